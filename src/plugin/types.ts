import type { Logger } from '../log.js';

import type { HairpinMode } from '../pod/index.js';

export type { HairpinMode };

/** What the plugin needs from its embedder (kubelet's network host). */
export interface Host {
  getPodByName(namespace: string, name: string): { annotations?: Record<string, string> } | undefined;
  /** Path of the pod sandbox's network namespace, such as /var/run/netns/<name>. */
  getNetNS(containerId: string): string;
}

export interface PodNetworkStatus {
  /** The pod's primary IP (IPv4 when it has one). */
  ip: string;
  ips: string[];
}

/** The kubelet network-plugin interface kubenet implements. */
export interface NetworkPlugin {
  init(host: Host, hairpinMode?: HairpinMode, nonMasqueradeCIDR?: string): Promise<void>;
  event(name: 'pod-cidr-change', details: { 'pod-cidr': string }): Promise<void>;
  name(): 'kubenet';
  capabilities(): Set<'shaping'>;
  status(): void;
  setUpPod(namespace: string, name: string, id: string): Promise<void>;
  tearDownPod(namespace: string, name: string, id: string): Promise<void>;
  getPodNetworkStatus(namespace: string, name: string, id: string): Promise<PodNetworkStatus>;
}

export interface KubenetOptions {
  /** Bridge every pod veth joins. Default 'cbr0'. */
  bridgeName?: string;
  /** Directories searched for the CNI plugin binaries, in order. */
  cniBinDirs?: string[];
  /** host-local IPAM data dir; addresses are recorded under <dir>/kubenet. */
  ipamDataDir?: string;
  /**
   * Where kubenet-ts 0.1.0 kept its CNI result cache (libcni layout: <dir>/results/...), read once at
   * init to upgrade in place; nothing is written there any more. Default /var/lib/cni.
   */
  cniCacheDir?: string;
  /** Pod records (what each attachment got, written before any plugin runs) live under <stateDir>/pods. Default /var/lib/kubenet. */
  stateDir?: string;
  /** Bridge and pod MTU; default: the minimum MTU of the host's up, non-loopback, non-point-to-point links. */
  mtu?: number;
  /** Kill a CNI plugin that runs longer than this. Default 60 s. */
  cniTimeoutMs?: number;
  /** The shared ifb carrying every shaped pod's egress. Default 'kubenet-ifb0'. */
  ifbName?: string;
  /** Where kubenet-ts 0.1.0's shaper kept one file per shaped pod (read once at init to upgrade; nothing is written there now). Default /run/kubenet/shaper. */
  shaperStateDir?: string;
  /**
   * Run the `loopback` plugin for the pod's `lo` (default true, as kubelet's kubenet did). The node
   * agent turns it off: container runtimes (containerd, CRI-O) bring `lo` up themselves.
   */
  manageLoopback?: boolean;
  logger?: Logger;
}
