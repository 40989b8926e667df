/**
 * The agent's config keys, each defined once: its type, allowed values, default, flag, meaning and
 * validation (`CONFIG_KEYS`). From this table come the defaults (`DEFAULT_CONFIG`), the YAML loader's
 * and the flags' checks (config.ts), `kubenet daemon --help` (src/cli/help.ts), the flags of an
 * agent started as configured (config.ts `configFlags`) and docs/config.md's table (`configKeysMarkdown`). A new key
 * is one entry here plus its field in `AgentConfig`; rules between keys live in config.ts.
 */
import { isAbsolute } from 'node:path';
import { parseBandwidth } from '../../bandwidth/limits.js';
import { parsePodCidrs } from '../../net/ip.js';
import { HAIRPIN_MODES, type HairpinMode } from '../../pod/bridge-conf.js';
import { AUTO_SHARDS_PER_CPU, MAX_SHARDS } from '../../shaper/tc-layout.js';
import { absPath, causeText, cidr, describe, ifName, oneOf, str, type Validator } from './validate.js';
import { parseListenAddress } from '../../net/listen-address.js';
import { DEFAULT_SOCKET_PATH, MAX_SOCKET_PATH_BYTES } from '../protocol.js';

export { causeText, describe, type Fail, type Validator } from './validate.js';

export const LOG_LEVELS = ['trace', 'debug', 'info', 'warn', 'error', 'silent'] as const;
export type LogLevel = (typeof LOG_LEVELS)[number];
/** Where pod addresses come from: the node's pod CIDR (host-local) or the LAN's DHCP server. */
export const IPAM_MODES = ['host-local', 'dhcp'] as const;
export type IpamMode = (typeof IPAM_MODES)[number];
/** Routes to other Nodes' pod CIDRs (src/daemon/cluster/routes.ts). */
export const ROUTE_MODES = ['none', 'direct', 'auto'] as const;
export type RouteMode = (typeof ROUTE_MODES)[number];
/**
 * The VXLAN UDP port and VNI of `routes: auto`: neither flannel's (8472, VNI 1; also the Linux and
 * Cilium default port) nor the IANA port 4789 (Calico, Antrea, OVN), so the agent's tunnel never
 * takes packets meant for another overlay on the same nodes.
 */
export const DEFAULT_VXLAN_PORT = 8475;
export const DEFAULT_VXLAN_VNI = 98;
/** Who may read the metrics port: anyone, or what the API server's TokenReview and SubjectAccessReview allow. */
export const METRICS_AUTH_MODES = ['none', 'kubernetes'] as const;
export type MetricsAuthMode = (typeof METRICS_AUTH_MODES)[number];
/**
 * The metrics port's default: outside Prometheus's exporter range (9100-9999, all allocated) and
 * the Kubernetes components' own ports (10248-10259: kubelet, kube-proxy, controller-manager,
 * scheduler), and none of the node network plugins' (Cilium 9962-9965, Calico 9091/9099, Antrea
 * 10349-10350, kube-router 20244, NodeLocal DNSCache 9253, CoreDNS 9153).
 */
export const DEFAULT_METRICS_PORT = 10266;
/** The DHCP lease daemon's socket: beside the agent's own socket, in the agent's run dir. */
export const DHCP_SOCKET_NAME = 'dhcp.sock';

/** The resolved agent configuration. Optional keys are absent (not undefined) when unset. */
export interface AgentConfig {
  /** Static pod CIDR ("v4" or "v4,v6", host bits cleared): the no-cluster mode. Unset: watch this Node's spec.podCIDRs. */
  podCIDR?: string;
  /** The Node this agent runs on. */
  nodeName: string;
  /** Kubeconfig file for the API server; unset: in-cluster config. */
  kubeconfig?: string;
  /** Unix socket the agent serves the CNI API on (see protocol.ts). */
  socket: string;
  /** Where the agent installs its CNI binary as `kubenet`. */
  cniBinDir: string;
  /** Where the agent writes `10-kubenet.conflist`. */
  cniConfDir: string;
  /** Where the reference CNI plugins (bridge, host-local, loopback) are looked up, in order. */
  pluginBinDirs: string[];
  bridgeName: string;
  /** The ifb device that carries shaped pods' egress (traffic from pods): egress shard 0. */
  ifbName: string;
  /** How many ifbs (egress shards, each its own htb tree) carry the pods' egress; 0: chosen from the CPUs (shardsFor). */
  ifbShards: number;
  /** Bridge/veth MTU; unset: the smallest MTU of the host's uplinks. */
  mtu?: number;
  hairpinMode: HairpinMode;
  /** Traffic to this CIDR is not masqueraded. */
  nonMasqueradeCIDR: string;
  /** Routes to the other Nodes' pod CIDRs (src/daemon/cluster/routes.ts): `direct` via their InternalIPs, `auto` (direct where connected, VXLAN elsewhere), or none. */
  routes: RouteMode;
  /** `routes: auto`: the UDP port of the VXLAN tunnels. */
  vxlanPort: number;
  /** `routes: auto`: the VXLAN network identifier. */
  vxlanVNI: number;
  /** Destinations whose traffic with shaped pods is not shaped; unset: the cluster's pod and Service ranges (live) with routes direct, else none. */
  unshapedCIDRs?: string[];
  /** Where pod addresses come from. */
  ipam: IpamMode;
  /** dhcp: the host interface enslaved to the bridge (required with dhcp, refused without). */
  uplink?: string;
  /** dhcp: seconds an ADD waits for a lease before it fails. */
  dhcpTimeout: number;
  /** host-local IPAM data directory. */
  ipamDataDir: string;
  /** CNI result cache directory (libcni layout). */
  cniCacheDir: string;
  /** The agent's own state. */
  stateDir: string;
  /** Seconds a /metrics scrape may serve the pods' counters an earlier scrape read; 0: each reads them. */
  metricsMaxAge: number;
  /** Where /metrics and /healthz are served over TCP (http/metrics-port.ts): "HOST:PORT", ":PORT" (every address), or "off". */
  metricsAddress: string;
  /** Who may read /metrics over TCP: anyone (`none`), or callers the API server authenticates and authorizes (`kubernetes`). */
  metricsAuth: MetricsAuthMode;
  /** PEM certificate (chain) the metrics port serves TLS with; with metricsTLSKeyFile. Unset: plain HTTP, or a self-signed certificate with metricsAuth kubernetes. */
  metricsTLSCertFile?: string;
  /** The PEM private key of metricsTLSCertFile. */
  metricsTLSKeyFile?: string;
  /** The node's bandwidth capacity from the pods (bits/s); unset: the link speed of capacityDevice (src/bandwidth/capacity.ts). */
  egressCapacity?: number;
  /** The node's bandwidth capacity to the pods (bits/s); unset: the link speed of capacityDevice. */
  ingressCapacity?: number;
  /** The device whose link speed gives an unset capacity; unset: the IPv4 default route's device. */
  capacityDevice?: string;
  logLevel: LogLevel;
}

export type ConfigKey = keyof AgentConfig;
/** Keys without a fixed default: optional ones and nodeName (from the environment). */
export type UndefaultedConfigKey =
  | 'podCIDR'
  | 'nodeName'
  | 'kubeconfig'
  | 'mtu'
  | 'uplink'
  | 'unshapedCIDRs'
  | 'egressCapacity'
  | 'ingressCapacity'
  | 'capacityDevice'
  | 'metricsTLSCertFile'
  | 'metricsTLSKeyFile';
export type DefaultedConfig = Omit<AgentConfig, UndefaultedConfigKey>;

/** Env var nodeName defaults to (set by the DaemonSet from spec.nodeName). */
export const NODE_NAME_ENV = 'NODE_NAME';

export interface ConfigKeySpec {
  /** Type in the YAML file. */
  type: 'string' | 'string[]' | 'integer';
  /** The allowed values, for enums. */
  values?: readonly string[];
  /** The default value; absent for keys without a fixed one. */
  value?: unknown;
  /** The default as docs/config.md and --help show it; undefined for optional keys without one. */
  default: string | undefined;
  /** The matching `kubenet daemon` flag. */
  flag: string;
  description: string;
  validate: Validator;
}

type KeyDefinition = Omit<ConfigKeySpec, 'default'> & { defaultText?: string };

/** `egressCapacity` / `ingressCapacity`: a bandwidth quantity, kept in bits/s. */
function capacityKey(direction: 'egress' | 'ingress', what: string): KeyDefinition {
  return {
    type: 'string',
    flag: `--${direction}-capacity`,
    defaultText: 'the link speed of capacityDevice',
    description: `The node's bandwidth ${what}, a quantity as in the pod annotations (e.g. "10G"): the rate of the shaping tree's node class, the capacity published on the Node as \`kubenet.io/${direction}-bandwidth\` (1 = 1 Mbit/s) and what guarantees are promised out of. Unset: in cluster mode the link speed of \`capacityDevice\`, and a device that reports none turns ${direction} guarantees off (\`kubenet status\` says so); with a static \`podCIDR\`, none.`,
    validate: (value, fail) => {
      // A number is bits/s (a loaded config given again as flags).
      const s =
        typeof value === 'number' && Number.isSafeInteger(value) ? String(value) : str(value, fail, 'a bandwidth quantity such as "10G"');
      try {
        return parseBandwidth(s, `${direction}Capacity`);
      } catch (err) {
        throw fail('a bandwidth quantity from 1k to 10T, such as "10G"', causeText(err));
      }
    },
  };
}

const KEYS: Record<ConfigKey, KeyDefinition> = {
  podCIDR: {
    type: 'string',
    flag: '--pod-cidr',
    description:
      'Static pod CIDR, "v4" or "v4,v6" (e.g. "10.244.1.0/24,fd00:10:244:1::/64"): the embedded default that needs no Kubernetes API. Unset: watch this Node\'s spec.podCIDRs.',
    validate: (value, fail) => {
      const expected = 'a CIDR or a "v4,v6" pair such as "10.244.1.0/24" or "10.244.1.0/24,fd00:10:244:1::/64"';
      const s = str(value, fail, expected);
      try {
        return parsePodCidrs(s)
          .map((subnet) => subnet.cidr)
          .join(',');
      } catch (err) {
        throw fail(expected, causeText(err));
      }
    },
  },
  nodeName: {
    type: 'string',
    defaultText: `env ${NODE_NAME_ENV}, else the host name (lower case)`,
    flag: '--node-name',
    description: 'Name of the Node this agent runs on.',
    validate: (value, fail) => {
      const expected = 'a Kubernetes node name (lower-case DNS subdomain, at most 253 characters)';
      const s = str(value, fail, expected);
      if (s.length > 253 || !/^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$/.test(s)) throw fail(expected);
      return s;
    },
  },
  kubeconfig: {
    type: 'string',
    flag: '--kubeconfig',
    description: 'Kubeconfig file for the API server. Unset: the in-cluster service account config.',
    validate: (value, fail) => str(value, fail, 'a path to a kubeconfig file'),
  },
  socket: {
    type: 'string',
    value: DEFAULT_SOCKET_PATH,
    flag: '--socket',
    description: `Absolute path of the unix socket serving the CNI API (at most ${MAX_SOCKET_PATH_BYTES} bytes); written into the conflist for the CNI binary.`,
    validate: (value, fail) => {
      const expected = `an absolute path of at most ${MAX_SOCKET_PATH_BYTES} bytes (the unix socket address limit)`;
      const s = absPath(expected)(value, fail) as string;
      if (Buffer.byteLength(s) > MAX_SOCKET_PATH_BYTES) throw fail(expected);
      return s;
    },
  },
  cniBinDir: {
    type: 'string',
    value: '/opt/cni/bin',
    flag: '--cni-bin-dir',
    description: 'Directory the agent installs its CNI binary into, as `kubenet`.',
    validate: absPath(),
  },
  cniConfDir: {
    type: 'string',
    value: '/etc/cni/net.d',
    flag: '--cni-conf-dir',
    description: 'Directory the agent writes `10-kubenet.conflist` into once the pod CIDR is known.',
    validate: absPath(),
  },
  pluginBinDirs: {
    type: 'string[]',
    value: ['/opt/cni/bin', '/usr/lib/cni'],
    flag: '--plugin-bin-dirs',
    description: 'Directories searched, in order, for the reference CNI plugins (bridge, host-local, loopback).',
    validate: (value, fail) => {
      const expected = 'a non-empty list of absolute paths';
      if (!Array.isArray(value) || value.length === 0) throw fail(expected);
      return value.map((v) => {
        if (typeof v !== 'string' || !isAbsolute(v) || v.includes('\0')) throw fail(expected, `element ${describe(v)}`);
        return v;
      });
    },
  },
  bridgeName: {
    type: 'string',
    value: 'cbr0',
    flag: '--bridge-name',
    description: 'Linux bridge every pod veth is attached to (at most 15 bytes).',
    validate: ifName,
  },
  ifbName: {
    type: 'string',
    value: 'kubenet-ifb0',
    flag: '--ifb-name',
    description:
      "The ifb device that shapes shaped pods' egress (at most 15 bytes); with more than one egress shard (`ifbShards`), the others are `<ifbName>.1`, `<ifbName>.2`, ...; with an ingress capacity, `<ifbName>.in` holds the ingress tree (with several shards, `<ifbName>.i1`, ... too). Created when the agent starts.",
    validate: ifName,
  },
  ifbShards: {
    type: 'integer',
    value: 0,
    flag: '--ifb-shards',
    description: `How many ifbs carry the shaped pods' egress, 1..${MAX_SHARDS}, each its own htb tree; a new shaped pod goes to the one with the fewest and stays there. One tree serializes every shaped pod's packets on one lock and one tasklet; shards spread them. 0 (the default): ${AUTO_SHARDS_PER_CPU} per CPU of the node, at most ${MAX_SHARDS}. With a capacity, each direction's capacity is split over that many trees (the ingress ones \`<ifbName>.in\`, \`<ifbName>.i1\`, ...), each shard's share moved by demand every 100 ms (docs/shaping.md, "Shards under a capacity"); 1 keeps one tree each way.`,
    validate: (value, fail) => {
      const expected = `an integer from 0 (chosen from the CPUs) to ${MAX_SHARDS}`;
      if (typeof value !== 'number' || !Number.isInteger(value) || value < 0 || value > MAX_SHARDS) throw fail(expected);
      return value;
    },
  },
  mtu: {
    type: 'integer',
    flag: '--mtu',
    description: "MTU of the bridge and pod interfaces, 68..65535. Unset: the smallest MTU of the host's up, non-loopback links.",
    validate: (value, fail) => {
      if (typeof value !== 'number' || !Number.isInteger(value) || value < 68 || value > 65535) throw fail('an integer from 68 to 65535');
      return value;
    },
  },
  hairpinMode: {
    type: 'string',
    values: HAIRPIN_MODES,
    value: 'hairpin-veth',
    flag: '--hairpin-mode',
    description: 'How a pod reaches itself through a service: hairpin on each veth, promiscuous bridge, or none.',
    validate: oneOf(HAIRPIN_MODES),
  },
  nonMasqueradeCIDR: {
    type: 'string',
    value: '10.0.0.0/8',
    flag: '--non-masquerade-cidr',
    description:
      'Traffic from pods to this CIDR keeps its source address; other off-node traffic is masqueraded. 0.0.0.0/0 disables masquerading.',
    validate: (value, fail) => {
      const expected = 'a CIDR such as "10.0.0.0/8"';
      return cidr(str(value, fail, expected), fail, expected);
    },
  },
  routes: {
    type: 'string',
    values: ROUTE_MODES,
    value: 'none',
    flag: '--routes',
    description:
      'Routes to the pods of other nodes: `direct` watches every Node and routes its pod CIDRs via its InternalIP when that is on a subnet directly connected to this node (routing protocol 98: `ip route show proto 98`; a Node it cannot route gets a Warning Event `NodeRouteUnavailable`), so a cluster needs no cloud route controller; keep the cluster CIDR inside `nonMasqueradeCIDR`. `auto` does the same for Nodes on a connected subnet and reaches every other Node through a VXLAN device per family (`kubenet-vx4`, `kubenet-vx6`; `vxlanPort`, `vxlanVNI`; docs/cluster.md). `none` leaves routes to others (a cloud, an operator). `direct` and `auto` need the Kubernetes API (no `podCIDR`) and `ipam: host-local`.',
    validate: oneOf(ROUTE_MODES),
  },
  vxlanPort: {
    type: 'integer',
    value: DEFAULT_VXLAN_PORT,
    flag: '--vxlan-port',
    description:
      "With `routes: auto`: the UDP port (1..65535) of the VXLAN tunnels to Nodes on no connected subnet; every node of the cluster should use the same. The agent publishes its port and VNI on its Node (annotation `kubenet.io/vxlan`); a peer that publishes others is still reached with its own, and gets a Warning Event `VXLANSettingsDiffer`. The default is neither flannel's 8472 nor the IANA port 4789.",
    validate: (value, fail) => {
      if (typeof value !== 'number' || !Number.isInteger(value) || value < 1 || value > 65535) throw fail('a UDP port from 1 to 65535');
      return value;
    },
  },
  vxlanVNI: {
    type: 'integer',
    value: DEFAULT_VXLAN_VNI,
    flag: '--vxlan-vni',
    description:
      "With `routes: auto`: the VXLAN network identifier (1..16777215) of the tunnels; every node of the cluster should use the same (see `vxlanPort`). The default is not flannel's 1.",
    validate: (value, fail) => {
      if (typeof value !== 'number' || !Number.isInteger(value) || value < 1 || value > 16777215) throw fail('a VNI from 1 to 16777215');
      return value;
    },
  },
  unshapedCIDRs: {
    type: 'string[]',
    flag: '--unshaped-cidrs',
    defaultText: 'see description',
    description:
      "CIDRs (IPv4 and IPv6) whose traffic with shaped pods runs at line rate, both ways: a pod's limits then hold only for traffic with anything else (e.g. the internet), not for traffic between pods of the cluster. Kept per node (the egress ifbs' filters, a mangle chain `KUBENET-UNSHAPED`), not per pod. Unset: with `routes: direct` or `auto`, exactly the cluster's own ranges, followed live (every Node's pod CIDRs and the ServiceCIDRs' `spec.cidrs`), else none; an empty list shapes everything.",
    validate: (value, fail) => {
      const expected = 'a list of CIDRs such as ["10.0.0.0/8", "fd00::/8"]';
      if (!Array.isArray(value)) throw fail(expected);
      return value.map((v) => {
        if (typeof v !== 'string') throw fail(expected, `element ${describe(v)}`);
        return cidr(v, fail, expected);
      });
    },
  },
  ipam: {
    type: 'string',
    values: IPAM_MODES,
    value: 'host-local',
    flag: '--ipam',
    description:
      "Where pod addresses come from: `host-local`, the node's pod CIDR (the bridge is the pods' gateway, off-node traffic is masqueraded); or `dhcp`, the LAN's DHCP server through `uplink` (address, gateway and routes from each pod's lease; the bridge is no gateway, no masquerade rule; the agent runs the reference lease daemon).",
    validate: oneOf(IPAM_MODES),
  },
  uplink: {
    type: 'string',
    flag: '--uplink',
    description:
      "With `ipam: dhcp` (required there, refused otherwise): the host interface the agent enslaves to the bridge, so pods share the LAN's L2 segment. It must carry no IP address of its own (the node's address belongs on another interface, or on the bridge).",
    validate: ifName,
  },
  dhcpTimeout: {
    type: 'integer',
    value: 30,
    flag: '--dhcp-timeout',
    description:
      "With `ipam: dhcp`: seconds, 2..600, a pod's ADD waits for its lease before it fails (no DHCP server answered) and is undone.",
    validate: (value, fail) => {
      if (typeof value !== 'number' || !Number.isInteger(value) || value < 2 || value > 600)
        throw fail('an integer number of seconds from 2 to 600');
      return value;
    },
  },
  ipamDataDir: {
    type: 'string',
    value: '/var/lib/cni/networks',
    flag: '--ipam-data-dir',
    description: 'host-local IPAM data directory (unused with `ipam: dhcp`).',
    validate: absPath(),
  },
  cniCacheDir: {
    type: 'string',
    value: '/var/lib/cni',
    flag: '--cni-cache-dir',
    description:
      "Where kubenet-ts 0.1.0 kept the agent's CNI results (libcni layout, results/ under it): read once at startup to upgrade in place, never written. The agent's own state, pod records included, lives in stateDir.",
    validate: absPath(),
  },
  stateDir: {
    type: 'string',
    value: '/var/lib/kubenet',
    flag: '--state-dir',
    description:
      "The agent's own state: a record per pod (written before any plugin runs, so a DEL after a crash undoes everything) and the shaper's state.",
    validate: absPath(),
  },
  metricsMaxAge: {
    type: 'integer',
    value: 2,
    flag: '--metrics-max-age',
    description:
      "Seconds, 0..60, a /metrics scrape may serve the pods' tc counters an earlier scrape read, instead of reading them again, while no pod was added, reshaped or removed since (each read at 500 shaped pods costs ~45-75 ms of the agent's CPU: docs/shaping.md); scrapes in a storm share one read. 0: every scrape reads them.",
    validate: (value, fail) => {
      if (typeof value !== 'number' || !Number.isInteger(value) || value < 0 || value > 60)
        throw fail('an integer number of seconds from 0 to 60');
      return value;
    },
  },
  metricsAddress: {
    type: 'string',
    value: `:${DEFAULT_METRICS_PORT}`,
    flag: '--metrics-address',
    description:
      'Where `/metrics` and `/healthz` (liveness: 200 while the agent runs) are served over TCP, and nothing else (the CNI API and `kubenet shape` stay on the unix socket): `HOST:PORT` (e.g. `127.0.0.1:10266`, `[::1]:10266`), `:PORT` on every address of the node (IPv4 and IPv6), or `off`. Port 0 picks a free one (logged).',
    validate: (value, fail) => {
      const expected = 'HOST:PORT, :PORT or "off", with a port from 0 to 65535';
      const s = str(value, fail, expected);
      if (s === 'off') return s;
      try {
        parseListenAddress(s);
      } catch (err) {
        throw fail(expected, causeText(err));
      }
      return s;
    },
  },
  metricsAuth: {
    type: 'string',
    values: METRICS_AUTH_MODES,
    value: 'none',
    flag: '--metrics-auth',
    description:
      "Who may read `/metrics` over TCP. `none`: anyone who reaches the port. `kubernetes`: as kubelet and kube-rbac-proxy do, a bearer token the API server authenticates (TokenReview) and authorizes (SubjectAccessReview: verb `get` on the non-resource URL `/metrics`), answers cached 2 min (denials 30 s); served over TLS (metricsTLSCertFile, else a self-signed certificate made at start). `/healthz` stays open for the kubelet's probe. Needs the Kubernetes API (no static podCIDR) and, in the agent's RBAC, `create` on tokenreviews and subjectaccessreviews.",
    validate: oneOf(METRICS_AUTH_MODES),
  },
  metricsTLSCertFile: {
    type: 'string',
    flag: '--metrics-tls-cert-file',
    description:
      'PEM certificate (chain) the metrics port serves TLS with, with `metricsTLSKeyFile` (both or neither). Unset: plain HTTP, or with `metricsAuth: kubernetes` a self-signed certificate.',
    validate: absPath(),
  },
  metricsTLSKeyFile: {
    type: 'string',
    flag: '--metrics-tls-key-file',
    description: 'The PEM private key of `metricsTLSCertFile`.',
    validate: absPath(),
  },
  egressCapacity: capacityKey('egress', 'from the pods: what the node sends out'),
  ingressCapacity: capacityKey('ingress', 'to the pods: what the node takes in'),
  capacityDevice: {
    type: 'string',
    flag: '--capacity-device',
    defaultText: "the IPv4 default route's device",
    description: 'The device whose link speed (/sys/class/net/DEV/speed) gives `egressCapacity` and `ingressCapacity` when they are unset.',
    validate: ifName,
  },
  logLevel: {
    type: 'string',
    values: LOG_LEVELS,
    value: 'info',
    flag: '--log-level',
    description: 'Log level.',
    validate: oneOf(LOG_LEVELS),
  },
};

/** Every config key: type, default, flag, description and validation. Order is docs/config.md's order. */
export const CONFIG_KEYS: Readonly<Record<ConfigKey, ConfigKeySpec>> = Object.freeze(
  Object.fromEntries(
    Object.entries(KEYS).map(([key, { defaultText, ...k }]) => [
      key,
      Object.freeze({
        ...k,
        default: defaultText ?? (k.value === undefined ? undefined : Array.isArray(k.value) ? k.value.join(',') : String(k.value)),
      }),
    ]),
  ) as Record<ConfigKey, ConfigKeySpec>,
);

/** Defaults of every key that has a fixed one (CONFIG_KEYS' values). Frozen; loadConfig returns copies. */
export const DEFAULT_CONFIG: Readonly<DefaultedConfig> = Object.freeze(
  Object.fromEntries(
    Object.entries(KEYS).flatMap(([key, k]) =>
      k.value === undefined ? [] : [[key, Array.isArray(k.value) ? Object.freeze([...(k.value as string[])]) : k.value]],
    ),
  ) as unknown as DefaultedConfig,
);

/** docs/config.md's table of config keys, generated from CONFIG_KEYS. */
export function configKeysMarkdown(): string {
  const rows = (Object.entries(CONFIG_KEYS) as Array<[ConfigKey, ConfigKeySpec]>).map(([key, s]) => {
    const type = s.values ? s.values.map((v) => `\`${v}\``).join(' \\| ') : s.type;
    const def = s.default === undefined ? '—' : key === 'nodeName' ? s.default : `\`${s.default}\``;
    return `| \`${key}\` | \`${s.flag}\` | ${type} | ${def} | ${s.description.replace(/\|/g, '\\|')} |`;
  });
  return ['| key | flag | type | default | description |', '| --- | --- | --- | --- | --- |', ...rows].join('\n');
}

/**
 * The JSON Schema (draft-07, as Helm checks values with) of a config file's mapping, generated from
 * CONFIG_KEYS: each key's type, allowed values and description; no other key. The Helm chart's
 * values.schema.json holds it as `config` (hack/render-manifest.sh writes it).
 */
export function configKeysJsonSchema(): Record<string, unknown> {
  const properties = Object.fromEntries(
    (Object.entries(CONFIG_KEYS) as Array<[ConfigKey, ConfigKeySpec]>).map(([key, s]) => {
      const type = s.values
        ? { type: 'string', enum: [...s.values] }
        : s.type === 'string[]'
          ? { type: 'array', items: { type: 'string' } }
          : { type: s.type };
      return [key, { ...type, description: s.description, ...(s.value !== undefined ? { default: s.value } : {}) }];
    }),
  );
  return { type: 'object', additionalProperties: false, properties };
}
