/**
 * The agent's Prometheus metrics: CNI call latencies and errors, pods and shaped pods, calls in
 * flight, veth deletions the kernel is still finishing; and per shaped pod and direction
 * (labels namespace, pod, direction = ingress: to the pod | egress: from the pod), the kernel's own
 * tc counters of its shaping, read over netlink at each scrape (src/shaper/counters.ts):
 * `kubenet_pod_bandwidth_limit_bits_per_second`, `kubenet_pod_shaped_bytes_total`,
 * `kubenet_pod_shaped_packets_total`, `kubenet_pod_shaped_drops_total`,
 * `kubenet_pod_shaped_overlimits_total`, `kubenet_pod_shaped_backlog_bytes`. Only shaped
 * directions have series; they are rebuilt at every scrape, so a pod's go with it. The limit series
 * also carry `source`, where the limit came from: `pod` (its annotations or runtimeConfig, and
 * every pod outside a namespace bandwidth policy), `namespace-default` or `namespace-ceiling`.
 */
import { Counter, Gauge, Histogram, Registry } from 'prom-client';
import { isUnshaped, type DirectionCounters, type PodRecord, type PodTraffic } from '../pod/index.js';

const LATENCY_BUCKETS = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1, 5];
/** Fine up to 20 ms, where a blocked loop starts to show in every CNI call. */
const LOOP_DELAY_BUCKETS = [0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.05, 0.1, 0.25, 0.5, 1];
const POD_LABELS = ['namespace', 'pod', 'direction'] as const;
const LIMIT_LABELS = [...POD_LABELS, 'source'] as const;

export class AgentMetrics {
  readonly registry = new Registry();
  readonly add = new Histogram({ name: 'kubenet_cni_add_seconds', help: 'CNI ADD latency', buckets: LATENCY_BUCKETS, registers: [this.registry] });
  readonly del = new Histogram({ name: 'kubenet_cni_del_seconds', help: 'CNI DEL latency', buckets: LATENCY_BUCKETS, registers: [this.registry] });
  readonly errors = new Counter({ name: 'kubenet_cni_errors_total', help: 'CNI calls that failed, by command and CNI error code', labelNames: ['command', 'code'], registers: [this.registry] });
  readonly inFlight = new Gauge({ name: 'kubenet_cni_calls_in_flight', help: 'CNI calls being handled', registers: [this.registry] });
  private readonly pods = new Gauge({ name: 'kubenet_pods', help: 'Pods attached to the bridge', registers: [this.registry] });
  private readonly shaped = new Gauge({ name: 'kubenet_shaped_pods', help: 'Pods with bandwidth limits', registers: [this.registry] });
  // DEL answers once a pod's veth is gone; the kernel frees the device on a worker thread after.
  private readonly vethDeletions = new Gauge({ name: 'kubenet_veth_deletions_in_flight', help: 'Pod veths deleted but not yet freed by the kernel', registers: [this.registry] });
  // Fed by loop-delay.ts: how late a timer due every 10 ms ran, runs a blocked loop missed included.
  readonly loopDelay = new Histogram({ name: 'kubenet_event_loop_delay_seconds', help: "How late the agent's event loop ran a timer due every 10 ms", buckets: LOOP_DELAY_BUCKETS, registers: [this.registry] });
  private readonly perPod = {
    limit: new Gauge({ name: 'kubenet_pod_bandwidth_limit_bits_per_second', help: "The pod's bandwidth limit as the kernel enforces it (its htb class rate), by direction: ingress = to the pod, egress = from the pod", labelNames: LIMIT_LABELS, registers: [this.registry] }),
    bytes: new Counter({ name: 'kubenet_pod_shaped_bytes_total', help: "Bytes (L2 frames) that passed the pod's shaping, from the kernel's tc counters", labelNames: POD_LABELS, registers: [this.registry] }),
    packets: new Counter({ name: 'kubenet_pod_shaped_packets_total', help: "Packets that passed the pod's shaping", labelNames: POD_LABELS, registers: [this.registry] }),
    drops: new Counter({ name: 'kubenet_pod_shaped_drops_total', help: "Packets the pod's shaping queues dropped", labelNames: POD_LABELS, registers: [this.registry] }),
    overlimits: new Counter({ name: 'kubenet_pod_shaped_overlimits_total', help: "Times the pod's class hit its limit and had to wait", labelNames: POD_LABELS, registers: [this.registry] }),
    backlog: new Gauge({ name: 'kubenet_pod_shaped_backlog_bytes', help: "Bytes queued in the pod's shaping now", labelNames: POD_LABELS, registers: [this.registry] }),
  };

  /** One finished CNI call. */
  observe(command: string, seconds: number, code: number | undefined): void {
    if (command === 'ADD') this.add.observe(seconds);
    if (command === 'DEL') this.del.observe(seconds);
    if (code !== undefined) this.errors.inc({ command, code: String(code) });
  }

  /** Refreshes the gauges from the pod records. */
  update(records: PodRecord[], vethDeletionsInFlight: number): void {
    const ready = records.filter((r) => r.phase === 'ready');
    this.pods.set(ready.length);
    this.shaped.set(ready.filter((r) => !isUnshaped(r.limits)).length);
    this.vethDeletions.set(vethDeletionsInFlight);
  }

  /** Replaces every per-pod series with the counters of the pods shaped now. */
  updateShaping(traffic: PodTraffic[]): void {
    for (const m of Object.values(this.perPod)) m.reset();
    for (const t of traffic) {
      const s = t.shaping;
      if (!s) continue;
      const pod = t.record.name || t.record.containerId.slice(0, 12);
      for (const direction of ['ingress', 'egress'] as const) {
        const c: DirectionCounters | undefined = s[direction];
        if (!c) continue;
        const labels = { namespace: t.record.namespace, pod, direction };
        this.perPod.limit.set({ ...labels, source: t.record.limitSources?.[direction] ?? 'pod' }, c.limit);
        this.perPod.bytes.inc(labels, c.bytes);
        this.perPod.packets.inc(labels, c.packets);
        this.perPod.drops.inc(labels, c.drops);
        this.perPod.overlimits.inc(labels, c.overlimits);
        this.perPod.backlog.set(labels, c.backlog);
      }
    }
  }

  async text(records: PodRecord[], vethDeletionsInFlight: number, traffic: PodTraffic[]): Promise<{ contentType: string; body: string }> {
    this.update(records, vethDeletionsInFlight);
    this.updateShaping(traffic);
    return { contentType: this.registry.contentType, body: await this.registry.metrics() };
  }
}
