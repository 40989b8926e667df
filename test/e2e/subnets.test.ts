/**
 * Nodes in two subnets behind a router, on a real cluster (issue 43): `hack/cluster.sh up --nodes 3
 * --subnets 2 --dual-stack` puts n1 and n2 on 198.18.252.0/24 and n3 on 198.18.253.0/24 (and the
 * IPv6 /64s), joined by the LAN namespace as a router that holds no route to any pod; then
 * `kubectl apply -f manifests/kubenet.yaml`, unchanged (its `routes: auto`). Then: n1 and n2 route
 * each other directly and n3 through VXLAN, both families, and n3 them; every pod pings every pod
 * across the router and sees its own address as the source; every pod resolves a name through
 * kube-dns's ClusterIP wherever CoreDNS runs; TCP crosses the tunnel (iperf3, logged) and a DF
 * packet over the tunnel's MTU gets frag-needed, never silence; n3's agent killed under a ping
 * across the router loses nothing; a Node that leaves leaves no route, neighbour or FDB entry.
 * Traffic only between the cluster's namespaces. Every measurement holds the traffic lock.
 */
import anyTest, { type TestFn } from 'ava';
import { execa } from 'execa';
import { withTrafficLock } from '../kit/traffic-lock.js';
import { iperf, retryLog } from '../kit/topo.js';
import {
  clusterBlocker,
  kclAgentPid as agentPid,
  kclRoutes as ourRoutes,
  LocalCluster,
  MANIFEST,
  pausePidOf,
  pausePod,
  type PodList,
  WHOAMI_SERVER,
  whoami,
} from '../kit/kcl.js';
import { checkPingLoss, pingThroughout } from '../kit/measure.js';
import { msUntil } from '../kit/until.js';

const test = anyTest as TestFn;
const blocker = clusterBlocker();
const serialTest = blocker ? test.serial.skip : test.serial;
if (blocker) console.warn(`subnets e2e tests skipped: ${blocker}`);

const NODES = [1, 2, 3];
const node = (i: number) => `kcl-n${i}`;
const ip4 = (i: number) => `198.18.${i === 3 ? 253 : 252}.${10 + i}`;
const c = new LocalCluster();
let up = false;

/** Every Node's pod CIDRs, by node number. */
async function podCidrs(): Promise<Map<number, string[]>> {
  const nodes = await c.json<{ items: Array<{ metadata: { name: string }; spec: { podCIDRs?: string[] } }> }>(['get', 'nodes']);
  return new Map(nodes.items.map((n) => [Number(n.metadata.name.replace('kcl-n', '')), n.spec.podCIDRs ?? []]));
}

test.before(async (t) => {
  if (blocker) return;
  const t0 = Date.now();
  const r = await c.up(['--nodes', '3', '--subnets', '2', '--dual-stack'], () => t.log("waiting for another suite's cluster to go down"));
  up = true;
  if (r.exitCode !== 0) throw new Error(`hack/cluster.sh up failed:\n${r.all ?? ''}`);
  await withTrafficLock(async () => {
    await c.kubectl(['apply', '-f', MANIFEST]);
    await c.kubectl(['-n', 'kube-system', 'rollout', 'status', 'daemonset/kubenet', '--timeout=180s']);
    await c.kubectl(['wait', '--for=condition=Ready', 'node', '--all', '--timeout=60s']);
  });
  t.log(`3 dual-stack nodes in 2 subnets up and Ready with kubenet in ${Date.now() - t0} ms`);
});

test.after.always(async () => {
  if (!up) return;
  const r = await c.down();
  if (r.exitCode !== 0) throw new Error(`hack/cluster.sh down failed: ${r.all ?? ''}`);
});

serialTest(
  'n1 and n2 route each other directly, n3 through VXLAN (both families), and n3 them; the router holds no pod route',
  async (t) => {
    const cidrs = await podCidrs();
    const want = (i: number) =>
      NODES.filter((j) => j !== i)
        .flatMap((j) =>
          (cidrs.get(j) ?? []).map((cidr) => {
            const v6 = cidr.includes(':');
            const tunnel = i === 3 || j === 3;
            const net = cidr.split('/')[0];
            if (tunnel) return `${cidr} via ${net} dev kubenet-vx${v6 ? 6 : 4}`;
            return `${cidr} via ${v6 ? `fd00:4b:252::${10 + j}` : ip4(j)} dev kcl${i}u`;
          }),
        )
        .sort();
    for (const i of NODES) {
      const ms = await msUntil(async () => JSON.stringify(await ourRoutes(i)) === JSON.stringify(want(i)), Date.now(), 30_000);
      t.deepEqual(await ourRoutes(i), want(i), `${node(i)}'s routes (after ${ms} ms)`);
    }
    t.log(`routes of n1: ${(await ourRoutes(1)).join('; ')}`);
    t.log(`routes of n3: ${(await ourRoutes(3)).join('; ')}`);
    // n3's FDB: n1 and n2 by their InternalIPs, nothing else (no learning, no flooding entry).
    const fdb = (await execa('bridge', ['-n', node(3), 'fdb', 'show', 'dev', 'kubenet-vx4'])).stdout
      .trim()
      .split('\n')
      .map((l) => l.trimEnd())
      .sort();
    t.deepEqual(
      fdb,
      [1, 2].map((j) => `0e:6b:c6:12:fc:${(10 + j).toString(16).padStart(2, '0')} dst ${ip4(j)} self permanent`),
    );
    const router = (await execa('ip', ['-n', 'kcl-lan', 'route', 'show'])).stdout;
    t.false(/10\.244\./.test(router), `the router has no route to a pod: ${router}`);
    // Each agent's VXLAN settings on its Node, as the real API server keeps them.
    for (const i of NODES) {
      const a = await c.kubectl(['get', 'node', node(i), '-o', 'jsonpath={.metadata.annotations.kubenet\\.io/vxlan}']);
      t.is(a.stdout, 'port=8475,vni=98', `${node(i)}'s kubenet.io/vxlan`);
    }
    const unavailable = await c.kubectl(['get', 'events', '-A', '--field-selector', 'reason=NodeRouteUnavailable', '-o', 'name']);
    t.is(unavailable.stdout, '', 'no Node without a route');
  },
);

/** In a pod's netns: kube-dns (its ClusterIP) resolves the API server's Service name. */
const RESOLVE = `const r=new (require('dns').promises.Resolver)();r.setServers(['10.96.0.10']);r.resolve4('kubernetes.default.svc.cluster.local').then((a)=>{console.log(a.join(','));process.exit(0)},(e)=>{console.error(String(e));process.exit(1)});setTimeout(()=>process.exit(2),5000)`;

serialTest(
  'across the router, both families: every pod pings every pod and sees its own address as the source; every pod resolves through kube-dns; TCP and a DF packet over the tunnel MTU',
  (t) =>
    withTrafficLock(async () => {
      await c.kubectl(['apply', '-f', '-'], {
        input: JSON.stringify({ apiVersion: 'v1', kind: 'List', items: NODES.map((i) => pausePod(`sub-${i}`, {}, node(i))) }),
      });
      await c.kubectl(['wait', '--for=condition=Ready', ...NODES.map((i) => `pod/sub-${i}`), '--timeout=90s']);
      const pods = (await c.json<PodList>(['get', 'pods'])).items.filter((p) => p.metadata.name.startsWith('sub-'));
      const ips = new Map(pods.map((p) => [p.metadata.name, (p.status.podIPs ?? []).map((x) => x.ip)]));
      const pid = new Map(pods.map((p) => [p.metadata.name, pausePidOf(p.status.podIP ?? '') ?? '']));
      const servers = [...pid.values()].map((p) =>
        execa('nsenter', ['-t', p, '-n', process.execPath, '-e', WHOAMI_SERVER], { reject: false }),
      );
      try {
        await new Promise((r) => setTimeout(r, 500));
        const results: string[] = [];
        for (const [from, fromIps] of ips) {
          for (const [to, toIps] of ips) {
            if (from === to) continue;
            for (const [k, toIp] of toIps.entries()) {
              const ping = await execa('nsenter', ['-t', pid.get(from) ?? '', '-n', 'ping', '-c', '1', '-W', '2', toIp], { reject: false });
              t.is(ping.exitCode, 0, `${from} pings ${to} (${toIp})`);
              const seen = await whoami(pid.get(from) ?? '', toIp);
              t.is(seen, fromIps[k] ?? '', `${to} sees ${from}'s own address`);
              results.push(`${from}->${to} ${toIp}: ping ${ping.exitCode === 0 ? 'ok' : 'FAILED'}, source seen ${seen}`);
            }
          }
        }
        t.log(results.join('\n'));
        t.is(results.length, 12);
      } finally {
        for (const s of servers) s.kill();
      }
      await c.kubectl(['-n', 'kube-system', 'rollout', 'status', 'deployment/coredns', '--timeout=120s']);
      const dnsNode = (
        await c.kubectl(['-n', 'kube-system', 'get', 'pods', '-l', 'k8s-app=kube-dns', '-o', 'jsonpath={.items[0].spec.nodeName}'])
      ).stdout;
      for (const [name, p] of pid) {
        const r = await execa('nsenter', ['-t', p, '-n', process.execPath, '-e', RESOLVE], { reject: false });
        t.is(r.exitCode, 0, `${name} resolves through kube-dns (CoreDNS on ${dnsNode}): ${r.stderr}`);
        t.is(r.stdout.trim(), '10.96.0.1');
      }
      // TCP across the tunnel (n1's pod to n3's), then a DF packet larger than the tunnel's MTU.
      const ep = (name: string) => {
        const [a4 = '', a6] = ips.get(name) ?? [];
        return { netns: '', netnsPath: `/proc/${pid.get(name)}/ns/net`, ip4: a4, ...(a6 ? { ip6: a6 } : {}) };
      };
      const tcp = await iperf(ep('sub-3'), ep('sub-1'), { onRetry: retryLog(t), seconds: 5 });
      t.log(`iperf3 TCP sub-1 (n1) -> sub-3 (n3) through VXLAN across the router: ${(tcp.bps / 1e9).toFixed(2)} Gbit/s`);
      t.true(tcp.bps > 100e6, `TCP crosses the tunnel: ${tcp.bps} bit/s`);
      const big = await execa(
        'nsenter',
        ['-t', pid.get('sub-1') ?? '', '-n', 'ping', '-c', '1', '-W', '2', '-M', 'do', '-s', '1472', ips.get('sub-3')?.[0] ?? ''],
        { reject: false },
      );
      t.regex(
        `${big.stdout}${big.stderr}`,
        /Frag needed and DF set \(mtu = 1450\)|message too long, mtu=1450/,
        'frag-needed with the tunnel MTU',
      );
      const fits = await execa(
        'nsenter',
        ['-t', pid.get('sub-1') ?? '', '-n', 'ping', '-c', '1', '-W', '2', '-M', 'do', '-s', '1422', ips.get('sub-3')?.[0] ?? ''],
        { reject: false },
      );
      t.is(fits.exitCode, 0, 'a DF packet of the tunnel MTU passes');
    }),
);

serialTest(
  "n3's agent killed under a ping across the router: kubelet restarts it, nothing is lost, its tunnel entries are the same after",
  (t) =>
    withTrafficLock(async () => {
      const pods = (await c.json<PodList>(['get', 'pods'])).items.filter((p) => p.metadata.name.startsWith('sub-'));
      const ip = (n: string) => pods.find((p) => p.metadata.name === n)?.status.podIP ?? '';
      const from = pausePidOf(ip('sub-1')) ?? '';
      const fdbBefore = (await execa('bridge', ['-n', node(3), 'fdb', 'show', 'dev', 'kubenet-vx4'])).stdout;
      const neighBefore = (await execa('ip', ['-n', node(3), 'neigh', 'show', 'dev', 'kubenet-vx4'])).stdout;
      const routesBefore = await ourRoutes(3);
      const pinger = pingThroughout((cmd, args) => execa('nsenter', ['-t', from, '-n', cmd, ...args], { reject: false }), ip('sub-3'), 120);
      const agent = (
        await c.json<{
          items: Array<{
            metadata: { name: string };
            spec: { nodeName: string };
            status: { containerStatuses?: Array<{ restartCount: number }> };
          }>;
        }>(['-n', 'kube-system', 'get', 'pods', '-l', 'app.kubernetes.io/name=kubenet'])
      ).items.find((p) => p.spec.nodeName === node(3));
      const restarts = agent?.status.containerStatuses?.[0]?.restartCount ?? 0;
      await execa('kill', ['-KILL', await agentPid(3)]);
      let now = restarts;
      for (const end = Date.now() + 90_000; Date.now() < end && now <= restarts; await new Promise((r) => setTimeout(r, 250))) {
        const p = await c.json<{ status: { containerStatuses?: Array<{ restartCount: number }> } }>([
          '-n',
          'kube-system',
          'get',
          'pod',
          agent?.metadata.name ?? '',
        ]);
        now = p.status.containerStatuses?.[0]?.restartCount ?? 0;
      }
      t.true(now > restarts, 'kubelet restarted the agent container');
      await c.kubectl(['-n', 'kube-system', 'wait', '--for=condition=Ready', `pod/${agent?.metadata.name}`, '--timeout=90s']);
      await new Promise((r) => setTimeout(r, 1000));
      const ping = await pinger.stop();
      t.log(`sub-1 (n1) -> sub-3 (n3) through the tunnel while n3's agent died and restarted: ${ping.sent} sent, ${ping.lost} lost`);
      checkPingLoss(t, ping);
      t.is(ping.lost, 0, 'no ping lost across the restart');
      t.is((await execa('bridge', ['-n', node(3), 'fdb', 'show', 'dev', 'kubenet-vx4'])).stdout, fdbBefore, 'the FDB as before');
      t.is((await execa('ip', ['-n', node(3), 'neigh', 'show', 'dev', 'kubenet-vx4'])).stdout, neighBefore, 'the neighbours as before');
      t.deepEqual(await ourRoutes(3), routesBefore, 'the routes as before');
    }),
);

serialTest('a Node that leaves takes its route, neighbour and FDB entry off every node; nothing of it is left', async (t) => {
  const cidrs = (await podCidrs()).get(3) ?? [];
  await c.kubectl(['delete', 'pod', 'sub-1', 'sub-2', 'sub-3', '--wait=true', '--timeout=60s']);
  await c.kubectl(['delete', 'node', node(3)]);
  for (const i of [1, 2]) {
    const ms = await msUntil(async () => !(await ourRoutes(i)).some((r) => cidrs.some((x) => r.startsWith(x))), Date.now(), 10_000);
    t.true(ms <= 2000, `${node(i)} unroutes n3 within 2 s: ${ms} ms`);
    t.is((await execa('bridge', ['-n', node(i), 'fdb', 'show', 'dev', 'kubenet-vx4'])).stdout.trim(), '', `${node(i)}: no FDB entry left`);
    t.is((await execa('ip', ['-n', node(i), 'neigh', 'show', 'dev', 'kubenet-vx4'])).stdout.trim(), '', `${node(i)}: no neighbour left`);
    t.is(
      (await execa('ip', ['-n', node(i), 'neigh', 'show', 'dev', 'kubenet-vx6'])).stdout.trim(),
      '',
      `${node(i)}: no IPv6 neighbour left`,
    );
  }
});
