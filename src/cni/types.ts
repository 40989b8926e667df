/**
 * CNI runtime-side types: network configs (single and list), typed configs for the reference
 * plugins kubenet drives (bridge, host-local IPAM, loopback), the runtime parameters of one
 * attachment, and one normalized result that every spec version (0.1.0–1.1.0) parses into.
 * Wire formats of each result version are typed too: `convertResult` produces them for
 * `prevResult` and for the result cache.
 */

/** Spec versions this runtime reads and writes, oldest first. */
export const CNI_VERSIONS = ['0.1.0', '0.2.0', '0.3.0', '0.3.1', '0.4.0', '1.0.0', '1.1.0'] as const;
export type CniVersion = (typeof CNI_VERSIONS)[number];

/** The commands of the CNI spec (STATUS and GC since 1.1.0). */
export const CNI_COMMANDS = ['ADD', 'DEL', 'CHECK', 'GC', 'STATUS', 'VERSION'] as const;
export type CniCommand = (typeof CNI_COMMANDS)[number];

/** `{ dst, gw }` as in configs and results; the optional fields are spec 1.1.0 route attributes. */
export interface Route {
  dst: string;
  gw?: string;
  mtu?: number;
  advmss?: number;
  priority?: number;
  table?: number;
  scope?: number;
}

export interface Dns {
  nameservers?: string[];
  domain?: string;
  search?: string[];
  options?: string[];
}

/** The keys every plugin config may carry. A plugin entry of a list may omit name and cniVersion (the list's are injected). */
export interface PluginConf {
  type: string;
  name?: string;
  cniVersion?: string;
  /** Capabilities the plugin takes through `runtimeConfig` (e.g. `bandwidth`, `portMappings`). */
  capabilities?: Record<string, boolean>;
  ipam?: IpamConf;
  dns?: Dns;
  /** Plugin-specific keys. */
  [key: string]: unknown;
}

/** One network config (a `.conf` file, or one plugin of a list once name/cniVersion are injected). */
export interface NetConf extends PluginConf {
  cniVersion: string;
  name: string;
}

/** A `.conflist`: plugins run in order on ADD/CHECK, in reverse on DEL. */
export interface NetConfList {
  cniVersion: string;
  name: string;
  plugins: PluginConf[];
  /** Skip CHECK for this network. */
  disableCheck?: boolean;
}

export interface IpamConf {
  type: string;
  [key: string]: unknown;
}

/** One address range of host-local. */
export interface IpamRange {
  subnet: string;
  rangeStart?: string;
  rangeEnd?: string;
  gateway?: string;
}

/** A set of ranges host-local allocates one address from (one per family, typically). */
export type RangeSet = IpamRange[];

export interface HostLocalIpamConf extends IpamConf {
  type: 'host-local';
  /** One address is allocated from each RangeSet. */
  ranges?: RangeSet[];
  routes?: Route[];
  /** Where reservations are recorded: `<dataDir>/<network name>/<ip>`. Default /var/lib/cni/networks. */
  dataDir?: string;
  resolvConf?: string;
}

export interface BridgeNetConf extends NetConf {
  type: 'bridge';
  /** Bridge name, default cni0. */
  bridge?: string;
  /** Give the bridge the gateway address (and enable IP forwarding on the host). */
  isGateway?: boolean;
  /** Make the gateway the pod's default route (implies isGateway). */
  isDefaultGateway?: boolean;
  forceAddress?: boolean;
  ipMasq?: boolean;
  hairpinMode?: boolean;
  promiscMode?: boolean;
  mtu?: number;
  vlan?: number;
  ipam?: HostLocalIpamConf | IpamConf;
}

export interface LoopbackNetConf extends NetConf {
  type: 'loopback';
}

/** The per-attachment parameters (libcni's RuntimeConf). */
export interface RuntimeConf {
  containerId: string;
  /** Path of the network namespace; '' on DEL when it is already gone. */
  netns: string;
  ifName: string;
  /** CNI_ARGS pairs, e.g. [['K8S_POD_NAME', 'web-0']]; passed as `k=v;k=v`. */
  args?: [string, string][];
  /** Capability values, passed in `runtimeConfig` to plugins that declare the capability. */
  capabilityArgs?: Record<string, unknown>;
}

export interface CniInterface {
  name: string;
  mac?: string;
  /** Spec 1.1.0. */
  mtu?: number;
  /** Netns path for interfaces inside the container; absent for host-side interfaces. */
  sandbox?: string;
  /** Spec 1.1.0. */
  socketPath?: string;
  /** Spec 1.1.0. */
  pciID?: string;
}

export interface CniIpConfig {
  /** CIDR notation: the address and the prefix length of its subnet, e.g. 10.99.3.2/24. */
  address: string;
  gateway?: string;
  /** Index into `interfaces`. */
  interface?: number;
}

/** The one normalized result every spec version parses into. */
export interface CniResult {
  /** The version the plugin answered in. */
  cniVersion: string;
  interfaces: CniInterface[];
  ips: CniIpConfig[];
  routes: Route[];
  dns: Dns;
}

/** Wire format of results in spec 0.1.0 and 0.2.0. */
export interface Result020 {
  cniVersion: string;
  ip4?: { ip: string; gateway?: string; routes?: Route[] };
  ip6?: { ip: string; gateway?: string; routes?: Route[] };
  dns?: Dns;
}

/** Wire format of results in spec 0.3.0, 0.3.1 and 0.4.0: ips carry `version`. */
export interface Result040 {
  cniVersion: string;
  interfaces?: CniInterface[];
  ips?: (CniIpConfig & { version: '4' | '6' })[];
  routes?: Route[];
  dns?: Dns;
}

/** Wire format of results in spec 1.0.0 and 1.1.0. */
export interface Result100 {
  cniVersion: string;
  interfaces?: CniInterface[];
  ips?: CniIpConfig[];
  routes?: Route[];
  dns?: Dns;
}

export type WireResult = Result020 | Result040 | Result100;

/** What a plugin answers to VERSION. */
export interface PluginVersionInfo {
  cniVersion: string;
  supportedVersions: string[];
}

/** One result cache file (libcni's cachedInfo, kind cniCacheV1). */
export interface CacheEntry {
  kind: 'cniCacheV1';
  containerId: string;
  /** Base64 of the network config bytes (the single config or the whole list) as this runtime serialized them. */
  config: string;
  ifName: string;
  networkName: string;
  netns?: string;
  cniArgs?: [string, string][];
  capabilityArgs?: Record<string, unknown>;
  /** The result in the wire format of the config's cniVersion. */
  result?: WireResult;
}
