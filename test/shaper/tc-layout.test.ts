/**
 * The shaper's tc lines and plans, exact output, without root or a kernel (src/shaper/tc-layout.ts,
 * tc-plan.ts). The kernel tests (shaper.test.ts, traffic.test.ts) prove the lines do what they say.
 */
import test from 'ava';
import { podLayout } from '../../src/shaper/sizing.js';
import {
  filtersFor,
  ifbLines,
  ifbLinkLines,
  MAX_CLASS,
  redirectLines,
  shardIfb,
  shardOf,
  structureLines,
  vethLines,
  type ShapingState,
} from '../../src/shaper/tc-layout.js';
import { ClassIds, Shards, planEnsure } from '../../src/shaper/tc-plan.js';

const IFB = 'kifb';

function state(over: Partial<ShapingState>): ShapingState {
  return {
    version: 1,
    id: 'p',
    hostVeth: 'vethab',
    ips: ['10.244.0.5'],
    limits: {},
    classId: 0,
    ingressInstalled: false,
    egressInstalled: false,
    filters: [],
    ...over,
  };
}

const VETH_10M = [
  'qdisc replace dev vethab root handle 2: htb default 3 direct_qlen 1000',
  'class replace dev vethab parent 2: classid 2:1 htb rate 10000000bit ceil 10000000bit burst 3028b cburst 3028b quantum 1514 prio 0',
  'class replace dev vethab parent 2:1 classid 2:2 htb rate 1000000bit ceil 10000000bit burst 3028b cburst 3028b quantum 1514 prio 0',
  'class replace dev vethab parent 2:1 classid 2:3 htb rate 9000000bit ceil 10000000bit burst 3028b cburst 3028b quantum 1514 prio 1',
  'qdisc replace dev vethab parent 2:2 handle 22: bfifo limit 12112',
  'qdisc replace dev vethab parent 2:3 handle 23: tbf rate 100000000000bit burst 3750b limit 34278b',
  'filter del dev vethab parent 2:',
  'filter add dev vethab parent 2: prio 1 protocol ip u32 match u16 0 0xfe00 at 2 flowid 2:2',
  'filter add dev vethab parent 2: prio 1 protocol ip u32 match ip protocol 1 0xff flowid 2:2',
  'filter add dev vethab parent 2: prio 1 protocol ip u32 match ip protocol 17 0xff match ip sport 53 0xffff flowid 2:2',
  'filter add dev vethab parent 2: prio 2 protocol ipv6 u32 match u16 0 0xfe00 at 4 flowid 2:2',
  'filter add dev vethab parent 2: prio 2 protocol ipv6 u32 match ip6 protocol 58 0xff flowid 2:2',
  'filter add dev vethab parent 2: prio 2 protocol ipv6 u32 match ip6 protocol 17 0xff match ip6 sport 53 0xffff flowid 2:2',
  'filter add dev vethab parent 2: prio 3 protocol arp u32 match u32 0 0 flowid 2:2',
];

const IFB_20M_CLASS_3 = [
  'class replace dev kifb parent 1: classid 1:3 htb rate 20000000bit ceil 20000000bit burst 3750b cburst 3750b quantum 2500 prio 0',
  'class replace dev kifb parent 1:3 classid 1:803 htb rate 2000000bit ceil 20000000bit burst 3028b cburst 3750b quantum 1514 prio 0',
  'class replace dev kifb parent 1:3 classid 1:1003 htb rate 18000000bit ceil 20000000bit burst 3750b cburst 3750b quantum 2250 prio 1',
  'qdisc replace dev kifb parent 1:803 handle 2003: bfifo limit 12500',
  'qdisc replace dev kifb parent 1:1003 handle 1003: tbf rate 100000000000bit burst 7500b limit 66250b',
];

test('the veth root for traffic to the pod: htb 2: with its two leaves and the interactive selectors', (t) => {
  t.deepEqual(vethLines('vethab', podLayout(10_000_000)), VETH_10M);
});

test("a pod's ifb side: class, leaves, their qdiscs, one interactive and one bulk node per address", (t) => {
  const rec = state({ ips: ['10.244.0.5', 'fd00::1a'], limits: { egress: 20_000_000 }, classId: 3, egressInstalled: true });
  t.deepEqual(ifbLines(IFB, rec), [
    ...IFB_20M_CLASS_3,
    'filter replace dev kifb parent 1: prio 8 handle 12:5:3 protocol ip u32 ht 12:5: match ip src 10.244.0.5/32 flowid 1:803',
    'filter replace dev kifb parent 1: prio 10 handle 10:5:3 protocol ip u32 ht 10:5: match ip src 10.244.0.5/32 flowid 1:1003',
    'filter replace dev kifb parent 1: prio 9 handle 13:1a:3 protocol ipv6 u32 ht 13:1a: match ip6 src fd00::1a/128 flowid 1:803',
    'filter replace dev kifb parent 1: prio 11 handle 11:1a:3 protocol ipv6 u32 ht 11:1a: match ip6 src fd00::1a/128 flowid 1:1003',
  ]);
  t.deepEqual(ifbLines(IFB, state({ limits: { ingress: 1_000_000 }, classId: 0 })), [], 'no egress limit: nothing on the ifb');
});

test('a second address of a family takes the node id + 0x800; a third is refused', (t) => {
  t.deepEqual(
    filtersFor(IFB, ['10.0.0.7', '10.0.1.7'], 0x12).map((f) => f.handle),
    ['12:7:12', '10:7:12', '12:7:812', '10:7:812'],
  );
  t.throws(() => filtersFor(IFB, ['10.0.0.1', '10.0.0.2', '10.0.0.3'], 1), { message: /more than two IPv4 addresses/ });
});

test('the shared ifb structure and the redirect', (t) => {
  const lines = structureLines(IFB);
  t.is(lines[0], 'qdisc replace dev kifb root handle 1: htb default 0 direct_qlen 1000');
  t.deepEqual(
    lines.filter((l) => l.includes('divisor 256')),
    [
      'filter add dev kifb parent 1: prio 8 handle 12: protocol ip u32 divisor 256',
      'filter add dev kifb parent 1: prio 9 handle 13: protocol ipv6 u32 divisor 256',
      'filter add dev kifb parent 1: prio 10 handle 10: protocol ip u32 divisor 256',
      'filter add dev kifb parent 1: prio 11 handle 11: protocol ipv6 u32 divisor 256',
    ],
  );
  t.is(lines.length, 13, 'per family: 3 interactive links and 1 bulk link, plus the 4 tables and the root');
  t.deepEqual(redirectLines('vethab', IFB), [
    'qdisc replace dev vethab ingress',
    'filter replace dev vethab parent ffff: prio 1 handle 800::800 protocol all u32 match u32 0 0 action mirred egress redirect dev kifb',
  ]);
});

test('plan: a new pod shaped both ways (the htb root line may fail, as on a veth that has ours)', (t) => {
  const next = state({ limits: { ingress: 10_000_000, egress: 20_000_000 }, classId: 3, ingressInstalled: true, egressInstalled: true });
  const plan = planEnsure(IFB, undefined, next, false);
  t.deepEqual(plan.pre, []);
  t.deepEqual(plan.lines, [
    ...VETH_10M,
    ...IFB_20M_CLASS_3,
    'filter replace dev kifb parent 1: prio 8 handle 12:5:3 protocol ip u32 ht 12:5: match ip src 10.244.0.5/32 flowid 1:803',
    'filter replace dev kifb parent 1: prio 10 handle 10:5:3 protocol ip u32 ht 10:5: match ip src 10.244.0.5/32 flowid 1:1003',
    ...redirectLines('vethab', IFB),
  ]);
  t.deepEqual([...plan.optional], [1]);
  t.deepEqual(next.filters, [
    { prio: 8, proto: 'ip', handle: '12:5:3' },
    { prio: 10, proto: 'ip', handle: '10:5:3' },
  ]);
});

test('plan: a shrinking bucket remakes the bulk leaf; a growing one changes it in place', (t) => {
  const prev = state({ limits: { ingress: 200_000_000, egress: 200_000_000 }, classId: 3, ingressInstalled: true, egressInstalled: true });
  prev.filters = filtersFor(IFB, prev.ips, 3).map(({ prio, proto, handle }) => ({ prio, proto, handle }));
  const down = planEnsure(
    IFB,
    prev,
    state({ limits: { ingress: 10_000_000, egress: 10_000_000 }, classId: 3, ingressInstalled: true, egressInstalled: true }),
    true,
  );
  t.deepEqual(down.pre, ['qdisc del dev vethab parent 2:3', 'qdisc del dev kifb parent 1:1003']);
  const up = planEnsure(
    IFB,
    { ...prev, limits: { ingress: 10_000_000, egress: 10_000_000 } },
    state({ limits: { ingress: 200_000_000, egress: 200_000_000 }, classId: 3, ingressInstalled: true, egressInstalled: true }),
    true,
  );
  t.deepEqual(up.pre, []);
});

test('plan: limits dropped remove their objects (the ifb classes go idle, their leaves go); a pod moved to a new veth clears the old one if it is still there', (t) => {
  const prev = state({
    limits: { ingress: 10_000_000, egress: 20_000_000 },
    classId: 3,
    ingressInstalled: true,
    egressInstalled: true,
    filters: [
      { prio: 8, proto: 'ip', handle: '12:5:3' },
      { prio: 10, proto: 'ip', handle: '10:5:3' },
    ],
  });
  const noEgress = planEnsure(IFB, prev, state({ limits: { ingress: 10_000_000 }, classId: 3, ingressInstalled: true }), true);
  t.deepEqual(noEgress.pre, [
    'qdisc del dev vethab ingress',
    'filter del dev kifb parent 1: prio 8 handle 12:5:3 protocol ip u32',
    'filter del dev kifb parent 1: prio 10 handle 10:5:3 protocol ip u32',
    'qdisc del dev kifb parent 1:803',
    'qdisc del dev kifb parent 1:1003',
  ]);
  t.deepEqual(noEgress.lines, VETH_10M);
  const noIngress = planEnsure(IFB, prev, state({ limits: { egress: 20_000_000 }, classId: 3, egressInstalled: true }), true);
  t.is(noIngress.lines[0], 'qdisc del dev vethab root');
  const moved = planEnsure(IFB, prev, state({ hostVeth: 'vethcd', limits: { ingress: 10_000_000 }, ingressInstalled: true }), true);
  t.deepEqual(moved.pre.slice(0, 2), ['qdisc del dev vethab root', 'qdisc del dev vethab ingress']);
  t.false(moved.pre.includes('qdisc del dev vethcd ingress'), 'the new veth never had our ingress qdisc');
  const movedGone = planEnsure(IFB, prev, state({ hostVeth: 'vethcd', limits: { ingress: 10_000_000 }, ingressInstalled: true }), false);
  t.false(
    movedGone.pre.some((l) => l.includes('vethab root')),
    'an old veth that is gone took its qdiscs with it',
  );
});

test('class ids: idle ones first, then the lowest unused; claims of kept ids; a clear error when all are taken', (t) => {
  const ids = new ClassIds(IFB);
  t.true(ids.claim(2));
  t.false(ids.claim(2), 'claimed twice');
  t.false(ids.claim(0));
  t.false(ids.claim(MAX_CLASS + 1));
  t.deepEqual(ids.allocate(), { id: 1, reused: false });
  t.deepEqual(ids.allocate(), { id: 3, reused: false });
  ids.release(3);
  ids.release(1);
  t.is(ids.pooled, 2);
  t.deepEqual(ids.allocate(), { id: 1, reused: true }, 'the lowest idle id, its classes kept');
  t.deepEqual(ids.allocate(), { id: 3, reused: true });
  t.deepEqual(ids.allocate(), { id: 4, reused: false }, 'no idle id left: a new one');
  ids.release(4);
  ids.free(4);
  t.is(ids.pooled, 0, 'freed: its classes are gone, not idle');
  ids.release(3);
  t.true(ids.claim(3), 'a kept state claims an idle id');
  t.is(ids.pooled, 0);
  ids.release(1);
  ids.forgetIdle();
  t.deepEqual(ids.allocate(), { id: 1, reused: false }, 'idle ids forgotten with the ifb root they lived on');
  for (let i = 4; i <= MAX_CLASS; i++) ids.allocate();
  t.throws(() => ids.allocate(), { message: `shaper: all ${MAX_CLASS} egress classes on kifb are in use` });
});

test("plan: a pod's ifb side first (no veth yet), then its veth's part alone", (t) => {
  const limits = { ingress: 10_000_000, egress: 20_000_000 };
  const first = state({ hostVeth: '', limits, classId: 3, egressInstalled: true });
  const early = planEnsure(IFB, undefined, first, false);
  t.deepEqual(early.pre, []);
  t.deepEqual(early.lines, [
    ...IFB_20M_CLASS_3,
    'filter replace dev kifb parent 1: prio 8 handle 12:5:3 protocol ip u32 ht 12:5: match ip src 10.244.0.5/32 flowid 1:803',
    'filter replace dev kifb parent 1: prio 10 handle 10:5:3 protocol ip u32 ht 10:5: match ip src 10.244.0.5/32 flowid 1:1003',
  ]);
  const late = planEnsure(IFB, first, state({ limits, classId: 3, ingressInstalled: true, egressInstalled: true }), false);
  t.deepEqual(late.pre, []);
  t.deepEqual(late.lines, [...VETH_10M, ...redirectLines('vethab', IFB)], 'the veth root and the redirect only');
  const other = planEnsure(
    IFB,
    first,
    state({ limits: { ...limits, egress: 30_000_000 }, classId: 3, ingressInstalled: true, egressInstalled: true }),
    false,
  );
  t.true(
    other.lines.some((l) => l.startsWith('class replace dev kifb')),
    'other limits than the ifb side was made with: made again',
  );
});

test('egress shards: names, what a name is, and the ip lines that make their ifbs', (t) => {
  t.deepEqual(
    [0, 1, 12].map((k) => shardIfb('kubenet-ifb0', k)),
    ['kubenet-ifb0', 'kubenet-ifb0.1', 'kubenet-ifb0.12'],
  );
  t.is(shardOf('kubenet-ifb0', 'kubenet-ifb0'), 0);
  t.is(shardOf('kubenet-ifb0', 'kubenet-ifb0.7'), 7);
  for (const other of ['kubenet-ifb0.', 'kubenet-ifb0.01', 'kubenet-ifb0.x', 'kubenet-ifb1', 'kubenet-ifb0.1.2'])
    t.is(shardOf('kubenet-ifb0', other), undefined, other);
  const lines = ifbLinkLines(
    ['i', 'i.1', 'i.2'],
    new Map([
      ['i', { txQLen: 1000 }],
      ['i.1', { txQLen: 0 }],
    ]),
  );
  t.deepEqual(lines, [
    'link set dev i up',
    'link set dev i.1 txqueuelen 1000',
    'link set dev i.1 up',
    'link add name i.2 type ifb',
    'link set dev i.2 txqueuelen 1000',
    'link set dev i.2 up',
  ]);
});

test('egress shards: a new pod goes to the shard with the fewest, the first of those', (t) => {
  const s = new Shards('kifb', 3);
  t.deepEqual(s.ifbs, ['kifb', 'kifb.1', 'kifb.2']);
  const on = (shard: number | undefined, classId = 1) => state({ classId, ...(shard === undefined ? {} : { shard }) });
  t.is(s.emptiest([]), 0);
  t.is(s.emptiest([on(undefined)]), 1, 'a state without a shard is on shard 0');
  t.is(s.emptiest([on(0), on(1)]), 2);
  t.is(s.emptiest([on(0), on(1), on(2), on(2, 2)]), 0);
  t.is(s.emptiest([on(0), on(1), state({ classId: 0 })]), 2, 'a pod without egress classes counts nowhere');
  t.is(s.ifbOf(on(2)), 'kifb.2');
  t.is(s.classIds(3), undefined, 'no such shard');
  t.throws(() => s.mustClassIds(3));
});

test("the node's tree: root default 1:fffd, node class at the capacity, pods under it with guarantee, ceiling and band", (t) => {
  const tree = { capacity: 100e6 };
  t.deepEqual(structureLines('kifb', tree).slice(0, 3), [
    'qdisc replace dev kifb root handle 1: htb default fffd direct_qlen 1000',
    'class replace dev kifb parent 1: classid 1:fffe htb rate 100000000bit ceil 100000000bit burst 18750b cburst 18750b quantum 1514 prio 0',
    'class replace dev kifb parent 1:fffe classid 1:fffd htb rate 1000bit ceil 100000000bit burst 3028b cburst 18750b quantum 1514 prio 5',
  ]);
  const rec: ShapingState = {
    version: 1,
    id: 'c',
    hostVeth: 'vethab',
    ips: ['10.1.0.5'],
    limits: { egressGuarantee: 60e6, priority: 2 },
    classId: 3,
    ingressInstalled: false,
    egressInstalled: true,
    filters: [],
  };
  const lines = ifbLines('kifb', rec, tree);
  t.is(
    lines[0],
    'class replace dev kifb parent 1:fffe classid 1:3 htb rate 60000000bit ceil 100000000bit burst 11250b cburst 18750b quantum 1514 prio 0',
  );
  t.regex(lines[1] ?? '', /classid 1:803 htb rate 6000000bit ceil 100000000bit .* prio 4$/);
  t.regex(lines[2] ?? '', /classid 1:1003 htb rate 54000000bit ceil 100000000bit .* prio 5$/);
  // Without a tree, a pod with no ceiling has no ifb side.
  t.deepEqual(ifbLines('kifb', rec), []);
});
