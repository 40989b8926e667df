/**
 * Error classes of the CNI runtime side. Failures of a plugin binary itself are the project's
 * `CniPluginError` (src/errors.ts); these cover what happens around it.
 */
import { CniPluginError, ConfigError, KubenetError } from '../errors.js';

/** No directory of the search path holds an executable file named like the plugin type. */
export class PluginNotFoundError extends ConfigError {
  readonly plugin: string;
  readonly dirs: readonly string[];
  constructor(plugin: string, dirs: readonly string[]) {
    super(
      dirs.length === 0
        ? `CNI plugin ${JSON.stringify(plugin)} is missing: no plugin directories configured`
        : // Not "not found": containerd takes a DEL error with those words for success and stops retrying.
          `CNI plugin ${JSON.stringify(plugin)} is missing from ${dirs.join(', ')}`,
    );
    this.plugin = plugin;
    this.dirs = dirs;
  }
}

/** A config, or a conversion request, names a spec version this runtime does not implement (or one too old for the operation). */
export class UnsupportedVersionError extends ConfigError {
  readonly version: string;
  constructor(version: string, message: string) {
    super(message);
    this.version = version;
  }
}

/** A plugin result (or cached result) is not valid JSON or not a valid result of its spec version. */
export class InvalidResultError extends KubenetError {}

/** A result cache entry exists but is not one (not JSON, not a cniCacheV1 entry); a file that cannot be read or written is an FsError. */
export class CacheError extends KubenetError {
  readonly path: string;
  constructor(path: string, message: string, options?: { cause?: unknown }) {
    super(`CNI cache ${path}: ${message}`, options);
    this.path = path;
  }
}

/** CHECK needs the result of the earlier ADD, and the cache has none for this attachment. */
export class NoCachedResultError extends KubenetError {}

/** A plugin ran past its timeout and was killed with everything it started (its process group). */
export class PluginTimeoutError extends CniPluginError {
  readonly timeoutMs: number;
  constructor(init: { plugin: string; command: string; timeoutMs: number; stderr?: string }) {
    super({ plugin: init.plugin, command: init.command, msg: `timed out after ${init.timeoutMs} ms; killed`, stderr: init.stderr ?? '' });
    this.timeoutMs = init.timeoutMs;
  }
}
