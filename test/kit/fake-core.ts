/**
 * The pod network core as the agent's bandwidth code uses it (LiveShaping, CniHandler), faked at its
 * boundary: list(), reshape() and attach() over records the test holds, each call recorded; and an
 * Event recorder that keeps what it was told. Shared by the daemon tests without root.
 */
import { UnknownPodError } from '../../src/errors.js';
import type { EventRecorder, EventType, ObjectRef } from '../../src/daemon/kube/events.js';
import type { AttachRequest, BandwidthLimits, LimitSources, PodNetwork, PodRecord } from '../../src/pod/index.js';

/** A ready pod record of `name` (container `<name>-id` unless given) in `namespace` (default 'default'). */
export function podRecord(
  name: string,
  limits: BandwidthLimits,
  o: { namespace?: string; id?: string; limitSources?: LimitSources } = {},
): PodRecord {
  return {
    version: 2,
    containerId: o.id ?? `${name}-id`,
    ifName: 'eth0',
    namespace: o.namespace ?? 'default',
    name,
    netns: `/var/run/netns/${name}`,
    phase: 'ready',
    cniArgs: [],
    portMappings: [],
    limits,
    ...(o.limitSources ? { limitSources: o.limitSources } : {}),
    ips: ['10.0.0.2'],
    addedAt: '',
  };
}

export interface Reshape {
  id: string;
  limits: BandwidthLimits;
  /** Recorded (undefined included) only with `{ sources: true }`. */
  sources?: LimitSources | undefined;
}

/**
 * The core over `records`: reshape() replaces a record's limits (and, with `sources`, its limit
 * sources) and records the call, an unknown one throws UnknownPodError; attach() makes a record.
 */
export function fakeNetwork(records: PodRecord[], o: { sources?: boolean } = {}) {
  const reshapes: Reshape[] = [];
  const attaches: AttachRequest[] = [];
  const network = {
    list: () => records,
    reshape: async (containerId: string, ifName: string, limits: BandwidthLimits, sources?: LimitSources) => {
      const i = records.findIndex((r) => r.containerId === containerId && r.ifName === ifName);
      if (i < 0) throw new UnknownPodError(`container ${containerId} gone`);
      reshapes.push({ id: containerId, limits, ...(o.sources ? { sources } : {}) });
      const { limitSources: _was, ...rest } = records[i]!;
      records[i] = o.sources ? { ...rest, limits, ...(sources ? { limitSources: sources } : {}) } : { ...records[i]!, limits };
      return records[i]!;
    },
    attach: async (req: AttachRequest) => {
      attaches.push(req);
      const r = podRecord(req.name, req.limits, {
        namespace: req.namespace,
        ...(req.limitSources ? { limitSources: req.limitSources } : {}),
      });
      records.push(r);
      return { record: r, result: { cniVersion: '1.0.0', interfaces: [], ips: [], routes: [], dns: {} }, repeated: false };
    },
  } as unknown as PodNetwork;
  return { network, reshapes, attaches, records };
}

/** An Event recorder keeping every Event; `of(reason)`: "pod: message" of those with that reason. */
export function fakeEvents() {
  const got: Array<{ pod: ObjectRef; type: EventType; reason: string; message: string }> = [];
  const rec: EventRecorder = {
    record: (pod, type, reason, message) => void got.push({ pod, type, reason, message }),
    flush: async () => undefined,
    stop: async () => undefined,
  };
  const of = (reason: string) => got.filter((e) => e.reason === reason).map((e) => `${(e.pod as { name: string }).name}: ${e.message}`);
  return { rec, got, of };
}
