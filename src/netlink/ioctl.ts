/**
 * Link lookups by ioctl on a datagram socket of this process's own network namespace: one syscall
 * each, no netlink message to build or parse, for the hot path (ifindex by name, name by ifindex,
 * txqueuelen).
 */
import { AF_INET, IFNAMSIZ, IFREQ_SIZE, lastErrno, libcNs, SIOCGIFINDEX, SIOCGIFNAME, SIOCGIFTXQLEN, SOCK_CLOEXEC, SOCK_DGRAM } from './libnl.js';
import { E, sysError } from './errno.js';
import { checkIfname } from './parse.js';

/** A datagram socket of this process's own network namespace for SIOC* requests, opened on first use. */
let ioctlFd = -1;
const ifreq = Buffer.alloc(IFREQ_SIZE);

/**
 * One SIOC* request on a struct ifreq naming the link by `name` (or by index for SIOCGIFNAME);
 * returns the int at offset IFNAMSIZ (ifr_ifindex / ifr_qlen), or undefined when there is no such
 * link (ENODEV). One syscall, no netlink message to build or parse: for the hot path's lookups.
 */
function ifreqInt(op: string, request: number, name: string | undefined, index = 0): number | undefined {
  if (ioctlFd < 0) {
    ioctlFd = libcNs.socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0) as number;
    if (ioctlFd < 0) throw sysError(op, lastErrno(), 'socket');
  }
  ifreq.fill(0);
  if (name !== undefined) ifreq.write(name, 0, IFNAMSIZ - 1, 'latin1');
  else ifreq.writeInt32LE(index, IFNAMSIZ);
  if ((libcNs.ioctlIfreq(ioctlFd, request, ifreq) as number) === 0) return ifreq.readInt32LE(IFNAMSIZ);
  const errno = lastErrno();
  if (errno === E.ENODEV) return undefined;
  throw sysError(op, errno, `ioctl ${request.toString(16)}`);
}

/**
 * Whether a link with this ifindex exists in this process's network namespace: one ioctl
 * (SIOCGIFNAME). For polling a link that is going away.
 */
export function linkIndexExists(ifindex: number): boolean {
  return ifreqInt(`linkIndexExists ${ifindex}`, SIOCGIFNAME, undefined, ifindex) !== undefined;
}

/** The ifindex of the link `name` in this process's network namespace, undefined when there is none (one ioctl). */
export function linkIndexByName(name: string): number | undefined {
  const op = `linkIndexByName ${name}`;
  checkIfname(op, name);
  return ifreqInt(op, SIOCGIFINDEX, name);
}

/** The txqueuelen of the link `name`, undefined when there is no such link (one ioctl). */
export function linkTxQLen(name: string): number | undefined {
  const op = `linkTxQLen ${name}`;
  checkIfname(op, name);
  return ifreqInt(op, SIOCGIFTXQLEN, name);
}
