/**
 * `kubenet top`: a refreshing per-pod view of what each pod really gets — the rates measured by the
 * agent (bits/s to the pod = IN, from the pod = OUT, over the refresh interval), its limits and
 * the drops of its shaping (a limit from the pod's namespace says so: "10M ns-default", "20M
 * ns-ceiling"; a guarantee stands before its ceiling: "60M..100M"; the band in PRIO when pods have
 * one) — like top(1): in a terminal it takes the alternate screen, redraws every
 * interval and exits cleanly (terminal restored, exit 0) on `q` or Ctrl-C; `-b` (or a stdout that
 * is not a terminal) prints frames one after the other, `-n N` stops after N of them. With a
 * capacity, the line under the header shows the trees: each direction's shard shares now and
 * whether the pods that asked for nothing are in them.
 */
import { treesSummary } from './bandwidth-text.js';
import type { StatusReport } from '../daemon/agent.js';
import { STATUS_PATH } from '../daemon/http/socket-api.js';
import { agentGet } from '../daemon/protocol.js';
import { rateText } from './rate-text.js';
import { formatBandwidth, PRIORITY_BANDS, sourceTag, type BandwidthLimits, type LimitSource } from '../pod/index.js';

export { rateText };

/**
 * A limit, and where it came from when that is the pod's namespace: "20M", "10M ns-default", "5M
 * ns-ceiling"; with a guarantee, the guarantee first: "60M..100M" (guaranteed 60M, may borrow up to
 * 100M), "60M.." (up to the node's capacity).
 */
export function limitText(v: number | undefined, source?: LimitSource, guarantee?: number): string {
  if (v === undefined && guarantee === undefined) return '-';
  const core =
    guarantee === undefined ? formatBandwidth(v ?? 0) : `${formatBandwidth(guarantee)}..${v === undefined ? '' : formatBandwidth(v)}`;
  const tag = v === undefined ? '' : sourceTag(source);
  return tag ? `${core} ${tag}` : core;
}

/** A direction's cell of a pod's limits, its guarantee included. */
export function directionText(limits: BandwidthLimits, d: 'ingress' | 'egress', source?: LimitSource): string {
  return limitText(limits[d] || undefined, source, d === 'ingress' ? limits.ingressGuarantee : limits.egressGuarantee);
}

/** The band's name ("high", "medium", "low"), or "-". */
export function bandText(priority: number | undefined): string {
  return (priority !== undefined ? PRIORITY_BANDS[priority] : undefined) ?? '-';
}

const COLUMNS = ['POD', 'IN RATE', 'IN LIMIT', 'IN DROP/s', 'OUT RATE', 'OUT LIMIT', 'OUT DROP/s'] as const;

/** One frame: a header line, the column heads, a line per ready pod (busiest first), cut to `width` x `height`. */
export function renderTop(
  s: StatusReport,
  opts: { width?: number; height?: number; now?: Date; intervalS: number; hint?: boolean },
): string[] {
  const pods = s.pods.filter((p) => p.phase === 'ready');
  const shaped = pods.filter(
    (p) =>
      p.limits.ingress !== undefined ||
      p.limits.egress !== undefined ||
      p.limits.ingressGuarantee !== undefined ||
      p.limits.egressGuarantee !== undefined,
  ).length;
  const total = (p: (typeof pods)[number]) => (p.rate?.ingress ?? 0) + (p.rate?.egress ?? 0);
  pods.sort((a, b) => total(b) - total(a) || `${a.namespace}/${a.name}`.localeCompare(`${b.namespace}/${b.name}`));
  const time = (opts.now ?? new Date()).toTimeString().slice(0, 8);
  const head = `kubenet top - ${time}  pod CIDR ${s.podCIDR ?? '(none)'}  pods ${pods.length} (${shaped} shaped)  every ${opts.intervalS} s${opts.hint ? '  q: quit' : ''}`;
  // The band only when some pod has one (a node with a capacity).
  const banded = pods.some((p) => p.limits.priority !== undefined);
  const columns: readonly string[] = banded ? [...COLUMNS, 'PRIO'] : COLUMNS;
  const rows = pods.map((p) => [
    p.namespace || p.name ? `${p.namespace}/${p.name}` : p.id.slice(0, 12),
    rateText(p.rate?.ingress),
    directionText(p.limits, 'ingress', p.limitSources?.ingress),
    rateText(p.rate?.ingressDrops),
    rateText(p.rate?.egress),
    directionText(p.limits, 'egress', p.limitSources?.egress),
    rateText(p.rate?.egressDrops),
    ...(banded ? [bandText(p.limits.priority)] : []),
  ]);
  const widths = columns.map((c, i) => Math.max(c.length, ...rows.map((r) => (r[i] ?? '').length)));
  widths[0] = Math.min(widths[0] ?? 3, 40);
  const line = (cells: readonly string[]) =>
    cells
      .map((c, i) =>
        i === 0
          ? c.length > (widths[0] ?? 0)
            ? `${c.slice(0, (widths[0] ?? 1) - 1)}…`
            : c.padEnd(widths[0] ?? 0)
          : c.padStart(widths[i] ?? 0),
      )
      .join('  ');
  // With a capacity, the trees' shares now and where the pods that asked for nothing are.
  let lines = [head, treesSummary(s.trees) ?? '', line(columns), ...rows.map(line)];
  if (opts.width) lines = lines.map((l) => (l.length > (opts.width ?? 0) ? l.slice(0, opts.width) : l));
  if (opts.height) lines = lines.slice(0, opts.height);
  return lines;
}

export interface TopOptions {
  socket: string;
  intervalS: number;
  batch: boolean;
  iterations: number | undefined;
}

const ALT_SCREEN_ON = '\x1b[?1049h\x1b[?25l';
const ALT_SCREEN_OFF = '\x1b[?25h\x1b[?1049l';
const HOME_CLEAR = '\x1b[H\x1b[2J';

async function fetchStatus(socket: string, windowS: number): Promise<StatusReport> {
  const r = await agentGet(socket, `${STATUS_PATH}?window=${windowS}`).catch((err: unknown) => {
    throw new Error(`kubenet agent unreachable at ${socket}: ${err instanceof Error ? err.message : String(err)}`);
  });
  if (r.status !== 200) throw new Error(`kubenet agent answered ${r.status}: ${r.body}`);
  return JSON.parse(r.body) as StatusReport;
}

/** Runs the view until q, Ctrl-C, SIGTERM or `iterations` frames; resolves with the exit code. */
export async function top(o: TopOptions): Promise<number> {
  const out = process.stdout;
  const interactive = out.isTTY === true && !o.batch;
  let quit = false;
  let wake: (() => void) | undefined;
  const stop = () => {
    quit = true;
    wake?.();
  };
  const onKey = (d: Buffer) => {
    const k = d.toString('latin1');
    if (k.includes('q') || k.includes('Q') || k.includes('\x03')) stop();
  };
  const stdin = process.stdin;
  const rawTty = interactive && stdin.isTTY === true;
  process.on('SIGINT', stop);
  process.on('SIGTERM', stop);
  if (interactive) {
    if (rawTty) stdin.setRawMode(true);
    stdin.on('data', onKey);
    stdin.resume();
    out.write(ALT_SCREEN_ON);
  }
  try {
    for (let frame = 1; !quit; frame++) {
      const s = await fetchStatus(o.socket, o.intervalS);
      if (quit) break;
      const lines = renderTop(s, {
        intervalS: o.intervalS,
        hint: interactive,
        ...(interactive ? { width: out.columns, height: out.rows } : {}),
      });
      out.write(interactive ? HOME_CLEAR + lines.join('\n') : `${lines.join('\n')}\n\n`);
      if (o.iterations !== undefined && frame >= o.iterations) break;
      await new Promise<void>((resolve) => {
        const timer = setTimeout(resolve, o.intervalS * 1000);
        wake = () => {
          clearTimeout(timer);
          resolve();
        };
      });
    }
    return 0;
  } finally {
    process.off('SIGINT', stop);
    process.off('SIGTERM', stop);
    if (interactive) {
      out.write(ALT_SCREEN_OFF);
      stdin.off('data', onKey);
      if (rawTty) stdin.setRawMode(false);
      stdin.pause();
    }
  }
}
