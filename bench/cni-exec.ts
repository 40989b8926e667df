/**
 * What one CNI plugin exec costs the agent, by way of starting it, at the agent's RSS as it is and
 * inflated (a big Buffer, every page touched): fork-based starts copy the page tables, so they
 * grow with RSS; the others should not.
 *
 *   shell          a bash loop exec'ing the plugin (timed with $EPOCHREALTIME): a lean exec'er, the reference
 *   execa          execa, as src/cni/exec.ts did before the spawner (child_process: libuv forks this process)
 *   spawn          child_process.spawn directly, stdio pipes, detached
 *   spawner        src/cni/spawner.ts: the long-lived native/kubenet-spawner forks + execs (what the agent uses)
 *   posix_spawn    bench/posix-spawn.ts: posix_spawn through koffi (clone(CLONE_VM|CLONE_VFORK)), the alternative
 *   posix+shim     posix_spawn of a C shim that sets PR_SET_PDEATHSIG and execs the plugin (dies with the agent; delegates do not)
 *   posix+forkshim posix_spawn of a C shim that forks the plugin and kills its whole group when the agent dies
 *   execPlugin     the full src/cni/exec.ts call (spawner, env, JSON.parse), and with via: 'execa'
 *
 * Every call: the plugin's VERSION command with a config on stdin, the exact CNI environment.
 * Within a round each method runs once, the order rotating, so machine noise hits all alike; a
 * warm-up round is not counted. Prints p50 / p99 / mean per method and level, in ms.
 * Run it under the machine-wide lock, compiled, so the process is as lean as the shipped agent
 * (tsx alone adds ~35 MB), with --expose-gc so that garbage collected after each round keeps the
 * RSS near its level (without it the first level drifts from ~65 to ~110 MB):
 *   npx tsc -p tsconfig.json && flock /tmp/kubenet-traffic.lock node --expose-gc dist/bench/cni-exec.js
 *
 * Usage: node --expose-gc dist/bench/cni-exec.js [--calls N] [--plugin loopback|bridge] [--rss MB[,MB...]]
 *        (or npx tsx bench/cni-exec.ts ..., starting at ~110 MB)
 *   --calls  counted calls per method and level (default 300)
 *   --rss    target RSS levels in MB; the first level is also "as is" when below the current RSS (default 60,170)
 */
import { execa } from 'execa';
import { spawn } from 'node:child_process';
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { performance } from 'node:perf_hooks';
import { execPlugin, findPlugin } from '../src/cni/exec.js';
import { sharedSpawner } from '../src/cni/spawner.js';
import { posixSpawnRun, SHIM_C } from './posix-spawn.js';
import { CNI_BIN_DIRS } from '../test/kit/kernel.js';
import { BenchArgs, summary } from '../test/kit/bench-kit.js';

const DIRS = CNI_BIN_DIRS;

const args = BenchArgs.parse('usage: node --expose-gc dist/bench/cni-exec.js [--calls N] [--plugin loopback|bridge] [--rss MB[,MB...]]', [
  'calls',
  'plugin',
  'rss',
]);
const CALLS = args.num('calls', 300);
const PLUGIN = args.str('plugin') ?? 'loopback';
const LEVELS = args.nums('rss', '60,170');

const rssMB = () => process.memoryUsage().rss / 1048576;

const stats = summary;

type Method = { name: string; run: () => Promise<string> };

async function main(): Promise<void> {
  const bin = findPlugin(PLUGIN, DIRS);
  const stdin = JSON.stringify({ cniVersion: '1.0.0', name: 'kfx-bench', type: PLUGIN });
  const env = {
    CNI_COMMAND: 'VERSION',
    CNI_CONTAINERID: '',
    CNI_NETNS: '',
    CNI_IFNAME: '',
    CNI_ARGS: '',
    CNI_PATH: DIRS.join(':'),
    PATH: process.env.PATH ?? '',
  };
  const dir = await mkdtemp(join(tmpdir(), 'kfx-exec-bench-'));
  try {
    await writeFile(join(dir, 'shim.c'), SHIM_C);
    await execa('cc', ['-O2', '-o', join(dir, 'shim'), join(dir, 'shim.c')]);
    const shim = join(dir, 'shim');
    const agentPid = String(process.pid);
    const check = (what: string, out: string) => {
      if (!out.includes('supportedVersions')) throw new Error(`${what}: unexpected output ${JSON.stringify(out.slice(0, 200))}`);
      return out;
    };
    const posix = async (argv: string[], what: string) => {
      const o = await posixSpawnRun(argv, env, stdin, 10_000);
      if (o.exitCode !== 0) throw new Error(`${what}: ${JSON.stringify(o)}`);
      return check(what, o.stdout);
    };
    const spawner = sharedSpawner();
    const methods: Method[] = [
      {
        name: 'execa',
        run: async () =>
          check('execa', (await execa(bin, [], { input: stdin, env, extendEnv: false, reject: false, detached: true })).stdout),
      },
      {
        name: 'spawn',
        run: () =>
          new Promise<string>((ok, fail) => {
            const p = spawn(bin, [], { env, detached: true, stdio: ['pipe', 'pipe', 'pipe'] });
            const out: Buffer[] = [];
            p.stdout.on('data', (b: Buffer) => out.push(b));
            p.stderr.resume();
            p.on('error', fail);
            p.on('close', () => ok(check('spawn', Buffer.concat(out).toString())));
            p.stdin.on('error', () => undefined); // EPIPE: VERSION need not read stdin
            p.stdin.end(stdin);
          }),
      },
      {
        name: 'spawner',
        run: async () => {
          const o = await spawner.run(bin, env, stdin, 10_000);
          if (o.exitCode !== 0) throw new Error(`spawner: ${JSON.stringify(o)}`);
          return check('spawner', o.stdout);
        },
      },
      { name: 'posix_spawn', run: () => posix([bin], 'posix_spawn') },
      { name: 'posix+shim', run: () => posix([shim, 'exec', agentPid, bin], 'posix+shim') },
      { name: 'posix+forkshim', run: () => posix([shim, 'fork', agentPid, bin], 'posix+forkshim') },
      {
        name: 'execPlugin',
        run: async () => JSON.stringify(await execPlugin(bin, stdin, { command: 'VERSION', path: DIRS }, { via: 'spawner' })),
      },
      {
        name: 'execPlugin/execa',
        run: async () => JSON.stringify(await execPlugin(bin, stdin, { command: 'VERSION', path: DIRS }, { via: 'execa' })),
      },
    ];

    console.log(`plugin ${bin} VERSION; ${CALLS} calls per method and level; node ${process.version}; ${new Date().toISOString()}`);
    const ballast: Buffer[] = [];
    for (const level of LEVELS) {
      const before = rssMB();
      const add = level - before;
      if (add > 0) {
        const b = Buffer.alloc(Math.round(add * 1048576), 1); // alloc + fill: every page touched
        ballast.push(b);
      }
      const times = new Map<string, number[]>(methods.map((m) => [m.name, []]));
      for (let round = -1; round < CALLS; round++) {
        for (let k = 0; k < methods.length; k++) {
          const m = methods[(k + Math.max(round, 0)) % methods.length] as Method;
          const s = performance.now();
          await m.run();
          if (round >= 0) times.get(m.name)?.push(performance.now() - s);
        }
        (globalThis as { gc?: () => void }).gc?.(); // untimed
      }
      // The reference: the same exec from a lean process.
      const sh = await execa(
        'bash',
        [
          '-c',
          `s=$EPOCHREALTIME; for i in $(seq ${CALLS}); do printf '%s' "$STDIN" | "$BIN" >/dev/null; done; e=$EPOCHREALTIME; echo "$s $e"`,
        ],
        {
          env: { ...env, BIN: bin, STDIN: stdin },
          extendEnv: false,
        },
      );
      const [s0, s1] = sh.stdout.trim().split(' ').map(Number);
      const shellMean = (((s1 ?? 0) - (s0 ?? 0)) * 1000) / CALLS;
      console.log(
        `\nagent RSS ${before.toFixed(0)} MB before the level, ${(add > 0 ? level : before).toFixed(0)} MB target, ${rssMB().toFixed(0)} MB after`,
      );
      console.log(`  ${'method'.padEnd(18)} ${'p50'.padStart(8)} ${'p99'.padStart(8)} ${'mean'.padStart(8)}`);
      console.log(
        `  ${'shell (reference)'.padEnd(18)} ${''.padStart(8)} ${''.padStart(8)} ${shellMean.toFixed(3).padStart(8)}   (bash loop incl. printf; mean only)`,
      );
      for (const m of methods) {
        const st = stats(times.get(m.name) ?? []);
        console.log(
          `  ${m.name.padEnd(18)} ${st.p50.toFixed(3).padStart(8)} ${st.p99.toFixed(3).padStart(8)} ${st.mean.toFixed(3).padStart(8)}`,
        );
      }
    }
    ballast.length = 0;
  } finally {
    await sharedSpawner().close();
    await rm(dir, { recursive: true, force: true });
  }
}

main().catch((err) => {
  console.error(err);
  process.exit(1);
});
