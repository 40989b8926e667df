/**
 * What pods can leave behind on a node sandbox's node (its netns and its private directories):
 * veths, host-local reservations, the runtime's libcni cache entries, the agent's pod records and
 * shaper state, the pods' leaf qdiscs and filters on the egress shards' ifbs (their classes stay, idle, for
 * the next pods: src/shaper/tc-plan.ts ClassIds), qdiscs on pod veths, host-port nat rules.
 * `podLeftovers` lists them; after the last pod is gone every list must be empty.
 */
import { readdir } from 'node:fs/promises';
import { isIP } from 'node:net';
import { join } from 'node:path';
import { ifbShardNames } from './kernel.js';
import type { NodeSandbox } from './node-sandbox.js';

export interface NodeLayout {
  bridgeName: string;
  ifbName: string;
  ipamDataDir: string;
  /** The agent's stateDir: pod records under pods/, the shaper's state under shaper/. */
  stateDir: string;
  /** The runtime's libcni cache dir (results/ under it). */
  runtimeCacheDir: string;
}

export interface PodLeftovers {
  /** Every veth of the node but the sandbox's uplink (pod veths, on the bridge or not). */
  veths: string[];
  reservations: string[];
  runtimeCacheEntries: string[];
  podRecords: string[];
  shaperState: string[];
  /** tbf / bfifo leaves of pod classes on the ifb (a pod's classes go idle without them). */
  ifbLeaves: string[];
  ifbFilters: string[];
  /** Root/ingress qdiscs on pod veths (only while veths are left). */
  vethQdiscs: string[];
  /** Per-pod host-port nat rules and chains (portmap's CNI-DN-*, entries of CNI-HOSTPORT-DNAT, DNAT into pods). */
  natRules: string[];
}

export const NO_LEFTOVERS: PodLeftovers = {
  veths: [],
  reservations: [],
  runtimeCacheEntries: [],
  podRecords: [],
  shaperState: [],
  ifbLeaves: [],
  ifbFilters: [],
  vethQdiscs: [],
  natRules: [],
};

async function ls(path: string): Promise<string[]> {
  return (await readdir(path).catch(() => [] as string[])).filter((f) => !f.startsWith('.')).sort();
}

/** Lines of a command run in the node; '' lines dropped. */
async function lines(sb: NodeSandbox, cmd: string, args: string[]): Promise<string[]> {
  return (await sb.exec(cmd, args, { reject: false })).stdout.split('\n').filter((l) => l.trim() !== '');
}

/** The node's veths (not the uplink). */
export async function nodeVeths(sb: NodeSandbox): Promise<string[]> {
  const links = JSON.parse((await sb.exec('ip', ['-j', 'link', 'show', 'type', 'veth'])).stdout || '[]') as Array<{ ifname: string }>;
  return links
    .map((l) => l.ifname)
    .filter((n) => n !== sb.uplink.nodeIf && n !== sb.uplink.lanIf)
    .sort();
}

/** Per-pod nat rules: portmap's per-container chains and their entries, DNAT rules with a destination. */
export function podNatRules(natSave: string[]): string[] {
  return natSave.filter((l) => /CNI-DN-|CNI-SN-|dnat name: |--to-destination /.test(l));
}

export async function podLeftovers(sb: NodeSandbox, n: NodeLayout): Promise<PodLeftovers> {
  const veths = await nodeVeths(sb);
  const vethQdiscs: string[] = [];
  for (const v of veths) {
    for (const q of await lines(sb, 'tc', ['qdisc', 'show', 'dev', v])) if (!/^qdisc noqueue /.test(q)) vethQdiscs.push(`${v}: ${q}`);
  }
  // Every egress shard's ifb (ifbName, ifbName.1, ...) that is there.
  const ifbs = await ifbShardNames(n.ifbName, sb.netns);
  const ifbLeaves: string[] = [];
  const ifbFilters: string[] = [];
  for (const ifb of ifbs) {
    ifbLeaves.push(...podLeaves(await lines(sb, 'tc', ['qdisc', 'show', 'dev', ifb])).map((l) => `${ifb}: ${l}`));
    ifbFilters.push(
      ...(await lines(sb, 'tc', ['filter', 'show', 'dev', ifb, 'parent', '1:']))
        .filter((l) => /flowid 1:[0-9a-f]+/.test(l))
        .map((l) => `${ifb}: ${l}`),
    );
  }
  return {
    veths,
    reservations: (await ls(sb.hostPath(join(n.ipamDataDir, 'kubenet')))).filter((f) => isIP(f) !== 0),
    runtimeCacheEntries: await ls(sb.hostPath(join(n.runtimeCacheDir, 'results'))),
    podRecords: await ls(sb.hostPath(join(n.stateDir, 'pods'))),
    shaperState: await ls(sb.hostPath(join(n.stateDir, 'shaper'))),
    ifbLeaves,
    ifbFilters,
    vethQdiscs,
    natRules: podNatRules(await lines(sb, 'iptables-save', ['-t', 'nat'])),
  };
}

/** The leftovers that are not empty, as "what: a, b, c" lines ('' when none). */
export function describeLeftovers(l: PodLeftovers): string {
  return Object.entries(l)
    .filter(([, v]) => (v as string[]).length > 0)
    .map(
      ([k, v]) => `${k} (${(v as string[]).length}): ${(v as string[]).slice(0, 10).join(', ')}${(v as string[]).length > 10 ? ', …' : ''}`,
    )
    .join('\n');
}

export function countLeftovers(l: PodLeftovers): number {
  return Object.values(l).reduce((s, v: string[]) => s + v.length, 0);
}

/** The pods' leaf qdiscs among `tc qdisc show dev <ifb>` lines: tbf and bfifo under a class 1:x. */
export function podLeaves(qdiscLines: string[]): string[] {
  return qdiscLines.filter((l) => /^qdisc (tbf|bfifo) \S+ parent 1:[0-9a-f]+ /.test(l));
}
