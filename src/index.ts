/**
 * The package's public surface, exactly what docs/library.md documents: the
 * kubelet-style plugin, the types it takes and returns, and the error classes it throws.
 */
export { KubenetPlugin } from './plugin/kubenet.js';
export type { HairpinMode, Host, KubenetOptions, NetworkPlugin, PodNetworkStatus } from './plugin/types.js';
export {
  AggregateKubenetError,
  CniPluginError,
  ConfigError,
  ConflictError,
  KubenetError,
  NetlinkError,
  NotReadyError,
  ToolError,
  UnknownPodError,
} from './errors.js';
