/**
 * Shaper against the real kernel, without traffic: objects installed, replaced, removed, class ids
 * reused, restart recovery and the orphan sweep. Each test has its own bridge, namespaces, ifb and
 * state dir, removed in t.teardown even on failure.
 */
import test, { type ExecutionContext } from 'ava';
import { execa } from 'execa';
import { existsSync } from 'node:fs';
import { ConfigError } from '../../src/errors.js';
import { bandwidthFromAnnotations, EGRESS_ANNOTATION, MAX_BANDWIDTH, MAX_BURST_BITS, MIN_BANDWIDTH } from '../../src/bandwidth/limits.js';
import { interactiveQueueBytes } from '../../src/shaper/sizing.js';
import { Shaper } from '../../src/shaper/tc.js';
import { isRoot, uniq } from '../kit/kernel.js';
import type { TopoPod } from '../kit/topo.js';
import { podOf, shaperEnv, type ShaperEnv } from '../kit/shaper-env.js';

const skip = isRoot ? undefined : 'needs root (tc, ifb, network namespaces)';
const kTest = skip ? test.skip : test;

async function tc(args: string[]): Promise<string> {
  const r = await execa('tc', args, { reject: false });
  return r.stdout;
}

/** A pod's class ids on the ifb (hex): its own, interactive leaf, bulk leaf. */
function ifbIds(classId: number | undefined): string[] {
  return classId ? [classId, classId + 0x800, classId + 0x1000].map((c) => c.toString(16)) : [];
}

/** Everything of one pod the kernel holds: veth qdiscs/classes/filters and ifb classes/filters of its classes. */
async function podObjects(env: ShaperEnv, p: TopoPod, classId: number | undefined) {
  const vethQdiscs = (await tc(['qdisc', 'show', 'dev', p.hostVeth])).split('\n').filter((l) => l && !l.startsWith('qdisc noqueue'));
  const vethClasses = (await tc(['class', 'show', 'dev', p.hostVeth])).split('\n').filter((l) => l.startsWith('class htb'));
  const vethFilters = (await tc(['filter', 'show', 'dev', p.hostVeth, 'ingress'])).split('\n').filter((l) => l.includes('fh'));
  const ids = ifbIds(classId);
  const ifbClasses = (await tc(['class', 'show', 'dev', env.ifb]))
    .split('\n')
    .filter((l) => ids.some((id) => l.startsWith(`class htb 1:${id} `)));
  const ifbFilters = (await tc(['filter', 'show', 'dev', env.ifb, 'parent', '1:']))
    .split('\n')
    .filter((l) => ids.some((id) => l.includes(`flowid 1:${id} `)));
  const ifbLeaves = (await tc(['qdisc', 'show', 'dev', env.ifb]))
    .split('\n')
    .filter((l) => /^qdisc (tbf|bfifo) /.test(l) && ids.some((id) => l.includes(` parent 1:${id} `)));
  return { vethQdiscs, vethClasses, vethFilters, ifbClasses, ifbLeaves, ifbFilters };
}

const NOTHING = { vethQdiscs: [], vethClasses: [], vethFilters: [], ifbClasses: [], ifbLeaves: [], ifbFilters: [] };

/** What a removed pod leaves: its three ifb classes, idle (no leaf qdisc, no filter), for the next pod. */
function idleOnly(t: ExecutionContext, objs: Awaited<ReturnType<typeof podObjects>>, what: string): void {
  t.is(objs.ifbClasses.length, 3, `${what}: its ifb classes stay idle for the next pod`);
  t.deepEqual({ ...objs, ifbClasses: [] }, NOTHING, `${what}: nothing else`);
}

async function allIfbPodFilters(ifb: string): Promise<string[]> {
  return (await tc(['filter', 'show', 'dev', ifb, 'parent', '1:'])).split('\n').filter((l) => l.includes('flowid 1:'));
}

kTest('ensure installs both directions with explicit quantum; remove leaves nothing of the pod but its idle ifb classes', async (t) => {
  const env = await shaperEnv(t);
  const a = env.topo.pods[0]!;
  await env.shaper.ensure(podOf(a, { ingress: 20e6, egress: 10e6 }));
  const id = env.shaper.classIdOf(a.id);
  t.is(id, 1);
  const objs = await podObjects(env, a, id);
  t.regex(objs.vethQdiscs.join('\n'), /qdisc htb 2: root .*default 0x3/);
  t.regex(objs.vethClasses.join('\n'), /class htb 2:1 root rate 20Mbit ceil 20Mbit/);
  t.regex(objs.vethQdiscs.join('\n'), /qdisc ingress ffff:/);
  t.is(objs.vethFilters.length, 2); // the u32 root ht line + the redirect node
  t.regex(await tc(['filter', 'show', 'dev', a.hostVeth, 'ingress']), /mirred \(Egress Redirect to device kif/);
  t.is(objs.ifbClasses.length, 3, 'the pod class and its two leaves');
  t.regex(objs.ifbClasses.join('\n'), /class htb 1:1 root rate 10Mbit ceil 10Mbit/);
  t.is(objs.ifbFilters.length, 4, 'per address (one /32, one /128) an interactive and a bulk node');
  t.regex(await tc(['-d', 'class', 'show', 'dev', env.ifb]), /quantum 1514 /);
  t.deepEqual(env.shaper.list(), [{ id: a.id, hostVeth: a.hostVeth, ips: [a.ip4, a.ip6], limits: { ingress: 20e6, egress: 10e6 } }]);
  // txqueuelen of the ifb is not zero.
  t.not((await execa('cat', [`/sys/class/net/${env.ifb}/tx_queue_len`])).stdout.trim(), '0');

  await env.shaper.remove(a.id);
  idleOnly(t, await podObjects(env, a, id), 'removed');
  t.is(env.shaper.idleClasses(), 1);
  t.deepEqual(env.shaper.list(), []);
  t.deepEqual(env.shaper.states(), [], 'nothing left to keep');
  // The shared ifb is kept (documented); removing an unknown pod succeeds.
  t.true(existsSync(`/sys/class/net/${env.ifb}`));
  await t.notThrowsAsync(env.shaper.remove(a.id));
  await t.notThrowsAsync(env.shaper.remove('never-seen'));
});

kTest('re-ensure replaces rates, switches directions, and empty limits remove', async (t) => {
  const env = await shaperEnv(t);
  const a = env.topo.pods[0]!;
  await env.shaper.ensure(podOf(a, { ingress: 20e6, egress: 10e6 }));
  await env.shaper.ensure(podOf(a, { ingress: 30e6, egress: 5e6 }));
  const id = env.shaper.classIdOf(a.id);
  t.is(id, 1);
  let objs = await podObjects(env, a, id);
  t.regex(objs.vethClasses.join('\n'), /class htb 2:1 root rate 30Mbit/);
  t.regex(objs.ifbClasses.join('\n'), /class htb 1:1 root rate 5Mbit ceil 5Mbit/);
  t.is(objs.ifbFilters.length, 4);
  // Idempotent: the same call again changes nothing and does not fail.
  await env.shaper.ensure(podOf(a, { ingress: 30e6, egress: 5e6 }));
  t.is((await allIfbPodFilters(env.ifb)).length, 4);
  t.is((await podObjects(env, a, id)).vethClasses.length, 3);
  // IPv4 only now: the /128 nodes go.
  await env.shaper.ensure(podOf(a, { ingress: 30e6, egress: 5e6 }, false));
  t.is((await allIfbPodFilters(env.ifb)).length, 2);
  // Egress only: the veth root htb goes.
  await env.shaper.ensure(podOf(a, { egress: 5e6 }));
  objs = await podObjects(env, a, id);
  t.false(objs.vethQdiscs.some((l) => l.includes('htb')));
  t.deepEqual(objs.vethClasses, []);
  t.is(objs.ifbClasses.length, 3);
  // Ingress only: filters, leaves and the ingress qdisc go; the class id goes idle.
  await env.shaper.ensure(podOf(a, { ingress: 1e6 }));
  objs = await podObjects(env, a, id);
  t.is(objs.ifbClasses.length, 3, 'idle, kept for the next pod');
  t.deepEqual(objs.ifbLeaves, []);
  t.deepEqual(objs.ifbFilters, []);
  t.false(objs.vethQdiscs.some((l) => l.includes('qdisc ingress')));
  t.regex(objs.vethClasses.join('\n'), /class htb 2:1 root rate 1Mbit/);
  t.is(env.shaper.classIdOf(a.id), undefined);
  // Neither direction: everything goes.
  await env.shaper.ensure(podOf(a, {}));
  objs = await podObjects(env, a, id);
  t.deepEqual(objs.vethQdiscs, []);
  t.deepEqual(env.shaper.list(), []);
});

kTest('class ids are unique among live pods and reused after teardown', async (t) => {
  const env = await shaperEnv(t, 3);
  const [a, b, c] = env.topo.pods as [TopoPod, TopoPod, TopoPod];
  await Promise.all([a, b, c].map((p) => env.shaper.ensure(podOf(p, { egress: 5e6 }))));
  const ids = [a, b, c].map((p) => env.shaper.classIdOf(p.id));
  t.deepEqual([...ids].sort(), [1, 2, 3]);
  const bId = env.shaper.classIdOf(b.id);
  await env.shaper.remove(b.id);
  await env.shaper.ensure(podOf(b, { egress: 6e6 }));
  t.is(env.shaper.classIdOf(b.id), bId);
  t.is((await tc(['class', 'show', 'dev', env.ifb])).split('\n').filter((l) => l.startsWith('class htb')).length, 9);
  t.is((await allIfbPodFilters(env.ifb)).length, 12);
});

kTest('restart: a new Shaper finds its own objects, no duplicates, gone pods removed, orphans swept', async (t) => {
  const env = await shaperEnv(t, 3);
  const [a, b, c] = env.topo.pods as [TopoPod, TopoPod, TopoPod];
  for (const p of [a, b, c]) await env.shaper.ensure(podOf(p, { ingress: 8e6, egress: 4e6 }));
  const before = Object.fromEntries([a, b, c].map((p) => [p.id, env.shaper.classIdOf(p.id)]));
  env.shaper.close();
  // Something (a crashed older process) left a class and a filter no state file claims.
  await execa('tc', ['class', 'add', 'dev', env.ifb, 'parent', '1:', 'classid', '1:7ff', 'htb', 'rate', '1mbit', 'quantum', '1514']);
  await execa('tc', [
    'filter',
    'add',
    'dev',
    env.ifb,
    'parent',
    '1:',
    'prio',
    '10',
    'handle',
    '10:fe:7ff',
    'protocol',
    'ip',
    'u32',
    'ht',
    '10:fe:',
    'match',
    'ip',
    'src',
    '10.98.250.254/32',
    'flowid',
    '1:7ff',
  ]);

  // What the first process kept of its states (the agent keeps them in its pod records).
  const kept = env.shaper.states();
  const again = new Shaper({ ifbName: env.ifb });
  t.teardown(() => again.close());
  await again.init(kept);
  t.deepEqual(
    again
      .list()
      .map((p) => p.id)
      .sort(),
    [a, b, c].map((p) => p.id).sort(),
  );
  for (const p of [a, b, c]) t.is(again.classIdOf(p.id), before[p.id]);
  t.false((await tc(['class', 'show', 'dev', env.ifb])).includes('1:7ff '), 'orphan class swept');
  t.is((await allIfbPodFilters(env.ifb)).length, 12, 'orphan filter swept, ours kept');

  // b is gone after the restart; a and c live with c's rates changed.
  await again.reconcile([podOf(a, { ingress: 8e6, egress: 4e6 }), podOf(c, { ingress: 8e6, egress: 2e6 })]);
  t.deepEqual(
    again
      .list()
      .map((p) => p.id)
      .sort(),
    [a.id, c.id].sort(),
  );
  const classes = (await tc(['class', 'show', 'dev', env.ifb])).split('\n').filter((l) => l.startsWith('class htb'));
  t.is(classes.length, 9, "no duplicated classes: a's and c's, and b's idle");
  t.is(again.idleClasses(), 1);
  t.is((await allIfbPodFilters(env.ifb)).length, 8, 'no duplicated filters');
  t.regex(classes.join('\n'), /rate 2Mbit/);
  idleOnly(t, await podObjects(env, b, before[b.id]), 'b after the reconcile');
  t.deepEqual(
    again
      .states()
      .map((st) => st.id)
      .sort(),
    [a.id, c.id].sort(),
    'the states to keep: the two live pods',
  );

  // A new pod after restart does not collide with recovered ids.
  await again.ensure(podOf(b, { egress: 3e6 }));
  t.is(again.classIdOf(b.id), before[b.id]);
});

kTest(
  "restart: pods an earlier version shaped get today's bulk leaves (the 1 ms bucket of before issue 32 grows to 3 ms in place)",
  async (t) => {
    const env = await shaperEnv(t, 2);
    const [a] = env.topo.pods as [TopoPod];
    await env.shaper.ensure(podOf(a, { ingress: 200e6, egress: 200e6 }));
    const bulkLeaves = async () => [
      ...(await tc(['qdisc', 'show', 'dev', a.hostVeth])).split('\n').filter((l) => /^qdisc tbf /.test(l)),
      ...(await tc(['qdisc', 'show', 'dev', env.ifb])).split('\n').filter((l) => /^qdisc tbf /.test(l)),
    ];
    const today = await bulkLeaves();
    t.is(today.length, 2, 'one bulk leaf each way');
    // What the earlier version left: the same leaves with a 1 ms bucket.
    const id = env.shaper.classIdOf(a.id) ?? 0;
    env.shaper.close();
    await execa('tc', [
      'qdisc',
      'replace',
      'dev',
      a.hostVeth,
      'parent',
      '2:3',
      'handle',
      '23:',
      'tbf',
      'rate',
      '200gbit',
      'burst',
      '25000b',
      'limit',
      '662500b',
    ]);
    await execa('tc', [
      'qdisc',
      'replace',
      'dev',
      env.ifb,
      'parent',
      `1:${(id + 0x1000).toString(16)}`,
      'handle',
      `${(0x1000 + id).toString(16)}:`,
      'tbf',
      'rate',
      '200gbit',
      'burst',
      '25000b',
      'limit',
      '662500b',
    ]);
    // (tc shows a burst at these leaf rates in coarse steps of its clock; the two must differ still.)
    const old = await bulkLeaves();
    t.is(old.length, 2);
    t.true(
      old.every((l) => !today.includes(l)),
      `the old buckets in place: ${old.join(' | ')}`,
    );
    const again = new Shaper({ ifbName: env.ifb });
    t.teardown(() => again.close());
    await again.init(env.shaper.states());
    t.deepEqual(await bulkLeaves(), today, "today's leaves, nothing else changed");
  },
);

kTest('restart after the ifb was lost: structure rebuilt, known pods restored', async (t) => {
  const env = await shaperEnv(t, 2);
  const [a] = env.topo.pods as [TopoPod];
  await env.shaper.ensure(podOf(a, { egress: 4e6 }));
  await execa('ip', ['link', 'del', env.ifb]);
  const again = new Shaper({ ifbName: env.ifb, tcMode: 'exec' });
  await again.init(env.shaper.states());
  t.regex(await tc(['class', 'show', 'dev', env.ifb]), /class htb 1:1 .*rate 4Mbit/);
  t.is((await allIfbPodFilters(env.ifb)).length, 4);
  // The veth redirect pointed at the old ifb by index: init refreshed it.
  t.regex(await tc(['filter', 'show', 'dev', a.hostVeth, 'ingress']), new RegExp(`Redirect to device ${env.ifb}`));
  await again.reconcile([podOf(a, { egress: 4e6 })]);
  t.regex(await tc(['filter', 'show', 'dev', a.hostVeth, 'ingress']), new RegExp(`Redirect to device ${env.ifb}`));
});

kTest('a veth or ifb re-created under the same name while the tc session runs', async (t) => {
  const env = await shaperEnv(t, 1);
  const a = env.topo.pods[0]!;
  await env.shaper.ensure(podOf(a, { ingress: 3e6, egress: 3e6 }));
  t.teardown(() => execa('ip', ['link', 'del', a.hostVeth], { reject: false }));
  // The pod's veth dies and a new one with the same name appears (tc's name cache is now stale).
  await execa('ip', ['link', 'del', a.hostVeth]);
  await execa('ip', ['link', 'add', 'name', a.hostVeth, 'type', 'veth', 'peer', 'name', `kx${uniq(6)}`]);
  await env.shaper.ensure(podOf(a, { ingress: 4e6, egress: 4e6 }));
  t.regex(await tc(['class', 'show', 'dev', a.hostVeth]), /class htb 2:1 root rate 4Mbit/);
  t.regex(await tc(['filter', 'show', 'dev', a.hostVeth, 'ingress']), /Redirect to device/);
  // The shared ifb is deleted under a running shaper: the next egress ensure rebuilds it.
  await execa('ip', ['link', 'del', env.ifb]);
  await env.shaper.ensure(podOf(a, { ingress: 4e6, egress: 5e6 }));
  t.regex(await tc(['class', 'show', 'dev', env.ifb]), /class htb 1:1 .*rate 5Mbit/);
  t.regex(await tc(['filter', 'show', 'dev', a.hostVeth, 'ingress']), new RegExp(`Redirect to device ${env.ifb}`));
  await env.shaper.remove(a.id);
  t.is((await tc(['qdisc', 'show', 'dev', a.hostVeth])).includes('htb'), false);
});

kTest('invalid input is refused before touching the kernel', async (t) => {
  const env = await shaperEnv(t, 1);
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
  t.notRegex(await tc(['qdisc', 'show', 'dev', env.ifb]), /qdisc (tbf|bfifo) /, 'no leaf of the failed setup');
  await env.shaper.ensure(podOf(a, { egress: 1e6 }));
  t.is(env.shaper.classIdOf(a.id), 1);
});

kTest('reset removes the shared ifb', async (t) => {
  const env = await shaperEnv(t, 1);
  await env.shaper.ensure(podOf(env.topo.pods[0]!, { ingress: 2e6, egress: 2e6 }));
  await env.shaper.reset();
  t.false(existsSync(`/sys/class/net/${env.ifb}`));
  t.deepEqual(await podObjects(env, env.topo.pods[0]!, undefined), NOTHING);
});

interface ClassStat {
  parent: string | undefined;
  prio: number | undefined;
  rate: string;
  ceil: string;
  bytes: number;
  packets: number;
}

/** `tc -s class show` of the htb classes of a device (tc has no JSON for class stats here). */
async function htbClasses(dev: string): Promise<Map<string, ClassStat>> {
  const out = new Map<string, ClassStat>();
  let cur: ClassStat | undefined;
  for (const line of (await tc(['-s', 'class', 'show', 'dev', dev])).split('\n')) {
    const m = /^class htb (\S+) (?:parent (\S+)|root)(?: leaf \S+)?(?: prio (\d+))? rate (\S+) ceil (\S+)/.exec(line);
    if (m) {
      cur = { parent: m[2], prio: m[3] === undefined ? undefined : Number(m[3]), rate: m[4]!, ceil: m[5]!, bytes: 0, packets: 0 };
      out.set(m[1]!, cur);
      continue;
    }
    const s = /^ Sent (\d+) bytes (\d+) pkt/.exec(line);
    if (s && cur) {
      cur.bytes = Number(s[1]);
      cur.packets = Number(s[2]);
      cur = undefined;
    }
  }
  return out;
}

interface JsonFilter {
  protocol: string;
  pref: number;
  options?: { fh?: string; flowid?: string; link?: string; match?: { value: string; mask: string; off: number } };
}

async function jsonFilters(args: string[]): Promise<JsonFilter[]> {
  return JSON.parse((await tc(['-j', 'filter', 'show', ...args])) || '[]') as JsonFilter[];
}

kTest('each direction is a pod class with an interactive (prio 0) and a bulk (prio 1) leaf; u32 picks the leaf', async (t) => {
  const env = await shaperEnv(t, 1);
  const a = env.topo.pods[0]!;
  await env.shaper.ensure(podOf(a, { ingress: 20e6, egress: 10e6 }));
  // Twice more: the veth filters are flushed and re-added, never duplicated.
  await env.shaper.ensure(podOf(a, { ingress: 20e6, egress: 10e6 }));
  await env.shaper.ensure(podOf(a, { ingress: 20e6, egress: 10e6 }));

  // TO the pod: htb 2: on the veth, default -> bulk 2:3.
  const vq = JSON.parse(await tc(['-j', 'qdisc', 'show', 'dev', a.hostVeth])) as Array<{
    kind: string;
    handle: string;
    parent?: string;
    root?: boolean;
    options: Record<string, unknown>;
  }>;
  const root = vq.find((q) => q.root);
  t.is(root?.kind, 'htb');
  t.is(root?.handle, '2:');
  t.is(root?.options.default, '0x3');
  t.like(
    vq.find((q) => q.parent === '2:2'),
    { kind: 'bfifo', handle: '22:', options: { limit: interactiveQueueBytes(20e6) } },
  );
  t.like(
    vq.find((q) => q.parent === '2:3'),
    { kind: 'tbf', handle: '23:' },
  );
  const vc = await htbClasses(a.hostVeth);
  t.like(vc.get('2:1'), { parent: undefined, rate: '20Mbit', ceil: '20Mbit' });
  t.like(vc.get('2:2'), { parent: '2:1', prio: 0, rate: '2Mbit', ceil: '20Mbit' });
  t.like(vc.get('2:3'), { parent: '2:1', prio: 1, rate: '18Mbit', ceil: '20Mbit' });
  const vf = (await jsonFilters(['dev', a.hostVeth, 'parent', '2:'])).filter((f) => f.options?.flowid);
  t.is(vf.length, 7, 'IPv4 and IPv6: small, ICMP, DNS answers; ARP');
  t.true(vf.every((f) => f.options?.flowid === '2:2'));
  t.deepEqual(
    vf.map((f) => `${f.protocol}/${f.pref}`),
    ['ip/1', 'ip/1', 'ip/1', 'ipv6/2', 'ipv6/2', 'ipv6/2', 'arp/3'],
  );
  // IPv4 total length < 512: the u16 at 2 masked with 0xfe00 is 0.
  t.like(vf[0]?.options?.match, { value: '0', mask: 'fe00', off: 0 });

  // FROM the pod: on the ifb, class 1:1 with leaves 1:801 (interactive) and 1:1001 (bulk).
  const ic = await htbClasses(env.ifb);
  t.like(ic.get('1:1'), { parent: undefined, rate: '10Mbit', ceil: '10Mbit' });
  t.like(ic.get('1:801'), { parent: '1:1', prio: 0, rate: '1Mbit', ceil: '10Mbit' });
  t.like(ic.get('1:1001'), { parent: '1:1', prio: 1, rate: '9Mbit', ceil: '10Mbit' });
  const iq = JSON.parse(await tc(['-j', 'qdisc', 'show', 'dev', env.ifb])) as Array<{ kind: string; handle: string; parent?: string }>;
  t.like(
    iq.find((q) => q.parent === '1:801'),
    { kind: 'bfifo', handle: '2001:' },
  );
  t.like(
    iq.find((q) => q.parent === '1:1001'),
    { kind: 'tbf', handle: '1001:' },
  );
  const f = await jsonFilters(['dev', env.ifb, 'parent', '1:']);
  const nodes = (table: string) =>
    f.filter((x) => x.options?.fh?.startsWith(`${table}:`) && x.options.flowid).map((x) => x.options?.flowid);
  t.deepEqual(nodes('12'), ['1:801'], 'IPv4 interactive table: the pod -> its interactive leaf');
  t.deepEqual(nodes('13'), ['1:801'], 'IPv6 interactive table');
  t.deepEqual(nodes('10'), ['1:1001'], 'IPv4 table: the pod -> its bulk leaf');
  t.deepEqual(nodes('11'), ['1:1001'], 'IPv6 table');
  const links = (table: string) => f.filter((x) => x.options?.link === `${table}:`).length;
  t.deepEqual(
    [links('12'), links('13'), links('10'), links('11')],
    [3, 3, 1, 1],
    'shared links: three interactive selectors per family, one catch-all',
  );
});

/** Sends `count` UDP datagrams of `size` payload bytes from port `sport` in `from` to `to`:`dport`. */
async function udp(from: TopoPod, to: string, sport: number, dport: number, size: number, count: number): Promise<void> {
  const script = `const s=require('dgram').createSocket(${to.includes(':') ? "'udp6'" : "'udp4'"});s.bind(${sport},()=>{let n=0;const go=()=>s.send(Buffer.alloc(${size}),${dport},'${to}',()=>{if(++n<${count})go();else s.close();});go();});`;
  await execa('ip', ['netns', 'exec', from.netns, process.execPath, '-e', script]);
}

kTest('packets land in the leaf their kind asks for, both directions, IPv4 and IPv6 (tc -s counters)', async (t) => {
  const env = await shaperEnv(t, 2);
  const [a, b] = env.topo.pods as [TopoPod, TopoPod];
  // Far above what is sent: nothing queues or drops.
  await env.shaper.ensure(podOf(a, { ingress: 100e6, egress: 100e6 }));
  // Resolve neighbours first (ARP / NDP are interactive or unclassified; not counted below).
  await execa('ip', ['netns', 'exec', a.netns, 'ping', '-c', '1', '-W', '2', b.ip4]);
  await execa('ip', ['netns', 'exec', a.netns, 'ping', '-6', '-c', '1', '-W', '2', b.ip6]);
  const dirs = [
    { name: 'from the pod', from: a, to: b, dev: env.ifb, interactive: '1:801', bulk: '1:1001' },
    { name: 'to the pod', from: b, to: a, dev: a.hostVeth, interactive: '2:2', bulk: '2:3' },
  ];
  const cases = [
    { what: 'large UDP', v6: false, sport: 40001, size: 1200, expect: 'bulk' },
    { what: 'large UDP over IPv6', v6: true, sport: 40001, size: 1200, expect: 'bulk' },
    { what: 'small UDP', v6: false, sport: 40002, size: 100, expect: 'interactive' },
    { what: 'small UDP over IPv6', v6: true, sport: 40002, size: 100, expect: 'interactive' },
    { what: 'large DNS answer (UDP from port 53)', v6: false, sport: 53, size: 1200, expect: 'interactive' },
    { what: 'large DNS answer over IPv6', v6: true, sport: 53, size: 1200, expect: 'interactive' },
  ] as const;
  for (const d of dirs) {
    for (const c of cases) {
      const before = await htbClasses(d.dev);
      await udp(d.from, c.v6 ? d.to.ip6 : d.to.ip4, c.sport, 9, c.size, 5);
      const after = await htbClasses(d.dev);
      const delta = (id: string) => (after.get(id)?.packets ?? 0) - (before.get(id)?.packets ?? 0);
      const bytes = (id: string) => (after.get(id)?.bytes ?? 0) - (before.get(id)?.bytes ?? 0);
      if (c.expect === 'bulk') {
        t.true(delta(d.bulk) >= 5, `${d.name}, ${c.what}: ${delta(d.bulk)} packets in the bulk leaf ${d.bulk}`);
        // The interactive leaf may carry the exchange's own small packets (NDP, ICMP errors), not the datagrams.
        t.true(bytes(d.interactive) < c.size, `${d.name}, ${c.what}: ${bytes(d.interactive)} bytes in ${d.interactive}`);
      } else {
        t.true(delta(d.interactive) >= 5, `${d.name}, ${c.what}: ${delta(d.interactive)} packets in the interactive leaf ${d.interactive}`);
        t.is(delta(d.bulk), 0, `${d.name}, ${c.what}: nothing in ${d.bulk}`);
      }
    }
    // Large ICMP (ping -s 1200) is interactive too.
    for (const v6 of [false, true]) {
      const before = await htbClasses(d.dev);
      await execa('ip', [
        'netns',
        'exec',
        d.from.netns,
        'ping',
        ...(v6 ? ['-6'] : []),
        '-q',
        '-c',
        '3',
        '-i',
        '0.01',
        '-s',
        '1200',
        '-W',
        '2',
        v6 ? d.to.ip6 : d.to.ip4,
      ]);
      const after = await htbClasses(d.dev);
      const delta = (id: string) => (after.get(id)?.packets ?? 0) - (before.get(id)?.packets ?? 0);
      t.true(delta(d.interactive) >= 3, `${d.name}, large ICMP${v6 ? 'v6' : ''}: interactive`);
      t.is(delta(d.bulk), 0, `${d.name}, large ICMP${v6 ? 'v6' : ''}: nothing in bulk`);
    }
  }
});

kTest('an earlier layout (tbf root on the veth, ifb without the interactive tables) is replaced in place', async (t) => {
  const env = await shaperEnv(t, 1);
  const a = env.topo.pods[0]!;
  env.shaper.close();
  // What an earlier version left: a tbf 1: root on the veth, and an ifb with only tables 10:/11:.
  const ifb = env.ifb;
  await execa('tc', [
    'qdisc',
    'replace',
    'dev',
    a.hostVeth,
    'root',
    'handle',
    '1:',
    'tbf',
    'rate',
    '5mbit',
    'burst',
    '5kb',
    'limit',
    '30kb',
  ]);
  await execa('tc', ['qdisc', 'del', 'dev', ifb, 'root']);
  const old = [
    `qdisc replace dev ${ifb} root handle 1: htb default 0 direct_qlen 1000`,
    `filter add dev ${ifb} parent 1: prio 10 handle 10: protocol ip u32 divisor 256`,
    `filter add dev ${ifb} parent 1: prio 10 protocol ip u32 match u32 0 0 at 0 hashkey mask 0x000000ff at 12 link 10:`,
    `filter add dev ${ifb} parent 1: prio 11 handle 11: protocol ipv6 u32 divisor 256`,
    `filter add dev ${ifb} parent 1: prio 11 protocol ipv6 u32 match u32 0 0 at 0 hashkey mask 0x000000ff at 20 link 11:`,
  ];
  await execa('tc', ['-batch', '-'], { input: old.join('\n') + '\n' });

  const again = new Shaper({ ifbName: ifb });
  t.teardown(() => again.close());
  await again.init(env.shaper.states());
  await again.ensure(podOf(a, { ingress: 20e6, egress: 10e6 }));
  const root = (
    JSON.parse(await tc(['-j', 'qdisc', 'show', 'dev', a.hostVeth])) as Array<{ kind: string; handle: string; root?: boolean }>
  ).filter((q) => q.root);
  t.deepEqual(
    root.map((q) => `${q.kind} ${q.handle}`),
    ['htb 2:'],
    'the htb is grafted over the old tbf',
  );
  t.false((await tc(['qdisc', 'show', 'dev', a.hostVeth])).includes('tbf 1:'));
  const f = await jsonFilters(['dev', ifb, 'parent', '1:']);
  const tables = f
    .filter((x) => /^1[0-3]:$/.test(x.options?.fh ?? ''))
    .map((x) => x.options?.fh)
    .sort();
  t.deepEqual(tables, ['10:', '11:', '12:', '13:'], 'each table once');
  t.is(f.filter((x) => x.options?.link).length, 8, 'no duplicated links');
  t.is((await allIfbPodFilters(ifb)).length, 4);
});

kTest('the bounds the limits accept install: 1 kbit/s and 10 Tbit/s, with and without the largest burst', async (t) => {
  const env = await shaperEnv(t, 1);
  const p = env.topo.pods[0];
  if (!p) return t.fail('no pod');
  for (const rate of [MIN_BANDWIDTH, MAX_BANDWIDTH]) {
    for (const burst of [undefined, MAX_BURST_BITS]) {
      const limits = { ingress: rate, egress: rate, ...(burst ? { ingressBurst: burst, egressBurst: burst } : {}) };
      await env.shaper.ensure(podOf(p, limits));
      const want = rate === MIN_BANDWIDTH ? /rate 1Kbit ceil 1Kbit/ : /rate 10Tbit ceil 10Tbit/;
      t.regex(await tc(['class', 'show', 'dev', p.hostVeth]), want, `veth class at ${rate} bit/s, burst ${burst ?? 'sized'}`);
      t.regex(await tc(['class', 'show', 'dev', env.ifb]), want, `ifb class at ${rate} bit/s, burst ${burst ?? 'sized'}`);
    }
  }
  await env.shaper.remove(p.id);
});

/** The egress class counters of a device: packets per class id (hex minor). */
async function classPackets(dev: string): Promise<Map<string, number>> {
  return new Map([...(await htbClasses(dev))].map(([id, c]) => [id, c.packets]));
}

kTest('shards: new pods go to the emptiest shard, each redirected to its own ifb, where its traffic is shaped', async (t) => {
  const env = await shaperEnv(t, 5, 3);
  const pods = env.topo.pods.slice(0, 4) as TopoPod[];
  const peer = env.topo.pods[4]!;
  const ifbs = [env.ifb, `${env.ifb}.1`, `${env.ifb}.2`];
  t.deepEqual(env.shaper.ifbs, ifbs);
  for (const ifb of ifbs) t.true(existsSync(`/sys/class/net/${ifb}`), `${ifb} made at init`);
  for (const p of pods) await env.shaper.ensure(podOf(p, { ingress: 50e6, egress: 50e6 }));
  const where = pods.map((p) => env.shaper.ifbOfPod(p.id));
  t.deepEqual(where, [ifbs[0], ifbs[1], ifbs[2], ifbs[0]], 'one each, then the first of the emptiest');
  t.deepEqual(
    pods.map((p) => env.shaper.classIdOf(p.id)),
    [1, 1, 1, 2],
    'class ids are per shard',
  );
  await execa('ip', ['netns', 'exec', peer.netns, 'ping', '-c', '1', '-W', '2', pods[0]!.ip4]);
  for (const [i, p] of pods.entries()) {
    const ifb = where[i]!;
    t.regex(
      await tc(['filter', 'show', 'dev', p.hostVeth, 'ingress']),
      new RegExp(`Redirect to device ${ifb.replace('.', '\\.')}\\)`),
      `${p.id} redirected to ${ifb}`,
    );
    const before = await Promise.all(ifbs.map(classPackets));
    await execa('ip', ['netns', 'exec', p.netns, 'ping', '-c', '1', '-W', '2', peer.ip4]);
    await udp(p, peer.ip4, 40001, 9, 1200, 5);
    const after = await Promise.all(ifbs.map(classPackets));
    const bulk = (env.shaper.classIdOf(p.id)! + 0x1000).toString(16);
    ifbs.forEach((name, k) => {
      const delta = (after[k]!.get(`1:${bulk}`) ?? 0) - (before[k]!.get(`1:${bulk}`) ?? 0);
      if (name === ifb) t.true(delta >= 5, `${p.id}: ${delta} packets in its bulk leaf on ${name}`);
      else t.is(delta, 0, `${p.id}: nothing in 1:${bulk} of ${name}`);
    });
  }
  // The counters read each shard: every pod's egress is there, with what it sent.
  const counters = new Map((await env.shaper.counters()).pods.map((c) => [c.id, c]));
  for (const p of pods) t.true((counters.get(p.id)?.egress?.packets ?? 0) >= 5, `${p.id}: its egress counted from its shard`);
  // Removal idles the class on the pod's own shard, and the emptiest shard takes the next pod.
  await env.shaper.remove(pods[1]!.id);
  t.is(env.shaper.idleClasses(), 1);
  await env.shaper.ensure(podOf(pods[1]!, { egress: 10e6 }));
  t.is(env.shaper.ifbOfPod(pods[1]!.id), ifbs[1]);
  t.regex(await tc(['class', 'show', 'dev', ifbs[1]!]), /class htb 1:1 root rate 10Mbit/);
  await env.shaper.reset();
  for (const ifb of ifbs) t.false(existsSync(`/sys/class/net/${ifb}`), `${ifb} removed by reset`);
});

kTest('shards: a restart with fewer shards re-homes the pods of the shards that went; with more, pods keep theirs', async (t) => {
  const env = await shaperEnv(t, 4, 3);
  const pods = env.topo.pods.slice(0, 3) as TopoPod[];
  const peer = env.topo.pods[3]!;
  for (const p of pods) await env.shaper.ensure(podOf(p, { egress: 20e6 }));
  t.deepEqual(
    pods.map((p) => env.shaper.ifbOfPod(p.id)),
    [env.ifb, `${env.ifb}.1`, `${env.ifb}.2`],
  );
  env.shaper.close();
  const fewer = new Shaper({ ifbName: env.ifb, shards: 2 });
  t.teardown(() => fewer.close());
  await fewer.init(env.shaper.states());
  t.false(existsSync(`/sys/class/net/${env.ifb}.2`), 'the third shard is gone');
  await fewer.reconcile(pods.map((p) => podOf(p, { egress: 20e6 })));
  const homes = pods.map((p) => fewer.ifbOfPod(p.id));
  t.deepEqual(homes.slice(0, 2), [env.ifb, `${env.ifb}.1`], 'pods on remaining shards stay');
  t.true(homes[2] === env.ifb || homes[2] === `${env.ifb}.1`, `the third pod re-homed (${homes[2]})`);
  const third = pods[2]!;
  t.regex(
    await tc(['filter', 'show', 'dev', third.hostVeth, 'ingress']),
    new RegExp(`Redirect to device ${homes[2]!.replace('.', '\\.')}\\)`),
  );
  await execa('ip', ['netns', 'exec', peer.netns, 'ping', '-c', '1', '-W', '2', third.ip4]);
  const before = (await classPackets(homes[2]!)).get(`1:${(fewer.classIdOf(third.id)! + 0x1000).toString(16)}`) ?? 0;
  await udp(third, peer.ip4, 40001, 9, 1200, 5);
  const after = (await classPackets(homes[2]!)).get(`1:${(fewer.classIdOf(third.id)! + 0x1000).toString(16)}`) ?? 0;
  t.true(after - before >= 5, 'its traffic is shaped on its new shard');
  fewer.close();
  const more = new Shaper({ ifbName: env.ifb, shards: 4 });
  t.teardown(() => more.close());
  await more.init(fewer.states());
  t.deepEqual(
    pods.map((p) => more.ifbOfPod(p.id)),
    homes,
    'nobody moves when shards are added',
  );
  t.true(existsSync(`/sys/class/net/${env.ifb}.3`));
  await more.ensure(podOf(peer, { egress: 5e6 }));
  t.is(more.ifbOfPod(peer.id), `${env.ifb}.2`, 'a new pod goes to an empty shard');
});

test('shards: bad counts and names that would not fit are refused', (t) => {
  t.throws(() => new Shaper({ ifbName: 'kifx', shards: 0 }), { instanceOf: ConfigError });
  t.throws(() => new Shaper({ ifbName: 'kifx', shards: 65 }), { instanceOf: ConfigError });
  t.throws(() => new Shaper({ ifbName: 'kifx', shards: 1.5 }), { instanceOf: ConfigError });
  t.throws(() => new Shaper({ ifbName: 'kubenet-ifb012', shards: 10 }), { instanceOf: ConfigError, message: /kubenet-ifb012\.9/ });
  t.notThrows(() => new Shaper({ ifbName: 'kubenet-ifb0', shards: 64 }));
});
