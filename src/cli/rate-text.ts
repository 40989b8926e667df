/**
 * bits/s (or any rate) for a narrow column: "19.9M", "850k", "0". Shared by `kubenet top` and
 * `kubectl kubenet`, in a module of its own: the kubectl plugin loads nothing of the node's side.
 */
export function rateText(v: number | undefined): string {
  if (v === undefined || !Number.isFinite(v)) return '-';
  for (const [unit, f] of [
    ['G', 1e9],
    ['M', 1e6],
    ['k', 1e3],
  ] as const) {
    if (v >= f) return `${(v / f).toFixed(v >= 100 * f ? 0 : 1)}${unit}`;
  }
  return v >= 10 ? String(Math.round(v)) : v === 0 ? '0' : v.toFixed(1);
}
