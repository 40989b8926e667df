/**
 * The pod record: everything kubenet-ts knows about one attachment (container ID + interface), and
 * its store, the one source the core, the agent and `status` read.
 *
 * A record is written BEFORE any plugin runs (phase `adding`: the network config about to run, the
 * host ports and limits asked for), and again once the attachment is complete (phase `ready`: the
 * CNI result, IPs, host veth). So after a crash at any point a later DEL, or the startup
 * reconcile, knows exactly what to undo: the record is the agent's CNI cache, and it lives under the
 * agent's own state dir, never in a runtime's (`/var/lib/cni/results` belongs to the runtimes).
 *
 * One JSON file per attachment, `<dir>/<containerId>@<ifName>.json` ('@' cannot occur in a container
 * ID, so the name is unambiguous), written atomically through pre-made spare files kept in the hidden
 * sibling `.pods-spare` (src/util/atomic-file.ts SpareFileWriter: no inode made or freed per write). Files of kubenet-ts
 * 0.1.0 (`<dir>/<containerId>.json`, another shape) are returned by `load()` as legacy records for
 * the upgrade path to convert.
 */
import { readdirSync, readFileSync, unlinkSync } from 'node:fs';
import { basename, dirname, join } from 'node:path';
import type { NetConf, NetConfList, WireResult } from '../../cni/types.js';
import type { Logger } from '../../log.js';
import type { BandwidthLimits, LimitSources } from '../../bandwidth/limits.js';
import type { ShapingState } from '../../shaper/tc-layout.js';
import { isTempFile, SpareFileWriter } from '../../util/atomic-file.js';
import { fsError, fsTry } from '../../util/fs-error.js';
import { sameNetns, type NetnsId } from '../netns.js';

export const RECORD_VERSION = 2;

/** The records' directory under the state dir. */
export const recordsDir = (stateDir: string): string => join(stateDir, 'pods');
/** Where a records directory's spare files live: its hidden sibling `.<dir>-spare`. */
export const spareDirOf = (dir: string): string => join(dirname(dir), `.${basename(dir)}-spare`);

/** One host port, as CNI runtimeConfig.portMappings carries it. */
export interface PortMapping {
  hostPort: number;
  containerPort: number;
  protocol: 'tcp' | 'udp' | 'sctp';
  hostIP?: string;
}

export type PodPhase = 'adding' | 'ready';

export interface PodRecord {
  version: typeof RECORD_VERSION;
  containerId: string;
  ifName: string;
  /** Pod identity (K8S_POD_NAMESPACE / K8S_POD_NAME); '' when the runtime gave none. */
  namespace: string;
  name: string;
  /** The netns path given at ADD, and its identity then. */
  netns: string;
  netnsId?: NetnsId;
  phase: PodPhase;
  /**
   * The network config exactly as run at ADD (the bridge config, or bridge + portmap as a list), so
   * DEL undoes what ADD did even after a pod-CIDR change. Absent only for a record converted from
   * 0.1.0 whose config was not kept: DEL then uses the current config.
   */
  network?: NetConf | NetConfList;
  /** CNI_ARGS the plugins ran with. */
  cniArgs: Array<[string, string]>;
  portMappings: PortMapping[];
  /** The limits in force (changed by a live re-shape). */
  limits: BandwidthLimits;
  /** The limits the ADD asked for, when a re-shape has changed them since: what a repeated ADD is compared with. */
  addLimits?: BandwidthLimits;
  /**
   * Where each limit in force came from, when the pod's namespace has a bandwidth policy
   * (src/bandwidth/namespace-policy.ts). Absent (records of pods in namespaces without one, of the
   * static mode, of older agents): every limit is the pod's own.
   */
  limitSources?: LimitSources;
  /** From the result once ready; may be partly known while adding. */
  ips: string[];
  hostVeth?: string;
  /** ifindex of the host veth: proves on DEL that the name still means the same link (ifindexes are not reused). */
  hostVethIndex?: number;
  /** What the shaper installed for the pod (src/shaper/tc.ts), handed back to it after a restart. */
  shaping?: ShapingState;
  /** The CNI result of ADD in the network's cniVersion (ready only). */
  result?: WireResult;
  /** ISO time of the ADD. */
  addedAt: string;
}

/** What kubenet-ts 0.1.0 kept per pod under `<stateDir>/pods/<id>.json`. */
export interface LegacyPodRecord {
  namespace: string;
  name: string;
  id: string;
  netns: string;
  ips: string[];
  hostVeth: string | undefined;
  limits: BandwidthLimits;
  portMappings?: PortMapping[];
}

export function recordKey(containerId: string, ifName: string): string {
  return `${containerId}@${ifName}`;
}

function isObj(v: unknown): v is Record<string, unknown> {
  return typeof v === 'object' && v !== null && !Array.isArray(v);
}

function isRecord(v: unknown): v is PodRecord {
  return (
    isObj(v) &&
    v.version === RECORD_VERSION &&
    typeof v.containerId === 'string' &&
    typeof v.ifName === 'string' &&
    typeof v.netns === 'string' &&
    (v.phase === 'adding' || v.phase === 'ready') &&
    Array.isArray(v.ips) &&
    Array.isArray(v.portMappings) &&
    Array.isArray(v.cniArgs) &&
    isObj(v.limits)
  );
}

function isLegacy(v: unknown): v is LegacyPodRecord {
  return (
    isObj(v) &&
    v.version === undefined &&
    typeof v.id === 'string' &&
    typeof v.netns === 'string' &&
    Array.isArray(v.ips) &&
    isObj(v.limits)
  );
}

export class PodStore {
  private readonly records = new Map<string, PodRecord>();
  /** Writes and removes record files without making or freeing an inode per call (spares in `.<dir>-spare`). */
  private readonly files: SpareFileWriter;
  private changes = 0;

  constructor(
    readonly dir: string,
    private readonly log: Logger,
  ) {
    this.files = new SpareFileWriter(dir, spareDirOf(dir), { mode: 0o600, what: 'the pod record' });
  }

  /**
   * Reads every record in the directory into memory (replacing what was there) and sweeps stray
   * temporary files. Returns the 0.1.0 records found, for the upgrade path; unreadable files are
   * logged and left in place for an operator to look at.
   */
  load(): { legacy: Array<{ file: string; record: LegacyPodRecord }> } {
    this.records.clear();
    this.changes++;
    this.files.sweepSpares();
    const legacy: Array<{ file: string; record: LegacyPodRecord }> = [];
    let names: string[];
    try {
      names = readdirSync(this.dir);
    } catch (err) {
      if ((err as { code?: string }).code === 'ENOENT') return { legacy };
      throw fsError(err, 'read', 'the pod records in', this.dir);
    }
    for (const name of names) {
      const file = join(this.dir, name);
      if (isTempFile(name)) {
        fsTry('remove', 'a stray temporary file', file, () => unlinkSync(file));
        continue;
      }
      if (!name.endsWith('.json')) continue;
      let v: unknown;
      try {
        v = JSON.parse(readFileSync(file, 'utf8'));
      } catch (err) {
        this.log.warn({ err, file }, 'unreadable pod record; leaving it in place');
        continue;
      }
      if (isRecord(v) && name === `${recordKey(v.containerId, v.ifName)}.json`) this.records.set(recordKey(v.containerId, v.ifName), v);
      else if (isLegacy(v) && !name.includes('@')) legacy.push({ file, record: v });
      else this.log.warn({ file }, 'pod record of an unknown shape; leaving it in place');
    }
    return { legacy };
  }

  get(containerId: string, ifName: string): PodRecord | undefined {
    return this.records.get(recordKey(containerId, ifName));
  }

  all(): PodRecord[] {
    return [...this.records.values()];
  }

  /** A number that changes whenever a record is put, deleted or loaded (what was read of the records is then stale). */
  generation(): number {
    return this.changes;
  }

  /** Records whose namespace is `id` (by identity). */
  findByNetns(id: NetnsId): PodRecord[] {
    return this.all().filter((r) => sameNetns(r.netnsId, id));
  }

  /** Writes the record (atomically) and then makes it the one in memory. @throws FsError naming the record's file */
  put(record: PodRecord): void {
    const key = recordKey(record.containerId, record.ifName);
    this.files.write(`${key}.json`, JSON.stringify(record));
    this.records.set(key, record);
    this.changes++;
  }

  /** Removes the record; a missing one is success. @throws FsError naming the record's file */
  delete(containerId: string, ifName: string): void {
    const key = recordKey(containerId, ifName);
    this.files.remove(`${key}.json`);
    this.records.delete(key);
    this.changes++;
  }

  /** Stops background work on the spare files (the state directory may be removed afterwards). */
  close(): void {
    this.files.close();
  }
}

/**
 * The pods a records directory names, without loading a store (`kubenet uninstall`, with no agent
 * running): `namespace/name (container ID)` per record file, a file that cannot be read or parsed by
 * its name. Empty when the directory is not there.
 */
export function recordedPods(dir: string): string[] {
  let names: string[];
  try {
    names = readdirSync(dir);
  } catch (err) {
    if ((err as { code?: string }).code === 'ENOENT') return [];
    throw fsError(err, 'read', 'the pod records in', dir);
  }
  return names
    .filter((n) => n.endsWith('.json') && !isTempFile(n))
    .sort()
    .map((n) => {
      try {
        const v: unknown = JSON.parse(readFileSync(join(dir, n), 'utf8'));
        if (isRecord(v)) return `${v.namespace}/${v.name} (${v.containerId.slice(0, 12)}, ${v.ifName})`;
        if (isLegacy(v)) return `${v.namespace}/${v.name} (${v.id.slice(0, 12)})`;
      } catch {
        // named by its file below
      }
      return `record ${join(dir, n)}`;
    });
}
