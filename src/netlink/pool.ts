/**
 * The threads of libuv's pool that kernel requests may hold, and the one way a request gets there:
 * `offLoop`, a libnl call run by koffi on a pool thread (`.async`) while the event loop goes on.
 *
 * A netlink request is handled in the sender's own system call, so a request that needs the RTNL
 * lock sleeps there while anyone else holds it: hundreds of milliseconds when the kernel is busy
 * unregistering devices (docs/netlink.md). On the event loop that would stall every other call; on
 * a pool thread it stalls that thread only. The pool is shared with fs (the pod records), dns and
 * crypto, and its size is fixed when it first runs (UV_THREADPOOL_SIZE; the `kubenet` command sets
 * it, src/cli/threadpool.ts), so kernel requests hold at most all but two of its threads: two
 * for lookups, dumps and changes (the RTNL lock lets one request through at a time anyway), the
 * rest for link deletions (each held until the kernel has freed the device), each side at least
 * one. A request beyond its side's slots waits in line, on the event loop, for one to free. Why
 * the pool and not a worker_thread, and what fs meets when the pool is full: docs/netlink.md.
 */
import { NetlinkError } from '../errors.js';
import { E } from './errno.js';

/** libuv's pool size as this process set it (the default 4 when unset). */
export const POOL_SIZE = Number(process.env.UV_THREADPOOL_SIZE) || 4;
const KERNEL_THREADS = Math.max(2, POOL_SIZE - 2);
/** Pool threads lookups, dumps and changes may hold at once. */
export const CALL_SLOTS = Math.min(2, Math.floor(KERNEL_THREADS / 2));
/** Pool threads link deletions may hold at once (./link-delete.ts). */
export const DELETE_SLOTS = KERNEL_THREADS - CALL_SLOTS;

/** A counting semaphore: at most `size` holders, the others served in arrival order. */
export class Slots {
  private used = 0;
  private readonly queue: Array<() => void> = [];

  constructor(readonly size: number) {}

  /** Holders now. */
  get inUse(): number {
    return this.used;
  }

  /** Waiting for a slot now. */
  get waiting(): number {
    return this.queue.length;
  }

  async acquire(): Promise<void> {
    if (this.used < this.size) {
      this.used++;
      return;
    }
    // The releaser hands its slot over: `used` stays.
    await new Promise<void>((resolve) => this.queue.push(resolve));
  }

  release(): void {
    const next = this.queue.shift();
    if (next) next();
    else this.used--;
  }

  async run<T>(fn: () => Promise<T>): Promise<T> {
    await this.acquire();
    try {
      return await fn();
    } finally {
      this.release();
    }
  }
}

/** A libnl function as koffi binds it: callable here, or on a pool thread with a callback last. */
export interface Bound {
  async: (...args: never[]) => void;
}

/**
 * `fn(...args)` on a libuv pool thread; resolves with its return value (a libnl code) once it
 * returns. Out-parameters (`[null]` holders) are filled when it resolves. The caller holds a slot
 * (above) and passes objects no other call uses meanwhile: koffi copies nothing back until the end.
 */
export function offLoop(op: string, fn: Bound, ...args: unknown[]): Promise<number> {
  return new Promise((resolve, reject) => {
    const done = (err: unknown, rc: number) =>
      err ? reject(new NetlinkError(op, E.EIO, `koffi async call failed: ${String(err)}`)) : resolve(rc);
    (fn.async as (...a: unknown[]) => void)(...args, done);
  });
}
