/**
 * Upgrade in place from kubenet-ts 0.1.0, whose agent kept its own CNI result cache in the runtimes'
 * directory (`<cniCacheDir>/results/kubenet-<id>-eth0`, the very key containerd and CRI-O write their
 * own entry under) and a pod record of another shape under `<stateDir>/pods/<id>.json`.
 *
 * Each 0.1.0 record becomes a record of today's shape, phase `ready`, taking what the old cache
 * still knows: the network config and result when the entry is the agent's own (its config is the
 * bridge plugin's), only the result when a runtime has overwritten the entry with its own (its config
 * is the `kubenet` conflist; the result there is the one the agent returned). A runtime's entry is
 * never changed or removed. The agent's own entries are removed once converted, and so are those no
 * record claims (pods gone, or an ADD that died): their reservations are then swept like any other
 * leftover. The veth is tied to the record by ifindex only when the pod's netns proves it.
 */
import { readdirSync, readFileSync, rmdirSync, unlinkSync } from 'node:fs';
import { join } from 'node:path';
import { isValidContainerId } from '../../cni/names.js';
import type { NetConf, NetConfList, WireResult } from '../../cni/types.js';
import type { ShapingState } from '../../shaper/tc-layout.js';
import { NetlinkError } from '../../errors.js';
import type { Logger } from '../../log.js';
import * as nl from '../../netlink/index.js';
import { NETWORK_NAME, POD_IFNAME } from '../bridge-conf.js';
import { fsError } from '../../util/fs-error.js';
import { netnsIdIfAlive } from '../netns.js';
import { RECORD_VERSION, type LegacyPodRecord, type PodRecord, type PodStore } from './record.js';

export interface UpgradeInput {
  store: PodStore;
  legacy: Array<{ file: string; record: LegacyPodRecord }>;
  legacyCniCacheDir: string | undefined;
  legacyShaperStateDir: string | undefined;
  bridgeName: string;
  log: Logger;
}

/** What the upgrade found and did, as logged. */
export interface UpgradeReport {
  recordsConverted: number;
  configsRecovered: number;
  resultsRecovered: number;
  ownCacheEntriesRemoved: number;
  runtimeCacheEntriesLeft: number;
  shapingStatesAdopted: number;
}

interface LegacyEntry {
  file: string;
  containerId: string;
  ifName: string;
  config: unknown;
  result: WireResult | undefined;
}

function readEntry(file: string): LegacyEntry | undefined {
  let v: unknown;
  try {
    v = JSON.parse(readFileSync(file, 'utf8'));
  } catch {
    return undefined;
  }
  if (typeof v !== 'object' || v === null) return undefined;
  const e = v as { kind?: unknown; containerId?: unknown; ifName?: unknown; config?: unknown; result?: unknown };
  if (e.kind !== 'cniCacheV1' || typeof e.containerId !== 'string' || typeof e.ifName !== 'string' || typeof e.config !== 'string')
    return undefined;
  let config: unknown;
  try {
    config = JSON.parse(Buffer.from(e.config, 'base64').toString('utf8'));
  } catch {
    return undefined;
  }
  const result = typeof e.result === 'object' && e.result !== null ? (e.result as WireResult) : undefined;
  return { file, containerId: e.containerId, ifName: e.ifName, config, result };
}

/** True for a config the 0.1.0 agent ran itself: bridge (alone or first of a list), or its loopback network. */
function isOwnConfig(config: unknown): boolean {
  if (typeof config !== 'object' || config === null) return false;
  const c = config as { type?: unknown; name?: unknown; plugins?: Array<{ type?: unknown }> };
  if (c.name === 'cni-loopback' && c.type === 'loopback') return true;
  if (c.name !== NETWORK_NAME) return false;
  return c.type === 'bridge' || (Array.isArray(c.plugins) && c.plugins[0]?.type === 'bridge');
}

/** Removes a file kubenet-ts 0.1.0 left (`what` names it in errors); a missing one is success. */
function unlinkQuiet(file: string, what: string): void {
  try {
    unlinkSync(file);
  } catch (err) {
    if ((err as { code?: string }).code !== 'ENOENT') throw fsError(err, 'remove', what, file);
  }
}

/** The host veth's ifindex when the pod's own netns shows it as its interface's peer. */
async function provenVethIndex(hostVeth: string | undefined, netns: string, bridgeName: string): Promise<number | undefined> {
  if (!hostVeth || !netnsIdIfAlive(netns)) return undefined;
  try {
    const inPod = await nl.netnsLinkByName(netns, POD_IFNAME);
    const host = await nl.linkByName(hostVeth);
    const bridge = await nl.linkByName(bridgeName);
    if (inPod?.peerIndex === host.index && host.type === 'veth' && host.master === bridge.index) return host.index;
  } catch (err) {
    if (!(err instanceof NetlinkError)) throw err;
  }
  return undefined;
}

export async function upgradeFromV010(o: UpgradeInput): Promise<UpgradeReport> {
  const report: UpgradeReport = {
    recordsConverted: 0,
    configsRecovered: 0,
    resultsRecovered: 0,
    ownCacheEntriesRemoved: 0,
    runtimeCacheEntriesLeft: 0,
    shapingStatesAdopted: 0,
  };
  const resultsDir = o.legacyCniCacheDir ? join(o.legacyCniCacheDir, 'results') : undefined;
  for (const { file, record: old } of o.legacy) {
    if (!isValidContainerId(old.id)) {
      o.log.warn({ file }, '0.1.0 pod record with an invalid container ID; leaving it in place');
      continue;
    }
    if (!o.store.get(old.id, POD_IFNAME)) {
      let network: NetConf | NetConfList | undefined;
      let result: WireResult | undefined;
      const entry = resultsDir ? readEntry(join(resultsDir, `${NETWORK_NAME}-${old.id}-${POD_IFNAME}`)) : undefined;
      if (entry && isOwnConfig(entry.config)) {
        network = entry.config as NetConf | NetConfList;
        result = entry.result;
        unlinkQuiet(entry.file, "kubenet-ts 0.1.0's CNI cache entry");
        report.ownCacheEntriesRemoved++;
      } else if (entry) {
        // The runtime's entry: the result in it is the one the agent returned. Read, never touched.
        result = entry.result;
        report.runtimeCacheEntriesLeft++;
      }
      const netnsId = netnsIdIfAlive(old.netns);
      const hostVethIndex = await provenVethIndex(old.hostVeth, old.netns, o.bridgeName);
      const record: PodRecord = {
        version: RECORD_VERSION,
        containerId: old.id,
        ifName: POD_IFNAME,
        namespace: old.namespace ?? '',
        name: old.name === old.id ? '' : (old.name ?? ''),
        netns: old.netns,
        ...(netnsId ? { netnsId } : {}),
        phase: 'ready',
        ...(network ? { network } : {}),
        cniArgs: [
          ['IgnoreUnknown', '1'],
          ...(old.namespace ? ([['K8S_POD_NAMESPACE', old.namespace]] as Array<[string, string]>) : []),
          ...(old.name && old.name !== old.id ? ([['K8S_POD_NAME', old.name]] as Array<[string, string]>) : []),
          ['K8S_POD_INFRA_CONTAINER_ID', old.id],
        ],
        portMappings: old.portMappings ?? [],
        limits: old.limits ?? {},
        ips: old.ips,
        ...(old.hostVeth ? { hostVeth: old.hostVeth } : {}),
        ...(hostVethIndex ? { hostVethIndex } : {}),
        ...(result ? { result } : {}),
        addedAt: new Date(0).toISOString(),
      };
      o.store.put(record);
      report.recordsConverted++;
      if (network) report.configsRecovered++;
      if (result) report.resultsRecovered++;
      o.log.info(
        {
          pod: `${record.namespace}/${record.name}`,
          id: old.id.slice(0, 12),
          config: network ? 'recovered' : 'current',
          result: result !== undefined,
          veth: hostVethIndex ? 'proven' : 'by name',
        },
        'converted a pod record of kubenet-ts 0.1.0',
      );
    }
    unlinkQuiet(file, 'the kubenet-ts 0.1.0 pod record');
  }
  // The 0.1.0 agent's own entries that no record claims: pods gone, or an ADD that died midway.
  if (resultsDir) {
    let names: string[] = [];
    try {
      names = readdirSync(resultsDir);
    } catch (err) {
      if ((err as { code?: string }).code !== 'ENOENT') throw fsError(err, 'read', "kubenet-ts 0.1.0's CNI cache", resultsDir);
    }
    for (const name of names) {
      if (!name.startsWith(`${NETWORK_NAME}-`) && !name.startsWith('cni-loopback-')) continue;
      const entry = readEntry(join(resultsDir, name));
      if (!entry || !isOwnConfig(entry.config)) continue;
      unlinkQuiet(entry.file, "kubenet-ts 0.1.0's CNI cache entry");
      report.ownCacheEntriesRemoved++;
    }
  }
  // The 0.1.0 shaper's own files: each state goes into its pod's record; the files go.
  if (o.legacyShaperStateDir) {
    let names: string[] = [];
    try {
      names = readdirSync(o.legacyShaperStateDir);
    } catch (err) {
      if ((err as { code?: string }).code !== 'ENOENT')
        throw fsError(err, 'read', "kubenet-ts 0.1.0's shaper state in", o.legacyShaperStateDir);
    }
    for (const name of names) {
      if (!name.endsWith('.json')) continue;
      const file = join(o.legacyShaperStateDir, name);
      let state: ShapingState | undefined;
      try {
        state = JSON.parse(readFileSync(file, 'utf8')) as ShapingState;
      } catch {
        state = undefined;
      }
      const record = state && typeof state.id === 'string' ? o.store.get(state.id, POD_IFNAME) : undefined;
      if (record && state && !record.shaping) {
        o.store.put({ ...record, shaping: state });
        report.shapingStatesAdopted++;
      }
      unlinkQuiet(file, "kubenet-ts 0.1.0's shaper state");
    }
    try {
      rmdirSync(o.legacyShaperStateDir);
    } catch {
      // not empty (someone else's files) or already gone
    }
  }
  if (report.recordsConverted + report.ownCacheEntriesRemoved + report.shapingStatesAdopted > 0)
    o.log.info(report, 'upgraded the state kubenet-ts 0.1.0 left');
  return report;
}
