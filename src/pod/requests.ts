/**
 * What the pod network core is asked and answers (src/pod/network.ts): its options, the requests of
 * ADD / DEL / CHECK, and what it reports. Types and constants only, so that every module of the
 * core and both front ends can name them without importing the core itself.
 */
import type { Logger } from '../log.js';
import type * as nl from '../netlink/index.js';
import type { ShapingCounters } from '../shaper/counters.js';
import type { BandwidthLimits, LimitSources } from '../bandwidth/limits.js';
import type { PodRecord, PortMapping } from './records/record.js';

export const LOOPBACK_NETWORK_NAME = 'cni-loopback';
/** The only plugins kubenet-ts ever runs: never its own forwarding binary, never a type from a request. */
export const PLUGIN_TYPES = ['bridge', 'host-local', 'dhcp', 'loopback', 'portmap'] as const;
/** What must be installed to set pods up (portmap only for pods with host ports: its absence fails those clearly). */
export const REQUIRED_PLUGINS = ['bridge', 'host-local', 'loopback'] as const;

/** Where pod addresses come from: the pod CIDR (host-local), or the LAN's DHCP server through `uplink`. */
export type IpamSettings =
  | { mode: 'host-local' }
  | {
      mode: 'dhcp';
      /** Host interface enslaved to the bridge. */
      uplink: string;
      /** The lease daemon's socket (the dhcp plugin's daemonSocketPath); the caller runs the daemon. */
      daemonSocket: string;
      /** An ADD (or a lease re-acquired) that has no lease after this long fails. */
      timeoutMs: number;
    };

export interface PodNetworkOptions {
  bridgeName: string;
  /** Directories searched for the reference plugins, in order. */
  pluginBinDirs: string[];
  ipamDataDir: string;
  /** Pod records live under `<stateDir>/pods`. */
  stateDir: string;
  ifbName?: string;
  /** Egress shards (the Shaper's `shards`); default 1. */
  ifbShards?: number;
  /** Where kubenet-ts 0.1.0's shaper kept one file per shaped pod: read once to upgrade in place. */
  legacyShaperStateDir?: string;
  mtu?: number;
  cniTimeoutMs?: number;
  /** Run the loopback plugin for the pod's lo (kubelet's kubenet did; container runtimes do it themselves). */
  manageLoopback: boolean;
  /** Where kubenet-ts 0.1.0 kept its CNI result cache (libcni layout), read once to upgrade in place. */
  legacyCniCacheDir?: string;
  /** Default host-local. */
  ipam?: IpamSettings;
  /**
   * host-local mode: run host-local for a pod's ADD beside the bridge plugin instead of inside it.
   * The bridge's IPAM is then the shim (bridge-conf.ts IPAM_SHIM_TYPE, which must be in pluginBinDirs),
   * which fetches the result from this socket: the caller serves it with `prefetchedIpam`.
   */
  ipamPrefetchSocket?: string;
  /**
   * promiscuous-bridge mode: how often the dedup rules are checked and restored (default 30 000 ms,
   * kube-proxy's resync period). They are also synced when the pod CIDR is set, at init, and when a
   * pod's ADD finds the bridge made anew (a new bridge, a new MAC); never otherwise on the ADD path.
   */
  dedupResyncMs?: number;
  /**
   * Destinations whose traffic with shaped pods is not shaped (src/shaper/unshaped.ts), made at
   * init (later changes: PodNetwork.setUnshaped); unset: the node's rules for it are not touched
   * until then, empty: removed.
   */
  unshapedCIDRs?: string[];
  /**
   * The node's bandwidth capacity per direction, bits/s (src/bandwidth/capacity.ts): the Shaper's
   * `capacity`, the rate of its node class, out of which guarantees are given. Unset: no node class.
   */
  capacity?: { egress?: number; ingress?: number };
  logger: Logger;
}

/** The dedup rules' periodic check, by default (PodNetworkOptions.dedupResyncMs). */
export const DEDUP_RESYNC_MS = 30_000;

export type DhcpSettings = Extract<IpamSettings, { mode: 'dhcp' }>;

export interface AttachRequest {
  containerId: string;
  ifName: string;
  /** Pod identity; '' when unknown. */
  namespace: string;
  name: string;
  netns: string;
  limits: BandwidthLimits;
  /** Where the limits came from, when a namespace policy took part (kept in the record). */
  limitSources?: LimitSources;
  portMappings: PortMapping[];
}

export interface DetachRequest {
  containerId: string;
  ifName: string;
  /** Host ports the runtime passes on DEL (libcni does): used only when there is no record. */
  portMappings?: PortMapping[];
}

export interface CheckRequest {
  containerId: string;
  ifName: string;
  netns: string;
}

/** What a pod's traffic did, from the kernel: see PodNetwork.traffic(). */
export interface PodTraffic {
  record: PodRecord;
  /** The tc counters of its shaped directions (src/shaper/counters.ts); absent when unshaped. */
  shaping?: ShapingCounters;
  /** Its host veth's own counters (rx = from the pod, tx = to the pod), when asked for. */
  link?: nl.LinkStats;
}

export interface Attachment {
  containerId: string;
  ifName: string;
}
