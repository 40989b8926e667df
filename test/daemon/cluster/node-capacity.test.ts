/**
 * The node's bandwidth capacity on its Node (issue 33), against the fake API server, without root:
 * published once the capacity is known (a JSON merge patch of nodes/NAME/status setting capacity and
 * allocatable in whole Mbit/s), again when the Node watch shows them missing or different (kubelet
 * rewrote the status), not when they are the same (also as the API server writes 1000: "1k"); a
 * direction without capacity removes a stale value; a Node not registered yet is published when
 * the watch brings it; a failed PATCH is retried.
 */
import test, { type ExecutionContext } from 'ava';
import { pino } from 'pino';
import {
  capacityDiffers,
  configuredCapacity,
  NodeCapacityPublisher,
  publishedCapacity,
  resolveNodeCapacity,
} from '../../../src/daemon/cluster/node-capacity.js';
import { NodeWatchPodCidrSource } from '../../../src/daemon/pod-cidr/node-watch.js';
import { FakeApiServer, fakeKubeConfig, node, type FakeObject } from '../../kit/fake-apiserver.js';
import { until } from '../../kit/until.js';

const silent = pino({ level: process.env.DEBUG_LOG ? 'debug' : 'silent' });
const EGR = 'kubenet.io/egress-bandwidth';
const INR = 'kubenet.io/ingress-bandwidth';
const G = 1e9;

async function setup(t: ExecutionContext, nodeName = 'node-a') {
  const api = await FakeApiServer.start();
  const kube = { nodeName, logger: silent, kubeConfig: fakeKubeConfig(api), retryMinMs: 20, retryMaxMs: 50 };
  const publisher = new NodeCapacityPublisher(kube);
  const source = new NodeWatchPodCidrSource({ ...kube, onNode: (n) => publisher.nodeSeen(n) });
  t.teardown(async () => {
    await source.stop();
    await publisher.stop();
    await api.stop();
  });
  const status = () =>
    api.getNode(nodeName)?.status as { capacity?: Record<string, string>; allocatable?: Record<string, string> } | undefined;
  return { api, publisher, source, status };
}

/** kubelet's status update: its own keys rewritten, others kept or (a recreated Node) gone. */
function kubeletStatus(n: FakeObject, keep: boolean): FakeObject {
  const st = (n.status ?? {}) as { capacity?: Record<string, string>; allocatable?: Record<string, string> };
  const ours = (m: Record<string, string> | undefined) =>
    keep ? Object.fromEntries(Object.entries(m ?? {}).filter(([k]) => k.startsWith('kubenet.io/'))) : {};
  return {
    ...n,
    status: {
      capacity: { cpu: '2', pods: '110', ...ours(st.capacity) },
      allocatable: { cpu: '2', pods: '110', ...ours(st.allocatable) },
      conditions: [{ type: 'Ready', status: 'True', lastHeartbeatTime: new Date().toISOString() }],
    },
  };
}

test('the resources in whole Mbit/s; a direction without capacity is null (removed); compared as quantities', (t) => {
  t.deepEqual(publishedCapacity({ egress: 10 * G, ingress: 1.5e6 }), { [EGR]: '10000', [INR]: '1' });
  t.deepEqual(publishedCapacity({ egress: 1 * G }), { [EGR]: '1000', [INR]: null });
  const want = publishedCapacity({ egress: 1 * G, ingress: 1 * G });
  const n = (capacity: Record<string, string>, allocatable = capacity) => ({ status: { capacity, allocatable } });
  t.false(capacityDiffers(n({ [EGR]: '1k', [INR]: '1000' }), want), 'the API server writes 1000 as 1k');
  t.true(capacityDiffers(n({ [EGR]: '1k' }), want), 'one missing');
  t.true(capacityDiffers(n({ [EGR]: '1k', [INR]: '0' }), want), 'zeroed (kubelet re-registration)');
  t.true(capacityDiffers(n({ [EGR]: '1k', [INR]: '1k' }, { [EGR]: '1k' }), want), 'allocatable too');
  t.true(capacityDiffers(n({ [EGR]: '1k', [INR]: '5' }), publishedCapacity({ egress: 1 * G })), 'a stale direction');
  t.false(capacityDiffers(n({ [EGR]: '1k' }), publishedCapacity({ egress: 1 * G })));
});

test('the capacity from config: both keys set read no link speed; the static mode takes the config alone (unset: none, nothing changes)', async (t) => {
  t.deepEqual(await resolveNodeCapacity({ egressCapacity: 10 * G, ingressCapacity: 1 * G }), {
    egress: 10 * G,
    ingress: 1 * G,
    source: { egress: 'config', ingress: 'config' },
  });
  t.deepEqual(await resolveNodeCapacity({ egressCapacity: 10 * G, ingressCapacity: 1 * G, capacityDevice: 'no-such-dev0' }), {
    egress: 10 * G,
    ingress: 1 * G,
    source: { egress: 'config', ingress: 'config' },
  });
  t.like(
    await resolveNodeCapacity({ capacityDevice: 'no-such-dev0' }),
    { device: 'no-such-dev0', source: { egress: 'unknown', ingress: 'unknown' } },
    'a device without a link speed: guarantees off',
  );
  t.is(configuredCapacity({}), undefined);
  t.deepEqual(configuredCapacity({ egressCapacity: 5 * G }), { egress: 5 * G, source: { egress: 'config', ingress: 'unknown' } });
});

test('published at start as a merge patch of the status; again when kubelet drops them, not when it keeps them', async (t) => {
  const { api, publisher, source, status } = await setup(t);
  api.setNode(kubeletStatus(node('node-a', { podCIDR: '10.244.1.0/24' }), false));
  await source.start(() => undefined);
  await until('the watch', () => api.openWatches === 1);
  publisher.publish({ egress: 10 * G, ingress: 1 * G });
  await until('published', () => status()?.capacity?.[EGR] === '10000');
  t.deepEqual(api.patches[0], {
    node: 'node-a',
    contentType: 'application/merge-patch+json',
    patch: { status: { capacity: { [EGR]: '10000', [INR]: '1000' }, allocatable: { [EGR]: '10000', [INR]: '1000' } } },
  });
  t.like(status(), { capacity: { cpu: '2', [EGR]: '10000', [INR]: '1000' }, allocatable: { pods: '110', [EGR]: '10000', [INR]: '1000' } });
  await api.waitDelivered('nodes', ['node-a']);
  await publisher.settled();
  t.is(api.patches.length, 1, 'its own change seen on the watch: nothing more');

  api.setNode(kubeletStatus(api.getNode('node-a')!, true)); // a heartbeat that keeps them
  await api.waitDelivered('nodes', ['node-a']);
  await new Promise((r) => setTimeout(r, 50));
  t.is(api.patches.length, 1);

  api.setNode(kubeletStatus(api.getNode('node-a')!, false)); // the Node recreated: kubelet's keys only
  await until('published again', () => status()?.capacity?.[INR] === '1000');
  t.is(api.patches.length, 2);
  t.is(status()?.allocatable?.[EGR], '10000');
});

test('a direction without capacity removes a stale value; a Node registered later is published when the watch brings it; a failed PATCH is retried', async (t) => {
  const { api, publisher, source, status } = await setup(t);
  await source.start(() => undefined);
  await until('the watch', () => api.openWatches === 1);
  publisher.publish({ egress: 1 * G });
  await until('refused: no Node yet', () => api.patches.length === 1);
  await publisher.settled();
  const stale = node('node-a');
  stale.status = { capacity: { [INR]: '100' }, allocatable: { [INR]: '100' } };
  let fail = true;
  api.failWith = (r) => (r.method === 'PATCH' && fail ? 500 : undefined);
  api.setNode(stale);
  await until('tried on the watch', () => api.requests.filter((r) => r.method === 'PATCH').length >= 2);
  fail = false;
  await until('retried and published', () => status()?.capacity?.[EGR] === '1000', 5_000);
  t.deepEqual(status(), { capacity: { [EGR]: '1000' }, allocatable: { [EGR]: '1000' } }, 'the stale ingress removed');
  await publisher.settled();
  t.deepEqual((api.patches.at(-1)?.patch as { status: { capacity: Record<string, unknown> } } | undefined)?.status.capacity, {
    [EGR]: '1000',
    [INR]: null,
  });
});

test('annotations ride the same status PATCH: published at once, again when someone removes them; a null one is removed only from a Node that shows it', async (t) => {
  const { api, publisher, source } = await setup(t);
  const VX = 'kubenet.io/vxlan';
  const annotation = () => (api.getNode('node-a')?.metadata as { annotations?: Record<string, string> } | undefined)?.annotations?.[VX];
  api.setNode(node('node-a', { podCIDR: '10.244.1.0/24' }));
  await source.start(() => undefined);
  await until('the watch', () => api.openWatches === 1);
  publisher.annotate({ [VX]: 'port=8475,vni=98' });
  await until('published', () => annotation() === 'port=8475,vni=98');
  t.deepEqual(api.patches[0]?.patch, { metadata: { annotations: { [VX]: 'port=8475,vni=98' } } });
  // Someone removes it: the watch shows the Node without it, and it is published again.
  const bare = api.getNode('node-a')!;
  bare.metadata = { ...bare.metadata, annotations: {} };
  api.setNode(bare);
  await until('published again', () => annotation() === 'port=8475,vni=98');
  t.is(api.patches.length, 2);
  // With a capacity too, one PATCH carries both.
  publisher.publish({ egress: 1 * G });
  await until('capacity', () => api.patches.length === 3);
  t.deepEqual(api.patches[2]?.patch, {
    metadata: { annotations: { [VX]: 'port=8475,vni=98' } },
    status: { capacity: { [EGR]: '1000', [INR]: null }, allocatable: { [EGR]: '1000', [INR]: null } },
  });
  await publisher.settled();

  // An agent without tunnels: nothing sent for an absent annotation; a left-over one removed.
  const { api: api2, publisher: p2, source: s2 } = await setup(t, 'node-b');
  api2.setNode(node('node-b', { podCIDR: '10.244.2.0/24' }));
  p2.annotate({ [VX]: null });
  let seen = false;
  await s2.start(() => {
    seen = true;
  });
  await until('the Node seen (its pod CIDR)', () => seen);
  await p2.settled();
  t.is(api2.patches.length, 0, 'no PATCH for an annotation the Node does not have');
  const stale = api2.getNode('node-b')!;
  stale.metadata = { ...stale.metadata, annotations: { [VX]: 'port=8475,vni=98', other: 'kept' } };
  api2.setNode(stale);
  await until(
    'removed',
    () => api2.patches.length === 1 && (api2.getNode('node-b')?.metadata?.annotations as Record<string, string>)?.[VX] === undefined,
  );
  t.deepEqual((api2.getNode('node-b')?.metadata as { annotations?: Record<string, string> } | undefined)?.annotations, { other: 'kept' });
});
