/**
 * Other network namespaces, named after iproute2 (`ip -n NS ...`): a link, its addresses and its
 * deletion inside the namespace mounted at a path, each over a socket opened in that namespace for
 * the call and freed after it (./socket.ts withNetnsSocket: the thread that opens it is back in its
 * own namespace before the requests go, off the event loop); and whether a file descriptor is a
 * network namespace at all.
 */
import { CLONE_NEWNET, libcNs, NS_GET_NSTYPE, route, type Ptr } from './libnl.js';
import { NetlinkError } from '../errors.js';
import { addrListOn, type AddrInfo } from './addr.js';
import { E, NLE } from './errno.js';
import { getLinkOn, linkInfoOn, type LinkInfo } from './link.js';
import { afOf, checkIfname } from './parse.js';
import { withNetnsSocket } from './socket.js';

/**
 * `ip -n NS addr show dev IFNAME`: addresses of a link inside the network namespace mounted at
 * `netnsPath` (e.g. /var/run/netns/x or /proc/PID/ns/net). Missing path → errno 2 (ENOENT); a path
 * that is not a network namespace → errno 22 (EINVAL); missing link → errno 19 (ENODEV).
 */
export async function netnsAddrList(netnsPath: string, ifname: string, family?: 4 | 6): Promise<AddrInfo[]> {
  const op = `netnsAddrList ${netnsPath} ${ifname}`;
  checkIfname(op, ifname);
  afOf(op, family);
  return withNetnsSocket(op, netnsPath, (l) => addrListOn(l, ifname, family));
}

/**
 * `ip -n NS link show IFNAME`: a link inside the network namespace mounted at `netnsPath`, or
 * undefined when the namespace has no such link. Missing path → errno 2 (ENOENT); a path that is
 * not a network namespace → errno 22 (EINVAL).
 */
export async function netnsLinkByName(netnsPath: string, ifname: string): Promise<LinkInfo | undefined> {
  const op = `netnsLinkByName ${netnsPath} ${ifname}`;
  checkIfname(op, ifname);
  return withNetnsSocket(op, netnsPath, async (l) => {
    try {
      return await linkInfoOn(l, ifname);
    } catch (err) {
      if (err instanceof NetlinkError && err.errno === E.ENODEV) return undefined;
      throw err;
    }
  });
}

/**
 * `ip -n NS link del IFNAME`: deletes a link inside the network namespace at `netnsPath` (a veth's
 * peer goes with it), waiting for the kernel's answer. Absent link: success. For the rare path where
 * the host side cannot be reached (an ADD cut before its veth joined the bridge).
 */
export async function netnsLinkDelete(netnsPath: string, ifname: string): Promise<void> {
  const op = `netnsLinkDelete ${netnsPath} ${ifname}`;
  checkIfname(op, ifname);
  await withNetnsSocket(op, netnsPath, async (l) => {
    let link: Ptr;
    try {
      link = await getLinkOn(l, ifname);
    } catch (err) {
      if (err instanceof NetlinkError && err.errno === E.ENODEV) return;
      throw err;
    }
    try {
      const rc = await l.call(route.rtnl_link_delete, l.sk, link);
      if (rc < 0 && Math.abs(rc) !== NLE.NODEV && Math.abs(rc) !== NLE.OBJ_NOTFOUND) l.check(rc);
    } finally {
      route.rtnl_link_put(link);
    }
  });
}

/**
 * Whether the open file descriptor `fd` is a network namespace (ioctl NS_GET_NSTYPE == CLONE_NEWNET).
 * False for any other namespace type and for files that are not namespaces at all.
 */
export function isNetnsFd(fd: number): boolean {
  return (libcNs.ioctl(fd, NS_GET_NSTYPE) as number) === CLONE_NEWNET;
}
