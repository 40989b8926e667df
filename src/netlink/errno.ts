/**
 * Netlink errors: libnl's NLE_* codes translated to Linux errnos by one explicit table (libnl loses
 * the kernel errno, so the table is the single place that decides), the errnos NetlinkError carries,
 * and the constructors of NetlinkError the API uses.
 */
import { getSystemErrorName } from 'node:util';
import { NetlinkError } from '../errors.js';
import { nl } from './libnl.js';

/** netlink/errno.h */
export const NLE = {
  FAILURE: 1,
  INTR: 2,
  BAD_SOCK: 3,
  AGAIN: 4,
  NOMEM: 5,
  EXIST: 6,
  INVAL: 7,
  RANGE: 8,
  MSGSIZE: 9,
  OPNOTSUPP: 10,
  AF_NOSUPPORT: 11,
  OBJ_NOTFOUND: 12,
  NOATTR: 13,
  MISSING_ATTR: 14,
  AF_MISMATCH: 15,
  SEQ_MISMATCH: 16,
  MSG_OVERFLOW: 17,
  MSG_TRUNC: 18,
  NOADDR: 19,
  SRCRT_NOSUPPORT: 20,
  MSG_TOOSHORT: 21,
  MSGTYPE_NOSUPPORT: 22,
  OBJ_MISMATCH: 23,
  NOCACHE: 24,
  BUSY: 25,
  PROTO_MISMATCH: 26,
  NOACCESS: 27,
  PERM: 28,
  PKTLOC_FILE: 29,
  PARSE_ERR: 30,
  NODEV: 31,
  IMMUTABLE: 32,
  DUMP_INTR: 33,
  ATTRSIZE: 34,
} as const;

/** Linux errno values (asm-generic/errno*.h): what NetlinkError.errno holds. Classify by these, never by message. */
export const E = {
  EPERM: 1,
  ENOENT: 2,
  EINTR: 4,
  EIO: 5,
  EBADF: 9,
  EAGAIN: 11,
  ENOMEM: 12,
  EACCES: 13,
  EBUSY: 16,
  EEXIST: 17,
  ENODEV: 19,
  EINVAL: 22,
  ERANGE: 34,
  ENODATA: 61,
  EPROTO: 71,
  EOVERFLOW: 75,
  EMSGSIZE: 90,
  EPROTONOSUPPORT: 93,
  EOPNOTSUPP: 95,
  EAFNOSUPPORT: 97,
  EADDRNOTAVAIL: 99,
} as const;

/**
 * NLE code → errno. OBJ_NOTFOUND is absent on purpose: libnl produces it both for kernel ENOENT/ESRCH
 * and for "the kernel answered with nothing", so each operation says what absence means for it
 * (ENODEV for a link, ENOENT for an address or a namespace). NLE_FAILURE is what libnl makes of kernel
 * errnos it has no code for, so the original errno is lost: it becomes EIO.
 */
const NLE_ERRNO: Readonly<Record<number, number>> = {
  [NLE.FAILURE]: E.EIO,
  [NLE.INTR]: E.EINTR,
  [NLE.BAD_SOCK]: E.EBADF,
  [NLE.AGAIN]: E.EAGAIN,
  [NLE.NOMEM]: E.ENOMEM,
  [NLE.EXIST]: E.EEXIST,
  [NLE.INVAL]: E.EINVAL,
  [NLE.RANGE]: E.ERANGE,
  [NLE.MSGSIZE]: E.EMSGSIZE,
  [NLE.OPNOTSUPP]: E.EOPNOTSUPP,
  [NLE.AF_NOSUPPORT]: E.EAFNOSUPPORT,
  [NLE.NOATTR]: E.ENODATA,
  [NLE.MISSING_ATTR]: E.EINVAL,
  [NLE.AF_MISMATCH]: E.EINVAL,
  [NLE.SEQ_MISMATCH]: E.EPROTO,
  [NLE.MSG_OVERFLOW]: E.EOVERFLOW,
  [NLE.MSG_TRUNC]: E.EMSGSIZE,
  [NLE.NOADDR]: E.EADDRNOTAVAIL,
  [NLE.SRCRT_NOSUPPORT]: E.EOPNOTSUPP,
  [NLE.MSG_TOOSHORT]: E.EPROTO,
  [NLE.MSGTYPE_NOSUPPORT]: E.EOPNOTSUPP,
  [NLE.OBJ_MISMATCH]: E.EINVAL,
  [NLE.NOCACHE]: E.EINVAL,
  [NLE.BUSY]: E.EBUSY,
  [NLE.PROTO_MISMATCH]: E.EPROTONOSUPPORT,
  [NLE.NOACCESS]: E.EACCES,
  [NLE.PERM]: E.EPERM,
  [NLE.PKTLOC_FILE]: E.ENOENT,
  [NLE.PARSE_ERR]: E.EINVAL,
  [NLE.NODEV]: E.ENODEV,
  [NLE.IMMUTABLE]: E.EINVAL,
  [NLE.DUMP_INTR]: E.EINTR,
  [NLE.ATTRSIZE]: E.EINVAL,
};

/** The positive errno for a libnl return code (negative or positive NLE_*). */
export function nleToErrno(rc: number, notFound: number = E.ENODEV): number {
  const nle = Math.abs(rc);
  if (nle === NLE.OBJ_NOTFOUND) return notFound;
  return NLE_ERRNO[nle] ?? E.EIO;
}

/**
 * Codes that are the kernel's answer about objects and leave the socket in a clean state. Anything
 * else (sequence mismatch, truncation, overrun, bad socket...) may leave unread messages behind, so
 * the host socket is dropped and reopened on next use.
 */
export const CLEAN_NLE = new Set<number>([
  NLE.EXIST,
  NLE.INVAL,
  NLE.RANGE,
  NLE.OPNOTSUPP,
  NLE.AF_NOSUPPORT,
  NLE.OBJ_NOTFOUND,
  NLE.NOADDR,
  NLE.BUSY,
  NLE.NOACCESS,
  NLE.PERM,
  NLE.NODEV,
]);

export function nlError(op: string, rc: number, notFound: number = E.ENODEV): NetlinkError {
  const nle = Math.abs(rc);
  return new NetlinkError(op, nleToErrno(rc, notFound), `${nl.nl_geterror(nle) as string} (libnl NLE ${nle})`);
}

export function sysError(op: string, errno: number, what: string): NetlinkError {
  let name = `errno ${errno}`;
  try {
    name = getSystemErrorName(-errno);
  } catch {
    // unknown errno: keep the number
  }
  return new NetlinkError(op, errno, `${what}: ${name}`);
}

/** Whether `err` says the link (or device) is not there: a NetlinkError with ENODEV. */
export function isNoDevice(err: unknown): boolean {
  return err instanceof NetlinkError && err.errno === E.ENODEV;
}

/** A synchronous read's result: a function returning a promise is an asynchronous read, passed as its promise. */
type NotPromise<T> = T extends PromiseLike<unknown> ? never : T;

/**
 * What `read` reads, or undefined when the link it reads is not there (ENODEV); any other failure
 * is thrown. `read` is a request under way (a promise: so is the answer) or a synchronous read.
 */
export function ifPresent<T>(read: Promise<T>): Promise<T | undefined>;
export function ifPresent<T>(read: () => NotPromise<T>): T | undefined;
export function ifPresent<T>(read: Promise<T> | (() => T)): Promise<T | undefined> | T | undefined {
  const absent = (err: unknown) => {
    if (isNoDevice(err)) return undefined;
    throw err;
  };
  if (typeof read !== 'function') return read.catch(absent);
  try {
    return read();
  } catch (err) {
    return absent(err);
  }
}
