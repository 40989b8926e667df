/** What the benches (and the test suites that print figures) share: flags, percentiles, a process's CPU time and RSS, tables. */
import { readFile } from 'node:fs/promises';

/** `--NAME N` from the command line, else `dflt`. */
export function numArg(name: string, dflt: number): number {
  const i = process.argv.indexOf(`--${name}`);
  return i > 0 ? Number(process.argv[i + 1]) : dflt;
}

/** `--NAME VALUE` (name with its dashes) from the command line, else undefined. */
export function argValue(name: string): string | undefined {
  const i = process.argv.indexOf(name);
  return i >= 0 ? process.argv[i + 1] : undefined;
}

/** Count, nearest-rank p50 and p99, min, max and mean of unsorted samples (NaN for none). */
export function summary(xs: number[]): { n: number; p50: number; p99: number; min: number; max: number; mean: number } {
  const s = [...xs].sort((a, b) => a - b);
  return { n: s.length, p50: percentile(s, 50), p99: percentile(s, 99), min: s[0] ?? NaN, max: s[s.length - 1] ?? NaN, mean: s.length ? xs.reduce((a, b) => a + b, 0) / s.length : NaN };
}

/** The p-th percentile (nearest rank) of unsorted samples; NaN for none. */
export function percentile(xs: number[], p: number): number {
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.max(0, Math.ceil((p / 100) * s.length) - 1))] ?? NaN;
}

/** A process's own CPU time (utime + stime, at 100 ticks/s) and its RSS, from /proc. */
export async function processUsage(pid: string): Promise<{ cpuMs: number; rssMb: number }> {
  // stat(5) from field 3 on (after the command's ") "): utime at [11], stime at [12].
  const stat = (await readFile(`/proc/${pid}/stat`, 'utf8')).split(') ')[1]?.split(' ') ?? [];
  const rss = /VmRSS:\s+(\d+)/.exec(await readFile(`/proc/${pid}/status`, 'utf8'))?.[1];
  return { cpuMs: ((Number(stat[11]) + Number(stat[12])) * 1000) / 100, rssMb: Number(rss) / 1024 };
}

/** Prints a titled table: columns right-aligned to their widest cell, a dashed rule under the head. */
export function printTable(title: string, head: string[], rows: string[][]): void {
  const w = head.map((h, i) => Math.max(h.length, ...rows.map((r) => (r[i] ?? '').length)));
  const line = (r: string[]) => r.map((c, i) => c.padStart(w[i] ?? 0)).join('  ');
  console.log(`\n${title}`);
  console.log(line(head));
  console.log(w.map((n) => '-'.repeat(n)).join('  '));
  for (const r of rows) console.log(line(r));
}
