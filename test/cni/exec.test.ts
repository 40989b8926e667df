/**
 * findPlugin and execPlugin against fake plugins: /bin/sh scripts in a temporary directory (a
 * process boundary). Covers the environment a plugin gets, results of every spec version, CNI
 * error objects, garbage with a non-zero exit, non-JSON output, a hang (timeout, including a
 * child still holding the pipes), and missing binaries. No root or kernel state needed.
 */
import test from 'ava';
import { mkdir, mkdtemp, readFile, rm, writeFile, chmod } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { performance } from 'node:perf_hooks';
import { CniPluginError, ConfigError } from '../../src/errors.js';
import { PluginNotFoundError } from '../../src/cni/errors.js';
import { cniArgsString, execPlugin, findPlugin } from '../../src/cni/exec.js';
import { parseResult } from '../../src/cni/result.js';
import { CNI_VERSIONS } from '../../src/cni/types.js';
import { PARSED, WIRE } from './fixtures.js';
import { calls, printing, recording, writeScript } from './helpers.js';

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
  t.is(cniArgsString([['A', '1'], ['B', 'x=y']]), 'A=1;B=x=y');
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
  const path = await writeScript(dir, 'bridge', printing({ cniVersion: '1.0.0', code: 7, msg: 'invalid network config', details: 'bridge: no "bridge" key' }, 1, 'some log line'));
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
  const path = await writeScript(dir, 'hang', `sleep 30 &\necho $! > ${pidFile}\nwait`);
  const started = performance.now();
  const err = await t.throwsAsync(execPlugin(path, '{}', req(dir), { timeoutMs: 300 }), { instanceOf: CniPluginError });
  const elapsed = performance.now() - started;
  t.regex(err.message, /timed out after 300 ms/);
  t.true(elapsed < 5000, `took ${elapsed} ms`);
  const childPid = Number((await readFile(pidFile, 'utf8')).trim());
  t.true(childPid > 0);
  // The child got SIGKILL with its process group (it may linger as a zombie of its reaper, never running).
  const state = await readFile(`/proc/${childPid}/stat`, 'utf8').then(
    (s) => s.slice(s.lastIndexOf(')') + 2, s.lastIndexOf(')') + 3),
    () => 'gone',
  );
  t.true(state === 'gone' || state === 'Z', `child state ${state}`);
});
