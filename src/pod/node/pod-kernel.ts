/**
 * The node's kernel as the pod lifecycle (add.ts, del.ts, sweep.ts) sees it: the few questions and
 * changes an ADD, a DEL and the sweep make of links, namespaces and host-port rules, behind one
 * narrow interface, as host-local's `Store` or netlink's `Handle` are. `nodeKernel` is the real one
 * (netlink, ioctl, iptables); the lifecycle's rules are unit-tested without root over a fake of it
 * (test/kit/fake-pod-kernel.ts, checked against this interface at compile time).
 */
import type { Logger } from '../../log.js';
import * as nl from '../../netlink/index.js';
import type { BridgeSettings } from '../bridge-conf.js';
import { bridgeVeths, ensureBridge } from './bridge-link.js';
import { checkHostPorts, hostPortRules } from './host-setup.js';
import { netnsIdIfAlive, sameNetns } from '../netns.js';
import type { PodRecord } from '../records/record.js';
import { deletePodVeth, hostEndOnBridge, podVethPresent } from './veth.js';

/** A link as the lifecycle needs it: its name and index. */
export interface LinkRef {
  name: string;
  index: number;
}

export interface PodKernel {
  /** The bridge, made if missing, pinned and tuned as `s` says (node/bridge-link.ts). */
  ensureBridge(s: BridgeSettings, log: Logger): Promise<LinkRef>;
  /** The index of `ifName` inside the netns at `netns` (by ioctl: no RTNL), undefined when absent. */
  podInterfaceIndex(netns: string, ifName: string): number | undefined;
  /** The host end of the pod's interface once it is a port of the bridge (veth.ts), else undefined. */
  hostEndOnBridge(netns: string, ifName: string, bridgeIndex: number, claimed: ReadonlySet<number>): Promise<LinkRef | undefined>;
  /** A host link's index by name, undefined when absent. */
  linkIndexByName(name: string): number | undefined;
  /** Deletes the pod's veth where it is provably the pod's (veth.ts). */
  deletePodVeth(record: PodRecord, bridgeName: string, records: PodRecord[], log: Logger): Promise<void>;
  /** Whether the pod's host veth still exists. */
  podVethPresent(record: PodRecord): Promise<boolean>;
  /** Whether the netns the pod was attached in is still there (the same one, by identity). */
  podNetnsAlive(record: PodRecord): boolean;
  /** The veths that are ports of the bridge. */
  bridgeVeths(bridgeName: string): Promise<LinkRef[]>;
  /** Deletes a veth by index (its peer goes with it). */
  deleteVeth(index: number): Promise<void>;
  /** portmap's host-port rules of `networkName`: container ID → the pod addresses they forward to. */
  hostPortRules(networkName: string): Promise<Map<string, string[]>>;
  /** Throws unless every mapping has its DNAT rule to one of the pod's addresses (CHECK). */
  checkHostPorts(podIps: string[], mappings: Array<{ hostPort: number; containerPort: number; protocol: string }>): Promise<void>;
}

/** The real kernel. */
export const nodeKernel: PodKernel = {
  ensureBridge,
  podInterfaceIndex: (netns, ifName) => nl.netnsLinkIndex(netns, ifName),
  hostEndOnBridge,
  linkIndexByName: (name) => nl.linkIndexByName(name),
  deletePodVeth,
  podVethPresent,
  podNetnsAlive: (r) => sameNetns(netnsIdIfAlive(r.netns), r.netnsId),
  bridgeVeths,
  deleteVeth: async (index) => {
    await nl.linkDelete(index, { veth: true });
  },
  hostPortRules,
  checkHostPorts,
};
