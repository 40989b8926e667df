/**
 * Link lookups by ioctl on a datagram socket: one syscall each, no netlink message to build or parse,
 * and no RTNL lock (the kernel answers these under RCU), so they stay synchronous on the event loop
 * even while the kernel is busy: for the hot path (ifindex by name, name by ifindex, flags, MTU,
 * txqueuelen), in this process's own network namespace or, through a socket opened there, in
 * another one.
 */
import {
  AF_INET,
  IFF_PROMISC,
  IFF_UP,
  IFNAMSIZ,
  IFREQ_SIZE,
  lastErrno,
  libcNs,
  SIOCGIFFLAGS,
  SIOCGIFINDEX,
  SIOCGIFMTU,
  SIOCGIFNAME,
  SIOCGIFTXQLEN,
  SOCK_CLOEXEC,
  SOCK_DGRAM,
} from './libnl.js';
import { E, sysError } from './errno.js';
import { checkIfname } from './parse.js';
import { inNetns } from './socket.js';

/** A datagram socket of this process's own network namespace for SIOC* requests, opened on first use. */
let ioctlFd = -1;
const ifreq = Buffer.alloc(IFREQ_SIZE);

function dgramSocket(op: string): number {
  const fd = libcNs.socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0) as number;
  if (fd < 0) throw sysError(op, lastErrno(), 'socket');
  return fd;
}

function hostFd(op: string): number {
  if (ioctlFd < 0) ioctlFd = dgramSocket(op);
  return ioctlFd;
}

/**
 * One SIOC* request on a struct ifreq naming the link by `name` (or by index for SIOCGIFNAME) on
 * socket `fd`; returns the int at offset IFNAMSIZ (ifr_ifindex / ifr_mtu / ifr_qlen; ifr_flags is
 * its low 16 bits), or undefined when there is no such link (ENODEV).
 */
function ifreqInt(fd: number, op: string, request: number, name: string | undefined, index = 0): number | undefined {
  ifreq.fill(0);
  if (name !== undefined) ifreq.write(name, 0, IFNAMSIZ - 1, 'latin1');
  else ifreq.writeInt32LE(index, IFNAMSIZ);
  if ((libcNs.ioctlIfreq(fd, request, ifreq) as number) === 0) return ifreq.readInt32LE(IFNAMSIZ);
  const errno = lastErrno();
  if (errno === E.ENODEV) return undefined;
  throw sysError(op, errno, `ioctl ${request.toString(16)}`);
}

/**
 * Whether a link with this ifindex exists in this process's network namespace: one ioctl
 * (SIOCGIFNAME). For polling a link that is going away.
 */
export function linkIndexExists(ifindex: number): boolean {
  const op = `linkIndexExists ${ifindex}`;
  return ifreqInt(hostFd(op), op, SIOCGIFNAME, undefined, ifindex) !== undefined;
}

/** The ifindex of the link `name` in this process's network namespace, undefined when there is none (one ioctl). */
export function linkIndexByName(name: string): number | undefined {
  const op = `linkIndexByName ${name}`;
  checkIfname(op, name);
  return ifreqInt(hostFd(op), op, SIOCGIFINDEX, name);
}

/** The txqueuelen of the link `name`, undefined when there is no such link (one ioctl). */
export function linkTxQLen(name: string): number | undefined {
  const op = `linkTxQLen ${name}`;
  checkIfname(op, name);
  return ifreqInt(hostFd(op), op, SIOCGIFTXQLEN, name);
}

/** What ioctls tell of a link: the same fields as LinkInfo's, flags as `ip link` shows them (promisc: set by a user). */
export interface LinkBasics {
  index: number;
  flags: number;
  up: boolean;
  promisc: boolean;
  mtu: number;
  txQLen: number;
}

/**
 * Index, flags, MTU and txqueuelen of the link `name` in this process's network namespace by four
 * ioctls, undefined when there is none (or it went between two of them).
 */
export function linkBasics(name: string): LinkBasics | undefined {
  const op = `linkBasics ${name}`;
  checkIfname(op, name);
  const fd = hostFd(op);
  const index = ifreqInt(fd, op, SIOCGIFINDEX, name);
  const flags = ifreqInt(fd, op, SIOCGIFFLAGS, name);
  const mtu = ifreqInt(fd, op, SIOCGIFMTU, name);
  const txQLen = ifreqInt(fd, op, SIOCGIFTXQLEN, name);
  if (index === undefined || flags === undefined || mtu === undefined || txQLen === undefined) return undefined;
  const f = flags & 0xffff;
  return { index, flags: f, up: (f & IFF_UP) !== 0, promisc: (f & IFF_PROMISC) !== 0, mtu, txQLen };
}

/**
 * The ifindex of the link `ifname` inside the network namespace at `netnsPath` (e.g. whether a
 * pod's interface is there), undefined when it has none: one ioctl on a datagram socket the thread
 * opens there (inNetns) and closes after. Missing path → errno 2 (ENOENT); not a network
 * namespace → errno 22 (EINVAL).
 */
export function netnsLinkIndex(netnsPath: string, ifname: string): number | undefined {
  const op = `netnsLinkIndex ${netnsPath} ${ifname}`;
  checkIfname(op, ifname);
  const fd = inNetns(op, netnsPath, () => dgramSocket(op));
  try {
    return ifreqInt(fd, op, SIOCGIFINDEX, ifname);
  } finally {
    libcNs.close(fd);
  }
}
