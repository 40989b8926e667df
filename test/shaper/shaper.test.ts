/**
 * Shaper against the real kernel, without traffic: objects installed, replaced, removed, class ids
 * reused, restart recovery and the orphan sweep. Each test has its own bridge, namespaces, ifb and
 * state dir, removed in t.teardown even on failure.
 */
import test, { type ExecutionContext } from 'ava';
import { execa } from 'execa';
import { existsSync } from 'node:fs';
import { readdir } from 'node:fs/promises';
import { ConfigError } from '../../src/errors.js';
import { bandwidthFromAnnotations, EGRESS_ANNOTATION } from '../../src/shaper/quantity.js';
import { Shaper, type PodShaping } from '../../src/shaper/tc.js';
import { isRoot, makeTmpDir, rmrf, uniq } from '../helpers/kernel.js';
import { makeTopology, type TopoPod, type Topology } from './topo.js';

const skip = isRoot ? undefined : 'needs root (tc, ifb, network namespaces)';
const kTest = skip ? test.skip : test;

async function tc(args: string[]): Promise<string> {
  const r = await execa('tc', args, { reject: false });
  return r.stdout;
}

interface Env {
  topo: Topology;
  shaper: Shaper;
  ifb: string;
  stateDir: string;
}

async function setup(t: ExecutionContext, pods = 3): Promise<Env> {
  const ifb = `kif${uniq(8)}`;
  const stateDir = await makeTmpDir('kshaper');
  const topo = await makeTopology(pods);
  const shaper = new Shaper({ ifbName: ifb, stateDir });
  t.teardown(async () => {
    shaper.close();
    await new Shaper({ ifbName: ifb, stateDir }).reset().catch(() => undefined);
    await execa('ip', ['link', 'del', ifb], { reject: false });
    await topo.destroy();
    await rmrf(stateDir);
  });
  await shaper.init();
  return { topo, shaper, ifb, stateDir };
}

function podOf(p: TopoPod, limits: PodShaping['limits'], dual = true): PodShaping {
  return { id: p.id, hostVeth: p.hostVeth, ips: dual ? [p.ip4, p.ip6] : [p.ip4], limits };
}

/** Everything of one pod the kernel holds: veth qdiscs/filters and ifb classes/filters pointing at its class. */
async function podObjects(env: Env, p: TopoPod, classId: number | undefined) {
  const vethQdiscs = (await tc(['qdisc', 'show', 'dev', p.hostVeth])).split('\n').filter((l) => l && !l.startsWith('qdisc noqueue'));
  const vethFilters = (await tc(['filter', 'show', 'dev', p.hostVeth, 'ingress'])).split('\n').filter((l) => l.includes('fh'));
  const hexId = classId?.toString(16);
  const ifbClasses = hexId ? (await tc(['class', 'show', 'dev', env.ifb])).split('\n').filter((l) => l.startsWith(`class htb 1:${hexId} `)) : [];
  const ifbFilters = hexId ? (await tc(['filter', 'show', 'dev', env.ifb, 'parent', '1:'])).split('\n').filter((l) => l.includes(`flowid 1:${hexId} `)) : [];
  return { vethQdiscs, vethFilters, ifbClasses, ifbFilters };
}

async function allIfbPodFilters(ifb: string): Promise<string[]> {
  return (await tc(['filter', 'show', 'dev', ifb, 'parent', '1:'])).split('\n').filter((l) => l.includes('flowid 1:'));
}

kTest('ensure installs both directions with explicit quantum; remove leaves nothing of the pod', async (t) => {
  const env = await setup(t);
  const a = env.topo.pods[0]!;
  await env.shaper.ensure(podOf(a, { ingress: 20e6, egress: 10e6 }));
  const id = env.shaper.classIdOf(a.id);
  t.is(id, 1);
  const objs = await podObjects(env, a, id);
  t.regex(objs.vethQdiscs.join('\n'), /qdisc tbf 1: root .*rate 20Mbit/);
  t.regex(objs.vethQdiscs.join('\n'), /qdisc ingress ffff:/);
  t.is(objs.vethFilters.length, 2); // the u32 root ht line + the redirect node
  t.regex(await tc(['filter', 'show', 'dev', a.hostVeth, 'ingress']), /mirred \(Egress Redirect to device kif/);
  t.is(objs.ifbClasses.length, 1);
  t.regex(objs.ifbClasses[0]!, /rate 10Mbit ceil 10Mbit/);
  t.is(objs.ifbFilters.length, 2, 'one /32 and one /128 filter');
  t.regex(await tc(['-d', 'class', 'show', 'dev', env.ifb]), /quantum 1514 /);
  t.deepEqual(env.shaper.list(), [{ id: a.id, hostVeth: a.hostVeth, ips: [a.ip4, a.ip6], limits: { ingress: 20e6, egress: 10e6 } }]);
  // txqueuelen of the ifb is not zero.
  t.not((await execa('cat', [`/sys/class/net/${env.ifb}/tx_queue_len`])).stdout.trim(), '0');

  await env.shaper.remove(a.id);
  const after = await podObjects(env, a, id);
  t.deepEqual(after, { vethQdiscs: [], vethFilters: [], ifbClasses: [], ifbFilters: [] });
  t.deepEqual(env.shaper.list(), []);
  t.deepEqual(await readdir(env.stateDir), []);
  // The shared ifb is kept (documented); removing an unknown pod succeeds.
  t.true(existsSync(`/sys/class/net/${env.ifb}`));
  await t.notThrowsAsync(env.shaper.remove(a.id));
  await t.notThrowsAsync(env.shaper.remove('never-seen'));
});

kTest('re-ensure replaces rates, switches directions, and empty limits remove', async (t) => {
  const env = await setup(t);
  const a = env.topo.pods[0]!;
  await env.shaper.ensure(podOf(a, { ingress: 20e6, egress: 10e6 }));
  await env.shaper.ensure(podOf(a, { ingress: 30e6, egress: 5e6 }));
  const id = env.shaper.classIdOf(a.id);
  t.is(id, 1);
  let objs = await podObjects(env, a, id);
  t.regex(objs.vethQdiscs.join('\n'), /rate 30Mbit/);
  t.regex(objs.ifbClasses.join('\n'), /rate 5Mbit ceil 5Mbit/);
  t.is(objs.ifbFilters.length, 2);
  // Idempotent: the same call again changes nothing and does not fail.
  await env.shaper.ensure(podOf(a, { ingress: 30e6, egress: 5e6 }));
  t.is((await allIfbPodFilters(env.ifb)).length, 2);
  // IPv4 only now: the /128 filter goes.
  await env.shaper.ensure(podOf(a, { ingress: 30e6, egress: 5e6 }, false));
  t.is((await allIfbPodFilters(env.ifb)).length, 1);
  // Egress only: the veth root tbf goes.
  await env.shaper.ensure(podOf(a, { egress: 5e6 }));
  objs = await podObjects(env, a, id);
  t.false(objs.vethQdiscs.some((l) => l.includes('tbf')));
  t.is(objs.ifbClasses.length, 1);
  // Ingress only: class, filters and the ingress qdisc go; the class id is freed.
  await env.shaper.ensure(podOf(a, { ingress: 1e6 }));
  objs = await podObjects(env, a, id);
  t.deepEqual(objs.ifbClasses, []);
  t.deepEqual(objs.ifbFilters, []);
  t.false(objs.vethQdiscs.some((l) => l.includes('qdisc ingress')));
  t.regex(objs.vethQdiscs.join('\n'), /rate 1Mbit/);
  t.is(env.shaper.classIdOf(a.id), undefined);
  // Neither direction: everything goes.
  await env.shaper.ensure(podOf(a, {}));
  objs = await podObjects(env, a, id);
  t.deepEqual(objs.vethQdiscs, []);
  t.deepEqual(env.shaper.list(), []);
});

kTest('class ids are unique among live pods and reused after teardown', async (t) => {
  const env = await setup(t, 3);
  const [a, b, c] = env.topo.pods as [TopoPod, TopoPod, TopoPod];
  await Promise.all([a, b, c].map((p) => env.shaper.ensure(podOf(p, { egress: 5e6 }))));
  const ids = [a, b, c].map((p) => env.shaper.classIdOf(p.id));
  t.deepEqual([...ids].sort(), [1, 2, 3]);
  const bId = env.shaper.classIdOf(b.id);
  await env.shaper.remove(b.id);
  await env.shaper.ensure(podOf(b, { egress: 6e6 }));
  t.is(env.shaper.classIdOf(b.id), bId);
  t.is((await tc(['class', 'show', 'dev', env.ifb])).split('\n').filter((l) => l.startsWith('class htb')).length, 3);
  t.is((await allIfbPodFilters(env.ifb)).length, 6);
});

kTest('restart: a new Shaper finds its own objects, no duplicates, gone pods removed, orphans swept', async (t) => {
  const env = await setup(t, 3);
  const [a, b, c] = env.topo.pods as [TopoPod, TopoPod, TopoPod];
  for (const p of [a, b, c]) await env.shaper.ensure(podOf(p, { ingress: 8e6, egress: 4e6 }));
  const before = Object.fromEntries([a, b, c].map((p) => [p.id, env.shaper.classIdOf(p.id)]));
  env.shaper.close();
  // Something (a crashed older process) left a class and a filter no state file claims.
  await execa('tc', ['class', 'add', 'dev', env.ifb, 'parent', '1:', 'classid', '1:7ff', 'htb', 'rate', '1mbit', 'quantum', '1514']);
  await execa('tc', ['filter', 'add', 'dev', env.ifb, 'parent', '1:', 'prio', '10', 'handle', '10:fe:7ff', 'protocol', 'ip', 'u32', 'ht', '10:fe:', 'match', 'ip', 'src', '10.98.250.254/32', 'flowid', '1:7ff']);

  const again = new Shaper({ ifbName: env.ifb, stateDir: env.stateDir });
  t.teardown(() => again.close());
  await again.init();
  t.deepEqual(
    again.list().map((p) => p.id).sort(),
    [a, b, c].map((p) => p.id).sort(),
  );
  for (const p of [a, b, c]) t.is(again.classIdOf(p.id), before[p.id]);
  t.false((await tc(['class', 'show', 'dev', env.ifb])).includes('1:7ff '), 'orphan class swept');
  t.is((await allIfbPodFilters(env.ifb)).length, 6, 'orphan filter swept, ours kept');

  // b is gone after the restart; a and c live with c's rates changed.
  await again.reconcile([podOf(a, { ingress: 8e6, egress: 4e6 }), podOf(c, { ingress: 8e6, egress: 2e6 })]);
  t.deepEqual(again.list().map((p) => p.id).sort(), [a.id, c.id].sort());
  const classes = (await tc(['class', 'show', 'dev', env.ifb])).split('\n').filter((l) => l.startsWith('class htb'));
  t.is(classes.length, 2, 'no duplicated classes');
  t.is((await allIfbPodFilters(env.ifb)).length, 4, 'no duplicated filters');
  t.regex(classes.join('\n'), /rate 2Mbit/);
  const bObjs = await podObjects(env, b, before[b.id]);
  t.deepEqual(bObjs, { vethQdiscs: [], vethFilters: [], ifbClasses: [], ifbFilters: [] });
  t.is((await readdir(env.stateDir)).length, 2);

  // A new pod after restart does not collide with recovered ids.
  await again.ensure(podOf(b, { egress: 3e6 }));
  t.is(again.classIdOf(b.id), before[b.id]);
});

kTest('restart after the ifb was lost: structure rebuilt, known pods restored', async (t) => {
  const env = await setup(t, 2);
  const [a] = env.topo.pods as [TopoPod];
  await env.shaper.ensure(podOf(a, { egress: 4e6 }));
  await execa('ip', ['link', 'del', env.ifb]);
  const again = new Shaper({ ifbName: env.ifb, stateDir: env.stateDir, tcMode: 'exec' });
  await again.init();
  t.regex(await tc(['class', 'show', 'dev', env.ifb]), /class htb 1:1 .*rate 4Mbit/);
  t.is((await allIfbPodFilters(env.ifb)).length, 2);
  // The veth redirect pointed at the old ifb by index: init refreshed it.
  t.regex(await tc(['filter', 'show', 'dev', a.hostVeth, 'ingress']), new RegExp(`Redirect to device ${env.ifb}`));
  await again.reconcile([podOf(a, { egress: 4e6 })]);
  t.regex(await tc(['filter', 'show', 'dev', a.hostVeth, 'ingress']), new RegExp(`Redirect to device ${env.ifb}`));
});

kTest('a veth or ifb re-created under the same name while the tc session runs', async (t) => {
  const env = await setup(t, 1);
  const a = env.topo.pods[0]!;
  await env.shaper.ensure(podOf(a, { ingress: 3e6, egress: 3e6 }));
  t.teardown(() => execa('ip', ['link', 'del', a.hostVeth], { reject: false }));
  // The pod's veth dies and a new one with the same name appears (tc's name cache is now stale).
  await execa('ip', ['link', 'del', a.hostVeth]);
  await execa('ip', ['link', 'add', 'name', a.hostVeth, 'type', 'veth', 'peer', 'name', `kx${uniq(6)}`]);
  await env.shaper.ensure(podOf(a, { ingress: 4e6, egress: 4e6 }));
  t.regex(await tc(['qdisc', 'show', 'dev', a.hostVeth]), /tbf 1: root .*rate 4Mbit/);
  t.regex(await tc(['filter', 'show', 'dev', a.hostVeth, 'ingress']), /Redirect to device/);
  // The shared ifb is deleted under a running shaper: the next egress ensure rebuilds it.
  await execa('ip', ['link', 'del', env.ifb]);
  await env.shaper.ensure(podOf(a, { ingress: 4e6, egress: 5e6 }));
  t.regex(await tc(['class', 'show', 'dev', env.ifb]), /class htb 1:1 .*rate 5Mbit/);
  t.regex(await tc(['filter', 'show', 'dev', a.hostVeth, 'ingress']), new RegExp(`Redirect to device ${env.ifb}`));
  await env.shaper.remove(a.id);
  t.is((await tc(['qdisc', 'show', 'dev', a.hostVeth])).includes('tbf'), false);
});

kTest('invalid input is refused before touching the kernel', async (t) => {
  const env = await setup(t, 1);
  const a = env.topo.pods[0]!;
  t.throws(() => bandwidthFromAnnotations({ [EGRESS_ANNOTATION]: '10 Mbit' }), { instanceOf: ConfigError });
  await t.throwsAsync(env.shaper.ensure({ ...podOf(a, { egress: 1e6 }), ips: ['10.0.0.1/24'] }), { instanceOf: ConfigError });
  await t.throwsAsync(env.shaper.ensure({ ...podOf(a, { egress: 1e6 }), hostVeth: 'this-name-is-too-long' }), { instanceOf: ConfigError });
  await t.throwsAsync(env.shaper.ensure(podOf(a, { egress: -1 })), { instanceOf: ConfigError });
  t.deepEqual(env.shaper.list(), []);
  // A veth that does not exist: the kernel refuses, nothing is left behind, the class id is free again.
  await t.throwsAsync(env.shaper.ensure({ ...podOf(a, { egress: 1e6 }), hostVeth: `kvnone${uniq(4)}` }));
  t.deepEqual(env.shaper.list(), []);
  t.deepEqual(await allIfbPodFilters(env.ifb), []);
  t.is((await tc(['class', 'show', 'dev', env.ifb])).trim(), '');
  await env.shaper.ensure(podOf(a, { egress: 1e6 }));
  t.is(env.shaper.classIdOf(a.id), 1);
});

kTest('reset removes the shared ifb', async (t) => {
  const env = await setup(t, 1);
  await env.shaper.ensure(podOf(env.topo.pods[0]!, { ingress: 2e6, egress: 2e6 }));
  await env.shaper.reset();
  t.false(existsSync(`/sys/class/net/${env.ifb}`));
  t.deepEqual(await podObjects(env, env.topo.pods[0]!, undefined), { vethQdiscs: [], vethFilters: [], ifbClasses: [], ifbFilters: [] });
});
