/** `kubenet status`'s lines about the node's bandwidth: capacity, guarantees, and the trees that enforce them. */
import type { BandwidthReport } from '../daemon/cluster/pod-guarantees.js';
import type { TreesView } from '../daemon/http/metrics.js';
import { formatBandwidth } from '../pod/index.js';

/**
 * The node's capacity per direction, what its pods are guaranteed and what is free, or why guarantees
 * are off; with `trees` (an agent that reports them), each direction's shards with their shares of the
 * capacity now, and whether the pods that asked for nothing are in the trees.
 */
export function bandwidthLines(b: BandwidthReport, trees?: TreesView): string[] {
  const on = (['egress', 'ingress'] as const).filter((d) => b.capacity[d] !== undefined);
  if (on.length === 0 && b.off?.egress === b.off?.ingress) return [`guarantees: off: ${b.off?.egress ?? 'no capacity'}`];
  const out = on.length > 0 ? [`capacity: ${b.description}`] : [];
  for (const d of ['egress', 'ingress'] as const) {
    const cap = b.capacity[d];
    if (cap === undefined) {
      out.push(`  ${d.padEnd(7)} guarantees off: ${b.off?.[d] ?? 'no capacity'}`);
      continue;
    }
    const free = b.free[d] ?? 0;
    out.push(
      `  ${d.padEnd(7)} ${formatBandwidth(b.committed[d])} guaranteed, ${free >= 0 ? `${formatBandwidth(free)} free` : `over by ${formatBandwidth(-free)}`} of ${formatBandwidth(cap)}`,
    );
    const shares = trees?.shares.filter((s) => s.direction === d) ?? [];
    const steered = trees?.steered[d];
    if (shares.length === 0 && steered === undefined) continue;
    const parts: string[] = [];
    if (shares.length > 0)
      parts.push(
        `${shares.length} ${shares.length === 1 ? 'tree' : 'shards'}, ${shares.length === 1 ? 'at' : 'shares'} ${shares.map((s) => formatBandwidth(s.share)).join(' / ')}`,
      );
    if (steered !== undefined)
      parts.push(
        `pods that asked for nothing ${steered ? 'in the trees (node near its capacity)' : 'kept out (node far from its capacity)'}`,
      );
    out.push(`          ${parts.join('; ')}`);
  }
  return out;
}

/** `kubenet top`'s one line about the trees: each direction's shares now and where best-effort pods are; undefined without trees. */
export function treesSummary(trees: TreesView | undefined): string | undefined {
  const parts: string[] = [];
  for (const d of ['egress', 'ingress'] as const) {
    const shares = trees?.shares.filter((s) => s.direction === d) ?? [];
    if (shares.length === 0) continue;
    const steered = trees?.steered[d];
    const where = steered === undefined ? '' : steered ? ', best effort in' : ', best effort out';
    parts.push(`${d} ${shares.map((s) => formatBandwidth(s.share)).join('/')}${where}`);
  }
  return parts.length > 0 ? `trees: ${parts.join('  ')}` : undefined;
}
