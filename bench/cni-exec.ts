/**
 * Overhead of execPlugin (and of CniRuntime ADD+DEL) against a raw execa of the same plugin
 * binary with the same stdin and environment, interleaved call by call so both see the same
 * load. Prints p50 and mean per call and the difference. Not a test (ava runs *.test.ts only);
 * a benchmark script that belongs in bench/ once the lead moves it.
 * Usage: npx tsx test/cni/exec-overhead.ts [N]   (the runtime part needs root: it uses a netns)
 */
import { execa } from 'execa';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { performance } from 'node:perf_hooks';
import { execPlugin, findPlugin } from '../src/cni/exec.js';
import { CniRuntime } from '../src/cni/runtime.js';
import type { CniCommand, NetConf } from '../src/cni/types.js';

const DIRS = ['/usr/lib/cni', '/opt/cni/bin'];
const N = Number(process.argv[2] ?? 300);

function rawExec(bin: string, command: CniCommand, stdin: string, netns: string, ifName: string, id: string) {
  return execa(bin, [], {
    input: stdin,
    reject: false,
    extendEnv: false,
    env: {
      CNI_COMMAND: command,
      CNI_CONTAINERID: id,
      CNI_NETNS: netns,
      CNI_IFNAME: ifName,
      CNI_PATH: DIRS.join(':'),
      CNI_ARGS: 'IgnoreUnknown=1',
      PATH: process.env.PATH ?? '',
    },
  });
}

function summary(xs: number[]): { p50: number; mean: number } {
  const s = [...xs].sort((a, b) => a - b);
  return { p50: s[Math.floor(s.length / 2)] ?? NaN, mean: xs.reduce((a, b) => a + b, 0) / xs.length };
}

function report(label: string, ours: number[], raw: number[]): void {
  const o = summary(ours);
  const r = summary(raw);
  const f = (x: number) => `${x.toFixed(3)} ms`;
  console.log(
    `${label}: ours p50 ${f(o.p50)} mean ${f(o.mean)} | raw execa p50 ${f(r.p50)} mean ${f(r.mean)} | ` +
      `overhead p50 ${((o.p50 - r.p50) * 1000).toFixed(0)} µs (${(o.p50 / r.p50).toFixed(3)}×), mean ${((o.mean - r.mean) * 1000).toFixed(0)} µs (${(o.mean / r.mean).toFixed(3)}×)`,
  );
}

async function main(): Promise<void> {
  const bin = findPlugin('loopback', DIRS);
  const stdin = JSON.stringify({ cniVersion: '1.0.0', name: 'kcn-bench', type: 'loopback' });
  // Warm up both paths.
  for (let i = 0; i < 20; i++) {
    await rawExec(bin, 'VERSION', stdin, '', '', 'x');
    await execPlugin(bin, stdin, { command: 'VERSION', path: DIRS });
  }
  const ours: number[] = [];
  const raw: number[] = [];
  for (let i = 0; i < N; i++) {
    let s = performance.now();
    await execPlugin(bin, stdin, { command: 'VERSION', containerId: 'x', netns: '', ifName: '', args: [['IgnoreUnknown', '1']], path: DIRS });
    ours.push(performance.now() - s);
    s = performance.now();
    await rawExec(bin, 'VERSION', stdin, '', '', 'x');
    raw.push(performance.now() - s);
  }
  report(`execPlugin loopback VERSION, N=${N}`, ours, raw);

  if (process.getuid?.() !== 0) {
    console.log('runtime ADD+DEL part skipped: needs root (network namespace)');
    return;
  }
  const ns = `kcn-bench-${process.pid}`;
  const dir = await mkdtemp(join(tmpdir(), 'kcn-bench-'));
  await execa('ip', ['netns', 'add', ns]);
  try {
    const netns = `/var/run/netns/${ns}`;
    const runtime = new CniRuntime({ binDirs: DIRS, cacheDir: dir });
    const conf: NetConf = { cniVersion: '1.0.0', name: 'kcn-bench', type: 'loopback' };
    const rOurs: number[] = [];
    const rRaw: number[] = [];
    for (let i = 0; i < N; i++) {
      const rt = { containerId: `c${i}`, netns, ifName: 'lo', args: [['IgnoreUnknown', '1']] as [string, string][] };
      let s = performance.now();
      await runtime.addNetwork(conf, rt);
      await runtime.delNetwork(conf, rt);
      rOurs.push(performance.now() - s);
      s = performance.now();
      const add = await rawExec(bin, 'ADD', stdin, netns, 'lo', `c${i}`);
      JSON.parse(add.stdout);
      await rawExec(bin, 'DEL', stdin, netns, 'lo', `c${i}`);
      rRaw.push(performance.now() - s);
    }
    report(`CniRuntime loopback ADD+DEL (with cache write/read/delete), N=${N}`, rOurs, rRaw);
  } finally {
    await execa('ip', ['netns', 'del', ns], { reject: false });
    await rm(dir, { recursive: true, force: true });
  }
}

main().catch((err) => {
  console.error(err);
  process.exit(1);
});
