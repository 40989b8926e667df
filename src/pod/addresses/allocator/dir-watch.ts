/**
 * Whether a directory changed since this process last looked: what lets host-local's store keep an
 * index of its reservation files instead of reading every one of them on every ADD and DEL
 * (store.ts). One inotify(7) instance per process, one watch per directory: instances are few per
 * user (128 by default) and kubelet and containerd need theirs.
 *
 * Why it is sound beside the real host-local: the kernel queues an event inside the very syscall
 * that makes the change, so whatever another process changed before it released host-local's lock
 * is in the queue once this process holds that lock. A directory's `generation` counts the times
 * its events were seen; a store that reads the queue at the end of its own transaction takes the
 * generation of then as its own (its own changes), and any later one means someone else's.
 * Lost watches (the directory removed or moved: IN_IGNORED) and a full queue (IN_Q_OVERFLOW, every
 * directory) count as changes too. Without inotify (the calls fail) `watch` gives undefined and
 * the store reads the directory every time, as host-local does.
 */
import {
  EAGAIN,
  fns,
  IN_ATTRIB,
  IN_CLOEXEC,
  IN_CLOSE_WRITE,
  IN_CREATE,
  IN_DELETE,
  IN_DELETE_SELF,
  IN_IGNORED,
  IN_MODIFY,
  IN_MOVE_SELF,
  IN_MOVED_FROM,
  IN_MOVED_TO,
  IN_NONBLOCK,
  IN_Q_OVERFLOW,
  lastErrno,
} from './libc.js';

const MASK = IN_CREATE | IN_DELETE | IN_MODIFY | IN_ATTRIB | IN_CLOSE_WRITE | IN_MOVED_FROM | IN_MOVED_TO | IN_DELETE_SELF | IN_MOVE_SELF;
/** struct inotify_event without its name: wd, mask, cookie, len. */
const EVENT_HEADER = 16;

export interface WatchedDir {
  readonly dir: string;
  /** Bumped each time events of the directory are seen. */
  generation: number;
  /** False once the watch is gone (the directory removed or moved): watch the path again. */
  live: boolean;
}

class DirWatch {
  private fd: number | undefined;
  private unavailable = false;
  private readonly byWd = new Map<number, WatchedDir>();
  private readonly buf = Buffer.alloc(64 * 1024);

  /** The directory's watch (the same object for every caller while it lives); undefined without inotify. */
  watch(dir: string): WatchedDir | undefined {
    if (this.unavailable) return undefined;
    if (this.fd === undefined) {
      const fd = fns.inotifyInit1(IN_NONBLOCK | IN_CLOEXEC) as number;
      if (fd < 0) {
        this.unavailable = true;
        return undefined;
      }
      this.fd = fd;
    }
    const wd = fns.inotifyAddWatch(this.fd, dir, MASK) as number;
    if (wd < 0) return undefined;
    // One object per watch: two paths of one directory (a symlink) get the same wd, and share it.
    let w = this.byWd.get(wd);
    if (!w?.live) {
      w = { dir, generation: 0, live: true };
      this.byWd.set(wd, w);
    }
    return w;
  }

  /** Reads every queued event and bumps the generations of the directories they name. */
  poll(): void {
    if (this.fd === undefined) return;
    for (;;) {
      const n = Number(fns.read(this.fd, this.buf, this.buf.length));
      if (n < 0 && lastErrno() !== EAGAIN) {
        // Events may be lost: every directory counts as changed.
        for (const w of this.byWd.values()) w.generation++;
        return;
      }
      if (n <= 0) return; // EAGAIN: nothing more queued
      const touched = new Set<WatchedDir>();
      for (let off = 0; off + EVENT_HEADER <= n; off += EVENT_HEADER + this.buf.readUInt32LE(off + 12)) {
        const wd = this.buf.readInt32LE(off);
        const mask = this.buf.readUInt32LE(off + 4);
        if (mask & IN_Q_OVERFLOW) {
          for (const w of this.byWd.values()) touched.add(w);
          continue;
        }
        const w = this.byWd.get(wd);
        if (!w) continue;
        touched.add(w);
        if (mask & IN_IGNORED) {
          w.live = false;
          this.byWd.delete(wd);
        }
      }
      for (const w of touched) w.generation++;
    }
  }
}

/** The process's one instance. */
export const dirWatch = new DirWatch();
