/**
 * The shaper's side of the steering (steering.ts decides): which adopted best-effort pods are out of
 * the trees after a restart, which are in the trees now, and moving them in or out, each under its
 * pod's lock. What it works on is the Shaper's (tc.ts), handed over as a SteerContext.
 */
import { AggregateKubenetError } from '../errors.js';
import { isBestEffort } from '../bandwidth/limits.js';
import * as nl from '../netlink/index.js';
import type { KeyedMutex } from '../util/keyed-mutex.js';
import { batch, type BatchOptions, type BatchResult } from './tc-exec.js';
import { redirectLines, VETH, vethToIfbLines, type Direction, type OutsideCount, type ShapingState } from './tc-layout.js';
import { bypasses } from './tc-plan.js';
import { spell, vethCountNow, ZERO } from './outside.js';

export interface SteerContext {
  records: Map<string, ShapingState>;
  mutex: KeyedMutex;
  tc(lines: string[], opts?: BatchOptions): Promise<BatchResult>;
  /** The pod's egress shard's ifb, and its ingress shard's (undefined without an ingress tree). */
  ifbOf(r: ShapingState): string;
  inIfbOf(r: ShapingState): string | undefined;
  /** Which directions have a tree. */
  trees: { egress: boolean; ingress: boolean };
}

const installedIn = (r: ShapingState, dir: Direction): boolean =>
  dir === 'egress' ? r.egressInstalled && r.classId > 0 : r.ingressInstalled && !!r.ingressClassId;

/**
 * Which adopted best-effort pods are out of the trees, as their veths say (one qdisc listing):
 * the steering of the last process is not in the states it handed over, and a restart must not
 * change the node. A spell outside counts on from the veth's counter now.
 */
export async function adoptSteering(c: SteerContext): Promise<void> {
  const roots = new Set<string>();
  const ingress = new Set<string>();
  for (const line of (await batch('tc', ['qdisc show'], { force: true })).stdout.split('\n')) {
    const m = /^qdisc (\S+) (\S+) dev (\S+) (root|parent)/.exec(line);
    if (m?.[1] === 'ingress' && m[3]) ingress.add(m[3]);
    if (m?.[1] === 'htb' && m[2] === VETH.root && m[4] === 'root' && m[3]) roots.add(m[3]);
  }
  for (const rec of c.records.values()) {
    if (!rec.hostVeth || nl.linkIndexByName(rec.hostVeth) === undefined) continue;
    const out = (['egress', 'ingress'] as const).filter(
      (d) =>
        isBestEffort(rec.limits, d) &&
        (d === 'egress'
          ? rec.egressInstalled && c.trees.egress && !ingress.has(rec.hostVeth)
          : rec.ingressInstalled && c.trees.ingress && !roots.has(rec.hostVeth)),
    );
    const outside: Partial<Record<Direction, OutsideCount>> = {};
    for (const d of ['egress', 'ingress'] as const) {
      const was = rec.outside?.[d];
      if (out.includes(d)) outside[d] = { carried: { ...(was?.carried ?? ZERO) }, from: vethCountNow(rec.hostVeth, d) ?? { ...ZERO } };
      else if (was) outside[d] = { carried: { ...was.carried } };
    }
    if (out.length > 0) rec.bypass = out;
    else delete rec.bypass;
    if (Object.keys(outside).length > 0) rec.outside = outside;
  }
}

/** The best-effort pods in a direction's tree with a veth, and whether each is out of it (steering.ts). */
export function bestEffortPods(records: Iterable<ShapingState>, dir: Direction): Array<{ id: string; hostVeth: string; out: boolean }> {
  const out: Array<{ id: string; hostVeth: string; out: boolean }> = [];
  for (const r of records)
    if (installedIn(r, dir) && r.hostVeth !== '' && isBestEffort(r.limits, dir))
      out.push({ id: r.id, hostVeth: r.hostVeth, out: bypasses(r, dir) });
  return out;
}

/**
 * Best-effort pods into a direction's tree (their veth's redirect added) or out of it (deleted),
 * each under its own lock; a pod that changed meanwhile (gone, shaped, already there) is left.
 */
export async function steerPods(c: SteerContext, dir: Direction, ids: string[], into: boolean): Promise<void> {
  const errors: unknown[] = [];
  await Promise.all(
    ids.map((id) =>
      c.mutex
        .run(id, async () => {
          const rec = c.records.get(id);
          if (!rec?.hostVeth || !isBestEffort(rec.limits, dir) || bypasses(rec, dir) !== into) return;
          const inIfb = c.inIfbOf(rec);
          if (!installedIn(rec, dir) || (dir === 'ingress' && !inIfb)) return;
          const veth = rec.hostVeth;
          const count = vethCountNow(veth, dir);
          if (into) {
            const lines = dir === 'egress' ? redirectLines(veth, c.ifbOf(rec)) : vethToIfbLines(veth, inIfb ?? '');
            // The ingress root's replace fails where an htb is there already (htb has no change).
            await c.tc(lines, dir === 'ingress' ? { optional: new Set([1]) } : {});
          } else {
            await c.tc([dir === 'egress' ? `qdisc del dev ${veth} ingress` : `qdisc del dev ${veth} root`], { force: true });
          }
          const rest = (rec.bypass ?? []).filter((d) => d !== dir);
          if (into) {
            if (rest.length > 0) rec.bypass = rest;
            else delete rec.bypass;
          } else rec.bypass = [...rest, dir];
          rec.outside = { ...rec.outside, [dir]: spell(rec.outside?.[dir], into ? undefined : (count ?? ZERO), count) };
        })
        .catch((err: unknown) => errors.push(err)),
    ),
  );
  if (errors.length > 0) throw new AggregateKubenetError(`steering best-effort pods ${into ? 'into' : 'out of'} the ${dir} tree`, errors);
}
