/**
 * Live re-shaping's decisions (which pod updates re-shape, which are refused, which Events), the
 * `kubenet shape` request, the rate tracker, the per-pod metrics' series and the `kubenet top`
 * frame: pure, against a fake core (no kernel).
 */
import test from 'ava';
import { pino } from 'pino';
import { ConfigError, UnknownPodError } from '../../../src/errors.js';
import { LiveShaping, parseShapeRequest } from '../../../src/daemon/shaping/live-shaping.js';
import { AgentMetrics } from '../../../src/daemon/http/metrics.js';
import { RateTracker } from '../../../src/daemon/shaping/rates.js';
import type { BandwidthLimits, PodTraffic } from '../../../src/pod/index.js';
import { rateText, renderTop } from '../../../src/cli/top.js';
import type { StatusReport } from '../../../src/daemon/agent.js';
import { fakeEvents, fakeNetwork, podRecord as record } from '../../kit/fake-core.js';

const silent = pino({ level: 'silent' });
const M = 1e6;

const update = (name: string, annotations: Record<string, string>, previous?: Record<string, string>) => ({
  namespace: 'default',
  name,
  uid: `uid-${name}`,
  annotations,
  previous,
});
const EG = 'kubernetes.io/egress-bandwidth';
const IN = 'kubernetes.io/ingress-bandwidth';

test('a bandwidth annotation change re-shapes the pod and is a Normal event; other changes, other pods and the same values do nothing', async (t) => {
  const { network, reshapes: calls } = fakeNetwork([
    record('web', { egress: 10 * M, egressBurst: 80_000, ingress: 5 * M, ingressBurst: 40_000 }),
  ]);
  const ev = fakeEvents();
  const live = new LiveShaping(network, ev.rec, undefined, silent);
  await live.onPodUpdate(update('web', { [EG]: '10M', [IN]: '5M', other: 'x' }, { [EG]: '10M', [IN]: '5M' }));
  t.deepEqual(calls, [], 'an unrelated annotation changed');
  await live.onPodUpdate(update('stranger', { [EG]: '1M' }, {}));
  t.deepEqual(calls, [], 'a pod the agent did not set up');
  await live.onPodUpdate(update('web', { [EG]: '20M', [IN]: '5M' }, { [EG]: '10M', [IN]: '5M' }));
  t.deepEqual(
    calls,
    [{ id: 'web-id', limits: { egress: 20 * M, ingress: 5 * M, ingressBurst: 40_000 } }],
    'the new rate, and the unchanged direction keeps its burst',
  );
  t.deepEqual(ev.got, [
    {
      pod: { namespace: 'default', name: 'web', uid: 'uid-web' },
      type: 'Normal',
      reason: 'BandwidthApplied',
      message: 'bandwidth limits applied: ingress 5M, egress 20M (were ingress 5M, egress 10M)',
    },
  ]);
  await live.onPodUpdate(update('web', { [IN]: '5M' }, { [EG]: '20M', [IN]: '5M' }));
  t.deepEqual(calls[1]?.limits, { ingress: 5 * M, ingressBurst: 40_000 }, 'the egress annotation removed');
  await live.onPodUpdate(update('web', {}, { [IN]: '5M' }));
  t.deepEqual(calls[2]?.limits, {});
  t.is(ev.got[2]?.message, 'bandwidth limits removed (were ingress 5M)');
});

test('an invalid new value keeps the old limits and is a Warning naming the annotation and the error', async (t) => {
  const { network, reshapes: calls } = fakeNetwork([record('web', { egress: 10 * M })]);
  const ev = fakeEvents();
  const live = new LiveShaping(network, ev.rec, undefined, silent);
  await live.onPodUpdate(update('web', { [EG]: '10 Mbit' }, { [EG]: '10M' }));
  t.deepEqual(calls, []);
  t.is(ev.got.length, 1);
  t.like(ev.got[0], { type: 'Warning', reason: 'BandwidthRejected' });
  t.regex(
    ev.got[0]?.message ?? '',
    /^annotation kubernetes\.io\/egress-bandwidth: "10 Mbit" is not a bandwidth: want a number of bits\/s with an optional suffix .*e\.g\. "10M" or "500k"; the pod keeps its limits \(egress 10M\)$/,
  );
  // Both changed, one invalid: nothing applies.
  await live.onPodUpdate(update('web', { [EG]: '20M', [IN]: '2P' }, { [EG]: '10 Mbit' }));
  t.deepEqual(calls, []);
  t.regex(ev.got[1]?.message ?? '', /ingress-bandwidth.*above the maximum/);
});

test('a pod of this node not set up here (containerd refused its sandbox) with an unparsable annotation gets one Warning naming the annotation, the value and the accepted form; an ADD refused for the same values adds none; host-network pods are left alone', async (t) => {
  const { network, reshapes } = fakeNetwork([]);
  const ev = fakeEvents();
  const annotations: Record<string, Record<string, string>> = {};
  const pods = {
    annotations: async () => undefined,
    cachedAnnotations: (_ns: string, name: string) => annotations[name],
    uid: (_ns: string, name: string) => `uid-${name}`,
  };
  const live = new LiveShaping(network, ev.rec, pods, silent);
  const seen = async (name: string, a: Record<string, string>, previous?: Record<string, string>, extra: object = {}) => {
    annotations[name] = a;
    await live.onPodUpdate({ ...update(name, a, previous), ...extra });
  };
  await seen('bad', { [IN]: '10 Mbit' });
  t.is(ev.got.length, 1);
  t.like(ev.got[0], { pod: { namespace: 'default', name: 'bad', uid: 'uid-bad' }, type: 'Warning', reason: 'BandwidthRejected' });
  const message = ev.got[0]?.message ?? '';
  t.true(message.includes('kubernetes.io/ingress-bandwidth') && message.includes('"10 Mbit"'), message);
  t.regex(message, /e\.g\. "10M"|such as 10M|e\.g\. 10M/, 'the accepted form');
  t.regex(message, /cannot be set up until the annotation is fixed or removed$/);
  await seen('bad', { [IN]: '10 Mbit', other: 'x' }, { [IN]: '10 Mbit' });
  live.refused({ namespace: 'default', name: 'bad' }, new Error('an ADD refused for the same value'));
  t.is(ev.got.length, 1, 'told once per pod and value');
  await seen('bad', { [IN]: '10 Mbit', [EG]: '5 M' }, { [IN]: '10 Mbit' });
  t.is(ev.got.length, 2, 'another wrong value is told');
  await seen('bad', { [IN]: '10M' }, { [IN]: '10 Mbit', [EG]: '5 M' });
  t.is(ev.got.length, 2, 'fixed: nothing to tell');
  await seen('bad', { [IN]: '10 Mbit' }, { [IN]: '10M' });
  t.is(ev.got.length, 3, 'wrong again after a fix: told again');
  live.refused({ namespace: 'default', name: 'other' }, new Error('annotation kubernetes.io/egress-bandwidth: refused at ADD'));
  t.is(ev.got.length, 4, 'an ADD refused for values the watch has not told of is a Warning');
  await seen('host', { [EG]: 'lots' }, undefined, { hostNetwork: true });
  await seen('fine', { [EG]: '1M' });
  t.is(ev.got.length, 4, 'a host-network pod and a valid value: nothing');
  t.deepEqual(reshapes, []);
});

test('a pod seen for the first time re-shapes only when it carries a bandwidth annotation with other rates', async (t) => {
  const { network, reshapes: calls } = fakeNetwork([
    record('a', { egress: 10 * M, egressBurst: 1000 }),
    record('b', { egress: 10 * M }),
    record('c', { egress: 10 * M }),
  ]);
  const ev = fakeEvents();
  const live = new LiveShaping(network, ev.rec, undefined, silent);
  await live.onPodUpdate(update('a', { [EG]: '10M' })); // same rate (runtimeConfig burst kept)
  await live.onPodUpdate(update('b', {})); // no annotation: its limits may be the runtime's
  await live.onPodUpdate(update('c', { [EG]: '30M' }));
  t.deepEqual(calls, [{ id: 'c-id', limits: { egress: 30 * M } }]);
});

test('kubenet shape: sets the given directions, keeps the others, --clear starts from none; unknown pods and bad requests refused', async (t) => {
  const { network, reshapes: calls } = fakeNetwork([record('web', { ingress: 20 * M, egress: 10 * M })]);
  const ev = fakeEvents();
  const live = new LiveShaping(network, ev.rec, undefined, silent);
  const r = await live.shape('default', 'web', parseShapeRequest({ ingress: '40M' }));
  t.deepEqual(
    r.map((p) => [p.limits, p.previous, p.changed]),
    [[{ ingress: 40 * M, egress: 10 * M }, { ingress: 20 * M, egress: 10 * M }, true]],
  );
  const same = await live.shape('default', 'web', parseShapeRequest({ egress: '10M' }));
  t.false(same[0]?.changed);
  await live.shape('default', 'web', parseShapeRequest({ clear: true, egress: '1M' }));
  t.deepEqual(
    calls.map((c) => c.limits),
    [{ ingress: 40 * M, egress: 10 * M }, { egress: 1 * M }],
  );
  await live.shape('default', 'web', parseShapeRequest({ clear: true }));
  t.deepEqual(calls[2]?.limits, {});
  await t.throwsAsync(live.shape('default', 'nobody', { clear: true }), { instanceOf: UnknownPodError });
  for (const bad of [{}, { ingress: 5 }, { ingress: '10 Mbit' }, { egress: '100' }, { clear: 'yes' }, { rate: '1M' }, [], null]) {
    t.throws(() => parseShapeRequest(bad), { instanceOf: ConfigError }, JSON.stringify(bad));
  }
});

/** A fake network whose reshape the "kernel" refuses while `refuse` says so (the call is still counted). */
function refusingNetwork(records: Parameters<typeof fakeNetwork>[0]) {
  const f = fakeNetwork(records);
  const state = { refuse: (_id: string) => false, tries: 0 };
  const reshape = f.network.reshape.bind(f.network);
  f.network.reshape = async (...a: Parameters<typeof reshape>) => {
    state.tries++;
    if (state.refuse(a[0])) throw new Error('RTNETLINK answers: No buffer space available');
    return reshape(...a);
  };
  return { ...f, state };
}

test('a re-shape the kernel refuses is a Warning saying when it is tried again, counted, and retried with backoff from the annotations as the watch has them then, until it applies', async (t) => {
  const net = refusingNetwork([record('web', { egress: 10 * M })]);
  const ev = fakeEvents();
  const annotations: Record<string, Record<string, string>> = { web: { [EG]: '20M' } };
  const pods = {
    annotations: async () => undefined,
    cachedAnnotations: (_ns: string, n: string) => annotations[n],
    uid: (_ns: string, n: string) => `uid-${n}`,
  };
  const live = new LiveShaping(net.network, ev.rec, pods, silent);
  t.teardown(() => live.stop());
  net.state.refuse = () => true;
  await live.onPodUpdate(update('web', { [EG]: '20M' }, { [EG]: '10M' }));
  t.deepEqual(net.reshapes, [], 'refused');
  t.is(live.failures, 1);
  t.is(live.retrying, 1);
  t.like(ev.got[0], { type: 'Warning', reason: 'BandwidthRejected' });
  t.regex(
    ev.got[0]?.message ?? '',
    /^could not apply bandwidth limits egress 20M: RTNETLINK answers: No buffer space available; the pod keeps egress 10M; trying again in 0\.[5-9] s|1\.0 s$/,
  );
  // The pod changes meanwhile without a bandwidth change (nothing to do for the watch): the retry stays.
  await live.onPodUpdate(update('web', { [EG]: '20M', other: 'x' }, { [EG]: '20M' }));
  t.is(live.retrying, 1);
  // The first retry (0.5-1 s) is refused too; the annotation changed before the second, which applies it.
  await until(() => net.state.tries >= 2, 1500);
  t.is(live.failures, 2);
  t.regex(ev.got[1]?.message ?? '', /trying again in (1\.[0-9]|2\.0) s$/, 'the wait doubles');
  annotations.web = { [EG]: '30M' };
  net.state.refuse = () => false;
  await until(() => net.reshapes.length === 1, 2500);
  t.deepEqual(net.reshapes, [{ id: 'web-id', limits: { egress: 30 * M } }], 'the pod as the watch has it at the retry');
  t.like(ev.got[2], { type: 'Normal', reason: 'BandwidthApplied', message: 'bandwidth limits applied: egress 30M (were egress 10M)' });
  t.is(live.retrying, 0);
  // Metrics: the refusals and the pods waiting.
  const m = new AgentMetrics(undefined, undefined, undefined, () => ({
    failures: live.failures,
    retrying: live.retrying,
    queued: live.queued,
  }));
  const body = (await m.text([], 0, [])).body;
  t.regex(body, /^kubenet_pod_reshape_failures_total 2$/m);
  t.regex(body, /^kubenet_pod_reshapes_retrying 0$/m);
  t.regex(body, /^kubenet_pod_reshapes_queued 0$/m);
});

test('a newer change that applies ends the pending retry; a pod gone ends it too; stop() ends them all and queues nothing more', async (t) => {
  const net = refusingNetwork([record('web', { egress: 10 * M }), record('db', { egress: 10 * M })]);
  const ev = fakeEvents();
  const live = new LiveShaping(net.network, ev.rec, undefined, silent);
  net.state.refuse = () => true;
  await live.onPodUpdate(update('web', { [EG]: '20M' }, { [EG]: '10M' }));
  await live.onPodUpdate(update('db', { [EG]: '20M' }, { [EG]: '10M' }));
  t.is(live.retrying, 2);
  net.state.refuse = (id) => id === 'db-id';
  await live.onPodUpdate(update('web', { [EG]: '40M' }, { [EG]: '20M' }));
  t.is(live.retrying, 1, "web's newer change applied: its retry ended");
  t.deepEqual(net.reshapes, [{ id: 'web-id', limits: { egress: 40 * M } }]);
  net.records.splice(
    net.records.findIndex((r) => r.name === 'db'),
    1,
  );
  await until(() => live.retrying === 0, 1500);
  t.is(net.reshapes.length, 1, 'nothing applied for the pod that went');
  net.records.push(record('db', { egress: 10 * M }));
  await live.onPodUpdate(update('db', { [EG]: '20M' }, { [EG]: '10M' }));
  t.is(live.retrying, 1);
  live.stop();
  t.is(live.retrying, 0);
  const tries = net.state.tries;
  await new Promise((r) => setTimeout(r, 1200));
  t.is(net.state.tries, tries, 'no retry after stop()');
  // After stop() nothing is queued: an update changes nothing, tries nothing, tells nothing.
  const [failures, told] = [live.failures, ev.got.length];
  await live.onPodUpdate(update('db', { [EG]: '30M' }, { [EG]: '20M' }));
  t.is(net.state.tries, tries);
  t.is(live.failures, failures);
  t.is(live.retrying, 0);
  t.is(ev.got.length, told);
});

test("kubenet shape: a refusal is the answer (the kernel's error) and a Warning, not retried", async (t) => {
  const net = refusingNetwork([record('web', { egress: 10 * M })]);
  const ev = fakeEvents();
  const live = new LiveShaping(net.network, ev.rec, undefined, silent);
  net.state.refuse = () => true;
  await t.throwsAsync(live.shape('default', 'web', { egress: 20 * M, clear: false }), { message: /No buffer space available/ });
  t.is(live.failures, 1);
  t.is(live.retrying, 0);
  t.like(ev.got[0], { type: 'Warning', reason: 'BandwidthRejected' });
  t.regex(ev.got[0]?.message ?? '', /^could not apply bandwidth limits egress 20M: .*; the pod keeps egress 10M$/);
});

async function until(cond: () => boolean, ms: number): Promise<void> {
  const end = Date.now() + ms;
  while (!cond()) {
    if (Date.now() > end) throw new Error(`not within ${ms} ms`);
    await new Promise((r) => setTimeout(r, 20));
  }
}

function traffic(
  name: string,
  ingressBytes: number | undefined,
  egressBytes: number | undefined,
  link?: { rx: number; tx: number },
): PodTraffic {
  const dir = (bytes: number) => ({ limit: 10 * M, bytes, packets: bytes / 1000, drops: bytes / 1e6, overlimits: 3, backlog: 0 });
  const t: PodTraffic = {
    record: record(name, {
      ...(ingressBytes !== undefined ? { ingress: 10 * M } : {}),
      ...(egressBytes !== undefined ? { egress: 10 * M } : {}),
    }),
  };
  if (ingressBytes !== undefined || egressBytes !== undefined) {
    t.shaping = {
      id: `${name}-id`,
      hostVeth: 'v',
      ...(ingressBytes !== undefined ? { ingress: dir(ingressBytes) } : {}),
      ...(egressBytes !== undefined ? { egress: dir(egressBytes) } : {}),
    };
  }
  if (link) t.link = { rxBytes: link.rx, txBytes: link.tx, rxPackets: 0, txPackets: 0, rxDropped: 0, txDropped: 0 };
  return t;
}

test('rates: bytes over time per direction, tc for a shaped direction and the veth for an unshaped one; a re-made counter gives no rate', async (t) => {
  let now = 0;
  let snapshot: PodTraffic[] = [];
  const tracker = new RateTracker(async () => snapshot, silent, { now: () => now, periodMs: 1000 });
  t.teardown(() => tracker.stop());
  snapshot = [traffic('a', 0, 0), traffic('b', undefined, 1000, { rx: 5000, tx: 0 })];
  await tracker.sample();
  now = 2000;
  snapshot = [traffic('a', 2_500_000, 1_250_000), traffic('b', undefined, 0, { rx: 25_000, tx: 2_000_000 })];
  await tracker.sample();
  const r = await tracker.rates(5);
  t.deepEqual(r.get('a-id@eth0'), { seconds: 2, ingress: 10 * M, egress: 5 * M, ingressDrops: 1.25, egressDrops: 0.625 });
  // b: ingress from the veth (tx = to the pod); egress's tc counter went down (re-made): no rate.
  t.deepEqual(r.get('b-id@eth0'), { seconds: 2, ingress: 8 * M, ingressDrops: 0 });
  now = 8000;
  snapshot = [traffic('a', 2_500_000 + 6 * 1_250_000, 1_250_000)];
  await tracker.sample();
  const later = await tracker.rates(7);
  t.is(later.get('a-id@eth0')?.seconds, 6, 'the window reaches back to the earliest sample in it');
  t.is(later.get('a-id@eth0')?.ingress, 10 * M);
  t.is(later.get('b-id@eth0'), undefined, 'a pod gone');
});

test('rates after a quiet time are measured anew (one period), never against samples from before it', async (t) => {
  let now = 0;
  let bytes = 0;
  const tracker = new RateTracker(async () => [traffic('a', bytes, undefined)], silent, { now: () => now, periodMs: 50, idleAfterMs: 100 });
  t.teardown(() => tracker.stop());
  await tracker.sample();
  now = 50;
  bytes = 1_000_000; // 160 Mbit/s over 50 ms
  t.is((await tracker.rates(1)).get('a-id@eth0')?.ingress, 160 * M);
  tracker.stop(); // what the timer does once nobody asked for idleAfterMs
  now = 60_000;
  bytes = 2_000_000;
  const pending = tracker.rates(1);
  now = 60_050; // the tracker waits one period (real time) and samples again
  bytes = 2_000_000 + 62_500;
  const r = (await pending).get('a-id@eth0');
  t.is(r?.seconds, 0.05);
  t.is(r?.ingress, 10 * M, 'over the last period, not since the sample of a minute ago');
});

test('metrics: one series per shaped pod and direction, rebuilt at each scrape (a deleted pod leaves none)', async (t) => {
  const m = new AgentMetrics();
  const text = async (tr: PodTraffic[]) =>
    (
      await m.text(
        tr.map((x) => x.record),
        0,
        tr,
      )
    ).body;
  const first = await text([traffic('a', 1000, undefined), traffic('b', 2000, 3000), traffic('c', undefined, undefined)]);
  t.regex(first, /^kubenet_pod_shaped_bytes_total\{namespace="default",pod="a",direction="ingress"\} 1000$/m);
  t.regex(first, /^kubenet_pod_shaped_bytes_total\{namespace="default",pod="b",direction="egress"\} 3000$/m);
  t.regex(first, /^kubenet_pod_bandwidth_limit_bits_per_second\{namespace="default",pod="b",direction="ingress",source="pod"\} 10000000$/m);
  t.regex(first, /^kubenet_pod_shaped_overlimits_total\{namespace="default",pod="a",direction="ingress"\} 3$/m);
  t.false(/pod="a",direction="egress"/.test(first));
  t.false(/^(?!kubenet_pod_info\{).*pod="c"/m.test(first), 'an unshaped pod has no shaping series');
  t.regex(first, /^kubenet_pod_info\{namespace="default",pod="c",ips="10\.0\.0\.2"\} 1$/m, 'but its info series');
  const second = await text([traffic('b', 2500, 3500)]);
  t.false(/pod="a"/.test(second), 'a is gone');
  t.regex(second, /^kubenet_pod_shaped_bytes_total\{namespace="default",pod="b",direction="ingress"\} 2500$/m);
  t.is(second.match(/^kubenet_pod_shaped_bytes_total\{/gm)?.length, 2);
});

test('metrics: the per-pod text is encoded once and sent again as it is while no line of it changes', async (t) => {
  const m = new AgentMetrics();
  const scrape = async (tr: PodTraffic[]) =>
    (
      await m.exposition(
        tr.map((x) => x.record),
        0,
        tr,
      )
    ).parts;
  const [base, pods] = await scrape([traffic('a', 1000, 2000), traffic('b', 3000, undefined)]);
  t.true(typeof base === 'string' && base.includes('kubenet_pods 2'), 'the base metrics first');
  t.true(Buffer.isBuffer(pods));
  t.regex(pods?.toString() ?? '', /pod="a",direction="egress"\} 2000$/m);
  const again = (await scrape([traffic('a', 1000, 2000), traffic('b', 3000, undefined)]))[1];
  t.is(again, pods, 'the same Buffer: nothing built, nothing encoded');
  const moved = (await scrape([traffic('a', 1000, 2500), traffic('b', 3000, undefined)]))[1];
  t.not(moved, pods);
  t.regex(moved?.toString() ?? '', /pod="a",direction="egress"\} 2500$/m);
  const fewer = (await scrape([traffic('a', 1000, 2500)]))[1];
  t.notRegex(fewer?.toString() ?? '', /pod="b"/, 'a pod gone is a change too');
});

test('top: rates in short units, busiest pod first, limits and drops per direction, cut to the terminal', (t) => {
  t.deepEqual(
    [rateText(undefined), rateText(0), rateText(0.5), rateText(950), rateText(19_876_000), rateText(1.5e9), rateText(250e6)],
    ['-', '0', '0.5', '950', '19.9M', '1.5G', '250M'],
  );
  const pod = (name: string, limits: BandwidthLimits, rate?: StatusReport['pods'][number]['rate']): StatusReport['pods'][number] => ({
    namespace: 'demo',
    name,
    id: `${name}-id`,
    phase: 'ready',
    ips: [],
    hostVeth: 'v',
    limits,
    ...(rate ? { rate } : {}),
  });
  const s: StatusReport = {
    podCIDR: '10.244.0.0/24',
    bridge: 'cbr0',
    ready: true,
    pods: [
      pod('idle', {}, { seconds: 1, ingress: 0, egress: 0 }),
      pod('gold', { ingress: 40 * M, egress: 20 * M }, { seconds: 1, ingress: 39.8e6, egress: 1e5, ingressDrops: 2, egressDrops: 0 }),
      pod('new', { egress: 5 * M }),
    ],
  };
  const lines = renderTop(s, { intervalS: 1, now: new Date(2025, 0, 1, 12, 0, 1) });
  t.is(lines[0], 'kubenet top - 12:00:01  pod CIDR 10.244.0.0/24  pods 3 (2 shaped)  every 1 s');
  t.regex(lines[2] ?? '', /^POD +IN RATE +IN LIMIT +IN DROP\/s +OUT RATE +OUT LIMIT +OUT DROP\/s$/);
  t.regex(lines[3] ?? '', /^demo\/gold +39\.8M +40M +2\.0 +100k +20M +0$/);
  t.regex(lines[4] ?? '', /^demo\/idle +0 +- +- +0 +- +-$/);
  t.regex(lines[5] ?? '', /^demo\/new +- +- +- +- +5M +-$/);
  t.true(renderTop(s, { intervalS: 1, width: 30, height: 4 }).every((l) => l.length <= 30));
  t.is(renderTop(s, { intervalS: 1, width: 30, height: 4 }).length, 4);
});

test('the pod watch only queues: its handler returns while the kernel is busy, and a pod changed twice meanwhile is re-shaped once, to its newest limits', async (t) => {
  const f = fakeNetwork([record('web', { egress: 10 * M }), record('db', { egress: 10 * M })]);
  const reshape = f.network.reshape.bind(f.network);
  const gates: Array<() => void> = [];
  f.network.reshape = async (...a: Parameters<typeof reshape>) => {
    await new Promise<void>((r) => gates.push(r));
    return reshape(...a);
  };
  let listener: ((u: ReturnType<typeof update>) => void | Promise<void>) | undefined;
  const pods = { annotations: async () => undefined, onPodUpdate: (fn: typeof listener) => void (listener = fn) };
  const live = new LiveShaping(f.network, fakeEvents().rec, pods, silent);
  t.teardown(() => live.stop());
  live.start();
  const tell = async (u: ReturnType<typeof update>) => {
    const t0 = performance.now();
    await listener?.(u);
    return performance.now() - t0;
  };
  const ms = [
    await tell(update('web', { [EG]: '20M' }, { [EG]: '10M' })),
    await tell(update('db', { [EG]: '15M' }, { [EG]: '10M' })),
    await tell(update('web', { [EG]: '30M' }, { [EG]: '20M' })),
    await tell(update('web', { [EG]: '40M' }, { [EG]: '30M' })),
  ];
  t.true(
    ms.every((x) => x < 50),
    `each handler returned with the kernel call pending (${ms.map((x) => x.toFixed(1)).join(', ')} ms)`,
  );
  await until(() => gates.length === 1, 1000);
  t.is(live.queued, 2, "db and web's merged change wait behind web's first");
  while (f.reshapes.length < 3) {
    gates.shift()?.();
    await until(() => gates.length > 0 || f.reshapes.length === 3, 1000);
  }
  t.deepEqual(
    f.reshapes.map((r) => `${r.id} ${(r.limits.egress ?? 0) / M}M`),
    ['web-id 20M', 'db-id 15M', 'web-id 40M'],
  );
  t.is(live.queued, 0);
});
