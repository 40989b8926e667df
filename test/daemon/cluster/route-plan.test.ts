/** src/daemon/cluster/route-plan.ts: which routes the other Nodes need, and the diff against the kernel (pure). */
import test from 'ava';
import type { V1Node } from '@kubernetes/client-node';
import { diffRoutes, nodeRouteSource, planRoutes, sameRouteSource, type NodeRouteSource } from '../../../src/daemon/cluster/route-plan.js';

const node = (name: string, podCIDRs: string[], ips: string[]): NodeRouteSource => {
  const s = nodeRouteSource({
    metadata: { name },
    spec: { podCIDRs },
    status: { addresses: ips.map((address) => ({ type: 'InternalIP', address })) },
  } as V1Node);
  if (!s) throw new Error('no source');
  return s;
};
const LOCAL = [
  { ifindex: 2, cidr: '198.18.252.11/24' },
  { ifindex: 2, cidr: 'fd00:4b:252::11/64' },
  { ifindex: 3, cidr: '192.0.2.1/28' },
];

test('nodeRouteSource: podCIDRs (else podCIDR), canonical, the first InternalIP per family, nothing else', (t) => {
  const n = {
    metadata: { name: 'a' },
    spec: { podCIDR: '10.244.1.0/24' },
    status: {
      addresses: [
        { type: 'Hostname', address: 'a' },
        { type: 'ExternalIP', address: '203.0.113.1' },
        { type: 'InternalIP', address: 'FD00:4B:252:0::12' },
        { type: 'InternalIP', address: '198.18.252.12' },
        { type: 'InternalIP', address: '198.18.252.99' },
      ],
    },
  } as V1Node;
  t.deepEqual(nodeRouteSource(n), {
    name: 'a',
    podCIDRs: ['10.244.1.0/24'],
    families: [4],
    internalIPs: { 4: '198.18.252.12', 6: 'fd00:4b:252::12' },
  });
  t.deepEqual(
    nodeRouteSource({
      metadata: { name: 'b' },
      spec: { podCIDR: '10.244.1.0/24', podCIDRs: ['10.244.2.0/24', 'fd00:10:244:2::/64'] },
    } as V1Node)?.podCIDRs,
    ['10.244.2.0/24', 'fd00:10:244:2::/64'],
  );
  t.is(nodeRouteSource({ spec: {} } as V1Node), undefined);
  // A heartbeat (conditions, other addresses) is the same; a new InternalIP or CIDR is not.
  t.true(
    sameRouteSource(
      nodeRouteSource(n),
      nodeRouteSource({ ...n, status: { ...n.status, conditions: [{ type: 'Ready', status: 'True' }] } } as V1Node),
    ),
  );
  t.false(sameRouteSource(node('a', ['10.244.1.0/24'], ['198.18.252.12']), node('a', ['10.244.1.0/24'], ['198.18.252.13'])));
  t.false(sameRouteSource(node('a', ['10.244.1.0/24'], ['198.18.252.12']), undefined));
});

test('planRoutes: one route per pod CIDR of every other Node, via its InternalIP of that family, out of the connected link', (t) => {
  const plan = planRoutes(
    'n1',
    [
      node('n3', ['10.244.3.0/24', 'fd00:10:244:3::/64'], ['198.18.252.13', 'fd00:4b:252::13']),
      node('n1', ['10.244.1.0/24'], ['198.18.252.11']),
      node('n2', ['10.244.2.0/24'], ['198.18.252.12']),
      node('fresh', [], ['198.18.252.14']),
      node('n4', ['10.244.4.0/24'], ['192.0.2.4']),
    ],
    LOCAL,
  );
  t.deepEqual(plan.routes, [
    { node: 'n2', family: 4, dst: '10.244.2.0/24', gateway: '198.18.252.12', ifindex: 2 },
    { node: 'n3', family: 4, dst: '10.244.3.0/24', gateway: '198.18.252.13', ifindex: 2 },
    { node: 'n3', family: 6, dst: 'fd00:10:244:3::/64', gateway: 'fd00:4b:252::13', ifindex: 2 },
    { node: 'n4', family: 4, dst: '10.244.4.0/24', gateway: '192.0.2.4', ifindex: 3 },
  ]);
  t.deepEqual([...plan.problems], []);
  // Subnet edges: the last address of 198.19.0.0/20 is on it, the next one is not.
  const edge = planRoutes(
    'n1',
    [node('last', ['10.244.10.0/24'], ['198.19.15.255']), node('next', ['10.244.11.0/24'], ['198.19.16.0'])],
    [{ ifindex: 5, cidr: '198.19.0.1/20' }],
  );
  t.deepEqual(
    edge.routes.map((r) => `${r.node} ${r.ifindex}`),
    ['last 5'],
  );
  t.deepEqual([...edge.problems.keys()], ['next']);
});

test('planRoutes: no route, and a reason, for an address off every connected subnet, a missing family, our own address, a CIDR taken', (t) => {
  const plan = planRoutes(
    'n1',
    [
      node('n1', ['10.244.1.0/24'], ['198.18.252.11']),
      node('far', ['10.244.5.0/24'], ['203.0.113.5']),
      node('v4only', ['10.244.6.0/24', 'fd00:10:244:6::/64'], ['198.18.252.16']),
      node('me-too', ['10.244.7.0/24'], ['198.18.252.11']),
      node('a-first', ['10.244.8.0/24'], ['198.18.252.18']),
      node('b-second', ['10.244.8.0/24'], ['198.18.252.19']),
      node('thief', ['10.244.1.0/24'], ['198.18.252.20']),
    ],
    LOCAL,
  );
  t.deepEqual(
    plan.routes.map((r) => `${r.node} ${r.dst}`),
    ['a-first 10.244.8.0/24', 'v4only 10.244.6.0/24'],
  );
  t.deepEqual(Object.fromEntries(plan.problems), {
    far: 'its InternalIP 203.0.113.5 is not on a subnet directly connected to this node (192.0.2.0/28, 198.18.252.0/24): pod CIDR 10.244.5.0/24 needs a router, not a direct route',
    v4only: 'no InternalIP of IPv6 for pod CIDR fd00:10:244:6::/64',
    'me-too': 'its InternalIP 198.18.252.11 is an address of this node',
    'b-second': "pod CIDR 10.244.8.0/24 is also node a-first's",
    thief: "pod CIDR 10.244.1.0/24 is also this node's",
  });
});

test('diffRoutes: replace what is missing or points elsewhere, remove what no Node wants, leave the rest', (t) => {
  const wanted = planRoutes(
    'n1',
    [
      node('n2', ['10.244.2.0/24'], ['198.18.252.12']),
      node('n3', ['10.244.3.0/24'], ['198.18.252.13']),
      node('n4', ['10.244.4.0/24'], ['198.18.252.14']),
    ],
    LOCAL,
  ).routes;
  const current = [
    { family: 4 as const, dst: '10.244.2.0/24', gateway: '198.18.252.12', ifindex: 2, protocol: 98 },
    { family: 4 as const, dst: '10.244.3.0/24', gateway: '198.18.252.99', ifindex: 2, protocol: 98 },
    { family: 4 as const, dst: '10.244.9.0/24', gateway: '198.18.252.19', ifindex: 2, protocol: 98 },
  ];
  const d = diffRoutes(current, wanted);
  t.deepEqual(
    d.replace.map((r) => `${r.dst} via ${r.gateway}`),
    ['10.244.3.0/24 via 198.18.252.13', '10.244.4.0/24 via 198.18.252.14'],
  );
  t.deepEqual(
    d.remove.map((r) => r.dst),
    ['10.244.9.0/24'],
  );
  t.deepEqual(diffRoutes(current.slice(0, 1), wanted.slice(0, 1)), { replace: [], remove: [] });
});
