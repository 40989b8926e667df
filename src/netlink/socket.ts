/**
 * The NETLINK_ROUTE sockets of the netlink layer and the error check every call shares: one host
 * socket, opened lazily and reused (dropped after an error that leaves its state unknown), sockets
 * into other namespaces opened per call, and cache dumps retried when the kernel flags them
 * interrupted. Used by every per-object file of the API (links, addresses, namespaces, routes, classes).
 */
import { writeSync } from 'node:fs';
import { CLONE_NEWNET, lastErrno, libcNs, NETLINK_ROUTE, nl, O_CLOEXEC, O_RDONLY, type Out, type Ptr } from './libnl.js';
import { NetlinkError } from '../errors.js';
import { CLEAN_NLE, E, NLE, nlError, sysError } from './errno.js';

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
 * Opens a NETLINK_ROUTE socket inside the network namespace at `netnsPath`. The calling thread enters
 * the namespace only for nl_socket_alloc + nl_connect, synchronously, and returns before this function
 * does; if it cannot return, the process aborts (a thread left in a pod namespace would silently
 * configure the wrong network from then on). The caller frees the socket with nl_socket_free.
 */
export function socketInNetns(op: string, netnsPath: string): Ptr {
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
      return connectSocket(op);
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

