/** What the cluster benches share: numeric flags, percentiles, and a process's CPU time and RSS. */
import { readFile } from 'node:fs/promises';

/** `--NAME N` from the command line, else `dflt`. */
export function numArg(name: string, dflt: number): number {
  const i = process.argv.indexOf(`--${name}`);
  return i > 0 ? Number(process.argv[i + 1]) : dflt;
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
