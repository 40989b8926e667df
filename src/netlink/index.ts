/**
 * Typed netlink API over libnl-route (./libnl.ts: the koffi declarations), named after iproute2.
 *
 * Every request that can wait on the kernel's RTNL lock (link lookups by name or index, link
 * changes and deletions, address, route and link dumps and changes) is asynchronous: its blocking libnl call runs on a libuv pool thread (koffi `.async`) on a socket no
 * other request uses meanwhile, so the event loop never waits while the kernel is busy (./pool.ts
 * says how many pool threads they may hold; docs/netlink.md why this way and what it costs). The
 * exceptions: link lookups by ioctl (./ioctl.ts: one syscall, no RTNL), and `linkStats`,
 * `classList` and `classGet`, synchronous for their synchronous callers (the traffic counters, the
 * counters of a reused ifb class): they still wait on the lock when the kernel is busy. A socket into
 * another namespace is opened per request by a thread that enters the namespace and leaves it
 * before the request is sent (no await in between: a thread never stays in a pod's namespace).
 *
 * Errors are NetlinkError with a positive Linux errno; libnl's NLE_* codes are translated by an
 * explicit table in ./errno.ts (libnl loses the kernel errno, so the table is the single place that decides).
 * Kernel operations are idempotent where the contract says so: deleting what is absent succeeds.
 *
 * This module is the public face: callers import only it. The API is split by kernel object, each
 * file over the shared sockets (./socket.ts), the pool (./pool.ts), errors (./errno.ts) and argument
 * checks (./parse.ts): links (./link.ts), their deletion (./link-delete.ts) and ioctl lookups
 * (./ioctl.ts), addresses (./addr.ts), other namespaces (./netns.ts), routes (./route.ts),
 * neighbours and VXLAN FDB entries (./neigh.ts), tc classes (./tc-class.ts).
 */
export { E, ifPresent, isNoDevice, NLE, nleToErrno } from './errno.js';
export {
  linkByIndex,
  linkByName,
  linkList,
  linkSetMac,
  linkSetMtu,
  linkSetTxQLen,
  linkStats,
  minHostMtu,
  setPromiscOff,
  setPromiscOn,
  type LinkInfo,
  type LinkStats,
} from './link.js';
export {
  linkDelete,
  linkDeletionCounts,
  linkDeletionsInFlight,
  linkDeletionsSettled,
  type LinkDeleteOptions,
  type LinkDeletion,
} from './link-delete.js';
export { linkBasics, linkIndexByName, linkIndexExists, linkTxQLen, netnsLinkIndex, type LinkBasics } from './ioctl.js';
export { addrDel, addrList, addrListAll, type AddrInfo } from './addr.js';
export { isNetnsFd, netnsAddrList, netnsLinkByName, netnsLinkDelete } from './netns.js';
export { classGet, classList, type TcClassStats } from './tc-class.js';
export { netlinkCallsInFlight } from './socket.js';
export { routeDel, routeList, routeReplace, type RouteInfo, type RouteSpec } from './route.js';
export { neighApply, type NeighChange } from './neigh.js';
export { StatsSocket, type ClassAnswer, type ClassRef } from './stats-dump.js';
