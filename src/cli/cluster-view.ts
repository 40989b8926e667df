/**
 * `kubectl kubenet`'s cluster-wide view, pure: what one agent's /metrics says of its node and pods
 * (snapshotOf), the rates between two scrapes of it (rowsOf: bits/s from the L2 byte counters,
 * drops/s, overlimits/s, use % of the limit), the order (throttled first), and the tables of `top`
 * and `status`. The agent's I/O is cluster-scrape.ts's; the command is kubectl-plugin.ts.
 */
import { formatBandwidth, type LimitSource } from '../bandwidth/limits.js';
import { sourceTag } from '../bandwidth/namespace-policy.js';
import { samplesOf, type MetricFamily } from './prom-text.js';
import type { AgentInfo } from '../daemon/http/metrics.js';
import { rateText } from './rate-text.js';

export type Direction = 'ingress' | 'egress';
export const DIRECTIONS: readonly Direction[] = ['ingress', 'egress'];

export interface DirectionSnapshot {
  limit?: number;
  source?: string;
  bytes?: number;
  drops?: number;
  overlimits?: number;
  guarantee?: number;
}

export interface PodSnapshot {
  namespace: string;
  pod: string;
  /** From kubenet_pod_info; undefined when the agent does not say. */
  ips?: string[];
  directions: Partial<Record<Direction, DirectionSnapshot>>;
}

/** One scrape of one agent. */
export interface NodeSnapshot {
  /** The node as `kubenet_info` says (absent from agents before it): the agent's own type, erased at run time. */
  info?: AgentInfo;
  /** By "namespace/pod". */
  pods: Map<string, PodSnapshot>;
  /** When the agent read the counters (unix seconds, its clock; kubenet_pod_counters_read_timestamp_seconds). */
  countersReadAtS?: number;
  /** When the answer arrived (ms, this process's clock): the window's fallback. */
  receivedAtMs: number;
}

const FAMILY = {
  limit: 'kubenet_pod_bandwidth_limit_bits_per_second',
  bytes: 'kubenet_pod_shaped_bytes_total',
  drops: 'kubenet_pod_shaped_drops_total',
  overlimits: 'kubenet_pod_shaped_overlimits_total',
  guarantee: 'kubenet_pod_bandwidth_guarantee_bits_per_second',
} as const;

/** What an agent's exposition says of its node and pods. */
export function snapshotOf(families: Map<string, MetricFamily>, receivedAtMs: number): NodeSnapshot {
  const pods = new Map<string, PodSnapshot>();
  const podOf = (l: Record<string, string>): PodSnapshot | undefined => {
    const namespace = l.namespace;
    const pod = l.pod;
    if (namespace === undefined || pod === undefined) return undefined;
    const key = `${namespace}/${pod}`;
    let p = pods.get(key);
    if (!p) pods.set(key, (p = { namespace, pod, directions: {} }));
    return p;
  };
  for (const s of samplesOf(families, 'kubenet_pod_info')) {
    const p = podOf(s.labels);
    if (p) p.ips = (s.labels.ips ?? '').split(',').filter((ip) => ip !== '');
  }
  for (const field of Object.keys(FAMILY) as Array<keyof typeof FAMILY>) {
    for (const s of samplesOf(families, FAMILY[field])) {
      const d = s.labels.direction;
      const p = podOf(s.labels);
      if (!p || (d !== 'ingress' && d !== 'egress')) continue;
      const dir = (p.directions[d] ??= {});
      dir[field] = s.value;
      if (field === 'limit' && s.labels.source !== undefined) dir.source = s.labels.source;
    }
  }
  const info = samplesOf(families, 'kubenet_info')[0]?.labels;
  const readAt = samplesOf(families, 'kubenet_pod_counters_read_timestamp_seconds')[0]?.value;
  return {
    ...(info
      ? {
          info: {
            node: info.node ?? '',
            version: info.version ?? '',
            podCIDR: info.pod_cidr || undefined,
            bridge: info.bridge ?? '',
            ipam: info.ipam ?? '',
            routes: info.routes ?? '',
          },
        }
      : {}),
    pods,
    ...(readAt !== undefined && Number.isFinite(readAt) ? { countersReadAtS: readAt } : {}),
    receivedAtMs,
  };
}

/** The seconds between two scrapes' counters: between the agent's reads when it says, else between the answers; undefined when no time passed (the same read served twice). */
export function windowOf(first: NodeSnapshot, second: NodeSnapshot): number | undefined {
  const w =
    first.countersReadAtS !== undefined && second.countersReadAtS !== undefined
      ? second.countersReadAtS - first.countersReadAtS
      : (second.receivedAtMs - first.receivedAtMs) / 1000;
  return w > 0 ? w : undefined;
}

/** A counter's increase per second; a counter that went down was reset (the pod re-shaped): its increase is its new value, as Prometheus counts it. */
function perSecond(a: number | undefined, b: number | undefined, windowS: number | undefined): number | undefined {
  if (a === undefined || b === undefined || windowS === undefined) return undefined;
  return (b >= a ? b - a : b) / windowS;
}

/** One pod and direction (direction undefined: a pod with no shaped direction). */
export interface PodRow {
  node: string;
  namespace: string;
  pod: string;
  direction: Direction | undefined;
  ips?: string[];
  /** bits/s of L2 frames that passed the shaping. */
  rate?: number;
  limit?: number;
  source?: string;
  /** rate / limit, in percent. */
  use?: number;
  dropsPerS?: number;
  overlimitsPerS?: number;
  guarantee?: number;
}

/** The rows of one node between two scrapes of its agent: one per pod and shaped direction (a direction with only a guarantee counts), one for a pod shaped in neither. */
export function rowsOf(node: string, first: NodeSnapshot, second: NodeSnapshot): PodRow[] {
  const windowS = windowOf(first, second);
  const rows: PodRow[] = [];
  for (const [key, p] of second.pods) {
    const before = first.pods.get(key);
    const base = { node, namespace: p.namespace, pod: p.pod, ...(p.ips ? { ips: p.ips } : {}) };
    const dirs = DIRECTIONS.filter((d) => p.directions[d] !== undefined);
    if (dirs.length === 0) rows.push({ ...base, direction: undefined });
    for (const d of dirs) {
      const now = p.directions[d] ?? {};
      const was = before?.directions[d];
      const bytes = perSecond(was?.bytes, now.bytes, windowS);
      const rate = bytes === undefined ? undefined : bytes * 8;
      const row: PodRow = { ...base, direction: d };
      if (rate !== undefined) row.rate = rate;
      if (now.limit !== undefined) row.limit = now.limit;
      if (now.source !== undefined) row.source = now.source;
      if (rate !== undefined && now.limit !== undefined && now.limit > 0) row.use = (rate / now.limit) * 100;
      const drops = perSecond(was?.drops, now.drops, windowS);
      if (drops !== undefined) row.dropsPerS = drops;
      const over = perSecond(was?.overlimits, now.overlimits, windowS);
      if (over !== undefined) row.overlimitsPerS = over;
      if (now.guarantee !== undefined) row.guarantee = now.guarantee;
      rows.push(row);
    }
  }
  return rows;
}

const desc = (a: number | undefined, b: number | undefined) => (b ?? -1) - (a ?? -1);
const text = (a: string, b: string) => (a < b ? -1 : a > b ? 1 : 0);

/** Throttled first: overlimits/s, then drops/s, then use %, each highest first; then by node, namespace, pod, direction. */
export function sortRows(rows: PodRow[]): PodRow[] {
  return rows.sort(
    (a, b) =>
      desc(a.overlimitsPerS, b.overlimitsPerS) ||
      desc(a.dropsPerS, b.dropsPerS) ||
      desc(a.use, b.use) ||
      text(a.node, b.node) ||
      text(a.namespace, b.namespace) ||
      text(a.pod, b.pod) ||
      text(a.direction ?? '', b.direction ?? ''),
  );
}

/** "20M", "10M ns-default"; "-" without a limit. */
export function limitCell(limit: number | undefined, source: string | undefined): string {
  if (limit === undefined) return '-';
  const tag = sourceTag(source as LimitSource | undefined);
  return tag ? `${formatBandwidth(limit)} ${tag}` : formatBandwidth(limit);
}

/** "100%", "9.5%", "0%"; "-" when unknown. */
export const useCell = (use: number | undefined): string =>
  use === undefined ? '-' : use === 0 ? '0%' : `${use >= 10 ? Math.round(use) : use.toFixed(1)}%`;

/** Cells in columns: the first `left` columns padded right, the others left; two spaces between. */
export function table(head: readonly string[], rows: string[][], left: number): string[] {
  const widths = head.map((h, i) => Math.max(h.length, ...rows.map((r) => (r[i] ?? '').length)));
  const line = (cells: readonly string[]) =>
    cells
      .map((c, i) => (i < left ? c.padEnd(widths[i] ?? 0) : c.padStart(widths[i] ?? 0)))
      .join('  ')
      .trimEnd();
  return [line(head), ...rows.map(line)];
}

export interface TopSummary {
  /** Nodes whose agent answered both scrapes. */
  nodes: number;
  /** Nodes whose agent did not. */
  unreachable: number;
  intervalS: number;
}

/** `kubectl kubenet top`'s table: a summary line, then a line per row in the given order. */
export function renderClusterTop(rows: PodRow[], s: TopSummary): string[] {
  const pods = new Set(rows.map((r) => `${r.node}\0${r.namespace}/${r.pod}`)).size;
  const shaped = new Set(rows.filter((r) => r.direction !== undefined).map((r) => `${r.node}\0${r.namespace}/${r.pod}`)).size;
  const guaranteed = rows.some((r) => r.guarantee !== undefined);
  const head = [
    'NODE',
    'NAMESPACE',
    'POD',
    'DIRECTION',
    'RATE',
    'LIMIT',
    'USE',
    'DROPS/s',
    'OVERLIMITS/s',
    ...(guaranteed ? ['GUARANTEE'] : []),
  ];
  const cells = rows.map((r) => [
    r.node,
    r.namespace,
    r.pod,
    r.direction ?? '-',
    rateText(r.rate),
    limitCell(r.limit, r.source),
    useCell(r.use),
    rateText(r.dropsPerS),
    rateText(r.overlimitsPerS),
    ...(guaranteed ? [r.guarantee === undefined ? '-' : formatBandwidth(r.guarantee)] : []),
  ]);
  const summary = `${s.nodes} node(s)${s.unreachable > 0 ? ` (${s.unreachable} unreachable)` : ''}, ${pods} pod(s) (${shaped} shaped), rates over ${s.intervalS} s`;
  return [summary, '', ...(rows.length > 0 ? table(head, cells, 4) : ['(no pods)'])];
}

/** `kubectl kubenet status NODE`: the node as its agent describes it, then a line per pod (by namespace and name). */
export function renderNodeStatus(node: string, agentPod: string, second: NodeSnapshot, rows: PodRow[], intervalS: number): string[] {
  const i = second.info;
  const out = [
    `node:     ${node}`,
    `agent:    ${agentPod}${i ? ` (kubenet-ts ${i.version})` : ''}`,
    ...(i
      ? [`pod CIDR: ${i.podCIDR ?? '(none yet)'}`, `bridge:   ${i.bridge}`, `ipam:     ${i.ipam}`, `routes:   ${i.routes}`]
      : ['(this agent publishes no kubenet_info: pod CIDR, bridge and version unknown)']),
  ];
  const byPod = new Map<string, PodRow[]>();
  for (const r of rows) byPod.set(`${r.namespace}/${r.pod}`, [...(byPod.get(`${r.namespace}/${r.pod}`) ?? []), r]);
  const keys = [...byPod.keys()].sort(text);
  out.push(`pods:     ${keys.length} (${keys.filter((k) => byPod.get(k)?.some((r) => r.direction !== undefined)).length} shaped)`);
  if (keys.length === 0) return out;
  const dirCells = (rs: PodRow[], d: Direction) => {
    const r = rs.find((x) => x.direction === d);
    if (!r) return ['-', '-', '-'];
    const limit =
      r.guarantee !== undefined
        ? `${formatBandwidth(r.guarantee)}..${r.limit === undefined ? '' : limitCell(r.limit, r.source)}`
        : limitCell(r.limit, r.source);
    return [limit, rateText(r.rate), rateText(r.dropsPerS)];
  };
  const cells = keys.map((k) => {
    const rs = byPod.get(k) ?? [];
    return [k, rs[0]?.ips?.join(',') || '-', ...dirCells(rs, 'ingress'), ...dirCells(rs, 'egress')];
  });
  out.push(...table(['POD', 'IPS', 'INGRESS', 'IN RATE', 'IN DROP/s', 'EGRESS', 'OUT RATE', 'OUT DROP/s'], cells, 2).map((l) => `  ${l}`));
  out.push(`(INGRESS/EGRESS: limits to/from the pod, a guarantee first (60M..100M); rates over ${intervalS} s, bits/s of L2 frames)`);
  return out;
}
