/**
 * The names of the shaper's ifbs (tc.ts, tc-plan.ts Shards): the egress shards `<ifb>`, `<ifb>.1`,
 * ..., and with an ingress capacity the ingress shards `<ifb>.in`, `<ifb>.i1`, ..., each within the
 * 15 bytes of an interface name; and how many shards a configuration asks for.
 */

/** The most egress shards: each is an ifb, `<ifb>.<k>`, whose name must fit in 15 bytes. */
export const MAX_SHARDS = 64;
/** Egress shards per CPU when the count is left to the shaper (docs/shaping.md, "Egress shards": why). */
export const AUTO_SHARDS_PER_CPU = 2;

/**
 * The egress shard count configured (0: AUTO_SHARDS_PER_CPU per CPU, at most MAX_SHARDS), with or
 * without a capacity: under one, each direction's capacity is split over the shards (shares.ts).
 */
export function shardsFor(configured: number, cpus: number): number {
  return configured > 0 ? configured : Math.min(MAX_SHARDS, Math.max(1, AUTO_SHARDS_PER_CPU * cpus));
}

/**
 * The ifb of egress shard `k` (tc.ts: the pods' egress is spread over `shards` ifbs, each with its
 * own htb tree and this structure): shard 0 is `ifb` itself, shard k > 0 is `ifb.k`.
 */
export function shardIfb(ifb: string, k: number): string {
  return k === 0 ? ifb : `${ifb}.${k}`;
}

/** The shard an ifb name is, for `ifb`: 0 for itself, k for `ifb.k`, undefined for anything else. */
export function shardOf(ifb: string, name: string): number | undefined {
  if (name === ifb) return 0;
  if (!name.startsWith(`${ifb}.`)) return undefined;
  const k = name.slice(ifb.length + 1);
  return /^[1-9][0-9]*$/.test(k) ? Number(k) : undefined;
}

/** The ingress tree's ifb for the egress ifb `ifb` (shard 0's name): `<ifb>.in`. */
export function ingressIfb(ifb: string): string {
  return `${ifb}.in`;
}

/**
 * Ingress shards at most, as many as egress shards. Two characters name them within 15 bytes:
 * `<ifb>.in` for shard 0, `<ifb>.i<k in base 36>` for 1..35 but 23 (whose `in` is shard 0's), so
 * 23 is `<ifb>.j0` and 36..63 are `<ifb>.j1` .. `<ifb>.js`.
 */
export const MAX_INGRESS_SHARDS = MAX_SHARDS;
const IN_CLASH = Number.parseInt('n', 36);

/** The ifb of ingress shard `k` (MAX_INGRESS_SHARDS: the names). */
export function ingressShardIfb(ifb: string, k: number): string {
  if (k === 0) return ingressIfb(ifb);
  if (k === IN_CLASH) return `${ifb}.j0`;
  return k < 36 ? `${ifb}.i${k.toString(36)}` : `${ifb}.j${(k - 35).toString(36)}`;
}

/** The ingress shard an ifb name is, for `ifb`; undefined for anything else. */
export function ingressShardOf(ifb: string, name: string): number | undefined {
  if (name === ingressIfb(ifb)) return 0;
  const m = name.startsWith(`${ifb}.`) ? /^([ij])([0-9a-z])$/.exec(name.slice(ifb.length + 1)) : null;
  if (!m) return undefined;
  const c = Number.parseInt(m[2] ?? '', 36);
  const k = m[1] === 'i' ? c : c === 0 ? IN_CLASH : c + 35;
  return k > 0 && k < MAX_INGRESS_SHARDS && ingressShardIfb(ifb, k) === name ? k : undefined;
}
