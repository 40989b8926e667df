/**
 * One attachment's pure parts: the checks of its identity, what differs between a recorded
 * attachment and a repeated ADD, the CNI_ARGS and runtime config the plugins get, its name in logs.
 */
import { checkContainerId } from '../cni/names.js';
import { parseResult } from '../cni/result.js';
import type { CniResult, NetConf, NetConfList, RuntimeConf } from '../cni/types.js';
import { ConfigError } from '../errors.js';
import type { Logger } from '../log.js';
import { sameLimits, sameSources, type BandwidthLimits, type LimitSources } from '../bandwidth/limits.js';
import { POD_IFNAME } from './bridge-conf.js';
import { sameNetns, type NetnsId } from './netns.js';
import type { AttachRequest } from './requests.js';
import type { PodRecord, PortMapping } from './records/record.js';

/** A port mapping that makes portmap's DEL run (it removes the container's chains whatever the list holds). */
export const PLACEHOLDER_PORT: PortMapping = { hostPort: 1, containerPort: 1, protocol: 'tcp' };

export function checkAttachment(a: { containerId: string; ifName: string }): void {
  checkContainerId(a.containerId, 'container ID');
  if (a.ifName !== POD_IFNAME)
    throw new ConfigError(`interface name ${JSON.stringify(a.ifName)}: kubenet attaches pods as ${POD_IFNAME} only`);
}

/** What differs between a ready attachment and a repeated ADD of it ([] when nothing does). */
export function differences(r: PodRecord, req: AttachRequest, netnsId: NetnsId): string[] {
  const out: string[] = [];
  if (!sameNetns(r.netnsId, netnsId)) out.push(`network namespace (recorded ${r.netns})`);
  if (r.namespace !== req.namespace || r.name !== req.name) out.push(`pod (recorded ${podName(r)})`);
  if (!sameLimits(r.addLimits ?? r.limits, req.limits)) out.push('bandwidth limits');
  if (JSON.stringify(r.portMappings) !== JSON.stringify(req.portMappings)) out.push('host ports');
  return out;
}

/**
 * A ready record re-shaped to `limits` from `sources` (absent: the pod's own), or undefined when
 * neither changes; `rates`: whether the kernel must follow. A repeated ADD still compares with what
 * the ADD asked for (addLimits).
 */
export function reshapedRecord(
  r: PodRecord,
  limits: BandwidthLimits,
  sources: LimitSources | undefined,
): { record: PodRecord; rates: boolean } | undefined {
  const rates = !sameLimits(r.limits, limits);
  if (!rates && sameSources(r.limitSources, sources)) return undefined;
  const { limitSources: _was, ...rest } = r;
  return { record: { ...rest, limits, addLimits: r.addLimits ?? r.limits, ...(sources ? { limitSources: sources } : {}) }, rates };
}

/** The bridge plugin's part of a network (a list's first plugin, with the list's name and version). */
export function bridgeOnly(network: NetConf | NetConfList): NetConf {
  if (!Array.isArray(network.plugins)) return network as NetConf;
  const first = (network as NetConfList).plugins[0];
  if (!first) throw new ConfigError('network list without plugins');
  return { ...first, cniVersion: network.cniVersion, name: network.name };
}

/** CNI_ARGS as kubelet's kubenet passed them to the plugins (never the runtime's raw CNI_ARGS). */
export function podCniArgs(p: { namespace: string; name: string; containerId: string }): Array<[string, string]> {
  const args: Array<[string, string]> = [['IgnoreUnknown', '1']];
  if (p.namespace) args.push(['K8S_POD_NAMESPACE', p.namespace]);
  if (p.name) args.push(['K8S_POD_NAME', p.name]);
  args.push(['K8S_POD_INFRA_CONTAINER_ID', p.containerId]);
  return args;
}

export function runtimeConf(r: PodRecord, netns: string): RuntimeConf {
  const rt: RuntimeConf = { containerId: r.containerId, netns, ifName: r.ifName, args: r.cniArgs };
  if (r.portMappings.length > 0) rt.capabilityArgs = { portMappings: r.portMappings };
  return rt;
}

export function safeParseResult(result: unknown, log: Logger): CniResult | undefined {
  try {
    return parseResult(result);
  } catch (err) {
    log.warn({ err }, 'recorded CNI result is invalid; deleting without it');
    return undefined;
  }
}

export function podName(p: { namespace: string; name: string; containerId?: string }): string {
  if (p.namespace || p.name) return `${p.namespace}/${p.name}`;
  return p.containerId ? shortId(p.containerId) : '';
}

export function shortId(id: string): string {
  return id.slice(0, 12);
}

export function round(ms: number): number {
  return Math.round(ms * 100) / 100;
}
