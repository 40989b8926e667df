/**
 * Filesystem errors an operator can act on. Node's own (`ENOSPC: no space left on device, write`)
 * name neither the file nor what to do; `fsError` turns one into an FsError (src/errors.ts) whose
 * message says what was being done and on which file, the errno in words, and for the errnos an
 * operator can fix, where and how:
 * - ENOSPC / EDQUOT: the filesystem holding the file's directory (type, mount point, space and
 *   inodes free), to be freed;
 * - EROFS: the directory that must be writable and the read-only mount it lies on;
 * - EACCES / EPERM: the directory refused (owner, mode), the agent's uid and whether it has
 *   CAP_DAC_OVERRIDE (root without it obeys owner and mode; with it, only a security policy or
 *   the filesystem refuses), what to check;
 * - EIO, EMFILE, ENFILE: the disk, the open-file limits.
 * `code` (and `errno`) stay the errno's, so callers that check `err.code === 'ENOENT'` still work.
 * What the message reports of the node (mounts, free space, modes) is read when the error is made,
 * never on a path that succeeds.
 */
import { readFileSync, realpathSync, statfsSync, statSync } from 'node:fs';
import { constants as osConstants } from 'node:os';
import { basename, dirname } from 'node:path';
import { getSystemErrorMap } from 'node:util';
import { FsError } from '../errors.js';

/** Words for the errnos an operator meets on a node's disks (libuv has none for EDQUOT, and says "i/o error"). */
const WORDS: Record<string, string> = {
  ENOSPC: 'no space left on device',
  EDQUOT: 'disk quota exceeded',
  EROFS: 'read-only file system',
  EACCES: 'permission denied',
  EPERM: 'operation not permitted',
  EIO: 'input/output error',
};

const NAMES = new Map<number, string>(Object.entries(osConstants.errno).map(([k, v]) => [v, k]));
const CAP_DAC_OVERRIDE = 1n;

interface SystemError {
  code: string;
  errno: number;
  syscall: string | undefined;
  /** The path of the failing call (a temporary file, a directory being made) and its second path (rename, copy). */
  path: string | undefined;
  dest: string | undefined;
}

function systemError(err: unknown): SystemError | undefined {
  if (typeof err !== 'object' || err === null) return undefined;
  const e = err as { code?: unknown; errno?: unknown; syscall?: unknown; path?: unknown; dest?: unknown };
  if (typeof e.code !== 'string' || !/^E[A-Z0-9]+$/.test(e.code)) return undefined;
  const errno = typeof e.errno === 'number' ? Math.abs(e.errno) : (osConstants.errno as Record<string, number>)[e.code];
  if (errno === undefined) return undefined;
  return {
    code: e.code,
    errno,
    syscall: typeof e.syscall === 'string' ? e.syscall : undefined,
    path: typeof e.path === 'string' ? e.path : undefined,
    dest: typeof e.dest === 'string' ? e.dest : undefined,
  };
}

/**
 * `err` as an FsError saying that `op` ('write', 'remove', 'create', 'read', ...) on `what` ('the
 * pod record') at `path` failed, and why; an FsError is returned as it is (never wrapped twice),
 * and anything that is not a system error (no errno code) too.
 */
export function fsError(err: unknown, op: string, what: string, path: string): unknown {
  if (err instanceof FsError) return err;
  const e = systemError(err);
  if (!e) return err;
  return makeFsError(e, op, what, path, err);
}

/** The FsError of a libc call that gave a bare errno (koffi: linkat, flock), on `path`. */
export function fsErrnoError(errno: number, syscall: string, op: string, what: string, path: string): FsError {
  const code = NAMES.get(errno) ?? `errno ${errno}`;
  return makeFsError({ code, errno, syscall, path, dest: undefined }, op, what, path, undefined);
}

/** `fn()`, its system errors as fsError(err, op, what, path). */
export function fsTry<T>(op: string, what: string, path: string, fn: () => T): T {
  try {
    return fn();
  } catch (err) {
    throw fsError(err, op, what, path);
  }
}

function makeFsError(e: SystemError, op: string, what: string, path: string, cause: unknown): FsError {
  const words = WORDS[e.code] ?? getSystemErrorMap().get(-e.errno)?.[1] ?? 'system error';
  const advice = adviceFor(e, op, path);
  // Without advice, the failing call on another path (the source of a copy, a directory being made)
  // says more; not on a temporary file of the target (atomic-file.ts names them `.<name>….tmp`).
  const other = e.path !== undefined && e.path !== path && !/^\..*\.tmp$/.test(basename(e.path));
  const call = !advice && e.syscall && other ? ` (${e.syscall} ${e.path}${e.dest ? ` -> ${e.dest}` : ''})` : '';
  const message = `cannot ${op} ${what} ${path}: ${words} (${e.code})${call}${advice ? `: ${advice}` : ''}`;
  return new FsError({ code: e.code, errno: e.errno, syscall: e.syscall, path, op }, message, cause === undefined ? undefined : { cause });
}

function adviceFor(e: SystemError, op: string, path: string): string | undefined {
  // Space and mounts are the target's directory's (a temporary or spare file of it is on the same filesystem).
  const home = nearestDir(dirname(path));
  switch (e.code) {
    case 'ENOSPC':
      return `free space or inodes on the filesystem holding ${home} (${describeFs(home, true)})`;
    case 'EDQUOT':
      return `free space or raise the agent's quota on the filesystem holding ${home} (${describeFs(home, true)})`;
    case 'EROFS':
      return `${home} must be writable, but the filesystem holding it (${describeFs(home, false)}) is read-only: mount it read-write`;
    case 'EACCES':
    case 'EPERM': {
      // Refused where the call was made: the directory it lists or makes a file in (O_TMPFILE), else
      // the one it creates in, renames in or opens from.
      const at = e.dest ?? e.path ?? path;
      const dir = e.syscall !== 'mkdir' && e.syscall !== 'rmdir' && isDirectory(at) ? at : nearestDir(dirname(at));
      const verb = op === 'read' ? 'read' : 'write';
      const attrs = e.code === 'EPERM' ? 'the immutable and append-only attributes (lsattr; chattr -i -a), ' : '';
      return `the agent (${describeAgent()}) may not ${verb} in ${dir} (${describeOwner(dir)}): check ${attrs}the owner and mode of ${dir} and of its files, and any security policy confining the agent (SELinux, AppArmor)`;
    }
    case 'EIO':
      return `the filesystem holding ${home} (${describeFs(home, false)}) failed to read or write: check the disk and the kernel log (dmesg)`;
    case 'EMFILE':
      return "the agent holds too many open files: raise its open-file limit (ulimit -n, the container's or unit's LimitNOFILE)";
    case 'ENFILE':
      return 'the node has too many open files: raise fs.file-max or find what holds them';
    default:
      return undefined;
  }
}

function isDirectory(p: string): boolean {
  try {
    return statSync(p).isDirectory();
  } catch {
    return false;
  }
}

/** `p` when it is a directory, else its nearest ancestor that is ('/' at worst). */
function nearestDir(p: string): string {
  let d = p;
  while (!isDirectory(d) && d !== dirname(d)) d = dirname(d);
  return d;
}

/** "tmpfs at /var/lib/kubenet" (with space and inodes free), from /proc/self/mountinfo and statfs(2). */
function describeFs(dir: string, space: boolean): string {
  const m = mountOf(dir);
  const where = m ? `${m.fstype} at ${m.point}` : 'mount unknown';
  if (!space) return where;
  try {
    const s = statfsSync(dir);
    return `${where}: ${bytes(s.bavail * s.bsize)} of ${bytes(s.blocks * s.bsize)} free, ${s.ffree} inodes free`;
  } catch {
    return where;
  }
}

/** The mount holding `dir`: the last-mounted of the longest mount points containing its real path. */
export function mountOf(dir: string): { point: string; fstype: string } | undefined {
  let real = dir;
  try {
    real = realpathSync(dir);
  } catch {
    // as given
  }
  let text: string;
  try {
    text = readFileSync('/proc/self/mountinfo', 'utf8');
  } catch {
    return undefined;
  }
  let best: { point: string; fstype: string } | undefined;
  for (const line of text.split('\n')) {
    // id parent major:minor root mountpoint options [optional fields...] - fstype source super-options
    const f = line.split(' ');
    const sep = f.indexOf('-', 6);
    if (sep < 0 || f.length < sep + 2) continue;
    const point = (f[4] ?? '').replace(/\\([0-7]{3})/g, (_, o: string) => String.fromCharCode(parseInt(o, 8)));
    const inside = real === point || point === '/' || real.startsWith(`${point}/`);
    if (!inside || (best && point.length < best.point.length)) continue;
    best = { point, fstype: f[sep + 1] ?? '?' };
  }
  return best;
}

function bytes(n: number): string {
  const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB', 'PiB'];
  let v = n;
  let i = 0;
  while (v >= 1024 && i < units.length - 1) {
    v /= 1024;
    i++;
  }
  return `${i === 0 || v >= 10 ? Math.round(v) : v.toFixed(1)} ${units[i]}`;
}

/** "uid 0, without CAP_DAC_OVERRIDE" */
function describeAgent(): string {
  const uid = process.getuid?.();
  let cap = '';
  try {
    const eff = /^CapEff:\s*([0-9a-f]+)$/m.exec(readFileSync('/proc/self/status', 'utf8'))?.[1];
    if (eff !== undefined) cap = (BigInt(`0x${eff}`) >> CAP_DAC_OVERRIDE) & 1n ? ', with CAP_DAC_OVERRIDE' : ', without CAP_DAC_OVERRIDE';
  } catch {
    // not Linux
  }
  return `uid ${uid ?? '?'}${cap}`;
}

/** "owner 65534:65534, mode 0755" */
function describeOwner(dir: string): string {
  try {
    const s = statSync(dir);
    return `owner ${s.uid}:${s.gid}, mode ${(s.mode & 0o7777).toString(8).padStart(4, '0')}`;
  } catch {
    return 'owner unknown';
  }
}
