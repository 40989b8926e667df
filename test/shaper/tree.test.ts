/**
 * The node's egress tree (a capacity is set) against the real kernel, without traffic: the node and
 * default classes, each pod's class under the node class with its guarantee as rate and its ceiling
 * (or the capacity) as ceil, leaf priorities by band, every pod in the tree, and restarts that change
 * the capacity or switch between the flat layout and the tree. Traffic: bench/shaping.ts --only guarantees.
 */
import test from 'ava';
import { execa } from 'execa';
import { Shaper } from '../../src/shaper/tc.js';
import { isRoot } from '../kit/kernel.js';
import { podOf, shaperEnv } from '../kit/shaper-env.js';

const kTest = isRoot ? test : test.skip;

/** A rate as tc prints it ("60Mbit", "1Gbit", "999Kbit", "8bit") in bits/s. */
function tcRate(s: string): number {
  const m = /^([\d.]+)([KMGT]?)bit$/.exec(s);
  if (!m?.[1]) throw new Error(`not a tc rate: ${s}`);
  return Math.round(Number(m[1]) * ({ '': 1, K: 1e3, M: 1e6, G: 1e9, T: 1e12 }[m[2] ?? ''] ?? NaN));
}

/** The ifb's htb classes: id (minor, hex) → parent, rate and ceil in bits/s, leaf prio (`tc class show`). */
async function classes(ifb: string): Promise<Map<string, { parent: string; rate: number; ceil: number; prio?: number }>> {
  const text = (await execa('tc', ['class', 'show', 'dev', ifb])).stdout;
  const out = new Map<string, { parent: string; rate: number; ceil: number; prio?: number }>();
  for (const line of text.split('\n')) {
    const m = /^class htb 1:([0-9a-f]+) (?:root|parent 1:([0-9a-f]*))(?: leaf [0-9a-f]+:)? (?:prio (\d+) )?rate (\S+) ceil (\S+)/.exec(
      line,
    );
    if (!m?.[1] || !m[4] || !m[5]) continue;
    out.set(m[1], {
      parent: m[2] ?? 'root',
      rate: tcRate(m[4]),
      ceil: tcRate(m[5]),
      ...(m[3] !== undefined ? { prio: Number(m[3]) } : {}),
    });
  }
  return out;
}

kTest(
  'with a capacity: node class at it, pods under it with guarantee as rate and ceiling (or capacity) as ceil, leaf prio by band',
  async (t) => {
    const env = await shaperEnv(t, 3, 1, { egress: 100e6 });
    t.deepEqual(env.shaper.ifbs, [env.ifb], 'one shard, one tree (several: tree-shards.test.ts)');
    t.regex((await execa('tc', ['qdisc', 'show', 'dev', env.ifb])).stdout, /qdisc htb 1: root .*default 0xfffd/);
    const [a, b, c] = env.topo.pods as [(typeof env.topo.pods)[0], (typeof env.topo.pods)[0], (typeof env.topo.pods)[0]];
    await env.shaper.ensure(podOf(a, { egressGuarantee: 60e6, priority: 0 }));
    await env.shaper.ensure(podOf(b, { egress: 50e6, egressGuarantee: 20e6, priority: 1 }));
    await env.shaper.ensure(podOf(c, {})); // no limits at all: still in the tree, at the capacity
    const cls = await classes(env.ifb);
    t.like(cls.get('fffe'), { parent: 'root', rate: 100e6, ceil: 100e6 });
    t.like(cls.get('fffd'), { parent: 'fffe', ceil: 100e6 });
    const [ia, ib, ic] = [a, b, c].map((p) => env.shaper.classIdOf(p.id)) as [number, number, number];
    t.truthy(ia && ib && ic, 'every pod has a class, the one without limits too');
    t.like(cls.get(ia.toString(16)), { parent: 'fffe', rate: 60e6, ceil: 100e6 });
    t.like(cls.get((ia + 0x800).toString(16)), { parent: ia.toString(16), rate: 6e6, prio: 0 });
    t.like(cls.get((ia + 0x1000).toString(16)), { parent: ia.toString(16), rate: 54e6, prio: 1 });
    t.like(cls.get(ib.toString(16)), { parent: 'fffe', rate: 20e6, ceil: 50e6 });
    t.like(cls.get((ib + 0x1000).toString(16)), { prio: 3, ceil: 50e6 });
    t.like(cls.get(ic.toString(16)), { parent: 'fffe', ceil: 100e6 });
    t.true((cls.get(ic.toString(16))?.rate ?? Infinity) <= 1.001e6, 'no guarantee: a small assured rate only');
    t.like(cls.get((ic + 0x1000).toString(16)), { prio: 3 }, 'band unknown: the middle band');
    // Every pod's egress is redirected into the tree, the one without limits too.
    t.regex((await execa('tc', ['filter', 'show', 'dev', c.hostVeth, 'ingress'])).stdout, new RegExp(`Redirect to device ${env.ifb}`));
    t.true(env.shaper.wants({}), 'with a tree every pod is shaped');

    // A restart with another capacity: the node class and the ceilings that were the capacity follow.
    const states = env.shaper.states();
    env.shaper.close();
    const again = new Shaper({ ifbName: env.ifb, capacity: { egress: 200e6 } });
    t.teardown(() => again.close());
    await again.init(states);
    const after = await classes(env.ifb);
    t.like(after.get('fffe'), { rate: 200e6, ceil: 200e6 });
    t.like(after.get(ic.toString(16)), { ceil: 200e6 });
    t.like(after.get(ia.toString(16)), { rate: 60e6, ceil: 200e6 });
    t.like(after.get(ib.toString(16)), { rate: 20e6, ceil: 50e6 });

    // And back to the flat layout (no capacity): rebuilt, pods with a ceiling restored at it, the rest leave on reconcile.
    again.close();
    const flat = new Shaper({ ifbName: env.ifb });
    t.teardown(() => flat.close());
    await flat.init(again.states());
    t.regex((await execa('tc', ['qdisc', 'show', 'dev', env.ifb])).stdout, /qdisc htb 1: root .*default 0 /);
    await flat.reconcile([podOf(a, { egressGuarantee: 60e6 }), podOf(b, { egress: 50e6, egressGuarantee: 20e6 }), podOf(c, {})]);
    const flatCls = await classes(env.ifb);
    t.false(flatCls.has('fffe'), 'no node class');
    t.like(flatCls.get(ib.toString(16)), { parent: 'root', rate: 50e6, ceil: 50e6 });
    t.deepEqual(
      flat
        .list()
        .map((p) => p.id)
        .sort(),
      [a.id, b.id].sort(),
      'without a tree, a guarantee alone has nothing to install but stays known; the pod without limits is gone',
    );
    t.notRegex((await execa('tc', ['filter', 'show', 'dev', c.hostVeth, 'ingress'])).stdout, /Redirect/, 'its redirect is gone');
  },
);

kTest('a flat shard becomes the tree on a start with a capacity: rebuilt, its pods restored under the node class', async (t) => {
  const env = await shaperEnv(t, 1, 1);
  const [a] = env.topo.pods as [(typeof env.topo.pods)[0]];
  await env.shaper.ensure(podOf(a, { egress: 30e6 }));
  const id = env.shaper.classIdOf(a.id) ?? 0;
  const states = env.shaper.states();
  env.shaper.close();
  const tree = new Shaper({ ifbName: env.ifb, capacity: { egress: 1e9 } });
  t.teardown(() => tree.close());
  await tree.init(states);
  const cls = await classes(env.ifb);
  t.like(cls.get('fffe'), { rate: 1e9 });
  t.like(cls.get(id.toString(16)), { parent: 'fffe', ceil: 30e6 });
  t.regex((await execa('tc', ['filter', 'show', 'dev', a.hostVeth, 'ingress'])).stdout, new RegExp(`Redirect to device ${env.ifb}`));
  await tree.reset();
});

kTest(
  'with an ingress capacity: traffic to every pod goes from its veth root to the ingress tree, classified by destination',
  async (t) => {
    const env = await shaperEnv(t, 2, 1, { egress: 100e6, ingress: 50e6 });
    const inIfb = `${env.ifb}.in`;
    const [a, b] = env.topo.pods as [(typeof env.topo.pods)[0], (typeof env.topo.pods)[0]];
    await env.shaper.ensure(podOf(a, { ingress: 40e6, ingressGuarantee: 30e6, priority: 0 }));
    await env.shaper.ensure(podOf(b, {}));
    const cls = await classes(inIfb);
    t.like(cls.get('fffe'), { parent: 'root', rate: 50e6, ceil: 50e6 });
    const [ia, ib] = [a, b].map((p) => env.shaper.states().find((s) => s.id === p.id)?.ingressClassId ?? 0);
    t.truthy(ia && ib);
    t.like(cls.get((ia ?? 0).toString(16)), { parent: 'fffe', rate: 30e6, ceil: 40e6 });
    t.like(cls.get((ib ?? 0).toString(16)), { parent: 'fffe', ceil: 50e6 });
    const filters = (await execa('tc', ['filter', 'show', 'dev', inIfb, 'parent', '1:'])).stdout;
    t.regex(filters, /match [0-9a-f]+\/ffffffff at 16/, 'IPv4 destinations');
    for (const p of [a, b]) {
      t.regex((await execa('tc', ['qdisc', 'show', 'dev', p.hostVeth])).stdout, /qdisc htb 2: root .*default 0 /);
      t.regex(
        (await execa('tc', ['filter', 'show', 'dev', p.hostVeth, 'parent', '2:'])).stdout,
        new RegExp(`Redirect to device ${inIfb.replace('.', '\\.')}`),
      );
    }
    // Remove: the veth root goes, the classes idle on the ingress ifb.
    await env.shaper.remove(a.id);
    t.notRegex((await execa('tc', ['qdisc', 'show', 'dev', a.hostVeth])).stdout, /htb/);
    t.notRegex(
      (await execa('tc', ['filter', 'show', 'dev', inIfb, 'parent', '1:'])).stdout,
      new RegExp(`flowid 1:${(ia ?? 0).toString(16)} `),
    );
    // A start without an ingress capacity: the ingress ifb goes, the pods' veths get today's layout back on their ensure.
    const states = env.shaper.states();
    env.shaper.close();
    const flat = new Shaper({ ifbName: env.ifb, capacity: { egress: 100e6 } });
    t.teardown(() => flat.close());
    await flat.init(states);
    t.false((await execa('ip', ['link', 'show', inIfb], { reject: false })).exitCode === 0, 'the ingress ifb is gone');
    await flat.reconcile([podOf(b, { ingress: 20e6 })]);
    t.regex((await execa('tc', ['class', 'show', 'dev', b.hostVeth])).stdout, /class htb 2:1 root rate 20Mbit/);
    t.regex((await execa('tc', ['qdisc', 'show', 'dev', b.hostVeth])).stdout, /qdisc htb 2: root .*default 0x3/);
  },
);

kTest(
  "a namespace's total: its pods' classes under one class at that ceil, guaranteed their sum; moved out and in live; gone with its last pod",
  async (t) => {
    const env = await shaperEnv(t, 3, 1, { egress: 100e6, ingress: 100e6 });
    const [a, b, c] = env.topo.pods as [(typeof env.topo.pods)[0], (typeof env.topo.pods)[0], (typeof env.topo.pods)[0]];
    const inIfb = `${env.ifb}.in`;
    await env.shaper.ensure({ ...podOf(a, { egressTotal: 50e6, ingressTotal: 30e6, egressGuarantee: 10e6 }), group: 'ns1' });
    await env.shaper.ensure({ ...podOf(b, { egressTotal: 50e6, ingressTotal: 30e6, egressGuarantee: 5e6, egress: 40e6 }), group: 'ns1' });
    await env.shaper.ensure({ ...podOf(c, {}), group: 'ns2' });
    const st = (id: string) => env.shaper.states().find((s) => s.id === id);
    const gid = st(a.id)?.egressParent ?? 0;
    t.true(gid > 0x2000, 'a namespace class id');
    t.is(st(b.id)?.egressParent, gid);
    t.is(st(c.id)?.egressParent, undefined, 'a namespace without a total: under the node class');
    let cls = await classes(env.ifb);
    t.like(cls.get(gid.toString(16)), { parent: 'fffe', rate: 15e6, ceil: 50e6 });
    t.like(cls.get((st(a.id)?.classId ?? 0).toString(16)), { parent: gid.toString(16), rate: 10e6, ceil: 100e6 });
    t.like(cls.get((st(b.id)?.classId ?? 0).toString(16)), { parent: gid.toString(16), ceil: 40e6 });
    t.like(cls.get((st(c.id)?.classId ?? 0).toString(16)), { parent: 'fffe' });
    t.like((await classes(inIfb)).get(gid.toString(16)), { parent: 'fffe', ceil: 30e6 });

    // The namespace drops its egress total: a's class is made anew under the node class (same id).
    const aId = st(a.id)?.classId ?? 0;
    await env.shaper.ensure({ ...podOf(a, { ingressTotal: 30e6, egressGuarantee: 10e6 }), group: 'ns1' });
    cls = await classes(env.ifb);
    t.is(st(a.id)?.classId, aId);
    t.like(cls.get(aId.toString(16)), { parent: 'fffe', rate: 10e6 });
    t.regex(
      (await execa('tc', ['filter', 'show', 'dev', env.ifb, 'parent', '1:'])).stdout,
      new RegExp(`flowid 1:${(aId + 0x1000).toString(16)} `),
      'its filters are back',
    );
    t.like(cls.get(gid.toString(16)), { rate: 5e6, ceil: 50e6 }, 'the namespace class now guarantees b alone');

    // Its last pods go: the namespace's classes go (egress with b, ingress with a).
    await env.shaper.remove(b.id);
    t.false((await classes(env.ifb)).has(gid.toString(16)));
    t.true((await classes(inIfb)).has(gid.toString(16)), 'a still hangs under it ingress');
    // A restart keeps it.
    const states = env.shaper.states();
    env.shaper.close();
    const again = new Shaper({ ifbName: env.ifb, capacity: { egress: 100e6, ingress: 100e6 } });
    t.teardown(() => again.close());
    await again.init(states);
    t.true((await classes(inIfb)).has(gid.toString(16)), 'kept across a restart');
    await again.remove(a.id);
    t.false((await classes(inIfb)).has(gid.toString(16)));
    t.deepEqual((await classes(env.ifb)).get('fffd')?.parent, 'fffe');
  },
);

kTest(
  'with a tree, a pod without an egress ceiling still gets its egress side first, before its veth (the ADD beside the bridge exec)',
  async (t) => {
    const env = await shaperEnv(t, 1, 1, { egress: 100e6, ingress: 100e6 });
    const [a] = env.topo.pods as [(typeof env.topo.pods)[0]];
    const first = await env.shaper.ensure({ ...podOf(a, { ingress: 10e6 }), hostVeth: '' });
    t.truthy(first?.classId, 'its egress class, made before the veth is known');
    t.false(first?.ingressInstalled, 'nothing on a veth yet');
    const then = await env.shaper.ensure(podOf(a, { ingress: 10e6 }));
    t.is(then?.classId, first?.classId);
    t.truthy(then?.ingressClassId);
    t.regex((await execa('tc', ['filter', 'show', 'dev', a.hostVeth, 'ingress'])).stdout, new RegExp(`Redirect to device ${env.ifb}`));
    t.throws(() => new Shaper({ ifbName: 'kubenet-ifb012', capacity: { ingress: 1e9 } }), { message: /kubenet-ifb012\.in/ });
    t.notThrows(() => new Shaper({ ifbName: 'kubenet-ifb012' }).close());
  },
);

kTest(
  "an ADD whose veth vanished after its egress side came first: the failed ensure leaves none of the ingress class it took (the churn e2e's leak)",
  async (t) => {
    const env = await shaperEnv(t, 2, 1, { egress: 100e6, ingress: 100e6 });
    const [a, b] = env.topo.pods as [(typeof env.topo.pods)[0], (typeof env.topo.pods)[0]];
    const inIfb = `${env.ifb}.in`;
    const podFilters = async () =>
      (await execa('tc', ['filter', 'show', 'dev', inIfb, 'parent', '1:'])).stdout.split('\n').filter((l) => /flowid 1:/.test(l));
    const leaves = async () => (await execa('tc', ['qdisc', 'show', 'dev', inIfb])).stdout.split('\n').filter((l) => / parent 1:/.test(l));
    const before = { filters: await podFilters(), leaves: await leaves() };
    const first = await env.shaper.ensure({ ...podOf(a, { ingress: 10e6 }), hostVeth: '' });
    t.falsy(first?.ingressClassId, 'no ingress class before the veth is known');
    // The veth the plugin reported is gone by the time the shaper gets to it (a plugin that failed after making it).
    await t.throwsAsync(env.shaper.ensure({ ...podOf(a, { ingress: 10e6 }), hostVeth: `kvnone${a.id.slice(-4)}` }));
    t.deepEqual(await podFilters(), before.filters, 'no filter of the failed ingress class on the ingress ifb');
    t.deepEqual(await leaves(), before.leaves, 'no leaf of it either');
    // The ADD's undo removes what the pod has; the id's next pod gets its own filters only.
    await env.shaper.remove(a.id);
    const next = await env.shaper.ensure(podOf(b, { ingress: 10e6 }));
    t.truthy(next?.ingressClassId);
    t.is((await podFilters()).length, next?.ingressFilters?.length ?? -1, "only the next pod's filters");
    await env.shaper.remove(b.id);
    t.deepEqual(await podFilters(), before.filters);
  },
);
