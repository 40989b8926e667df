/**
 * Best-effort pods out of the node's trees while the node is far from its capacity
 * (src/shaper/steering.ts): the decision and the plan without root; against the real kernel, a pod
 * that asked for nothing leaves both trees once its directions are cool, goes back into them when
 * its traffic makes them hot (and is then held at the capacity), and leaves again when the traffic
 * ends; a pod with a guarantee never leaves. Traffic only between the topology's own namespaces.
 */
import test from 'ava';
import { execa } from 'execa';
import { isBestEffort } from '../../src/bandwidth/limits.js';
import { ACTIVE_BITS, IN_SHARE, nextPhase, OUT_HOLD_MS, OUT_SHARE, steerPlan, TICK_MS } from '../../src/shaper/steering.js';
import { planEnsure } from '../../src/shaper/tc-plan.js';
import { Shaper } from '../../src/shaper/tc.js';
import type { ShapingState } from '../../src/shaper/tc-layout.js';
import { isRoot } from '../kit/kernel.js';
import { podOf, shaperEnv } from '../kit/shaper-env.js';
import { iperf, retryLog } from '../kit/topo.js';
import { until } from '../kit/until.js';

const kTest = isRoot ? test : test.skip;

test('best effort: nothing asked that way (no ceiling, guarantee, total or band)', (t) => {
  t.true(isBestEffort({}, 'egress'));
  t.true(isBestEffort({ ingress: 10e6 }, 'egress'), 'a ceiling the other way only');
  t.false(isBestEffort({ egress: 10e6 }, 'egress'));
  t.false(isBestEffort({ egressGuarantee: 10e6 }, 'egress'));
  t.false(isBestEffort({ egressTotal: 10e6 }, 'egress'), "its namespace's total");
  t.false(isBestEffort({ priority: 2 }, 'ingress'), 'a band, even the last');
  t.false(isBestEffort({ ingressGuarantee: 1e6 }, 'ingress'));
});

test('phase: hot at IN_SHARE of the capacity at once; cool only after OUT_HOLD_MS under OUT_SHARE', (t) => {
  const C = 1e9;
  t.deepEqual(nextPhase({ hot: false }, IN_SHARE * C - 1, C, 0), { hot: false });
  t.deepEqual(nextPhase({ hot: false }, IN_SHARE * C, C, 0), { hot: true });
  t.deepEqual(nextPhase({ hot: true }, OUT_SHARE * C, C, 0), { hot: true }, 'between the shares: stays hot');
  const a = nextPhase({ hot: true }, OUT_SHARE * C - 1, C, 1000);
  t.deepEqual(a, { hot: true, coolSince: 1000 });
  t.deepEqual(nextPhase(a, 0, C, 1000 + OUT_HOLD_MS - 1), { hot: true, coolSince: 1000 });
  t.deepEqual(nextPhase(a, 0, C, 1000 + OUT_HOLD_MS), { hot: false });
  t.deepEqual(nextPhase(a, OUT_SHARE * C + 1, C, 1500), { hot: true }, 'a rise above OUT_SHARE starts the hold again');
});

test('plan: hot steers in the active pods that are out; cool steers out every pod that is in', (t) => {
  const pods = [
    { id: 'a', out: true, rate: ACTIVE_BITS },
    { id: 'b', out: true, rate: ACTIVE_BITS - 1 },
    { id: 'c', out: false, rate: 0 },
  ];
  t.deepEqual(steerPlan(true, pods), { into: ['a'], out: [] });
  t.deepEqual(steerPlan(false, pods), { into: [], out: ['c'] });
});

const IFB = 'kifb';
const IN_IFB = 'kifb.in';
const TREES = { egress: { capacity: 1e9 }, ingress: { ifb: IN_IFB, tree: { capacity: 1e9 } } };
function state(over: Partial<ShapingState>): ShapingState {
  return {
    version: 1,
    id: 'p',
    hostVeth: 'vethab',
    ips: ['10.244.0.5'],
    limits: {},
    classId: 3,
    ingressClassId: 4,
    ingressInstalled: true,
    egressInstalled: true,
    filters: [],
    ...over,
  };
}

test('plan lines: a pod out of the trees has its ifb side only; leaving and coming back are the veth lines alone', (t) => {
  const out = planEnsure(IFB, undefined, state({ bypass: ['egress', 'ingress'] }), false, TREES);
  t.false(
    out.lines.some((l) => l.includes('dev vethab')),
    'nothing on the veth',
  );
  t.true(
    out.lines.some((l) => l.startsWith(`class replace dev ${IFB} `)) && out.lines.some((l) => l.startsWith(`class replace dev ${IN_IFB} `)),
  );
  // A re-shape of a pod that is in the trees and leaves them (its limits stay none): the redirects go first.
  const leave = planEnsure(IFB, state({}), state({ bypass: ['egress', 'ingress'] }), false, TREES);
  t.true(leave.pre.includes('qdisc del dev vethab root') && leave.pre.includes('qdisc del dev vethab ingress'));
  t.false(leave.lines.some((l) => l.includes('dev vethab')));
  // Out of the trees and given a ceiling: the redirects come back, nothing on the veth is deleted.
  const back = planEnsure(IFB, state({ bypass: ['egress', 'ingress'] }), state({ limits: { egress: 10e6 } }), false, TREES);
  t.false(back.pre.some((l) => l.includes('dev vethab')));
  t.true(back.lines.some((l) => l.includes('dev vethab ingress')) && back.lines.some((l) => l.includes('dev vethab root')));
});

/** Whether the veth redirects its pod's egress (an ingress qdisc's filter) and its ingress (the root's) into the trees. */
async function redirects(veth: string): Promise<{ egress: boolean; ingress: boolean }> {
  const f = async (parent: string) =>
    /Redirect to device/.test((await execa('tc', ['filter', 'show', 'dev', veth, 'parent', parent], { reject: false })).stdout);
  return { egress: await f('ffff:'), ingress: await f('2:') };
}

kTest(
  'a pod that asked for nothing leaves both trees while cool, is back in them (and held at the capacity) under load, and leaves again',
  async (t) => {
    const capacity = 100e6;
    const env = await shaperEnv(t, 3, 1, { egress: capacity, ingress: capacity });
    const [a, b, c] = env.topo.pods as [(typeof env.topo.pods)[0], (typeof env.topo.pods)[0], (typeof env.topo.pods)[0]];
    await env.shaper.ensure(podOf(a, {}));
    await env.shaper.ensure(podOf(b, {}));
    await env.shaper.ensure(podOf(c, { egressGuarantee: 10e6, ingressGuarantee: 10e6 }));
    const leftBoth = async () => !(await redirects(a.hostVeth)).egress && !(await redirects(b.hostVeth)).ingress;
    // A new shaper starts hot: every pod in the trees until the first cool decision.
    t.deepEqual(await redirects(a.hostVeth), { egress: true, ingress: true });
    await until('the best-effort pods leave the trees', leftBoth, OUT_HOLD_MS + 20 * TICK_MS + 5000, 50);
    t.deepEqual(env.shaper.steered(), { egress: false, ingress: false });
    t.deepEqual(await redirects(a.hostVeth), { egress: false, ingress: false }, 'no redirect either way');
    t.deepEqual(await redirects(c.hostVeth), { egress: true, ingress: true }, 'the guaranteed pod stays in');
    t.deepEqual(
      env.shaper
        .states()
        .filter((s) => s.bypass)
        .map((s) => s.id)
        .sort(),
      [a.id, b.id].sort(),
    );
    const classes = (await execa('tc', ['class', 'show', 'dev', env.ifb])).stdout;
    t.regex(classes, new RegExp(`class htb 1:${(env.shaper.classIdOf(a.id) ?? 0).toString(16)} parent 1:fffe`), 'its classes stay');

    // A restart (states as an earlier process left them) changes nothing: the pods out of the trees stay out.
    const states = env.shaper.states().map((st) => {
      const { bypass: _b, ...rest } = st; // the steering is not in what a caller keeps
      return rest;
    });
    env.shaper.close();
    const again: Shaper = new Shaper({ ifbName: env.ifb, capacity: { egress: capacity, ingress: capacity } });
    await again.init(states);
    await again.reconcile([podOf(a, {}), podOf(b, {}), podOf(c, { egressGuarantee: 10e6, ingressGuarantee: 10e6 })]);
    t.deepEqual(await redirects(a.hostVeth), { egress: false, ingress: false }, 'still out after a restart');
    t.deepEqual(await redirects(c.hostVeth), { egress: true, ingress: true });
    t.teardown(async () => {
      await again.reset().catch(() => undefined);
      again.close();
    });

    // a -> b as fast as it goes: a tick or two later both are in the trees, and the flow is held at the capacity.
    const r = await iperf(b, a, { seconds: 5, onRetry: retryLog(t) });
    t.log(`a -> b, 1 s intervals (Mbit/s): ${r.intervals.map((x) => (x / 1e6).toFixed(1)).join(' ')}`);
    const held = r.intervals.slice(1, 5);
    t.true(held.length >= 3, 'iperf3 reported its intervals');
    for (const x of held) t.true(x <= capacity * 1.03, `after the first second the flow is within the capacity: ${(x / 1e6).toFixed(1)}M`);
    t.true(Math.min(...held) >= capacity * 0.8, 'and the tree lets it have the capacity');
    // (Each pod's ACKs the other way pass ACTIVE_BITS too: whether they went in depends on the tick.)
    t.true((await redirects(a.hostVeth)).egress, 'the sender in the egress tree');
    t.true((await redirects(b.hostVeth)).ingress, 'the receiver in the ingress tree');
    t.deepEqual(again.steered(), { egress: true, ingress: true }, 'both directions hot');

    // The traffic ended: both leave again.
    await until('the best-effort pods leave the trees after the traffic', leftBoth, OUT_HOLD_MS + 20 * TICK_MS + 5000, 50);
    // Removal of a pod out of the trees: nothing left of it, nothing failed.
    await again.remove(a.id);
    const hexIp = a.ip4
      .split('.')
      .map((o) => Number(o).toString(16).padStart(2, '0'))
      .join('');
    t.notRegex(
      (await execa('tc', ['filter', 'show', 'dev', env.ifb, 'parent', '1:'])).stdout,
      new RegExp(`match ${hexIp}/`),
      'its filters',
    );
    t.false(again.states().some((s) => s.id === a.id));
  },
);

kTest(
  'restarts without a capacity and with one again (the tax bench sequence): no redirect is left without one, and the pods out of the trees stay out, kernel and states agreeing',
  async (t) => {
    const capacity = 100e6;
    const env = await shaperEnv(t, 2, 1, { egress: capacity, ingress: capacity });
    const [a] = env.topo.pods as [(typeof env.topo.pods)[0]];
    await env.shaper.ensure(podOf(a, {}));
    const out = async () => {
      const r = await redirects(a.hostVeth);
      return !r.egress && !r.ingress;
    };
    await until('the best-effort pod leaves the trees', out, OUT_HOLD_MS + 20 * TICK_MS + 5000, 50);
    const kept = (s: Shaper) =>
      s.states().map((st) => {
        const { bypass: _b, ...rest } = st; // the steering is not in what a caller keeps
        return rest;
      });
    // What the agent's pod records held: the state of the first process (a record of a pod the shaper does not want is not rewritten).
    const first = kept(env.shaper);
    env.shaper.close();
    let current: Shaper | undefined;
    t.teardown(async () => {
      await current?.reset().catch(() => undefined);
      current?.close();
    });
    // Without a capacity: a pod without limits has nothing on its veth.
    current = new Shaper({ ifbName: env.ifb, shards: 1 });
    await current.init(first);
    await current.reconcile([podOf(a, {})]);
    t.deepEqual(await redirects(a.hostVeth), { egress: false, ingress: false }, 'no capacity: no redirect');
    t.notRegex((await execa('tc', ['qdisc', 'show', 'dev', a.hostVeth])).stdout, /ingress|htb/, 'no qdisc on the veth');
    current.close();
    // With the capacity again, from the first process's states (its ifb rebuilt: the layout changed twice): the pod is
    // out of the trees (now or after the first cool decision), and the shaper knows it.
    current = new Shaper({ ifbName: env.ifb, shards: 1, capacity: { egress: capacity, ingress: capacity } });
    await current.init(first);
    await current.reconcile([podOf(a, {})]);
    await until('the best-effort pod is out of the trees after the second restart', out, OUT_HOLD_MS + 20 * TICK_MS + 5000, 50);
    const known = current.states().find((s) => s.id === a.id);
    t.deepEqual([...(known?.bypass ?? [])].sort(), ['egress', 'ingress'], 'the states say out, as the kernel does');
  },
);
