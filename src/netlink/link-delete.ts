/**
 * Deleting a link without waiting for the kernel to free it (`linkDelete`), and the tracking of the
 * deletions whose kernel request is still outstanding. The one asynchronous call of the netlink
 * API: the request runs on a libuv worker thread (koffi `.async`) with a socket of its own.
 */
import { nl, route, type Ptr } from './libnl.js';
import { ConfigError, NetlinkError } from '../errors.js';
import { E, NLE, nlError } from './errno.js';
import { linkIndexExists } from './ioctl.js';
import { checkUint } from './parse.js';
import { connectSocket } from './socket.js';

/** libuv's thread pool, shared with fs and dns: deletions may hold all but two of its threads. */
const POOL_SIZE = Number(process.env.UV_THREADPOOL_SIZE) || 4;
const MAX_DELETIONS = Math.max(1, POOL_SIZE - 2);
const deletions = new Set<Promise<void>>();

/** Deletions started by linkDelete whose kernel request has not returned yet (the device not yet freed). */
export function linkDeletionsInFlight(): number {
  return deletions.size;
}

/** Resolves once every deletion started so far has been answered by the kernel (errors go to each caller's `finished`). */
export async function linkDeletionsSettled(): Promise<void> {
  while (deletions.size > 0) await Promise.all([...deletions]);
}

export interface LinkDeletion {
  /** Milliseconds until the link no longer resolved by index (what the caller waited for). */
  goneMs: number;
  /** Settles when the kernel answers the request: the device is freed, or the error. */
  finished: Promise<void>;
}

/**
 * `ip link del` of the link with `ifindex`, returning as soon as the link is gone from the namespace
 * rather than when the kernel has finished freeing it. The kernel unlists a link at the start of the
 * delete (its name, addresses and routes disappear, a veth's peer with it), but answers RTM_DELLINK
 * only after the device's last references are dropped and an RCU barrier has passed: tens of
 * milliseconds, many times what unlisting takes (measured: docs/netlink.md). So the request runs on
 * a libuv worker thread (koffi `.async`) with a socket of its own, and this polls the link by index
 * until it is gone, or until the request fails first (rejecting with its NetlinkError; ENODEV
 * counts as gone). At most UV_THREADPOOL_SIZE − 2 deletions are outstanding at once: beyond that
 * this first waits for one to finish. A missing link is gone at once. Only for links in this
 * process's own network namespace.
 */
export async function linkDelete(ifindex: number): Promise<LinkDeletion> {
  const op = `linkDelete ${ifindex}`;
  checkUint(op, 'ifindex', ifindex, 0x7fffffff);
  if (ifindex === 0) throw new ConfigError(`${op}: ifindex must be positive`);
  while (deletions.size >= MAX_DELETIONS) await Promise.race(deletions);
  const started = performance.now();
  const sk = connectSocket(op);
  const link = route.rtnl_link_alloc() as Ptr;
  if (!link) {
    nl.nl_socket_free(sk);
    throw new NetlinkError(op, E.ENOMEM, 'rtnl_link_alloc failed');
  }
  route.rtnl_link_set_ifindex(link, ifindex);
  let outcome: { err?: NetlinkError } | undefined;
  const finished = new Promise<void>((resolve, reject) => {
    route.rtnl_link_delete.async(sk, link, (callErr: unknown, rc: number) => {
      route.rtnl_link_put(link);
      nl.nl_socket_free(sk);
      let err: NetlinkError | undefined;
      if (callErr) err = new NetlinkError(op, E.EIO, `koffi async call failed: ${String(callErr)}`);
      else if (rc < 0 && Math.abs(rc) !== NLE.NODEV && Math.abs(rc) !== NLE.OBJ_NOTFOUND) err = nlError(op, rc);
      outcome = err ? { err } : {};
      if (err) reject(err);
      else resolve();
    });
  });
  const tracked = finished.catch(() => undefined);
  deletions.add(tracked);
  void tracked.then(() => deletions.delete(tracked));
  for (let polls = 0; ; polls++) {
    if (outcome) {
      if (outcome.err) throw outcome.err;
      break;
    }
    // One ioctl per poll (~µs), not a netlink round trip with a whole link to parse.
    if (!linkIndexExists(ifindex)) break;
    // The first polls only yield to the event loop (unlisting takes well under a millisecond of
    // kernel time); after that, back off to timers so a slow delete does not spin a core.
    await new Promise<void>((r) => (polls < 50 ? setImmediate(r) : setTimeout(r, 1)));
  }
  return { goneMs: performance.now() - started, finished };
}
