/**
 * The node's egress tree over several shards (src/shaper/shares.ts) against the real kernel, with
 * traffic: each shard an ifb with its own htb tree, its node class at its share; the shares add up
 * to the capacity and follow the demand. Pods and ifbs are the test's own (shaperEnv); iperf3 only
 * between its namespaces, under the traffic lock.
 */
import test from 'ava';
import { execa } from 'execa';
import { ingressShardIfb, ingressShardOf, MAX_INGRESS_SHARDS, MAX_SHARDS, shardOf } from '../../src/shaper/shard-names.js';
import { Shaper } from '../../src/shaper/tc.js';
import { Shards } from '../../src/shaper/tc-plan.js';
import { isRoot } from '../kit/kernel.js';
import { podOf, shaperEnv, type ShaperEnv } from '../kit/shaper-env.js';
import { iperf, retryLog, type TopoPod } from '../kit/topo.js';
import { withTrafficLock } from '../kit/traffic-lock.js';
import { until } from '../kit/until.js';

const kTest = isRoot ? test : test.skip;

/** The node class's rate on an ifb, bits/s. */
async function nodeRate(ifb: string): Promise<number> {
  const m = /class htb 1:fffe root rate (\d+(?:\.\d+)?)([KMG]?)bit/.exec((await execa('tc', ['class', 'show', 'dev', ifb])).stdout);
  return Number(m?.[1] ?? NaN) * ({ '': 1, K: 1e3, M: 1e6, G: 1e9 }[m?.[2] ?? ''] ?? NaN);
}

/** The env's pods a..d (shaperEnv made at least `n` of them; the rest of the four are not used). */
function pods(env: ShaperEnv, n: 3 | 4): [TopoPod, TopoPod, TopoPod, TopoPod] {
  const p = env.topo.pods;
  if (p.length < n) throw new Error(`shaperEnv made ${p.length} pods, not ${n}`);
  return p as [TopoPod, TopoPod, TopoPod, TopoPod];
}

kTest(
  'two egress shards under a 200M capacity: node classes at shares adding up to it, one flow alone gets it, two flows on two shards split it',
  async (t) => {
    const capacity = 200e6;
    const env = await shaperEnv(t, 4, 2, { egress: capacity });
    const [a, b, c, d] = pods(env, 4);
    t.deepEqual(env.shaper.ifbs, [env.ifb, `${env.ifb}.1`], 'two trees');
    // Senders with a guarantee (always in the tree), one per shard; receivers without limits.
    await env.shaper.ensure(podOf(a, { egressGuarantee: 10e6 }));
    await env.shaper.ensure(podOf(b, { egressGuarantee: 10e6 }));
    await env.shaper.ensure(podOf(c, {}));
    await env.shaper.ensure(podOf(d, {}));
    t.not(env.shaper.ifbOfPod(a.id), env.shaper.ifbOfPod(b.id), 'the senders on different shards');
    const rates = async () => [await nodeRate(env.ifb), await nodeRate(`${env.ifb}.1`)];
    t.true((await rates()).reduce((x, y) => x + y, 0) <= capacity, `the node classes add up to at most the capacity: ${await rates()}`);

    // One flow alone: its shard's share grows to nearly all of the capacity within a few ticks.
    const alone = await iperf(c, a, { seconds: 4, onRetry: retryLog(t) });
    t.log(`a alone, 1 s intervals (Mbit/s): ${alone.intervals.map((x) => (x / 1e6).toFixed(1)).join(' ')}`);
    const late = alone.intervals.slice(1, 4);
    t.true(late.length >= 2, 'iperf3 reported its intervals');
    for (const x of late)
      t.true(x >= capacity * 0.8 && x <= capacity * 1.03, `one flow on one shard gets the capacity: ${(x / 1e6).toFixed(1)}M`);

    // Two flows on two shards at once: together the capacity, each about half (weights: one active pod each).
    const [ra, rb] = await withTrafficLock(async () => {
      const sums: number[][] = [];
      const sample = setInterval(() => void rates().then((r) => sums.push(r)), 200);
      try {
        return await Promise.all([iperf(c, a, { seconds: 5, onRetry: retryLog(t) }), iperf(d, b, { seconds: 5, onRetry: retryLog(t) })]);
      } finally {
        clearInterval(sample);
        for (const r of sums) t.true(r[0]! + r[1]! <= capacity * 1.0001, `the shares never add up past the capacity: ${r}`);
        t.true(sums.length >= 10, 'the shares were sampled');
      }
    });
    t.log(
      `a: ${ra.intervals.map((x) => (x / 1e6).toFixed(1)).join(' ')}; b: ${rb.intervals.map((x) => (x / 1e6).toFixed(1)).join(' ')} Mbit/s`,
    );
    const both = [1, 2, 3].map((i) => [ra.intervals[i] ?? NaN, rb.intervals[i] ?? NaN] as const);
    for (const [x, y] of both) {
      t.true(x + y <= capacity * 1.05, `together within the capacity: ${((x + y) / 1e6).toFixed(1)}M`);
      t.true(x + y >= capacity * 0.8, `together about the capacity: ${((x + y) / 1e6).toFixed(1)}M`);
      t.true(Math.min(x, y) >= capacity * 0.3, `each a fair part: ${(x / 1e6).toFixed(1)}M / ${(y / 1e6).toFixed(1)}M`);
    }

    // A restart keeps the shares it finds (it changes nothing on the node).
    await until(
      'the shares settle after the traffic',
      async () => Math.abs((await rates())[0]! - capacity / 2) < capacity * 0.06,
      10_000,
      100,
    );
    const before = await rates();
    const states = env.shaper.states();
    env.shaper.close();
    const again = new Shaper({ ifbName: env.ifb, shards: 2, capacity: { egress: capacity } });
    t.teardown(() => again.close());
    await again.init(states);
    t.deepEqual(await rates(), before, 'a restart keeps the shares');
    t.deepEqual(again.shareOf(), before);
  },
);

/** A class's ceil on an ifb, bits/s (NaN when it is not there). */
async function classCeil(ifb: string, id: number): Promise<number> {
  const out = (await execa('tc', ['class', 'show', 'dev', ifb])).stdout;
  const m = new RegExp(`class htb 1:${id.toString(16)} parent 1:fffe .*ceil (\\d+(?:\\.\\d+)?)([KMG]?)bit`).exec(out);
  return Number(m?.[1] ?? NaN) * ({ '': 1, K: 1e3, M: 1e6, G: 1e9 }[m?.[2] ?? ''] ?? NaN);
}

kTest(
  "a namespace with a total over two shards: its class on each at shares adding up to the total, one pod's flow alone gets it, two split it; its last pod on a shard takes its class there",
  async (t) => {
    const total = 40e6;
    const env = await shaperEnv(t, 4, 2, { egress: 200e6 });
    const [a, b, c, d] = pods(env, 4);
    await env.shaper.ensure({ ...podOf(a, { egressTotal: total }), group: 'ns1' });
    await env.shaper.ensure({ ...podOf(b, { egressTotal: total }), group: 'ns1' });
    await env.shaper.ensure(podOf(c, {}));
    await env.shaper.ensure(podOf(d, {}));
    t.not(env.shaper.ifbOfPod(a.id), env.shaper.ifbOfPod(b.id), "the namespace's pods on both shards");
    const gid = env.shaper.states().find((s) => s.id === a.id)?.egressParent ?? 0;
    t.is(env.shaper.states().find((s) => s.id === b.id)?.egressParent, gid, 'one namespace class id on both');
    const ceils = async () => [await classCeil(env.ifb, gid), await classCeil(`${env.ifb}.1`, gid)];
    const sum = (xs: number[]) => xs.reduce((x, y) => x + y, 0);
    t.deepEqual(await ceils(), [total / 2, total / 2], 'split evenly at first');

    // One pod's flow alone: its shard's share of the total grows to nearly all of it.
    const alone = await iperf(c, a, { seconds: 4, onRetry: retryLog(t) });
    t.log(`a alone, 1 s intervals (Mbit/s): ${alone.intervals.map((x) => (x / 1e6).toFixed(1)).join(' ')}; ceils ${await ceils()}`);
    for (const x of alone.intervals.slice(1, 4))
      t.true(x >= total * 0.8 && x <= total * 1.03, `one pod of the namespace gets its total: ${(x / 1e6).toFixed(2)}M`);

    // Both at once: together the total, each a fair part of it.
    const samples: number[][] = [];
    const [ra, rb] = await withTrafficLock(async () => {
      const sample = setInterval(() => void ceils().then((r) => samples.push(r)), 200);
      try {
        return await Promise.all([iperf(c, a, { seconds: 5, onRetry: retryLog(t) }), iperf(d, b, { seconds: 5, onRetry: retryLog(t) })]);
      } finally {
        clearInterval(sample);
      }
    });
    t.log(
      `a: ${ra.intervals.map((x) => (x / 1e6).toFixed(1)).join(' ')}; b: ${rb.intervals.map((x) => (x / 1e6).toFixed(1)).join(' ')} Mbit/s`,
    );
    for (const i of [2, 3, 4]) {
      const [x, y] = [ra.intervals[i] ?? NaN, rb.intervals[i] ?? NaN];
      t.true(x + y >= total * 0.85 && x + y <= total * 1.03, `together the namespace's total: ${((x + y) / 1e6).toFixed(2)}M`);
      t.true(Math.min(x, y) >= (x + y) * 0.3, `each a fair part: ${(x / 1e6).toFixed(2)} / ${(y / 1e6).toFixed(2)}M`);
    }
    t.true(samples.length > 5, 'the ceils were sampled');
    t.true(
      samples.every((r) => sum(r) <= total),
      `the namespace's classes never added up past its total: ${samples.map((r) => sum(r) / 1e6).join(' ')}`,
    );

    // Its last pod on shard 1 goes: the class there goes, the one left has the whole total.
    await env.shaper.remove(b.id);
    t.true(Number.isNaN(await classCeil(`${env.ifb}.1`, gid)), 'no namespace class left on shard 1');
    t.is(await classCeil(env.ifb, gid), total, 'the one left has the whole total');
    await env.shaper.remove(a.id);
    t.true(Number.isNaN(await classCeil(env.ifb, gid)), 'and it goes with the last pod');
  },
);

kTest('bands across two shards: a band-0 pod on one takes most of the capacity from a band-2 pod on the other', async (t) => {
  const capacity = 200e6;
  const env = await shaperEnv(t, 4, 2, { egress: capacity });
  const [a, b, c, d] = pods(env, 4);
  await env.shaper.ensure(podOf(a, { priority: 0 }));
  await env.shaper.ensure(podOf(b, { priority: 2 }));
  await env.shaper.ensure(podOf(c, {}));
  await env.shaper.ensure(podOf(d, {}));
  t.not(env.shaper.ifbOfPod(a.id), env.shaper.ifbOfPod(b.id), 'the two on different shards');
  const [ra, rb] = await withTrafficLock(() =>
    Promise.all([iperf(c, a, { seconds: 5, onRetry: retryLog(t) }), iperf(d, b, { seconds: 5, onRetry: retryLog(t) })]),
  );
  t.log(
    `band 0: ${ra.intervals.map((x) => (x / 1e6).toFixed(1)).join(' ')}; band 2: ${rb.intervals.map((x) => (x / 1e6).toFixed(1)).join(' ')} Mbit/s`,
  );
  for (const i of [2, 3, 4]) {
    const [x, y] = [ra.intervals[i] ?? NaN, rb.intervals[i] ?? NaN];
    t.true(x / (x + y) >= 0.75, `band 0's part of the two (the trees' goal >= 75 %): ${((100 * x) / (x + y)).toFixed(1)} %`);
    t.true(x + y <= capacity * 1.05, `together within the capacity: ${((x + y) / 1e6).toFixed(1)}M`);
  }
});

test('ingress shard names: <ifb>.in, <ifb>.i1 .. <ifb>.iz (23: <ifb>.j0), <ifb>.j1 .. <ifb>.js, all distinct, within 15 bytes; read back', (t) => {
  t.is(ingressShardIfb('kubenet-ifb0', 0), 'kubenet-ifb0.in');
  t.is(ingressShardIfb('kubenet-ifb0', 1), 'kubenet-ifb0.i1');
  t.is(ingressShardIfb('kubenet-ifb0', 35), 'kubenet-ifb0.iz');
  t.is(ingressShardIfb('kubenet-ifb0', 23), 'kubenet-ifb0.j0', "23 would be 'in', shard 0's");
  t.is(ingressShardIfb('kubenet-ifb0', 36), 'kubenet-ifb0.j1');
  t.is(ingressShardIfb('kubenet-ifb0', 63), 'kubenet-ifb0.js');
  const names = new Set<string>();
  for (let k = 0; k < MAX_INGRESS_SHARDS; k++) {
    const name = ingressShardIfb('kubenet-ifb0', k);
    t.true(name.length <= 15, name);
    t.is(ingressShardOf('kubenet-ifb0', name), k);
    t.is(shardOf('kubenet-ifb0', name), undefined, `${name} is no egress shard`);
    names.add(name);
  }
  t.is(names.size, MAX_INGRESS_SHARDS, 'every shard its own name');
  for (const other of [
    'kubenet-ifb0',
    'kubenet-ifb0.1',
    'kubenet-ifb0.i0',
    'kubenet-ifb0.i10',
    'kubenet-ifb0.jt',
    'kubenet-ifb0.k0',
    'kubenet-ifb1.in',
  ])
    t.is(ingressShardOf('kubenet-ifb0', other), undefined, other);
  // As many ingress shards as egress ones, never more.
  t.is(MAX_INGRESS_SHARDS, MAX_SHARDS);
  t.throws(() => new Shards('kubenet-ifb0', MAX_INGRESS_SHARDS + 1, 'ingress'), { message: /ingress shards must be an integer 1\.\.64/ });
  t.is(new Shards('kubenet-ifb0', MAX_INGRESS_SHARDS, 'ingress').ifbs.at(-1), 'kubenet-ifb0.js');
});

kTest(
  'two ingress shards under a 200M ingress capacity: pods on .in and .i1, one flow to a pod alone gets the capacity, two flows to pods on two shards split it; removal leaves no pod filter',
  async (t) => {
    const capacity = 200e6;
    const env = await shaperEnv(t, 4, 2, { ingress: capacity });
    const [a, b, c, d] = pods(env, 4);
    const [in0, in1] = [`${env.ifb}.in`, `${env.ifb}.i1`];
    // Receivers with an ingress guarantee (always in the tree), one per ingress shard; senders without limits.
    await env.shaper.ensure(podOf(a, { ingressGuarantee: 10e6 }));
    await env.shaper.ensure(podOf(b, { ingressGuarantee: 10e6 }));
    await env.shaper.ensure(podOf(c, {}));
    await env.shaper.ensure(podOf(d, {}));
    t.is(env.shaper.inIfbOfPod(a.id), in0);
    t.is(env.shaper.inIfbOfPod(b.id), in1);
    t.regex((await execa('tc', ['filter', 'show', 'dev', b.hostVeth, 'parent', '2:'])).stdout, new RegExp(`Redirect to device ${in1}\\)`));
    const rates = async () => [await nodeRate(in0), await nodeRate(in1)];
    t.true((await rates()).reduce((x, y) => x + y, 0) <= capacity, `the node classes add up to at most the capacity: ${await rates()}`);

    const alone = await iperf(b, c, { seconds: 4, onRetry: retryLog(t) });
    t.log(`to b alone, 1 s intervals (Mbit/s): ${alone.intervals.map((x) => (x / 1e6).toFixed(1)).join(' ')}`);
    for (const x of alone.intervals.slice(1, 4))
      t.true(x >= capacity * 0.8 && x <= capacity * 1.03, `one flow to a pod on one shard gets the capacity: ${(x / 1e6).toFixed(1)}M`);

    const [ra, rb] = await withTrafficLock(() =>
      Promise.all([iperf(a, c, { seconds: 5, onRetry: retryLog(t) }), iperf(b, d, { seconds: 5, onRetry: retryLog(t) })]),
    );
    t.log(
      `to a: ${ra.intervals.map((x) => (x / 1e6).toFixed(1)).join(' ')}; to b: ${rb.intervals.map((x) => (x / 1e6).toFixed(1)).join(' ')} Mbit/s`,
    );
    for (const i of [1, 2, 3]) {
      const [x, y] = [ra.intervals[i] ?? NaN, rb.intervals[i] ?? NaN];
      t.true(x + y <= capacity * 1.05 && x + y >= capacity * 0.8, `together about the capacity: ${((x + y) / 1e6).toFixed(1)}M`);
      t.true(Math.min(x, y) >= capacity * 0.3, `each a fair part: ${(x / 1e6).toFixed(1)}M / ${(y / 1e6).toFixed(1)}M`);
    }

    // A restart keeps each pod on its shard; removal leaves no pod filter on either.
    const states = env.shaper.states();
    env.shaper.close();
    const again = new Shaper({ ifbName: env.ifb, shards: 2, capacity: { ingress: capacity } });
    t.teardown(() => again.close());
    await again.init(states);
    t.is(again.inIfbOfPod(b.id), in1);
    for (const p of [a, b, c, d]) await again.remove(p.id);
    for (const ifb of [in0, in1])
      t.is(
        (await execa('tc', ['filter', 'show', 'dev', ifb, 'parent', '1:'])).stdout.match(/flowid 1:/g)?.length ?? 0,
        0,
        `no pod filter on ${ifb}`,
      );
  },
);

kTest(
  'an upgrade from one tree to two shards: the reconcile spreads the running pods over both, a TCP flow through moved pods goes on, nothing of them is left on their old shard',
  async (t) => {
    const capacity = { egress: 200e6, ingress: 200e6 };
    const env = await shaperEnv(t, 4, 1, capacity);
    const [a, b, c, d] = pods(env, 4);
    // A band each: in the trees whatever the steering decides.
    const live = [a, b, c, d].map((p) => podOf(p, { priority: 1 }));
    for (const p of live) await env.shaper.ensure(p);
    const podFilters = async (dev: string) =>
      ((await execa('tc', ['filter', 'show', 'dev', dev, 'parent', '1:'])).stdout.match(/flowid 1:[0-9a-f]+/g) ?? []).length;
    const before = { egress: await podFilters(env.ifb), ingress: await podFilters(`${env.ifb}.in`) };
    const states = env.shaper.states();
    env.shaper.close();
    const next = new Shaper({ ifbName: env.ifb, shards: 2, capacity });
    t.teardown(async () => {
      await next.reset().catch(() => undefined);
      next.close();
    });
    await next.init(states);
    t.is(next.ifbOfPod(c.id), env.ifb, 'adopted where it was until its next ensure');
    // d sends to c for 5 s; their next ensures (the agent's reconcile after a start) move both.
    const flow = iperf(c, d, { seconds: 5, onRetry: retryLog(t) });
    await new Promise((r) => setTimeout(r, 2000));
    await next.reconcile(live);
    const r = await flow;
    t.log(`d -> c across the move (at ~2 s), 1 s intervals (Mbit/s): ${r.intervals.map((x) => (x / 1e6).toFixed(1)).join(' ')}`);
    t.true(r.intervals.length >= 5, 'the flow ran to its end');
    for (const x of r.intervals.slice(1)) t.true(x >= 50e6, `no second without traffic: ${(x / 1e6).toFixed(1)} Mbit/s`);
    t.deepEqual(
      [a, b, c, d].map((p) => next.ifbOfPod(p.id)),
      [env.ifb, env.ifb, `${env.ifb}.1`, `${env.ifb}.1`],
      'egress: two pods a shard',
    );
    t.deepEqual(
      [a, b, c, d].map((p) => next.inIfbOfPod(p.id)),
      [`${env.ifb}.in`, `${env.ifb}.in`, `${env.ifb}.i1`, `${env.ifb}.i1`],
      'ingress: two pods a shard',
    );
    t.is(await podFilters(env.ifb), before.egress / 2, "the moved pods' filters left the first egress shard");
    t.is(await podFilters(`${env.ifb}.1`), before.egress / 2);
    t.is(await podFilters(`${env.ifb}.in`), before.ingress / 2, "and the first ingress shard's");
    t.is(await podFilters(`${env.ifb}.i1`), before.ingress / 2);
    t.regex(
      (await execa('tc', ['filter', 'show', 'dev', c.hostVeth, 'parent', '2:'])).stdout,
      new RegExp(`Redirect to device ${env.ifb}\\.i1\\)`),
    );
    t.regex(
      (await execa('tc', ['filter', 'show', 'dev', d.hostVeth, 'ingress'])).stdout,
      new RegExp(`Redirect to device ${env.ifb}\\.1\\)`),
    );
    // A second start finds them spread: nothing moves.
    const again = next.states();
    next.close();
    const third = new Shaper({ ifbName: env.ifb, shards: 2, capacity });
    t.teardown(() => third.close());
    await third.init(again);
    await third.reconcile(live);
    t.deepEqual(
      third.states().map((s) => [s.id, s.shard ?? 0, s.ingressShard ?? 0, s.classId]),
      again.map((s) => [s.id, s.shard ?? 0, s.ingressShard ?? 0, s.classId]),
    );
  },
);
