/**
 * Write-then-rename, the one way kubenet-ts replaces a file: readers see the old content or the new,
 * never a partial file, and a crash leaves at most a stray temporary file (named `.<name>.<pid>.<n>.tmp`
 * next to the target, which `isTempFile` recognizes so directory scans can skip and sweep it).
 *
 * Synchronous on purpose: state files are a few hundred bytes in a local directory, so each syscall
 * takes microseconds, while a thread-pool round trip per step costs more than the write itself on
 * the hot path. Not fsync'ed: a file survives process crashes, not power loss (after which the
 * kernel state it describes is gone too).
 */
import {
  closeSync,
  constants,
  copyFileSync,
  chmodSync,
  existsSync,
  fstatSync,
  linkSync,
  mkdirSync,
  openSync,
  readdirSync,
  renameSync,
  unlinkSync,
  writeFileSync,
  writeSync,
} from 'node:fs';
import { basename, dirname, join } from 'node:path';
import { fsError } from './fs-error.js';

let counter = 0;

function tempPathFor(path: string): string {
  return join(dirname(path), `.${basename(path)}.${process.pid}.${++counter}.tmp`);
}

/** True for the temporary files this module writes. */
export function isTempFile(name: string): boolean {
  return name.startsWith('.') && name.endsWith('.tmp');
}

/**
 * Atomically replaces `path` with `data` (mode applies to a new file). Creates the directory when
 * missing. Fails with an FsError naming `opts.what` (default "the file") and `path`.
 */
export function writeFileAtomic(
  path: string,
  data: string | Uint8Array,
  opts: { mode?: number; dirMode?: number; what?: string } = {},
): void {
  const tmp = tempPathFor(path);
  try {
    try {
      writeFileSync(tmp, data, { mode: opts.mode ?? 0o644 });
    } catch (err) {
      if ((err as { code?: string }).code !== 'ENOENT') throw err;
      mkdirSync(dirname(path), { recursive: true, ...(opts.dirMode !== undefined ? { mode: opts.dirMode } : {}) });
      writeFileSync(tmp, data, { mode: opts.mode ?? 0o644 });
    }
    renameSync(tmp, path);
  } catch (err) {
    try {
      unlinkSync(tmp);
    } catch {
      // never written
    }
    throw fsError(err, 'write', opts.what ?? 'the file', path);
  }
}

/**
 * Atomically installs a copy of `src` at `dest` with `mode` (e.g. an executable into a CNI bin dir).
 * Fails with an FsError naming `what` and `dest` (and `src` when the copy could not read it).
 */
export function copyFileAtomic(src: string, dest: string, mode: number, what = 'the file'): void {
  const tmp = tempPathFor(dest);
  try {
    copyFileSync(src, tmp);
    chmodSync(tmp, mode);
    renameSync(tmp, dest);
  } catch (err) {
    try {
      unlinkSync(tmp);
    } catch {
      // never written
    }
    throw fsError(err, 'install', what, dest);
  }
}

/**
 * Write-then-rename and remove for the small files of one directory (the pod records), without
 * creating or freeing an inode, or taking a directory lock for long, on the caller's path: creating
 * a file and unlinking one (or renaming over a file's last link) cost several times what renaming,
 * linking and overwriting in place cost, truncating frees blocks, and an open with O_CREAT of an
 * existing file waits on its directory's lock (docs/pod.md, "Pod
 * record files"). A pod's ADD writes its record twice and its DEL removes it.
 *
 * So a write goes into a spare file of the spare directory (a hidden sibling on the same filesystem:
 * rename never crosses filesystems): opened without O_CREAT, written from offset 0 in one write,
 * padded with spaces to the spare's old length instead of truncated (JSON allows trailing white
 * space), then renamed over the target, exactly as writeFileAtomic does with a fresh temporary file:
 * readers see the old content or the new, never a partial file. The file it replaces is first
 * linked into the spare directory, so the rename drops a link instead of freeing an inode, and it
 * becomes a spare; a removal likewise renames the file into the spare directory. Spares so recycle
 * themselves; new ones are made only when few are left, after a pause and one per timer tick, so a
 * call never waits for more than one file's creation (and `close` leaves none in flight).
 * Without a spare a write falls back to writeFileAtomic. Spares hold nothing of value: `sweepSpares`
 * (called at load) removes whatever a previous process left.
 */
export class SpareFileWriter {
  private readonly spares: string[] = [];
  private timer: NodeJS.Timeout | undefined;
  private closed = false;
  private dirReady = false;

  constructor(
    readonly dir: string,
    readonly spareDir: string,
    /** `what` names a file in errors (default "the file"): "cannot write the pod record <path>: …". */
    private readonly opts: { mode: number; keep?: number; delayMs?: number; what?: string },
  ) {}

  private get what(): string {
    return this.opts.what ?? 'the file';
  }

  private get keep(): number {
    return this.opts.keep ?? 8;
  }

  /** Spares ready now (tests). */
  get spareCount(): number {
    return this.spares.length;
  }

  /** Removes every spare (this process's and earlier ones'); new ones are made as writes need them. */
  sweepSpares(): void {
    this.spares.length = 0;
    this.dirReady = false;
    let names: string[];
    try {
      names = readdirSync(this.spareDir);
    } catch {
      return;
    }
    for (const n of names) {
      try {
        unlinkSync(join(this.spareDir, n));
      } catch {
        // gone already
      }
    }
  }

  /** Atomically replaces `<dir>/<name>` with `data`. */
  write(name: string, data: string): void {
    const target = join(this.dir, name);
    const spare = this.spares.pop();
    if (this.spares.length < this.keep / 2) this.replenishLater();
    if (spare === undefined) {
      writeFileAtomic(target, data, { mode: this.opts.mode, what: this.what });
      return;
    }
    let old: string | undefined;
    try {
      writeInPlace(spare, data);
      // The file being replaced stays alive as a spare through a second link, so the rename over it
      // frees nothing.
      old = this.spareName();
      try {
        linkSync(target, old);
      } catch {
        old = undefined; // no such file yet (a new record), or no link possible: the rename still works
      }
      renameSync(spare, target);
      if (old !== undefined) this.spares.push(old);
    } catch (err) {
      // Never leave a second link to a live file among the spares: writing into it would change that file.
      for (const f of [spare, old]) {
        if (f === undefined) continue;
        try {
          unlinkSync(f);
        } catch {
          // not there
        }
      }
      if ((err as { code?: string }).code !== 'ENOENT') throw fsError(err, 'write', this.what, target);
      // A spare or a directory is missing: the plain way (which creates the target directory).
      writeFileAtomic(target, data, { mode: this.opts.mode, what: this.what });
    }
  }

  /** Removes `<dir>/<name>`; a missing file is success. */
  remove(name: string): void {
    const target = join(this.dir, name);
    if (this.dirReady && this.spares.length < 4 * this.keep) {
      const spare = this.spareName();
      try {
        renameSync(target, spare);
        this.spares.push(spare);
        return;
      } catch (err) {
        if ((err as { code?: string }).code === 'ENOENT' && !existsSync(target)) return;
        // anything else: the plain way
      }
    }
    try {
      unlinkSync(target);
    } catch (err) {
      if ((err as { code?: string }).code !== 'ENOENT') throw fsError(err, 'remove', this.what, target);
    }
  }

  private spareName(): string {
    return join(this.spareDir, `.spare.${process.pid}.${++counter}.tmp`);
  }

  /**
   * Stops making spares (a pending one is not made): no background work of this writer touches the
   * spare directory afterwards, so its owner may remove it once it makes no more calls.
   */
  close(): void {
    this.closed = true;
    clearTimeout(this.timer);
    this.timer = undefined;
  }

  /** After a pause, makes spares until `keep` are ready, one per timer tick. */
  private replenishLater(): void {
    if (this.timer !== undefined || this.closed) return;
    this.timer = setTimeout(() => this.replenishOne(), this.opts.delayMs ?? 50).unref();
  }

  /**
   * One spare, synchronously (an empty file: one file creation), then the next on a later tick: a
   * call that arrives meanwhile waits for one file at most, and close() leaves no creation in flight.
   */
  private replenishOne(): void {
    this.timer = undefined;
    if (this.closed || this.spares.length >= this.keep) return;
    try {
      if (!this.dirReady) {
        mkdirSync(this.spareDir, { recursive: true, mode: 0o700 });
        this.dirReady = true;
      }
      const name = this.spareName();
      writeFileSync(name, '', { mode: this.opts.mode });
      this.spares.push(name);
    } catch {
      this.dirReady = false; // made again on the next attempt
      return;
    }
    if (this.spares.length < this.keep) this.timer = setTimeout(() => this.replenishOne(), 0).unref();
  }
}

/**
 * Writes `data` from offset 0 of the existing file `path`, padded with spaces to its current length:
 * one write, unless the kernel takes part of it (a disk filling up), when the rest follows, so that
 * a full disk fails with its errno (ENOSPC), not with a short count.
 */
function writeInPlace(path: string, data: string): void {
  const fd = openSync(path, constants.O_WRONLY);
  try {
    const size = fstatSync(fd).size;
    const bytes = Buffer.from(data, 'utf8');
    const out = bytes.length >= size ? bytes : Buffer.alloc(size, 0x20);
    if (out !== bytes) bytes.copy(out);
    for (let done = 0; done < out.length; ) {
      const n = writeSync(fd, out, done, out.length - done, done);
      if (n <= 0) throw new Error(`short write to ${path}: ${done} of ${out.length} bytes`);
      done += n;
    }
  } finally {
    closeSync(fd);
  }
}
