/**
 * CniRuntime's libcni semantics, observed through recording fake plugins (/bin/sh scripts that
 * store each call's stdin and environment; a process boundary): name/cniVersion injection,
 * prevResult chaining and conversion, runtimeConfig only for declared capabilities, CHECK and
 * DEL with the cached result, DEL in reverse order, the cache entry's format and lifetime,
 * delFromCache after a restart. No root or kernel state needed.
 */
import test from 'ava';
import { mkdir, mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { existsSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { CniPluginError, ConfigError } from '../../src/errors.js';
import { NoCachedResultError, PluginNotFoundError, UnsupportedVersionError } from '../../src/cni/errors.js';
import { convertResult } from '../../src/cni/result.js';
import { CniRuntime } from '../../src/cni/runtime.js';
import type { CacheEntry, NetConf, NetConfList, RuntimeConf } from '../../src/cni/types.js';
import { PARSED, WIRE } from '../kit/cni-fixtures.js';
import { calls, recording, writeScript } from '../kit/fake-plugins.js';

let root = '';
test.before(async () => {
  root = await mkdtemp(join(tmpdir(), 'kcn-rtf-'));
});
test.after.always(async () => {
  if (root) await rm(root, { recursive: true, force: true });
});

let n = 0;
/** A bin dir with recording fakes `first` (answers 0.4.0-shaped), `second` (answers 1.0.0) and a cache dir. */
async function setup() {
  const dir = join(root, `s${++n}`);
  const bin = join(dir, 'bin');
  const rec = join(dir, 'rec');
  const cacheDir = join(dir, 'cache');
  await mkdir(bin, { recursive: true });
  await mkdir(rec, { recursive: true });
  await writeScript(bin, 'first', recording(rec, 'first', WIRE['0.4.0']));
  await writeScript(bin, 'second', recording(rec, 'second', WIRE['1.0.0']));
  const runtime = new CniRuntime({ binDirs: [bin], cacheDir });
  const cachePath = (net: string, rt: RuntimeConf) => join(cacheDir, 'results', `${net}-${rt.containerId}-${rt.ifName}`);
  return { dir, bin, rec, cacheDir, runtime, cachePath };
}

const rt: RuntimeConf = {
  containerId: 'c0ffee',
  netns: '/var/run/netns/kcn-fake',
  ifName: 'eth0',
  args: [
    ['IgnoreUnknown', '1'],
    ['K8S_POD_NAME', 'web-0'],
  ],
  capabilityArgs: {
    portMappings: [{ hostPort: 8080, containerPort: 80, protocol: 'tcp' }],
    bandwidth: { ingressRate: 1000 },
    ipRanges: [],
  },
};

function list(cniVersion = '1.0.0', extra: Partial<NetConfList> = {}): NetConfList {
  return {
    cniVersion,
    name: 'chain',
    plugins: [
      { type: 'first', knob: 1 },
      { type: 'second', capabilities: { portMappings: true, bandwidth: false } },
    ],
    ...extra,
  };
}

test('ADD of a list: injection, prevResult chaining (converted), runtimeConfig for declared capabilities, cache entry', async (t) => {
  const s = await setup();
  const l = list('1.0.0');
  const result = await s.runtime.addNetworkList(l, rt);
  t.deepEqual(result, PARSED['1.0.0']);
  const cs = await s.runtime.getCachedResult('chain', rt);
  t.deepEqual(cs, PARSED['1.0.0']);

  const [a, b, ...rest] = await calls(s.rec);
  t.is(rest.length, 0);
  t.is(a?.plugin, 'first');
  t.deepEqual(a?.stdin, { type: 'first', knob: 1, cniVersion: '1.0.0', name: 'chain' });
  t.is(b?.plugin, 'second');
  // first answered in 0.4.0 shape; second gets it as 1.0.0 (no ips[].version).
  t.deepEqual(b?.stdin, {
    type: 'second',
    capabilities: { portMappings: true, bandwidth: false },
    cniVersion: '1.0.0',
    name: 'chain',
    prevResult: convertResult(PARSED['0.4.0']!, '1.0.0'),
    runtimeConfig: { portMappings: rt.capabilityArgs?.portMappings },
  });
  t.false(JSON.stringify(b?.stdin.prevResult).includes('"version"'));
  for (const c of [a, b]) {
    t.is(c?.env.CNI_COMMAND, 'ADD');
    t.is(c?.env.CNI_CONTAINERID, 'c0ffee');
    t.is(c?.env.CNI_NETNS, '/var/run/netns/kcn-fake');
    t.is(c?.env.CNI_IFNAME, 'eth0');
    t.is(c?.env.CNI_ARGS, 'IgnoreUnknown=1;K8S_POD_NAME=web-0');
    t.is(c?.env.CNI_PATH, s.bin);
  }

  const entry = JSON.parse(await readFile(s.cachePath('chain', rt), 'utf8')) as CacheEntry;
  t.deepEqual(entry, {
    kind: 'cniCacheV1',
    containerId: 'c0ffee',
    config: Buffer.from(JSON.stringify(l)).toString('base64'),
    ifName: 'eth0',
    networkName: 'chain',
    netns: '/var/run/netns/kcn-fake',
    cniArgs: rt.args,
    capabilityArgs: rt.capabilityArgs,
    result: WIRE['1.0.0'],
  });
});

test('chained prevResult in a 0.4.0 list carries ips[].version; results are cached in the list version', async (t) => {
  const s = await setup();
  await s.runtime.addNetworkList(list('0.4.0'), rt);
  const [, b] = await calls(s.rec);
  t.deepEqual(b?.stdin.prevResult, WIRE['0.4.0']);
  const entry = JSON.parse(await readFile(s.cachePath('chain', rt), 'utf8')) as CacheEntry;
  t.deepEqual(entry.result, convertResult(PARSED['1.0.0']!, '0.4.0'));
  t.true(JSON.stringify(entry.result).includes('"version":"4"'));
});

test('CHECK passes the cached result to every plugin in order; DEL runs in reverse with it and removes the entry', async (t) => {
  const s = await setup();
  const l = list('1.0.0');
  await s.runtime.addNetworkList(l, rt);
  await s.runtime.checkNetworkList(l, rt);
  await s.runtime.delNetworkList(l, rt);
  const cs = await calls(s.rec);
  t.deepEqual(
    cs.map((c) => `${c.plugin} ${c.command}`),
    ['first ADD', 'second ADD', 'first CHECK', 'second CHECK', 'second DEL', 'first DEL'],
  );
  for (const c of cs.slice(2)) t.deepEqual(c.stdin.prevResult, WIRE['1.0.0'], `${c.plugin} ${c.command}`);
  t.false(existsSync(s.cachePath('chain', rt)));
  t.is(await s.runtime.getCachedResult('chain', rt), undefined);
  // DEL again: nothing cached, no prevResult, still success.
  await s.runtime.delNetworkList(l, rt);
  const again = (await calls(s.rec)).slice(6);
  t.deepEqual(
    again.map((c) => `${c.plugin} ${c.command}`),
    ['second DEL', 'first DEL'],
  );
  t.false('prevResult' in (again[0]?.stdin ?? {}));
});

test('a failed DEL keeps the cache entry and stops; the retry runs every plugin again', async (t) => {
  const s = await setup();
  const l = list('1.0.0');
  await s.runtime.addNetworkList(l, rt);
  await writeFile(join(s.rec, 'fail-second-DEL'), '');
  const err = await t.throwsAsync(s.runtime.delNetworkList(l, rt), { instanceOf: CniPluginError });
  t.is(err.plugin, 'second');
  t.is(err.code, 11);
  t.true(existsSync(s.cachePath('chain', rt)));
  t.deepEqual(
    (await calls(s.rec)).map((c) => `${c.plugin} ${c.command}`),
    ['first ADD', 'second ADD', 'second DEL'],
  );
  await rm(join(s.rec, 'fail-second-DEL'));
  await s.runtime.delNetworkList(l, rt);
  t.false(existsSync(s.cachePath('chain', rt)));
});

test('delFromCache after a restart uses the cached config, CNI_ARGS and capability args; false when nothing is cached', async (t) => {
  const s = await setup();
  await s.runtime.addNetworkList(list('1.0.0'), rt);
  const fresh = new CniRuntime({ binDirs: [s.bin], cacheDir: s.cacheDir });
  // The caller's args and capabilities changed since ADD; the cached ones are used, its netns ('' = gone) too.
  const now: RuntimeConf = { containerId: rt.containerId, ifName: rt.ifName, netns: '', args: [['K8S_POD_NAME', 'other']] };
  t.true(await fresh.delFromCache('chain', now));
  const dels = (await calls(s.rec)).slice(2);
  t.deepEqual(
    dels.map((c) => `${c.plugin} ${c.command}`),
    ['second DEL', 'first DEL'],
  );
  t.is(dels[0]?.env.CNI_ARGS, 'IgnoreUnknown=1;K8S_POD_NAME=web-0');
  t.is(dels[0]?.env.CNI_NETNS, '');
  t.deepEqual(dels[0]?.stdin.runtimeConfig, { portMappings: rt.capabilityArgs?.portMappings });
  t.deepEqual(dels[0]?.stdin.prevResult, WIRE['1.0.0']);
  t.false(existsSync(s.cachePath('chain', rt)));
  t.false(await fresh.delFromCache('chain', now));
  t.is((await calls(s.rec)).length, 4);
});

test('single network config: ADD sends the config bytes as they are and caches them; DEL uses the cached result', async (t) => {
  const s = await setup();
  const conf: NetConf = { cniVersion: '1.0.0', name: 'single', type: 'second', mtu: 1400 };
  const r1 = { ...rt, capabilityArgs: {} };
  t.deepEqual(await s.runtime.addNetwork(conf, r1), PARSED['1.0.0']);
  const [add] = await calls(s.rec);
  t.deepEqual(add?.stdin, conf);
  const entry = JSON.parse(await readFile(s.cachePath('single', r1), 'utf8')) as CacheEntry;
  t.is(Buffer.from(entry.config, 'base64').toString('utf8'), JSON.stringify(conf));
  t.false('capabilityArgs' in entry);
  await s.runtime.checkNetwork(conf, r1);
  t.true(await s.runtime.delFromCache('single', r1));
  const cs = await calls(s.rec);
  t.deepEqual(
    cs.map((c) => c.command),
    ['ADD', 'CHECK', 'DEL'],
  );
  t.deepEqual(cs[2]?.stdin, { ...conf, prevResult: WIRE['1.0.0'] });
  await s.runtime.delNetwork(conf, r1);
});

test('DEL of a 0.3.1 network gets no prevResult (cached results on DEL are 0.4.0+); CHECK refuses < 0.4.0', async (t) => {
  const s = await setup();
  const l = list('0.3.1');
  await s.runtime.addNetworkList(l, rt);
  await t.throwsAsync(s.runtime.checkNetworkList(l, rt), { instanceOf: UnsupportedVersionError });
  await s.runtime.delNetworkList(l, rt);
  const dels = (await calls(s.rec)).filter((c) => c.command === 'DEL');
  t.is(dels.length, 2);
  for (const d of dels) t.false('prevResult' in d.stdin);
  t.false(existsSync(s.cachePath('chain', rt)));
});

test('CHECK without a cached result is a NoCachedResultError; disableCheck skips CHECK entirely', async (t) => {
  const s = await setup();
  await t.throwsAsync(s.runtime.checkNetworkList(list('1.0.0'), rt), { instanceOf: NoCachedResultError });
  await s.runtime.checkNetworkList(list('1.0.0', { disableCheck: true }), rt);
  t.is((await calls(s.rec)).length, 0);
});

test('a corrupt cache entry: DEL proceeds without prevResult and removes it; delFromCache answers false', async (t) => {
  const s = await setup();
  const l = list('1.0.0');
  await mkdir(join(s.cacheDir, 'results'), { recursive: true });
  await writeFile(s.cachePath('chain', rt), '{"kind":"cniCacheV1", trunc');
  t.false(await s.runtime.delFromCache('chain', rt));
  t.false(existsSync(s.cachePath('chain', rt)));
  await writeFile(s.cachePath('chain', rt), 'garbage');
  await s.runtime.delNetworkList(l, rt);
  t.false(existsSync(s.cachePath('chain', rt)));
  for (const c of await calls(s.rec)) t.false('prevResult' in c.stdin);
});

test('invalid input fails before any plugin runs', async (t) => {
  const s = await setup();
  await t.throwsAsync(s.runtime.addNetworkList(list('1.0.0'), { ...rt, containerId: '../etc' }), { instanceOf: ConfigError });
  await t.throwsAsync(s.runtime.addNetworkList(list('1.0.0'), { ...rt, ifName: 'a-name-longer-than-15' }), { instanceOf: ConfigError });
  await t.throwsAsync(s.runtime.addNetworkList({ ...list('1.0.0'), name: 'bad/name' }, rt), { instanceOf: ConfigError });
  await t.throwsAsync(s.runtime.addNetworkList(list('2.0.0'), rt), { instanceOf: UnsupportedVersionError });
  await t.throwsAsync(s.runtime.addNetworkList({ ...list('1.0.0'), plugins: [] }, rt), { instanceOf: ConfigError });
  await t.throwsAsync(s.runtime.addNetwork({ cniVersion: '1.0.0', name: 'x', type: 'missing' }, rt), {
    instanceOf: PluginNotFoundError,
    message: new RegExp(s.bin),
  });
  t.is((await calls(s.rec)).length, 0);
});

test('a plugin failing ADD is a CniPluginError and nothing is cached', async (t) => {
  const s = await setup();
  await writeFile(join(s.rec, 'fail-second-ADD'), '');
  const err = await t.throwsAsync(s.runtime.addNetworkList(list('1.0.0'), rt), { instanceOf: CniPluginError });
  t.is(err.plugin, 'second');
  t.is(err.command, 'ADD');
  t.false(existsSync(s.cachePath('chain', rt)));
});

test('an ADD result that is not a valid result is a CniPluginError', async (t) => {
  const s = await setup();
  await writeScript(s.bin, 'bogus', recording(s.rec, 'bogus', { cniVersion: '1.0.0', ips: [{ address: 'nope' }] }));
  const err = await t.throwsAsync(s.runtime.addNetwork({ cniVersion: '1.0.0', name: 'b', type: 'bogus' }, rt), {
    instanceOf: CniPluginError,
  });
  t.regex(err.message, /ips\[0\]\.address/);
});

test('version() reports what the plugin supports', async (t) => {
  const s = await setup();
  await writeScript(s.bin, 'ver', `cat >/dev/null\nprintf '%s' '{"cniVersion":"1.0.0","supportedVersions":["0.3.1","0.4.0","1.0.0"]}'`);
  await writeScript(s.bin, 'old', `cat >/dev/null\nprintf '%s' '{"cniVersion":"0.2.0"}'`);
  t.deepEqual(await s.runtime.version('ver'), { cniVersion: '1.0.0', supportedVersions: ['0.3.1', '0.4.0', '1.0.0'] });
  t.deepEqual(await s.runtime.version('old'), { cniVersion: '0.2.0', supportedVersions: ['0.1.0', '0.2.0'] });
});
