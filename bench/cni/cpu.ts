/** CPU time from /proc (clock ticks of 10 ms: enough over a burst of ~100 calls), and a process's children. */
import { readdirSync, readFileSync } from 'node:fs';

export const TICK_MS = 10;

/** CPU time (ms) of a burst's parties: this process's reaped children, the agent, the agent's helpers. */
export interface BurstCpu {
  runtime: number;
  agent: number;
  helpers: number;
}

/** utime+stime and cutime+cstime (reaped children) of a process, ms; zeros when it is gone. */
export function procCpu(pid: number | string): { self: number; reaped: number } {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
    const f = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
    // fields 14-17 of stat(5), here from field 3 on: utime at [11], stime [12], cutime [13], cstime [14]
    return { self: (Number(f[11]) + Number(f[12])) * TICK_MS, reaped: (Number(f[13]) + Number(f[14])) * TICK_MS };
  } catch {
    return { self: 0, reaped: 0 };
  }
}

/** The pids whose parent is `pid` (from /proc/N/stat). */
export function childPids(pid: number): string[] {
  const out: string[] = [];
  for (const d of readdirSync('/proc')) {
    if (!/^\d+$/.test(d)) continue;
    try {
      const stat = readFileSync(`/proc/${d}/stat`, 'utf8');
      if (stat.slice(stat.lastIndexOf(')') + 2).split(' ')[1] === String(pid)) out.push(d);
    } catch {
      // gone meanwhile
    }
  }
  return out;
}

/** The agent's own CPU, and that of its live children and everything they reaped (the spawner and its plugins, the tc session). */
export function agentTreeCpu(pid: number): { agent: number; helpers: number } {
  const own = procCpu(pid);
  let helpers = own.reaped;
  for (const d of childPids(pid)) {
    const c = procCpu(d);
    helpers += c.self + c.reaped;
  }
  return { agent: own.self, helpers };
}
