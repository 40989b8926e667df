/** src/daemon/cluster/route-plan.ts: which routes the other Nodes need, and the diff against the kernel (pure). */
import test from 'ava';
import type { V1Node } from '@kubernetes/client-node';
import {
  diffEntries,
  diffRoutes,
  nodeRouteSource,
  parseVxlanSettings,
  planRoutes,
  sameRouteSource,
  tunnelEndpoint,
  VXLAN_ANNOTATION,
  vtepMac,
  type NodeRouteSource,
} from '../../../src/daemon/cluster/route-plan.js';
import { fdbValue } from '../../../src/daemon/cluster/vxlan.js';

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
    { node: 'n2', family: 4, dst: '10.244.2.0/24', gateway: '198.18.252.12', ifindex: 2, way: 'direct', underlay: '198.18.252.12' },
    { node: 'n3', family: 4, dst: '10.244.3.0/24', gateway: '198.18.252.13', ifindex: 2, way: 'direct', underlay: '198.18.252.13' },
    {
      node: 'n3',
      family: 6,
      dst: 'fd00:10:244:3::/64',
      gateway: 'fd00:4b:252::13',
      ifindex: 2,
      way: 'direct',
      underlay: 'fd00:4b:252::13',
    },
    { node: 'n4', family: 4, dst: '10.244.4.0/24', gateway: '192.0.2.4', ifindex: 3, way: 'direct', underlay: '192.0.2.4' },
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

// routes: auto — direct where connected, VXLAN elsewhere.
const TUNNELS = {
  4: { ifindex: 9, mtu: 1450, mac: vtepMac('198.18.252.11') },
  6: { ifindex: 10, mtu: 1430, mac: vtepMac('fd00:4b:252::11') },
};

test('vtepMac: locally administered unicast, from the IPv4 octets or a hash of the IPv6 address, the same on every node', (t) => {
  t.is(vtepMac('198.18.252.11'), '0e:6b:c6:12:fc:0b');
  t.is(vtepMac('10.0.0.1'), '0e:6b:0a:00:00:01');
  const v6 = vtepMac('fd00:4b:252::11');
  t.regex(v6, /^0e(:[0-9a-f]{2}){5}$/);
  t.is(vtepMac('FD00:4B:252:0::11'), v6, 'any spelling of the address gives the same MAC');
  t.not(vtepMac('fd00:4b:253::11'), v6);
  for (const m of [vtepMac('1.2.3.4'), v6]) {
    const first = Number.parseInt(m.slice(0, 2), 16);
    t.is(first & 1, 0, 'unicast');
    t.is(first & 2, 2, 'locally administered');
  }
});

test("tunnelEndpoint: this node's InternalIP of the family, on one of its links; else why not", (t) => {
  const self = node('n1', ['10.244.1.0/24'], ['198.18.252.11']);
  t.deepEqual(tunnelEndpoint(self, LOCAL, 4), { local: '198.18.252.11', uplink: 2, mac: '0e:6b:c6:12:fc:0b' });
  t.regex((tunnelEndpoint(self, LOCAL, 6) as { problem: string }).problem, /no InternalIP of IPv6/);
  t.regex(
    (tunnelEndpoint(node('n1', [], ['203.0.113.7']), LOCAL, 4) as { problem: string }).problem,
    /203\.0\.113\.7 is on none of its links/,
  );
  t.regex((tunnelEndpoint(undefined, LOCAL, 4) as { problem: string }).problem, /no InternalIP/);
});

test('planRoutes with tunnels: connected Nodes direct at full MTU; the others via the VXLAN device, onlink, its MTU, with a neighbour and an FDB entry each', (t) => {
  const plan = planRoutes(
    'n1',
    [
      node('n1', ['10.244.1.0/24', 'fd00:10:244:1::/64'], ['198.18.252.11', 'fd00:4b:252::11']),
      node('n2', ['10.244.2.0/24'], ['198.18.252.12']),
      node('far', ['10.244.5.0/24', 'fd00:10:244:5::/64'], ['198.51.100.5', 'fd00:4c::5']),
      node('far2', ['10.244.6.0/24'], ['198.51.100.6']),
    ],
    LOCAL,
    { tunnels: TUNNELS },
  );
  t.deepEqual(plan.routes, [
    {
      node: 'far',
      family: 4,
      dst: '10.244.5.0/24',
      gateway: '10.244.5.0',
      ifindex: 9,
      way: 'tunnel',
      underlay: '198.51.100.5',
      mtu: 1450,
      onlink: true,
    },
    {
      node: 'far',
      family: 6,
      dst: 'fd00:10:244:5::/64',
      gateway: 'fd00:10:244:5::',
      ifindex: 10,
      way: 'tunnel',
      underlay: 'fd00:4c::5',
      mtu: 1430,
      onlink: true,
    },
    {
      node: 'far2',
      family: 4,
      dst: '10.244.6.0/24',
      gateway: '10.244.6.0',
      ifindex: 9,
      way: 'tunnel',
      underlay: '198.51.100.6',
      mtu: 1450,
      onlink: true,
    },
    { node: 'n2', family: 4, dst: '10.244.2.0/24', gateway: '198.18.252.12', ifindex: 2, way: 'direct', underlay: '198.18.252.12' },
  ]);
  t.deepEqual(plan.neighbours, [
    { family: 4, node: 'far', ip: '10.244.5.0', mac: '0e:6b:c6:33:64:05' },
    { family: 6, node: 'far', ip: 'fd00:10:244:5::', mac: vtepMac('fd00:4c::5') },
    { family: 4, node: 'far2', ip: '10.244.6.0', mac: '0e:6b:c6:33:64:06' },
  ]);
  t.deepEqual(plan.fdb, [
    { family: 4, node: 'far', mac: '0e:6b:c6:33:64:05', dst: '198.51.100.5' },
    { family: 6, node: 'far', mac: vtepMac('fd00:4c::5'), dst: 'fd00:4c::5' },
    { family: 4, node: 'far2', mac: '0e:6b:c6:33:64:06', dst: '198.51.100.6' },
  ]);
  t.deepEqual([...plan.problems], []);
  // Without tunnels (routes: direct) the same Nodes are problems, as before.
  const direct = planRoutes('n1', [node('far', ['10.244.5.0/24'], ['198.51.100.5'])], LOCAL);
  t.deepEqual(direct.routes, []);
  t.deepEqual(direct.neighbours, []);
  t.regex(direct.problems.get('far') ?? '', /needs a router/);
});

test('planRoutes with tunnels: a peer whose agent publishes another port or VNI is reached with its own (its FDB entry carries them) and named; one that publishes ours, or nothing, is not', (t) => {
  const withVxlan = (n: NodeRouteSource, value: string) =>
    nodeRouteSource({
      metadata: { name: n.name, annotations: { [VXLAN_ANNOTATION]: value } },
      spec: { podCIDRs: n.podCIDRs },
      status: { addresses: Object.values(n.internalIPs).map((address) => ({ type: 'InternalIP', address })) },
    } as V1Node) as NodeRouteSource;
  const flannelish = withVxlan(node('far', ['10.244.5.0/24'], ['198.51.100.5']), 'port=8472,vni=1');
  const otherVni = withVxlan(node('far2', ['10.244.6.0/24'], ['198.51.100.6']), 'port=8475,vni=7');
  const same = withVxlan(node('far3', ['10.244.7.0/24'], ['198.51.100.7']), 'port=8475,vni=98');
  const older = node('far4', ['10.244.8.0/24'], ['198.51.100.8']);
  t.deepEqual(flannelish.vxlan, { port: 8472, vni: 1 });
  const plan = planRoutes('n1', [flannelish, otherVni, same, older], LOCAL, { tunnels: TUNNELS, vxlan: { port: 8475, vni: 98 } });
  t.deepEqual(
    plan.fdb.map((e) => fdbValue(e)),
    ['198.51.100.5 port 8472 vni 1', '198.51.100.6 vni 7', '198.51.100.7', '198.51.100.8'],
    "the kernel's own listing: port and VNI only where not the device's",
  );
  t.is(plan.routes.length, 4, 'every peer still has its route');
  t.deepEqual(
    [...plan.mismatched],
    [
      ['far', "its agent uses VXLAN port 8472 and VNI 1, this node's port 8475 and VNI 98"],
      ['far2', "its agent uses VXLAN port 8475 and VNI 7, this node's port 8475 and VNI 98"],
    ],
  );
  t.deepEqual([...plan.problems], []);
  // A change of a peer's settings is a change of its route source (not a heartbeat).
  t.false(sameRouteSource(flannelish, withVxlan(flannelish, 'port=8475,vni=98')));
  t.true(sameRouteSource(flannelish, withVxlan(flannelish, 'port=8472,vni=1')));
  // Anything but port=P,vni=V within range is unknown (treated as an agent that publishes nothing).
  for (const bad of [
    '',
    'port=8472',
    'vni=1,port=8472',
    'port=0,vni=1',
    'port=65536,vni=1',
    'port=8472,vni=16777216',
    'port=8472,vni=0',
    'port=8472, vni=1',
  ])
    t.is(parseVxlanSettings(bad), undefined, bad);
  t.deepEqual(parseVxlanSettings('port=65535,vni=16777215'), { port: 65535, vni: 16777215 });
});

test('planRoutes with tunnels: a family without a device, a Node with our VTEP MAC and our own address get reasons, not routes', (t) => {
  const plan = planRoutes(
    'n1',
    [
      node('far6', ['fd00:10:244:5::/64'], ['fd00:4c::5']),
      node('clash', ['10.244.7.0/24'], ['198.18.252.11']),
      node('far', ['10.244.5.0/24'], ['198.51.100.5']),
    ],
    LOCAL,
    { tunnels: { 4: TUNNELS[4] }, tunnelProblems: { 6: 'this node has no InternalIP of IPv6 to send VXLAN from' } },
  );
  t.deepEqual(
    plan.routes.map((r) => `${r.node} ${r.way}`),
    ['far tunnel'],
  );
  t.regex(
    plan.problems.get('far6') ?? '',
    /not on a subnet directly connected .* no tunnel for pod CIDR fd00:10:244:5::\/64: this node has no InternalIP of IPv6/,
  );
  t.regex(plan.problems.get('clash') ?? '', /an address of this node/);
  // Two Nodes whose VTEP MACs collide (IPv6: a hash): the first by name is tunnelled, the other told why.
  const mac = vtepMac('fd00:4c::5');
  const clash = planRoutes(
    'n1',
    [node('a', ['fd00:10:244:5::/64'], ['fd00:4c::5']), node('b', ['fd00:10:244:6::/64'], ['fd00:4c::6'])],
    LOCAL,
    {
      tunnels: { 6: { ...TUNNELS[6], mac: vtepMac('fd00:4c::6') } },
    },
  );
  t.deepEqual(
    clash.routes.map((r) => r.node),
    ['a'],
  );
  t.regex(clash.problems.get('b') ?? '', /VTEP MAC .* is also this node's/);
  t.not(mac, vtepMac('fd00:4c::6'));
});

test('diffRoutes: a tunnel route whose MTU or onlink flag differs is replaced', (t) => {
  const w = planRoutes('n1', [node('far', ['10.244.5.0/24'], ['198.51.100.5'])], LOCAL, { tunnels: TUNNELS }).routes;
  const same = { family: 4 as const, dst: '10.244.5.0/24', gateway: '10.244.5.0', ifindex: 9, protocol: 98, mtu: 1450, onlink: true };
  t.deepEqual(diffRoutes([same], w), { replace: [], remove: [] });
  t.is(diffRoutes([{ ...same, mtu: 1500 }], w).replace.length, 1);
  t.is(diffRoutes([{ ...same, onlink: false }], w).replace.length, 1);
  t.is(diffRoutes([{ ...same, ifindex: 2, gateway: '198.51.100.5', mtu: undefined, onlink: undefined }], w).replace.length, 1);
});

test('diffEntries: set what is missing or differs, remove what no peer wants and duplicates, keep the rest', (t) => {
  const d = diffEntries(
    [
      { key: '10.244.5.0', value: '0e:6b:c6:33:64:05' },
      { key: '10.244.6.0', value: '0e:6b:00:00:00:00' },
      { key: '10.244.9.0', value: '0e:6b:c6:33:64:09' },
    ],
    [
      { key: '10.244.5.0', value: '0e:6b:c6:33:64:05' },
      { key: '10.244.6.0', value: '0e:6b:c6:33:64:06' },
      { key: '10.244.7.0', value: '0e:6b:c6:33:64:07' },
    ],
  );
  t.deepEqual(
    d.replace.map((e) => e.key),
    ['10.244.6.0', '10.244.7.0'],
  );
  t.deepEqual(
    d.remove.map((e) => e.key),
    ['10.244.9.0'],
  );
});
