/**
 * The result cache, in libcni's layout and format so the two can read each other's entries:
 * one file per attachment at `<cacheDir>/results/<networkName>-<containerId>-<ifName>`, holding
 * a `cniCacheV1` entry (config bytes in base64, runtime args, the result in the config's
 * version). Written atomically (temporary file in the same directory, then rename); not
 * fsync'ed, as libcni does not either: an entry survives process crashes, not power loss.
 *
 * The file operations are synchronous on purpose: entries are a few hundred bytes in a local
 * directory, so each syscall takes microseconds, while a round trip through libuv's thread pool
 * per step (open, write, close, rename, …) costs far more, on the hot path (docs/cni.md,
 * "Result cache"). The methods stay async so the storage can change without touching callers.
 */
import { readFileSync, unlinkSync } from 'node:fs';
import { join } from 'node:path';
import { writeFileAtomic } from '../util/atomic-file.js';
import { fsError } from '../util/fs-error.js';
import { CacheError } from './errors.js';
import { validateContainerId, validateInterfaceName, validateNetworkName } from './names.js';
import type { CacheEntry, WireResult } from './types.js';

/** The key of one attachment. */
export interface AttachmentKey {
  networkName: string;
  containerId: string;
  ifName: string;
}

function isErrno(err: unknown, code: string): boolean {
  return typeof err === 'object' && err !== null && (err as { code?: unknown }).code === code;
}

function isObj(v: unknown): v is Record<string, unknown> {
  return typeof v === 'object' && v !== null && !Array.isArray(v);
}

export class ResultCache {
  readonly resultsDir: string;

  constructor(readonly cacheDir: string) {
    this.resultsDir = join(cacheDir, 'results');
  }

  /** The entry's file; validates the key parts, which become a file name. */
  path(key: AttachmentKey): string {
    validateNetworkName(key.networkName);
    validateContainerId(key.containerId);
    validateInterfaceName(key.ifName);
    return join(this.resultsDir, `${key.networkName}-${key.containerId}-${key.ifName}`);
  }

  /**
   * The entry for the attachment, or undefined when there is none.
   * @throws FsError when the file exists but cannot be read, CacheError when it is not a cniCacheV1 entry
   */
  async read(key: AttachmentKey): Promise<CacheEntry | undefined> {
    const path = this.path(key);
    let text: string;
    try {
      text = readFileSync(path, 'utf8');
    } catch (err) {
      if (isErrno(err, 'ENOENT')) return undefined;
      throw fsError(err, 'read', 'the CNI result cache entry', path);
    }
    let v: unknown;
    try {
      v = JSON.parse(text);
    } catch (err) {
      throw new CacheError(path, 'not JSON', { cause: err });
    }
    if (!isObj(v) || v.kind !== 'cniCacheV1') throw new CacheError(path, 'not a cniCacheV1 entry');
    for (const k of ['containerId', 'ifName', 'networkName', 'config'] as const) {
      if (typeof v[k] !== 'string') throw new CacheError(path, `${k} must be a string`);
    }
    if (v.result !== undefined && !isObj(v.result)) throw new CacheError(path, 'result must be an object');
    if (
      v.cniArgs !== undefined &&
      !(Array.isArray(v.cniArgs) && v.cniArgs.every((p) => Array.isArray(p) && p.length === 2 && p.every((s) => typeof s === 'string')))
    ) {
      throw new CacheError(path, 'cniArgs must be a list of [key, value] strings');
    }
    if (v.capabilityArgs !== undefined && !isObj(v.capabilityArgs)) throw new CacheError(path, 'capabilityArgs must be an object');
    return v as unknown as CacheEntry;
  }

  /** Writes (or replaces) the entry atomically: readers see the old entry or the new one, never a partial file. @throws FsError */
  async write(entry: CacheEntry): Promise<void> {
    writeFileAtomic(this.path(entry), JSON.stringify(entry), { mode: 0o600, dirMode: 0o700, what: 'the CNI result cache entry' });
  }

  /** Removes the entry; a missing one is success. @throws FsError */
  async delete(key: AttachmentKey): Promise<void> {
    const path = this.path(key);
    try {
      unlinkSync(path);
    } catch (err) {
      if (isErrno(err, 'ENOENT')) return;
      throw fsError(err, 'remove', 'the CNI result cache entry', path);
    }
  }
}

/** Builds an entry; `configBytes` are the exact bytes of the network config (single or list). */
export function makeCacheEntry(
  key: AttachmentKey,
  configBytes: Uint8Array | string,
  rt: { netns: string; args?: [string, string][] | undefined; capabilityArgs?: Record<string, unknown> | undefined },
  result: WireResult | undefined,
): CacheEntry {
  const entry: CacheEntry = {
    kind: 'cniCacheV1',
    containerId: key.containerId,
    config: Buffer.from(configBytes).toString('base64'),
    ifName: key.ifName,
    networkName: key.networkName,
  };
  // Optional keys are omitted when empty, as libcni's omitempty does.
  if (rt.netns) entry.netns = rt.netns;
  if (rt.args && rt.args.length > 0) entry.cniArgs = rt.args.map(([k, v]) => [k, v]);
  if (rt.capabilityArgs && Object.keys(rt.capabilityArgs).length > 0) entry.capabilityArgs = rt.capabilityArgs;
  if (result) entry.result = result;
  return entry;
}
