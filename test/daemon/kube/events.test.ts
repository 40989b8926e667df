/**
 * Events through the agent's API client (KubeApi.postJson) against the fake API server, and the
 * pod watch's updates for live re-shaping (ClusterPodLookup.onPodUpdate). No root needed; no
 * traffic except to the fake on 127.0.0.1.
 */
import test, { type ExecutionContext } from 'ava';
import { setTimeout as sleep } from 'node:timers/promises';
import { pino } from 'pino';
import { eventObject, KubeEventRecorder } from '../../../src/daemon/kube/events.js';
import type { PodUpdate } from '../../../src/daemon/cluster/pod-lookup.js';
import { KubeApi, KubeApiError } from '../../../src/daemon/kube/watch.js';
import { ClusterPodLookup } from '../../../src/daemon/cluster/pod-lookup.js';
import { FakeApiServer, fakeKubeConfig, pod } from '../../kit/fake-apiserver.js';
import { until } from '../../kit/until.js';

const RETRY = { retryMinMs: 20, retryMaxMs: 200 };
const silent = pino({ level: 'silent' });

async function fakeApi(t: ExecutionContext): Promise<FakeApiServer> {
  const api = await FakeApiServer.start();
  t.teardown(() => api.stop());
  return api;
}

test('an Event object is core/v1 as kubelet writes it: about the pod, from kubenet on this node, count 1', (t) => {
  const now = new Date('2025-01-02T03:04:05.678Z');
  const ev = eventObject(
    { namespace: 'ns1', name: 'web', uid: 'u-1' },
    'Warning',
    'BandwidthRejected',
    'x'.repeat(2000),
    'node-a',
    now,
  ) as Record<string, any>;
  t.is(ev.apiVersion, 'v1');
  t.is(ev.kind, 'Event');
  t.is(ev.metadata.namespace, 'ns1');
  t.regex(ev.metadata.name, /^web\.[0-9a-f]+$/);
  t.deepEqual(ev.involvedObject, { apiVersion: 'v1', kind: 'Pod', namespace: 'ns1', name: 'web', uid: 'u-1' });
  t.like(ev, {
    reason: 'BandwidthRejected',
    type: 'Warning',
    count: 1,
    firstTimestamp: '2025-01-02T03:04:05Z',
    lastTimestamp: '2025-01-02T03:04:05Z',
    reportingComponent: 'kubenet',
    reportingInstance: 'node-a',
  });
  t.deepEqual(ev.source, { component: 'kubenet', host: 'node-a' });
  t.true(ev.message.length <= 1024, 'the message fits the API server limit');
  const other = eventObject({ namespace: 'ns1', name: 'web' }, 'Normal', 'BandwidthApplied', 'm', 'node-a', now) as Record<string, any>;
  t.not(other.metadata.name, ev.metadata.name, 'two events in the same millisecond get different names');
  t.false('uid' in other.involvedObject);
});

test('KubeEventRecorder POSTs Events the fake records; a refusal is logged, never thrown', async (t) => {
  const api = await fakeApi(t);
  const rec = new KubeEventRecorder({ nodeName: 'node-a', logger: silent, kubeConfig: fakeKubeConfig(api) });
  t.teardown(() => rec.stop());
  rec.record({ namespace: 'default', name: 'web', uid: 'u-web' }, 'Normal', 'BandwidthApplied', 'bandwidth limits applied: ingress 10M');
  rec.record(
    { namespace: 'default', name: 'web', uid: 'u-web' },
    'Warning',
    'BandwidthRejected',
    'annotation kubernetes.io/egress-bandwidth: invalid',
  );
  rec.record({ namespace: '', name: 'nameless' }, 'Normal', 'BandwidthApplied', 'not recorded: no namespace');
  await rec.flush();
  t.deepEqual(
    api.events.map((e) => [e.involvedObject.name, e.involvedObject.uid, e.type, e.reason]),
    [
      ['web', 'u-web', 'Normal', 'BandwidthApplied'],
      ['web', 'u-web', 'Warning', 'BandwidthRejected'],
    ],
  );
  t.true(
    api.requests.some(
      (r) => r.method === 'POST' && r.path === '/api/v1/namespaces/default/events' && r.authorization === 'Bearer fake-token',
    ),
  );
  api.failWith = () => 403;
  rec.record({ namespace: 'default', name: 'web' }, 'Normal', 'BandwidthApplied', 'forbidden');
  await rec.flush();
  t.is(api.events.length, 2);
});

test('KubeEventRecorder: 40 Events recorded at once (a burst of ADDs) are all posted, in order, one at a time, without a listener-leak warning', async (t) => {
  const api = await fakeApi(t);
  const rec = new KubeEventRecorder({ nodeName: 'node-a', logger: silent, kubeConfig: fakeKubeConfig(api) });
  t.teardown(() => rec.stop());
  const warnings: string[] = [];
  const onWarning = (w: Error) => warnings.push(`${w.name}: ${w.message}`);
  process.on('warning', onWarning);
  t.teardown(() => process.off('warning', onWarning));
  for (let i = 0; i < 40; i++) rec.record({ namespace: 'default', name: `p${i}` }, 'Normal', 'BandwidthApplied', 'ingress 10M');
  await rec.flush();
  await sleep(50); // warnings are emitted on the next tick
  t.deepEqual(
    api.events.map((e) => e.involvedObject.name),
    Array.from({ length: 40 }, (_, i) => `p${i}`),
  );
  t.deepEqual(
    warnings.filter((w) => w.startsWith('MaxListenersExceededWarning')),
    [],
  );
});

test('KubeEventRecorder: while the API server does not answer, one Event is in flight and the rest wait; stop() gives them up', async (t) => {
  const api = await fakeApi(t);
  const rec = new KubeEventRecorder({ nodeName: 'node-a', logger: silent, kubeConfig: fakeKubeConfig(api) });
  api.stall = true;
  for (let i = 0; i < 5; i++) rec.record({ namespace: 'default', name: `p${i}` }, 'Normal', 'BandwidthApplied', 'ingress 10M');
  const posts = () => api.requests.filter((r) => r.method === 'POST').length;
  await sleep(300);
  t.is(posts(), 1, 'one POST reached the API server');
  await rec.stop();
  t.is(posts(), 1, 'the waiting Events were given up, not posted');
  rec.record({ namespace: 'default', name: 'late' }, 'Normal', 'BandwidthApplied', 'after stop');
  await rec.flush();
  t.is(posts(), 1, 'nothing is recorded after stop()');
});

test('KubeApi.postJson: 201 is parsed; an error answer is a KubeApiError with the Status reason', async (t) => {
  const api = await fakeApi(t);
  const kube = new KubeApi(fakeKubeConfig(api));
  const created = await kube.postJson<{ metadata: { uid: string } }>(
    '/api/v1/namespaces/default/events',
    eventObject({ namespace: 'default', name: 'p' }, 'Normal', 'R', 'm', 'n'),
  );
  t.truthy(created.metadata.uid);
  const err = await t.throwsAsync(
    kube.postJson('/api/v1/namespaces/other/events', eventObject({ namespace: 'default', name: 'p' }, 'Normal', 'R', 'm', 'n')),
    { instanceOf: KubeApiError },
  );
  t.is(err?.status, 422);
  t.is(err?.reason, 'Invalid');
  t.regex(err?.message ?? '', /^POST \/api\/v1\/namespaces\/other\/events: 422/);
});

test('the pod watch tells of every pod listed, added and modified, with the annotations known before', async (t) => {
  const api = await fakeApi(t);
  api.setPod(pod('default', 'a', 'node-a', { 'kubernetes.io/egress-bandwidth': '10M' }));
  api.setPod(pod('default', 'elsewhere', 'node-b', { 'kubernetes.io/egress-bandwidth': '1M' }));
  const lookup = new ClusterPodLookup({ nodeName: 'node-a', logger: silent, kubeConfig: fakeKubeConfig(api), ...RETRY });
  const seen: PodUpdate[] = [];
  lookup.onPodUpdate((u) => void seen.push(u));
  t.teardown(() => lookup.stop());
  await lookup.start();
  await until('the list', () => seen.length === 1);
  t.deepEqual(seen[0], {
    namespace: 'default',
    name: 'a',
    uid: 'uid-default-a',
    annotations: { 'kubernetes.io/egress-bandwidth': '10M' },
    previous: undefined,
    ask: { guarantees: {} },
    previousAsk: undefined,
  });
  await until('the watch', () => api.openWatches === 1);
  api.annotatePod('default', 'a', { 'kubernetes.io/egress-bandwidth': '20M' });
  await until('the change', () => seen.length === 2);
  t.deepEqual(seen[1]?.previous, { 'kubernetes.io/egress-bandwidth': '10M' });
  t.deepEqual(seen[1]?.annotations, { 'kubernetes.io/egress-bandwidth': '20M' });
  t.is(lookup.uid('default', 'a'), 'uid-default-a');
  t.deepEqual(lookup.cachedAnnotations('default', 'a'), { 'kubernetes.io/egress-bandwidth': '20M' });
  t.is(lookup.cachedAnnotations('default', 'elsewhere'), undefined, 'pods of other nodes are not cached');

  // A change made while the watch is gone is seen on the re-list, against what was known before.
  await api.stop();
  api.annotatePod('default', 'a', { 'kubernetes.io/egress-bandwidth': null, 'kubernetes.io/ingress-bandwidth': '5M' });
  api.expire();
  await api.start();
  await until('the re-list', () => seen.length === 3, 15_000);
  t.deepEqual(seen[2]?.previous, { 'kubernetes.io/egress-bandwidth': '20M' });
  t.deepEqual(seen[2]?.annotations, { 'kubernetes.io/ingress-bandwidth': '5M' });
  t.false(seen.some((u) => u.name === 'elsewhere'));
});
