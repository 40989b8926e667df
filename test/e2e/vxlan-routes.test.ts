/**
 * `routes: auto` on the real kernel (src/daemon/cluster/routes.ts, route-plan.ts, vxlan.ts): three
 * "node" namespaces in two subnets joined by a "router" namespace that forwards between them (and
 * knows nothing of pod CIDRs), a bridge and a "pod" namespace per node, and each node's route
 * controller run in this process against its namespace (netlink sockets opened there, iproute2 with
 * `-n`) and a fake API server's Node list and watch. Dual-stack: IPv4 and IPv6 underlay and pods.
 *
 *   kvx-T-n1 (198.18.1.1, fd00:4b:1::1) ─┐
 *                                         ├─ kvx-T-r (bridge 198.18.1.254) ── (198.18.2.254) ── kvx-T-n3 (198.18.2.3)
 *   kvx-T-n2 (198.18.1.2, fd00:4b:1::2) ─┘
 *
 * Asserted: n1-n2 routed directly (no encapsulation: the VXLAN device's tx counters do not move, full
 * MTU), n1/n2-n3 through VXLAN (the router has no route to any pod); pod-to-pod ping both ways and
 * families with the pod's own source address; iperf3 TCP (5 s) through the tunnel and direct, UDP with
 * DF; PMTU: DF pings up to the tunnel MTU answered, above it a "frag needed"/"packet too big", never
 * silence; an InternalIP change moves the FDB entry, neighbour and the tunnel's source; a Node that
 * leaves takes its routes, neighbours and FDB entries with it. Traffic only between the namespaces
 * made here. Needs root; iperf3 runs under the traffic lock.
 */
import anyTest, { type TestFn } from 'ava';
import { execa } from 'execa';
import { FakeApiServer, fakeKubeConfig, type FakeObject } from '../kit/fake-apiserver.js';
import { isRoot, uniq } from '../kit/kernel.js';
import { withTrafficLock } from '../kit/traffic-lock.js';
import { iperf, retryLog } from '../kit/topo.js';
import { until } from '../kit/until.js';
import type { EventRecorder } from '../../src/daemon/kube/events.js';
import { NodeRoutes, netlinkRouteKernel, REASON_VXLAN_DIFFERS, ROUTE_PROTOCOL } from '../../src/daemon/cluster/routes.js';
import { VXLAN_ANNOTATION, vtepMac } from '../../src/daemon/cluster/route-plan.js';
import { iprouteTunnelKernel } from '../../src/daemon/cluster/vxlan.js';
import { createLogger } from '../../src/log.js';

const test = anyTest as TestFn;
const blocker = isRoot ? undefined : 'needs root (network namespaces, veths, bridges, VXLAN devices)';
const serial = blocker ? test.serial.skip : test.serial;
if (blocker) console.warn(`vxlan-routes e2e skipped: ${blocker}`);

const T = uniq(4);
const NS = { r: `kvx-${T}-r`, n: [1, 2, 3].map((i) => `kvx-${T}-n${i}`), p: [1, 2, 3].map((i) => `kvx-${T}-p${i}`) };
const VX = { 4: 'kvx4', 6: 'kvx6' } as const;
const BRIDGE = 'kvxbr';
const PORT = 8475;
const VNI = 98;
/** Node i's subnet (1: n1, n2; 2: n3), underlay addresses, pod addresses. */
const subnet = (i: number) => (i === 3 ? 2 : 1);
const under4 = (i: number) => `198.18.${subnet(i)}.${i}`;
const under6 = (i: number) => `fd00:4b:${subnet(i)}::${i}`;
const pod4 = (i: number) => `10.244.${i}.10`;
const pod6 = (i: number) => `fd00:10:244:${i}::10`;

const node = (i: number, ip4 = under4(i), ip6 = under6(i)): FakeObject => ({
  apiVersion: 'v1',
  kind: 'Node',
  metadata: { name: `n${i}` },
  spec: { podCIDR: `10.244.${i}.0/24`, podCIDRs: [`10.244.${i}.0/24`, `fd00:10:244:${i}::/64`] },
  status: {
    addresses: [
      { type: 'InternalIP', address: ip4 },
      { type: 'InternalIP', address: ip6 },
    ],
  },
});

async function ip(ns: string, args: string[], input?: string) {
  return execa('ip', ['-n', ns, ...args], input === undefined ? {} : { input });
}
async function inNs(ns: string, cmd: string[], opts: { reject?: boolean; timeout?: number } = {}) {
  return execa('ip', ['netns', 'exec', ns, ...cmd], { reject: opts.reject ?? true, ...(opts.timeout ? { timeout: opts.timeout } : {}) });
}
const batch = (ns: string, lines: string[]) => ip(ns, ['-batch', '-'], `${lines.join('\n')}\n`);

async function setup(): Promise<void> {
  for (const ns of [NS.r, ...NS.n, ...NS.p]) await execa('ip', ['netns', 'add', ns]);
  // The router: a bridge for subnet 1 (n1, n2), a plain link for subnet 2 (n3); forwarding on, no pod routes.
  await batch(NS.r, [
    'link set lo up',
    'link add kvxba type bridge',
    'link set kvxba up',
    'addr add 198.18.1.254/24 dev kvxba',
    'addr add fd00:4b:1::fe/64 dev kvxba nodad',
    ...[1, 2].flatMap((i) => [`link add kvxr${i} type veth peer name kvxu netns ${NS.n[i - 1]}`, `link set kvxr${i} master kvxba up`]),
    `link add kvxr3 type veth peer name kvxu netns ${NS.n[2]}`,
    'link set kvxr3 up',
    'addr add 198.18.2.254/24 dev kvxr3',
    'addr add fd00:4b:2::fe/64 dev kvxr3 nodad',
  ]);
  for (const ns of [NS.r, ...NS.n]) await inNs(ns, ['sysctl', '-q', '-w', 'net.ipv4.ip_forward=1', 'net.ipv6.conf.all.forwarding=1']);
  for (const i of [1, 2, 3]) {
    const n = NS.n[i - 1] as string;
    const p = NS.p[i - 1] as string;
    const s = subnet(i);
    await batch(n, [
      'link set lo up',
      `addr add ${under4(i)}/24 dev kvxu`,
      `addr add ${under6(i)}/64 dev kvxu nodad`,
      'link set kvxu up',
      `route add default via 198.18.${s}.254`,
      `route add default via fd00:4b:${s}::fe`,
      `link add ${BRIDGE} type bridge`,
      `addr add 10.244.${i}.1/24 dev ${BRIDGE}`,
      `addr add fd00:10:244:${i}::1/64 dev ${BRIDGE} nodad`,
      `link set ${BRIDGE} up`,
      `link add kvxp type veth peer name eth0 netns ${p}`,
      `link set kvxp master ${BRIDGE} up`,
    ]);
    await batch(p, [
      'link set lo up',
      `addr add ${pod4(i)}/24 dev eth0`,
      `addr add ${pod6(i)}/64 dev eth0 nodad`,
      'link set eth0 up',
      `route add default via 10.244.${i}.1`,
      `route add default via fd00:10:244:${i}::1`,
    ]);
  }
}

async function teardown(): Promise<void> {
  for (const ns of [...NS.p, ...NS.n, NS.r]) await execa('ip', ['netns', 'del', ns], { reject: false });
}

/** Events recorded as (node, reason, message). */
function recorder(events: World['events']): EventRecorder {
  return {
    record: (obj, _type, reason, message) => void events.push({ node: obj.name, reason, message }),
    flush: async () => undefined,
    stop: async () => undefined,
  };
}

interface World {
  api: FakeApiServer;
  controllers: NodeRoutes[];
  events: Array<{ node: string; reason: string; message: string }>;
}
let world: World | undefined;

test.before(async () => {
  if (blocker) return;
  try {
    await setup();
    const api = await FakeApiServer.start();
    for (const i of [1, 2, 3]) api.setNode(node(i));
    const events: World['events'] = [];
    const rec = recorder(events);
    const controllers = [1, 2, 3].map(
      (i) =>
        new NodeRoutes({
          nodeName: `n${i}`,
          // Warnings (a failed kernel change, retried) show in the test's output.
          logger: createLogger({ level: process.env.KUBENET_LOG_LEVEL ?? 'warn', name: `n${i}` }),
          kubeConfig: fakeKubeConfig(api),
          events: rec,
          kernel: netlinkRouteKernel(BRIDGE, { netns: `/var/run/netns/${NS.n[i - 1]}`, exclude: Object.values(VX) }),
          tunnel: {
            kernel: iprouteTunnelKernel({ names: VX, netns: NS.n[i - 1] as string, protocol: ROUTE_PROTOCOL }),
            vni: VNI,
            port: PORT,
          },
          resyncMs: 2_000,
        }),
    );
    world = { api, controllers, events };
    for (const c of controllers) c.start();
  } catch (err) {
    await teardown();
    throw err;
  }
});

test.after.always(async () => {
  if (world) {
    for (const c of world.controllers) await c.stop();
    await world.api.stop();
  }
  await teardown();
});

function w(): World {
  if (!world) throw new Error('setup failed');
  return world;
}

/** `ip route show proto 98` of a node namespace, both families, as "dst via gw dev D [onlink] [mtu M]". */
async function routes(ns: string): Promise<string[]> {
  const out: string[] = [];
  for (const f of ['-4', '-6']) {
    const { stdout } = await execa('ip', ['-n', ns, '-j', '-d', f, 'route', 'show', 'proto', String(ROUTE_PROTOCOL)]);
    for (const r of JSON.parse(stdout || '[]') as Array<{
      dst: string;
      gateway?: string;
      dev: string;
      flags?: string[];
      metrics?: Array<{ mtu?: number }>;
    }>) {
      const mtu = r.metrics?.find((m) => m.mtu !== undefined)?.mtu;
      out.push(`${r.dst} via ${r.gateway ?? '-'} dev ${r.dev}${r.flags?.includes('onlink') ? ' onlink' : ''}${mtu ? ` mtu ${mtu}` : ''}`);
    }
  }
  return out.sort();
}
async function neighbours(ns: string, dev: string): Promise<string[]> {
  const { stdout } = await execa('ip', ['-n', ns, '-j', 'neigh', 'show', 'dev', dev], { reject: false });
  return (JSON.parse(stdout || '[]') as Array<{ dst: string; lladdr?: string; state?: string[] }>)
    .map((n) => `${n.dst} ${n.lladdr ?? '-'} ${(n.state ?? []).join(',')}`)
    .sort();
}
async function fdb(ns: string, dev: string): Promise<string[]> {
  const { stdout } = await execa('bridge', ['-n', ns, '-j', 'fdb', 'show', 'dev', dev], { reject: false });
  return (JSON.parse(stdout || '[]') as Array<{ mac: string; dst?: string }>).map((e) => `${e.mac} ${e.dst ?? '-'}`).sort();
}
async function txPackets(ns: string, dev: string): Promise<number> {
  const { stdout } = await execa('ip', ['-n', ns, '-j', '-s', 'link', 'show', 'dev', dev]);
  const [l] = JSON.parse(stdout) as Array<{ stats64: { tx: { packets: number } } }>;
  return l?.stats64.tx.packets ?? 0;
}
async function ping(from: number, to: string, extra: string[] = [], count = 3) {
  return inNs(NS.p[from - 1] as string, ['ping', '-n', '-c', String(count), '-i', '0.2', '-W', '2', ...extra, to], { reject: false });
}

/** What n1 should hold: n2 direct (full MTU), n3 through VXLAN. */
const N1_ROUTES = [
  '10.244.2.0/24 via 198.18.1.2 dev kvxu',
  '10.244.3.0/24 via 10.244.3.0 dev kvx4 onlink mtu 1450',
  'fd00:10:244:2::/64 via fd00:4b:1::2 dev kvxu',
  'fd00:10:244:3::/64 via fd00:10:244:3:: dev kvx6 onlink mtu 1430',
].sort();

serial(
  'routes converge: same-subnet peer direct, the other subnet through VXLAN, with its neighbour and FDB entry; status and counts per way',
  async (t) => {
    const { controllers, events } = w();
    await until(
      'n1 routes',
      async () => JSON.stringify(await routes(NS.n[0] as string)) === JSON.stringify(N1_ROUTES) || undefined,
      15_000,
    );
    t.deepEqual(await routes(NS.n[0] as string), N1_ROUTES);
    await until('n3 routes', async () => (await routes(NS.n[2] as string)).length === 4 || undefined, 15_000);
    t.deepEqual(await routes(NS.n[2] as string), [
      '10.244.1.0/24 via 10.244.1.0 dev kvx4 onlink mtu 1450',
      '10.244.2.0/24 via 10.244.2.0 dev kvx4 onlink mtu 1450',
      'fd00:10:244:1::/64 via fd00:10:244:1:: dev kvx6 onlink mtu 1430',
      'fd00:10:244:2::/64 via fd00:10:244:2:: dev kvx6 onlink mtu 1430',
    ]);
    t.deepEqual(await neighbours(NS.n[0] as string, VX[4]), [`10.244.3.0 ${vtepMac(under4(3))} PERMANENT`]);
    t.deepEqual(await neighbours(NS.n[0] as string, VX[6]), [`fd00:10:244:3:: ${vtepMac(under6(3))} PERMANENT`]);
    t.deepEqual(await fdb(NS.n[0] as string, VX[4]), [`${vtepMac(under4(3))} ${under4(3)}`]);
    t.deepEqual(await fdb(NS.n[0] as string, VX[6]), [`${vtepMac(under6(3))} ${under6(3)}`]);
    // The device: the VNI and port configured, no learning, this node's derived MAC, the uplink's MTU less 50.
    const { stdout } = await ip(NS.n[0] as string, ['-j', '-d', 'link', 'show', 'dev', VX[4]]);
    const [dev] = JSON.parse(stdout) as Array<{ address: string; mtu: number; linkinfo: { info_data: Record<string, unknown> } }>;
    t.is(dev?.address, vtepMac(under4(1)));
    t.is(dev?.mtu, 1450);
    t.like(dev?.linkinfo.info_data, { id: VNI, port: PORT, learning: false, local: under4(1), link: 'kvxu' });
    t.false('group' in (dev?.linkinfo.info_data ?? {}) || 'remote' in (dev?.linkinfo.info_data ?? {}), 'no group, no remote');
    const status = controllers[0]?.status();
    t.deepEqual(
      status?.routes.map((r) => `${r.node} ${r.dst} ${r.way} ${r.underlay}`).sort(),
      [
        `n2 10.244.2.0/24 direct ${under4(2)}`,
        `n2 fd00:10:244:2::/64 direct ${under6(2)}`,
        `n3 10.244.3.0/24 tunnel ${under4(3)}`,
        `n3 fd00:10:244:3::/64 tunnel ${under6(3)}`,
      ].sort(),
    );
    t.deepEqual(controllers[0]?.wayCounts(), { direct: 2, tunnel: 2 });
    t.deepEqual(status?.problems, {});
    t.deepEqual(events, [], 'every Node is routed: no NodeRouteUnavailable');
    // A full resync (every 2 s here) reads the routes back over netlink, mtu and onlink included, and
    // the devices' entries: nothing differs, so nothing is replaced.
    const replaced = controllers.map((c) => c.counters.replaced);
    const reconciles = controllers.map((c) => c.counters.reconciles);
    await new Promise((r) => setTimeout(r, 2_500));
    t.true(
      controllers.every((c, i) => c.counters.reconciles > (reconciles[i] ?? 0)),
      'each node resynced',
    );
    t.deepEqual(
      controllers.map((c) => c.counters.replaced),
      replaced,
    );
  },
);

serial(
  'pods reach each other across the router through the tunnel with their own source addresses; the same-subnet peer without encapsulation',
  async (t) => {
    for (const [from, to] of [
      [1, 3],
      [3, 1],
      [2, 3],
      [1, 2],
    ] as const) {
      for (const dst of [pod4(to), pod6(to)]) {
        const r = await ping(from, dst);
        t.is(r.exitCode, 0, `p${from} -> ${dst}: ${r.stdout}`);
      }
    }
    // The receiving pod sees the sender's own address (nothing masquerades it): a UDP datagram's source.
    for (const [dst, src, v6] of [
      [pod4(3), pod4(1), false],
      [pod6(3), pod6(1), true],
    ] as const) {
      const server = inNs(NS.p[2] as string, [
        'python3',
        '-c',
        `import socket;s=socket.socket(socket.AF_INET${v6 ? '6' : ''},socket.SOCK_DGRAM);s.bind(('${dst}',7777));s.settimeout(10);print(s.recvfrom(100)[1][0],flush=True)`,
      ]);
      await new Promise((r) => setTimeout(r, 300));
      await inNs(NS.p[0] as string, [
        'python3',
        '-c',
        `import socket;s=socket.socket(socket.AF_INET${v6 ? '6' : ''},socket.SOCK_DGRAM);[s.sendto(b'x',('${dst}',7777)) for _ in range(3)]`,
      ]);
      t.is((await server).stdout.trim(), src);
    }
    // Direct: n1's VXLAN devices send nothing for pod traffic to n2; through the tunnel they do.
    const before = { 4: await txPackets(NS.n[0] as string, VX[4]), 6: await txPackets(NS.n[0] as string, VX[6]) };
    t.is((await ping(1, pod4(2), [], 5)).exitCode, 0);
    t.is((await ping(1, pod6(2), [], 5)).exitCode, 0);
    t.is(await txPackets(NS.n[0] as string, VX[4]), before[4], 'no IPv4 encapsulation to the same-subnet peer');
    t.is(await txPackets(NS.n[0] as string, VX[6]), before[6], 'no IPv6 encapsulation to the same-subnet peer');
    // Full MTU to the direct peer: a 1500-byte DF packet goes through.
    t.is((await ping(1, pod4(2), ['-M', 'do', '-s', '1472'])).exitCode, 0);
    t.is((await ping(1, pod4(3), [], 5)).exitCode, 0);
    t.true((await txPackets(NS.n[0] as string, VX[4])) >= before[4] + 5, 'the tunnel carries the traffic to n3');
  },
);

serial(
  'PMTU: DF pings up to the tunnel MTU are answered, larger ones get frag-needed / packet-too-big, never silence (both families)',
  async (t) => {
    // IPv4: 1450 - 28 = 1422 bytes of payload fit; 1472 (a 1500-byte packet) does not.
    const fits4 = await ping(1, pod4(3), ['-M', 'do', '-s', '1422']);
    t.is(fits4.exitCode, 0, fits4.stdout);
    const big4 = await ping(1, pod4(3), ['-M', 'do', '-s', '1472']);
    t.regex(`${big4.stdout}\n${big4.stderr}`, /mtu ?= ?1450/i, 'frag needed (mtu = 1450), or the local error once learned');
    t.log(
      `IPv4 DF 1500 across the tunnel: ${`${big4.stdout}\n${big4.stderr}`
        .split('\n')
        .find((l) => /mtu/i.test(l))
        ?.trim()}`,
    );
    // IPv6: 1430 - 48 = 1382 bytes fit; 1452 do not.
    const fits6 = await ping(1, pod6(3), ['-M', 'do', '-s', '1382']);
    t.is(fits6.exitCode, 0, fits6.stdout);
    const big6 = await ping(1, pod6(3), ['-M', 'do', '-s', '1452']);
    t.regex(`${big6.stdout}\n${big6.stderr}`, /mtu ?= ?1430/i, 'packet too big (mtu = 1430)');
    t.log(
      `IPv6 DF 1500 across the tunnel: ${`${big6.stdout}\n${big6.stderr}`
        .split('\n')
        .find((l) => /mtu/i.test(l))
        ?.trim()}`,
    );
  },
);

serial('large TCP (iperf3, 5 s) and UDP with DF across the tunnel; TCP direct for comparison', async (t) => {
  const ep = (i: number) => ({ netns: NS.p[i - 1] as string, ip4: pod4(i), ip6: pod6(i) });
  // Forget the path MTU the pings above taught p1: TCP starts at the pod's full MSS and must discover it.
  await ip(NS.p[0] as string, ['-4', 'route', 'flush', 'cache']);
  await ip(NS.p[0] as string, ['-6', 'route', 'flush', 'cache']);
  const tunnel = await iperf(ep(3), ep(1), { seconds: 5, onRetry: retryLog(t) });
  const tunnel6 = await iperf(ep(3), ep(1), { seconds: 5, v6: true, onRetry: retryLog(t) });
  const direct = await iperf(ep(2), ep(1), { seconds: 5, onRetry: retryLog(t) });
  t.log(
    `iperf3 TCP p1->p3 through VXLAN: IPv4 ${(tunnel.bps / 1e9).toFixed(2)} Gbit/s (mss ${tunnel.mss}, ${tunnel.retransmits} retr), IPv6 ${(tunnel6.bps / 1e9).toFixed(2)} Gbit/s (mss ${tunnel6.mss}); p1->p2 direct: ${(direct.bps / 1e9).toFixed(2)} Gbit/s (mss ${direct.mss})`,
  );
  for (const r of [tunnel, tunnel6, direct]) t.true(r.bps > 50e6, `TCP flows (${r.bps} bit/s)`);
  // UDP, DF set, datagrams that fit the tunnel: they arrive (loss well under 5 %).
  const udp = await withTrafficLock(async () => {
    const port = String(30000 + (process.pid % 20000));
    const srv = execa('ip', ['netns', 'exec', NS.p[2] as string, 'iperf3', '-s', '-1', '-p', port], { reject: false });
    try {
      await new Promise((r) => setTimeout(r, 500));
      const c = await inNs(
        NS.p[0] as string,
        ['iperf3', '-c', pod4(3), '-p', port, '-u', '-b', '100M', '-l', '1400', '--dont-fragment', '-t', '3', '-J'],
        { reject: false, timeout: 30_000 },
      );
      return JSON.parse(c.stdout || '{}') as {
        end?: { sum?: { lost_percent: number; packets: number; bits_per_second: number } };
        error?: string;
      };
    } finally {
      srv.kill('SIGKILL');
      await srv.catch(() => undefined);
    }
  });
  t.falsy(udp.error, udp.error);
  t.log(
    `iperf3 UDP 1400-byte datagrams, DF, 100M through VXLAN: ${udp.end?.sum?.packets} packets, ${udp.end?.sum?.lost_percent.toFixed(2)} % lost, ${((udp.end?.sum?.bits_per_second ?? 0) / 1e6).toFixed(0)} Mbit/s`,
  );
  t.true((udp.end?.sum?.packets ?? 0) > 1000);
  // What this guards is the offload/checksum class of bug (flannel#2152), where datagrams across the
  // tunnel are lost outright. On two cores shared with the rest of the suite, 100M of UDP lost up to
  // 8.3 % to socket buffers (CI, 2026-12-05): the bound tells a broken path from a busy one.
  t.true((udp.end?.sum?.lost_percent ?? 100) < 25, `lost ${udp.end?.sum?.lost_percent} %`);
});

serial('an InternalIP change moves the tunnel: the FDB entry, neighbour and device follow, pods reach each other again', async (t) => {
  const n3 = NS.n[2] as string;
  // The new address is a secondary of the same subnet: it must survive the old one's removal below.
  await inNs(n3, ['sysctl', '-q', '-w', 'net.ipv4.conf.kvxu.promote_secondaries=1']);
  await batch(n3, ['addr add 198.18.2.33/24 dev kvxu', 'addr add fd00:4b:2::33/64 dev kvxu nodad']);
  w().api.setNode(node(3, '198.18.2.33', 'fd00:4b:2::33'));
  const want = [`${vtepMac('198.18.2.33')} 198.18.2.33`];
  const want6 = [`${vtepMac('fd00:4b:2::33')} fd00:4b:2::33`];
  // Both families' entries: the agent applies them one family after the other (CI once read v6 between the two).
  await until(
    'n1 fdb moved (both families)',
    async () =>
      (JSON.stringify(await fdb(NS.n[0] as string, VX[4])) === JSON.stringify(want) &&
        JSON.stringify(await fdb(NS.n[0] as string, VX[6])) === JSON.stringify(want6)) ||
      undefined,
    15_000,
  );
  t.deepEqual(await fdb(NS.n[0] as string, VX[4]), want);
  t.deepEqual(await neighbours(NS.n[0] as string, VX[4]), [`10.244.3.0 ${vtepMac('198.18.2.33')} PERMANENT`]);
  t.deepEqual(await fdb(NS.n[0] as string, VX[6]), want6);
  // n3 remade its devices from the new address, with the new MAC.
  await until('n3 device moved', async () => {
    // Remade: absent for a moment between its deletion and its creation.
    const { stdout } = await execa('ip', ['-n', n3, '-j', '-d', 'link', 'show', 'dev', VX[4]], { reject: false });
    const [d] = JSON.parse(stdout || '[]') as Array<{ address: string; linkinfo: { info_data: { local?: string } } }>;
    return (d?.address === vtepMac('198.18.2.33') && d.linkinfo.info_data.local === '198.18.2.33') || undefined;
  });
  await until('n3 v6 device moved', async () => {
    const { stdout } = await execa('ip', ['-n', n3, '-j', '-d', 'link', 'show', 'dev', VX[6]], { reject: false });
    const [d] = JSON.parse(stdout || '[]') as Array<{ address: string }>;
    return d?.address === vtepMac('fd00:4b:2::33') || undefined;
  });
  // Its routes came back on the remade devices.
  await until('n3 routes back', async () => (await routes(n3)).length === 4 || undefined, 15_000);
  for (const dst of [pod4(3), pod6(3)]) {
    const r = await until(
      `p1 -> ${dst} again`,
      async () => {
        const p = await ping(1, dst, [], 2);
        return p.exitCode === 0 ? p : undefined;
      },
      15_000,
      200,
    );
    t.is(r.exitCode, 0);
  }
  // The old address no longer carries anything: remove it, the tunnel still works.
  await batch(n3, [`addr del ${under4(3)}/24 dev kvxu`, `addr del ${under6(3)}/64 dev kvxu`]);
  t.is((await ping(1, pod4(3))).exitCode, 0);
  t.is((await ping(1, pod6(3))).exitCode, 0);
});

/** A device's FDB entries with the port and VNI the kernel lists where they are not the device's own. */
async function fdbFull(ns: string, dev: string): Promise<string[]> {
  const { stdout } = await execa('bridge', ['-n', ns, '-j', 'fdb', 'show', 'dev', dev], { reject: false });
  return (JSON.parse(stdout || '[]') as Array<{ mac: string; dst?: string; port?: number; vni?: number }>)
    .map((e) => `${e.mac} ${e.dst ?? '-'}${e.port !== undefined ? ` port ${e.port}` : ''}${e.vni !== undefined ? ` vni ${e.vni}` : ''}`)
    .sort();
}

serial(
  "n3's agent restarted on another VXLAN port and VNI, published on its Node: the others send to it with its own and it to them with theirs, pods reach each other, each side has a Warning naming the difference",
  async (t) => {
    const { api, controllers, events } = w();
    const n3 = NS.n[2] as string;
    const annotate = (name: string, value: string) => {
      const n = api.getNode(name);
      if (!n) throw new Error(`no Node ${name}`);
      api.setNode({ ...n, metadata: { ...n.metadata, annotations: { ...n.metadata?.annotations, [VXLAN_ANNOTATION]: value } } });
    };
    // What each agent publishes (main.ts's NodeCapacityPublisher; the controllers here run without it).
    annotate('n1', `port=${PORT},vni=${VNI}`);
    annotate('n2', `port=${PORT},vni=${VNI}`);
    await controllers[2]?.stop();
    const other = new NodeRoutes({
      nodeName: 'n3',
      logger: createLogger({ level: process.env.KUBENET_LOG_LEVEL ?? 'warn', name: 'n3' }),
      kubeConfig: fakeKubeConfig(api),
      events: recorder(events),
      kernel: netlinkRouteKernel(BRIDGE, { netns: `/var/run/netns/${n3}`, exclude: Object.values(VX) }),
      tunnel: { kernel: iprouteTunnelKernel({ names: VX, netns: n3, protocol: ROUTE_PROTOCOL }), vni: 1, port: 8472 },
      resyncMs: 2_000,
    });
    controllers[2] = other;
    other.start();
    annotate('n3', 'port=8472,vni=1');
    const n3ip4 = String((api.getNode('n3')?.status as { addresses?: Array<{ address: string }> } | undefined)?.addresses?.[0]?.address);
    await until('n3 device on port 8472, VNI 1', async () => {
      const { stdout } = await ip(n3, ['-j', '-d', 'link', 'show', 'dev', VX[4]]).catch(() => ({ stdout: '[]' }));
      const [d] = JSON.parse(stdout || '[]') as Array<{ linkinfo: { info_data: { id?: number; port?: number } } }>;
      return (d?.linkinfo.info_data.id === 1 && d.linkinfo.info_data.port === 8472) || undefined;
    });
    await until(
      "n1's FDB entry for n3 carries n3's port and VNI",
      async () =>
        (await fdbFull(NS.n[0] as string, VX[4])).some((e) => e === `${vtepMac(n3ip4)} ${n3ip4} port 8472 vni 1`) ? true : undefined,
      15_000,
    );
    await until(
      "n3's FDB entries for n1 and n2 carry theirs",
      async () => {
        const e = await fdbFull(n3, VX[4]);
        return e.length === 2 && e.every((l) => l.endsWith(` port ${PORT} vni ${VNI}`)) ? true : undefined;
      },
      15_000,
    );
    for (const [from, dst] of [
      [1, pod4(3)],
      [1, pod6(3)],
      [3, pod4(2)],
      [3, pod6(1)],
    ] as const) {
      const r = await until(
        `p${from} -> ${dst}`,
        async () => {
          const p = await ping(from, dst, [], 2);
          return p.exitCode === 0 ? p : undefined;
        },
        15_000,
        200,
      );
      t.is(r.exitCode, 0, `p${from} -> ${dst}`);
    }
    const differ = events.filter((e) => e.reason === REASON_VXLAN_DIFFERS);
    t.true(
      differ.some(
        (e) =>
          e.node === 'n3' &&
          /^kubenet on n1: its agent uses VXLAN port 8472 and VNI 1, this node's port 8475 and VNI 98: reached with its own/.test(
            e.message,
          ),
      ),
      JSON.stringify(differ),
    );
    t.true(
      differ.some(
        (e) =>
          e.node === 'n1' &&
          e.message.startsWith("kubenet on n3: its agent uses VXLAN port 8475 and VNI 98, this node's port 8472 and VNI 1"),
      ),
    );
    t.false(
      differ.some((e) => e.node === 'n2' && e.message.startsWith('kubenet on n1')),
      'n1 and n2 agree: nothing between them',
    );
  },
);

serial('a Node that leaves takes its routes, neighbours and FDB entries with it, on every node', async (t) => {
  w().api.deleteNode('n3');
  for (const i of [1, 2]) {
    const n = NS.n[i - 1] as string;
    await until(
      `n${i} forgets n3`,
      async () => ((await routes(n)).every((r) => !r.includes('244.3.') && !r.includes(':244:3:')) ? true : undefined),
      15_000,
    );
    t.deepEqual(await neighbours(n, VX[4]), []);
    t.deepEqual(await neighbours(n, VX[6]), []);
    t.deepEqual(await fdb(n, VX[4]), []);
    t.deepEqual(await fdb(n, VX[6]), []);
  }
  t.deepEqual(await routes(NS.n[0] as string), ['10.244.2.0/24 via 198.18.1.2 dev kvxu', 'fd00:10:244:2::/64 via fd00:4b:1::2 dev kvxu']);
  t.deepEqual(w().controllers[0]?.wayCounts(), { direct: 2, tunnel: 0 });
  // n3's own agent, its Node gone, has no endpoint: its devices go, and its routes to the others with them.
  const n3 = NS.n[2] as string;
  await until(
    'n3 devices gone',
    async () => {
      const { stdout } = await execa('ip', ['-n', n3, '-j', 'link', 'show', 'type', 'vxlan']);
      return (JSON.parse(stdout || '[]') as unknown[]).length === 0 || undefined;
    },
    15_000,
  );
  t.deepEqual(await routes(n3), []);
  // n3's pods are unreachable now (the router has no pod routes): nothing was left to reach them by.
  t.not((await ping(1, pod4(3), [], 2)).exitCode, 0);
});
