/**
 * The libc calls host-local's store needs and Node does not offer, bound with koffi (as
 * src/netlink/libnl.ts binds libnl): flock(2) on a descriptor, linkat(2) with AT_SYMLINK_FOLLOW,
 * which gives an O_TMPFILE file its name, and inotify(7) with a non-blocking read(2) of its
 * descriptor (dir-watch.ts). Declarations and errno only.
 */
import koffi from 'koffi';
import { constants } from 'node:fs';

const libc = koffi.load('libc.so.6');

export const fns = {
  flock: libc.func('int flock(int fd, int operation)'),
  linkat: libc.func('int linkat(int olddirfd, const char *oldpath, int newdirfd, const char *newpath, int flags)'),
  inotifyInit1: libc.func('int inotify_init1(int flags)'),
  inotifyAddWatch: libc.func('int inotify_add_watch(int fd, const char *pathname, uint32_t mask)'),
  read: libc.func('long read(int fd, _Out_ uint8_t *buf, size_t count)'),
};

/** sys/file.h */
export const LOCK_EX = 2;
export const LOCK_NB = 4;
export const LOCK_UN = 8;
/** fcntl.h */
export const AT_FDCWD = -100;
export const AT_SYMLINK_FOLLOW = 0x400;
/** fcntl.h O_TMPFILE: __O_TMPFILE (the same on x86_64 and arm64) | O_DIRECTORY (not the same: Node's value). */
export const O_TMPFILE = 0o20000000 | constants.O_DIRECTORY;

/** sys/inotify.h (IN_NONBLOCK and IN_CLOEXEC are O_NONBLOCK and O_CLOEXEC: the generic values) */
export const IN_NONBLOCK = 0o4000;
export const IN_CLOEXEC = 0o2000000;
export const IN_MODIFY = 0x2;
export const IN_ATTRIB = 0x4;
export const IN_CLOSE_WRITE = 0x8;
export const IN_MOVED_FROM = 0x40;
export const IN_MOVED_TO = 0x80;
export const IN_CREATE = 0x100;
export const IN_DELETE = 0x200;
export const IN_DELETE_SELF = 0x400;
export const IN_MOVE_SELF = 0x800;
export const IN_Q_OVERFLOW = 0x4000;
export const IN_IGNORED = 0x8000;

/** asm-generic/errno-base.h, errno.h */
export const EINTR = 4;
export const EEXIST = 17;
export const EWOULDBLOCK = 11;
export const EAGAIN = EWOULDBLOCK;

/** errno of the last libc call on this thread. */
export function lastErrno(): number {
  return koffi.errno();
}

/**
 * flock(fd, LOCK_EX) on a worker thread of libuv's pool (koffi's async call): the event loop
 * keeps running while another process holds the lock. Resolves with the call's return value.
 */
export function flockExclusiveAsync(fd: number): Promise<number> {
  return new Promise((resolve, reject) => {
    fns.flock.async(fd, LOCK_EX, (err: unknown, rc: number) => (err ? reject(err) : resolve(rc)));
  });
}
