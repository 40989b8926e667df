/** The CNI runtime side: types, plugin lookup and exec, result versions, the result cache, the runtime. */
export * from './types.js';
export * from './errors.js';
export { findPlugin, execPlugin, cniArgsString, DEFAULT_TIMEOUT_MS, type ExecRequest, type ExecOptions } from './exec.js';
export { parseResult, convertResult, compareVersions, versionAtLeast, isSupportedVersion, cidrFamily } from './result.js';
export { ResultCache, makeCacheEntry, validateContainerId, validateNetworkName, validateInterfaceName, type AttachmentKey } from './cache.js';
export { CniRuntime, type CniRuntimeOptions } from './runtime.js';
