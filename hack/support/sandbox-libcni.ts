/**
 * The reference runtime library (libcni, through native/build/libcni-driver) run INSIDE a node
 * sandbox, as a container runtime on the node runs it: the lexically first config of the conf dir,
 * plugins from the bin dirs, CNI_ARGS as containerd 1.6 passes them, runtimeConfig from capability
 * args, and either a cache dir of the test's or libcni's own default (`/var/lib/cni`, a tmpfs in
 * the sandbox: the driver refuses --default-cache-dir anywhere else).
 */
import { performance } from 'node:perf_hooks';
import { LIBCNI_DRIVER } from './agent-harness.js';
import type { NodeSandbox } from './node-sandbox.js';

/** libcni's default cache dir (libcni.CacheDir): where containerd and CRI-O keep their results. */
export const LIBCNI_DEFAULT_CACHE_DIR = '/var/lib/cni';

export interface CniPod {
  namespace: string;
  name: string;
  uid: string;
  /** Sandbox (container) ID. */
  id: string;
  /** CNI_NETNS as the runtime passes it. */
  netnsPath: string;
}

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

  /** CNI_ARGS exactly as containerd 1.6 passes them. */
  static cniArgs(p: CniPod): string {
    return `IgnoreUnknown=1;K8S_POD_NAMESPACE=${p.namespace};K8S_POD_NAME=${p.name};K8S_POD_INFRA_CONTAINER_ID=${p.id};K8S_POD_UID=${p.uid}`;
  }

  /** One libcni call; `netns` overrides the pod's (containerd's second DEL passes ''). Never throws for a CNI failure. */
  async call(cmd: 'add' | 'del' | 'check', pod: CniPod, opts: { runtimeConfig?: object; netns?: string } = {}): Promise<LibcniCall> {
    const timeoutMs = this.opts.timeoutMs ?? 90_000;
    const args = [
      cmd,
      '--conf-dir', this.opts.confDir,
      '--bin-dir', this.opts.binDirs.join(':'),
      ...(this.opts.cacheDir === undefined ? ['--default-cache-dir'] : ['--cache-dir', this.opts.cacheDir]),
      '--netns', opts.netns ?? pod.netnsPath,
      '--container-id', pod.id,
      '--args', SandboxLibcni.cniArgs(pod),
      '--timeout', `${Math.ceil(timeoutMs / 1000)}s`,
    ];
    if (opts.runtimeConfig) args.push('--runtime-config', JSON.stringify(opts.runtimeConfig));
    const t0 = performance.now();
    const r = await this.sb.exec(LIBCNI_DRIVER, args, { reject: false, timeout: timeoutMs + 10_000 });
    return { exitCode: r.exitCode ?? -1, stdout: r.stdout, stderr: r.stderr, ms: performance.now() - t0 };
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
    return parts.length === 4 && parts.every((p) => Number.isInteger(p) && p >= 0 && p <= 255) ? parts.reduce((n, p) => n * 256 + p, 0) : NaN;
  };
  const [net = '', bits = ''] = cidr.split('/');
  const len = Number(bits);
  const size = 2 ** (32 - len);
  const a = toInt(ip ?? '');
  const n = toInt(net);
  return Number.isInteger(len) && len >= 0 && len <= 32 && !Number.isNaN(a) && !Number.isNaN(n) && Math.floor(a / size) === Math.floor(n / size);
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
