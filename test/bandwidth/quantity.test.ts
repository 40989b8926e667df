import test from 'ava';
import { ConfigError } from '../../src/errors.js';
import {
  bandwidthFromAnnotations,
  EGRESS_ANNOTATION,
  INGRESS_ANNOTATION,
  limitsFromRuntimeConfig,
  parseBandwidth,
} from '../../src/bandwidth/limits.js';
import { parseQuantity } from '../../src/bandwidth/quantity.js';
import {
  burstBytes,
  FRAME,
  htbQuantum,
  interactiveQueueBytes,
  leafParams,
  podLayout,
  queueLimitBytes,
  rateParams,
} from '../../src/shaper/sizing.js';
import { parseIfbListing } from '../../src/shaper/tc.js';

const valid: Array<[string, number]> = [
  ['500k', 500_000],
  ['10M', 10_000_000],
  ['1.5G', 1_500_000_000],
  ['1Gi', 2 ** 30],
  ['100Mi', 100 * 2 ** 20],
  ['1000', 1000],
  ['1k', 1000],
  ['1Ki', 1024],
  ['2T', 2e12],
  ['10T', 1e13],
  ['1e3', 1000],
  ['1E6', 1e6],
  ['+5M', 5e6],
  ['.5M', 500_000],
  ['2.M', 2e6],
  ['1000000m', 1000],
  ['1500.5', 1501], // rounded up like Quantity.Value()
  ['0.001M', 1000],
];

for (const [text, bits] of valid) {
  test(`quantity ${text} = ${bits} bit/s`, (t) => {
    t.is(parseBandwidth(text, 'x'), bits);
  });
}

test('parseQuantity keeps the sign and rejects junk', (t) => {
  t.is(parseQuantity('-5M'), -5_000_000n);
  t.is(parseQuantity('1Ei'), 2n ** 60n);
  for (const bad of [
    '',
    ' ',
    '10 Mbit',
    '1e3M',
    'abc',
    'M',
    '1MB',
    '1mi',
    '1.2.3',
    '5 M',
    '10M ',
    '1e',
    '0x10',
    'Infinity',
    'NaN',
    '1_000',
  ]) {
    t.is(parseQuantity(bad), undefined, bad);
  }
});

test("bandwidth below kubelet's 1k or above the 10T tc can enforce is refused, naming the value", (t) => {
  for (const bad of ['999', '0', '-5M', '1500m', '10.1T', '1P', '2E', '1Pi']) {
    t.throws(() => parseBandwidth(bad, 'x'), { instanceOf: ConfigError, message: new RegExp(bad.replace('.', '\\.')) }, bad);
  }
});

test('bandwidthFromAnnotations reads both directions', (t) => {
  t.deepEqual(bandwidthFromAnnotations(undefined), {});
  t.deepEqual(bandwidthFromAnnotations({ other: 'x' }), {});
  t.deepEqual(bandwidthFromAnnotations({ [INGRESS_ANNOTATION]: '20M', [EGRESS_ANNOTATION]: '10M' }), { ingress: 20e6, egress: 10e6 });
  t.deepEqual(bandwidthFromAnnotations({ [EGRESS_ANNOTATION]: '1Gi' }), { egress: 2 ** 30 });
});

test('invalid annotations name the annotation, the value and the accepted form', (t) => {
  for (const bad of ['10 Mbit', '-5M', '', '1e3M', 'abc', '100', '2P']) {
    const err = t.throws(() => bandwidthFromAnnotations({ [EGRESS_ANNOTATION]: bad }), { instanceOf: ConfigError });
    t.true(err?.message.includes(EGRESS_ANNOTATION), err?.message);
    t.true(err?.message.includes(JSON.stringify(bad)), err?.message);
  }
  const err = t.throws(() => bandwidthFromAnnotations({ [INGRESS_ANNOTATION]: 'abc', [EGRESS_ANNOTATION]: '1M' }), {
    instanceOf: ConfigError,
  });
  t.true(err?.message.includes(INGRESS_ANNOTATION));
  // What an operator reads (issue 34): the annotation, the value and the accepted form, in one line.
  t.is(
    t.throws(() => bandwidthFromAnnotations({ [INGRESS_ANNOTATION]: '10 Mbit' }))?.message,
    'annotation kubernetes.io/ingress-bandwidth: "10 Mbit" is not a bandwidth: want a number of bits/s with an optional suffix k, M, G, T (or Ki, Mi, Gi, Ti) and no space or unit, e.g. "10M" or "500k"',
  );
});

test('sizing: bursts small but at least two frames, queues bounded, quantum in htb range', (t) => {
  t.is(burstBytes(10e6), 2 * FRAME);
  t.is(burstBytes(1e9), 187_500);
  t.is(burstBytes(10e6, 80_000), 10_000);
  t.is(burstBytes(10e6, 8), 2 * FRAME);
  // containerd's 2^31-1 bit burst is cut to 100 ms of the rate.
  t.is(burstBytes(10e6, 2 ** 31 - 1), 125_000);
  // The bulk queue is the reference plugin's (25 ms of the rate + burst), at least 8 frames.
  t.is(queueLimitBytes(1e6), 8 * FRAME);
  t.is(queueLimitBytes(1e5), 8 * FRAME);
  t.is(queueLimitBytes(10e6), 31_250 + 2 * FRAME);
  t.is(queueLimitBytes(100e6), 312_500 + 18_750);
  t.is(queueLimitBytes(1e9), 3_125_000 + 187_500);
  t.is(rateParams(100e6).limit, 331_250);
  t.is(interactiveQueueBytes(10e6), 8 * FRAME);
  t.is(interactiveQueueBytes(1e9), 625_000);
  for (const r of [1e3, 1e6, 1e9, 1e12, 1e15]) {
    const q = htbQuantum(r);
    t.true(q >= FRAME && q <= 200_000);
    const p = rateParams(r);
    const leaf = leafParams(p);
    t.true(leaf.rate >= Math.min(1e18, 1000 * p.rate) && leaf.rate >= 100e9 && leaf.burst >= 2 * FRAME && leaf.limit === p.limit);
    t.is(leafParams(rateParams(1e6)).burst, 2 * FRAME);
    t.is(leafParams(rateParams(10e6)).burst, 3750);
    t.is(leafParams(rateParams(1e9)).burst, 375_000);
  }
  // The first second of a fresh 10M transfer may exceed the limit by the burst only.
  t.true(burstBytes(10e6) * 8 < 0.01 * 10e6);
});

test('sizing: a pod class at the limit, interactive leaf first with 10% assured, bulk the rest', (t) => {
  for (const r of [1e5, 1e6, 10e6, 100e6, 1e9, 10e9]) {
    const l = podLayout(r);
    t.is(l.pod.rate, r);
    t.is(l.pod.ceil, r);
    t.is(l.interactive.rate + l.bulk.rate, r, 'assured rates add up to the limit');
    t.is(l.interactive.rate, Math.round(r / 10));
    t.is(l.interactive.ceil, r, 'either leaf may use the whole limit');
    t.is(l.bulk.ceil, r);
    t.true(l.interactive.prio < l.bulk.prio, 'interactive is dequeued first');
    t.true(l.interactive.burst >= 2 * FRAME && l.bulk.burst === l.pod.burst);
    t.true(l.interactive.quantum >= FRAME && l.bulk.quantum >= FRAME);
    t.is(l.interactive.queue, interactiveQueueBytes(r));
    t.is(l.bulk.leaf.limit, queueLimitBytes(r));
  }
  // An explicit burst sizes the pod class and the bulk leaf's queue (as the reference does).
  const l = podLayout(10e6, 80_000);
  t.is(l.pod.burst, 10_000);
  t.is(l.bulk.leaf.limit, 31_250 + 10_000);
});

test('ifb listing parser finds structure, classes and pod filters', (t) => {
  const text = `qdisc htb 1: root refcnt 2 r2q 10 default 0 direct_packets_stat 0 direct_qlen 1000
qdisc tbf 1003: parent 1:3 rate 1Gbit burst 6054b lat 0us
class htb 1:3 root leaf 1003: prio 0 rate 10Mbit ceil 10Mbit burst 3026b cburst 3026b
class tbf 1003:1 parent 1003:
filter protocol ip pref 10 u32 chain 0
filter protocol ip pref 10 u32 chain 0 fh 10: ht divisor 256
filter protocol ip pref 10 u32 chain 0 fh 10:b:3 order 3 key ht 10 bkt b *flowid 1:3 not_in_hw
  match 0a61000b/ffffffff at 12
filter protocol ip pref 10 u32 chain 0 fh 800: ht divisor 1
filter protocol ip pref 10 u32 chain 0 fh 800::800 order 2048 key ht 800 bkt 0 link 10: not_in_hw
filter protocol ipv6 pref 11 u32 chain 0 fh 11: ht divisor 256
filter protocol ipv6 pref 11 u32 chain 0 fh 11:11:803 order 2051 key ht 11 bkt 11 *flowid 1:3 not_in_hw
filter protocol ipv6 pref 11 u32 chain 0 fh 801::800 order 2048 key ht 801 bkt 0 link 11: not_in_hw
`;
  const l = parseIfbListing(text);
  t.true(l.htbRoot);
  t.deepEqual([...l.tables].sort(), ['10', '11']);
  t.deepEqual([...l.links].sort(), ['10', '11']);
  t.deepEqual([...l.classes], [3]);
  t.deepEqual(l.podFilters, [
    { proto: 'ip', prio: 10, handle: '10:b:3', flowid: 3 },
    { proto: 'ipv6', prio: 11, handle: '11:11:803', flowid: 3 },
  ]);
});

test('ifb listing parser: interactive tables, their links and nodes, leaf classes', (t) => {
  const text = `qdisc htb 1: root refcnt 2 r2q 10 default 0 direct_packets_stat 0 direct_qlen 1000
class htb 1:1001 parent 1:1 leaf 1001: prio 1 rate 9Mbit ceil 10Mbit burst 3026b cburst 3026b
class htb 1:801 parent 1:1 leaf 2001: prio 0 rate 1Mbit ceil 10Mbit burst 3028b cburst 3026b
class htb 1:1 root rate 10Mbit ceil 10Mbit burst 3026b cburst 3026b
filter protocol ip pref 8 u32 chain 0 fh 12: ht divisor 256
filter protocol ip pref 8 u32 chain 0 fh 12:a:1 order 1 key ht 12 bkt a *flowid 1:801 not_in_hw
filter protocol ip pref 8 u32 chain 0 fh 800::801 order 2049 key ht 800 bkt 0 link 12: not_in_hw
filter protocol ipv6 pref 9 u32 chain 0 fh 13: ht divisor 256
filter protocol ipv6 pref 9 u32 chain 0 fh 13:a:1 order 1 key ht 13 bkt a *flowid 1:801 not_in_hw
filter protocol ipv6 pref 9 u32 chain 0 fh 801::800 order 2048 key ht 801 bkt 0 link 13: not_in_hw
filter protocol ip pref 10 u32 chain 0 fh 10: ht divisor 256
filter protocol ip pref 10 u32 chain 0 fh 10:a:1 order 1 key ht 10 bkt a *flowid 1:1001 not_in_hw
filter protocol ip pref 10 u32 chain 0 fh 802::800 order 2048 key ht 802 bkt 0 link 10: not_in_hw
`;
  const l = parseIfbListing(text);
  t.deepEqual([...l.tables].sort(), ['10', '12', '13']);
  t.deepEqual([...l.links].sort(), ['10', '12', '13']);
  t.deepEqual(
    [...l.classes].sort((x, y) => x - y),
    [1, 0x801, 0x1001],
  );
  t.deepEqual(
    l.podFilters.map((f) => f.handle),
    ['12:a:1', '13:a:1', '10:a:1'],
  );
});

test('runtimeConfig.bandwidth: camelCase and PascalCase, 0 and the uint32-max burst mean none, bounds named', (t) => {
  t.deepEqual(limitsFromRuntimeConfig({ ingressRate: 20e6, egressRate: 10e6, egressBurst: 80000 }), {
    ingress: 20e6,
    egress: 10e6,
    egressBurst: 80000,
  });
  t.deepEqual(limitsFromRuntimeConfig({ IngressRate: 20e6, IngressBurst: 4294967295 }), { ingress: 20e6 });
  t.is(limitsFromRuntimeConfig({ ingressRate: 0, egressRate: 0 }), undefined);
  t.is(limitsFromRuntimeConfig(undefined), undefined);
  t.throws(() => limitsFromRuntimeConfig({ ingressRate: 999 }), {
    instanceOf: ConfigError,
    message: /runtimeConfig\.bandwidth\.ingressRate 999 is outside/,
  });
  t.throws(() => limitsFromRuntimeConfig([]), { instanceOf: ConfigError, message: /must be an object/ });
});
