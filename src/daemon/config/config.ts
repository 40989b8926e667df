/**
 * Configuration of the kubenet node agent (`kubenet daemon`): a YAML file plus command-line flags;
 * a flag wins over the file, the file over the defaults.
 *
 * Parsing is strict: an unknown key, a value of the wrong type, a bad enum value or path, an
 * unreadable file or invalid YAML is an {@link AgentConfigError} (a ConfigError) naming the file
 * (or the flag), the key and what was expected. Every key is defined once, in config/keys.ts
 * (CONFIG_KEYS: type, default, flag, meaning, validation); this module loads, merges and checks the
 * rules between keys.
 */
import { readFile } from 'node:fs/promises';
import { availableParallelism, hostname } from 'node:os';
import { dirname, join, normalize } from 'node:path';
import yaml from 'js-yaml';
import { ConfigError } from '../../errors.js';
import { isValidIfName } from '../../net/ifname.js';
import { shardIfb, shardsFor } from '../../shaper/tc-layout.js';
import {
  causeText,
  CONFIG_KEYS,
  DEFAULT_CONFIG,
  describe,
  DHCP_SOCKET_NAME,
  NODE_NAME_ENV,
  type AgentConfig,
  type ConfigKey,
  type ConfigKeySpec,
} from './keys.js';
import { MAX_SOCKET_PATH_BYTES } from '../protocol.js';

export * from './keys.js';

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
  checkShards(out, opts.file ?? 'flags');
  checkIpam(out, merged, opts.file ?? 'flags');
  checkRoutes(out, opts.file ?? 'flags');
  checkMetrics(out, opts.file ?? 'flags');
  return out;
}

/** Every egress shard's ifb name must be a valid interface name: `<ifbName>.<k>` up to the last shard. */
function checkShards(c: AgentConfig, source: string): void {
  const last = shardIfb(c.ifbName, shardsFor(c.ifbShards, availableParallelism()) - 1);
  if (!isValidIfName(last)) {
    throw new AgentConfigError({
      source,
      key: 'ifbName',
      expected: 'a name short enough for every egress shard',
      problem: `the last egress shard's ifb would be ${JSON.stringify(last)}, longer than 15 bytes: shorten ifbName or set fewer ifbShards`,
    });
  }
}

/** The dhcp keys go together: `uplink` is required with dhcp and refused without, like `dhcpTimeout`. */
function checkIpam(c: AgentConfig, set: Partial<AgentConfig>, source: string): void {
  if (c.ipam === 'dhcp') {
    if (c.uplink === undefined) {
      throw new AgentConfigError({
        source,
        key: 'uplink',
        expected: 'an interface name',
        problem: 'ipam "dhcp" needs an uplink: the host interface that connects the bridge to the LAN and its DHCP server',
      });
    }
    if (c.uplink === c.bridgeName || c.uplink === c.ifbName || c.uplink.startsWith(`${c.ifbName}.`)) {
      throw new AgentConfigError({
        source,
        key: 'uplink',
        expected: 'an interface other than the bridge and the ifb',
        problem: `uplink ${c.uplink} is the agent's own ${c.uplink === c.bridgeName ? 'bridge' : 'ifb'}`,
      });
    }
    const socket = dhcpSocketPath(c);
    if (Buffer.byteLength(socket) > MAX_SOCKET_PATH_BYTES) {
      throw new AgentConfigError({
        source,
        key: 'socket',
        expected: `a directory short enough for ${DHCP_SOCKET_NAME}`,
        problem: `the DHCP lease daemon's socket ${socket} would be longer than ${MAX_SOCKET_PATH_BYTES} bytes`,
      });
    }
    return;
  }
  for (const key of ['uplink', 'dhcpTimeout'] as const) {
    if (set[key] !== undefined) {
      throw new AgentConfigError({
        source,
        key,
        expected: 'ipam "dhcp"',
        problem: `${key} applies only to ipam "dhcp" (ipam is "${c.ipam}")`,
      });
    }
  }
}

/**
 * The destinations not shaped (config `unshapedCIDRs`) when the config fixes them: as set, else
 * none without `routes: direct`. Undefined with `routes: direct` and nothing set: the cluster's own
 * pod CIDRs and Service ranges, followed live (cluster-ranges.ts).
 */
export function unshapedCidrsOf(c: AgentConfig): string[] | undefined {
  if (c.unshapedCIDRs !== undefined) return [...c.unshapedCIDRs];
  return c.routes === 'direct' || c.routes === 'auto' ? undefined : [];
}

/** `routes: direct` (and `auto`) routes the Nodes' pod CIDRs: it needs the Nodes (cluster mode) and pods in those CIDRs (host-local). */
function checkRoutes(c: AgentConfig, source: string): void {
  if (c.routes !== 'direct' && c.routes !== 'auto') return;
  if (c.podCIDR !== undefined) {
    throw new AgentConfigError({
      source,
      key: 'routes',
      expected: '"none" with a static podCIDR',
      problem: `routes "${c.routes}" watches the Nodes of a cluster; with a static podCIDR there is no Kubernetes API to watch (unset podCIDR, or set routes: none)`,
    });
  }
  if (c.ipam !== 'host-local') {
    throw new AgentConfigError({
      source,
      key: 'routes',
      expected: '"none" with ipam "dhcp"',
      problem: `routes "${c.routes}" routes the Nodes' pod CIDRs; with ipam "${c.ipam}" pods take their addresses from the LAN, which needs no routes`,
    });
  }
}

/** The metrics port's TLS files go together; its `kubernetes` auth asks the API server, which a static pod CIDR has none of. */
function checkMetrics(c: AgentConfig, source: string): void {
  if ((c.metricsTLSCertFile === undefined) !== (c.metricsTLSKeyFile === undefined)) {
    const key = c.metricsTLSCertFile === undefined ? 'metricsTLSCertFile' : 'metricsTLSKeyFile';
    throw new AgentConfigError({
      source,
      key,
      expected: 'metricsTLSCertFile and metricsTLSKeyFile together',
      problem: `${key} is missing: the metrics port's certificate and its key are set together (or neither)`,
    });
  }
  if (c.metricsAuth === 'kubernetes' && c.podCIDR !== undefined) {
    throw new AgentConfigError({
      source,
      key: 'metricsAuth',
      expected: '"none" with a static podCIDR',
      problem:
        'metricsAuth "kubernetes" asks the API server who a caller is; with a static podCIDR the agent has no Kubernetes API (unset podCIDR, or set metricsAuth: none)',
    });
  }
  if (c.metricsAddress === 'off' && (c.metricsAuth !== 'none' || c.metricsTLSCertFile !== undefined)) {
    throw new AgentConfigError({
      source,
      key: 'metricsAddress',
      expected: 'an address, with metricsAuth or metricsTLSCertFile set',
      problem: 'metricsAddress is "off": metricsAuth and the TLS files would secure a port that is not served',
    });
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
    ["the runtimes' CNI result cache", join(c.cniCacheDir, 'results')],
  ];
  for (const [what, dir] of runtimeDirs) {
    if (within(c.stateDir, dir)) {
      throw new AgentConfigError({
        source,
        key: 'stateDir',
        expected: `a directory outside ${what}`,
        problem: `stateDir ${c.stateDir} lies in ${what} (${dir}), which container runtimes use`,
      });
    }
  }
  if (within(c.cniConfDir, c.cniBinDir) || within(c.cniBinDir, c.cniConfDir)) {
    throw new AgentConfigError({
      source,
      key: 'cniConfDir',
      expected: 'a directory apart from cniBinDir',
      problem: `cniConfDir ${c.cniConfDir} and cniBinDir ${c.cniBinDir} overlap`,
    });
  }
}

/** Reads, parses and validates one YAML config file (only the keys it sets). */
export async function readConfigFile(file: string): Promise<Partial<AgentConfig>> {
  let text: string;
  try {
    text = await readFile(file, 'utf8');
  } catch (err) {
    throw new AgentConfigError(
      { source: file, expected: 'a readable file', problem: `cannot read config file: ${causeText(err)}` },
      { cause: err },
    );
  }
  let doc: unknown;
  try {
    doc = yaml.load(text, { filename: file, schema: yaml.CORE_SCHEMA });
  } catch (err) {
    const reason =
      err instanceof yaml.YAMLException ? `${err.reason} at line ${err.mark.line + 1}, column ${err.mark.column + 1}` : causeText(err);
    throw new AgentConfigError({ source: file, expected: 'valid YAML', problem: `invalid YAML: ${reason}` }, { cause: err });
  }
  if (doc === undefined || doc === null) return {}; // an empty file: all defaults
  if (typeof doc !== 'object' || Array.isArray(doc)) {
    throw new AgentConfigError({
      source: file,
      expected: 'a mapping of config keys',
      problem: `expected a mapping of config keys at the top level, got ${describe(doc)}`,
    });
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
    out[k] = CONFIG_KEYS[k].validate(value, (expected, detail) => {
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

function nonEmpty(s: string | undefined): string | undefined {
  return s === undefined || s === '' ? undefined : s;
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
