/**
 * A real containerd (2.x, with runc: the pinned versions hack/build-upstream.sh builds) inside a
 * NodeSandbox, driven over CRI as kubelet drives it. It has its own root, state, temp and plugin dirs (under the sandbox's tmpfs
 * /var/lib/containerd and /run/containerd, so create the sandbox with CONTAINERD_TMPFS_DIRS) and
 * its own gRPC socket in the sandbox's tmpDir; the CRI plugin keeps containerd's DEFAULT CNI
 * settings: bin_dir /opt/cni/bin, conf_dir /etc/cni/net.d (both the sandbox's tmpfs), max_conf_num
 * 1 (only the lexically first conflist), and libcni's default cache dir /var/lib/cni.
 *
 * Config (version 3, containerd 2.x's) beyond the defaults:
 * - `pinned_images.sandbox`: the locally built image (hack/build-sandbox-image.sh), imported with
 *   `ctr -n k8s.io images import` at start (no registry is reachable);
 * - runc by absolute path (`BinaryName`), the shim found through PATH (the built containerd's dir);
 * - NRI off: it would listen on the host's /var/run/nri;
 * - `restrict_oom_score_adj = true`: root here lacks CAP_SYS_RESOURCE, runc could not set the
 *   sandbox's oom_score_adj below its own;
 * - `netns_mounts_under_state_dir = true` (unless `netnsUnderStateDir: false`): pod netns bind
 *   mounts go under the state dir (tmpfs) instead of /run/netns (the host's, unless the sandbox has
 *   a tmpfs there, where the files would be visible and could be left behind);
 * - snapshotter `overlayfs`, falling back to `native` when containerd skipped overlayfs.
 *
 * Pods get the cgroup parent `/<prefix>-<tag>/pod<uid>` (podCgroupParent), which destroy() removes.
 * stop()/start()/restart() keep root and state: shims and pods keep running across a restart, as
 * with a real containerd restart. destroy() stops and removes every sandbox it can through CRI
 * (bounded), kills containerd, its shims and the pods' processes, removes the cgroups.
 */
import { execa, type ResultPromise } from 'execa';
import { type Dirent, existsSync, readFileSync } from 'node:fs';
import { readdir, rmdir, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { CriClient } from './cri/client.js';
import { Cleanup } from './kernel.js';
import { upstreamBlocker, upstreamDir } from './upstream.js';
import type { NodeSandbox } from './node-sandbox.js';

const ROOT = fileURLToPath(new URL('../../', import.meta.url));
/** Built by hack/build-sandbox-image.sh (npm test runs it through build:test-tools). */
export const SANDBOX_IMAGE_TAR = join(ROOT, 'native/build/sandbox-image.oci.tar');
/** The agent's image, built by hack/build-image.sh (npm test runs it through build:test-tools). */
export const AGENT_IMAGE_TAR = join(ROOT, 'native/build/kubenet-image.oci.tar');
/** The name the image carries (io.containerd.image.name) and containerd's sandbox_image. */
export const SANDBOX_IMAGE = 'kubenet-ts.local/sandbox:1';
const CONTAINERD_DIR = upstreamDir('containerd');
const RUNC = join(upstreamDir('runc'), 'runc');
/** containerd finds its shim, and the shim runc, through PATH: the built ones come first. */
const CONTAINERD_ENV = { PATH: [CONTAINERD_DIR, upstreamDir('runc'), process.env.PATH ?? ''].join(':') };

/** Why containerd tests cannot run here, or undefined when they can. */
export async function containerdTestBlocker(): Promise<string | undefined> {
  const built = upstreamBlocker('containerd', ['containerd', 'ctr', 'containerd-shim-runc-v2']) ?? upstreamBlocker('runc', ['runc']);
  if (built) return built;
  for (const tool of ['nsenter', 'unshare']) {
    const r = await execa('sh', ['-c', `command -v ${tool}`], { reject: false });
    if (r.exitCode !== 0) return `needs ${tool} (util-linux)`;
  }
  if (!existsSync(SANDBOX_IMAGE_TAR)) return `needs ${SANDBOX_IMAGE_TAR} (npm run build:test-tools; npm test builds it)`;
  return undefined;
}

export type Snapshotter = 'overlayfs' | 'native';

export interface ContainerdOptions {
  /** Default 'auto': overlayfs, or native when containerd could not load overlayfs here. */
  snapshotter?: Snapshotter | 'auto';
  /** containerd's log level; default 'info'. */
  logLevel?: string;
  /**
   * Default true: pod netns bind mounts under the state dir (tmpfs). false: containerd's default,
   * /var/run/netns, which a DaemonSet's agent mounts HostToContainer; the sandbox then needs a
   * tmpfs over /run/netns (so nothing lands in the host's).
   */
  netnsUnderStateDir?: boolean;
}

export class Containerd {
  readonly cleanup = new Cleanup();
  /** Paths inside the sandbox. */
  readonly root: string;
  readonly state: string;
  /** The gRPC socket: in the sandbox's tmpDir, the same path on the host and inside. */
  readonly socket: string;
  readonly configPath: string;
  readonly logFile: string;
  /** The cgroup all pods of this containerd live under ("/kcr-<tag>"). */
  readonly cgroupRoot: string;
  snapshotter: Snapshotter = 'overlayfs';
  cri: CriClient;
  private proc: ResultPromise | undefined;
  private readonly logLevel: string;
  private readonly netnsUnderStateDir: boolean;

  private constructor(
    readonly sandbox: NodeSandbox,
    opts: ContainerdOptions,
  ) {
    const id = `${sandbox.prefix}-${sandbox.tag}`;
    this.root = `/var/lib/containerd/${id}`;
    this.state = `/run/containerd/${id}`;
    this.socket = join(sandbox.tmpDir, 'containerd.sock');
    this.configPath = join(sandbox.tmpDir, 'containerd.toml');
    this.logFile = join(sandbox.tmpDir, 'containerd.log');
    this.cgroupRoot = `/${id}`;
    this.logLevel = opts.logLevel ?? 'info';
    this.netnsUnderStateDir = opts.netnsUnderStateDir ?? true;
    this.cri = new CriClient(this.socket);
  }

  /** Starts containerd in the sandbox and imports the sandbox image; ready for RunPodSandbox once the CNI config exists. */
  static async start(sandbox: NodeSandbox, opts: ContainerdOptions = {}): Promise<Containerd> {
    for (const d of ['/run/containerd', '/var/lib/containerd', ...(opts.netnsUnderStateDir === false ? ['/run/netns'] : [])]) {
      if (!sandbox.tmpfsDirs.includes(d))
        throw new Error(`the node sandbox needs a tmpfs over ${d} for containerd (CONTAINERD_TMPFS_DIRS)`);
    }
    const c = new Containerd(sandbox, opts);
    c.cleanup.add(() => c.removeCgroups());
    c.cleanup.add(() => c.killEverything());
    c.cleanup.add(() => c.removeAllSandboxes());
    try {
      const wanted = opts.snapshotter ?? 'auto';
      c.snapshotter = wanted === 'native' ? 'native' : 'overlayfs';
      await c.writeConfig();
      await c.startProcess();
      if (wanted === 'auto' && !(await c.snapshotterLoaded('overlayfs'))) {
        await c.stop();
        c.snapshotter = 'native';
        await c.writeConfig();
        await c.startProcess();
      }
      await c.importImage(SANDBOX_IMAGE_TAR);
    } catch (err) {
      await c.destroy().catch(() => undefined);
      throw err;
    }
    return c;
  }

  /** The config file (version 3); see the module doc for what differs from the defaults. */
  configToml(): string {
    const q = (s: string) => JSON.stringify(s);
    return [
      'version = 3',
      `root = ${q(this.root + '/root')}`,
      `state = ${q(this.state + '/state')}`,
      `temp = ${q(this.root + '/tmp')}`,
      '',
      '[grpc]',
      `  address = ${q(this.socket)}`,
      '',
      '[debug]',
      `  level = ${q(this.logLevel)}`,
      '',
      '[plugins."io.containerd.internal.v1.opt"]',
      `  path = ${q(this.root + '/opt')}`,
      '',
      '[plugins."io.containerd.nri.v1.nri"]',
      '  disable = true',
      '',
      '[plugins."io.containerd.cri.v1.images"]',
      `  snapshotter = ${q(this.snapshotter)}`,
      '  [plugins."io.containerd.cri.v1.images".pinned_images]',
      `    sandbox = ${q(SANDBOX_IMAGE)}`,
      '',
      '[plugins."io.containerd.cri.v1.runtime"]',
      '  restrict_oom_score_adj = true',
      `  netns_mounts_under_state_dir = ${this.netnsUnderStateDir}`,
      // CNI: containerd's defaults, written out so the test reads what it relies on.
      '  [plugins."io.containerd.cri.v1.runtime".cni]',
      '    bin_dirs = ["/opt/cni/bin"]',
      '    conf_dir = "/etc/cni/net.d"',
      '    max_conf_num = 1',
      '  [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]',
      `    BinaryName = ${q(RUNC)}`,
      '',
    ].join('\n');
  }

  /** `ctr -n k8s.io images import` of an OCI archive, unpacked for the CRI's snapshotter. */
  async importImage(tar: string): Promise<void> {
    await this.ctr(['images', 'import', '--snapshotter', this.snapshotter, tar]);
  }

  /** The cgroup parent kubelet-style for a pod (cgroupfs syntax). */
  podCgroupParent(uid: string): string {
    return `${this.cgroupRoot}/pod${uid}`;
  }

  /** Runs `ctr --address <socket> -n k8s.io ARGS` inside the sandbox. */
  ctr(args: string[]) {
    return this.sandbox.exec(join(CONTAINERD_DIR, 'ctr'), ['--address', this.socket, '--namespace', 'k8s.io', ...args], {
      cwd: '/',
      env: CONTAINERD_ENV,
    });
  }

  get running(): boolean {
    return this.proc !== undefined;
  }

  /** PID of the containerd process (0 when stopped). */
  get pid(): number {
    return this.proc?.pid ?? 0;
  }

  /** Starts containerd again (same root and state) and waits until it answers CRI. */
  async start(): Promise<void> {
    await this.startProcess();
  }

  /** SIGTERM, waits for the exit (SIGKILL after 10 s). Shims and pods keep running. */
  async stop(): Promise<void> {
    const p = this.proc;
    if (!p) return;
    this.proc = undefined;
    p.kill('SIGTERM');
    const exited = await Promise.race([p.then(() => true), new Promise<boolean>((r) => setTimeout(() => r(false), 10_000))]);
    if (!exited) {
      p.kill('SIGKILL');
      await p;
    }
  }

  async restart(): Promise<void> {
    await this.stop();
    await this.start();
  }

  /** Waits until the CRI Status reports NetworkReady (containerd loaded a CNI config). */
  async waitNetworkReady(timeoutMs = 30_000): Promise<void> {
    const deadline = Date.now() + timeoutMs;
    let last = '';
    while (Date.now() < deadline) {
      const cond = (await this.cri.status()).find((c) => c.type === 'NetworkReady');
      if (cond?.status) return;
      last = `${cond?.reason ?? ''}: ${cond?.message ?? 'no NetworkReady condition'}`;
      await new Promise((r) => setTimeout(r, 100));
    }
    throw new Error(`containerd network not ready after ${timeoutMs} ms (${last})`);
  }

  /** The last lines of containerd's log (for test failure messages). */
  logTail(lines = 40): string {
    try {
      return readFileSync(this.logFile, 'utf8').split('\n').slice(-lines).join('\n');
    } catch {
      return '';
    }
  }

  async destroy(): Promise<void> {
    await this.cleanup.run();
  }

  private async writeConfig(): Promise<void> {
    await writeFile(this.configPath, this.configToml());
  }

  private async startProcess(): Promise<void> {
    if (this.proc) return;
    this.proc = this.sandbox.spawn(join(CONTAINERD_DIR, 'containerd'), ['--config', this.configPath], {
      cwd: '/',
      logFile: this.logFile,
      env: CONTAINERD_ENV,
    });
    const proc = this.proc;
    const exited = proc.then((r) => r);
    try {
      // A tool failure, not a result: containerd may take a moment to listen.
      await Promise.race([
        this.cri.waitReady(30_000),
        exited.then((r) => {
          throw new Error(`containerd exited (${r.exitCode ?? r.signal}) while starting:\n${this.logTail()}`);
        }),
      ]);
    } catch (err) {
      if (this.proc === proc) await this.stop();
      throw err;
    }
  }

  private async snapshotterLoaded(name: Snapshotter): Promise<boolean> {
    const r = await this.ctr(['plugins', 'ls']);
    return r.stdout
      .split('\n')
      .some((l) => /\bio\.containerd\.snapshotter\.v1\s/.test(l) && l.split(/\s+/)[1] === name && /\bok\s*$/.test(l));
  }

  /**
   * Best effort: Stop + Remove of every sandbox through CRI (so CNI DEL runs), each call within 5 s;
   * the first failure ends it (a hanging DEL would only make every call wait) and killEverything
   * takes over. Whatever a pod leaves in the node netns and tmpfs goes with the sandbox anyway.
   */
  private async removeAllSandboxes(): Promise<void> {
    if (!this.proc) return;
    const cri = new CriClient(this.socket, 5_000);
    try {
      for (const s of await cri.listPodSandbox()) {
        await cri.stopPodSandbox(s.id);
        await cri.removePodSandbox(s.id);
      }
    } catch {
      // containerd or a CNI DEL not answering: killEverything takes over
    } finally {
      cri.close();
    }
  }

  /** containerd, then shims and pods: every process of the sandbox whose command is one of ours. */
  private async killEverything(): Promise<void> {
    this.cri.close();
    await this.stop();
    const ours = (pid: number) => {
      try {
        const cmd = readFileSync(`/proc/${pid}/cmdline`, 'utf8');
        return (
          /(^|\/)containerd-shim[^\0]*/.test(cmd.split('\0')[0] ?? '') ||
          cmd.includes(this.state) ||
          cmd.includes(this.socket) ||
          cmd.startsWith('/pause')
        );
      } catch {
        return false;
      }
    };
    // Shims and their pods; the sandbox's own destroy() sweeps whatever else remains.
    for (let round = 0; round < 30; round++) {
      const pids = this.sandbox.processes().filter(ours);
      if (pids.length === 0) return;
      for (const pid of pids) {
        try {
          process.kill(pid, 'SIGKILL');
        } catch {
          // gone
        }
      }
      await new Promise((r) => setTimeout(r, 100));
    }
  }

  /** rmdir of every cgroup under cgroupRoot in every mounted hierarchy (deepest first). */
  private async removeCgroups(): Promise<void> {
    const mounts = readFileSync('/proc/self/mountinfo', 'utf8')
      .split('\n')
      .map((l) => l.split(' '))
      .filter((f) => {
        const type = f[f.indexOf('-') + 1];
        return type === 'cgroup' || type === 'cgroup2';
      })
      .map((f) => f[4] ?? '');
    const errors: string[] = [];
    const rmTree = async (dir: string): Promise<void> => {
      let entries: Dirent[];
      try {
        entries = await readdir(dir, { withFileTypes: true });
      } catch {
        return;
      }
      for (const e of entries) if (e.isDirectory()) await rmTree(join(dir, e.name));
      await rmdir(dir).catch((err: NodeJS.ErrnoException) => {
        if (err.code !== 'ENOENT') errors.push(`${dir}: ${err.code}`);
      });
    };
    for (const m of new Set(mounts)) if (m) await rmTree(join(m, this.cgroupRoot));
    if (errors.length > 0) throw new Error(`cgroups left: ${errors.join(', ')}`);
  }
}
