/**
 * Configuration of the kubenet node agent (`kubenet daemon`): a YAML file plus command-line flags;
 * a flag wins over the file, the file over the defaults.
 *
 * Parsing is strict: an unknown key, a value of the wrong type, a bad enum value or path, an
 * unreadable file or invalid YAML is an {@link AgentConfigError} (a ConfigError) naming the file
 * (or the flag), the key and what was expected. {@link CONFIG_KEYS} describes every key; README's
 * table is {@link configKeysMarkdown}.
 */
import { readFile } from 'node:fs/promises';
import { hostname } from 'node:os';
import { dirname, isAbsolute, join, normalize } from 'node:path';
import yaml from 'js-yaml';
import { ConfigError } from '../errors.js';
import { isValidIfName } from '../net/ifname.js';
import { parseCidr, parsePodCidrs } from '../net/ip.js';
import { HAIRPIN_MODES, type HairpinMode } from '../pod/bridge.js';
import { DEFAULT_SOCKET_PATH, MAX_SOCKET_PATH_BYTES } from './protocol.js';


export const LOG_LEVELS = ['trace', 'debug', 'info', 'warn', 'error', 'silent'] as const;
export type LogLevel = (typeof LOG_LEVELS)[number];
/** Where pod addresses come from: the node's pod CIDR (host-local) or the LAN's DHCP server. */
export const IPAM_MODES = ['host-local', 'dhcp'] as const;
export type IpamMode = (typeof IPAM_MODES)[number];
/** Routes to other Nodes' pod CIDRs (src/daemon/routes.ts). */
export const ROUTE_MODES = ['none', 'direct'] as const;
export type RouteMode = (typeof ROUTE_MODES)[number];
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
  /** The shared ifb device that carries every shaped pod's egress (traffic from pods). */
  ifbName: string;
  /** Bridge/veth MTU; unset: the smallest MTU of the host's uplinks. */
  mtu?: number;
  hairpinMode: HairpinMode;
  /** Traffic to this CIDR is not masqueraded. */
  nonMasqueradeCIDR: string;
  /** Routes to the other Nodes' pod CIDRs (src/daemon/routes.ts): `direct` via their InternalIPs, or none. */
  routes: RouteMode;
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
  logLevel: LogLevel;
}

export type ConfigKey = keyof AgentConfig;
/** Keys without a fixed default: optional ones and nodeName (from the environment). */
export type UndefaultedConfigKey = 'podCIDR' | 'nodeName' | 'kubeconfig' | 'mtu' | 'uplink';
export type DefaultedConfig = Omit<AgentConfig, UndefaultedConfigKey>;

/** Defaults of every key that has a fixed one. Frozen; loadConfig returns copies. */
export const DEFAULT_CONFIG: Readonly<DefaultedConfig> = Object.freeze({
  socket: DEFAULT_SOCKET_PATH,
  cniBinDir: '/opt/cni/bin',
  cniConfDir: '/etc/cni/net.d',
  pluginBinDirs: Object.freeze(['/opt/cni/bin', '/usr/lib/cni']) as unknown as string[],
  bridgeName: 'cbr0',
  ifbName: 'kubenet-ifb0',
  hairpinMode: 'hairpin-veth',
  nonMasqueradeCIDR: '10.0.0.0/8',
  routes: 'none',
  ipam: 'host-local',
  dhcpTimeout: 30,
  ipamDataDir: '/var/lib/cni/networks',
  cniCacheDir: '/var/lib/cni',
  stateDir: '/var/lib/kubenet',
  logLevel: 'info',
});

/** Env var nodeName defaults to (set by the DaemonSet from spec.nodeName). */
export const NODE_NAME_ENV = 'NODE_NAME';

export interface ConfigKeySpec {
  /** Type in the YAML file. */
  type: 'string' | 'string[]' | 'integer';
  /** The allowed values, for enums. */
  values?: readonly string[];
  /** The default, as README shows it; undefined for optional keys without one. */
  default: string | undefined;
  /** The matching `kubenet daemon` flag. */
  flag: string;
  description: string;
}

/** Every config key: type, default, flag and description. Order is README's order. */
export const CONFIG_KEYS: Readonly<Record<ConfigKey, ConfigKeySpec>> = Object.freeze({
  podCIDR: {
    type: 'string',
    default: undefined,
    flag: '--pod-cidr',
    description:
      'Static pod CIDR, "v4" or "v4,v6" (e.g. "10.244.1.0/24,fd00:10:244:1::/64"): the embedded default that needs no Kubernetes API. Unset: watch this Node\'s spec.podCIDRs.',
  },
  nodeName: {
    type: 'string',
    default: `env ${NODE_NAME_ENV}, else the host name (lower case)`,
    flag: '--node-name',
    description: 'Name of the Node this agent runs on.',
  },
  kubeconfig: {
    type: 'string',
    default: undefined,
    flag: '--kubeconfig',
    description: 'Kubeconfig file for the API server. Unset: the in-cluster service account config.',
  },
  socket: {
    type: 'string',
    default: DEFAULT_CONFIG.socket,
    flag: '--socket',
    description: `Absolute path of the unix socket serving the CNI API (at most ${MAX_SOCKET_PATH_BYTES} bytes); written into the conflist for the CNI binary.`,
  },
  cniBinDir: {
    type: 'string',
    default: DEFAULT_CONFIG.cniBinDir,
    flag: '--cni-bin-dir',
    description: 'Directory the agent installs its CNI binary into, as `kubenet`.',
  },
  cniConfDir: {
    type: 'string',
    default: DEFAULT_CONFIG.cniConfDir,
    flag: '--cni-conf-dir',
    description: 'Directory the agent writes `10-kubenet.conflist` into once the pod CIDR is known.',
  },
  pluginBinDirs: {
    type: 'string[]',
    default: DEFAULT_CONFIG.pluginBinDirs.join(','),
    flag: '--plugin-bin-dirs',
    description: 'Directories searched, in order, for the reference CNI plugins (bridge, host-local, loopback).',
  },
  bridgeName: {
    type: 'string',
    default: DEFAULT_CONFIG.bridgeName,
    flag: '--bridge-name',
    description: 'Linux bridge every pod veth is attached to (at most 15 bytes).',
  },
  ifbName: {
    type: 'string',
    default: DEFAULT_CONFIG.ifbName,
    flag: '--ifb-name',
    description: 'The one ifb device that shapes the egress of every shaped pod (at most 15 bytes); created with the first shaped pod.',
  },
  mtu: {
    type: 'integer',
    default: undefined,
    flag: '--mtu',
    description: 'MTU of the bridge and pod interfaces, 68..65535. Unset: the smallest MTU of the host\'s up, non-loopback links.',
  },
  hairpinMode: {
    type: 'string',
    values: HAIRPIN_MODES,
    default: DEFAULT_CONFIG.hairpinMode,
    flag: '--hairpin-mode',
    description: 'How a pod reaches itself through a service: hairpin on each veth, promiscuous bridge, or none.',
  },
  nonMasqueradeCIDR: {
    type: 'string',
    default: DEFAULT_CONFIG.nonMasqueradeCIDR,
    flag: '--non-masquerade-cidr',
    description: 'Traffic from pods to this CIDR keeps its source address; other off-node traffic is masqueraded. 0.0.0.0/0 disables masquerading.',
  },
  routes: {
    type: 'string',
    values: ROUTE_MODES,
    default: DEFAULT_CONFIG.routes,
    flag: '--routes',
    description:
      'Routes to the pods of other nodes: `direct` watches every Node and routes its pod CIDRs via its InternalIP when that is on a subnet directly connected to this node (routing protocol 98: `ip route show proto 98`; a Node it cannot route gets a Warning Event `NodeRouteUnavailable`), so a cluster needs no cloud route controller; keep the cluster CIDR inside `nonMasqueradeCIDR`. `none` leaves routes to others (a cloud, an operator). `direct` needs the Kubernetes API (no `podCIDR`) and `ipam: host-local`.',
  },
  ipam: {
    type: 'string',
    values: IPAM_MODES,
    default: DEFAULT_CONFIG.ipam,
    flag: '--ipam',
    description:
      'Where pod addresses come from: `host-local`, the node\'s pod CIDR (the bridge is the pods\' gateway, off-node traffic is masqueraded); or `dhcp`, the LAN\'s DHCP server through `uplink` (address, gateway and routes from each pod\'s lease; the bridge is no gateway, no masquerade rule; the agent runs the reference lease daemon).',
  },
  uplink: {
    type: 'string',
    default: undefined,
    flag: '--uplink',
    description:
      'With `ipam: dhcp` (required there, refused otherwise): the host interface the agent enslaves to the bridge, so pods share the LAN\'s L2 segment. It must carry no IP address of its own (the node\'s address belongs on another interface, or on the bridge).',
  },
  dhcpTimeout: {
    type: 'integer',
    default: String(DEFAULT_CONFIG.dhcpTimeout),
    flag: '--dhcp-timeout',
    description: 'With `ipam: dhcp`: seconds, 2..600, a pod\'s ADD waits for its lease before it fails (no DHCP server answered) and is undone.',
  },
  ipamDataDir: {
    type: 'string',
    default: DEFAULT_CONFIG.ipamDataDir,
    flag: '--ipam-data-dir',
    description: 'host-local IPAM data directory (unused with `ipam: dhcp`).',
  },
  cniCacheDir: {
    type: 'string',
    default: DEFAULT_CONFIG.cniCacheDir,
    flag: '--cni-cache-dir',
    description:
      "Where kubenet-ts 0.1.0 kept the agent's CNI results (libcni layout, results/ under it): read once at startup to upgrade in place, never written. The agent's own state, pod records included, lives in stateDir.",
  },
  stateDir: {
    type: 'string',
    default: DEFAULT_CONFIG.stateDir,
    flag: '--state-dir',
    description: "The agent's own state: a record per pod (written before any plugin runs, so a DEL after a crash undoes everything) and the shaper's state.",
  },
  logLevel: {
    type: 'string',
    values: LOG_LEVELS,
    default: DEFAULT_CONFIG.logLevel,
    flag: '--log-level',
    description: 'Log level.',
  },
});

/** README's table of config keys, generated from CONFIG_KEYS. */
export function configKeysMarkdown(): string {
  const rows = (Object.entries(CONFIG_KEYS) as Array<[ConfigKey, ConfigKeySpec]>).map(([key, s]) => {
    const type = s.values ? s.values.map((v) => `\`${v}\``).join(' \\| ') : s.type;
    const def = s.default === undefined ? '—' : key === 'nodeName' ? s.default : `\`${s.default}\``;
    return `| \`${key}\` | \`${s.flag}\` | ${type} | ${def} | ${s.description.replace(/\|/g, '\\|')} |`;
  });
  return ['| key | flag | type | default | description |', '| --- | --- | --- | --- | --- |', ...rows].join('\n');
}

/**
 * The `kubenet daemon` flags that give a config (each set key as CONFIG_KEYS[k].flag; lists joined
 * with commas), for starting an agent process as configured. dhcp's own keys are left out unless
 * ipam is dhcp: the agent refuses them otherwise, even at their defaults.
 */
export function configFlags(c: Partial<AgentConfig>): string[] {
  const flags: string[] = [];
  for (const [key, spec] of Object.entries(CONFIG_KEYS) as Array<[ConfigKey, ConfigKeySpec]>) {
    const v = c[key];
    if (v === undefined) continue;
    if ((key === 'uplink' || key === 'dhcpTimeout') && c.ipam !== 'dhcp') continue;
    flags.push(spec.flag, Array.isArray(v) ? v.join(',') : String(v));
  }
  return flags;
}

/** A config problem, with where it is (`source`: the file path or "flags"), the key and what was expected. */
export class AgentConfigError extends ConfigError {
  readonly source: string;
  readonly key: string | undefined;
  readonly expected: string | undefined;
  constructor(init: { source: string; key?: string; expected?: string; problem: string }, options?: { cause?: unknown }) {
    const where = init.key === undefined ? init.source : `${init.source}: key "${init.key}"`;
    super(`${where}: ${init.problem}`, options);
    this.source = init.source;
    this.key = init.key;
    this.expected = init.expected;
  }
}

export interface LoadConfigOptions {
  /** YAML file (camelCase keys). Omitted: defaults plus flags only. */
  file?: string;
  /** Values from command-line flags; undefined entries are ignored. They win over the file. */
  flags: Partial<AgentConfig>;
  /** Environment for defaults (NODE_NAME); process.env when omitted. */
  env?: Record<string, string | undefined>;
}

/** Loads and validates the agent config: defaults < file < flags. Throws AgentConfigError. */
export async function loadConfig(opts: LoadConfigOptions): Promise<AgentConfig> {
  const env = opts.env ?? process.env;
  const fromFile = opts.file === undefined ? {} : await readConfigFile(opts.file);
  const fromFlags = validateValues(Object.fromEntries(Object.entries(opts.flags).filter(([, v]) => v !== undefined)), 'flags');
  const merged: Partial<AgentConfig> = { ...fromFile, ...fromFlags };
  const envNode = nonEmpty(env[NODE_NAME_ENV]);
  const nodeName =
    merged.nodeName ??
    (envNode === undefined ? undefined : (validateValues({ nodeName: envNode }, `env ${NODE_NAME_ENV}`).nodeName as string)) ??
    hostname().toLowerCase();
  const out: AgentConfig = {
    ...DEFAULT_CONFIG,
    ...merged,
    nodeName,
    pluginBinDirs: [...(merged.pluginBinDirs ?? DEFAULT_CONFIG.pluginBinDirs)],
  };
  checkDirectories(out, opts.file ?? 'flags');
  checkIpam(out, merged, opts.file ?? 'flags');
  checkRoutes(out, opts.file ?? 'flags');
  return out;
}

/** The dhcp keys go together: `uplink` is required with dhcp and refused without, like `dhcpTimeout`. */
function checkIpam(c: AgentConfig, set: Partial<AgentConfig>, source: string): void {
  if (c.ipam === 'dhcp') {
    if (c.uplink === undefined) {
      throw new AgentConfigError({ source, key: 'uplink', expected: 'an interface name', problem: 'ipam "dhcp" needs an uplink: the host interface that connects the bridge to the LAN and its DHCP server' });
    }
    if (c.uplink === c.bridgeName || c.uplink === c.ifbName) {
      throw new AgentConfigError({ source, key: 'uplink', expected: 'an interface other than the bridge and the ifb', problem: `uplink ${c.uplink} is the agent's own ${c.uplink === c.bridgeName ? 'bridge' : 'ifb'}` });
    }
    const socket = dhcpSocketPath(c);
    if (Buffer.byteLength(socket) > MAX_SOCKET_PATH_BYTES) {
      throw new AgentConfigError({ source, key: 'socket', expected: `a directory short enough for ${DHCP_SOCKET_NAME}`, problem: `the DHCP lease daemon's socket ${socket} would be longer than ${MAX_SOCKET_PATH_BYTES} bytes` });
    }
    return;
  }
  for (const key of ['uplink', 'dhcpTimeout'] as const) {
    if (set[key] !== undefined) {
      throw new AgentConfigError({ source, key, expected: 'ipam "dhcp"', problem: `${key} applies only to ipam "dhcp" (ipam is "${c.ipam}")` });
    }
  }
}

/** `routes: direct` routes the Nodes' pod CIDRs: it needs the Nodes (cluster mode) and pods in those CIDRs (host-local). */
function checkRoutes(c: AgentConfig, source: string): void {
  if (c.routes !== 'direct') return;
  if (c.podCIDR !== undefined) {
    throw new AgentConfigError({ source, key: 'routes', expected: '"none" with a static podCIDR', problem: 'routes "direct" watches the Nodes of a cluster; with a static podCIDR there is no Kubernetes API to watch (unset podCIDR, or set routes: none)' });
  }
  if (c.ipam !== 'host-local') {
    throw new AgentConfigError({ source, key: 'routes', expected: '"none" with ipam "dhcp"', problem: `routes "direct" routes the Nodes' pod CIDRs; with ipam "${c.ipam}" pods take their addresses from the LAN, which needs no routes` });
  }
}

/** The DHCP lease daemon's socket: `dhcp.sock` in the directory of the agent's own socket. */
export function dhcpSocketPath(c: Pick<AgentConfig, 'socket'>): string {
  return join(dirname(c.socket), DHCP_SOCKET_NAME);
}

/** Whether `child` is `parent` or inside it (paths are absolute, compared after normalizing). */
function within(child: string, parent: string): boolean {
  const c = normalize(child).replace(/\/+$/, '');
  const p = normalize(parent).replace(/\/+$/, '');
  return c === p || c.startsWith(`${p}/`);
}

/**
 * Directories that must stay apart: the agent's state never inside a directory container runtimes
 * read or write (their CNI conf, bin and result-cache dirs), so nothing of the agent's can be taken
 * for theirs or theirs for the agent's.
 */
function checkDirectories(c: AgentConfig, source: string): void {
  const runtimeDirs: Array<[string, string]> = [
    ['cniConfDir', c.cniConfDir],
    ['cniBinDir', c.cniBinDir],
    ['the runtimes\' CNI result cache', join(c.cniCacheDir, 'results')],
  ];
  for (const [what, dir] of runtimeDirs) {
    if (within(c.stateDir, dir)) {
      throw new AgentConfigError({ source, key: 'stateDir', expected: `a directory outside ${what}`, problem: `stateDir ${c.stateDir} lies in ${what} (${dir}), which container runtimes use` });
    }
  }
  if (within(c.cniConfDir, c.cniBinDir) || within(c.cniBinDir, c.cniConfDir)) {
    throw new AgentConfigError({ source, key: 'cniConfDir', expected: 'a directory apart from cniBinDir', problem: `cniConfDir ${c.cniConfDir} and cniBinDir ${c.cniBinDir} overlap` });
  }
}

/** Reads, parses and validates one YAML config file (only the keys it sets). */
export async function readConfigFile(file: string): Promise<Partial<AgentConfig>> {
  let text: string;
  try {
    text = await readFile(file, 'utf8');
  } catch (err) {
    throw new AgentConfigError({ source: file, expected: 'a readable file', problem: `cannot read config file: ${causeText(err)}` }, { cause: err });
  }
  let doc: unknown;
  try {
    doc = yaml.load(text, { filename: file, schema: yaml.CORE_SCHEMA });
  } catch (err) {
    const reason =
      err instanceof yaml.YAMLException
        ? `${err.reason} at line ${err.mark.line + 1}, column ${err.mark.column + 1}`
        : causeText(err);
    throw new AgentConfigError({ source: file, expected: 'valid YAML', problem: `invalid YAML: ${reason}` }, { cause: err });
  }
  if (doc === undefined || doc === null) return {}; // an empty file: all defaults
  if (typeof doc !== 'object' || Array.isArray(doc)) {
    throw new AgentConfigError({ source: file, expected: 'a mapping of config keys', problem: `expected a mapping of config keys at the top level, got ${describe(doc)}` });
  }
  return validateValues(doc as Record<string, unknown>, file);
}

/** Validates every entry of `raw` against CONFIG_KEYS; returns the normalized values. */
function validateValues(raw: Record<string, unknown>, source: string): Partial<AgentConfig> {
  const out: Record<string, unknown> = {};
  for (const [key, value] of Object.entries(raw)) {
    if (!Object.hasOwn(CONFIG_KEYS, key)) {
      const near = Object.keys(CONFIG_KEYS).find((k) => k.toLowerCase() === key.toLowerCase().replace(/[-_]/g, ''));
      const hint = near ? ` (did you mean "${near}"?)` : '';
      throw new AgentConfigError({
        source,
        key,
        expected: `one of ${Object.keys(CONFIG_KEYS).join(', ')}`,
        problem: `unknown key${hint}; known keys: ${Object.keys(CONFIG_KEYS).join(', ')}`,
      });
    }
    const k = key as ConfigKey;
    out[k] = VALIDATORS[k](value, (expected, detail) => {
      const flag = source === 'flags' ? ` (${CONFIG_KEYS[k].flag})` : '';
      return new AgentConfigError({
        source,
        key,
        expected,
        problem: `expected ${expected}${flag}, got ${describe(value)}${detail ? `: ${detail}` : ''}`,
      });
    });
  }
  return out as Partial<AgentConfig>;
}

type Fail = (expected: string, detail?: string) => AgentConfigError;
type Validator = (value: unknown, fail: Fail) => unknown;

function str(value: unknown, fail: Fail, expected: string): string {
  if (typeof value !== 'string' || value === '' || value.includes('\0')) throw fail(expected);
  return value;
}

function ifName(value: unknown, fail: Fail): string {
  const expected = 'a Linux interface name (1-15 bytes, no "/", ":" or whitespace, not "." or "..")';
  const s = str(value, fail, expected);
  if (!isValidIfName(s)) throw fail(expected);
  return s;
}

function absPath(expected = 'an absolute path'): Validator {
  return (value, fail) => {
    const s = str(value, fail, expected);
    if (!isAbsolute(s)) throw fail(expected);
    return s;
  };
}

function oneOf(values: readonly string[]): Validator {
  const expected = `one of ${values.map((v) => JSON.stringify(v)).join(', ')}`;
  return (value, fail) => {
    if (typeof value !== 'string' || !values.includes(value)) throw fail(expected);
    return value;
  };
}

function causeText(err: unknown): string {
  return err instanceof Error ? err.message : String(err);
}

const VALIDATORS: Record<ConfigKey, Validator> = {
  podCIDR: (value, fail) => {
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
  nodeName: (value, fail) => {
    const expected = 'a Kubernetes node name (lower-case DNS subdomain, at most 253 characters)';
    const s = str(value, fail, expected);
    if (s.length > 253 || !/^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$/.test(s)) throw fail(expected);
    return s;
  },
  kubeconfig: (value, fail) => str(value, fail, 'a path to a kubeconfig file'),
  socket: (value, fail) => {
    const expected = `an absolute path of at most ${MAX_SOCKET_PATH_BYTES} bytes (the unix socket address limit)`;
    const s = absPath(expected)(value, fail) as string;
    if (Buffer.byteLength(s) > MAX_SOCKET_PATH_BYTES) throw fail(expected);
    return s;
  },
  cniBinDir: absPath(),
  cniConfDir: absPath(),
  pluginBinDirs: (value, fail) => {
    const expected = 'a non-empty list of absolute paths';
    if (!Array.isArray(value) || value.length === 0) throw fail(expected);
    return value.map((v) => {
      if (typeof v !== 'string' || !isAbsolute(v) || v.includes('\0')) throw fail(expected, `element ${describe(v)}`);
      return v;
    });
  },
  bridgeName: ifName,
  ifbName: ifName,
  mtu: (value, fail) => {
    if (typeof value !== 'number' || !Number.isInteger(value) || value < 68 || value > 65535) throw fail('an integer from 68 to 65535');
    return value;
  },
  hairpinMode: oneOf(HAIRPIN_MODES),
  nonMasqueradeCIDR: (value, fail) => {
    const expected = 'a CIDR such as "10.0.0.0/8"';
    const s = str(value, fail, expected);
    try {
      return parseCidr(s).cidr;
    } catch (err) {
      throw fail(expected, causeText(err));
    }
  },
  routes: oneOf(ROUTE_MODES),
  ipam: oneOf(IPAM_MODES),
  uplink: ifName,
  dhcpTimeout: (value, fail) => {
    if (typeof value !== 'number' || !Number.isInteger(value) || value < 2 || value > 600) throw fail('an integer number of seconds from 2 to 600');
    return value;
  },
  ipamDataDir: absPath(),
  cniCacheDir: absPath(),
  stateDir: absPath(),
  logLevel: oneOf(LOG_LEVELS),
};

function nonEmpty(s: string | undefined): string | undefined {
  return s === undefined || s === '' ? undefined : s;
}

function describe(v: unknown): string {
  if (v === null) return 'null';
  if (v === undefined) return 'nothing';
  if (Array.isArray(v)) return 'a list';
  if (typeof v === 'object') return 'a mapping';
  if (typeof v === 'string') return JSON.stringify(v);
  return `${String(v)} (${typeof v})`;
}
