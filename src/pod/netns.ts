/**
 * Network namespaces named by a request: what they are, compared by identity (device and inode of
 * the nsfs file), never by path text. A pod's namespace must be a network namespace that is
 * neither the agent's own nor init's: the node's interfaces and routes live there.
 */
import { closeSync, constants, fstatSync, openSync, statfsSync, statSync, type Stats } from 'node:fs';
import { isAbsolute } from 'node:path';
import { ConfigError } from '../errors.js';
import { isNetnsFd } from '../netlink/index.js';

/** The identity of a namespace: the nsfs file's device and inode. */
export interface NetnsId {
  dev: number;
  ino: number;
}

/** statfs f_type of nsfs (linux/magic.h NSFS_MAGIC). */
const NSFS_MAGIC = 0x6e736673;

/** A netns path that cannot be a pod's network namespace; `path` and the reason are in the message. */
export class NetnsError extends ConfigError {
  readonly path: string;
  constructor(path: string, reason: string) {
    super(`network namespace ${JSON.stringify(path)} ${reason}`);
    this.path = path;
  }
}

export function sameNetns(a: NetnsId | undefined, b: NetnsId | undefined): boolean {
  return a !== undefined && b !== undefined && a.dev === b.dev && a.ino === b.ino;
}

function errCode(err: unknown): string | undefined {
  return typeof err === 'object' && err !== null ? ((err as { code?: string }).code ?? undefined) : undefined;
}

function kindOf(st: Stats): string {
  if (st.isDirectory()) return 'a directory';
  if (st.isFIFO()) return 'a FIFO';
  if (st.isSocket()) return 'a socket';
  if (st.isCharacterDevice() || st.isBlockDevice()) return 'a device';
  return 'not a regular file';
}

/**
 * The identity of the network namespace at `path`, checked without side effects: it exists, is an
 * nsfs file (a bind mount such as /run/netns/x, or /proc/PID/ns/net), and is a network namespace,
 * not another kind. Nothing but nsfs files is ever opened (a FIFO or a device could block or act).
 * @throws NetnsError saying which of these failed
 */
export function identifyNetns(path: string): NetnsId {
  if (typeof path !== 'string' || path === '') throw new NetnsError(String(path ?? ''), 'is empty: a network namespace path is required');
  if (!isAbsolute(path) || path.includes('\0')) throw new NetnsError(path, 'is not an absolute path');
  let st: Stats;
  try {
    st = statSync(path);
  } catch (err) {
    if (errCode(err) === 'ENOENT' || errCode(err) === 'ENOTDIR') throw new NetnsError(path, 'does not exist');
    throw new NetnsError(path, `cannot be examined (${errCode(err) ?? String(err)})`);
  }
  if (!st.isFile()) throw new NetnsError(path, `is not a network namespace (${kindOf(st)})`);
  let fsType: number;
  try {
    fsType = statfsSync(path).type;
  } catch (err) {
    throw new NetnsError(path, `cannot be examined (${errCode(err) ?? String(err)})`);
  }
  if (fsType !== NSFS_MAGIC) throw new NetnsError(path, 'is not a network namespace (an ordinary file, not an nsfs mount)');
  let fd: number;
  try {
    fd = openSync(path, constants.O_RDONLY | constants.O_NONBLOCK);
  } catch (err) {
    throw new NetnsError(path, `cannot be opened (${errCode(err) ?? String(err)})`);
  }
  try {
    const opened = fstatSync(fd);
    if (opened.dev !== st.dev || opened.ino !== st.ino) throw new NetnsError(path, 'changed while it was examined');
    if (!isNetnsFd(fd)) throw new NetnsError(path, 'is another kind of namespace, not a network namespace');
    return { dev: opened.dev, ino: opened.ino };
  } finally {
    closeSync(fd);
  }
}

let hostIds: NetnsId[] | undefined;

/**
 * The namespaces no pod may be attached in: this process's own and init's (the node's). Looked up
 * once: neither changes during the process's life (the agent enters pod namespaces only on one
 * thread for one synchronous call, and returns), and the two /proc lookups were ~1.7 % of the
 * agent's CPU in a 64-pod burst (perf).
 */
export function hostNetnsIds(): NetnsId[] {
  hostIds ??= lookUpHostNetnsIds();
  return hostIds;
}

function lookUpHostNetnsIds(): NetnsId[] {
  const out: NetnsId[] = [];
  for (const p of ['/proc/self/ns/net', '/proc/1/ns/net']) {
    try {
      const st = statSync(p);
      out.push({ dev: st.dev, ino: st.ino });
    } catch {
      // /proc/1 may be hidden (hidepid): the agent's own namespace is still checked
    }
  }
  return out;
}

/**
 * The identity of a pod's network namespace: `identifyNetns`, and refused when it is the agent's or
 * init's namespace (where a pod's eth0, routes and a DEL's deletions would hit the node itself).
 */
export function podNetnsId(path: string): NetnsId {
  const id = identifyNetns(path);
  if (hostNetnsIds().some((h) => sameNetns(h, id))) {
    throw new NetnsError(path, "is the node's own network namespace (the agent's or init's), never a pod's");
  }
  return id;
}

/** The identity of `path` when it is still a network namespace, else undefined (gone, or something else now). */
export function netnsIdIfAlive(path: string): NetnsId | undefined {
  if (!path) return undefined;
  try {
    return identifyNetns(path);
  } catch {
    return undefined;
  }
}
