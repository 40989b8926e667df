/**
 * Typed netlink API over libnl-route (./libnl.ts: the koffi declarations), named after iproute2.
 *
 * Every function but linkDelete is synchronous: one koffi call is a few µs and a netlink round trip a
 * few tens, so there is nothing to gain from the thread pool and a lot to lose (netns switching must
 * never span an await). linkDelete is the exception because the kernel holds its request for tens of
 * milliseconds after the link is already gone (see there). One NETLINK_ROUTE socket serves the
 * process's own namespace; it is opened on first use and reused. Sockets into other namespaces are
 * opened per call and freed before returning.
 *
 * Errors are NetlinkError with a positive Linux errno; libnl's NLE_* codes are translated by an
 * explicit table in ./errno.ts (libnl loses the kernel errno, so the table is the single place that decides).
 * Kernel operations are idempotent where the contract says so: deleting what is absent succeeds.
 *
 * This module is the public face: callers import only it. The API is split by kernel object, each
 * file over the shared sockets (./socket.ts), errors (./errno.ts) and argument checks (./parse.ts):
 * links (./link.ts), their deletion (./link-delete.ts) and ioctl lookups (./ioctl.ts), addresses
 * (./addr.ts), other namespaces (./netns.ts), routes (./route.ts), tc classes (./tc-class.ts).
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
export { linkDelete, linkDeletionCounts, linkDeletionsInFlight, linkDeletionsSettled, type LinkDeleteOptions, type LinkDeletion } from './link-delete.js';
export { linkIndexByName, linkIndexExists, linkTxQLen } from './ioctl.js';
export { addrDel, addrList, addrListAll, type AddrInfo } from './addr.js';
export { isNetnsFd, netnsAddrList, netnsLinkByName, netnsLinkDelete } from './netns.js';
export { classGet, classList, type TcClassStats } from './tc-class.js';
export { routeDel, routeList, routeReplace, type RouteInfo, type RouteSpec } from './route.js';
export { StatsSocket, type ClassAnswer, type ClassRef } from './stats-dump.js';
