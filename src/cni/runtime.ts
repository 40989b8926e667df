/**
 * The CNI runtime (libcni's CNIConfig): runs network configs and config lists against the
 * plugin binaries with libcni's semantics, and keeps the result cache. Every config and runtime
 * config is checked completely (./netconf.ts) before any plugin runs.
 *
 * - Each plugin of a list gets the list's `name` and `cniVersion` injected, `runtimeConfig`
 *   holding only the capability args it declares in `capabilities`, and on ADD the previous
 *   plugin's result as `prevResult`, converted to the list's version.
 * - CHECK (0.4.0+) passes the cached result as `prevResult` to every plugin.
 * - DEL runs the plugins in reverse order with the cached result as `prevResult` (0.4.0+), stops
 *   at the first failure and removes the cache entry only after every plugin succeeded.
 * - ADD writes the cache entry after the last plugin; DEL of something never added succeeds as
 *   far as the plugins allow (the reference plugins treat it as success).
 *
 * Operations on one attachment (network, container, interface) must not run concurrently; the
 * caller serializes them (KubenetPlugin does, per pod). Different attachments run in parallel.
 */
import { performance } from 'node:perf_hooks';
import { CniPluginError, ConfigError } from '../errors.js';
import { silentLogger, type Logger } from '../log.js';
import { moduleLogger } from '../util/module-logger.js';
import { makeCacheEntry, ResultCache, type AttachmentKey } from './cache.js';
import { InvalidResultError, NoCachedResultError, UnsupportedVersionError } from './errors.js';
import { DEFAULT_TIMEOUT_MS, execPlugin, findPlugin } from './exec.js';
import { cachedNetwork, checkRuntimeConf, listNetwork, networkOf, singleNetwork, type Network } from './netconf.js';
import { convertResult, parseResult, versionAtLeast } from './result.js';
import {
  CNI_VERSIONS,
  type CacheEntry,
  type CniCommand,
  type CniResult,
  type NetConf,
  type NetConfList,
  type PluginConf,
  type PluginVersionInfo,
  type RuntimeConf,
} from './types.js';

export { deepFreeze } from './netconf.js';

export interface CniRuntimeOptions {
  /** Directories searched for plugin binaries, in order; also passed to plugins as CNI_PATH. */
  binDirs: string[];
  /**
   * Result cache directory (entries under `<cacheDir>/results/`), e.g. /var/lib/cni. Without it the
   * cache-based calls (addNetwork … delFromCache) are refused and only the uncached ones
   * (`add`/`check`/`del`, whose caller keeps the result) are available.
   */
  cacheDir?: string;
  /**
   * Plugin types this runtime may exec; any other type is refused with a ConfigError before
   * anything runs. Unset: any type found in binDirs.
   */
  allowedTypes?: readonly string[];
  /** Kill a plugin that runs longer than this. Default 60 s. */
  timeoutMs?: number;
  logger?: Logger;
}

const LATEST_VERSION = CNI_VERSIONS[CNI_VERSIONS.length - 1] as string;

function isObj(v: unknown): v is Record<string, unknown> {
  return typeof v === 'object' && v !== null && !Array.isArray(v);
}

/** libcni's injectRuntimeConfig: only the capabilities the plugin declares, only those the runtime has values for. */
function runtimeConfigFor(plugin: PluginConf, rt: RuntimeConf): Record<string, unknown> | undefined {
  const caps = plugin.capabilities;
  const args = rt.capabilityArgs;
  if (!caps || !args) return undefined;
  let rc: Record<string, unknown> | undefined;
  for (const [cap, enabled] of Object.entries(caps)) {
    if (enabled !== true || !Object.hasOwn(args, cap)) continue;
    (rc ??= {})[cap] = args[cap];
  }
  return rc;
}

export class CniRuntime {
  readonly binDirs: readonly string[];
  readonly cacheDir: string | undefined;
  readonly timeoutMs: number;
  private readonly resultCache: ResultCache | undefined;
  private readonly allowedTypes: ReadonlySet<string> | undefined;
  private readonly log: Logger;

  constructor(opts: CniRuntimeOptions) {
    if (!Array.isArray(opts.binDirs) || opts.binDirs.length === 0)
      throw new ConfigError('CniRuntime: binDirs must name at least one directory');
    if (opts.cacheDir !== undefined && opts.cacheDir === '') throw new ConfigError('CniRuntime: cacheDir must not be empty');
    if (opts.timeoutMs !== undefined && !(Number.isFinite(opts.timeoutMs) && opts.timeoutMs > 0)) {
      throw new ConfigError(`CniRuntime: timeoutMs must be a positive number, got ${opts.timeoutMs}`);
    }
    this.binDirs = [...opts.binDirs];
    this.cacheDir = opts.cacheDir;
    this.timeoutMs = opts.timeoutMs ?? DEFAULT_TIMEOUT_MS;
    this.resultCache = opts.cacheDir === undefined ? undefined : new ResultCache(opts.cacheDir);
    this.allowedTypes = opts.allowedTypes ? new Set(opts.allowedTypes) : undefined;
    this.log = moduleLogger(opts.logger ?? silentLogger(), 'cni');
  }

  /** ADD of one network config; caches and returns its result. */
  async addNetwork(conf: NetConf, rt: RuntimeConf): Promise<CniResult> {
    return this.addCached(singleNetwork(conf), rt);
  }

  /** CHECK of one network config against its cached result (spec 0.4.0+). */
  async checkNetwork(conf: NetConf, rt: RuntimeConf): Promise<void> {
    return this.checkCached(singleNetwork(conf), rt);
  }

  /** DEL of one network config; passes the cached result (0.4.0+) and removes it after success. */
  async delNetwork(conf: NetConf, rt: RuntimeConf): Promise<void> {
    return this.delCached(singleNetwork(conf), rt);
  }

  /** ADD of every plugin in order, chaining results; caches and returns the last plugin's result. */
  async addNetworkList(list: NetConfList, rt: RuntimeConf): Promise<CniResult> {
    return this.addCached(listNetwork(list), rt);
  }

  /** CHECK of every plugin in order against the cached result (0.4.0+; a no-op with disableCheck). */
  async checkNetworkList(list: NetConfList, rt: RuntimeConf): Promise<void> {
    return this.checkCached(listNetwork(list), rt);
  }

  /** DEL of every plugin in reverse order; removes the cache entry after all succeeded. */
  async delNetworkList(list: NetConfList, rt: RuntimeConf): Promise<void> {
    return this.delCached(listNetwork(list), rt);
  }

  /**
   * DEL with the config, CNI_ARGS and capability args recorded at ADD (as after an agent restart
   * or a config change), in the caller's netns ('' when gone). Returns false, having done
   * nothing, when there is no usable cache entry (a corrupt one is removed): the caller may fall
   * back to `delNetwork` with its current config. True after a successful DEL.
   */
  async delFromCache(networkName: string, rt: RuntimeConf): Promise<boolean> {
    checkRuntimeConf(rt);
    const key = { networkName, containerId: rt.containerId, ifName: rt.ifName };
    const entry = await this.readEntryForDel(key);
    if (!entry) return false;
    let net: Network;
    try {
      net = cachedNetwork(Buffer.from(entry.config, 'base64').toString('utf8'));
    } catch (err) {
      this.log.warn({ err, networkName, containerId: rt.containerId }, 'cached CNI config is unusable; removing the entry');
      await this.cache().delete(key);
      return false;
    }
    if (net.name !== networkName) {
      this.log.warn({ networkName, cachedName: net.name }, 'cached CNI config has another network name; deleting under the cached entry');
    }
    const cachedRt: RuntimeConf = { ...rt };
    if (entry.cniArgs) cachedRt.args = entry.cniArgs;
    if (entry.capabilityArgs) cachedRt.capabilityArgs = entry.capabilityArgs;
    else delete cachedRt.capabilityArgs;
    await this.runDel(net, cachedRt, this.resultOfEntry(entry, net.cniVersion, key));
    await this.cache().delete(key);
    return true;
  }

  /**
   * The cached result of an attachment, or undefined when nothing is cached.
   * @throws CacheError, InvalidResultError for a corrupt entry
   */
  async getCachedResult(networkName: string, rt: Pick<RuntimeConf, 'containerId' | 'ifName'>): Promise<CniResult | undefined> {
    const entry = await this.cache().read({ networkName, containerId: rt.containerId, ifName: rt.ifName });
    if (!entry?.result) return undefined;
    return parseResult(entry.result);
  }

  /**
   * ADD of a config or a list, without the result cache: the caller records the result (and the
   * config) itself and passes them back to `check` and `del`.
   */
  async add(conf: NetConf | NetConfList, rt: RuntimeConf): Promise<CniResult> {
    const net = networkOf(conf);
    checkRuntimeConf(rt);
    return this.runAdd(net, rt);
  }

  /** CHECK of a config or a list against the result of its ADD (spec 0.4.0+), without the cache. */
  async check(conf: NetConf | NetConfList, rt: RuntimeConf, prevResult: CniResult): Promise<void> {
    const net = networkOf(conf);
    checkRuntimeConf(rt);
    this.requireCheck(net);
    if (net.disableCheck) return;
    await this.runCheck(net, rt, prevResult);
  }

  /** DEL of a config or a list (plugins in reverse), with the result of its ADD when known, without the cache. */
  async del(conf: NetConf | NetConfList, rt: RuntimeConf, prevResult?: CniResult): Promise<void> {
    const net = networkOf(conf);
    checkRuntimeConf(rt);
    await this.runDel(net, rt, prevResult);
  }

  /** The spec versions a plugin supports (CNI_COMMAND=VERSION). */
  async version(type: string): Promise<PluginVersionInfo> {
    const out = await this.exec(type, 'VERSION', JSON.stringify({ cniVersion: LATEST_VERSION }), undefined);
    const bad = (msg: string) => new CniPluginError({ plugin: type, command: 'VERSION', msg });
    if (!isObj(out) || typeof out.cniVersion !== 'string' || out.cniVersion === '') throw bad('version info without cniVersion');
    const sv = out.supportedVersions;
    if (sv === undefined || (Array.isArray(sv) && sv.length === 0)) {
      // Plugins of spec 0.2.0 predate supportedVersions (libcni's decoder does the same).
      if (out.cniVersion === '0.2.0') return { cniVersion: '0.2.0', supportedVersions: ['0.1.0', '0.2.0'] };
      throw bad('version info without supportedVersions');
    }
    if (!Array.isArray(sv) || !sv.every((v) => typeof v === 'string')) throw bad('supportedVersions must be a list of strings');
    return { cniVersion: out.cniVersion, supportedVersions: sv as string[] };
  }

  // ---- internals ----

  private cache(): ResultCache {
    if (!this.resultCache) throw new ConfigError('CniRuntime: this runtime keeps no result cache (no cacheDir); use add/check/del');
    return this.resultCache;
  }

  private async addCached(net: Network, rt: RuntimeConf): Promise<CniResult> {
    checkRuntimeConf(rt);
    const cache = this.cache();
    const result = await this.runAdd(net, rt);
    const key = { networkName: net.name, containerId: rt.containerId, ifName: rt.ifName };
    await cache.write(makeCacheEntry(key, net.bytes, rt, convertResult(result, net.cniVersion)));
    return result;
  }

  private async runAdd(net: Network, rt: RuntimeConf): Promise<CniResult> {
    let result: CniResult | undefined;
    for (const plugin of net.plugins) {
      const stdin = this.pluginConfig(net, plugin, result, rt);
      const out = await this.exec(plugin.type, 'ADD', stdin, rt);
      if (out === undefined || out === null) throw new CniPluginError({ plugin: plugin.type, command: 'ADD', msg: 'returned no result' });
      try {
        result = parseResult(out, net.cniVersion);
      } catch (err) {
        if (!(err instanceof InvalidResultError)) throw err;
        throw new CniPluginError({ plugin: plugin.type, command: 'ADD', msg: err.message }, { cause: err });
      }
    }
    if (!result) throw new ConfigError(`network ${net.name}: no plugins`);
    return result;
  }

  private requireCheck(net: Network): void {
    if (!versionAtLeast(net.cniVersion, '0.4.0')) {
      throw new UnsupportedVersionError(
        net.cniVersion,
        `network ${net.name}: cniVersion ${net.cniVersion} does not support CHECK (0.4.0+)`,
      );
    }
  }

  private async checkCached(net: Network, rt: RuntimeConf): Promise<void> {
    checkRuntimeConf(rt);
    this.requireCheck(net);
    if (net.disableCheck) return;
    const cached = await this.getCachedResult(net.name, rt);
    if (!cached)
      throw new NoCachedResultError(
        `network ${net.name}: no cached result for container ${rt.containerId} ${rt.ifName}; CHECK needs the result of ADD`,
      );
    await this.runCheck(net, rt, cached);
  }

  private async runCheck(net: Network, rt: RuntimeConf, prev: CniResult): Promise<void> {
    for (const plugin of net.plugins) {
      await this.exec(plugin.type, 'CHECK', this.pluginConfig(net, plugin, prev, rt), rt);
    }
  }

  private async delCached(net: Network, rt: RuntimeConf): Promise<void> {
    checkRuntimeConf(rt);
    this.cache();
    const key = { networkName: net.name, containerId: rt.containerId, ifName: rt.ifName };
    let prev: CniResult | undefined;
    // The cached result is passed on DEL from spec 0.4.0 on.
    if (versionAtLeast(net.cniVersion, '0.4.0')) {
      const entry = await this.readEntryForDel(key);
      if (entry) prev = this.resultOfEntry(entry, net.cniVersion, key);
    }
    await this.runDel(net, rt, prev);
    await this.cache().delete(key);
  }

  /** DEL of the plugins in reverse order; the first failure stops it (a retry runs them all again). */
  private async runDel(net: Network, rt: RuntimeConf, prev: CniResult | undefined): Promise<void> {
    const prevForDel = versionAtLeast(net.cniVersion, '0.4.0') ? prev : undefined;
    for (let i = net.plugins.length - 1; i >= 0; i--) {
      const plugin = net.plugins[i] as PluginConf;
      await this.exec(plugin.type, 'DEL', this.pluginConfig(net, plugin, prevForDel, rt), rt);
    }
  }

  /** The cache entry, or undefined when missing or corrupt (a corrupt one is removed: it can never be used). */
  private async readEntryForDel(key: AttachmentKey): Promise<CacheEntry | undefined> {
    try {
      return await this.cache().read(key);
    } catch (err) {
      this.log.warn({ err, ...key }, 'corrupt CNI cache entry; removing it and deleting without it');
      await this.cache().delete(key);
      return undefined;
    }
  }

  private resultOfEntry(entry: CacheEntry, cniVersion: string, key: AttachmentKey): CniResult | undefined {
    if (!entry.result) return undefined;
    try {
      return parseResult(entry.result, cniVersion);
    } catch (err) {
      this.log.warn({ err, ...key }, 'cached CNI result is invalid; deleting without prevResult');
      return undefined;
    }
  }

  /** The stdin of one plugin: its config with name, cniVersion, prevResult and runtimeConfig injected. */
  private pluginConfig(net: Network, plugin: PluginConf, prev: CniResult | undefined, rt: RuntimeConf): string {
    const rc = runtimeConfigFor(plugin, rt);
    // A single config already carries its name and version: send its bytes as they are.
    if (net.single && !prev && !rc) return net.bytes;
    const conf: Record<string, unknown> = { ...plugin, cniVersion: net.cniVersion, name: net.name };
    if (prev) conf.prevResult = convertResult(prev, net.cniVersion);
    if (rc) conf.runtimeConfig = rc;
    return JSON.stringify(conf);
  }

  private async exec(type: string, command: CniCommand, stdin: string, rt: RuntimeConf | undefined): Promise<unknown> {
    if (this.allowedTypes && !this.allowedTypes.has(type)) {
      throw new ConfigError(`CNI plugin type ${JSON.stringify(type)} is not one this runtime runs (${[...this.allowedTypes].join(', ')})`);
    }
    const path = findPlugin(type, this.binDirs);
    const started = performance.now();
    const req = rt
      ? {
          command,
          containerId: rt.containerId,
          netns: rt.netns,
          ifName: rt.ifName,
          path: this.binDirs,
          ...(rt.args ? { args: rt.args } : {}),
        }
      : { command, path: this.binDirs };
    try {
      const out = await execPlugin(path, stdin, req, { timeoutMs: this.timeoutMs, plugin: type });
      this.log.debug(
        {
          plugin: type,
          command,
          containerId: rt?.containerId,
          ifName: rt?.ifName,
          ms: Math.round((performance.now() - started) * 100) / 100,
        },
        'CNI plugin ran',
      );
      return out;
    } catch (err) {
      this.log.debug({ err, plugin: type, command, containerId: rt?.containerId, ifName: rt?.ifName }, 'CNI plugin failed');
      throw err;
    }
  }
}
