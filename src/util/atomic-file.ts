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
import { copyFileSync, chmodSync, mkdirSync, renameSync, unlinkSync, writeFileSync } from 'node:fs';
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
