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
 *
 * Bandwidth as a resource of the node (issue 33): `kubenet_node_bandwidth_capacity_bits_per_second`
 * and `kubenet_node_bandwidth_committed_bits_per_second` (the sum of the ready pods' guarantees) by
 * direction (a direction without a capacity has no capacity series); per pod with a guarantee
 * `kubenet_pod_bandwidth_guarantee_bits_per_second{namespace,pod,direction}`, and per pod with a
 * band `kubenet_pod_bandwidth_priority{namespace,pod}` (0 served first .. 2), from the pod records.
 *
 * What the node is, for readers that have only /metrics (`kubectl kubenet status`, over the API
 * server's pod proxy): `kubenet_info{node,version,pod_cidr,bridge,ipam,routes} 1` (pod_cidr: ""
 * while none is known; "v4,v6" on a dual-stack node), `kubenet_pod_info{namespace,pod,ips} 1` per
 * ready pod, shaped or not (ips: its addresses, comma-separated), and
 * `kubenet_pod_counters_read_timestamp_seconds`, when the pods' tc counters this scrape serves were
 * read (a scrape may serve an earlier scrape's read: metricsMaxAge), so that a rate between two
 * scrapes divides by the time between the reads, not between the scrapes. Only the *_info families
 * carry labels beyond namespace, pod, direction and source.
 *
 * With a capacity, the node's trees: `kubenet_node_bandwidth_share_bits_per_second{direction,shard}`
 * (each shard's share of the direction's capacity, moved by demand: src/shaper/shares.ts) and
 * `kubenet_node_best_effort_in_trees{direction}` (1 while pods that asked for nothing are in the
 * trees: src/shaper/steering.ts).
 *
 * Live re-shapes (live-shaping.ts): `kubenet_pod_reshape_failures_total` (the kernel refused a change of a
 * running pod's limits) and `kubenet_pod_reshapes_retrying` (pods waiting for the retry).
 *
 * Routes between nodes, per way (no `way` label, to keep the label set above):
 * `kubenet_routes_direct` and `kubenet_routes_tunnel`, the routes the route controller holds now (0
 * without one).
 *
 * The per-pod families (six lines per shaped direction, 6 000 at 500 pods) are written as text here
 * rather than through prom-client, whose per-series label objects and hashing cost more than the
 * kernel reads: each direction's lines are kept and written again as they are while its figures
 * and labels stay the same. prom-client serves the rest.
 */
import { Counter, Gauge, Histogram, Registry } from 'prom-client';
import type { NodeCapacity } from '../../bandwidth/capacity.js';
import { isUnshaped, type DirectionCounters, type PodRecord, type PodTraffic } from '../../pod/index.js';
import { committed } from '../cluster/pod-guarantees.js';
import { reshapeSeries } from './reshape-metrics.js';

const LATENCY_BUCKETS = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1, 5];
/** Fine up to 20 ms, where a blocked loop starts to show in every CNI call. */
const LOOP_DELAY_BUCKETS = [0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.05, 0.1, 0.25, 0.5, 1];

/** The per-pod families, in the order written: name, type, help; `limit` carries `source` too. */
const POD_FAMILIES = [
  [
    'limit',
    'kubenet_pod_bandwidth_limit_bits_per_second',
    'gauge',
    "The pod's bandwidth limit as the kernel enforces it (its htb class rate), by direction: ingress = to the pod, egress = from the pod",
  ],
  ['bytes', 'kubenet_pod_shaped_bytes_total', 'counter', "Bytes (L2 frames) that passed the pod's shaping, from the kernel's tc counters"],
  ['packets', 'kubenet_pod_shaped_packets_total', 'counter', "Packets that passed the pod's shaping"],
  ['drops', 'kubenet_pod_shaped_drops_total', 'counter', "Packets the pod's shaping queues dropped"],
  ['overlimits', 'kubenet_pod_shaped_overlimits_total', 'counter', "Times the pod's class hit its limit and had to wait"],
  ['backlog', 'kubenet_pod_shaped_backlog_bytes', 'gauge', "Bytes queued in the pod's shaping now"],
] as const satisfies ReadonlyArray<readonly [keyof DirectionCounters, string, string, string]>;

/** Prometheus text format: a label value with backslash, double quote and newline escaped. */
export function escapeLabel(v: string): string {
  return v.replace(/[\\"\n]/g, (c) => (c === '\n' ? '\\n' : `\\${c}`));
}

/** A direction's lines as last written: the label values and figures they were made from. */
interface Rendered {
  namespace: string;
  pod: string;
  source: string;
  counters: DirectionCounters;
  lines: string[];
}

const sameCounters = (a: DirectionCounters, b: DirectionCounters) =>
  a.limit === b.limit &&
  a.bytes === b.bytes &&
  a.packets === b.packets &&
  a.drops === b.drops &&
  a.overlimits === b.overlimits &&
  a.backlog === b.backlog;

function render(namespace: string, pod: string, direction: string, source: string, c: DirectionCounters): Rendered {
  const labels = `{namespace="${escapeLabel(namespace)}",pod="${escapeLabel(pod)}",direction="${direction}"`;
  const lines = POD_FAMILIES.map(
    ([field, name]) => `${name}${labels}${field === 'limit' ? `,source="${escapeLabel(source)}"` : ''}} ${c[field]}\n`,
  );
  return { namespace, pod, source, counters: { ...c }, lines };
}

/**
 * The text of the six per-pod families for the given pods: HELP and TYPE of each (also with no
 * series), then one line per shaped direction. Keeps each direction's lines for the next call.
 */
export class PodSeries {
  private rendered = new Map<string, { ingress?: Rendered; egress?: Rendered }>();
  /** The last text, as sent, and the directions it was made of: sent again as it is while they all are the same. */
  private last: { rows: Rendered[]; body: Buffer } | undefined;

  /** The text, encoded (the same Buffer as the last call's when no line changed: nothing to build or encode). */
  body(traffic: PodTraffic[]): Buffer {
    const { rows, text } = this.build(traffic);
    const last = this.last;
    if (last && last.rows.length === rows.length && rows.every((r, i) => r === last.rows[i])) return last.body;
    const body = Buffer.from(text(), 'utf8');
    this.last = { rows, body };
    return body;
  }

  text(traffic: PodTraffic[]): string {
    return this.build(traffic).text();
  }

  /** Each shaped direction's lines (made again only where a label or a figure changed), and the text they make. */
  private build(traffic: PodTraffic[]): { rows: Rendered[]; text: () => string } {
    const next = new Map<string, { ingress?: Rendered; egress?: Rendered }>();
    const rows: Rendered[] = [];
    for (const t of traffic) {
      const s = t.shaping;
      if (!s || (!s.ingress && !s.egress)) continue;
      const rec = t.record;
      const pod = rec.name || rec.containerId.slice(0, 12);
      const key = rec.ifName === 'eth0' ? rec.containerId : `${rec.containerId}@${rec.ifName}`;
      const was = this.rendered.get(key);
      const now: { ingress?: Rendered; egress?: Rendered } = {};
      for (const direction of ['ingress', 'egress'] as const) {
        const c = s[direction];
        if (!c) continue;
        const source = rec.limitSources?.[direction] ?? 'pod';
        let r = was?.[direction];
        if (!r || r.namespace !== rec.namespace || r.pod !== pod || r.source !== source || !sameCounters(r.counters, c))
          r = render(rec.namespace, pod, direction, source, c);
        now[direction] = r;
        rows.push(r);
      }
      next.set(key, now);
    }
    this.rendered = next;
    const text = () => {
      let out = '';
      POD_FAMILIES.forEach(([, name, type, help], i) => {
        const lines = new Array<string>(rows.length);
        for (let j = 0; j < rows.length; j++) lines[j] = rows[j]?.lines[i] ?? '';
        out += `# HELP ${name} ${help}\n# TYPE ${name} ${type}\n${lines.join('')}`;
      });
      return out;
    };
    return { rows, text };
  }
}

const GUARANTEE_FAMILY = 'kubenet_pod_bandwidth_guarantee_bits_per_second';
const PRIORITY_FAMILY = 'kubenet_pod_bandwidth_priority';

/** The per-pod guarantee and band families from the ready pods' records (one series per pod: its first attachment's). */
export function guaranteeSeries(records: PodRecord[]): string {
  let guarantees = '';
  let bands = '';
  const seen = new Set<string>();
  for (const r of records) {
    const pod = r.name || r.containerId.slice(0, 12);
    const key = `${r.namespace}/${pod}`;
    if (r.phase !== 'ready' || seen.has(key)) continue;
    seen.add(key);
    const labels = `namespace="${escapeLabel(r.namespace)}",pod="${escapeLabel(pod)}"`;
    for (const d of ['ingress', 'egress'] as const) {
      const g = r.limits[d === 'ingress' ? 'ingressGuarantee' : 'egressGuarantee'];
      if (g !== undefined) guarantees += `${GUARANTEE_FAMILY}{${labels},direction="${d}"} ${g}\n`;
    }
    if (r.limits.priority !== undefined) bands += `${PRIORITY_FAMILY}{${labels}} ${r.limits.priority}\n`;
  }
  return (
    `# HELP ${GUARANTEE_FAMILY} The bandwidth the node guarantees the pod under contention (its requests of kubenet.io/{ingress,egress}-bandwidth), by direction\n# TYPE ${GUARANTEE_FAMILY} gauge\n${guarantees}` +
    `# HELP ${PRIORITY_FAMILY} The pod's priority band for bandwidth left after guarantees: 0 (high, served first), 1 (medium), 2 (low)\n# TYPE ${PRIORITY_FAMILY} gauge\n${bands}`
  );
}

/** The node as `kubenet_info` describes it. */
export interface AgentInfo {
  node: string;
  version: string;
  /** The pod CIDR(s) ("v4,v6"); undefined while none is known. */
  podCIDR: string | undefined;
  bridge: string;
  ipam: string;
  routes: string;
}

const INFO_FAMILY = 'kubenet_info';
const POD_INFO_FAMILY = 'kubenet_pod_info';
const READ_AT_FAMILY = 'kubenet_pod_counters_read_timestamp_seconds';

/** `kubenet_info` (when `info` is given), `kubenet_pod_info` per ready pod (one series per pod, its attachments' addresses together), and the counters' read time (when known). */
export function infoSeries(info: AgentInfo | undefined, records: PodRecord[], countersReadAtMs?: number): string {
  let out = '';
  if (info) {
    const labels = (['node', 'version', 'pod_cidr', 'bridge', 'ipam', 'routes'] as const)
      .map((k) => `${k}="${escapeLabel((k === 'pod_cidr' ? info.podCIDR : info[k]) ?? '')}"`)
      .join(',');
    out += `# HELP ${INFO_FAMILY} The agent: its node, version, pod CIDR(s) (empty while none is known), bridge, address mode and routes mode\n# TYPE ${INFO_FAMILY} gauge\n${INFO_FAMILY}{${labels}} 1\n`;
  }
  const pods = new Map<string, { namespace: string; pod: string; ips: string[] }>();
  for (const r of records) {
    if (r.phase !== 'ready') continue;
    const pod = r.name || r.containerId.slice(0, 12);
    const key = `${r.namespace}/${pod}`;
    const p = pods.get(key) ?? { namespace: r.namespace, pod, ips: [] };
    for (const ip of r.ips) if (!p.ips.includes(ip)) p.ips.push(ip);
    pods.set(key, p);
  }
  out += `# HELP ${POD_INFO_FAMILY} A pod attached to the bridge, shaped or not, with its addresses (comma-separated)\n# TYPE ${POD_INFO_FAMILY} gauge\n`;
  for (const p of pods.values())
    out += `${POD_INFO_FAMILY}{namespace="${escapeLabel(p.namespace)}",pod="${escapeLabel(p.pod)}",ips="${escapeLabel(p.ips.join(','))}"} 1\n`;
  if (countersReadAtMs !== undefined) {
    out += `# HELP ${READ_AT_FAMILY} When the pods' tc counters this scrape serves were read (unix seconds): an earlier scrape's read may be served again (metricsMaxAge)\n# TYPE ${READ_AT_FAMILY} gauge\n${READ_AT_FAMILY} ${countersReadAtMs / 1000}\n`;
  }
  return out;
}

/** The node's trees for /metrics: shard shares of the capacity and whether best-effort pods are in them (PodNetwork.bandwidthShares). */
export interface TreesView {
  shares: Array<{ direction: 'egress' | 'ingress'; ifb: string; share: number }>;
  steered: { egress?: boolean; ingress?: boolean };
}

/** The trees as `kubenet status` reports them: none without a capacity (no shares, no steering). */
export const treesOf = (t: TreesView): { trees?: TreesView } =>
  t.shares.length > 0 || Object.values(t.steered).some((v) => v !== undefined) ? { trees: t } : {};

export class AgentMetrics {
  readonly registry = new Registry();
  /**
   * `info`: the node as kubenet_info describes it, asked at each scrape (the pod CIDR comes later).
   * `routeWays`: with routes between nodes, the routes held now per way, as `kubenet_routes_direct`
   * (via a Node's InternalIP) and `kubenet_routes_tunnel` (through VXLAN, `routes: auto`).
   */
  constructor(
    private readonly info?: () => AgentInfo,
    routeWays?: () => { direct: number; tunnel: number } | undefined,
    trees?: () => TreesView,
    reshapes?: () => { failures: number; retrying: number; queued: number },
  ) {
    reshapeSeries(this.registry, reshapes);
    if (trees) {
      new Gauge({
        name: 'kubenet_node_bandwidth_share_bits_per_second',
        help: "Each shard's share of the node's capacity now (its tree's node class), by direction and shard (its ifb); the shares of a direction add up to its capacity",
        labelNames: ['direction', 'shard'],
        registers: [this.registry],
        collect() {
          this.reset();
          for (const s of trees().shares) this.set({ direction: s.direction, shard: s.ifb }, s.share);
        },
      });
      new Gauge({
        name: 'kubenet_node_best_effort_in_trees',
        help: "1 while the pods that asked for nothing are in the node's trees that way (the node near its capacity), 0 while they are kept out",
        labelNames: ['direction'],
        registers: [this.registry],
        collect() {
          this.reset();
          for (const [d, hot] of Object.entries(trees().steered)) if (hot !== undefined) this.set({ direction: d }, hot ? 1 : 0);
        },
      });
    }
    if (!routeWays) return;
    for (const way of ['direct', 'tunnel'] as const) {
      new Gauge({
        name: `kubenet_routes_${way}`,
        help:
          way === 'direct'
            ? "Routes to other Nodes' pod CIDRs via their InternalIPs (on a subnet connected to this node)"
            : "Routes to other Nodes' pod CIDRs through this node's VXLAN devices (routes: auto)",
        registers: [this.registry],
        collect() {
          this.set(routeWays()?.[way] ?? 0);
        },
      });
    }
  }

  readonly add = new Histogram({
    name: 'kubenet_cni_add_seconds',
    help: 'CNI ADD latency',
    buckets: LATENCY_BUCKETS,
    registers: [this.registry],
  });
  readonly del = new Histogram({
    name: 'kubenet_cni_del_seconds',
    help: 'CNI DEL latency',
    buckets: LATENCY_BUCKETS,
    registers: [this.registry],
  });
  readonly errors = new Counter({
    name: 'kubenet_cni_errors_total',
    help: 'CNI calls that failed, by command and CNI error code',
    labelNames: ['command', 'code'],
    registers: [this.registry],
  });
  readonly inFlight = new Gauge({ name: 'kubenet_cni_calls_in_flight', help: 'CNI calls being handled', registers: [this.registry] });
  private readonly pods = new Gauge({ name: 'kubenet_pods', help: 'Pods attached to the bridge', registers: [this.registry] });
  private readonly shaped = new Gauge({ name: 'kubenet_shaped_pods', help: 'Pods with bandwidth limits', registers: [this.registry] });
  // DEL answers once a pod's veth is gone; the kernel frees the device on a worker thread after.
  private readonly vethDeletions = new Gauge({
    name: 'kubenet_veth_deletions_in_flight',
    help: 'Pod veths deleted but not yet freed by the kernel',
    registers: [this.registry],
  });
  // Fed by loop-delay.ts: how late a timer due every 10 ms ran, runs a blocked loop missed included.
  readonly loopDelay = new Histogram({
    name: 'kubenet_event_loop_delay_seconds',
    help: "How late the agent's event loop ran a timer due every 10 ms",
    buckets: LOOP_DELAY_BUCKETS,
    registers: [this.registry],
  });
  private readonly perPod = new PodSeries();
  private readonly capacity = new Gauge({
    name: 'kubenet_node_bandwidth_capacity_bits_per_second',
    help: "The node's bandwidth capacity guarantees are given out of, by direction (ingress: to the pods, egress: from them)",
    labelNames: ['direction'],
    registers: [this.registry],
  });
  private readonly committed = new Gauge({
    name: 'kubenet_node_bandwidth_committed_bits_per_second',
    help: "The sum of the guarantees of the node's pods, by direction",
    labelNames: ['direction'],
    registers: [this.registry],
  });

  /** The node's capacity (undefined: unknown); a direction without one has no series. */
  setCapacity(c: Pick<NodeCapacity, 'egress' | 'ingress'> | undefined): void {
    this.capacity.reset();
    for (const d of ['ingress', 'egress'] as const) if (c?.[d] !== undefined) this.capacity.set({ direction: d }, c[d]);
  }

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
    const sum = committed(ready.map((r) => r.limits));
    for (const d of ['ingress', 'egress'] as const) this.committed.set({ direction: d }, sum[d]);
    this.vethDeletions.set(vethDeletionsInFlight);
  }

  /** The exposition: prom-client's metrics, then the per-pod series of the pods shaped now (in parts, as sent). */
  async text(
    records: PodRecord[],
    vethDeletionsInFlight: number,
    traffic: PodTraffic[],
    countersReadAtMs?: number,
  ): Promise<{ contentType: string; body: string }> {
    const { contentType, parts } = await this.exposition(records, vethDeletionsInFlight, traffic, countersReadAtMs);
    return { contentType, body: parts.map((p) => p.toString()).join('') };
  }

  /**
   * The exposition in the parts /metrics sends: prom-client's text, the per-pod series' encoded text
   * (reused while unchanged), the guarantee and band series, the info series. `countersReadAtMs`:
   * when `traffic` was read (Date.now()).
   */
  async exposition(
    records: PodRecord[],
    vethDeletionsInFlight: number,
    traffic: PodTraffic[],
    countersReadAtMs?: number,
  ): Promise<{ contentType: string; parts: Array<string | Buffer> }> {
    this.update(records, vethDeletionsInFlight);
    const base = await this.registry.metrics();
    return {
      contentType: this.registry.contentType,
      parts: [
        base.endsWith('\n') || base === '' ? base : `${base}\n`,
        this.perPod.body(traffic),
        guaranteeSeries(records),
        infoSeries(this.info?.(), records, countersReadAtMs),
      ],
    };
  }
}
