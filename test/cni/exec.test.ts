/**
 * findPlugin and execPlugin against fake plugins: /bin/sh scripts in a temporary directory (a
 * process boundary). Covers the environment a plugin gets, results of every spec version, CNI
 * error objects, garbage with a non-zero exit, non-JSON output, a hang (timeout, including a
 * child still holding the pipes), and missing binaries; then what the plugin spawner adds:
 * concurrency, large stdin/stdout, process groups, no descriptor leak, plugins and delegates
 * dying with the agent, a spawner that dies. No root or kernel state needed.
 */
import test from 'ava';
import { spawn } from 'node:child_process';
import { mkdir, mkdtemp, readdir, readFile, rm, writeFile, chmod } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { performance } from 'node:perf_hooks';
import { setTimeout as sleep } from 'node:timers/promises';
import { CniPluginError, ConfigError } from '../../src/errors.js';
import { PluginNotFoundError } from '../../src/cni/errors.js';
import { cniArgsString, execPlugin, findPlugin } from '../../src/cni/exec.js';
import { sharedSpawner } from '../../src/cni/spawner.js';
import { parseResult } from '../../src/cni/result.js';
import { CNI_VERSIONS } from '../../src/cni/types.js';
import { PARSED, WIRE } from '../kit/cni-fixtures.js';
import { calls, printing, recording, shQuote, writeScript } from '../kit/fake-plugins.js';
import { until } from '../kit/until.js';

let root = '';
test.before(async () => {
  root = await mkdtemp(join(tmpdir(), 'kcn-exec-'));
});
test.after.always(async () => {
  if (root) await rm(root, { recursive: true, force: true });
});

let n = 0;
async function freshDir(): Promise<string> {
  const d = join(root, `d${++n}`);
  await mkdir(d, { recursive: true });
  return d;
}

/** Process state letter from /proc/<pid>/stat (R, S, D, Z, ...), or 'gone'. */
async function procState(pid: number): Promise<string> {
  return readFile(`/proc/${pid}/stat`, 'utf8').then(
    (s) => s.slice(s.lastIndexOf(')') + 2, s.lastIndexOf(')') + 3),
    () => 'gone',
  );
}

/** Polls (up to `ms`) until the process is gone or a zombie; returns the last state seen. */
async function settledState(pid: number, ms = 2000): Promise<string> {
  const deadline = performance.now() + ms;
  for (;;) {
    const st = await procState(pid);
    if (st === 'gone' || st === 'Z' || performance.now() > deadline) return st;
    await sleep(10);
  }
}

const req = (dir: string) => ({ command: 'ADD' as const, containerId: 'ctr1', netns: '/var/run/netns/none', ifName: 'eth0', path: [dir] });

test('findPlugin returns the first directory holding an executable file of that name', async (t) => {
  const a = await freshDir();
  const b = await freshDir();
  const c = await freshDir();
  await writeFile(join(a, 'p'), '#!/bin/sh\n'); // not executable
  await mkdir(join(b, 'p')); // a directory
  const inC = await writeScript(c, 'p', 'exit 0');
  t.is(findPlugin('p', [a, b, c]), inC);
  const inA = await writeScript(a, 'q', 'exit 0');
  await writeScript(c, 'q', 'exit 0');
  t.is(findPlugin('q', [a, c]), inA);
  // Not cached: a binary installed later into an earlier directory wins from then on.
  await chmod(join(a, 'p'), 0o755);
  t.is(findPlugin('p', [a, b, c]), join(a, 'p'));
});

test('findPlugin: missing plugin is a PluginNotFoundError (a ConfigError) naming the plugin and every dir', async (t) => {
  const a = await freshDir();
  const b = join(root, 'does-not-exist');
  const err = t.throws(() => findPlugin('nosuchplugin', [a, b]), { instanceOf: PluginNotFoundError });
  t.true(err instanceof ConfigError);
  t.regex(err.message, /nosuchplugin/);
  t.true(err.message.includes(a) && err.message.includes(b), err.message);
  t.deepEqual(err.dirs, [a, b]);
  t.throws(() => findPlugin('../bin/sh', [a]), { instanceOf: ConfigError, message: /must be a file name/ });
});

test('execPlugin passes exactly the CNI variables and PATH, config on stdin, and parses stdout', async (t) => {
  const dir = await freshDir();
  const rec = join(dir, 'rec');
  await mkdir(rec);
  const path = await writeScript(dir, 'fake', recording(rec, 'fake', WIRE['1.0.0']));
  process.env.KCN_LEAK_CHECK = 'must-not-reach-the-plugin';
  t.teardown(() => {
    delete process.env.KCN_LEAK_CHECK;
  });
  const conf = { cniVersion: '1.0.0', name: 'n', type: 'fake', x: 'é"\'$(x)' };
  const out = await execPlugin(path, JSON.stringify(conf), {
    command: 'ADD',
    containerId: 'ctr1',
    netns: '/var/run/netns/kcn-x',
    ifName: 'eth0',
    args: [
      ['IgnoreUnknown', '1'],
      ['K8S_POD_NAME', 'web-0'],
    ],
    path: [dir, '/usr/lib/cni'],
  });
  t.deepEqual(out, WIRE['1.0.0']);
  const [call] = await calls(rec);
  t.deepEqual(call?.stdin, conf);
  t.deepEqual(call?.env, {
    CNI_ARGS: 'IgnoreUnknown=1;K8S_POD_NAME=web-0',
    CNI_COMMAND: 'ADD',
    CNI_CONTAINERID: 'ctr1',
    CNI_IFNAME: 'eth0',
    CNI_NETNS: '/var/run/netns/kcn-x',
    CNI_PATH: `${dir}:/usr/lib/cni`,
    PATH: process.env.PATH ?? '',
  });
});

test('cniArgsString joins k=v with ;', (t) => {
  t.is(cniArgsString(undefined), '');
  t.is(cniArgsString([['A', '1']]), 'A=1');
  t.is(
    cniArgsString([
      ['A', '1'],
      ['B', 'x=y'],
    ]),
    'A=1;B=x=y',
  );
});

for (const v of CNI_VERSIONS) {
  test(`execPlugin + parseResult read a ${v} result`, async (t) => {
    const dir = await freshDir();
    const path = await writeScript(dir, `v${v}`, printing(WIRE[v]));
    t.deepEqual(parseResult(await execPlugin(path, '{}', req(dir))), PARSED[v]);
  });
}

test('empty stdout is undefined (DEL, CHECK)', async (t) => {
  const dir = await freshDir();
  const path = await writeScript(dir, 'quiet', printing(''));
  t.is(await execPlugin(path, '{}', { ...req(dir), command: 'DEL' }), undefined);
});

test('a CNI error object with a non-zero exit is a CniPluginError with code, msg, details and stderr', async (t) => {
  const dir = await freshDir();
  const path = await writeScript(
    dir,
    'bridge',
    printing({ cniVersion: '1.0.0', code: 7, msg: 'invalid network config', details: 'bridge: no "bridge" key' }, 1, 'some log line'),
  );
  const err = await t.throwsAsync(execPlugin(path, '{}', req(dir)), { instanceOf: CniPluginError });
  t.is(err.plugin, 'bridge');
  t.is(err.command, 'ADD');
  t.is(err.code, 7);
  t.is(err.details, 'bridge: no "bridge" key');
  t.is(err.stderr, 'some log line');
  t.regex(err.message, /invalid network config/);
});

test('a CNI error object with exit 0 is still an error', async (t) => {
  const dir = await freshDir();
  const path = await writeScript(dir, 'liar', printing({ code: 100, msg: 'plugin specific' }, 0));
  const err = await t.throwsAsync(execPlugin(path, '{}', req(dir), { plugin: 'liar-plugin' }), { instanceOf: CniPluginError });
  t.is(err.code, 100);
  t.is(err.plugin, 'liar-plugin');
});

test('a non-zero exit with garbage output is a CniPluginError quoting the output and keeping stderr', async (t) => {
  const dir = await freshDir();
  const path = await writeScript(dir, 'garbage', printing('panic: runtime error: index out of range', 2, 'goroutine 1 [running]'));
  const err = await t.throwsAsync(execPlugin(path, '{}', req(dir)), { instanceOf: CniPluginError });
  t.is(err.code, undefined);
  t.regex(err.message, /exit status 2/);
  t.regex(err.message, /index out of range/);
  t.is(err.stderr, 'goroutine 1 [running]');
});

test('a non-zero exit without output reports stderr', async (t) => {
  const dir = await freshDir();
  const path = await writeScript(dir, 'silent', printing('', 3, 'cannot open /run/lock'));
  const err = await t.throwsAsync(execPlugin(path, '{}', req(dir)), { instanceOf: CniPluginError });
  t.regex(err.message, /exit status 3: cannot open \/run\/lock/);
});

test('exit 0 with non-JSON output is a CniPluginError', async (t) => {
  const dir = await freshDir();
  const path = await writeScript(dir, 'chatty', printing('hello, I am a plugin'));
  const err = await t.throwsAsync(execPlugin(path, '{}', req(dir)), { instanceOf: CniPluginError });
  t.regex(err.message, /not JSON/);
});

test('a plugin that cannot be executed is a CniPluginError', async (t) => {
  const dir = await freshDir();
  const path = join(dir, 'broken');
  await writeFile(path, '#!/no/such/interpreter\n');
  await chmod(path, 0o755);
  const err = await t.throwsAsync(execPlugin(path, '{}', req(dir)), { instanceOf: CniPluginError });
  t.regex(err.message, /could not run .*broken: ENOENT/);
  const gone = await t.throwsAsync(execPlugin(join(dir, 'vanished'), '{}', req(dir)), { instanceOf: CniPluginError });
  t.regex(gone.message, /could not run .*vanished: ENOENT/);
});

test('a plugin that does not read its stdin (large config) still succeeds', async (t) => {
  const dir = await freshDir();
  const path = await writeScript(dir, 'noread', `printf '%s' '{"cniVersion":"1.0.0"}'`);
  const big = JSON.stringify({ cniVersion: '1.0.0', name: 'n', type: 'noread', pad: 'x'.repeat(1 << 20) });
  t.deepEqual(await execPlugin(path, big, req(dir)), { cniVersion: '1.0.0' });
});

test('a hung plugin is killed after timeoutMs, with the children it started', async (t) => {
  const dir = await freshDir();
  const pidFile = join(dir, 'child.pid');
  // The child keeps stdout/stderr open: killing only the plugin would leave us waiting for it.
  // The pid goes in with a rename, so the file is either whole or absent.
  const path = await writeScript(dir, 'hang', `sleep 30 &\necho $! > ${pidFile}.tmp && mv ${pidFile}.tmp ${pidFile}\nwait`);
  // On a loaded machine the shell may not reach its echo before the timeout kills it: then there is
  // no child to check, and the same case runs again with a longer timeout (the scheduler's delay,
  // not what is tested). Each try still has to time out and name its timeout.
  let childPid = 0;
  for (const timeoutMs of [300, 1500, 6000]) {
    const started = performance.now();
    const err = await t.throwsAsync(execPlugin(path, '{}', req(dir), { timeoutMs }), { instanceOf: CniPluginError });
    const elapsed = performance.now() - started;
    t.regex(err.message, new RegExp(`timed out after ${timeoutMs} ms`));
    t.true(elapsed < timeoutMs + 5000, `took ${elapsed} ms`);
    childPid = Number((await readFile(pidFile, 'utf8').catch(() => '')).trim());
    if (childPid > 0) break;
    t.log(`the plugin was killed after ${timeoutMs} ms before it had started its child; again with a longer timeout`);
  }
  t.true(childPid > 0, 'the plugin never got to start its child');
  // The child got SIGKILL with its process group (it may linger as a zombie of its reaper, never
  // running). The signal is sent before execPlugin returns, but the kernel tears the process down
  // asynchronously: give it a moment to reach the state.
  const state = await settledState(childPid);
  t.true(state === 'gone' || state === 'Z', `child state ${state}`);
});

// ---- the plugin spawner (src/cni/spawner.ts): what the agent's hot path relies on ----

const ROOT = fileURLToPath(new URL('../..', import.meta.url));

async function waitForFile(path: string, ms = 10_000): Promise<string> {
  const deadline = performance.now() + ms;
  for (;;) {
    const text = await readFile(path, 'utf8').catch(() => '');
    if (text.endsWith('\n')) return text.trim();
    if (performance.now() > deadline) throw new Error(`timed out waiting for ${path}`);
    await sleep(10);
  }
}

test('the plugin gets exactly the seven variables: its whole initial environment', async (t) => {
  const dir = await freshDir();
  const out = join(dir, 'environ');
  // /proc/<pid>/environ is what execve received, before the shell adds anything of its own.
  const path = await writeScript(dir, 'envdump', `tr '\\0' '\\n' < /proc/$$/environ > ${shQuote(out)}\nprintf '{}'`);
  process.env.KCN_LEAK_CHECK_2 = 'must-not-reach-the-plugin';
  t.teardown(() => {
    delete process.env.KCN_LEAK_CHECK_2;
  });
  await execPlugin(path, '{}', { command: 'CHECK', containerId: 'c', netns: '/n', ifName: 'eth1', args: [['A', 'b']], path: [dir] });
  const lines = (await readFile(out, 'utf8'))
    .split('\n')
    .filter((l) => l !== '')
    .sort();
  t.deepEqual(lines, [
    'CNI_ARGS=A=b',
    'CNI_COMMAND=CHECK',
    'CNI_CONTAINERID=c',
    'CNI_IFNAME=eth1',
    'CNI_NETNS=/n',
    `CNI_PATH=${dir}`,
    `PATH=${process.env.PATH ?? ''}`,
  ]);
});

test('32 concurrent execs each get their own stdin and environment and return their own output', async (t) => {
  const dir = await freshDir();
  const path = await writeScript(
    dir,
    'echoer',
    `printf '{"id":"%s","conf":' "$CNI_CONTAINERID"\ncat\nprintf '}'\necho "log $CNI_CONTAINERID" >&2`,
  );
  const results = await Promise.all(
    Array.from({ length: 32 }, (_, i) =>
      execPlugin(path, JSON.stringify({ cniVersion: '1.0.0', n: i }), { ...req(dir), containerId: `ctr-${i}` }),
    ),
  );
  for (const [i, r] of results.entries()) t.deepEqual(r, { id: `ctr-${i}`, conf: { cniVersion: '1.0.0', n: i } });
});

test('1 MiB of stdin comes back as 1 MiB of stdout; a large stderr is kept whole', async (t) => {
  const dir = await freshDir();
  const cat = await writeScript(dir, 'cat', 'exec cat');
  const conf = { cniVersion: '1.0.0', name: 'n', type: 'cat', pad: 'é'.repeat(1 << 19) }; // 1 MiB of UTF-8 in pad
  t.deepEqual(await execPlugin(cat, JSON.stringify(conf), req(dir)), conf);
  const noisy = await writeScript(dir, 'noisy', `cat >/dev/null\nhead -c 300000 /dev/zero | tr '\\0' e >&2\nexit 4`);
  const err = await t.throwsAsync(execPlugin(noisy, '{}', req(dir)), { instanceOf: CniPluginError });
  t.is(err.stderr, 'e'.repeat(300000));
  t.regex(err.message, /exit status 4: e+$/);
});

test('a plugin killed by a signal is "killed by SIGxxx"', async (t) => {
  const dir = await freshDir();
  const path = await writeScript(dir, 'suicide', 'kill -TERM $$');
  const err = await t.throwsAsync(execPlugin(path, '{}', req(dir)), { instanceOf: CniPluginError });
  t.regex(err.message, /killed by SIGTERM/);
});

test('each plugin runs in a process group of its own, started by the spawner (or the agent with KUBENET_PLUGIN_EXEC=execa)', async (t) => {
  const dir = await freshDir();
  const path = await writeScript(dir, 'who', `printf '{"pid":%s,"ppid":%s,"pgid":%s}' $$ $PPID $(ps -o pgid= -p $$)`);
  const a = (await execPlugin(path, '{}', req(dir))) as { pid: number; ppid: number | undefined; pgid: number };
  t.is(a.pgid, a.pid);
  t.is(a.ppid, sharedSpawner().pid);
  t.not(a.ppid, process.pid);
  const b = (await execPlugin(path, '{}', req(dir), { via: 'execa' })) as { pid: number; ppid: number; pgid: number };
  t.is(b.pgid, b.pid);
  t.is(b.ppid, process.pid);
  process.env.KUBENET_PLUGIN_EXEC = 'execa';
  try {
    const c = (await execPlugin(path, '{}', req(dir))) as { ppid: number };
    t.is(c.ppid, process.pid);
  } finally {
    delete process.env.KUBENET_PLUGIN_EXEC;
  }
});

test.serial('no descriptor is left open in the agent after 200 execs (successes, failures, missing binaries, timeouts)', async (t) => {
  const dir = await freshDir();
  const ok = await writeScript(dir, 'ok', printing({ cniVersion: '1.0.0' }));
  const bad = await writeScript(dir, 'bad', printing('', 3, 'nope'));
  const hang = await writeScript(dir, 'hang', 'sleep 30 & wait');
  await execPlugin(ok, '{}', req(dir)); // the spawner's own pipes are opened once, here
  const count = async () => (await readdir('/proc/self/fd')).length;
  const before = await count();
  for (let i = 0; i < 200; i++) {
    if (i % 20 === 5) await t.throwsAsync(execPlugin(bad, '{}', req(dir)), { instanceOf: CniPluginError });
    else if (i % 50 === 7) await t.throwsAsync(execPlugin(join(dir, 'missing'), '{}', req(dir)), { message: /ENOENT/ });
    else if (i % 100 === 9) await t.throwsAsync(execPlugin(hang, '{}', req(dir), { timeoutMs: 50 }), { message: /timed out/ });
    else t.deepEqual(await execPlugin(ok, '{}', req(dir)), { cniVersion: '1.0.0' });
  }
  t.is(await count(), before);
});

/** A plugin that starts a delegate (as bridge starts host-local) and waits for it; both write their pid. */
async function slowChain(dir: string) {
  const delegate = await writeScript(dir, 'delegate', `echo $$ > ${shQuote(join(dir, 'delegate.pid'))}\nexec sleep 60`);
  const plugin = await writeScript(dir, 'slow', `echo $$ > ${shQuote(join(dir, 'plugin.pid'))}\n${shQuote(delegate)} &\nwait`);
  return {
    plugin,
    pids: async () => [Number(await waitForFile(join(dir, 'plugin.pid'))), Number(await waitForFile(join(dir, 'delegate.pid')))],
  };
}

test('plugins and their delegates die with the agent when it is SIGKILLed mid-exec', async (t) => {
  const dir = await freshDir();
  const chain = await slowChain(dir);
  const script = `
import { execPlugin } from './src/cni/exec.ts';
import { sharedSpawner } from './src/cni/spawner.ts';
execPlugin(process.env.PLUGIN, '{}', { command: 'ADD', containerId: 'c', netns: '/n', ifName: 'eth0', path: [] }, { timeoutMs: 60_000 }).catch(() => undefined);
console.log('spawner ' + sharedSpawner().pid);
`;
  const agent = spawn(process.execPath, ['--import', 'tsx', '--input-type=module', '-e', script], {
    cwd: ROOT,
    env: { ...process.env, PLUGIN: chain.plugin },
    stdio: ['ignore', 'pipe', 'inherit'],
  });
  t.teardown(() => void agent.kill('SIGKILL'));
  let out = '';
  agent.stdout.on('data', (b: Buffer) => (out += b.toString()));
  const [pluginPid, delegatePid] = await chain.pids();
  // The agent prints the spawner's pid as it starts the plugin; the line may arrive after the pid files.
  const spawnerPid = Number((await until("the spawner pid on the agent's stdout", () => /spawner (\d+)/.exec(out)))[1]);
  const everyone = [pluginPid ?? 0, delegatePid ?? 0, spawnerPid];
  t.teardown(() => everyone.forEach((p) => void tryKill(p)));
  t.true(spawnerPid > 0, out);
  // Alive: sleeping, or running at the instant of the read (the spawner may be handling a message).
  for (const pid of everyone) {
    const st = await procState(pid);
    t.true(st === 'S' || st === 'R' || st === 'D', `pid ${pid} runs before the agent dies (state ${st})`);
  }
  const exited = new Promise((ok) => agent.once('exit', ok));
  agent.kill('SIGKILL');
  await exited;
  const started = performance.now();
  for (const pid of everyone) {
    const st = await settledState(pid, 2000);
    t.true(st === 'gone' || st === 'Z', `pid ${pid} is ${st} ${Math.round(performance.now() - started)} ms after the agent died`);
  }
});

// Serial: it kills the shared spawner, which would fail the concurrent tests' runs too.
test.serial(
  'when the spawner itself dies, the run in flight fails with a CniPluginError and the next exec starts a new spawner',
  async (t) => {
    const dir = await freshDir();
    const chain = await slowChain(dir);
    const running = execPlugin(chain.plugin, '{}', req(dir), { timeoutMs: 30_000 });
    const [pluginPid, delegatePid] = await chain.pids();
    t.teardown(() => [pluginPid, delegatePid].forEach((p) => void tryKill(p ?? 0)));
    const first = sharedSpawner().pid ?? 0;
    process.kill(first, 'SIGKILL');
    const err = await t.throwsAsync(running, { instanceOf: CniPluginError });
    t.regex(err.message, /plugin spawner .* exited \(SIGKILL\)/);
    // The plugin had PR_SET_PDEATHSIG towards the spawner (its delegate, started by it, had not).
    const st = await settledState(pluginPid ?? 0);
    t.true(st === 'gone' || st === 'Z', `plugin is ${st}`);
    const ok = await writeScript(dir, 'ok', printing({ cniVersion: '1.0.0' }));
    t.deepEqual(await execPlugin(ok, '{}', req(dir)), { cniVersion: '1.0.0' });
    t.not(sharedSpawner().pid, first);
  },
);

function tryKill(pid: number): void {
  try {
    if (pid > 0) process.kill(pid, 'SIGKILL');
  } catch {
    // gone
  }
}
