/**
 * One node agent on the test's own bridge, ifb, socket and temporary CNI dirs, driven the way a
 * container runtime drives it: through the conflist it writes and the CNI binary it installs,
 * either exec'd directly or through the reference runtime library (the libcni driver of
 * test/libcni, built by `npm run build:test-tools`). `cleanup` removes everything it made.
 */
import { execa } from 'execa';
import { existsSync } from 'node:fs';
import { readdir } from 'node:fs/promises';
import { request } from 'node:http';
import { isIP } from 'node:net';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { Agent, type AgentOptions } from '../../src/daemon/agent.js';
import { StaticCidr, type PodCidrSource } from '../../src/daemon/pod-cidr/source.js';
import { agentGet, CNI_API_HOST, CNI_API_PATH } from '../../src/daemon/protocol.js';
import type { PodLookup } from '../../src/daemon/cluster/pod-lookup.js';
import { loadConfig, type AgentConfig } from '../../src/daemon/config/config.js';
import { createLogger, type Logger } from '../../src/log.js';
import { CNI_BIN_DIRS, Cleanup, delIfbs, delLink, makeTmpDir, rmrf, uniq } from './kernel.js';
import { addTestPod, cniArgs, type TestPod } from './test-pod.js';

const ROOT = fileURLToPath(new URL('../../', import.meta.url));
export const LIBCNI_DRIVER = join(ROOT, 'native/build/libcni-driver');
export const FORWARDER = join(ROOT, 'native/build/kubenet-cni');

/** Why the agent e2e tests cannot run, beyond the kernel blocker. */
export function agentTestBlocker(): string | undefined {
  if (!existsSync(FORWARDER)) return `needs ${FORWARDER} (npm run build:native; npm test builds it)`;
  if (!existsSync(LIBCNI_DRIVER)) return `needs ${LIBCNI_DRIVER} (npm run build:test-tools; npm test builds it)`;
  return undefined;
}

export interface DriverResult {
  exitCode: number;
  stdout: string;
  stderr: string;
}

export class AgentHarness {
  readonly cleanup = new Cleanup();
  readonly tag = uniq(6);
  readonly bridge = `kag${this.tag}`;
  readonly ifb = `kai${this.tag}`;
  root!: string;
  config!: AgentConfig;
  /** libcni's own cache (the runtime side), apart from the agent's. */
  libcniCache!: string;
  agent: Agent | undefined;

  async setup(podCidr: string, overrides: Partial<AgentConfig> = {}): Promise<this> {
    this.root = await makeTmpDir('kag');
    this.cleanup.add(() => rmrf(this.root));
    this.cleanup.add(() => delLink(this.bridge));
    this.cleanup.add(() => delIfbs(this.ifb));
    this.cleanup.add(() => this.stopAgent());
    this.libcniCache = join(this.root, 'libcni-cache');
    this.config = await loadConfig({
      flags: {
        podCIDR: podCidr,
        socket: join(this.root, 'kubenet.sock'),
        cniBinDir: join(this.root, 'cni-bin'),
        cniConfDir: join(this.root, 'cni-conf'),
        pluginBinDirs: CNI_BIN_DIRS,
        bridgeName: this.bridge,
        ifbName: this.ifb,
        nonMasqueradeCIDR: '0.0.0.0/0',
        ipamDataDir: join(this.root, 'ipam'),
        cniCacheDir: join(this.root, 'cni-cache'),
        stateDir: join(this.root, 'state'),
        logLevel: (process.env.KUBENET_LOG_LEVEL as AgentConfig['logLevel'] | undefined) ?? 'silent',
        // Loopback, a free port: agents of parallel tests side by side on the host, none on its addresses.
        metricsAddress: '127.0.0.1:0',
        ...overrides,
      },
      env: { NODE_NAME: 'test-node' },
    });
    return this;
  }

  async startAgent(
    source: PodCidrSource = new StaticCidr(this.config.podCIDR ?? ''),
    pods?: PodLookup,
    logger?: Logger,
    opts: AgentOptions = {},
  ): Promise<Agent> {
    const agent = new Agent(this.config, source, logger ?? createLogger({ level: this.config.logLevel }), pods, opts);
    this.agent = agent;
    await agent.start();
    return agent;
  }

  async stopAgent(): Promise<void> {
    const agent = this.agent;
    this.agent = undefined;
    await agent?.stop();
  }

  /** A pod sandbox of the test's own (addTestPod: netns `kag-<tag>-<name>`). */
  async addPod(name: string): Promise<TestPod> {
    const pod = await addTestPod(this.cleanup, 'kag', this.tag, name);
    // Runs first (cleanup is last-in, first-out): a test that failed midway still gets the pod's
    // DEL, so host-wide state (portmap's nat rules, shaping) does not outlive it. Best effort:
    // a DEL of a pod never added succeeds, and a stopped agent just fails the call.
    this.cleanup.add(async () => {
      if (this.agent) await this.libcni('del', pod);
    });
    return pod;
  }

  /**
   * The conflist through libcni, as containerd does: the lexically first file of the conf dir,
   * plugins from the agent's bin dir then the reference dirs, runtimeConfig from capability args
   * (`opts.runtimeConfig`, else the pod's). `cacheDir`: the runtime's cache, default `libcniCache`.
   */
  async libcni(
    cmd: 'add' | 'del' | 'check',
    pod: TestPod,
    opts: { runtimeConfig?: object; netns?: string; cacheDir?: string } = {},
  ): Promise<DriverResult> {
    const runtimeConfig = opts.runtimeConfig ?? pod.runtimeConfig;
    const args = libcniCallArgs(
      { ...this.libcniDirs(), cache: opts.cacheDir ?? this.libcniCache },
      {
        cmd,
        netns: opts.netns ?? pod.netnsPath,
        containerId: pod.id,
        ifName: pod.ifName,
        args: cniArgs(pod),
        ...(runtimeConfig ? { runtimeConfig } : {}),
      },
    );
    const r = await execa(LIBCNI_DRIVER, args, { reject: false });
    return { exitCode: r.exitCode ?? -1, stdout: r.stdout, stderr: r.stderr };
  }

  /**
   * `cmd` of each pod through one libcni-driver process (its `batch` command: libcni called
   * in-process, `concurrency` calls at a time, as containerd makes them); its answers by pod index.
   */
  libcniBatch(cmd: 'add' | 'del', pods: TestPod[], concurrency: number): Promise<BatchRun> {
    const requests = pods.map((p) => ({
      cmd,
      netns: p.netnsPath,
      containerId: p.id,
      ifName: p.ifName,
      args: cniArgs(p),
      ...(p.runtimeConfig ? { runtimeConfig: p.runtimeConfig } : {}),
    }));
    return libcniBatch(this.libcniDirs(), requests, concurrency);
  }

  /** The runtime's view: the agent's conflist dir, its binary's dir then the plugins', libcni's cache. */
  private libcniDirs(): LibcniDirs {
    return { conf: this.config.cniConfDir, bin: [this.config.cniBinDir, ...CNI_BIN_DIRS].join(':'), cache: this.libcniCache };
  }

  /** The installed CNI binary exec'd directly with the given command and config on stdin. */
  async execCni(command: string, pod: TestPod | undefined, stdin: string, env: Record<string, string> = {}): Promise<DriverResult> {
    const r = await execa(join(this.config.cniBinDir, 'kubenet'), [], {
      reject: false,
      input: stdin,
      extendEnv: false,
      env: {
        CNI_COMMAND: command,
        CNI_PATH: [this.config.cniBinDir, ...CNI_BIN_DIRS].join(':'),
        ...(pod ? { CNI_CONTAINERID: pod.id, CNI_NETNS: pod.netnsPath, CNI_IFNAME: pod.ifName, CNI_ARGS: cniArgs(pod) } : {}),
        ...env,
      },
    });
    return { exitCode: r.exitCode ?? -1, stdout: r.stdout, stderr: r.stderr };
  }

  /** GET on the agent socket. */
  get(path: string): Promise<{ status: number; body: string }> {
    return agentGet(this.config.socket, path);
  }

  async reservedIps(): Promise<string[]> {
    const files = await readdir(join(this.config.ipamDataDir, 'kubenet')).catch(() => [] as string[]);
    return files.filter((f) => isIP(f) !== 0);
  }

  async agentCacheEntries(): Promise<string[]> {
    return readdir(join(this.config.cniCacheDir, 'results')).catch(() => [] as string[]);
  }

  async libcniCacheEntries(): Promise<string[]> {
    return readdir(join(this.libcniCache, 'results')).catch(() => [] as string[]);
  }

  async podStateFiles(): Promise<string[]> {
    return readdir(join(this.config.stateDir, 'pods')).catch(() => [] as string[]);
  }
}

/** One answer of `libcni-driver batch` (test/libcni/batch.go). */
export interface BatchAnswer {
  i: number;
  startMs: number;
  endMs: number;
  error?: string;
  result?: { ips?: Array<{ address: string }>; interfaces?: Array<{ name?: string }> };
}

/** What `libcni-driver batch` gave: its answers by request index, and the batch's wall time (first start to last end). */
export interface BatchRun {
  exitCode: number;
  stderr: string;
  answers: BatchAnswer[];
  wallMs?: number;
}

/** One request of `libcni-driver batch`, or (with `check` too) the arguments of a single call. */
export interface BatchRequest {
  cmd: 'add' | 'del';
  netns: string;
  containerId: string;
  ifName: string;
  args: string;
  runtimeConfig?: object;
}

/** Where libcni looks: the conflist dir, the plugin dirs (colon-separated), its result cache. */
export interface LibcniDirs {
  conf: string;
  bin: string;
  cache: string;
}

/** The arguments of one `libcni-driver` call of `q` on `dirs` (test/libcni/driver.go). */
export function libcniCallArgs(dirs: LibcniDirs, q: Omit<BatchRequest, 'cmd'> & { cmd: 'add' | 'del' | 'check' }): string[] {
  const args = [
    q.cmd,
    '--conf-dir',
    dirs.conf,
    '--bin-dir',
    dirs.bin,
    '--cache-dir',
    dirs.cache,
    '--netns',
    q.netns,
    '--container-id',
    q.containerId,
    '--ifname',
    q.ifName,
    '--args',
    q.args,
    '--timeout',
    '60s',
  ];
  if (q.runtimeConfig) args.push('--runtime-config', JSON.stringify(q.runtimeConfig));
  return args;
}

/** Runs the driver: `file args` with `input` on stdin, never rejecting (the default: here; a node sandbox's `exec` runs it inside). */
export type DriverRunner = (file: string, args: string[], input: string) => Promise<{ exitCode?: number; stdout: string; stderr: string }>;

const runHere: DriverRunner = (file, args, input) => execa(file, args, { input, reject: false });

/** The requests through one libcni-driver process, `concurrency` at a time, on `dirs`. */
export async function libcniBatch(
  dirs: LibcniDirs,
  requests: BatchRequest[],
  concurrency: number,
  run: DriverRunner = runHere,
): Promise<BatchRun> {
  const args = [
    'batch',
    '--conf-dir',
    dirs.conf,
    '--bin-dir',
    dirs.bin,
    '--cache-dir',
    dirs.cache,
    '--concurrency',
    String(concurrency),
    '--timeout',
    '60s',
  ];
  const r = await run(LIBCNI_DRIVER, args, requests.map((q) => JSON.stringify(q)).join('\n'));
  const lines = r.stdout
    .split('\n')
    .filter(Boolean)
    .map((l) => JSON.parse(l) as Partial<BatchAnswer> & { wallMs?: number });
  const answers: BatchAnswer[] = [];
  for (const l of lines) if (l.i !== undefined) answers[l.i] = l as BatchAnswer;
  return { exitCode: r.exitCode ?? -1, stderr: r.stderr, answers, wallMs: lines.find((l) => l.wallMs !== undefined)?.wallMs };
}

/** One forwarded CNI call straight to an agent socket, as the CNI binary sends it. */
export function postCni(socketPath: string, env: Record<string, string>, stdin: string): Promise<{ status: number; body: string }> {
  const body = JSON.stringify({ env, stdin });
  const headers = {
    host: CNI_API_HOST,
    'content-type': 'application/json',
    'content-length': Buffer.byteLength(body),
    connection: 'close',
  };
  return new Promise((resolve, reject) => {
    const req = request({ socketPath, path: CNI_API_PATH, method: 'POST', headers }, (res) => {
      const chunks: Buffer[] = [];
      res.on('data', (c: Buffer) => chunks.push(c));
      res.on('end', () => resolve({ status: res.statusCode ?? 0, body: Buffer.concat(chunks).toString('utf8') }));
    });
    req.on('error', reject);
    req.end(body);
  });
}
