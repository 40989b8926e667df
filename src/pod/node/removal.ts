/**
 * The pod network's part of leaving a node (`kubenet uninstall`, the agent stopped): which pods
 * still use the node (veths on the bridge, records in the state dir, host-local reservations of the
 * kubenet network), and the removal of what the core made for all pods: the pods' veths when forced,
 * the uplink off the bridge (dhcp mode), the bridge once no port is left on it, the dedup
 * (ebtables) and masquerade (iptables nat) rules, host-local's directory of the network.
 */
import { execa } from 'execa';
import { readdirSync } from 'node:fs';
import { isIP } from 'node:net';
import { join } from 'node:path';
import { ToolError } from '../../errors.js';
import type { Logger } from '../../log.js';
import * as nl from '../../netlink/index.js';
import { removeEmptyDir, removePath, type Removal } from '../../util/removal.js';
import { NETWORK_NAME } from '../bridge-conf.js';
import { recordedPods, recordsDir, spareDirOf } from '../records/record.js';
import { bridgeVeths } from './bridge-link.js';
import { removeDedupRules } from './dedup-rules.js';
import { removeMasqueradeRules } from './host-setup.js';
import { markedUplink, releaseOldUplink } from './uplink.js';

export interface NodePlumbing {
  bridgeName: string;
  stateDir: string;
  ipamDataDir: string;
}

/** What pods still hold on the node; all empty once every pod is gone. */
export interface PodsInUse {
  /** Pod veths on the bridge (the dhcp uplink excluded). */
  veths: string[];
  /** `namespace/name (id)` of each pod record. */
  records: string[];
  /** host-local reservations of the kubenet network (addresses). */
  reservations: string[];
}

/** host-local's directory of the kubenet network. */
const ipamDir = (o: NodePlumbing) => join(o.ipamDataDir, NETWORK_NAME);

export async function podsInUse(o: NodePlumbing): Promise<PodsInUse> {
  const uplink = markedUplink(o.stateDir);
  const veths = (await bridgeVeths(o.bridgeName)).map((l) => l.name).filter((n) => n !== uplink);
  let reservations: string[] = [];
  try {
    reservations = readdirSync(ipamDir(o)).filter((n) => isIP(n) !== 0);
  } catch {
    // no directory: no reservation
  }
  return { veths: veths.sort(), records: recordedPods(recordsDir(o.stateDir)), reservations: reservations.sort() };
}

async function ip(args: string[], gone: () => boolean): Promise<void> {
  const r = await execa('ip', args, { reject: false });
  if (r.exitCode !== 0 && !gone()) throw new ToolError('ip', args, r.exitCode, r.stderr);
}

/** Deletes the pods' veths (`--force`): the pods lose their network; their qdiscs go with the veths. */
export async function removePodVeths(veths: string[], r: Removal): Promise<void> {
  for (const v of veths)
    await r.remove(`link ${v} (a pod's veth)`, () => ip(['link', 'del', 'dev', v], () => nl.linkIndexByName(v) === undefined));
}

/** Takes the dhcp uplink off the bridge, then deletes the bridge if no port is left on it. */
export async function removeBridge(o: NodePlumbing, r: Removal, log: Logger): Promise<void> {
  const uplink = markedUplink(o.stateDir);
  if (uplink !== undefined)
    await r.remove(`uplink ${uplink} off the bridge ${o.bridgeName}`, () =>
      releaseOldUplink({ bridgeName: o.bridgeName, stateDir: o.stateDir, keep: undefined }, log),
    );
  const bridge = await nl.ifPresent(nl.linkByName(o.bridgeName));
  if (!bridge) return;
  if (bridge.type !== 'bridge') return r.keep(`link ${o.bridgeName}`, `a ${bridge.type ?? 'link without a kind'}, not the pod bridge`);
  // A dry run has removed neither the uplink nor (forced) the pods' veths: those ports do not count.
  const ports = (await nl.linkList())
    .filter((l) => l.master === bridge.index && !(r.dryRun && (l.name === uplink || l.type === 'veth')))
    .map((l) => l.name);
  if (ports.length > 0) return r.keep(`link ${o.bridgeName} (bridge)`, `ports still on it: ${ports.join(', ')}`);
  await r.remove(`link ${o.bridgeName} (bridge)`, () =>
    ip(['link', 'del', 'dev', o.bridgeName], () => nl.linkIndexByName(o.bridgeName) === undefined),
  );
}

/** The dedup (ebtables) and masquerade (iptables nat) rules. */
export async function removeNodeRules(r: Removal, log: Logger): Promise<void> {
  await removeDedupRules(r, log);
  await removeMasqueradeRules(r);
}

/** host-local's directory of the kubenet network, and the data dir when nothing else is left in it. */
export async function removeAddresses(o: NodePlumbing, r: Removal): Promise<void> {
  await removePath(r, "host-local's directory of the kubenet network", ipamDir(o));
  if (!r.dryRun) await removeEmptyDir(r, 'host-local data directory', o.ipamDataDir);
}

/** The pod records and their spare files. */
export async function removeRecords(o: NodePlumbing, r: Removal): Promise<void> {
  const dir = recordsDir(o.stateDir);
  await removePath(r, 'pod records', dir);
  await removePath(r, "the pod records' spare files", spareDirOf(dir));
}
