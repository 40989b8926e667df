/**
 * Runs a Shaper in the network namespace this process was started in (test/shaper/unshaped-live.test.ts
 * starts it with `ip netns exec`): argv[2] is JSON {ifb, bridge, steps: string[][]}; the shaper starts with
 * the first step's CIDRs, each later step is one setUnshaped (a step starting with "burst" makes the
 * rest of its entries, each a comma-separated set, concurrent calls). After each step it prints one
 * JSON line: the ifb's unshaped filters and the mangle chain per family, as the kernel lists them,
 * and how long the step took.
 */
import { execa } from 'execa';
import { Shaper } from '../../src/shaper/tc.js';
import { parseUnshaped } from '../../src/shaper/unshaped.js';

const { ifb, bridge, steps } = JSON.parse(process.argv[2] ?? '{}') as { ifb: string; bridge: string; steps: string[][] };

/** Per filter to the htb root (flowid 1:) at prio 4 / 5: its match lines, as `tc filter show` prints them. */
async function filters(): Promise<string[]> {
  const out: string[] = [];
  for (const prio of ['4', '5']) {
    const lines = (await execa('tc', ['filter', 'show', 'dev', ifb, 'parent', '1:', 'prio', prio])).stdout.split('\n');
    lines.forEach((l, i) => {
      if (!/flowid 1: /.test(l)) return;
      const matches: string[] = [];
      for (let j = i + 1; j < lines.length && /^\s+match /.test(lines[j] ?? ''); j++) matches.push((lines[j] ?? '').trim());
      out.push(`prio ${prio} ${matches.join(' ')}`);
    });
  }
  return out;
}

async function chain(tool: string): Promise<string[] | null> {
  const r = await execa(tool, ['-t', 'mangle', '-S', 'KUBENET-UNSHAPED'], { reject: false });
  return r.exitCode === 0 ? r.stdout.split('\n').filter((l) => l.startsWith('-A ')) : null;
}

async function jumps(): Promise<number> {
  let n = 0;
  for (const tool of ['iptables', 'ip6tables'])
    n += (await execa(tool, ['-t', 'mangle', '-S', 'POSTROUTING'])).stdout.split('\n').filter((l) => l.includes('KUBENET-UNSHAPED')).length;
  return n;
}

const u = (cidrs: string[]) => ({ subnets: parseUnshaped(cidrs), bridge });
const shaper = new Shaper({ ifbName: ifb, unshaped: u(steps[0] ?? []) });
try {
  for (const [i, step] of steps.entries()) {
    const t0 = performance.now();
    if (i === 0) await shaper.init();
    else if (step[0] === 'burst') await Promise.all(step.slice(1).map((set) => shaper.setUnshaped(u(set === '' ? [] : set.split(',')))));
    else await shaper.setUnshaped(u(step));
    const ms = +(performance.now() - t0).toFixed(1);
    console.log(
      JSON.stringify({ filters: await filters(), v4: await chain('iptables'), v6: await chain('ip6tables'), jumps: await jumps(), ms }),
    );
  }
} finally {
  await shaper.reset();
  shaper.close();
}
