/**
 * The node agent as a separate process inside a NodeSandbox, as the DaemonSet runs it
 * (`kubenet daemon`, from src/ through tsx), and the manifest's ConfigMap config it is given.
 * Start waits for /healthz 200; stop sends SIGTERM as kubelet does; kill sends anything else.
 * `startManifestAgent` runs it as deployed: the ConfigMap's YAML, no directory flag, cluster mode
 * against a fake API server that serves the Node's pod CIDR.
 */
import type { ResultPromise } from 'execa';
import yaml from 'js-yaml';
import { readFile, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import type { AgentConfig } from '../../src/daemon/config/config.js';
import { agentGet, HEALTH_PATH } from '../../src/daemon/protocol.js';
import { FakeApiServer, fakeKubeConfig, node as nodeObject } from './fake-apiserver.js';
import { CNI_BIN_DIRS, type Cleanup } from './kernel.js';
import type { NodeSandbox } from './node-sandbox.js';

const ROOT = fileURLToPath(new URL('../../', import.meta.url));
export const AGENT_MAIN = join(ROOT, 'src/cli/main.ts');
export const MANIFEST = join(ROOT, 'manifests/kubenet.yaml');

/** The agent config exactly as the manifest's ConfigMap holds it (the text, unparsed). */
export async function manifestConfigYaml(): Promise<string> {
  const docs = yaml.loadAll(await readFile(MANIFEST, 'utf8')) as Array<{ kind?: string; data?: Record<string, string> } | null>;
  const cm = docs.find((d) => d?.kind === 'ConfigMap');
  const text = cm?.data?.['config.yaml'];
  if (!text) throw new Error(`${MANIFEST} has no ConfigMap with data["config.yaml"]`);
  return text;
}

export class AgentProcess {
  proc: ResultPromise | undefined;
  constructor(
    private readonly sandbox: NodeSandbox,
    readonly args: string[],
    private readonly env: Record<string, string>,
    readonly logFile: string,
    private readonly socket: string,
    /** A command the agent runs under, e.g. `['setpriv', '--bounding-set=-dac_override', '--']`; default none. */
    readonly wrapper: readonly string[] = [],
  ) {}

  /** The agent's pid (in the sandbox's pid namespace, which is the host's). */
  get pid(): number | undefined {
    return this.proc?.pid;
  }

  /** Starts the agent; returns once /healthz says ready (200), or with `ready: false` once it answers at all (the API listens). */
  async start(opts: { ready?: boolean } = {}): Promise<void> {
    const ready = opts.ready ?? true;
    const [cmd, ...pre] = [...this.wrapper, process.execPath];
    this.proc = this.sandbox.spawn(cmd ?? process.execPath, [...pre, '--import', 'tsx', AGENT_MAIN, 'daemon', ...this.args], {
      cwd: ROOT,
      env: this.env,
      logFile: this.logFile,
    });
    const proc = this.proc;
    let exited = false;
    void proc.then(() => (exited = true));
    const deadline = Date.now() + 60_000;
    let last = '';
    while (Date.now() < deadline && !exited) {
      const r = await agentGet(this.sandbox.hostPath(this.socket), HEALTH_PATH, 2_000).catch((err: Error) => ({
        status: 0,
        body: err.message,
      }));
      if (r.status === 200 || (!ready && r.status !== 0)) return;
      last = `${r.status} ${r.body}`;
      await new Promise((res) => setTimeout(res, 200));
    }
    throw new Error(`agent not healthy (${exited ? 'exited' : 'timeout'}; last /healthz: ${last}):\n${await this.logTail()}`);
  }

  /** SIGTERM as the kubelet sends it; the exit code, or undefined when it had to be killed after the DaemonSet's 30 s grace period. */
  async stop(graceMs = 30_000): Promise<number | undefined> {
    const p = this.proc;
    this.proc = undefined;
    if (!p) return undefined;
    p.kill('SIGTERM');
    let timer: NodeJS.Timeout | undefined;
    const exited = await Promise.race([p.then(() => true), new Promise<boolean>((r) => (timer = setTimeout(() => r(false), graceMs)))]);
    // A pending grace timer would keep the test worker alive for the rest of the grace period.
    clearTimeout(timer);
    if (!exited) p.kill('SIGKILL');
    const r = await p;
    const code = exited ? r.exitCode : undefined;
    // A test failing on this shows only "undefined": the agent's last words say which step hung.
    if (code !== 0 && graceMs >= 30_000) {
      const why = exited ? `exited with ${r.exitCode ?? r.signal}` : `still running ${graceMs} ms after SIGTERM: killed`;
      process.stderr.write(`agent ${why}; its log ends:\n${await this.logTail(60)}\n`);
    }
    return code;
  }

  /** SIGKILL, as a crash or an OOM kill: nothing of the agent runs after this resolves. */
  async kill(): Promise<void> {
    const p = this.proc;
    this.proc = undefined;
    if (!p) return;
    p.kill('SIGKILL');
    await p;
  }

  async logTail(lines = 30): Promise<string> {
    return (await readFile(this.logFile, 'utf8').catch(() => '')).split('\n').slice(-lines).join('\n');
  }
}

/** The directory and device settings of the manifest's config (the keys the tests look at). */
export type ManifestSettings = Pick<
  AgentConfig,
  'socket' | 'cniBinDir' | 'cniConfDir' | 'pluginBinDirs' | 'bridgeName' | 'ifbName' | 'ipamDataDir' | 'cniCacheDir' | 'stateDir'
>;

export interface ManifestAgent {
  agent: AgentProcess;
  api: FakeApiServer;
  nodeName: string;
  /** The ConfigMap's config.yaml, as given to the agent, and parsed. */
  configText: string;
  settings: ManifestSettings;
}

/**
 * The agent as the DaemonSet runs it, inside `sb`: `--config` with exactly the manifest ConfigMap's
 * YAML, `--kubeconfig` for a fake API server (reached through sb.exposeHostPort) whose Node
 * `nodeName` has `podCidr`, env NODE_NAME; no directory flag. Returns once /healthz says ready.
 * The API server's stop goes on `cleanup`; the agent dies with the sandbox.
 */
export async function startManifestAgent(
  sb: NodeSandbox,
  cleanup: Cleanup,
  opts: { nodeName: string; podCidr: string; logFile?: string },
): Promise<ManifestAgent> {
  const api = await FakeApiServer.start();
  cleanup.add(() => api.stop());
  api.setNode(nodeObject(opts.nodeName, { podCIDR: opts.podCidr, podCIDRs: [opts.podCidr] }));
  await sb.exposeHostPort(api.port);
  const kubeconfig = join(sb.tmpDir, 'kubeconfig');
  await writeFile(kubeconfig, fakeKubeConfig(`http://127.0.0.1:${api.port}`).exportConfig());
  const configText = await manifestConfigYaml();
  const configFile = join(sb.tmpDir, 'config.yaml');
  await writeFile(configFile, configText);
  const settings = yaml.load(configText) as ManifestSettings;
  const agent = new AgentProcess(
    sb,
    ['--config', configFile, '--kubeconfig', kubeconfig],
    { NODE_NAME: opts.nodeName },
    opts.logFile ?? join(sb.tmpDir, 'agent.log'),
    settings.socket,
  );
  await agent.start();
  return { agent, api, nodeName: opts.nodeName, configText, settings };
}

/**
 * The agent configured by flags alone, inside `sb`, on private directories under sb.tmpDir and its
 * own bridge and ifb names, the reference plugins hack/build-upstream.sh built: with a static `podCidr` (no API
 * server), or in cluster mode with `kubeconfig` (then NODE_NAME is `nodeName`).
 */
export function flagsAgent(
  sb: NodeSandbox,
  opts: { podCidr?: string; kubeconfig?: string; nodeName?: string; logFile?: string; extraArgs?: string[] },
): { agent: AgentProcess; settings: ManifestSettings } {
  const root = sb.tmpDir;
  const settings: ManifestSettings = {
    socket: join(root, 'kubenet.sock'),
    cniBinDir: join(root, 'cni-bin'),
    cniConfDir: join(root, 'cni-conf'),
    pluginBinDirs: CNI_BIN_DIRS,
    bridgeName: `${sb.prefix}${sb.tag}b`,
    ifbName: `${sb.prefix}${sb.tag}i`,
    ipamDataDir: join(root, 'ipam'),
    cniCacheDir: join(root, 'cni-cache'),
    stateDir: join(root, 'state'),
  };
  const args = [
    ...(opts.podCidr ? ['--pod-cidr', opts.podCidr] : []),
    ...(opts.kubeconfig ? ['--kubeconfig', opts.kubeconfig] : []),
    '--socket',
    settings.socket,
    '--cni-bin-dir',
    settings.cniBinDir,
    '--cni-conf-dir',
    settings.cniConfDir,
    '--plugin-bin-dirs',
    settings.pluginBinDirs.join(','),
    '--bridge-name',
    settings.bridgeName,
    '--ifb-name',
    settings.ifbName,
    '--ipam-data-dir',
    settings.ipamDataDir,
    '--cni-cache-dir',
    settings.cniCacheDir,
    '--state-dir',
    settings.stateDir,
    '--non-masquerade-cidr',
    '10.0.0.0/8',
    '--log-level',
    'info',
    ...(opts.extraArgs ?? []),
  ];
  const env: Record<string, string> = opts.nodeName ? { NODE_NAME: opts.nodeName } : {};
  return { agent: new AgentProcess(sb, args, env, opts.logFile ?? join(root, 'agent.log'), settings.socket), settings };
}

/** flagsAgent with a static pod CIDR, started (ready). */
export async function startFlagsAgent(
  sb: NodeSandbox,
  opts: { podCidr: string; logFile?: string },
): Promise<{ agent: AgentProcess; settings: ManifestSettings }> {
  const started = flagsAgent(sb, opts);
  await started.agent.start();
  return started;
}
