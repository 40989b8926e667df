/**
 * The node agent: one KubenetPlugin, a pod-CIDR source, the CNI API on a unix socket (mode 0600),
 * the CNI binary and conflist for container runtimes, pod state that survives restarts, metrics.
 */
import { renameSync, rmSync, writeFileSync } from 'node:fs';
import { chmod, copyFile, mkdir, readdir, readFile, rename, rm, writeFile } from 'node:fs/promises';
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { performance } from 'node:perf_hooks';
import { Counter, Gauge, Histogram, Registry } from 'prom-client';
import { KubenetError } from '../errors.js';
import type { Logger } from '../log.js';
import { linkDeletionsInFlight } from '../netlink/index.js';
import { KubenetPlugin, NETWORK_NAME, type PodRecord } from '../plugin/kubenet.js';
import { isUnshaped } from '../shaper/quantity.js';
import { CniHandler, type PodLookup } from './cni-handler.js';
import type { AgentConfig } from './config.js';
import { CNI_API_PATH, CNI_BINARY_BUILD_PATH, CNI_BINARY_NAME, CNI_ERR_DECODE, cniErrorBody, CONF_SOCKET_KEY, HEALTH_PATH, parseCniRequest } from './protocol.js';

export const CONFLIST_NAME = '10-kubenet.conflist';
export const STATUS_PATH = '/v1/status';
export const METRICS_PATH = '/metrics';

/** Where a pod-CIDR comes from: a static value or the Node object. */
export interface PodCidrSource {
  start(onCidr: (podCidr: string) => void | Promise<void>): Promise<void>;
  stop(): Promise<void>;
}

export class StaticCidr implements PodCidrSource {
  constructor(private readonly cidr: string) {}
  async start(onCidr: (podCidr: string) => void | Promise<void>): Promise<void> {
    await onCidr(this.cidr);
  }
  async stop(): Promise<void> {}
}

/** The conflist runtimes read: network kubenet, plugin type kubenet, capabilities bandwidth + portMappings. */
export function buildConflist(socket: string): object {
  return {
    // containerd 1.6 / CRI-O use libcni 1.1 (spec up to 1.0.0); libcni >= 1.2 picks the highest of
    // cniVersions it supports, which gives it STATUS and GC (1.1.0).
    cniVersion: '1.0.0',
    cniVersions: ['1.0.0', '1.1.0'],
    name: NETWORK_NAME,
    plugins: [{ type: CNI_BINARY_NAME, [CONF_SOCKET_KEY]: socket, capabilities: { bandwidth: true, portMappings: true } }],
  };
}

export interface StatusReport {
  podCIDR: string | undefined;
  bridge: string;
  ready: boolean;
  pods: Array<{ namespace: string; name: string; id: string; ips: string[]; hostVeth: string | undefined; limits: PodRecord['limits']; portMappings?: PodRecord['portMappings'] }>;
}

export class Agent {
  readonly plugin: KubenetPlugin;
  private readonly handler: CniHandler;
  private server: Server | undefined;
  private podCidr: string | undefined;
  private confWritten = false;
  private inFlight = 0;
  private stopping = false;
  private readonly registry = new Registry();
  private readonly metrics;

  constructor(
    private readonly config: AgentConfig,
    private readonly source: PodCidrSource,
    private readonly log: Logger,
    private readonly pods?: PodLookup,
  ) {
    this.plugin = new KubenetPlugin({
      bridgeName: config.bridgeName,
      cniBinDirs: config.pluginBinDirs,
      ipamDataDir: config.ipamDataDir,
      cniCacheDir: config.cniCacheDir,
      ifbName: config.ifbName,
      // The runtime calling us runs loopback for lo itself (from the same bin dir).
      manageLoopback: false,
      shaperStateDir: join(config.stateDir, 'shaper'),
      logger: log,
      ...(config.mtu !== undefined ? { mtu: config.mtu } : {}),
    });
    this.handler = new CniHandler(this.plugin, pods, {
      onAdd: (r) => this.savePod(r),
      onDel: (id) => this.forgetPod(id),
    });
    const reg = this.registry;
    this.metrics = {
      setup: new Histogram({ name: 'kubenet_cni_add_seconds', help: 'CNI ADD latency', buckets: [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1, 5], registers: [reg] }),
      teardown: new Histogram({ name: 'kubenet_cni_del_seconds', help: 'CNI DEL latency', buckets: [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1, 5], registers: [reg] }),
      errors: new Counter({ name: 'kubenet_cni_errors_total', help: 'CNI calls that failed, by command and CNI error code', labelNames: ['command', 'code'], registers: [reg] }),
      pods: new Gauge({ name: 'kubenet_pods', help: 'Pods attached to the bridge', registers: [reg] }),
      shaped: new Gauge({ name: 'kubenet_shaped_pods', help: 'Pods with bandwidth limits', registers: [reg] }),
      inFlight: new Gauge({ name: 'kubenet_cni_calls_in_flight', help: 'CNI calls being handled', registers: [reg] }),
      // DEL answers once a pod's veth is gone; the kernel frees the device on a worker thread after.
      vethDeletions: new Gauge({ name: 'kubenet_veth_deletions_in_flight', help: 'Pod veths deleted but not yet freed by the kernel', registers: [reg] }),
    };
  }

  private get podsDir(): string {
    return join(this.config.stateDir, 'pods');
  }

  async start(): Promise<void> {
    await mkdir(this.podsDir, { recursive: true });
    const restored = await this.loadPods();
    const host = {
      getPodByName: () => undefined,
      // Every CNI call carries its netns; for anything else, the netns recorded at ADD.
      getNetNS: (id: string) => this.plugin.listPods().find((p) => p.id === id)?.netns ?? '',
    };
    await this.plugin.init(host, this.config.hairpinMode, this.config.nonMasqueradeCIDR);
    for (const r of restored) this.plugin.restorePod(r);
    this.updateGauges();
    if (restored.length > 0) this.log.info({ pods: restored.length }, 'restored pods set up before the restart');
    await this.pods?.start?.();
    await this.listen();
    await this.source.start((cidr) => this.onPodCidr(cidr));
  }

  private async onPodCidr(cidr: string): Promise<void> {
    try {
      await this.plugin.event('pod-cidr-change', { 'pod-cidr': cidr });
      this.podCidr = cidr;
      await this.installCni();
    } catch (err) {
      this.log.error({ err, podCIDR: cidr }, 'pod CIDR refused; keeping the previous one');
    }
  }

  /** Installs the forwarding binary and writes the conflist, both atomically (tmp + rename). */
  private async installCni(): Promise<void> {
    const src = forwarderBinaryPath();
    const bin = join(this.config.cniBinDir, CNI_BINARY_NAME);
    await mkdir(this.config.cniBinDir, { recursive: true });
    const tmpBin = `${bin}.tmp-${process.pid}`;
    try {
      await copyFile(src, tmpBin);
    } catch (err) {
      throw new KubenetError(`CNI forwarder ${src} is missing: build it with "npm run build"`, { cause: err });
    }
    await chmod(tmpBin, 0o755);
    await rename(tmpBin, bin);
    await mkdir(this.config.cniConfDir, { recursive: true });
    const conf = join(this.config.cniConfDir, CONFLIST_NAME);
    await writeFile(`${conf}.tmp`, JSON.stringify(buildConflist(this.config.socket), null, 2) + '\n');
    await rename(`${conf}.tmp`, conf);
    this.confWritten = true;
    this.log.info({ bin, conf }, 'installed CNI binary and conflist');
  }

  private async listen(): Promise<void> {
    await mkdir(dirname(this.config.socket), { recursive: true });
    await rm(this.config.socket, { force: true });
    const server = createServer((req, res) => {
      this.route(req, res).catch((err: unknown) => {
        this.log.error({ err }, 'request failed');
        if (!res.headersSent) res.writeHead(500);
        res.end();
      });
    });
    await new Promise<void>((ok, fail) => {
      server.once('error', fail);
      server.listen(this.config.socket, () => ok());
    });
    await chmod(this.config.socket, 0o600);
    this.server = server;
    this.log.info({ socket: this.config.socket }, 'serving the CNI API');
  }

  private async route(req: IncomingMessage, res: ServerResponse): Promise<void> {
    const url = req.url ?? '';
    if (req.method === 'POST' && url === CNI_API_PATH) return this.serveCni(req, res);
    if (req.method === 'GET' && url === HEALTH_PATH) {
      const ready = this.ready();
      res.writeHead(ready.ok ? 200 : 503, { 'content-type': 'application/json' });
      res.end(JSON.stringify(ready));
      return;
    }
    if (req.method === 'GET' && url === METRICS_PATH) {
      this.updateGauges();
      res.writeHead(200, { 'content-type': this.registry.contentType });
      res.end(await this.registry.metrics());
      return;
    }
    if (req.method === 'GET' && url === STATUS_PATH) {
      res.writeHead(200, { 'content-type': 'application/json' });
      res.end(JSON.stringify(this.statusReport()));
      return;
    }
    res.writeHead(404);
    res.end();
  }

  private async serveCni(req: IncomingMessage, res: ServerResponse): Promise<void> {
    this.inFlight++;
    this.metrics.inFlight.set(this.inFlight);
    try {
      await this.serveCniCall(req, res);
    } finally {
      this.inFlight--;
      this.metrics.inFlight.set(this.inFlight);
    }
  }

  private async serveCniCall(req: IncomingMessage, res: ServerResponse): Promise<void> {
    const chunks: Buffer[] = [];
    for await (const c of req) chunks.push(c as Buffer);
    let answer;
    const started = performance.now();
    try {
      const call = parseCniRequest(JSON.parse(Buffer.concat(chunks).toString('utf8')));
      answer = await this.handler.handle(call);
    } catch (err) {
      const msg = err instanceof Error ? err.message : String(err);
      answer = { status: 400, command: 'unknown', code: CNI_ERR_DECODE, body: JSON.stringify(cniErrorBody(CNI_ERR_DECODE, msg)) };
    }
    const secs = (performance.now() - started) / 1000;
    if (answer.command === 'ADD') this.metrics.setup.observe(secs);
    if (answer.command === 'DEL') this.metrics.teardown.observe(secs);
    if (answer.status !== 200) {
      this.metrics.errors.inc({ command: answer.command, code: String(answer.code ?? 999) });
      this.log.warn({ command: answer.command, body: answer.body }, 'CNI call failed');
    }
    this.updateGauges();
    // While stopping, the answer closes its connection, so close() is not held by keep-alive.
    if (this.stopping) res.setHeader('connection', 'close');
    res.writeHead(answer.status, { 'content-type': 'application/json' });
    res.end(answer.body);
  }

  /** CNI calls being handled right now. */
  callsInFlight(): number {
    return this.inFlight;
  }

  ready(): { ok: boolean; reason?: string } {
    try {
      this.plugin.status();
    } catch (err) {
      return { ok: false, reason: err instanceof Error ? err.message : String(err) };
    }
    return this.confWritten ? { ok: true } : { ok: false, reason: 'CNI config not written yet' };
  }

  statusReport(): StatusReport {
    return {
      podCIDR: this.podCidr,
      bridge: this.config.bridgeName,
      ready: this.ready().ok,
      pods: this.plugin.listPods().map((p) => ({
        namespace: p.namespace,
        name: p.name,
        id: p.id,
        ips: p.ips,
        hostVeth: p.hostVeth,
        limits: p.limits,
        ...(p.portMappings ? { portMappings: p.portMappings } : {}),
      })),
    };
  }

  private updateGauges(): void {
    const pods = this.plugin.listPods();
    this.metrics.pods.set(pods.length);
    this.metrics.shaped.set(pods.filter((p) => !isUnshaped(p.limits)).length);
    this.metrics.vethDeletions.set(linkDeletionsInFlight());
  }

  // Pod records are written synchronously, like the CNI result cache (src/cni/cache.ts): a few
  // hundred bytes each, microseconds of syscalls, against a thread-pool round trip per step (and a
  // pool that pod veth deletions may be holding) on every ADD and DEL.
  private async savePod(r: PodRecord): Promise<void> {
    const file = join(this.podsDir, `${r.id}.json`);
    writeFileSync(`${file}.tmp`, JSON.stringify(r));
    renameSync(`${file}.tmp`, file);
  }

  private async forgetPod(id: string): Promise<void> {
    rmSync(join(this.podsDir, `${id}.json`), { force: true });
  }

  private async loadPods(): Promise<PodRecord[]> {
    const out: PodRecord[] = [];
    for (const f of await readdir(this.podsDir)) {
      if (!f.endsWith('.json')) continue;
      try {
        const r = JSON.parse(await readFile(join(this.podsDir, f), 'utf8')) as PodRecord;
        if (typeof r.id === 'string' && Array.isArray(r.ips)) out.push(r);
      } catch (err) {
        this.log.warn({ err, file: f }, 'unreadable pod state file; ignoring it');
      }
    }
    return out;
  }

  /** Stops taking calls, lets calls in flight finish, then releases the plugin. */
  async stop(): Promise<void> {
    this.stopping = true;
    await this.source.stop();
    const server = this.server;
    if (server) {
      const closed = new Promise<void>((ok) => server.close(() => ok()));
      server.closeIdleConnections();
      await closed;
    }
    await this.pods?.stop?.();
    // Veths of pods deleted just before: let the kernel finish them (tens of ms) before exiting,
    // but never hold the exit on it for long.
    let timer: NodeJS.Timeout | undefined;
    await Promise.race([this.plugin.settled(), new Promise<void>((r) => (timer = setTimeout(r, 5000)))]);
    clearTimeout(timer);
    this.plugin.close();
    await rm(this.config.socket, { force: true });
    this.log.info('agent stopped');
  }
}

/** The built forwarder: native/build/kubenet-cni at the package root (from src/ or dist/src/). */
export function forwarderBinaryPath(): string {
  return resolve(packageRoot(), CNI_BINARY_BUILD_PATH);
}

function packageRoot(): string {
  const here = dirname(fileURLToPath(import.meta.url)); // .../src/daemon or .../dist/src/daemon
  const up = resolve(here, '..', '..');
  return up.endsWith('/dist') ? resolve(up, '..') : up;
}
