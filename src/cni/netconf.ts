/**
 * What the CNI runtime is given, checked before any plugin runs: a network config or config list
 * becomes a validated `Network` (name, version, plugins, the exact bytes to cache), and a runtime
 * config is checked for its container ID, interface name and netns. Configs deeply frozen by the
 * caller (`deepFreeze`) cannot change, so each is checked and serialized only once.
 */
import { ConfigError } from '../errors.js';
import { UnsupportedVersionError } from './errors.js';
import { validateContainerId, validateInterfaceName, validateNetworkName } from './names.js';
import { isSupportedVersion } from './result.js';
import { CNI_VERSIONS, type NetConf, type NetConfList, type PluginConf, type RuntimeConf } from './types.js';

/** A network to run: its name and version, its plugins in order, and the config bytes to cache. */
export interface Network {
  name: string;
  cniVersion: string;
  plugins: PluginConf[];
  /** The exact serialized config (single or list), cached for DEL after a restart. */
  bytes: string;
  /** A single config (not a list): its bytes are sent as they are when nothing needs injecting. */
  single: boolean;
  disableCheck: boolean;
}

function isObj(v: unknown): v is Record<string, unknown> {
  return typeof v === 'object' && v !== null && !Array.isArray(v);
}

function checkVersion(v: unknown, what: string): string {
  if (!isSupportedVersion(v)) {
    throw new UnsupportedVersionError(
      String(v),
      `${what}: unsupported cniVersion ${JSON.stringify(v)} (supported: ${CNI_VERSIONS.join(', ')})`,
    );
  }
  return v;
}

function checkPlugin(p: unknown, what: string): PluginConf {
  if (!isObj(p) || typeof p.type !== 'string' || p.type === '') throw new ConfigError(`${what}: a plugin config needs a non-empty "type"`);
  if (p.capabilities !== undefined && !isObj(p.capabilities)) throw new ConfigError(`${what}: "capabilities" must be an object`);
  return p as PluginConf;
}

export function singleNetwork(conf: NetConf): Network {
  if (!isObj(conf)) throw new ConfigError('network config must be an object');
  const what = `network ${JSON.stringify(conf.name)}`;
  if (typeof conf.name !== 'string') throw new ConfigError('network config needs a "name"');
  validateNetworkName(conf.name);
  const cniVersion = checkVersion(conf.cniVersion, what);
  checkPlugin(conf, what);
  return { name: conf.name, cniVersion, plugins: [conf], bytes: JSON.stringify(conf), single: true, disableCheck: false };
}

export function listNetwork(list: NetConfList, bytes?: string): Network {
  if (!isObj(list)) throw new ConfigError('network config list must be an object');
  if (typeof list.name !== 'string') throw new ConfigError('network config list needs a "name"');
  validateNetworkName(list.name);
  const what = `network list ${JSON.stringify(list.name)}`;
  const cniVersion = checkVersion(list.cniVersion, what);
  if (!Array.isArray(list.plugins) || list.plugins.length === 0) throw new ConfigError(`${what}: "plugins" must be a non-empty list`);
  for (const [i, p] of list.plugins.entries()) checkPlugin(p, `${what} plugin ${i}`);
  if (list.disableCheck !== undefined && typeof list.disableCheck !== 'boolean')
    throw new ConfigError(`${what}: "disableCheck" must be a boolean`);
  return {
    name: list.name,
    cniVersion,
    plugins: list.plugins,
    bytes: bytes ?? JSON.stringify(list),
    single: false,
    disableCheck: list.disableCheck === true,
  };
}

/** A config as cached at ADD, from its exact bytes (single or list; a list keeps these bytes). Throws on anything unusable. */
export function cachedNetwork(bytes: string): Network {
  const conf: unknown = JSON.parse(bytes);
  return isObj(conf) && 'plugins' in conf ? listNetwork(conf as unknown as NetConfList, bytes) : singleNetwork(conf as NetConf);
}

/** Validated networks of deeply frozen configs (which cannot change), so a config used for every call is checked and serialized once. */
const frozenNetworks = new WeakMap<object, Network>();

/** A single config or a list, validated. */
export function networkOf(conf: NetConf | NetConfList): Network {
  const cached = isObj(conf) ? frozenNetworks.get(conf) : undefined;
  if (cached) return cached;
  const net =
    isObj(conf) && Array.isArray((conf as { plugins?: unknown }).plugins)
      ? listNetwork(conf as unknown as NetConfList)
      : singleNetwork(conf as NetConf);
  if (isDeepFrozen(conf)) frozenNetworks.set(conf, net);
  return net;
}

function isDeepFrozen(v: unknown): boolean {
  if (typeof v !== 'object' || v === null) return true;
  if (!Object.isFrozen(v)) return false;
  return Object.values(v).every(isDeepFrozen);
}

/** Freezes `v` and everything it holds (a config the caller will use for many calls: see networkOf). */
export function deepFreeze<T>(v: T): T {
  if (typeof v === 'object' && v !== null && !Object.isFrozen(v)) {
    for (const x of Object.values(v)) deepFreeze(x);
    Object.freeze(v);
  }
  return v;
}

export function checkRuntimeConf(rt: RuntimeConf): void {
  if (!isObj(rt)) throw new ConfigError('runtime config must be an object');
  validateContainerId(rt.containerId);
  validateInterfaceName(rt.ifName);
  if (typeof rt.netns !== 'string') throw new ConfigError('runtime config: netns must be a string (empty when there is none)');
}
