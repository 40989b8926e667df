/**
 * The pod network core, as the front ends (the kubelet facade in src/plugin, the node agent in
 * src/daemon) see it: the core itself, the pod record, netns identity, and the bandwidth limits they
 * parse from their inputs. Nothing above this reaches into the shaper or netlink directly.
 */
export { HAIRPIN_MODES, IPAM_SHIM_TYPE, NETWORK_NAME, POD_IFNAME, type HairpinMode } from './bridge-conf.js';
export { DhcpLeaseError, socketAnswers } from './addresses/dhcp-leases.js';
export { NetnsError, podNetnsId } from './netns.js';
export { PodNetwork } from './network.js';
export {
  PLUGIN_TYPES,
  REQUIRED_PLUGINS,
  type AttachRequest,
  type Attachment,
  type CheckRequest,
  type DetachRequest,
  type IpamSettings,
  type PodNetworkOptions,
  type PodTraffic,
} from './requests.js';
export type { DirectionCounters, ShapingCounters } from '../shaper/counters.js';
export type { LinkStats } from '../netlink/index.js';
export type { PodPhase, PodRecord, PortMapping } from './records/record.js';
export {
  bandwidthFromAnnotations,
  describeLimits,
  EGRESS_ANNOTATION,
  formatBandwidth,
  INGRESS_ANNOTATION,
  isUnshaped,
  limitsFromRuntimeConfig,
  parseBandwidth,
  sameLimits,
  sameRates,
  sameSources,
  withRates,
  withTotals,
  type BandwidthLimits,
  type LimitSource,
  type LimitSources,
} from '../bandwidth/limits.js';
export {
  applyNamespacePolicy,
  cappedMessage,
  describeSourcedLimits,
  NAMESPACE_ANNOTATIONS,
  NAMESPACE_POLICY_ANNOTATIONS,
  policyAnnotations,
  rawPolicy,
  resolveLimits,
  sourceTag,
  type ResolvedLimits,
} from '../bandwidth/namespace-policy.js';
export { PRIORITY_BANDS } from '../bandwidth/guarantees.js';
