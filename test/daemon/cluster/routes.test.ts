/**
 * src/daemon/cluster/routes.ts (the NodeRoutes controller) against the fake API server, with a kernel of
 * the test's own (an in-memory route table behind the RouteKernel interface; the real netlink side
 * is test/netlink/route.test.ts, the whole on a real cluster test/e2e/multinode.test.ts, routes: auto
 * on the kernel test/e2e/vxlan-routes.test.ts): nothing is
 * removed before the first list, only differences are applied, a change is applied without reading
 * every route again, the periodic resync restores a route someone deleted, a failed change is retried,
 * and a Node that cannot be routed gets one Warning Event per reason.
 */
import test from 'ava';
import { FakeApiServer, fakeKubeConfig, type FakeObject } from '../../kit/fake-apiserver.js';
import { until } from '../../kit/until.js';
import type { EventRecorder, ObjectRef } from '../../../src/daemon/kube/events.js';
import { NodeRoutes, ROUTE_PROTOCOL, type RouteKernel } from '../../../src/daemon/cluster/routes.js';
import { silentLogger } from '../../../src/log.js';
import { vtepMac, type TunnelEntry } from '../../../src/daemon/cluster/route-plan.js';
import type { TunnelKernel, VxlanSpec } from '../../../src/daemon/cluster/vxlan.js';
import type { Family } from '../../../src/net/ip.js';
import type { RouteInfo, RouteSpec } from '../../../src/netlink/route.js';

const node = (name: string, cidr: string, ip: string): FakeObject => ({
  apiVersion: 'v1',
  kind: 'Node',
  metadata: { name },
  spec: { podCIDR: cidr, podCIDRs: [cidr] },
  status: { addresses: [{ type: 'InternalIP', address: ip }] },
});

class FakeKernel implements RouteKernel {
  table = new Map<string, RouteInfo>();
  lists = 0;
  ops: string[] = [];
  failNext = 0;
  async list(): Promise<RouteInfo[]> {
    this.lists++;
    return [...this.table.values()];
  }
  async replace(s: RouteSpec): Promise<void> {
    if (this.failNext > 0) {
      this.failNext--;
      throw new Error('injected failure');
    }
    this.ops.push(`replace ${s.dst} via ${s.gateway}`);
    this.table.set(s.dst, { family: 4, dst: s.dst, gateway: s.gateway, ifindex: s.ifindex, protocol: s.protocol });
  }
  async del(dst: string): Promise<void> {
    this.ops.push(`del ${dst}`);
    this.table.delete(dst);
  }
  async localAddresses() {
    return [{ ifindex: 2, cidr: '198.18.0.1/24' }];
  }
}

function recorder() {
  const got: Array<{ obj: ObjectRef; reason: string; message: string }> = [];
  const rec: EventRecorder = {
    record: (obj, _type, reason, message) => void got.push({ obj, reason, message }),
    flush: async () => undefined,
    stop: async () => undefined,
  };
  return { rec, got };
}

test('routes follow the Nodes: only differences applied, no removal before the first list, changes without a dump, resync restores, failures retried', async (t) => {
  const api = await FakeApiServer.start();
  t.teardown(() => api.stop());
  api.setNode(node('self', '10.244.0.0/24', '198.18.0.1'));
  api.setNode(node('b', '10.244.1.0/24', '198.18.0.2'));
  api.setNode(node('far', '10.244.9.0/24', '203.0.113.9'));
  const kernel = new FakeKernel();
  // Left by an earlier agent: b's route (right), and a route of a Node deleted while no agent ran.
  kernel.table.set('10.244.1.0/24', { family: 4, dst: '10.244.1.0/24', gateway: '198.18.0.2', ifindex: 2, protocol: ROUTE_PROTOCOL });
  kernel.table.set('10.244.7.0/24', { family: 4, dst: '10.244.7.0/24', gateway: '198.18.0.7', ifindex: 2, protocol: ROUTE_PROTOCOL });
  const { rec, got } = recorder();
  const routes = new NodeRoutes({
    nodeName: 'self',
    logger: silentLogger(),
    kubeConfig: fakeKubeConfig(api),
    events: rec,
    kernel,
    resyncMs: 300,
  });
  t.teardown(() => routes.stop());
  await routes.reconcile();
  t.deepEqual(kernel.ops, [], 'nothing before the first list');
  routes.start();
  await until('the first reconcile', () => routes.counters.reconciles >= 1, 5000);
  t.deepEqual(kernel.ops, ['del 10.244.7.0/24'], "b's route stays as it was (no flap); the vanished Node's goes");
  t.deepEqual(routes.status().routes, [{ node: 'b', dst: '10.244.1.0/24', via: '198.18.0.2', way: 'direct', underlay: '198.18.0.2' }]);
  t.deepEqual(
    got.map((e) => [e.obj, e.reason]),
    [[{ kind: 'Node', name: 'far' }, 'NodeRouteUnavailable']],
  );
  t.regex(got[0]?.message ?? '', /kubenet on self: .*203\.0\.113\.9 is not on a subnet directly connected/);

  // A new Node and a moved one: applied from what the last reconcile left, no dump of every route.
  const lists = kernel.lists;
  kernel.ops = [];
  api.setNode(node('c', '10.244.2.0/24', '198.18.0.3'));
  await until('c routed', () => kernel.table.has('10.244.2.0/24'), 5000);
  api.setNode(node('b', '10.244.1.0/24', '198.18.0.12'));
  await until('b moved', () => kernel.table.get('10.244.1.0/24')?.gateway === '198.18.0.12', 5000);
  t.deepEqual(kernel.ops, ['replace 10.244.2.0/24 via 198.18.0.3', 'replace 10.244.1.0/24 via 198.18.0.12']);
  t.is(kernel.lists, lists, 'no kernel dump for a change');
  // A heartbeat (same CIDR and address) changes nothing; a Node deleted is unrouted.
  const reconciles = routes.counters.reconciles;
  api.setNode({ ...node('c', '10.244.2.0/24', '198.18.0.3'), metadata: { name: 'c', labels: { beat: '1' } } });
  await new Promise((r) => setTimeout(r, 100));
  t.is(routes.counters.reconciles, reconciles, 'a heartbeat is not even a reconcile');
  api.deleteNode('c');
  await until('c unrouted', () => !kernel.table.has('10.244.2.0/24'), 5000);

  // Someone deletes our route behind our back: the next resync (300 ms here, 30 s by default) restores it.
  kernel.table.delete('10.244.1.0/24');
  await until('the resync restored b', () => kernel.table.has('10.244.1.0/24'), 3000);
  // A failed replace is retried (after 1 s) with the kernel read again.
  kernel.failNext = 1;
  api.setNode(node('d', '10.244.3.0/24', '198.18.0.4'));
  await until('d routed after a retry', () => kernel.table.has('10.244.3.0/24'), 4000);
  t.true(routes.counters.failed >= 1);
  t.is(got.length, 1, 'still one Event for far: reasons are reported once');
});

class FakeTunnels implements TunnelKernel {
  devices = new Map<Family, VxlanSpec>();
  neigh = new Map<Family, Map<string, string>>();
  fdb = new Map<Family, Map<string, string>>();
  ops: string[] = [];
  entryReads = 0;
  failApply = 0;
  constructor(private readonly kernel: FakeKernel) {}
  async ensure(spec: VxlanSpec) {
    const had = this.devices.get(spec.family);
    if (!had || had.local !== spec.local) {
      this.ops.push(`device ${spec.family} ${spec.local} vni ${spec.vni} port ${spec.port} ${spec.mac}`);
      this.neigh.set(spec.family, new Map());
      this.fdb.set(spec.family, new Map());
    }
    this.devices.set(spec.family, spec);
    return { ifindex: 90 + spec.family, mtu: spec.family === 4 ? 1450 : 1430, mac: spec.mac };
  }
  async remove(family: Family) {
    if (this.devices.delete(family)) this.ops.push(`remove ${family}`);
    // Its routes go with it, as the kernel's do.
    for (const [dst, r] of this.kernel.table) if (r.ifindex === 90 + family) this.kernel.table.delete(dst);
  }
  async entries(family: Family) {
    this.entryReads++;
    const m = (x: Map<string, string> | undefined) => [...(x ?? new Map<string, string>())].map(([key, value]) => ({ key, value }));
    return { neighbours: m(this.neigh.get(family)), fdb: m(this.fdb.get(family)) };
  }
  async apply(family: Family, n: { replace: TunnelEntry[]; remove: TunnelEntry[] }, f: { replace: TunnelEntry[]; remove: TunnelEntry[] }) {
    if (this.failApply > 0) {
      this.failApply--;
      throw new Error('injected failure');
    }
    // Routes through the device must not exist before their entries: checked by the order of ops.
    for (const e of f.replace) this.fdb.get(family)?.set(e.key, e.value);
    for (const e of f.remove) this.fdb.get(family)?.delete(e.key);
    for (const e of n.replace) this.neigh.get(family)?.set(e.key, e.value);
    for (const e of n.remove) this.neigh.get(family)?.delete(e.key);
    this.ops.push(`entries ${family} +${n.replace.length + f.replace.length} -${n.remove.length + f.remove.length}`);
  }
}

test('routes: auto — the device from our InternalIP, each tunnel peer its neighbour and FDB entry before its route, a leaving Node takes them, a lost endpoint the device; failures retried', async (t) => {
  const api = await FakeApiServer.start();
  t.teardown(() => api.stop());
  api.setNode(node('self', '10.244.0.0/24', '198.18.0.1'));
  api.setNode(node('b', '10.244.1.0/24', '198.18.0.2'));
  api.setNode(node('far', '10.244.9.0/24', '203.0.113.9'));
  const kernel = new FakeKernel();
  const tunnels = new FakeTunnels(kernel);
  const order: string[] = [];
  const replace = kernel.replace.bind(kernel);
  kernel.replace = async (s) => {
    order.push(`route ${s.dst}${s.mtu ? ` mtu ${s.mtu}` : ''}${s.onlink ? ' onlink' : ''} dev ${s.ifindex}`);
    return replace(s);
  };
  const apply = tunnels.apply.bind(tunnels);
  tunnels.apply = async (...a) => {
    order.push('entries');
    return apply(...a);
  };
  const { rec, got } = recorder();
  const routes = new NodeRoutes({
    nodeName: 'self',
    logger: silentLogger(),
    kubeConfig: fakeKubeConfig(api),
    events: rec,
    kernel,
    tunnel: { kernel: tunnels, vni: 98, port: 8475 },
    resyncMs: 60_000,
  });
  t.teardown(() => routes.stop());
  routes.start();
  await until('far tunnelled', () => kernel.table.has('10.244.9.0/24'), 5000);
  t.deepEqual(tunnels.ops.slice(0, 1), [`device 4 198.18.0.1 vni 98 port 8475 ${vtepMac('198.18.0.1')}`]);
  t.deepEqual(
    order,
    ['entries', 'route 10.244.1.0/24 dev 2', 'route 10.244.9.0/24 mtu 1450 onlink dev 94'],
    'the entries before the routes',
  );
  t.deepEqual([...(tunnels.fdb.get(4) ?? [])], [[vtepMac('203.0.113.9'), '203.0.113.9']]);
  t.deepEqual([...(tunnels.neigh.get(4) ?? [])], [['10.244.9.0', vtepMac('203.0.113.9')]]);
  t.deepEqual(routes.wayCounts(), { direct: 1, tunnel: 1 });
  t.deepEqual(
    routes.status().routes.map((r) => `${r.node} ${r.way} ${r.underlay}${r.mtu ? ` ${r.mtu}` : ''}`),
    ['b direct 198.18.0.2', 'far tunnel 203.0.113.9 1450'],
  );
  t.deepEqual(got, [], 'a Node behind a router is tunnelled, not a Warning');

  // Its address moves: the FDB entry and neighbour follow (diffed, no listing of the device again).
  const reads = tunnels.entryReads;
  api.setNode(node('far', '10.244.9.0/24', '203.0.113.10'));
  await until('far moved', () => tunnels.fdb.get(4)?.has(vtepMac('203.0.113.10')), 5000);
  t.deepEqual([...(tunnels.fdb.get(4) ?? [])], [[vtepMac('203.0.113.10'), '203.0.113.10']]);
  t.is(tunnels.entryReads, reads, 'a change is diffed against what was applied');
  // A failed entry update is retried, the entries read again.
  tunnels.failApply = 1;
  api.setNode(node('far2', '10.244.8.0/24', '203.0.113.8'));
  await until('far2 after a retry', () => tunnels.fdb.get(4)?.has(vtepMac('203.0.113.8')), 5000);
  t.true(tunnels.entryReads > reads);
  t.true(kernel.table.has('10.244.8.0/24'));
  // Leaving: its route, neighbour and FDB entry go.
  api.deleteNode('far');
  await until('far gone', () => !kernel.table.has('10.244.9.0/24') && !tunnels.fdb.get(4)?.has(vtepMac('203.0.113.10')), 5000);
  t.deepEqual([...(tunnels.neigh.get(4)?.keys() ?? [])], ['10.244.8.0']);
  // This node loses its InternalIP: no device, and the tunnelled Node gets a reason.
  api.setNode({ ...node('self', '10.244.0.0/24', '198.18.0.1'), status: { addresses: [] } });
  await until('device removed', () => !tunnels.devices.has(4), 5000);
  t.false(kernel.table.has('10.244.8.0/24'));
  await until('a Warning for far2', () => got.find((e) => e.obj.name === 'far2'), 5000);
  t.regex(
    got.find((e) => e.obj.name === 'far2')?.message ?? '',
    /no tunnel for pod CIDR 10\.244\.8\.0\/24: this node has no InternalIP of IPv4/,
  );
});
