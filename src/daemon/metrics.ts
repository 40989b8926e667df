/**
 * The agent's Prometheus metrics: CNI call latencies and errors, pods and shaped pods, calls in
 * flight, veth deletions the kernel is still finishing.
 */
import { Counter, Gauge, Histogram, Registry } from 'prom-client';
import { isUnshaped, type PodRecord } from '../pod/index.js';

const LATENCY_BUCKETS = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1, 5];

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

  async text(records: PodRecord[], vethDeletionsInFlight: number): Promise<{ contentType: string; body: string }> {
    this.update(records, vethDeletionsInFlight);
    return { contentType: this.registry.contentType, body: await this.registry.metrics() };
  }
}
