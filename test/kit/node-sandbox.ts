/**
 * A "node sandbox": a network namespace that plays a Kubernetes node, plus a private mount
 * namespace in which the node's well-known directories are fresh tmpfs, so an agent, a container
 * runtime and CNI plugins can run there with their literal default paths without touching the host.
 *
 * ```
 *   host (root netns, host mounts)
 *     ├─ netns <prefix>-<tag>       the node: lo up, uplink <prefix><tag>u = 198.18-19.x.1/24,
 *     │                             default route via the lan side
 *     └─ netns <prefix>-<tag>-lan   "outside": <prefix><tag>l = 198.18-19.x.2/24
 *   mount namespace of a holder process (`sleep infinity`, pid = holderPid), in the node netns:
 *     tmpfs over every `tmpfsDirs` entry (default NODE_TMPFS_DIRS), /sys remounted for the node
 *     netns (so /sys/class/net lists the node's links) with the host's /sys/fs/cgroup kept;
 *     every other path is the host's. Propagation is slave: network namespaces the host adds
 *     later under /run/netns (`ip netns add`) appear inside; mounts made inside never leak out.
 * ```
 *
 * - `exec` / `spawn` run a process in both namespaces (`nsenter -t <holder> -m -n`), in the
 *   caller's working directory by default (the host's paths outside the tmpfs dirs are the same).
 * - `hostPath(p)` is the path of the sandbox's file `p` as the host sees it (/proc/<holder>/root/p):
 *   read pod records, IPAM files or a unix socket inside from the test process.
 * - `tmpDir` is a host temp directory, also visible inside at the same path (configs, sockets).
 * - `exposeHostPort(port)` makes 127.0.0.1:<port> inside the node reach 127.0.0.1:<port> of the
 *   host (a relay over a unix socket), e.g. for a fake API server the test serves.
 * - `destroy()` kills every process of the sandbox's mount namespace and their descendants (also
 *   ones the test did not start through `spawn`: container shims, pod processes), kills the
 *   holder (the tmpfs mounts vanish with its namespace), deletes both netns and `tmpDir`. It works
 *   after a partial or failed setup, and reports every failure together.
 *
 * Host changes that remain: a `tmpfsDirs` entry missing on the host is created there as an empty
 * directory (a mount point must exist), and is never removed, because another sandbox may be using
 * it as its mount point at that moment; so is /usr/lib/cni, where the reference CNI plugins that
 * hack/build-upstream.sh built are bind-mounted inside, read-only (where the DaemonSet image holds
 * them).
 * Needs root, iproute2, util-linux (unshare, nsenter, mountpoint) and node.
 */
import { execa, type Options as ExecaOptions, type ResultPromise } from 'execa';
import { randomInt } from 'node:crypto';
import { readdirSync, readFileSync, readlinkSync, realpathSync } from 'node:fs';
import { createConnection, createServer, type Server, type Socket } from 'node:net';
import { join } from 'node:path';
import { Cleanup, makeTmpDir, rmrf, uniq } from './kernel.js';
import { REF_PLUGINS_DIR } from './upstream.js';

/** The directories an agent and CNI plugins write with their defaults. */
export const NODE_TMPFS_DIRS = ['/var/lib/cni', '/var/lib/kubenet', '/etc/cni/net.d', '/opt/cni/bin', '/run/kubenet'] as const;
/** And those a containerd with default paths writes (add them for the containerd harness). */
export const CONTAINERD_TMPFS_DIRS = ['/run/containerd', '/var/lib/containerd'] as const;

export interface NodeSandboxOptions {
  /** Prefix of every kernel object (netns `<prefix>-<tag>`, links `<prefix><tag>u|l`); default 'kcr'. Keep it ≤ 5 characters. */
  prefix?: string;
  /** Directories that get a fresh tmpfs inside; default NODE_TMPFS_DIRS. */
  tmpfsDirs?: readonly string[];
}

export interface SandboxExecOptions {
  input?: string;
  env?: Record<string, string>;
  /** Working directory inside; default the caller's cwd. */
  cwd?: string;
  /** Default true: a non-zero exit throws. */
  reject?: boolean;
  timeout?: number;
}

export interface SandboxSpawnOptions {
  env?: Record<string, string>;
  cwd?: string;
  /** Append stdout and stderr to this (host) file instead of piping them. */
  logFile?: string;
}

/** The uplink between the node and the lan namespace. */
export interface Uplink {
  /** Interface in the node netns, and its address (no prefix length). */
  nodeIf: string;
  nodeIp: string;
  /** Interface in the lan netns, and its address. */
  lanIf: string;
  lanIp: string;
  prefixLen: number;
}

const HOLDER_SCRIPT = `set -eu
scratch="$1"; refplugins="$2"; shift 2
for d in "$@"; do
  mkdir -p "$d"
  mount -t tmpfs -o mode=0755 kcr-node-sandbox "$d"
  # Shared, as every mount of a systemd host is: a container's HostToContainer (rslave) mount of
  # it sees what is mounted there later (containerd's pod netns under /run/netns).
  mount --make-shared "$d"
done
# The reference plugins where the DaemonSet image holds them (manifest: pluginBinDirs).
mkdir -p /usr/lib/cni
mount --bind -o ro "$refplugins" /usr/lib/cni
# /sys as seen from the node netns (what ip netns exec does), keeping the host's cgroup mounts.
mkdir -p "$scratch/sys"
mount -t sysfs kcr-sysfs "$scratch/sys"
if mountpoint -q /sys/fs/cgroup; then mount --move /sys/fs/cgroup "$scratch/sys/fs/cgroup"; fi
umount -l /sys
mount --move "$scratch/sys" /sys
rmdir "$scratch/sys" 2>/dev/null || true
echo ready
exec sleep infinity
`;

/** Relay run inside: 127.0.0.1:<port> → the unix socket the test process serves. */
const RELAY_SCRIPT = `const net = require('node:net');
const [port, path] = process.argv.slice(1);
const srv = net.createServer((c) => { const u = net.connect(path); c.pipe(u).pipe(c); c.on('error', () => u.destroy()); u.on('error', () => c.destroy()); });
srv.listen(Number(port), '127.0.0.1', () => console.log('listening'));
`;

export class NodeSandbox {
  readonly tag = uniq(6);
  readonly prefix: string;
  /** Node netns name and path. */
  readonly netns: string;
  readonly netnsPath: string;
  /** The "outside" netns on the other end of the uplink. */
  readonly lanNetns: string;
  readonly lanNetnsPath: string;
  readonly uplink: Uplink;
  readonly tmpfsDirs: readonly string[];
  /** Host temp dir, visible inside at the same path. */
  tmpDir = '';
  /** PID of the process holding the mount namespace (0 until started). */
  holderPid = 0;
  private readonly cleanup = new Cleanup();
  private readonly children = new Set<ResultPromise>();
  private readonly relays: Server[] = [];

  private constructor(opts: NodeSandboxOptions) {
    this.prefix = opts.prefix ?? 'kcr';
    this.tmpfsDirs = opts.tmpfsDirs ?? NODE_TMPFS_DIRS;
    this.netns = `${this.prefix}-${this.tag}`;
    this.netnsPath = `/var/run/netns/${this.netns}`;
    this.lanNetns = `${this.prefix}-${this.tag}-lan`;
    this.lanNetnsPath = `/var/run/netns/${this.lanNetns}`;
    // A random /24 of the benchmarking range 198.18.0.0/15: only ever on these two namespaces.
    const net = `198.${18 + randomInt(2)}.${randomInt(256)}`;
    this.uplink = {
      nodeIf: `${this.prefix}${this.tag}u`,
      nodeIp: `${net}.1`,
      lanIf: `${this.prefix}${this.tag}l`,
      lanIp: `${net}.2`,
      prefixLen: 24,
    };
  }

  /** Builds the sandbox; on any failure what was made is removed and the error rethrown. */
  static async create(opts: NodeSandboxOptions = {}): Promise<NodeSandbox> {
    const s = new NodeSandbox(opts);
    try {
      await s.setup();
    } catch (err) {
      await s.destroy().catch(() => undefined);
      throw err;
    }
    return s;
  }

  private async setup(): Promise<void> {
    this.tmpDir = await makeTmpDir(`${this.prefix}-sandbox`);
    const tmpDir = this.tmpDir;
    this.cleanup.add(() => rmrf(tmpDir));
    // Deleted after every process inside is gone (cleanup runs last-in, first-out).
    this.cleanup.add(() => execa('ip', ['netns', 'del', this.lanNetns], { reject: false }));
    this.cleanup.add(() => execa('ip', ['netns', 'del', this.netns], { reject: false }));
    await execa('ip', ['netns', 'add', this.netns]);
    await execa('ip', ['netns', 'add', this.lanNetns]);
    const u = this.uplink;
    await execa('ip', ['-n', this.netns, 'link', 'add', u.nodeIf, 'type', 'veth', 'peer', 'name', u.lanIf, 'netns', this.lanNetns]);
    await execa('ip', ['-n', this.netns, '-batch', '-'], {
      input:
        [
          `link set lo up`,
          `addr add ${u.nodeIp}/${u.prefixLen} dev ${u.nodeIf}`,
          `link set ${u.nodeIf} up`,
          `route add default via ${u.lanIp}`,
        ].join('\n') + '\n',
    });
    await execa('ip', ['-n', this.lanNetns, '-batch', '-'], {
      input: [`link set lo up`, `addr add ${u.lanIp}/${u.prefixLen} dev ${u.lanIf}`, `link set ${u.lanIf} up`].join('\n') + '\n',
    });

    this.cleanup.add(() => this.killAll());
    const holder = execa(
      'unshare',
      [
        '--mount',
        '--propagation',
        'slave',
        '--',
        'nsenter',
        `--net=${this.netnsPath}`,
        '--',
        'sh',
        '-c',
        HOLDER_SCRIPT,
        'holder',
        tmpDir,
        realpathSync(REF_PLUGINS_DIR),
        ...this.tmpfsDirs,
      ],
      {
        reject: false,
        stdin: 'ignore',
      },
    );
    this.children.add(holder);
    this.holderPid = holder.pid ?? 0;
    const ready = await new Promise<boolean>((resolve) => {
      let out = '';
      holder.stdout?.on('data', (d: Buffer) => {
        out += d.toString();
        if (out.includes('ready')) resolve(true);
      });
      void holder.then(() => resolve(false));
    });
    if (!ready) {
      const r = await holder;
      throw new Error(`node sandbox: the mount namespace holder failed (exit ${r.exitCode}): ${String(r.stderr)}`);
    }
  }

  /** Runs a command inside the node (both namespaces) and waits for it. */
  exec(cmd: string, args: string[], opts: SandboxExecOptions = {}) {
    const [file, argv] = this.nsenter(cmd, args, opts.cwd);
    return execa(file, argv, {
      reject: opts.reject ?? true,
      ...(opts.input !== undefined ? { input: opts.input } : { stdin: 'ignore' as const }),
      ...(opts.env ? { env: opts.env } : {}),
      ...(opts.timeout ? { timeout: opts.timeout } : {}),
    });
  }

  /**
   * Starts a long-running process inside the node. It is killed by `destroy()` if still running;
   * stop it earlier yourself with `.kill()` and await it. nsenter execs the command, so the
   * returned process's pid is the command's pid.
   */
  spawn(cmd: string, args: string[], opts: SandboxSpawnOptions = {}): ResultPromise {
    const [file, argv] = this.nsenter(cmd, args, opts.cwd);
    const io: ExecaOptions = opts.logFile
      ? { stdout: { file: opts.logFile, append: true }, stderr: { file: opts.logFile, append: true } }
      : {};
    const child = execa(file, argv, {
      reject: false,
      stdin: 'ignore',
      ...io,
      ...(opts.env ? { env: opts.env } : {}),
    }) as unknown as ResultPromise;
    this.children.add(child);
    void child.finally(() => this.children.delete(child));
    return child;
  }

  /** Runs a command in the lan netns (host mount namespace). */
  execLan(cmd: string, args: string[], opts: { input?: string; reject?: boolean; timeout?: number } = {}) {
    return execa('ip', ['netns', 'exec', this.lanNetns, cmd, ...args], {
      reject: opts.reject ?? true,
      ...(opts.input !== undefined ? { input: opts.input } : { stdin: 'ignore' as const }),
      ...(opts.timeout ? { timeout: opts.timeout } : {}),
    });
  }

  /** The host-visible path of the sandbox's path `p` (absolute). */
  hostPath(p: string): string {
    if (!p.startsWith('/')) throw new Error(`hostPath needs an absolute path, got ${p}`);
    return `/proc/${this.holderPid}/root${p}`;
  }

  /**
   * Makes 127.0.0.1:`port` inside the node reach 127.0.0.1:`port` on the host, through a relay
   * (node, inside) and a unix socket in `tmpDir` that this process serves. Returns once it listens.
   */
  async exposeHostPort(port: number): Promise<void> {
    const path = join(this.tmpDir, `relay-${port}.sock`);
    const server = createServer((inside: Socket) => {
      const host = createConnection({ host: '127.0.0.1', port });
      inside.pipe(host).pipe(inside);
      inside.on('error', () => host.destroy());
      host.on('error', () => inside.destroy());
    });
    await new Promise<void>((resolve, reject) => {
      server.once('error', reject);
      server.listen(path, () => resolve());
    });
    this.relays.push(server);
    const relay = this.spawn(process.execPath, ['-e', RELAY_SCRIPT, String(port), path], { cwd: '/' });
    await new Promise<void>((resolve, reject) => {
      const timer = setTimeout(() => reject(new Error(`relay for port ${port} did not start`)), 10_000);
      relay.stdout?.on('data', (d: Buffer) => {
        if (d.toString().includes('listening')) {
          clearTimeout(timer);
          resolve();
        }
      });
      void relay.then((r) => {
        clearTimeout(timer);
        reject(new Error(`relay for port ${port} exited (${r.exitCode}): ${String(r.stderr)}`));
      });
    });
  }

  /**
   * PIDs of the processes in the sandbox's mount namespace, and of all their descendants (pod
   * processes live in mount namespaces of their own but descend from shims that live here). The
   * holder is excluded.
   */
  processes(): number[] {
    if (!this.holderPid) return [];
    let mntNs: string;
    try {
      mntNs = readlinkSync(`/proc/${this.holderPid}/ns/mnt`);
    } catch {
      return [];
    }
    const parent = new Map<number, number>();
    const inNs = new Set<number>();
    for (const e of readdirSync('/proc')) {
      const pid = Number(e);
      if (!Number.isInteger(pid) || pid === this.holderPid || pid === process.pid) continue;
      try {
        if (readlinkSync(`/proc/${pid}/ns/mnt`) === mntNs) inNs.add(pid);
        const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
        // pid (comm) state ppid ...: comm may hold spaces and parentheses; split after the last ')'.
        const ppid = Number(stat.slice(stat.lastIndexOf(')') + 2).split(' ')[1]);
        parent.set(pid, ppid);
      } catch {
        // gone meanwhile
      }
    }
    const out = new Set(inNs);
    let grew = true;
    while (grew) {
      grew = false;
      for (const [pid, ppid] of parent) {
        if (!out.has(pid) && (out.has(ppid) || ppid === this.holderPid)) {
          out.add(pid);
          grew = true;
        }
      }
    }
    return [...out];
  }

  /** Kills everything inside (SIGKILL, repeated until none is left, at most ~5 s), then the holder. */
  private async killAll(): Promise<void> {
    for (const server of this.relays.splice(0)) server.close();
    for (let round = 0; round < 50; round++) {
      const pids = this.processes();
      if (pids.length === 0) break;
      for (const pid of pids) {
        try {
          process.kill(pid, 'SIGKILL');
        } catch {
          // already gone
        }
      }
      await new Promise((r) => setTimeout(r, 100));
    }
    const left = this.processes();
    for (const child of this.children) child.kill('SIGKILL');
    await Promise.all([...this.children].map((c) => c.catch(() => undefined)));
    this.children.clear();
    this.holderPid = 0;
    if (left.length > 0) throw new Error(`node sandbox ${this.netns}: processes survived SIGKILL: ${left.join(' ')}`);
  }

  /** Removes everything (see the module doc). Safe to call more than once. */
  async destroy(): Promise<void> {
    await this.cleanup.run();
  }

  private nsenter(cmd: string, args: string[], cwd = process.cwd()): [string, string[]] {
    if (!this.holderPid) throw new Error('node sandbox is not running');
    return ['nsenter', ['-t', String(this.holderPid), '-m', '-n', `--wd=${cwd}`, '--', cmd, ...args]];
  }
}
