/**
 * Bandwidth as a resource of the node in the agent (issue 33), without root: what a pod asks of the
 * node (its requests of kubenet.io/{egress,ingress}-bandwidth, its QoS class, the priority
 * annotation) entering its limits on the ADD path (CniHandler over a fake core) and when
 * re-shaping live (LiveShaping over a fake core), each Warning, the pod watch keeping the ask
 * (ClusterPodLookup against the fake API server), and what status, metrics and `kubenet top` show.
 * Static mode: nothing changes.
 */
import test from 'ava';
import { pino } from 'pino';
import type { NodeCapacity } from '../../../src/bandwidth/capacity.js';
import { bandText, directionText, renderTop } from '../../../src/cli/top.js';
import type { StatusReport } from '../../../src/daemon/agent.js';
import { CniHandler } from '../../../src/daemon/cni/handler.js';
import type { PodInfo, PodLookup, PodUpdate } from '../../../src/daemon/cluster/pod-lookup.js';
import { LiveShaping } from '../../../src/daemon/shaping/live-shaping.js';
import { AgentMetrics } from '../../../src/daemon/http/metrics.js';
import { ClusterPodLookup } from '../../../src/daemon/cluster/pod-lookup.js';
import { applyAsk, bandwidthReport, podAsk, type PodAsk } from '../../../src/daemon/cluster/pod-guarantees.js';
import { FakeApiServer, fakeKubeConfig, pod } from '../../kit/fake-apiserver.js';
import { until } from '../../kit/until.js';
import { fakeEvents, fakeNetwork, podRecord as record } from '../../kit/fake-core.js';

const silent = pino({ level: 'silent' });
const M = 1e6;
const EG = 'kubernetes.io/egress-bandwidth';
const PRIO = 'kubenet.io/bandwidth-priority';
const EGR = 'kubenet.io/egress-bandwidth';
const INR = 'kubenet.io/ingress-bandwidth';
const CAP: NodeCapacity = { egress: 1000 * M, ingress: 1000 * M, source: { egress: 'link-speed', ingress: 'link-speed' }, device: 'eth0' };
const afterAnswers = () => new Promise<void>((resolve) => setImmediate(resolve));

const spec = (requests: Record<string, string>) => ({ containers: [{ resources: { requests } }] });

/** Pods as the watch would hold them: annotations and ask. */
function fakePods() {
  const pods = new Map<string, PodInfo>();
  const lookup: PodLookup & { fail?: boolean } = {
    annotations: async (ns, name) => pods.get(`${ns}/${name}`)?.annotations,
    pod: async (ns, name) => {
      if (lookup.fail) throw new Error('API server down');
      return pods.get(`${ns}/${name}`);
    },
    cachedAnnotations: (ns, name) => pods.get(`${ns}/${name}`)?.annotations,
    cachedAsk: (ns, name) => pods.get(`${ns}/${name}`)?.ask,
    uid: (ns, name) => `uid-${ns}-${name}`,
  };
  return { lookup, pods };
}

const addRequest = (name: string, runtimeConfig?: object) => ({
  env: {
    CNI_COMMAND: 'ADD',
    CNI_CONTAINERID: `${name}-id`,
    CNI_NETNS: `/var/run/netns/${name}`,
    CNI_IFNAME: 'eth0',
    CNI_ARGS: `K8S_POD_NAMESPACE=default;K8S_POD_NAME=${name}`,
    CNI_PATH: '/opt/cni/bin',
  },
  stdin: JSON.stringify({ cniVersion: '1.0.0', name: 'kubenet', type: 'kubenet', ...(runtimeConfig ? { runtimeConfig } : {}) }),
});

test('the ask: guarantees summed from the containers (1 unit = 1 Mbit/s), the QoS class; a bad quantity is a problem, not a throw', (t) => {
  t.deepEqual(
    podAsk({
      spec: {
        containers: [
          { name: 'a', resources: { requests: { [EGR]: '200' } } },
          { name: 'b', resources: { limits: { [EGR]: '100', [INR]: '50' } } },
        ],
      },
      status: { qosClass: 'Burstable' },
    }),
    {
      guarantees: { egress: 300 * M, ingress: 50 * M },
      qosClass: 'Burstable',
    },
  );
  const bad = podAsk({ spec: { containers: [{ name: 'a', resources: { requests: { [EGR]: '-5' } } }] } });
  t.deepEqual(bad.guarantees, {});
  t.regex(bad.problem ?? '', /kubenet\.io\/egress-bandwidth: invalid quantity "-5"/);
});

test('applyAsk: the guarantee and the QoS band (when known) into the limits; a ceiling below the guarantee raised; a bad priority, a bad request and a node without capacity are Warnings', (t) => {
  const ask: PodAsk = { guarantees: { egress: 60 * M }, qosClass: 'Guaranteed' };
  t.deepEqual(applyAsk({ egress: 100 * M }, ask, {}, CAP), {
    limits: { egress: 100 * M, egressGuarantee: 60 * M, priority: 0 },
    notes: [],
  });
  const raised = applyAsk({ egress: 20 * M, egressBurst: 1000 }, ask, { [PRIO]: 'low' }, CAP);
  t.deepEqual(
    raised.limits,
    { egress: 60 * M, egressGuarantee: 60 * M, priority: 2 },
    'the ceiling raised, its burst sized anew; the annotation overrides the QoS band',
  );
  t.deepEqual(raised.notes, [
    {
      reason: 'BandwidthCeilingRaised',
      message:
        "kubernetes.io/egress-bandwidth 20M is below the pod's guarantee (kubenet.io/egress-bandwidth request, 60M): egress ceiling raised to 60M",
    },
  ]);
  const badBand = applyAsk({}, { guarantees: {}, qosClass: 'BestEffort' }, { [PRIO]: 'urgent' }, CAP);
  t.deepEqual(badBand.limits, { priority: 2 });
  t.is(badBand.notes[0]?.reason, 'BandwidthPriorityRejected');
  t.regex(badBand.notes[0]?.message ?? '', /"urgent" is not one of high, medium, low; the pod's QoS class \(BestEffort\) gives band low/);
  const badQty = applyAsk(
    {},
    { guarantees: {}, problem: 'container resource kubenet.io/egress-bandwidth: invalid quantity "1.5"' },
    {},
    CAP,
  );
  t.deepEqual(badQty.notes, [
    {
      reason: 'BandwidthGuaranteeRejected',
      message: 'container resource kubenet.io/egress-bandwidth: invalid quantity "1.5"; the pod gets no guarantee',
    },
  ]);
  // Egress known, ingress not (a device without link speed, say): the ingress guarantee is off.
  const half: NodeCapacity = { egress: 1000 * M, source: { egress: 'config', ingress: 'unknown' }, device: 'veth0' };
  const off = applyAsk({}, { guarantees: { egress: 10 * M, ingress: 20 * M }, qosClass: 'Burstable' }, {}, half);
  t.deepEqual(off.limits, { egressGuarantee: 10 * M, priority: 1 });
  t.deepEqual(
    off.notes.map((n) => n.reason),
    ['BandwidthGuaranteeUnavailable'],
  );
  t.regex(
    off.notes[0]?.message ?? '',
    /^guarantees are off on this node: no ingress capacity: veth0 reports no link speed \(set ingressCapacity, or capacityDevice to a device that reports its link speed, in the agent's config\); the pod's kubenet\.io\/ingress-bandwidth request \(20M\) is not reserved$/,
  );
  // No QoS class known (a pod without status, as fakes hold them) and no valid annotation: no band.
  t.deepEqual(applyAsk({ egress: 5 * M }, { guarantees: {} }, {}, CAP).limits, { egress: 5 * M });
  t.deepEqual(applyAsk({ egress: 5 * M }, { guarantees: {} }, { [PRIO]: 'high' }, CAP).limits, { egress: 5 * M, priority: 0 });
  // No capacity at all: no guarantee, no band (today's shaping).
  const none = applyAsk(
    { egress: 5 * M },
    { guarantees: { egress: 10 * M }, qosClass: 'Guaranteed' },
    {},
    { source: { egress: 'unknown', ingress: 'unknown' } },
  );
  t.deepEqual(none.limits, { egress: 5 * M });
  t.regex(none.notes[0]?.message ?? '', /no egress capacity: no IPv4 default route/);
});

test('ADD in cluster mode: guarantees and band from the pod, also beside runtimeConfig limits; Warnings as Events after the answer; a failed lookup with runtimeConfig limits still sets the pod up', async (t) => {
  const c = fakePods();
  c.pods.set('default/web', { annotations: { [EG]: '20M' }, ask: { guarantees: { egress: 60 * M }, qosClass: 'Burstable' } });
  c.pods.set('default/rc', { annotations: {}, ask: { guarantees: { ingress: 5 * M }, qosClass: 'Guaranteed' } });
  const { network, attaches } = fakeNetwork([]);
  const ev = fakeEvents();
  const live = new LiveShaping(network, ev.rec, c.lookup, silent, undefined, () => CAP);
  const handler = new CniHandler(
    network,
    c.lookup,
    () => undefined,
    silent,
    live,
    undefined,
    () => CAP,
  );
  t.is((await handler.handle(addRequest('web'))).status, 200);
  t.is((await handler.handle(addRequest('rc', { bandwidth: { ingressRate: 10_000_000, egressRate: 0 } }))).status, 200);
  t.deepEqual(
    attaches.map((a) => a.limits),
    [
      { egress: 60 * M, egressGuarantee: 60 * M, priority: 1 },
      { ingress: 10 * M, ingressGuarantee: 5 * M, priority: 0 },
    ],
  );
  await afterAnswers();
  t.deepEqual(ev.of('BandwidthCeilingRaised'), [
    "web: kubernetes.io/egress-bandwidth 20M is below the pod's guarantee (kubenet.io/egress-bandwidth request, 60M): egress ceiling raised to 60M",
  ]);
  t.deepEqual(ev.of('BandwidthApplied'), [
    'web: bandwidth limits applied: egress 60M (guaranteed 60M); priority medium',
    'rc: bandwidth limits applied: ingress 10M (guaranteed 5M); priority high',
  ]);
  c.lookup.fail = true;
  t.is(
    (await handler.handle(addRequest('down', { bandwidth: { egressRate: 1_000_000 } }))).status,
    200,
    'runtimeConfig limits need no API server',
  );
  t.deepEqual(attaches[2]?.limits, { egress: 1 * M });
  t.is((await handler.handle(addRequest('down2'))).status, 500, 'without them, the lookup is needed');
});

test('ADD on a node without capacity: the pod runs with its ceilings, no guarantee and no band, and a Warning says guarantees are off, naming the config keys; a bad request and a bad band likewise', async (t) => {
  const c = fakePods();
  c.pods.set('default/g', {
    annotations: { [EG]: '20M', [PRIO]: 'fastest' },
    ask: { guarantees: { egress: 60 * M }, qosClass: 'Guaranteed' },
  });
  c.pods.set('default/q', {
    annotations: {},
    ask: {
      guarantees: {},
      problem: 'container resource kubenet.io/ingress-bandwidth: invalid quantity "-1" (expected a whole number of Mbit/s, e.g. "200")',
      qosClass: 'Burstable',
    },
  });
  const { network, attaches } = fakeNetwork([]);
  const ev = fakeEvents();
  const none: NodeCapacity = { source: { egress: 'unknown', ingress: 'unknown' }, device: 'eth0' };
  const live = new LiveShaping(network, ev.rec, c.lookup, silent, undefined, () => none);
  const handler = new CniHandler(
    network,
    c.lookup,
    () => undefined,
    silent,
    live,
    undefined,
    () => none,
  );
  t.is((await handler.handle(addRequest('g'))).status, 200);
  t.is((await handler.handle(addRequest('q'))).status, 200);
  t.deepEqual(
    attaches.map((a) => a.limits),
    [{ egress: 20 * M }, {}],
  );
  await afterAnswers();
  t.deepEqual(ev.of('BandwidthGuaranteeUnavailable'), [
    "g: guarantees are off on this node: no egress capacity: eth0 reports no link speed (set egressCapacity, or capacityDevice to a device that reports its link speed, in the agent's config); the pod's kubenet.io/egress-bandwidth request (60M) is not reserved",
  ]);
  t.is(ev.of('BandwidthPriorityRejected').length, 1);
  t.deepEqual(ev.of('BandwidthGuaranteeRejected'), [
    'q: container resource kubenet.io/ingress-bandwidth: invalid quantity "-1" (expected a whole number of Mbit/s, e.g. "200"); the pod gets no guarantee',
  ]);
  t.true(ev.got.filter((e) => e.reason !== 'BandwidthApplied').every((e) => e.type === 'Warning'));
});

test('static mode (no pod lookup, no capacity): the limits as the runtime gives them, nothing else', async (t) => {
  const { network, attaches } = fakeNetwork([]);
  const handler = new CniHandler(network, undefined, () => undefined, silent);
  t.is((await handler.handle(addRequest('s', { bandwidth: { egressRate: 2_000_000 } }))).status, 200);
  t.deepEqual(attaches[0]?.limits, { egress: 2 * M });
});

const upd = (
  name: string,
  annotations: Record<string, string>,
  ask: PodAsk,
  previous?: Record<string, string>,
  previousAsk?: PodAsk,
): PodUpdate => ({
  namespace: 'default',
  name,
  uid: `uid-${name}`,
  annotations,
  previous,
  ask,
  previousAsk,
});

test('live: a priority annotation change re-shapes the band; a guarantee first seen keeps the runtime rates; the same ask again does nothing', async (t) => {
  const { network, reshapes } = fakeNetwork([
    record('web', { egress: 100 * M, egressGuarantee: 60 * M, priority: 1 }),
    record('rc', { ingress: 10 * M }),
    record('plain', { egress: 5 * M, priority: 1 }),
  ]);
  const ev = fakeEvents();
  const live = new LiveShaping(network, ev.rec, undefined, silent, undefined, () => CAP);
  const ask: PodAsk = { guarantees: { egress: 60 * M }, qosClass: 'Burstable' };
  await live.onPodUpdate(upd('web', { [EG]: '100M' }, ask, { [EG]: '100M' }, ask));
  t.deepEqual(reshapes, [], 'nothing of the bandwidth changed');
  await live.onPodUpdate(upd('web', { [EG]: '100M', [PRIO]: 'high' }, ask, { [EG]: '100M' }, ask));
  t.deepEqual(reshapes, [{ id: 'web-id', limits: { egress: 100 * M, egressGuarantee: 60 * M, priority: 0 } }]);
  t.deepEqual(ev.of('BandwidthApplied'), ['web: bandwidth priority high (was medium)']);
  await live.onPodUpdate(upd('web', { [EG]: '100M', [PRIO]: 'top' }, ask, { [EG]: '100M', [PRIO]: 'high' }, ask));
  t.deepEqual(
    reshapes[1],
    { id: 'web-id', limits: { egress: 100 * M, egressGuarantee: 60 * M, priority: 1 } },
    "an invalid band: the QoS class's",
  );
  t.is(ev.of('BandwidthPriorityRejected').length, 1);
  // Without a guarantee the band is still the pod's: a change of it alone says so.
  const burst: PodAsk = { guarantees: {}, qosClass: 'Burstable' };
  await live.onPodUpdate(upd('plain', { [EG]: '5M', [PRIO]: 'low' }, burst, { [EG]: '5M' }, burst));
  t.deepEqual(reshapes.at(-1), { id: 'plain-id', limits: { egress: 5 * M, priority: 2 } });
  t.is(ev.of('BandwidthApplied').at(-1), 'plain: bandwidth priority low (was medium)');
  // First sight (after a restart) of a pod whose rates came from runtimeConfig and that asks a guarantee.
  await live.onPodUpdate(upd('rc', {}, { guarantees: { ingress: 5 * M }, qosClass: 'Guaranteed' }));
  t.deepEqual(reshapes.at(-1), { id: 'rc-id', limits: { ingress: 10 * M, ingressGuarantee: 5 * M, priority: 0 } }, 'its ceiling stays');
  await live.onPodUpdate(upd('rc', {}, { guarantees: { ingress: 5 * M }, qosClass: 'Guaranteed' }));
  t.is(reshapes.length, 4);
});

test("kubenet shape keeps a pod's guarantee and band: a ceiling below the guarantee is raised to it, with a Warning", async (t) => {
  const { network, reshapes } = fakeNetwork([record('web', { egress: 100 * M, egressGuarantee: 60 * M, priority: 0 })]);
  const ev = fakeEvents();
  const live = new LiveShaping(network, ev.rec, undefined, silent, undefined, () => CAP);
  await live.shape('default', 'web', { egress: 10 * M, clear: false });
  t.deepEqual(reshapes, [{ id: 'web-id', limits: { egress: 60 * M, egressGuarantee: 60 * M, priority: 0 } }]);
  t.is(ev.of('BandwidthCeilingRaised').length, 1);
  await live.shape('default', 'web', { clear: true });
  t.deepEqual(reshapes[1]?.limits, { egressGuarantee: 60 * M, priority: 0 }, '--clear removes ceilings, not guarantees');
});

test("the pod watch keeps each pod's ask (requests, QoS class) and tells it with the one before; a GET on a miss brings it too", async (t) => {
  const api = await FakeApiServer.start();
  t.teardown(() => api.stop());
  const withAsk = (name: string, requests: Record<string, string>, qos: string) => ({
    ...pod('default', name, 'node-a'),
    spec: { nodeName: 'node-a', ...spec(requests) },
    status: { qosClass: qos },
  });
  api.setPod(withAsk('a', { [EGR]: '200' }, 'Burstable'));
  const lookup = new ClusterPodLookup({
    nodeName: 'node-a',
    logger: silent,
    kubeConfig: fakeKubeConfig(api),
    retryMinMs: 20,
    retryMaxMs: 50,
  });
  const seen: PodUpdate[] = [];
  lookup.onPodUpdate((u) => void seen.push(u));
  t.teardown(() => lookup.stop());
  await lookup.start();
  await until('the list', () => seen.length === 1);
  t.deepEqual(seen[0]?.ask, { guarantees: { egress: 200 * M }, qosClass: 'Burstable' });
  await until('the watch', () => api.openWatches === 1);
  api.setPod(withAsk('a', { [EGR]: '300' }, 'Burstable'));
  await until('the change', () => seen.length === 2);
  t.deepEqual(seen[1]?.previousAsk, { guarantees: { egress: 200 * M }, qosClass: 'Burstable' });
  t.deepEqual(lookup.cachedAsk('default', 'a'), { guarantees: { egress: 300 * M }, qosClass: 'Burstable' });
  const fresh = new ClusterPodLookup({ nodeName: 'node-a', logger: silent, kubeConfig: fakeKubeConfig(api) });
  t.deepEqual(
    await fresh.pod('default', 'a'),
    { annotations: {}, ask: { guarantees: { egress: 300 * M }, qosClass: 'Burstable' } },
    'not started: one GET',
  );
  t.is(await fresh.pod('default', 'nobody'), undefined);
});

test("status, metrics and top: the capacity, the guarantees committed and free, each pod's guarantee and band; without a capacity, why guarantees are off", async (t) => {
  const records = [
    record('a', { egress: 100 * M, egressGuarantee: 60 * M, priority: 0 }),
    record('b', { ingressGuarantee: 20 * M, priority: 2 }),
    record('c', {}),
  ];
  const report = bandwidthReport(CAP, records);
  t.deepEqual(report.committed, { ingress: 20 * M, egress: 60 * M });
  t.deepEqual(report.free, { ingress: 980 * M, egress: 940 * M });
  t.is(report.description, 'egress 1G (link speed of eth0), ingress 1G (link speed of eth0)');
  const off = bandwidthReport({ source: { egress: 'unknown', ingress: 'unknown' }, device: 'veth0' }, records);
  t.deepEqual(off.capacity, {});
  t.regex(off.off?.egress ?? '', /veth0 reports no link speed \(set egressCapacity, or capacityDevice/);
  t.regex(bandwidthReport(undefined, []).off?.ingress ?? '', /cluster mode/);

  const m = new AgentMetrics();
  m.setCapacity(CAP);
  const text = (await m.text(records, 0, [])).body;
  t.regex(text, /^kubenet_node_bandwidth_capacity_bits_per_second\{direction="egress"\} 1000000000$/m);
  t.regex(text, /^kubenet_node_bandwidth_committed_bits_per_second\{direction="egress"\} 60000000$/m);
  t.regex(text, /^kubenet_node_bandwidth_committed_bits_per_second\{direction="ingress"\} 20000000$/m);
  t.regex(text, /^kubenet_pod_bandwidth_guarantee_bits_per_second\{namespace="default",pod="a",direction="egress"\} 60000000$/m);
  t.regex(text, /^kubenet_pod_bandwidth_guarantee_bits_per_second\{namespace="default",pod="b",direction="ingress"\} 20000000$/m);
  t.regex(text, /^kubenet_pod_bandwidth_priority\{namespace="default",pod="b"\} 2$/m);
  t.notRegex(text, /^(?!kubenet_pod_info\{).*pod="c"/m, 'no guarantee, no band: no series (but its kubenet_pod_info)');
  m.setCapacity(undefined);
  t.notRegex((await m.text(records, 0, [])).body, /^kubenet_node_bandwidth_capacity_bits_per_second\{/m, 'no capacity, no series');

  t.is(directionText({ egress: 100 * M, egressGuarantee: 60 * M }, 'egress'), '60M..100M');
  t.is(directionText({ ingressGuarantee: 20 * M }, 'ingress'), '20M..');
  t.is(directionText({ egress: 5 * M }, 'egress', 'namespace-ceiling'), '5M ns-ceiling');
  t.is(bandText(0), 'high');
  t.is(bandText(undefined), '-');
  const s: StatusReport = {
    podCIDR: '10.0.0.0/24',
    bridge: 'cbr0',
    ready: true,
    pods: records.map((r) => ({
      namespace: r.namespace,
      name: r.name,
      id: r.containerId,
      phase: 'ready',
      ips: r.ips,
      hostVeth: 'v',
      limits: r.limits,
    })),
  };
  const frame = renderTop(s, { intervalS: 1, now: new Date(0) });
  t.regex(frame[2] ?? '', /OUT DROP\/s\s+PRIO$/);
  t.regex(frame.find((l) => l.startsWith('default/a')) ?? '', /60M\.\.100M\s+-\s+high$/);
  t.regex(frame[0] ?? '', /pods 3 \(2 shaped\)/);
});
