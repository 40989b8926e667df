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
import { copyFileSync, chmodSync, existsSync, mkdirSync, readdirSync, renameSync, unlinkSync, writeFileSync } from 'node:fs';
import { writeFile } from 'node:fs/promises';
import { basename, dirname, join } from 'node:path';

let counter = 0;

function tempPathFor(path: string): string {
  return join(dirname(path), `.${basename(path)}.${process.pid}.${++counter}.tmp`);
}

/** True for the temporary files this module writes. */
export function isTempFile(name: string): boolean {
  return name.startsWith('.') && name.endsWith('.tmp');
}

/** Atomically replaces `path` with `data` (mode applies to a new file). Creates the directory when missing. */
export function writeFileAtomic(path: string, data: string | Uint8Array, opts: { mode?: number; dirMode?: number } = {}): void {
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
    throw err;
  }
}

/** Atomically installs a copy of `src` at `dest` with `mode` (e.g. an executable into a CNI bin dir). */
export function copyFileAtomic(src: string, dest: string, mode: number): void {
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
    throw err;
  }
}

/**
 * Write-then-rename and remove for the small files of one directory (the pod records), without
 * creating or freeing an inode on the caller's path. On ext4 creating a file costs ~0.2 ms and
 * unlinking one ~0.1-0.4 ms (inode and block bookkeeping in the journal), overwriting an existing
 * file and renaming ~0.04 ms each; a pod's ADD writes its record twice and its DEL removes it.
 *
 * So writes go into a pre-created spare file (truncated and written: same inode), which is then
 * renamed over the target, exactly as writeFileAtomic does with a fresh temporary file: readers see
 * the old content or the new, never a partial file. A removal renames the file back into the spare
 * directory, to be reused. Spares are made ahead, off the caller's path, on libuv's thread pool;
 * when none is ready a write falls back to writeFileAtomic. They live in `spareDir`, a hidden
 * sibling on the same filesystem (rename never crosses filesystems), and hold nothing of value:
 * `sweepSpares` (called at load) removes whatever a previous process left there.
 */
export class SpareFileWriter {
  private readonly spares: string[] = [];
  private making = 0;
  private ready = false;

  constructor(
    readonly dir: string,
    readonly spareDir: string,
    private readonly opts: { mode: number; keep?: number },
  ) {}

  private get keep(): number {
    return this.opts.keep ?? 4;
  }

  /** Removes every spare (this process's and earlier ones'); the next write makes new ones. */
  sweepSpares(): void {
    this.spares.length = 0;
    this.ready = false;
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
    this.replenish();
    if (spare === undefined) {
      writeFileAtomic(target, data, { mode: this.opts.mode });
      return;
    }
    try {
      writeFileSync(spare, data, { mode: this.opts.mode });
      renameSync(spare, target);
    } catch (err) {
      try {
        unlinkSync(spare);
      } catch {
        // never written, or renamed
      }
      if ((err as { code?: string }).code !== 'ENOENT') throw err;
      // The target directory (or the spare's) is missing: the plain way creates it.
      writeFileAtomic(target, data, { mode: this.opts.mode });
    }
  }

  /** Removes `<dir>/<name>`; a missing file is success. */
  remove(name: string): void {
    const target = join(this.dir, name);
    if (this.ready && this.spares.length < 2 * this.keep) {
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
      if ((err as { code?: string }).code !== 'ENOENT') throw err;
    }
  }

  private spareName(): string {
    return join(this.spareDir, `.spare.${process.pid}.${++counter}.tmp`);
  }

  /** Makes spares in the background until `keep` are ready or being made. */
  private replenish(): void {
    if (!this.ready) {
      // The spare directory, once (a few µs when it exists).
      try {
        mkdirSync(this.spareDir, { recursive: true, mode: 0o700 });
        this.ready = true;
      } catch {
        return;
      }
    }
    while (this.spares.length + this.making < this.keep) {
      const name = this.spareName();
      this.making++;
      writeFile(name, '', { mode: this.opts.mode }).then(
        () => {
          this.making--;
          this.spares.push(name);
        },
        () => {
          this.making--;
          this.ready = false; // the directory went away: made again on the next write
        },
      );
    }
  }
}
