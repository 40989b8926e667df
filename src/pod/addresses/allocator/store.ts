/**
 * host-local's disk store (plugins/ipam/host-local/backend/disk, reference plugins v1.10.0), byte
 * for byte, so the real host-local and the agent share one directory:
 * - `<dataDir>/<network>/` (made 0755), one file per reserved address, named by the address as
 *   Go writes it (dotted IPv4, RFC 5952 IPv6), mode 0600, holding `<container ID trimmed>\r\n<ifname>`
 *   and nothing else (no final line break). Files of host-local before 0.8.6 hold the ID alone: a
 *   release by ID takes them when no file names the ID and interface (ReleaseByID).
 * - `last_reserved_ip.<range set index>` (0600): the last address reserved in that set, no line break.
 * - `lock` (made O_CREAT|O_RDONLY, 0750, by go-filemutex), on which host-local takes flock(2)
 *   LOCK_EX around every allocation, release, CHECK and GC. The agent takes the same lock around
 *   every change: flock on a descriptor of that file, a fresh one per transaction (flock locks
 *   belong to the open file description, so two of this process's exclude each other as two
 *   processes do; a process that dies drops its lock with its descriptors).
 *
 * How the lock is taken: flock(2) bound with koffi (libc.ts; koffi is already how the agent calls
 * libnl). First LOCK_EX|LOCK_NB on the event loop (~1 µs); only when another process holds the
 * lock does a blocking LOCK_EX wait on a libuv worker thread, so the agent never blocks its event
 * loop on host-local. Transactions of this process are queued in-process first, so at most one of
 * them waits on a worker thread per directory. util-linux flock(1) (what reservations.ts uses)
 * would cost a fork+exec per transaction and cannot hold the lock across the agent's own calls.
 * (libuv opens every file O_CLOEXEC: no plugin the agent execs inherits the lock.)
 * Everything under the lock is synchronous (small files in one directory: microseconds per call),
 * so the lock is held for as short a time as the work allows. The reservation files are read once
 * and then kept in an index for as long as nobody else changes the directory (dir-watch.ts tells):
 * an ADD's duplicate check and a DEL need not read every file each time, as host-local does.
 *
 * One deliberate difference in HOW (never in WHAT ends on disk): host-local creates a reservation
 * with O_EXCL and then writes the ID into it, so a host-local killed between the two leaves an empty
 * file no DEL can release (see reservations.ts). The agent writes the content into an unnamed
 * O_TMPFILE file in the directory and links it under the address's name (linkat, which fails with
 * EEXIST as O_EXCL does): the name appears with its whole content or not at all, and a process
 * killed at any point leaves no file behind. `last_reserved_ip.N` is rewritten in place without
 * truncating it first (a longer value overwrites the old; a shorter one truncates to its own length
 * first), so it is never empty either; at worst, killed between the two steps, it holds a prefix of
 * the old address: a round-robin hint off by some addresses, which host-local tolerates too ("not
 * critical, we just lose round-robin this one time"). Filesystems without O_TMPFILE fall back to
 * host-local's own way.
 */
import {
  closeSync,
  constants,
  fstatSync,
  ftruncateSync,
  mkdirSync,
  openSync,
  readdirSync,
  type Dirent,
  readFileSync,
  unlinkSync,
  writeSync,
} from 'node:fs';
import { join } from 'node:path';
import { KubenetError } from '../../../errors.js';
import { fsErrnoError, fsError, fsTry } from '../../../util/fs-error.js';
import { KeyedMutex } from '../../../util/keyed-mutex.js';
import { dirWatch, type WatchedDir } from './dir-watch.js';
import {
  AT_FDCWD,
  AT_SYMLINK_FOLLOW,
  EEXIST,
  EINTR,
  EWOULDBLOCK,
  flockExclusiveAsync,
  fns,
  lastErrno,
  LOCK_EX,
  LOCK_NB,
  LOCK_UN,
  O_TMPFILE,
} from './libc.js';

export const LOCK_FILE = 'lock';
export const LAST_IP_PREFIX = 'last_reserved_ip.';
/** host-local's separator of container ID and interface name in a reservation file. */
export const LINE_BREAK = '\r\n';

/**
 * A store call failed other than with an errno (a network name that cannot be a directory, a write
 * the kernel cut short); failures with an errno are FsErrors naming the file (src/util/fs-error.ts).
 */
export class HostLocalStoreError extends KubenetError {
  readonly errno: number | undefined;
  constructor(message: string, errno?: number, options?: { cause?: unknown }) {
    super(errno === undefined ? message : `${message} (errno ${errno})`, options);
    this.errno = errno;
  }
}

/** The content host-local writes for a reservation (disk.Store.Reserve). */
export function reservationContent(containerId: string, ifName: string): string {
  return containerId.trim() + LINE_BREAK + ifName;
}

/** True for the names host-local's GC treats as reservations (disk isReservation). */
export function isReservationName(name: string): boolean {
  return name !== LOCK_FILE && !name.startsWith(LAST_IP_PREFIX);
}

/** One reservation file: its name (an address) and its content, trimmed as host-local compares it. */
export interface StoredReservation {
  name: string;
  key: string;
}

/** What a transaction may do; every call is synchronous and runs under the lock. */
export interface LockedStore {
  /** Reserves `name` for the attachment (false when it is taken) and records it as the set's last reserved. */
  reserve(containerId: string, ifName: string, name: string, rangeId: number): boolean;
  /** The raw content of `last_reserved_ip.<rangeId>`, undefined when there is none. */
  lastReserved(rangeId: number): string | undefined;
  /** Every reservation file (regular files other than the lock and last_reserved_ip.N). */
  reservations(): StoredReservation[];
  /** Removes a reservation file; false when it was gone. */
  remove(name: string): boolean;
}

const mutex = new KeyedMutex();
let scans = 0;

/** How many times this process read a store's reservation files from its directory (tests, debugging). */
export function reservationScans(): number {
  return scans;
}

/** The store of one network: `<dataDir>/<network>`. */
export class DiskStore {
  readonly dir: string;
  private tmpfile = true;
  /**
   * The reservation files (name → content, trimmed) as of this store's last transaction, kept while
   * the directory's watch says nobody else changed it (dir-watch.ts); undefined: read the directory.
   */
  private index: Map<string, string> | undefined;
  private indexGeneration = -1;
  private watched: WatchedDir | undefined;

  constructor(dataDir: string, network: string) {
    if (network === '' || network.includes('/') || network === '.' || network === '..') {
      throw new HostLocalStoreError(`host-local: network name ${JSON.stringify(network)} cannot name a directory`);
    }
    this.dir = join(dataDir, network);
  }

  /** Runs `fn` holding host-local's lock (this process's transactions on the directory queue first). */
  locked<T>(fn: (store: LockedStore) => T): Promise<T> {
    return mutex.run(this.dir, async () => {
      const fd = await this.lock();
      let done = false;
      try {
        this.beginIndex();
        const out = fn(this.view());
        done = true;
        return out;
      } finally {
        this.endIndex(done);
        fns.flock(fd, LOCK_UN);
        closeSync(fd);
      }
    });
  }

  /** Under the lock, first: the index goes when the directory changed since this store's last transaction. */
  private beginIndex(): void {
    dirWatch.poll();
    if (!this.watched?.live) {
      this.watched = dirWatch.watch(this.dir);
      this.index = undefined;
    }
    if (this.watched?.generation !== this.indexGeneration) this.index = undefined;
  }

  /** Under the lock, last: this transaction's own changes are in the index already; their events are taken as seen. */
  private endIndex(completed: boolean): void {
    dirWatch.poll();
    if (!completed || !this.watched?.live) this.index = undefined;
    else this.indexGeneration = this.watched.generation;
  }

  private async lock(): Promise<number> {
    const lockFile = join(this.dir, LOCK_FILE);
    fsTry('create', "host-local's network directory", this.dir, () => mkdirSync(this.dir, { recursive: true, mode: 0o755 }));
    const fd = fsTry('open', "host-local's lock file", lockFile, () => openSync(lockFile, constants.O_CREAT | constants.O_RDONLY, 0o750));
    try {
      for (let attempt = 0; ; attempt++) {
        if (fns.flock(fd, LOCK_EX | LOCK_NB) === 0) return fd;
        const errno = lastErrno();
        if (errno !== EWOULDBLOCK && errno !== EINTR) throw fsErrnoError(errno, 'flock', 'lock', "host-local's lock file", lockFile);
        // Held by another process: wait for it off the event loop. A failed wait (EINTR) tries again.
        if ((await flockExclusiveAsync(fd)) === 0) return fd;
        if (attempt >= 100) throw new HostLocalStoreError(`host-local: flock ${join(this.dir, LOCK_FILE)} keeps failing`);
      }
    } catch (err) {
      closeSync(fd);
      throw err;
    }
  }

  private view(): LockedStore {
    return {
      reserve: (id, ifName, name, rangeId) => this.reserve(id, ifName, name, rangeId),
      lastReserved: (rangeId) => {
        try {
          return readFileSync(join(this.dir, LAST_IP_PREFIX + rangeId), 'latin1');
        } catch {
          return undefined; // host-local logs and ignores any error here
        }
      },
      reservations: () => this.reservations(),
      remove: (name) => {
        try {
          unlinkSync(join(this.dir, name));
          this.index?.delete(name);
          return true;
        } catch {
          this.index = undefined;
          return false; // host-local's ReleaseByKey ignores a failed remove too
        }
      },
    };
  }

  private reserve(containerId: string, ifName: string, name: string, rangeId: number): boolean {
    const path = join(this.dir, name);
    const content = Buffer.from(reservationContent(containerId, ifName), 'utf8');
    const made = (this.tmpfile ? this.linkNew(path, content) : undefined) ?? this.createExclusive(path, content);
    if (!made) {
      // Taken: by a reservation the index knows, or else the index missed a change; read again next time.
      if (this.index && !this.index.has(name)) this.index = undefined;
      return false;
    }
    this.index?.set(name, content.toString('utf8').trim());
    const last = join(this.dir, LAST_IP_PREFIX + rangeId);
    fsTry('write', "host-local's last reserved address", last, () => writeInPlace(last, Buffer.from(name, 'latin1')));
    return true;
  }

  /** The content in an unnamed file, then linked as `path`: true, false when `path` exists, undefined without O_TMPFILE. */
  private linkNew(path: string, content: Buffer): boolean | undefined {
    let fd: number;
    try {
      fd = openSync(this.dir, O_TMPFILE | constants.O_WRONLY, 0o600);
    } catch (err) {
      const code = (err as { code?: string }).code;
      if (code === 'EOPNOTSUPP' || code === 'EISDIR' || code === 'EINVAL' || code === 'ENOTSUP') {
        this.tmpfile = false;
        return undefined;
      }
      throw fsError(err, 'create', 'the address reservation', path);
    }
    try {
      fsTry('write', 'the address reservation', path, () => writeAll(fd, content, path));
      if (fns.linkat(AT_FDCWD, `/proc/self/fd/${fd}`, AT_FDCWD, path, AT_SYMLINK_FOLLOW) === 0) return true;
      const errno = lastErrno();
      if (errno === EEXIST) return false;
      throw fsErrnoError(errno, 'linkat', 'create', 'the address reservation', path);
    } finally {
      closeSync(fd);
    }
  }

  /** host-local's way: O_EXCL create, then write; removed again when the write fails. */
  private createExclusive(path: string, content: Buffer): boolean {
    let fd: number;
    try {
      fd = openSync(path, constants.O_RDWR | constants.O_EXCL | constants.O_CREAT, 0o600);
    } catch (err) {
      if ((err as { code?: string }).code === 'EEXIST') return false;
      throw fsError(err, 'create', 'the address reservation', path);
    }
    try {
      writeAll(fd, content, path);
    } catch (err) {
      closeSync(fd);
      unlinkSync(path);
      throw fsError(err, 'write', 'the address reservation', path);
    }
    closeSync(fd);
    return true;
  }

  private reservations(): StoredReservation[] {
    if (this.index) return [...this.index].map(([name, key]) => ({ name, key }));
    const out = this.readReservations();
    if (this.watched?.live) this.index = new Map(out.map((r) => [r.name, r.key]));
    return out;
  }

  private readReservations(): StoredReservation[] {
    scans++;
    const out: StoredReservation[] = [];
    let entries: Dirent[];
    try {
      entries = readdirSync(this.dir, { withFileTypes: true });
    } catch (err) {
      if ((err as { code?: string }).code === 'ENOENT') return out;
      throw fsError(err, 'read', 'the address reservations in', this.dir);
    }
    for (const e of entries) {
      if (!e.isFile() || !isReservationName(e.name)) continue;
      try {
        out.push({ name: e.name, key: readFileSync(join(this.dir, e.name), 'utf8').trim() });
      } catch {
        // unreadable: skipped, as host-local's walk skips it
      }
    }
    return out;
  }
}

/** `data` at offset 0; the rest again when the kernel took part of it (a disk filling up fails then with its errno). */
function writeAll(fd: number, data: Buffer, path: string): void {
  for (let done = 0; done < data.length; ) {
    const n = writeSync(fd, data, done, data.length - done, done);
    if (n <= 0) throw new HostLocalStoreError(`host-local: short write to ${path}: ${done} of ${data.length} bytes`);
    done += n;
  }
}

/**
 * Replaces the content of a small file without ever leaving it empty (see the module doc): a value
 * at least as long as the old one in one write; a shorter one after truncating to its length.
 */
function writeInPlace(path: string, data: Buffer): void {
  const fd = openSync(path, constants.O_WRONLY | constants.O_CREAT, 0o600);
  try {
    const size = fstatSync(fd).size;
    if (data.length < size) ftruncateSync(fd, data.length);
    writeAll(fd, data, path);
  } finally {
    closeSync(fd);
  }
}
