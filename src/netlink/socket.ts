/**
 * The NETLINK_ROUTE sockets of the netlink layer and the error check every call shares.
 *
 * Requests made off the event loop (./pool.ts) each hold a socket of their own from start to end
 * (`withHostSocket`, `withNetnsSocket`: a `Lease`), so no socket ever serves two requests at once:
 * host-namespace sockets are kept for reuse, at most one per slot, and dropped after an error that
 * leaves their state unknown; sockets into other namespaces are opened per request. The few calls
 * that stay on the event loop (their callers are synchronous: link counters, class dumps) share one
 * host socket, opened lazily and reused. Cache dumps are retried when the kernel flags them
 * interrupted. Used by every per-object file of the API (links, addresses, namespaces, routes, classes).
 */
import { writeSync } from 'node:fs';
import { CLONE_NEWNET, lastErrno, libcNs, NETLINK_ROUTE, nl, O_CLOEXEC, O_RDONLY, type Out, type Ptr } from './libnl.js';
import { NetlinkError } from '../errors.js';
import { CLEAN_NLE, E, NLE, nlError, sysError } from './errno.js';
import { CALL_SLOTS, offLoop, Slots, type Bound } from './pool.js';

/** Host-namespace socket, opened lazily, reused by every call on this thread's module instance. */
let hostSock: Ptr | null = null;

export function connectSocket(op: string): Ptr {
  const sk = nl.nl_socket_alloc() as Ptr;
  if (!sk) throw new NetlinkError(op, E.ENOMEM, 'nl_socket_alloc failed');
  const rc = nl.nl_connect(sk, NETLINK_ROUTE) as number;
  if (rc < 0) {
    nl.nl_socket_free(sk);
    throw nlError(op, rc);
  }
  return sk;
}

export function hostSocket(op: string): Ptr {
  if (hostSock === null) hostSock = connectSocket(op);
  return hostSock;
}

/** Drops a host socket whose state is unknown after an error; the next call reopens one. */
export function afterError(sk: Ptr, rc: number): void {
  if (sk === hostSock && !CLEAN_NLE.has(Math.abs(rc))) {
    hostSock = null;
    nl.nl_socket_free(sk);
  }
}

/** Throws a NetlinkError for a negative libnl return code, recycling the host socket when needed. */
export function check(sk: Ptr, op: string, rc: number, notFound: number = E.ENODEV): void {
  if (rc >= 0) return;
  afterError(sk, rc);
  throw nlError(op, rc, notFound);
}

/**
 * Opens a NETLINK_ROUTE socket inside the network namespace at `netnsPath` (inNetns). The caller
 * frees it with nl_socket_free.
 */
export function socketInNetns(op: string, netnsPath: string): Ptr {
  return inNetns(op, netnsPath, () => connectSocket(op));
}

/**
 * `fn()` run by the calling thread inside the network namespace at `netnsPath`: the thread enters
 * it for `fn` only, synchronously, and is back before this returns; if it cannot come back, the
 * process aborts (a thread left in a pod namespace would silently configure the wrong network from
 * then on). For opening sockets there: a socket stays in the namespace it was made in.
 */
export function inNetns<T>(op: string, netnsPath: string, fn: () => T): T {
  const flags = O_RDONLY | O_CLOEXEC;
  const target = libcNs.open(netnsPath, flags) as number;
  if (target < 0) throw sysError(op, lastErrno(), `open ${netnsPath}`);
  let self = -1;
  try {
    self = libcNs.open('/proc/thread-self/ns/net', flags) as number;
    if (self < 0) throw sysError(op, lastErrno(), 'open /proc/thread-self/ns/net');
    if ((libcNs.setns(target, CLONE_NEWNET) as number) < 0) {
      // Still in our own namespace (EINVAL: not a network namespace file).
      throw sysError(op, lastErrno(), `setns ${netnsPath}`);
    }
    try {
      return fn();
    } finally {
      if ((libcNs.setns(self, CLONE_NEWNET) as number) < 0) {
        const errno = lastErrno();
        writeSync(2, `kubenet netlink: FATAL: cannot return from network namespace ${netnsPath} (errno ${errno}); aborting\n`);
        process.abort();
      }
    }
  } finally {
    if (self >= 0) libcNs.close(self);
    libcNs.close(target);
  }
}

/** Dumps into a cache, retrying a dump the kernel flagged as interrupted (NLM_F_DUMP_INTR). */
export function dumpCache(sk: Ptr, op: string, fill: (out: Out) => number): Ptr {
  for (let attempt = 1; ; attempt++) {
    const out: Out = [null];
    const rc = fill(out);
    if (rc >= 0 && out[0]) return out[0];
    if (rc >= 0) throw new NetlinkError(op, E.EIO, 'libnl returned no cache');
    if (Math.abs(rc) === NLE.DUMP_INTR && attempt < 5) continue;
    check(sk, op, rc, E.ENOENT);
  }
}

// ---------------------------------------------------------------------------------------------
// Requests off the event loop.

/** Pool threads held by lookups, dumps and changes (./pool.ts). */
const callSlots = new Slots(CALL_SLOTS);
/** Host-namespace sockets no request holds now. */
const idleHost: Ptr[] = [];

/** Requests other than link deletions under way now (holding a socket, or waiting for a slot). */
export function netlinkCallsInFlight(): number {
  return callSlots.inUse + callSlots.waiting;
}

/** `fn` holding one of the call slots (a pool thread kernel requests may use): for requests on sockets of their own (./stats-dump.ts). */
export function withCallSlot<T>(fn: () => Promise<T>): Promise<T> {
  return callSlots.run(fn);
}

/** A socket one request holds from start to end: its blocking calls run off the event loop, its codes are checked here. */
export class Lease {
  /** An error left the socket's state unknown: it is freed, not reused. */
  retired = false;

  constructor(
    readonly sk: Ptr,
    readonly op: string,
  ) {}

  /** `fn(...args)` on a pool thread (the socket among the args, as libnl takes it); its libnl code. */
  async call(fn: Bound, ...args: unknown[]): Promise<number> {
    try {
      return await offLoop(this.op, fn, ...args);
    } catch (err) {
      this.retired = true;
      throw err;
    }
  }

  /** Throws a NetlinkError for a negative libnl code; one that may leave messages unread retires the socket. */
  check(rc: number, notFound: number = E.ENODEV): void {
    if (rc >= 0) return;
    if (!CLEAN_NLE.has(Math.abs(rc))) this.retired = true;
    throw nlError(this.op, rc, notFound);
  }

  /** A dump into a cache off the event loop, retried when the kernel flags it interrupted (NLM_F_DUMP_INTR). */
  async dump(fill: (out: Out) => Promise<number>): Promise<Ptr> {
    for (let attempt = 1; ; attempt++) {
      const out: Out = [null];
      const rc = await fill(out);
      if (rc >= 0 && out[0]) return out[0];
      if (rc >= 0) throw new NetlinkError(this.op, E.EIO, 'libnl returned no cache');
      if (Math.abs(rc) === NLE.DUMP_INTR && attempt < 5) continue;
      this.check(rc, E.ENOENT);
    }
  }
}

/** `use` with a host-namespace socket of its own, within the call slots; the socket is kept for the next request unless retired. */
export function withHostSocket<T>(op: string, use: (l: Lease) => Promise<T>): Promise<T> {
  return callSlots.run(async () => {
    const lease = new Lease(idleHost.pop() ?? connectSocket(op), op);
    try {
      return await use(lease);
    } finally {
      if (lease.retired) nl.nl_socket_free(lease.sk);
      else idleHost.push(lease.sk);
    }
  });
}

/**
 * `use` with a socket opened in the network namespace at `netnsPath` (socketInNetns: the thread is
 * back in its own namespace before anything is awaited), within the call slots; freed after.
 */
export function withNetnsSocket<T>(op: string, netnsPath: string, use: (l: Lease) => Promise<T>): Promise<T> {
  return callSlots.run(async () => {
    const sk = socketInNetns(op, netnsPath);
    try {
      return await use(new Lease(sk, op));
    } finally {
      nl.nl_socket_free(sk);
    }
  });
}
