/** What the benches (and the test suites that print figures) share: flags, percentiles, a process's CPU time and RSS, tables. */
import { readFile } from 'node:fs/promises';
import { parseArgs } from 'node:util';

/** A flag whose value is not what the bench takes: its name, what it wants, what it got. */
export class BenchArgError extends Error {}

/**
 * A bench's command line, parsed once by node:util's parseArgs (strict: a flag it does not know,
 * a value missing, or a stray word is an error naming the usage). `values` are the flags that take
 * a value (`--NAME V` or `--NAME=V`), `switches` those that take none; defaults stay with each
 * getter, so a default may depend on another flag (`--quick`).
 */
export class BenchArgs {
  private constructor(
    private readonly got: Record<string, string | boolean | undefined>,
    readonly usage: string,
  ) {}

  static parse(
    usage: string,
    values: readonly string[],
    switches: readonly string[] = [],
    argv: string[] = process.argv.slice(2),
  ): BenchArgs {
    const options: Record<string, { type: 'string' | 'boolean' }> = {};
    for (const v of values) options[v] = { type: 'string' };
    for (const s of switches) options[s] = { type: 'boolean' };
    try {
      return new BenchArgs(parseArgs({ args: argv, options, strict: true, allowPositionals: false }).values, usage);
    } catch (err) {
      throw new BenchArgError(`${err instanceof Error ? err.message : String(err)}\n${usage}`);
    }
  }

  /** `--NAME V`'s V, or undefined when not given. */
  str(name: string): string | undefined {
    const v = this.got[name];
    return typeof v === 'string' ? v : undefined;
  }

  /** Whether the switch `--NAME` was given. */
  has(name: string): boolean {
    return this.got[name] === true;
  }

  /** `--NAME N` as a number, else `dflt`. */
  num(name: string, dflt: number): number {
    const raw = this.str(name);
    if (raw === undefined) return dflt;
    const v = Number(raw);
    if (raw.trim() === '' || !Number.isFinite(v)) throw new BenchArgError(`--${name}: want a number, got ${JSON.stringify(raw)}`);
    return v;
  }

  /** `--NAME N` as an integer in min..max, else `dflt`. */
  int(name: string, dflt: number, min: number, max: number): number {
    const raw = this.str(name);
    if (raw === undefined) return dflt;
    const v = Number(raw);
    if (raw.trim() === '' || !Number.isInteger(v) || v < min || v > max)
      throw new BenchArgError(`--${name}: want an integer in ${min}..${max}, got ${JSON.stringify(raw)}`);
    return v;
  }

  /** `--NAME V` where V is one of `allowed`, else `dflt`. */
  oneOf<T extends string>(name: string, dflt: T, allowed: readonly T[]): T {
    const raw = this.str(name);
    if (raw === undefined) return dflt;
    if (!(allowed as readonly string[]).includes(raw))
      throw new BenchArgError(`--${name}: want one of ${allowed.join(', ')}, got ${JSON.stringify(raw)}`);
    return raw as T;
  }

  /** `--NAME a,b,c` (else `dflt`) split at commas. */
  list(name: string, dflt: string): string[] {
    return (this.str(name) ?? dflt).split(',');
  }

  /** `--NAME 1,2,3` (else `dflt`) as numbers; a word that is not one is an error. */
  nums(name: string, dflt: string): number[] {
    return this.list(name, dflt).map((x) => {
      const v = Number(x);
      if (x.trim() === '' || !Number.isFinite(v))
        throw new BenchArgError(`--${name}: want numbers separated by commas, got ${JSON.stringify(this.str(name) ?? dflt)}`);
      return v;
    });
  }
}

/** What summary() gives. */
export type Summary = { n: number; p50: number; p99: number; min: number; max: number; mean: number };

/** Count, nearest-rank p50 and p99, min, max and mean of unsorted samples (NaN for none). */
export function summary(xs: number[]): Summary {
  const s = [...xs].sort((a, b) => a - b);
  return { n: s.length, p50: percentile(s, 50), p99: percentile(s, 99), min: s[0] ?? NaN, max: s[s.length - 1] ?? NaN, mean: mean(xs) };
}

/** The p-th percentile (nearest rank) of unsorted samples; NaN for none. */
export function percentile(xs: number[], p: number): number {
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.max(0, Math.ceil((p / 100) * s.length) - 1))] ?? NaN;
}

/**
 * The median of unsorted samples; NaN for none. For an even count, `even` picks the lower of the
 * two middle samples (the nearest-rank p50, as `percentile(xs, 50)`), the upper one, or their mean.
 */
export function median(xs: number[], even: 'lower' | 'upper' | 'mean' = 'lower'): number {
  const s = [...xs].sort((a, b) => a - b);
  if (s.length === 0) return NaN;
  const m = Math.floor(s.length / 2);
  if (s.length % 2 === 1 || even === 'upper') return s[m] ?? NaN;
  return even === 'lower' ? (s[m - 1] ?? NaN) : ((s[m - 1] ?? NaN) + (s[m] ?? NaN)) / 2;
}

/** The arithmetic mean; NaN for none. */
export function mean(xs: number[]): number {
  return xs.length ? xs.reduce((a, b) => a + b, 0) / xs.length : NaN;
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
