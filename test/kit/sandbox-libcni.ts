/**
 * The reference runtime library (libcni, through native/build/libcni-driver) run INSIDE a node
 * sandbox, as a container runtime on the node runs it: the lexically first config of the conf dir,
 * plugins from the bin dirs, CNI_ARGS as containerd 1.6 passes them, runtimeConfig from capability
 * args, and either a cache dir of the test's or libcni's own default (`/var/lib/cni`, a tmpfs in
 * the sandbox: the driver refuses --default-cache-dir anywhere else).
 *
 * `SandboxWorld` is the fixture every sandbox e2e starts from: a NodeSandbox, the agent that runs
 * in it now, libcni as its runtime, the test's pods (`TestPod`, netns `<prefix>-<tag>-<name>`),
 * and one `destroy()` that DELs what is still attached, stops the agent and removes everything.
 */
import { join } from 'node:path';
import { performance } from 'node:perf_hooks';
import { DEFAULT_SOCKET_PATH } from '../../src/daemon/protocol.js';
import { agentTestBlocker, LIBCNI_DRIVER } from './agent-harness.js';
import { AgentProcess } from './agent-process.js';
import { Cleanup, CNI_BIN_DIRS, kernelTestBlocker, uniq } from './kernel.js';
import { NodeSandbox, type NodeSandboxOptions } from './node-sandbox.js';
import { addTestPod, cniArgs, type TestPod } from './test-pod.js';

/** libcni's default cache dir (libcni.CacheDir): where containerd and CRI-O keep their results. */
export const LIBCNI_DEFAULT_CACHE_DIR = '/var/lib/cni';

export interface LibcniCall {
  exitCode: number;
  stdout: string;
  stderr: string;
  ms: number;
}

export interface SandboxLibcniOptions {
  confDir: string;
  binDirs: string[];
  /** The runtime's cache dir; undefined: libcni's default (the driver's --default-cache-dir). */
  cacheDir?: string;
  timeoutMs?: number;
}

export class SandboxLibcni {
  constructor(
    private readonly sb: NodeSandbox,
    readonly opts: SandboxLibcniOptions,
  ) {}

  /** Where the runtime's results live (`<cache>/results/<network>-<id>-<ifname>`). */
  get cacheDir(): string {
    return this.opts.cacheDir ?? LIBCNI_DEFAULT_CACHE_DIR;
  }

  /**
   * One libcni call; `netns` overrides the pod's (containerd's second DEL passes ''), `runtimeConfig`
   * the pod's. Never throws for a CNI failure.
   */
  async call(cmd: 'add' | 'del' | 'check', pod: TestPod, opts: { runtimeConfig?: object; netns?: string } = {}): Promise<LibcniCall> {
    const timeoutMs = this.opts.timeoutMs ?? 90_000;
    const args = [
      cmd,
      '--conf-dir',
      this.opts.confDir,
      '--bin-dir',
      this.opts.binDirs.join(':'),
      ...(this.opts.cacheDir === undefined ? ['--default-cache-dir'] : ['--cache-dir', this.opts.cacheDir]),
      '--netns',
      opts.netns ?? pod.netnsPath,
      '--container-id',
      pod.id,
      '--ifname',
      pod.ifName,
      '--args',
      cniArgs(pod),
      '--timeout',
      `${Math.ceil(timeoutMs / 1000)}s`,
    ];
    const runtimeConfig = opts.runtimeConfig ?? pod.runtimeConfig;
    if (runtimeConfig) args.push('--runtime-config', JSON.stringify(runtimeConfig));
    const t0 = performance.now();
    const r = await this.sb.exec(LIBCNI_DRIVER, args, { reject: false, timeout: timeoutMs + 10_000 });
    return { exitCode: r.exitCode ?? -1, stdout: r.stdout, stderr: r.stderr, ms: performance.now() - t0 };
  }
}

/** Why a SandboxWorld e2e cannot run here (root, the reference plugins, the forwarder, the libcni driver), or undefined. */
export function sandboxTestBlocker(): string | undefined {
  return kernelTestBlocker() ?? agentTestBlocker();
}

export interface SandboxWorldOptions extends NodeSandboxOptions {
  /** The runtime's libcni in the node; default `defaultWorldLibcni`. */
  libcni?: (sb: NodeSandbox) => SandboxLibcniOptions;
}

/**
 * A runtime on a node whose agent runs with the default directories: conf dir /etc/cni/net.d, the
 * plugins from /opt/cni/bin and then the reference plugins, its results in a cache dir of the
 * test's (<tmpDir>/libcni), 60 s per call.
 */
export function defaultWorldLibcni(sb: NodeSandbox): SandboxLibcniOptions {
  return { confDir: '/etc/cni/net.d', binDirs: ['/opt/cni/bin', ...CNI_BIN_DIRS], cacheDir: join(sb.tmpDir, 'libcni'), timeoutMs: 60_000 };
}

/**
 * The sandbox-world fixture: a NodeSandbox (`prefix` names its kernel objects and the pods'
 * netns), the agent running in it, libcni as the node's runtime, and the pods the test made.
 * `destroy()` (or `run`) removes all of it; a test adds what else it made to `cleanup`.
 */
export class SandboxWorld {
  /** Steps run last-in, first-out by destroy(); the sandbox's removal is the first, so it runs last. */
  readonly cleanup = new Cleanup();
  /** Names the pods: netns `<prefix>-<tag>-<name>`. */
  readonly tag = uniq(5);
  /** Every pod newPod made, in order. */
  readonly pods: TestPod[] = [];
  /** The runtime; replace it once the agent's directories are known. */
  libcni: SandboxLibcni;
  /** Pods whose ADD through call() succeeded, with no successful DEL through it since. */
  private readonly attached = new Set<TestPod>();
  private current: AgentProcess | undefined;

  private constructor(
    readonly sb: NodeSandbox,
    libcni: SandboxLibcniOptions,
  ) {
    this.libcni = new SandboxLibcni(sb, libcni);
    this.cleanup.add(() => sb.destroy());
  }

  /** The agent running in the node now (startAgent's, or one started elsewhere and set here): destroy() stops it, run() prints its log when the body fails. */
  get agent(): AgentProcess {
    if (!this.current) throw new Error(`node sandbox ${this.sb.netns}: no agent started`);
    return this.current;
  }

  set agent(agent: AgentProcess) {
    this.current = agent;
  }

  static async create(opts: SandboxWorldOptions = {}): Promise<SandboxWorld> {
    const sb = await NodeSandbox.create(opts);
    return new SandboxWorld(sb, (opts.libcni ?? defaultWorldLibcni)(sb));
  }

  /** Runs `body` on a fresh world; when it fails, logs the tail of the agent's log; destroys the world either way. */
  static async run(
    t: { log: (msg: string) => void },
    opts: SandboxWorldOptions,
    body: (world: SandboxWorld) => Promise<void>,
  ): Promise<void> {
    const world = await SandboxWorld.create(opts);
    try {
      await body(world);
    } catch (err) {
      if (world.current) t.log(`agent log (tail):\n${await world.current.logTail(30)}`);
      throw err;
    } finally {
      await world.destroy();
    }
  }

  /** A pod of this world (see addTestPod): netns `<prefix>-<tag>-<name>`, removed by destroy(). */
  async newPod(name: string): Promise<TestPod> {
    const pod = await addTestPod(this.cleanup, this.sb.prefix, this.tag, name);
    this.pods.push(pod);
    return pod;
  }

  /** One libcni call (SandboxLibcni.call); a successful ADD sets `pod.ip`, and destroy() DELs the pod unless a DEL here succeeded since. */
  async call(cmd: 'add' | 'del' | 'check', pod: TestPod, opts: { runtimeConfig?: object; netns?: string } = {}): Promise<LibcniCall> {
    const r = await this.libcni.call(cmd, pod, opts);
    if (r.exitCode === 0 && cmd === 'add') {
      pod.ip = resultIp(r.stdout);
      this.attached.add(pod);
    }
    if (r.exitCode === 0 && cmd === 'del') this.attached.delete(pod);
    return r;
  }

  /**
   * `kubenet daemon ARGS` in the node (AgentProcess) in place of the agent that ran (stopped first);
   * returns once it is ready. `socket` where it serves (default the agent's), `logFile` default
   * <tmpDir>/agent.log, `wrapper` a command it runs under (AgentProcess).
   */
  async startAgent(
    args: string[],
    opts: { env?: Record<string, string>; socket?: string; logFile?: string; wrapper?: string[] } = {},
  ): Promise<AgentProcess> {
    await this.current?.stop(5000);
    const agent = new AgentProcess(
      this.sb,
      args,
      opts.env ?? {},
      opts.logFile ?? join(this.sb.tmpDir, 'agent.log'),
      opts.socket ?? DEFAULT_SOCKET_PATH,
      opts.wrapper,
    );
    this.current = agent;
    await agent.start();
    return agent;
  }

  /** The stdout of a command run in the node; a failure is no error (the output says what is there). */
  async inNode(cmd: string, args: string[]): Promise<string> {
    return (await this.sb.exec(cmd, args, { reject: false })).stdout;
  }

  /**
   * DELs every pod still attached (while an agent runs), stops the agent, then runs `cleanup`: the
   * pods' netns, what the test added, the sandbox. Reports the cleanup's failures together.
   */
  async destroy(): Promise<void> {
    if (this.current?.pid !== undefined) for (const p of [...this.attached]) await this.call('del', p).catch(() => undefined);
    await this.current?.stop(5000).catch(() => undefined);
    await this.cleanup.run();
  }
}

/** The first address of an ADD result (no prefix length), or undefined. */
export function resultIp(stdout: string): string | undefined {
  try {
    const r = JSON.parse(stdout) as { ips?: Array<{ address?: string }> };
    return r.ips?.[0]?.address?.split('/')[0];
  } catch {
    return undefined;
  }
}

/** Whether IPv4 `ip` lies in the IPv4 `cidr` ("10.1.2.0/24"); false for anything else. */
export function inCidr4(ip: string | undefined, cidr: string): boolean {
  const toInt = (a: string) => {
    const parts = a.split('.').map(Number);
    return parts.length === 4 && parts.every((p) => Number.isInteger(p) && p >= 0 && p <= 255)
      ? parts.reduce((n, p) => n * 256 + p, 0)
      : NaN;
  };
  const [net = '', bits = ''] = cidr.split('/');
  const len = Number(bits);
  const size = 2 ** (32 - len);
  const a = toInt(ip ?? '');
  const n = toInt(net);
  return (
    Number.isInteger(len) && len >= 0 && len <= 32 && !Number.isNaN(a) && !Number.isNaN(n) && Math.floor(a / size) === Math.floor(n / size)
  );
}

/** The CNI error code of a failed call (the driver's last stderr line), or undefined. */
export function cniErrorCode(r: { stderr: string }): number | undefined {
  const m = /CNI error code (\d+)/.exec(r.stderr);
  return m?.[1] ? Number(m[1]) : undefined;
}

/** CNI code 11, "try again later": the agent is unreachable (forwarder) or not ready yet (agent). */
export const CNI_TRY_AGAIN_LATER = 11;

/** The agent accepted the call and its connection broke before the answer: it died with the call in flight. */
export function agentDiedMidCall(r: { stdout: string; stderr: string }): boolean {
  return /connection closed (without a response|before the response was complete)|waiting for the response/.test(r.stdout + r.stderr);
}
