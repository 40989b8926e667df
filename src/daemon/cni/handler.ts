/**
 * The agent side of one forwarded CNI call: the wire format (src/daemon/cni/request.ts parses and
 * checks it completely) translated into calls of the pod network core, and the answer: status 200
 * with the result, or a CNI error object with the spec's code.
 */
import { existsSync } from 'node:fs';
import { convertResult } from '../../cni/result.js';
import { CniPluginError, ConfigError, ConflictError, FsError, NotReadyError, UnknownPodError } from '../../errors.js';
import type { Logger } from '../../log.js';
import { DhcpLeaseError, NetnsError, podNetnsId, type PodNetwork, type PodRecord, type ResolvedLimits } from '../../pod/index.js';
import { CniRequestError, parseCniCall, parseIpamCall, type CniCall } from './request.js';
import {
  CNI_ERR_ATTACHMENT_CONFLICT,
  CNI_ERR_INTERNAL,
  CNI_ERR_INVALID_CONFIG,
  CNI_ERR_INVALID_ENV,
  CNI_ERR_IO,
  CNI_ERR_PLUGIN_NOT_AVAILABLE,
  CNI_ERR_TRY_AGAIN_LATER,
  CNI_ERR_UNKNOWN_CONTAINER,
  CNI_VERSION_ANSWER,
  cniErrorBody,
  type CniRequest,
} from '../protocol.js';
import type { NamespaceLookup } from '../cluster/namespace-lookup.js';
import type { PodLookup } from '../cluster/pod-lookup.js';
import type { AskNote, PodAsk } from '../cluster/pod-guarantees.js';
import { wantedShaping, type Wanted } from '../cluster/wanted.js';
import type { NodeCapacity } from '../../bandwidth/capacity.js';

export interface CniAnswer {
  status: number;
  body: string;
  /** For metrics and logs. */
  command: string;
  code?: number;
}

/** Told about what ADD did to a pod's bandwidth (Events, live re-shaping). */
export interface AttachObserver {
  /** `resolved`: how its namespace's policy shaped the limits (cluster mode); `notes`: what it asked of the node and did not get as asked. */
  attached(record: PodRecord, resolved?: ResolvedLimits, notes?: AskNote[]): void;
  /** The ADD was refused for the pod's bandwidth annotations. */
  refused(pod: { namespace: string; name: string }, err: unknown): void;
}

export class CniHandler {
  constructor(
    private readonly network: PodNetwork,
    private readonly pods: PodLookup | undefined,
    private readonly notReady: () => string | undefined,
    private readonly log: Logger,
    private readonly observer?: AttachObserver,
    /** Cluster mode: the namespaces' bandwidth policy (defaults and ceilings). */
    private readonly namespaces?: NamespaceLookup,
    /** Cluster mode: the node's capacity (undefined: unknown), out of which pods' guarantees are given (pod-guarantees.ts). */
    private readonly capacity?: () => NodeCapacity | undefined,
  ) {}

  async handle(req: CniRequest): Promise<CniAnswer> {
    const command = req.env.CNI_COMMAND ?? 'unknown';
    let cniVersion = '1.1.0';
    try {
      const call = parseCniCall(req);
      cniVersion = call.cniVersion;
      return { status: 200, body: await this.act(call), command: call.command };
    } catch (err) {
      const code = codeOf(err);
      if (code === CNI_ERR_INTERNAL) this.log.error({ err, command }, 'CNI call failed unexpectedly');
      return errorAnswer(command, cniVersion, code, err);
    }
  }

  /** The IPAM shim's ADD: the host-local result of the pod ADD running for that attachment. */
  async ipam(req: CniRequest): Promise<CniAnswer> {
    let cniVersion = '1.1.0';
    try {
      const call = parseIpamCall(req);
      cniVersion = call.cniVersion;
      const result = await this.network.prefetchedIpam(call.containerId, call.ifName);
      return { status: 200, body: JSON.stringify(convertResult(result, call.cniVersion)), command: 'IPAM' };
    } catch (err) {
      return errorAnswer('IPAM', cniVersion, codeOf(err), err);
    }
  }

  private tellAttached(record: PodRecord, resolved: ResolvedLimits | undefined, notes: AskNote[]): void {
    try {
      this.observer?.attached(record, resolved, notes);
    } catch (err) {
      this.log.error({ err, pod: `${record.namespace}/${record.name}` }, 'telling of an attached pod failed');
    }
  }

  private async act(call: CniCall): Promise<string> {
    switch (call.command) {
      case 'VERSION':
        return JSON.stringify(CNI_VERSION_ANSWER);
      case 'STATUS': {
        const why = this.notReady();
        if (why) throw new StatusError(why);
        return '';
      }
      case 'ADD': {
        // runtimeConfig carries the annotations' rates already; else (cluster mode) the pod's annotations,
        // then its namespace's policy, its guarantees and band (cluster/wanted.ts: as every re-shape does).
        const { annotations, ask } = await this.podOf(call);
        const policy = this.namespaces && call.namespace ? await this.namespaces.annotations(call.namespace) : undefined;
        let wanted: Wanted;
        try {
          wanted = wantedShaping({
            own: call.limits ?? (call.name ? undefined : {}),
            annotations,
            policy,
            namespace: call.namespace,
            ask,
            node: this.capacity ? { capacity: this.capacity() } : undefined,
          });
        } catch (err) {
          if (call.name) this.observer?.refused({ namespace: call.namespace, name: call.name }, err);
          throw err;
        }
        const { limits, resolved, notes } = wanted;
        const { result, record, repeated } = await this.network.attach({
          containerId: call.containerId,
          ifName: call.ifName,
          namespace: call.namespace,
          name: call.name,
          netns: call.netns,
          limits,
          ...(wanted.sources ? { limitSources: wanted.sources } : {}),
          portMappings: call.portMappings,
        });
        // Events and the late re-shape check after the answer has gone out, not before it.
        if (!repeated && this.observer) setImmediate(() => this.tellAttached(record, resolved, notes));
        return JSON.stringify(convertResult(result, call.cniVersion));
      }
      case 'DEL':
        // The netns is never entered on DEL; a path that still exists must still not be the node's own.
        if (call.netns !== '' && existsSync(call.netns)) podNetnsId(call.netns);
        await this.network.detach({ containerId: call.containerId, ifName: call.ifName, portMappings: call.portMappings });
        return '';
      case 'CHECK':
        await this.network.check({ containerId: call.containerId, ifName: call.ifName, netns: call.netns });
        return '';
      case 'GC':
        await this.network.gc(call.valid);
        return '';
    }
  }

  /**
   * The pod's annotations and ask (cluster mode). With runtimeConfig limits the ADD does not need
   * the API server: a failed lookup then costs the pod its guarantees until the watch brings it
   * (live-shaping.ts applies them), not its ADD.
   */
  private async podOf(
    call: Extract<CniCall, { command: 'ADD' }>,
  ): Promise<{ annotations?: Record<string, string> | undefined; ask?: PodAsk | undefined }> {
    if (!call.name || !this.pods) return {};
    if (!this.pods.pod) return call.limits ? {} : { annotations: await this.pods.annotations(call.namespace, call.name) };
    try {
      const p = await this.pods.pod(call.namespace, call.name);
      return { annotations: p?.annotations, ask: p?.ask };
    } catch (err) {
      if (!call.limits) throw err;
      this.log.warn(
        { err, pod: `${call.namespace}/${call.name}` },
        "pod lookup failed; setting it up with the runtime's limits, its guarantees once the watch has it",
      );
      return {};
    }
  }
}

class StatusError extends NotReadyError {}

/** The CNI error code for a failure: the spec's codes by error class, a plugin's own code as it gave it. */
export function codeOf(err: unknown): number {
  if (err instanceof CniRequestError) return err.code;
  if (err instanceof StatusError) return CNI_ERR_PLUGIN_NOT_AVAILABLE;
  if (err instanceof CniPluginError && err.code !== undefined) return err.code;
  if (err instanceof NetnsError) return CNI_ERR_INVALID_ENV;
  if (err instanceof ConflictError) return CNI_ERR_ATTACHMENT_CONFLICT;
  if (err instanceof UnknownPodError) return CNI_ERR_UNKNOWN_CONTAINER;
  if (err instanceof NotReadyError) return CNI_ERR_TRY_AGAIN_LATER;
  // No DHCP server answered in time: the runtime may well succeed later.
  if (err instanceof DhcpLeaseError) return CNI_ERR_TRY_AGAIN_LATER;
  if (err instanceof ConfigError) return CNI_ERR_INVALID_CONFIG;
  // The spec's "I/O failure": a full, read-only or forbidden disk; the message says which and what to do.
  if (err instanceof FsError) return CNI_ERR_IO;
  return CNI_ERR_INTERNAL;
}

function errorAnswer(command: string, cniVersion: string, code: number, err: unknown): CniAnswer {
  const msg = err instanceof Error ? err.message : String(err);
  const details = err instanceof CniPluginError ? err.details : undefined;
  return { status: 500, body: JSON.stringify(cniErrorBody(code, msg, details, cniVersion)), command, code };
}
