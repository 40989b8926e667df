/** The live re-shapes' series of /metrics (live-shaping.ts): refusals of the kernel, the pods waiting for a retry, and for the worker. */
import { Counter, Gauge, type Registry } from 'prom-client';

export function reshapeSeries(registry: Registry, reshapes?: () => { failures: number; retrying: number; queued: number }): void {
  new Counter({
    name: 'kubenet_pod_reshape_failures_total',
    help: "Changes of a running pod's limits the kernel refused (each is a Warning BandwidthRejected on the pod; a watch's is retried with backoff)",
    registers: [registry],
    collect() {
      this.reset();
      const n = reshapes?.().failures ?? 0;
      if (n > 0) this.inc(n);
    },
  });
  new Gauge({
    name: 'kubenet_pod_reshapes_retrying',
    help: 'Pods whose refused change of limits waits for its next try',
    registers: [registry],
    collect() {
      this.set(reshapes?.().retrying ?? 0);
    },
  });
  new Gauge({
    name: 'kubenet_pod_reshapes_queued',
    help: 'Pods whose limits wait to be resolved again (a watch event or a retry queued them; one worker resolves them in order)',
    registers: [registry],
    collect() {
      this.set(reshapes?.().queued ?? 0);
    },
  });
}
