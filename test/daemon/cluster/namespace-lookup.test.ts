/**
 * Namespace bandwidth policy in the agent (issue 24), without root: the ADD path (CniHandler over a
 * fake core), live re-shaping when a namespace's policy or a pod's annotations change (LiveShaping
 * over a fake core), its Events, the namespace watch against the fake API server
 * (ClusterNamespaceLookup), the `source` of the limit metrics, `kubenet status` sources and the
 * `kubenet top` cells.
 */
import test, { type ExecutionContext } from 'ava';
import { pino } from 'pino';
import { renderTop } from '../../../src/cli/top.js';
import { sourcesOf, type StatusReport } from '../../../src/daemon/agent.js';
import { CniHandler } from '../../../src/daemon/cni/handler.js';
import type { PodLookup } from '../../../src/daemon/cluster/pod-lookup.js';
import { LiveShaping } from '../../../src/daemon/shaping/live-shaping.js';
import { AgentMetrics } from '../../../src/daemon/http/metrics.js';
import { ClusterNamespaceLookup, type NamespaceLookup, type NamespaceUpdate } from '../../../src/daemon/cluster/namespace-lookup.js';
import type { BandwidthLimits, LimitSources, PodRecord, PodTraffic } from '../../../src/pod/index.js';
import { FakeApiServer, fakeKubeConfig, namespace } from '../../kit/fake-apiserver.js';
import { until } from '../../kit/until.js';
import { fakeEvents, fakeNetwork as fakeCore, podRecord } from '../../kit/fake-core.js';

const silent = pino({ level: 'silent' });
const M = 1e6;
const IN = 'kubernetes.io/ingress-bandwidth';
const EG = 'kubernetes.io/egress-bandwidth';
const DEF_IN = 'kubenet.io/default-ingress-bandwidth';
const DEF_EG = 'kubenet.io/default-egress-bandwidth';
const MAX_IN = 'kubenet.io/max-ingress-bandwidth';
const MAX_EG = 'kubenet.io/max-egress-bandwidth';
/** A turn of the event loop: the handler tells of an attached pod (Events) after its answer. */
const afterAnswers = () => new Promise<void>((resolve) => setImmediate(resolve));

function record(ns: string, name: string, limits: BandwidthLimits, limitSources?: LimitSources): PodRecord {
  return podRecord(name, limits, { namespace: ns, ...(limitSources ? { limitSources } : {}) });
}

/** The fake core recording the limit sources of each re-shape. */
const fakeNetwork = (records: PodRecord[]) => fakeCore(records, { sources: true });

/** Namespaces and pods as the watches would hold them. */
function fakeCluster() {
  const nsAnnotations = new Map<string, Record<string, string>>();
  const podAnnotations = new Map<string, Record<string, string>>();
  const namespaces: NamespaceLookup & { lookups: number } = {
    lookups: 0,
    annotations: async (ns) => {
      namespaces.lookups++;
      return nsAnnotations.get(ns);
    },
    cachedAnnotations: (ns) => nsAnnotations.get(ns),
    onNamespaceUpdate: () => undefined,
    start: async () => undefined,
    stop: async () => undefined,
  };
  const pods: PodLookup = {
    annotations: async (ns, name) => podAnnotations.get(`${ns}/${name}`),
    cachedAnnotations: (ns, name) => podAnnotations.get(`${ns}/${name}`),
    uid: (ns, name) => `uid-${ns}-${name}`,
  };
  /** Sets a namespace's policy and returns the update its watch would deliver. */
  const setNs = (name: string, annotations: Record<string, string>): NamespaceUpdate => {
    const previous = nsAnnotations.get(name);
    nsAnnotations.set(name, annotations);
    return { name, annotations, previous };
  };
  return { namespaces, pods, podAnnotations, setNs };
}

test('a namespace change whose re-shape the kernel refuses for one pod still re-shapes the others; the refused one waits for its retry', async (t) => {
  const c = fakeCluster();
  c.setNs('team', { [MAX_IN]: '50M' });
  c.podAnnotations.set('team/a', { [IN]: '40M' });
  c.podAnnotations.set('team/b', { [IN]: '40M' });
  const { network, reshapes } = fakeNetwork([
    record('team', 'a', { ingress: 40 * M }, { ingress: 'pod' }),
    record('team', 'b', { ingress: 40 * M }, { ingress: 'pod' }),
  ]);
  const reshape = network.reshape.bind(network);
  network.reshape = async (...a: Parameters<typeof reshape>) => {
    if (a[0] === 'a-id') throw new Error('RTNETLINK answers: No buffer space available');
    return reshape(...a);
  };
  const ev = fakeEvents();
  const live = new LiveShaping(network, ev.rec, c.pods, silent, c.namespaces);
  t.teardown(() => live.stop());
  await live.onNamespaceUpdate(c.setNs('team', { [MAX_IN]: '20M' }));
  t.deepEqual(reshapes, [{ id: 'b-id', limits: { ingress: 20 * M }, sources: { ingress: 'namespace-ceiling' } }]);
  t.is(live.retrying, 1);
  t.regex(
    ev.of('BandwidthRejected')[0] ?? '',
    /^a: could not apply bandwidth limits ingress 20M: .*; the pod keeps ingress 40M; trying again in/,
  );
});

test('a namespace ceiling lowered under load re-shapes its pods live: the ones above get the ceiling with a BandwidthCapped Warning, the ones below keep theirs, other namespaces are untouched', async (t) => {
  const c = fakeCluster();
  c.setNs('team', { [MAX_IN]: '50M' });
  c.podAnnotations.set('team/big', { [IN]: '40M' });
  c.podAnnotations.set('team/small', { [IN]: '5M' });
  c.podAnnotations.set('team/none', {});
  c.podAnnotations.set('other/big', { [IN]: '40M' });
  const { network, reshapes, records } = fakeNetwork([
    record('team', 'big', { ingress: 40 * M }, { ingress: 'pod' }),
    record('team', 'small', { ingress: 5 * M }, { ingress: 'pod' }),
    record('team', 'none', { ingress: 50 * M }, { ingress: 'namespace-ceiling' }),
    record('other', 'big', { ingress: 40 * M }),
  ]);
  const ev = fakeEvents();
  const live = new LiveShaping(network, ev.rec, c.pods, silent, c.namespaces);
  await live.onNamespaceUpdate(c.setNs('team', { [MAX_IN]: '20M' }));
  t.deepEqual(reshapes, [
    { id: 'big-id', limits: { ingress: 20 * M }, sources: { ingress: 'namespace-ceiling' } },
    { id: 'none-id', limits: { ingress: 20 * M }, sources: { ingress: 'namespace-ceiling' } },
  ]);
  t.deepEqual(ev.of('BandwidthApplied'), [
    'big: bandwidth limits applied: ingress 20M (namespace ceiling) (were ingress 40M)',
    'none: bandwidth limits applied: ingress 20M (namespace ceiling) (were ingress 50M (namespace ceiling))',
  ]);
  t.deepEqual(ev.of('BandwidthCapped'), [
    'big: kubernetes.io/ingress-bandwidth 40M is above the ceiling kubenet.io/max-ingress-bandwidth 20M of namespace team: ingress limited to 20M',
  ]);
  t.like(
    ev.got.find((e) => e.reason === 'BandwidthCapped'),
    { type: 'Warning', pod: { namespace: 'team', name: 'big', uid: 'uid-team-big' } },
  );
  t.deepEqual(records.find((r) => r.namespace === 'other')?.limits, { ingress: 40 * M });

  // The same policy again (another annotation of the namespace changed): nothing.
  await live.onNamespaceUpdate({ name: 'team', annotations: { [MAX_IN]: '20M' }, previous: { [MAX_IN]: '20M' } });
  t.is(reshapes.length, 2);
  // The ceiling raised: the capped pod gets its own ask back (source pod), the one that asked nothing the new ceiling.
  await live.onNamespaceUpdate(c.setNs('team', { [MAX_IN]: '100M' }));
  t.deepEqual(reshapes.slice(2), [
    { id: 'big-id', limits: { ingress: 40 * M }, sources: { ingress: 'pod' } },
    { id: 'none-id', limits: { ingress: 100 * M }, sources: { ingress: 'namespace-ceiling' } },
  ]);
  // The policy removed: the pod's own limits, no sources recorded; the pod without annotations unshaped.
  await live.onNamespaceUpdate(c.setNs('team', {}));
  t.deepEqual(reshapes.slice(4), [
    { id: 'big-id', limits: { ingress: 40 * M }, sources: undefined },
    { id: 'small-id', limits: { ingress: 5 * M }, sources: undefined },
    { id: 'none-id', limits: {}, sources: undefined },
  ]);
  t.is(ev.got.at(-1)?.message, 'bandwidth limits removed (were ingress 100M (namespace ceiling))');
  t.true(records.every((r) => r.limitSources === undefined));
});

test('namespace defaults: pods that ask nothing get them live; an invalid namespace value is ignored with a BandwidthRejected Warning on each pod', async (t) => {
  const c = fakeCluster();
  c.podAnnotations.set('team/a', {});
  c.podAnnotations.set('team/b', { [EG]: '1M' });
  const { network, reshapes } = fakeNetwork([record('team', 'a', {}), record('team', 'b', { egress: 1 * M })]);
  const ev = fakeEvents();
  const live = new LiveShaping(network, ev.rec, c.pods, silent, c.namespaces);
  await live.onNamespaceUpdate(c.setNs('team', {}));
  await live.onNamespaceUpdate(c.setNs('team', { [DEF_IN]: '10M', [DEF_EG]: '5M', [MAX_EG]: 'fast' }));
  t.deepEqual(reshapes, [
    { id: 'a-id', limits: { ingress: 10 * M, egress: 5 * M }, sources: { ingress: 'namespace-default', egress: 'namespace-default' } },
    { id: 'b-id', limits: { ingress: 10 * M, egress: 1 * M }, sources: { ingress: 'namespace-default', egress: 'pod' } },
  ]);
  const rejected =
    'namespace team: annotation kubenet.io/max-egress-bandwidth: "fast" is not a bandwidth: want a number of bits/s with an optional suffix k, M, G, T (or Ki, Mi, Gi, Ti) and no space or unit, e.g. "10M" or "500k"; ignored';
  t.deepEqual(ev.of('BandwidthRejected'), [`a: ${rejected}`, `b: ${rejected}`]);
  t.deepEqual(ev.of('BandwidthApplied'), [
    'a: bandwidth limits applied: ingress 10M (namespace default), egress 5M (namespace default) (were none)',
    'b: bandwidth limits applied: ingress 10M (namespace default), egress 1M (were egress 1M)',
  ]);
});

test('first sight after a start: a namespace or pod without policy, annotations or recorded sources changes nothing; a policy set while the agent was down applies', async (t) => {
  const c = fakeCluster();
  c.podAnnotations.set('plain/p', {});
  c.podAnnotations.set('team/q', {});
  const { network, reshapes } = fakeNetwork([record('plain', 'p', { egress: 3 * M }), record('team', 'q', {})]);
  const ev = fakeEvents();
  const live = new LiveShaping(network, ev.rec, c.pods, silent, c.namespaces);
  c.setNs('plain', {});
  await live.onNamespaceUpdate({ name: 'plain', annotations: {}, previous: undefined });
  await live.onPodUpdate({ namespace: 'plain', name: 'p', uid: 'u', annotations: {}, previous: undefined });
  t.deepEqual(reshapes, [], 'limits from the runtime stay: nothing says otherwise');
  c.setNs('team', { [DEF_EG]: '2M' });
  await live.onNamespaceUpdate({ name: 'team', annotations: { [DEF_EG]: '2M' }, previous: undefined });
  t.deepEqual(reshapes, [{ id: 'q-id', limits: { egress: 2 * M }, sources: { egress: 'namespace-default' } }]);
  // The pod watch's first sight of it then agrees: nothing more.
  await live.onPodUpdate({ namespace: 'team', name: 'q', uid: 'u', annotations: {}, previous: undefined });
  t.is(reshapes.length, 1);
  t.deepEqual(ev.of('BandwidthRejected'), []);
});

test("a pod's own annotation above its namespace's ceiling: capped with a Warning, also when the limit in force stays the ceiling", async (t) => {
  const c = fakeCluster();
  c.setNs('team', { [MAX_EG]: '10M' });
  c.podAnnotations.set('team/p', { [EG]: '5M' });
  const { network, reshapes } = fakeNetwork([record('team', 'p', { egress: 5 * M }, { egress: 'pod' })]);
  const ev = fakeEvents();
  const live = new LiveShaping(network, ev.rec, c.pods, silent, c.namespaces);
  await live.onPodUpdate({ namespace: 'team', name: 'p', uid: 'u', annotations: { [EG]: '30M' }, previous: { [EG]: '5M' } });
  t.deepEqual(reshapes, [{ id: 'p-id', limits: { egress: 10 * M }, sources: { egress: 'namespace-ceiling' } }]);
  await live.onPodUpdate({ namespace: 'team', name: 'p', uid: 'u', annotations: { [EG]: '40M' }, previous: { [EG]: '30M' } });
  t.is(reshapes.length, 1, 'the limit stays the ceiling');
  t.deepEqual(
    ev.of('BandwidthCapped').map((m) => m.replace(/^p: kubernetes\.io\/egress-bandwidth (\S+) .*/, '$1')),
    ['30M', '40M'],
  );
  // Back under the ceiling: its own limit, source pod.
  await live.onPodUpdate({ namespace: 'team', name: 'p', uid: 'u', annotations: { [EG]: '10M' }, previous: { [EG]: '40M' } });
  t.deepEqual(reshapes[1], { id: 'p-id', limits: { egress: 10 * M }, sources: { egress: 'pod' } }, 'same rate, the source recorded');
  t.is(ev.of('BandwidthApplied').length, 1, 'no Event when only the source changed');
  // kubenet shape is the operator's own: sources go.
  await live.shape('team', 'p', { egress: 3 * M, clear: false });
  t.deepEqual(reshapes[2], { id: 'p-id', limits: { egress: 3 * M }, sources: undefined });
});

test('kubenet shape never sets a limit above the namespace ceiling: a direction above it (or cleared) gets the ceiling and the answer says so; below it, as asked', async (t) => {
  const c = fakeCluster();
  c.setNs('team', { [MAX_EG]: '100M', [DEF_IN]: '5M' });
  const { network, reshapes } = fakeNetwork([
    record('team', 'p', { egress: 50 * M, ingress: 5 * M }, { egress: 'pod', ingress: 'namespace-default' }),
    record('free', 'q', { egress: 50 * M }),
  ]);
  const ev = fakeEvents();
  const live = new LiveShaping(network, ev.rec, c.pods, silent, c.namespaces);
  const above = await live.shape('team', 'p', { egress: 500 * M, clear: false });
  t.deepEqual(
    above.map((p) => [p.limits, p.changed, p.capped]),
    [
      [
        { ingress: 5 * M, egress: 100 * M },
        true,
        ['egress 500M is above the ceiling kubenet.io/max-egress-bandwidth 100M of namespace team: egress limited to 100M'],
      ],
    ],
  );
  t.deepEqual(reshapes.at(-1), { id: 'p-id', limits: { ingress: 5 * M, egress: 100 * M }, sources: { egress: 'namespace-ceiling' } });
  t.deepEqual(ev.of('BandwidthApplied'), [
    'p: bandwidth limits applied: ingress 5M, egress 100M (namespace ceiling) (were ingress 5M (namespace default), egress 50M)',
  ]);
  const below = await live.shape('team', 'p', { egress: 20 * M, clear: false });
  t.deepEqual(
    [below[0]?.limits, below[0]?.capped],
    [{ ingress: 5 * M, egress: 20 * M }, undefined],
    'below the ceiling: as asked, nothing to say',
  );
  t.deepEqual(reshapes.at(-1)?.sources, undefined, "the operator's own, as before");
  const cleared = await live.shape('team', 'p', { clear: true });
  t.deepEqual(
    [cleared[0]?.limits, cleared[0]?.capped],
    [
      { egress: 100 * M },
      ['no egress limit is above the ceiling kubenet.io/max-egress-bandwidth 100M of namespace team: egress limited to 100M'],
    ],
    '--clear: no limit where there is a ceiling is the ceiling; the default (ingress) is not forced on the operator',
  );
  const again = await live.shape('team', 'p', { egress: 200 * M, clear: false });
  t.deepEqual(
    [again[0]?.changed, again[0]?.limits, again[0]?.capped?.length],
    [false, { egress: 100 * M }, 1],
    'already at the ceiling: unchanged, and still said',
  );
  const free = await live.shape('free', 'q', { egress: 500 * M, clear: false });
  t.deepEqual([free[0]?.limits, free[0]?.capped], [{ egress: 500 * M }, undefined], 'a namespace without a ceiling: as asked');
});

const addRequest = (ns: string, name: string, runtimeConfig?: object) => ({
  env: {
    CNI_COMMAND: 'ADD',
    CNI_CONTAINERID: `${name}-id`,
    CNI_NETNS: `/var/run/netns/${name}`,
    CNI_IFNAME: 'eth0',
    CNI_ARGS: `K8S_POD_NAMESPACE=${ns};K8S_POD_NAME=${name}`,
    CNI_PATH: '/opt/cni/bin',
  },
  stdin: JSON.stringify({ cniVersion: '1.0.0', name: 'kubenet', type: 'kubenet', ...(runtimeConfig ? { runtimeConfig } : {}) }),
});

test('ADD: runtimeConfig or annotation limits meet the namespace policy; the record keeps the sources; Events say where limits came from; no policy: the request as before', async (t) => {
  const c = fakeCluster();
  c.setNs('team', { [DEF_IN]: '10M', [MAX_EG]: '20M' });
  c.setNs('plain', {});
  c.podAnnotations.set('team/annotated', { [EG]: '30M' });
  const { network, attaches } = fakeNetwork([]);
  const ev = fakeEvents();
  const live = new LiveShaping(network, ev.rec, c.pods, silent, c.namespaces);
  const handler = new CniHandler(network, c.pods, () => undefined, silent, live, c.namespaces);
  const ok = async (req: ReturnType<typeof addRequest>) => {
    const a = await handler.handle(req);
    t.is(a.status, 200, a.body);
  };
  await ok(addRequest('team', 'runtime', { bandwidth: { egressRate: 50_000_000, egressBurst: 4294967295 } }));
  await ok(addRequest('team', 'annotated'));
  await ok(addRequest('plain', 'mine', { bandwidth: { ingressRate: 7_000_000, ingressBurst: 80_000 } }));
  t.deepEqual(
    attaches.map((a) => [a.name, a.limits, a.limitSources]),
    [
      ['runtime', { ingress: 10 * M, egress: 20 * M }, { ingress: 'namespace-default', egress: 'namespace-ceiling' }],
      ['annotated', { ingress: 10 * M, egress: 20 * M }, { ingress: 'namespace-default', egress: 'namespace-ceiling' }],
      ['mine', { ingress: 7 * M, ingressBurst: 80_000 }, undefined],
    ],
  );
  t.false('limitSources' in (attaches[2] ?? {}), 'a namespace without policy: the request is what it was');
  await afterAnswers(); // the Events are told after the answer has gone out
  t.deepEqual(ev.of('BandwidthApplied'), [
    'runtime: bandwidth limits applied: ingress 10M (namespace default), egress 20M (namespace ceiling)',
    'annotated: bandwidth limits applied: ingress 10M (namespace default), egress 20M (namespace ceiling)',
    'mine: bandwidth limits applied: ingress 7M',
  ]);
  t.deepEqual(ev.of('BandwidthCapped'), [
    'runtime: kubernetes.io/egress-bandwidth 50M is above the ceiling kubenet.io/max-egress-bandwidth 20M of namespace team: egress limited to 20M',
    'annotated: kubernetes.io/egress-bandwidth 30M is above the ceiling kubenet.io/max-egress-bandwidth 20M of namespace team: egress limited to 20M',
  ]);
  // An invalid namespace value at ADD: ignored, a Warning; the pod is set up with the rest.
  c.setNs('bad', { [MAX_IN]: '1X', [DEF_EG]: '3M' });
  await ok(addRequest('bad', 'p'));
  t.deepEqual(attaches[3]?.limits, { egress: 3 * M });
  await afterAnswers();
  t.deepEqual(ev.of('BandwidthRejected'), [
    'p: namespace bad: annotation kubenet.io/max-ingress-bandwidth: "1X" is not a bandwidth: want a number of bits/s with an optional suffix k, M, G, T (or Ki, Mi, Gi, Ti) and no space or unit, e.g. "10M" or "500k"; ignored',
  ]);
  // Without a namespace lookup (static mode) nothing is asked.
  const before = c.namespaces.lookups;
  const statik = new CniHandler(fakeNetwork([]).network, undefined, () => undefined, silent);
  t.is((await statik.handle(addRequest('team', 'x'))).status, 200);
  t.is(c.namespaces.lookups, before);
});

async function fakeApi(t: ExecutionContext): Promise<FakeApiServer> {
  const api = await FakeApiServer.start();
  t.teardown(() => api.stop());
  return api;
}

test('the namespace watch keeps policy annotations only, tells of policy changes only, and a miss costs one GET that fills the cache', async (t) => {
  const api = await fakeApi(t);
  api.setNamespace(namespace('team', { [MAX_IN]: '20M', owner: 'x' }));
  api.setNamespace(namespace('plain'));
  const lookup = new ClusterNamespaceLookup({
    nodeName: 'node-a',
    logger: silent,
    kubeConfig: fakeKubeConfig(api),
    retryMinMs: 20,
    retryMaxMs: 200,
  });
  const seen: NamespaceUpdate[] = [];
  lookup.onNamespaceUpdate((u) => void seen.push(u));
  t.teardown(() => lookup.stop());
  // Before the list: a GET, shared by concurrent lookups of one namespace.
  const [a, b] = await Promise.all([lookup.annotations('team'), lookup.annotations('team')]);
  t.deepEqual([a, b], [{ [MAX_IN]: '20M' }, { [MAX_IN]: '20M' }]);
  t.is(api.count('/api/v1/namespaces/team', 'get'), 1);
  t.is(await lookup.annotations('gone'), undefined, 'a namespace that does not exist');
  await lookup.annotations('gone');
  t.is(api.count('/api/v1/namespaces/gone', 'get'), 1, 'its absence is cached until the watch says otherwise');
  await lookup.start();
  await until('the list', () => seen.length === 2);
  // team: what the GET found is what was known before.
  t.deepEqual(seen.map((u) => [u.name, u.annotations, u.previous]).sort(), [
    ['plain', {}, undefined],
    ['team', { [MAX_IN]: '20M' }, { [MAX_IN]: '20M' }],
  ]);
  await until('the watch', () => api.openWatches === 1);
  api.annotateNamespace('team', { owner: 'y' });
  api.annotateNamespace('team', { [MAX_IN]: '10M', [DEF_EG]: '1M' });
  await until('the change', () => seen.length === 3);
  t.deepEqual(seen[2], { name: 'team', annotations: { [MAX_IN]: '10M', [DEF_EG]: '1M' }, previous: { [MAX_IN]: '20M' } });
  t.deepEqual(lookup.cachedAnnotations('team'), { [MAX_IN]: '10M', [DEF_EG]: '1M' });
  api.annotateNamespace('fresh', { [MAX_EG]: '5M' });
  await until('a new namespace', () => seen.length === 4);
  t.deepEqual(seen[3], { name: 'fresh', annotations: { [MAX_EG]: '5M' }, previous: undefined });
  t.is(api.count('/api/v1/namespaces/fresh', 'get'), 0);
  t.true(api.requests.filter((r) => r.path === '/api/v1/namespaces').every((r) => r.authorization === 'Bearer fake-token'));
});

test('a ClusterRole without namespaces (the image updated before the RBAC): the lookup answers no policy instead of failing the ADD, and asks again next time', async (t) => {
  const api = await fakeApi(t);
  api.setNamespace(namespace('team', { [MAX_IN]: '20M' }));
  api.failWith = (r) => (r.path === '/api/v1/namespaces/team' ? 403 : undefined);
  const lookup = new ClusterNamespaceLookup({
    nodeName: 'node-a',
    logger: silent,
    kubeConfig: fakeKubeConfig(api),
    retryMinMs: 20,
    retryMaxMs: 200,
  });
  t.teardown(() => lookup.stop());
  t.is(await lookup.annotations('team'), undefined, 'no policy: the pod is set up as before the policy existed');
  t.is(await lookup.annotations('team'), undefined);
  t.is(api.count('/api/v1/namespaces/team', 'get'), 2, 'not cached: once the RBAC allows it, the policy applies');
  api.failWith = undefined;
  t.deepEqual(await lookup.annotations('team'), { [MAX_IN]: '20M' });
});

function traffic(r: PodRecord): PodTraffic {
  const dir = { limit: 10 * M, bytes: 1, packets: 1, drops: 0, overlimits: 0, backlog: 0 };
  return {
    record: r,
    shaping: {
      id: r.containerId,
      hostVeth: 'v',
      ...(r.limits.ingress ? { ingress: dir } : {}),
      ...(r.limits.egress ? { egress: dir } : {}),
    },
  };
}

test('metrics: every limit series carries source: pod, namespace-default or namespace-ceiling; the counters keep their labels', async (t) => {
  const m = new AgentMetrics();
  const tr = [
    traffic(record('team', 'capped', { ingress: 10 * M, egress: 10 * M }, { ingress: 'namespace-ceiling', egress: 'pod' })),
    traffic(record('team', 'dflt', { egress: 10 * M }, { egress: 'namespace-default' })),
    traffic(record('default', 'own', { ingress: 10 * M })),
  ];
  const text = (
    await m.text(
      tr.map((x) => x.record),
      0,
      tr,
    )
  ).body;
  const limits = text.split('\n').filter((l) => l.startsWith('kubenet_pod_bandwidth_limit_bits_per_second{'));
  t.deepEqual(limits.sort(), [
    'kubenet_pod_bandwidth_limit_bits_per_second{namespace="default",pod="own",direction="ingress",source="pod"} 10000000',
    'kubenet_pod_bandwidth_limit_bits_per_second{namespace="team",pod="capped",direction="egress",source="pod"} 10000000',
    'kubenet_pod_bandwidth_limit_bits_per_second{namespace="team",pod="capped",direction="ingress",source="namespace-ceiling"} 10000000',
    'kubenet_pod_bandwidth_limit_bits_per_second{namespace="team",pod="dflt",direction="egress",source="namespace-default"} 10000000',
  ]);
  t.regex(
    text,
    /^kubenet_pod_shaped_bytes_total\{namespace="team",pod="capped",direction="ingress"\} 1$/m,
    'the counters keep their labels',
  );
});

test('status and top: where each limit came from (old records: the pod)', (t) => {
  t.deepEqual(sourcesOf(record('a', 'b', { ingress: 1 * M, egress: 2 * M })), { ingress: 'pod', egress: 'pod' });
  t.deepEqual(sourcesOf(record('a', 'b', { egress: 2 * M }, { egress: 'namespace-default' })), { egress: 'namespace-default' });
  const pod = (name: string, limits: BandwidthLimits, limitSources?: LimitSources): StatusReport['pods'][number] => ({
    namespace: 'team',
    name,
    id: `${name}-id`,
    phase: 'ready',
    ips: [],
    hostVeth: 'v',
    limits,
    ...(limitSources ? { limitSources } : {}),
  });
  const s: StatusReport = {
    podCIDR: '10.244.0.0/24',
    bridge: 'cbr0',
    ready: true,
    pods: [
      pod('a', { ingress: 20 * M, egress: 5 * M }, { ingress: 'namespace-ceiling', egress: 'pod' }),
      pod('b', { egress: 10 * M }, { egress: 'namespace-default' }),
      pod('c', { ingress: 1 * M }),
    ],
  };
  const lines = renderTop(s, { intervalS: 1, now: new Date(2025, 0, 1, 12, 0, 1) });
  t.regex(lines[2] ?? '', /^POD +IN RATE +IN LIMIT +IN DROP\/s +OUT RATE +OUT LIMIT +OUT DROP\/s$/);
  t.regex(lines[3] ?? '', /^team\/a +- +20M ns-ceiling +- +- +5M +-$/);
  t.regex(lines[4] ?? '', /^team\/b +- +- +- +- +10M ns-default +-$/);
  t.regex(lines[5] ?? '', /^team\/c +- +1M +- +- +- +-$/);
});
