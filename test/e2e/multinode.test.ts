/**
 * Pods on several nodes without a cloud (`routes: auto`, the manifest's, src/daemon/cluster/routes.ts), on a real cluster:
 * hack/cluster.sh up --nodes 3 --dual-stack (each node its own netns with its own uplink on a shared
 * LAN, its own kubelet, containerd and kube-proxy; one API server; pod CIDRs of both families
 * allocated by the controller-manager), `helm install kubenet manifests/chart` with its defaults (the
 * chart manifests/kubenet.yaml is rendered from). Then:
 * every node routes the other nodes' pod CIDRs via their InternalIPs (routing protocol 98); every
 * pod reaches every pod on the other nodes in both families and sees the peer's own address (no
 * masquerading inside the cluster CIDR); iperf3 across nodes runs at line rate (the cluster's pod
 * CIDRs and Service ranges are unshaped by default with routes direct), and each pod's limits hold with a LAN host; a Node
 * added or deleted is routed or unrouted on the others within 1 s; a Node off the LAN is reached
 * through VXLAN, one no way can reach gets a Warning Event instead of a route; killing one node's agent neither disturbs the other two nodes' pods nor
 * flaps its own routes, and routes of a Node deleted while that agent was down go when it restarts.
 * The cluster's DNS (CoreDNS as kube-dns, hack/cluster/coredns.yaml): a pod on one node resolves a
 * Service name to its ClusterIP and reaches the pod behind it on another node; kube-proxy's
 * conntrack timeouts are upstream's in every node's netns and the host's stay as they were.
 * Prometheus (manifests/monitoring) scrapes every agent and the dashboard's queries return series;
 * `kubectl kubenet` reads every node through the API server; `helm upgrade` to metricsAuth:
 * kubernetes puts the metrics port behind the API server's reviews.
 * Traffic only between the cluster's namespaces. Every step holds the traffic lock.
 */
import anyTest, { type ExecutionContext, type TestFn } from 'ava';
import { execa } from 'execa';
import { readFileSync } from 'node:fs';
import { withTrafficLock } from '../kit/traffic-lock.js';
import { iperf, retryLog } from '../kit/topo.js';
import { msUntil } from '../kit/until.js';
import { upstreamDir } from '../kit/upstream.js';
import { readFile } from 'node:fs/promises';
import { join } from 'node:path';
import { dashboardQueries, type Dashboard } from '../kit/dashboard.js';
import { clusterTop, kubectlKubenet, pluginPathDir, type TopJson } from '../kit/kubectl-kubenet.js';
import {
  CHART,
  clusterBlocker,
  kclAgentPid as agentPid,
  kclRoutes as ourRoutes,
  LAN_HOST,
  lanRoutes,
  LocalCluster,
  MANIFEST,
  pausePidOf,
  pausePod,
  type PodList,
  WHOAMI_SERVER,
  whoami,
} from '../kit/kcl.js';
import { checkPingLoss, logRate, logUnshaped, pingThroughout } from '../kit/measure.js';
import { tcOnShards } from '../kit/shards.js';

const test = anyTest as TestFn;
const blocker = clusterBlocker();
const serialTest = blocker ? test.serial.skip : test.serial;
if (blocker) console.warn(`multi-node e2e tests skipped: ${blocker}`);

const NODES = [1, 2, 3];
const node = (i: number) => `kcl-n${i}`;
const c = new LocalCluster();
let up = false;
/** The host's own conntrack close-wait timeout before the cluster came up (undefined: no conntrack yet). */
let hostCloseWait: string | undefined;
const CLOSE_WAIT = 'net/netfilter/nf_conntrack_tcp_timeout_close_wait';
const readSysctl = (path: string) => {
  try {
    return readFileSync(`/proc/sys/${path}`, 'utf8').trim();
  } catch {
    return undefined;
  }
};

interface NodeJson {
  metadata: { name: string };
  spec: { podCIDRs?: string[] };
  status: { addresses: Array<{ type: string; address: string }> };
}
/** Polls node i's routes every 20 ms until `ok`; returns the ms it took since t0 (Infinity after `limitMs`): a time measured, not a wait that fails. */
function msUntilRoutes(i: number, ok: (routes: string[]) => boolean, t0: number, limitMs = 5000): Promise<number> {
  return msUntil(async () => ok(await ourRoutes(i)), t0, limitMs);
}

/** The agent pod of node i. */
async function agentPod(i: number): Promise<{ name: string; restarts: number }> {
  const pods = await c.json<{
    items: Array<{
      metadata: { name: string };
      spec: { nodeName: string };
      status: { containerStatuses?: Array<{ restartCount: number; ready: boolean }> };
    }>;
  }>(['-n', 'kube-system', 'get', 'pods', '-l', 'app.kubernetes.io/name=kubenet']);
  const p = pods.items.find((x) => x.spec.nodeName === node(i));
  return { name: p?.metadata.name ?? '', restarts: p?.status.containerStatuses?.[0]?.restartCount ?? -1 };
}

test.before(async (t) => {
  if (blocker) return;
  const t0 = Date.now();
  hostCloseWait = readSysctl(CLOSE_WAIT);
  const r = await c.up(['--nodes', '3', '--dual-stack'], () => t.log("waiting for another suite's cluster to go down"));
  up = true;
  if (r.exitCode !== 0) throw new Error(`hack/cluster.sh up failed:\n${r.all ?? ''}`);
  await withTrafficLock(async () => {
    // As a Helm user installs it: the chart with its defaults, which render manifests/kubenet.yaml
    // (test/manifests/chart.test.ts); the single-node suite applies that file with kubectl.
    await c.helm(['install', 'kubenet', CHART, '--namespace', 'kube-system', '--wait', '--timeout', '180s']);
    await c.kubectl(['-n', 'kube-system', 'rollout', 'status', 'daemonset/kubenet', '--timeout=180s']);
    await c.kubectl(['wait', '--for=condition=Ready', 'node', '--all', '--timeout=60s']);
  });
  t.log(`3 dual-stack nodes up and Ready with kubenet in ${Date.now() - t0} ms`);
});

test.after.always(async () => {
  if (!up) return;
  const r = await c.down();
  if (r.exitCode !== 0) throw new Error(`hack/cluster.sh down failed: ${r.all ?? ''}`);
});

serialTest("every node routes the other nodes' pod CIDRs (both families) via their InternalIPs, and nothing else", async (t) => {
  const nodes = (await c.json<{ items: NodeJson[] }>(['get', 'nodes'])).items;
  t.is(nodes.length, 3);
  for (const i of NODES) {
    const want = nodes
      .filter((n) => n.metadata.name !== node(i))
      .flatMap((n) =>
        (n.spec.podCIDRs ?? []).map((cidr) => {
          const v6 = cidr.includes(':');
          const via = n.status.addresses.find((a) => a.type === 'InternalIP' && a.address.includes(':') === v6)?.address;
          return `${cidr} via ${via} dev kcl${i}u`;
        }),
      )
      .sort();
    t.is(want.length, 4);
    t.deepEqual(await ourRoutes(i), want, `${node(i)}'s routes`);
  }
  t.log(`routes of ${node(1)}: ${(await ourRoutes(1)).join('; ')}`);
  // kubenet status in the agent pod says the same.
  const status = JSON.parse(
    (await c.kubectl(['-n', 'kube-system', 'exec', (await agentPod(1)).name, '--', 'kubenet', 'status', '--json'])).stdout,
  ) as { routes?: { routes: Array<{ node: string; dst: string; via: string }>; problems: Record<string, string> } };
  t.deepEqual(
    status.routes?.routes.map((r) => `${r.dst} via ${r.via}`).sort(),
    (await ourRoutes(1)).map((r) => r.replace(/ dev \S+$/, '')),
    'kubenet status lists the routes',
  );
  t.deepEqual(status.routes?.problems, {});
  const text = (await c.kubectl(['-n', 'kube-system', 'exec', (await agentPod(1)).name, '--', 'kubenet', 'status'])).stdout;
  t.regex(text, /routes: +4 to other nodes' pods \(proto 98\)/);
});

serialTest(
  'full mesh across nodes, both families: every pod pings every pod on the other nodes and sees its own address as the source',
  (t) =>
    withTrafficLock(async () => {
      await c.kubectl(['apply', '-f', '-'], {
        input: JSON.stringify({ apiVersion: 'v1', kind: 'List', items: NODES.map((i) => pausePod(`mesh-${i}`, {}, node(i))) }),
      });
      await c.kubectl(['wait', '--for=condition=Ready', ...NODES.map((i) => `pod/mesh-${i}`), '--timeout=90s']);
      const pods = (await c.json<PodList>(['get', 'pods'])).items.filter((p) => p.metadata.name.startsWith('mesh-'));
      const ips = new Map(pods.map((p) => [p.metadata.name, (p.status.podIPs ?? []).map((x) => x.ip)]));
      const pid = new Map(pods.map((p) => [p.metadata.name, pausePidOf(p.status.podIP ?? '') ?? '']));
      t.deepEqual(
        [...ips.values()].map((a) => a.length),
        [2, 2, 2],
        'every pod has an IPv4 and an IPv6 address',
      );
      // A UDP "who am I" server in every pod, both families: it answers with the sender's address.
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
              const fromIp = fromIps[k] ?? '';
              const ping = await execa('nsenter', ['-t', pid.get(from) ?? '', '-n', 'ping', '-c', '1', '-W', '2', toIp], { reject: false });
              t.is(ping.exitCode, 0, `${from} (${fromIp}) pings ${to} (${toIp})`);
              const seen = await whoami(pid.get(from) ?? '', toIp);
              t.is(seen, fromIp, `${to} sees ${from}'s own address`);
              results.push(`${from}->${to} ${toIp}: ping ${ping.exitCode === 0 ? 'ok' : 'FAILED'}, source seen ${seen}`);
            }
          }
        }
        t.log(results.join('\n'));
        t.is(results.length, 12);
      } finally {
        for (const s of servers) s.kill();
      }
    }),
);

/** An HTTP server on port 8080 that answers who it is (pod, node, address) and whom it saw. */
const WHO_HTTP_SERVER = `require('http').createServer((q,s)=>s.end(JSON.stringify({pod:process.env.POD_NAME,node:process.env.NODE_NAME,ip:process.env.POD_IP,peer:q.socket.remoteAddress}))).listen(8080,'0.0.0.0')`;
/** In a pod: the name server it is given, the Service name resolved both ways (c-ares on the FQDN, getaddrinfo on the short name through the search path), kube-dns's own IPv6 address, and the Service's answer over HTTP. */
const DNS_CLIENT = `const dns=require('dns').promises,http=require('http'),fs=require('fs');(async()=>{const t0=Date.now();const fqdn=await dns.resolve4('dns-web.default.svc.cluster.local');const ms=Date.now()-t0;const short=(await dns.lookup('dns-web',{family:4})).address;const dns6=await dns.resolve6('kube-dns.kube-system.svc.cluster.local');const body=await new Promise((res,rej)=>http.get('http://dns-web/',{timeout:5000},(r)=>{let b='';r.on('data',(d)=>b+=d);r.on('end',()=>res(b))}).on('error',rej));console.log(JSON.stringify({resolv:fs.readFileSync('/etc/resolv.conf','utf8'),fqdn,ms,short,dns6,body:JSON.parse(body)}))})().catch((e)=>{console.error(String(e));process.exit(1)})`;

serialTest(
  "cluster DNS: a pod on n1 resolves a Service name through kube-dns (10.96.0.10) to the Service's ClusterIP and reaches, through it, the pod behind it on n2, which sees the client's own address",
  (t) =>
    withTrafficLock(async () => {
      await c.kubectl(['-n', 'kube-system', 'rollout', 'status', 'deployment/coredns', '--timeout=120s']);
      const svc = await c.json<{ spec: { clusterIPs: string[]; ipFamilyPolicy: string } }>([
        '-n',
        'kube-system',
        'get',
        'service',
        'kube-dns',
      ]);
      t.deepEqual(
        svc.spec.clusterIPs,
        ['10.96.0.10', 'fd00:10:96::a'],
        "kube-dns at kubelet's clusterDNS, and the IPv6 family too (dual-stack)",
      );
      const image = (
        await c.kubectl(['-n', 'kube-system', 'get', 'daemonset', 'kubenet', '-o', 'jsonpath={.spec.template.spec.containers[0].image}'])
      ).stdout;
      const env = [
        ['POD_NAME', 'metadata.name'],
        ['NODE_NAME', 'spec.nodeName'],
        ['POD_IP', 'status.podIP'],
      ].map(([name, fieldPath]) => ({ name, valueFrom: { fieldRef: { fieldPath } } }));
      const nodePod = (name: string, nodeName: string, script: string, extra: Record<string, unknown> = {}) => ({
        apiVersion: 'v1',
        kind: 'Pod',
        metadata: { name, namespace: 'default', labels: { app: name } },
        spec: {
          nodeName,
          terminationGracePeriodSeconds: 1,
          containers: [{ name: 'node', image, imagePullPolicy: 'Never', command: ['/usr/local/bin/node', '-e', script], env, ...extra }],
        },
      });
      const items = [
        nodePod('dns-web', node(2), WHO_HTTP_SERVER, {
          ports: [{ containerPort: 8080 }],
          readinessProbe: { tcpSocket: { port: 8080 }, periodSeconds: 1 },
        }),
        {
          apiVersion: 'v1',
          kind: 'Service',
          metadata: { name: 'dns-web', namespace: 'default' },
          spec: { selector: { app: 'dns-web' }, ports: [{ port: 80, targetPort: 8080 }] },
        },
        nodePod('dns-client', node(1), 'setInterval(()=>{},3600e3)'),
      ];
      try {
        await c.kubectl(['apply', '-f', '-'], { input: JSON.stringify({ apiVersion: 'v1', kind: 'List', items }) });
        await c.kubectl(['wait', '--for=condition=Ready', 'pod/dns-web', 'pod/dns-client', '--timeout=90s']);
        const clusterIP = (await c.json<{ spec: { clusterIP: string } }>(['get', 'service', 'dns-web'])).spec.clusterIP;
        const web = await c.json<{ status: { podIP: string } }>(['get', 'pod', 'dns-web']);
        const client = await c.json<{ status: { podIP: string } }>(['get', 'pod', 'dns-client']);
        const dnsPod = (await c.json<PodList>(['-n', 'kube-system', 'get', 'pods', '-l', 'k8s-app=kube-dns'])).items.map(
          (p) => `${p.metadata.name} on ${p.spec?.nodeName ?? '?'}`,
        );
        // The Service's endpoints reach kube-proxy's rules a moment after the pod is Ready: retried for 10 s.
        let r = await c.kubectl(['exec', 'dns-client', '--', '/usr/local/bin/node', '-e', DNS_CLIENT], { reject: false });
        for (const end = Date.now() + 10_000; r.exitCode !== 0 && Date.now() < end; ) {
          await new Promise((res) => setTimeout(res, 500));
          r = await c.kubectl(['exec', 'dns-client', '--', '/usr/local/bin/node', '-e', DNS_CLIENT], { reject: false });
        }
        t.is(r.exitCode, 0, `the client ran: ${r.stderr}`);
        const got = JSON.parse(r.stdout) as {
          resolv: string;
          fqdn: string[];
          ms: number;
          short: string;
          dns6: string[];
          body: { pod: string; node: string; ip: string; peer: string };
        };
        t.log(
          `CoreDNS: ${dnsPod.join(', ')}; dns-client (n1) resolved dns-web.default.svc.cluster.local to ${got.fqdn.join(',')} in ${got.ms} ms, dns-web to ${got.short}; Service ClusterIP ${clusterIP}; http://dns-web/ answered ${JSON.stringify(got.body)}`,
        );
        t.regex(got.resolv, /^nameserver 10\.96\.0\.10$/m, "the pod's name server is kube-dns");
        t.regex(got.resolv, /^search default\.svc\.cluster\.local svc\.cluster\.local cluster\.local/m);
        t.deepEqual(got.fqdn, [clusterIP], "the FQDN resolves to the Service's ClusterIP");
        t.is(got.short, clusterIP, 'the short name resolves through the search path to the ClusterIP');
        t.deepEqual(got.dns6, ['fd00:10:96::a'], 'kube-dns answers AAAA with its own IPv6 ClusterIP');
        t.deepEqual(
          { pod: got.body.pod, node: got.body.node, ip: got.body.ip },
          { pod: 'dns-web', node: node(2), ip: web.status.podIP },
          'the answer came from the pod on n2',
        );
        t.is(got.body.peer, client.status.podIP, "the server saw the client pod's own address (no masquerading inside the cluster)");
        // Its RBAC is enough (no forbidden list/watch) and nothing failed (the errors plugin logs every SERVFAIL).
        const logs = (await c.kubectl(['-n', 'kube-system', 'logs', 'deployment/coredns'])).stdout;
        t.notRegex(logs, /forbidden|Failed to (list|watch)|\[ERROR\]/i, `CoreDNS's log: ${logs}`);
      } finally {
        await c.kubectl(
          ['delete', 'pod/dns-web', 'pod/dns-client', 'service/dns-web', '--ignore-not-found', '--wait=true', '--timeout=60s'],
          { reject: false },
        );
      }
    }),
);

serialTest(
  "kube-proxy runs with upstream's conntrack timeouts in every node's netns (close-wait 3600 s, established 86400 s); the host's stay as they were",
  async (t) => {
    for (const i of NODES) {
      const get = async (k: string) => (await c.inNode(i, 'sysctl', ['-n', `net.netfilter.nf_conntrack_tcp_timeout_${k}`])).stdout.trim();
      t.is(await get('close_wait'), '3600', `${node(i)}: close-wait`);
      t.is(await get('established'), '86400', `${node(i)}: established`);
    }
    t.log(
      `host: close-wait ${readSysctl(CLOSE_WAIT)} s (before up: ${hostCloseWait ?? 'no conntrack'}), established ${readSysctl('net/netfilter/nf_conntrack_tcp_timeout_established')} s`,
    );
    if (hostCloseWait !== undefined) t.is(readSysctl(CLOSE_WAIT), hostCloseWait, "the host's close-wait timeout is as before up");
  },
);

serialTest(
  'a host port on one node is reached from a pod on another, and traffic leaving the cluster (to a node address or a LAN host) is masqueraded',
  (t) =>
    withTrafficLock(async () => {
      const hp = pausePod('hp-2', {}, node(2));
      (hp.spec as { containers: Array<Record<string, unknown>> }).containers[0]!.ports = [
        { containerPort: 7777, hostPort: 17777, protocol: 'UDP' },
      ];
      await c.kubectl(['apply', '-f', '-'], { input: JSON.stringify(hp) });
      await c.kubectl(['wait', '--for=condition=Ready', 'pod/hp-2', '--timeout=90s']);
      const hpIp = (await c.json<{ status: { podIP: string } }>(['get', 'pod', 'hp-2'])).status.podIP;
      const server = execa('nsenter', ['-t', pausePidOf(hpIp) ?? '', '-n', process.execPath, '-e', WHOAMI_SERVER], { reject: false });
      try {
        await new Promise((r) => setTimeout(r, 500));
        const fromIp = (await c.json<{ status: { podIP: string } }>(['get', 'pod', 'mesh-1'])).status.podIP;
        const seen = await whoami(pausePidOf(fromIp) ?? '', '198.18.252.12', 17777);
        t.log(`mesh-1 (${fromIp}, n1) → ${node(2)}'s host port 198.18.252.12:17777/udp → hp-2 (${hpIp}): source seen ${seen}`);
        // The destination is a node address, outside nonMasqueradeCIDR: n1 masquerades it as kubenet
        // always has (only pod-to-pod traffic inside the cluster CIDR keeps its source address).
        t.is(seen, '198.18.252.11', "answered; the source is n1's address (masqueraded on the way out of n1)");
        // Traffic leaving the cluster is masqueraded too: a host on the LAN (the test's own LAN
        // namespace) sees n1's address, not the pod's.
        const lanServer = execa('ip', ['netns', 'exec', 'kcl-lan', process.execPath, '-e', WHOAMI_SERVER], { reject: false });
        try {
          await new Promise((r) => setTimeout(r, 500));
          const lanSeen = await whoami(pausePidOf(fromIp) ?? '', '198.18.252.1');
          t.log(`mesh-1 (${fromIp}) → a LAN host 198.18.252.1: source seen ${lanSeen}`);
          t.is(lanSeen, '198.18.252.11', "leaving the cluster, a pod's traffic is masqueraded");
        } finally {
          lanServer.kill();
        }
      } finally {
        server.kill();
        await c.kubectl(['delete', 'pod', 'hp-2', '--wait=true', '--timeout=60s']);
      }
    }),
);

serialTest(
  "across nodes, between pods of the cluster, iperf3 runs at line rate (unshapedCIDRs unset: the cluster's pod CIDRs and Service ranges with routes direct); with a host outside the cluster (the LAN's) each pod's limits hold (±10 %, no full second above 1.25×)",
  (t) =>
    withTrafficLock(async () => {
      const items = [
        pausePod('bw-1', { 'kubernetes.io/ingress-bandwidth': '10M', 'kubernetes.io/egress-bandwidth': '20M' }, node(1)),
        pausePod('bw-2', {}, node(2)),
        pausePod('bw-3', { 'kubernetes.io/ingress-bandwidth': '15M' }, node(3)),
      ];
      await c.kubectl(['apply', '-f', '-'], { input: JSON.stringify({ apiVersion: 'v1', kind: 'List', items }) });
      await c.kubectl(['wait', '--for=condition=Ready', 'pod/bw-1', 'pod/bw-2', 'pod/bw-3', '--timeout=90s']);
      const ip = async (name: string) => (await c.json<{ status: { podIP: string } }>(['get', 'pod', name])).status.podIP;
      const ep = async (name: string) => {
        const a = await ip(name);
        return { netns: '', netnsPath: `/proc/${pausePidOf(a) ?? 'none'}/ns/net`, ip4: a };
      };
      const [b1, b2, b3] = [await ep('bw-1'), await ep('bw-2'), await ep('bw-3')];
      const podCidr = async (i: number) => (await c.json<{ spec: { podCIDR: string } }>(['get', 'node', node(i)])).spec.podCIDR;
      const unroute = await lanRoutes([
        { cidr: await podCidr(1), node: 1 },
        { cidr: await podCidr(3), node: 3 },
      ]);
      try {
        const into1 = await iperf(b1, b2, { onRetry: retryLog(t), seconds: 5 });
        logUnshaped(t, 'bw-2 (n2) → bw-1 (n1, ingress 10M)', into1.bps, into1.intervals, 10e6);
        const outOf1 = await iperf(b2, b1, { onRetry: retryLog(t), seconds: 5 });
        logUnshaped(t, 'bw-1 (n1, egress 20M) → bw-2 (n2)', outOf1.bps, outOf1.intervals, 20e6);
        const lanInto1 = await iperf(b1, LAN_HOST, { onRetry: retryLog(t), seconds: 10 });
        logRate(t, 'LAN host → bw-1 (n1, ingress 10M)', lanInto1.bps, lanInto1.intervals, 10e6);
        const lanOutOf1 = await iperf(LAN_HOST, b1, { onRetry: retryLog(t), seconds: 10 });
        logRate(t, 'bw-1 (n1, egress 20M) → LAN host', lanOutOf1.bps, lanOutOf1.intervals, 20e6);
        const lanInto3 = await iperf(b3, LAN_HOST, { onRetry: retryLog(t), seconds: 10 });
        logRate(t, 'LAN host → bw-3 (n3, ingress 15M)', lanInto3.bps, lanInto3.intervals, 15e6);
      } finally {
        await unroute();
        await c.kubectl(['delete', 'pod', 'bw-1', 'bw-2', 'bw-3', '--wait=true', '--timeout=60s']);
      }
    }),
);

const MONITORING = join(MANIFEST, '../monitoring');

/**
 * A failed CNI call on node `i` (CHECK of a container the agent never saw, through the installed
 * binary as a runtime calls it): kubenet_cni_errors_total gets a series, as on a node in trouble.
 */
async function failedCniCall(i: number): Promise<void> {
  const list = JSON.parse((await c.inNode(i, 'cat', ['/etc/cni/net.d/10-kubenet.conflist'])).stdout) as {
    cniVersion: string;
    name: string;
    plugins: Array<Record<string, unknown>>;
  };
  const conf = { cniVersion: list.cniVersion, name: list.name, ...list.plugins[0] };
  const env = {
    CNI_COMMAND: 'CHECK',
    CNI_CONTAINERID: 'kubenet-e2e-never-added',
    CNI_NETNS: '/proc/self/ns/net',
    CNI_IFNAME: 'eth0',
    CNI_PATH: '/opt/cni/bin',
  };
  const r = await c.inNode(i, '/opt/cni/bin/kubenet', [], false, { env, input: JSON.stringify(conf) });
  if (r.exitCode === 0) throw new Error(`CHECK of a container never added succeeded: ${r.stdout}`);
}

serialTest(
  "Prometheus (manifests/monitoring/prometheus.yaml, unchanged) scrapes every node's agent: a shaped pod's PromQL rate matches its iperf3 figure (±5 %), kubenet_pod_bandwidth_limit_bits_per_second is its limit, and every query of the Grafana dashboard returns series",
  (t) =>
    withTrafficLock(async () => {
      const t0 = Date.now();
      await c.kubectl(['apply', '-f', join(MONITORING, 'prometheus.yaml')]);
      const rolled = await c.kubectl(['-n', 'kubenet-monitoring', 'rollout', 'status', 'deployment/prometheus', '--timeout=180s'], {
        reject: false,
      });
      if (rolled.exitCode !== 0)
        throw new Error(
          `Prometheus did not start: ${(await c.kubectl(['-n', 'kubenet-monitoring', 'describe', 'pods'], { reject: false })).stdout.slice(-3000)}`,
        );
      const targetsUp = async () =>
        (await c.promQuery('up{job="kubenet"} == 1').catch(() => ({ result: [] }))).result.map((r) => r.metric.node).sort();
      const allUp = await msUntil(async () => (await targetsUp()).length === NODES.length, t0, 120_000, 1000);
      t.log(`Prometheus up and scraping every agent ${allUp} ms after apply`);
      t.deepEqual(await targetsUp(), NODES.map(node), "every node's agent is a target that answers");
      // A shaped pod with a guarantee, taking as much as TCP gets from a LAN host for 60 s.
      const pod = pausePod('prom-bw', { 'kubernetes.io/ingress-bandwidth': '10M' }, node(1)) as {
        spec: { containers: Array<Record<string, unknown>> };
      };
      pod.spec.containers[0] = {
        ...pod.spec.containers[0],
        resources: { requests: { 'kubenet.io/ingress-bandwidth': '5' }, limits: { 'kubenet.io/ingress-bandwidth': '5' } },
      };
      await c.kubectl(['apply', '-f', '-'], { input: JSON.stringify(pod) });
      const podCidr = (await c.json<{ spec: { podCIDR: string } }>(['get', 'node', node(1)])).spec.podCIDR;
      const unroute = await lanRoutes([{ cidr: podCidr, node: 1 }]);
      try {
        await c.kubectl(['wait', '--for=condition=Ready', 'pod/prom-bw', '--timeout=90s']);
        const ip = (await c.json<{ status: { podIP: string } }>(['get', 'pod', 'prom-bw'])).status.podIP;
        const ep = { netns: '', netnsPath: `/proc/${pausePidOf(ip) ?? 'none'}/ns/net`, ip4: ip };
        const began = Date.now();
        const run = await iperf(ep, LAN_HOST, { onRetry: retryLog(t), seconds: 60 });
        const ended = Date.now();
        // The tree counts frames; iperf3 counts TCP payload: its figure on the wire adds each data
        // segment's Ethernet, IPv4 and TCP (with timestamps) headers, 14 + 20 + 32 bytes.
        const wire =
          run.bytes !== undefined && run.segments !== undefined && run.bytes > 0
            ? run.bps * ((run.bytes + run.segments * 66) / run.bytes)
            : NaN;
        // The rate over the scrapes inside the run, past TCP's first seconds.
        const at = ended - 1000;
        const windowS = Math.floor((at - (began + 5000)) / 1000);
        await new Promise((r) => setTimeout(r, 1000));
        const q = `8 * rate(kubenet_pod_shaped_bytes_total{pod="prom-bw", namespace="default", direction="ingress"}[${windowS}s])`;
        const prom = Number((await c.promQuery(q, at)).result[0]?.value[1] ?? NaN);
        t.log(
          `LAN host → prom-bw (n1, ingress 10M): iperf3 ${(run.bps / 1e6).toFixed(3)} Mbit/s of payload, ${(wire / 1e6).toFixed(3)} on the wire; PromQL ${q} = ${(prom / 1e6).toFixed(3)} Mbit/s (${((prom / wire) * 100).toFixed(1)} %)`,
        );
        t.true(Math.abs(prom / wire - 1) <= 0.05, `PromQL ${prom} within ±5 % of iperf3's ${wire}`);
        const limit = (await c.promQuery('kubenet_pod_bandwidth_limit_bits_per_second{pod="prom-bw", direction="ingress"}')).result;
        t.deepEqual(
          limit.map((r) => [r.metric.node, r.metric.namespace, r.metric.source, r.value[1]]),
          [[node(1), 'default', 'pod', '10000000']],
        );
        // Every family the dashboard reads exists once a CNI call has failed somewhere; two scrapes later
        // every panel's query (variables as "All", rate over 2 m) returns series.
        await failedCniCall(1);
        const errorsAt = Date.now();
        await msUntil(
          async () => (await c.promQuery('count_over_time(kubenet_cni_errors_total{node="kcl-n1"}[2m]) >= 2')).result.length > 0,
          errorsAt,
          60_000,
          1000,
        );
        const queries = dashboardQueries(JSON.parse(await readFile(join(MONITORING, 'grafana-dashboard.json'), 'utf8')) as Dashboard, '2m');
        const empty: string[] = [];
        for (const query of queries) {
          const r = await c.promQuery(query.query);
          if (r.result.length === 0) empty.push(`${query.title}: ${query.query}`);
        }
        t.deepEqual(empty, [], 'dashboard queries that returned no series');
        t.log(`${queries.length} dashboard queries, each with series`);
        const nodes = JSON.parse(
          (
            await c.kubectl([
              'get',
              '--raw',
              '/api/v1/namespaces/kubenet-monitoring/services/prometheus:9090/proxy/api/v1/label/node/values?match[]=kubenet_pods',
            ])
          ).stdout,
        ) as { data: string[] };
        t.deepEqual(nodes.data.sort(), NODES.map(node), "the dashboard's node variable lists every node");
      } finally {
        await unroute();
        await c.kubectl(['delete', 'pod', 'prom-bw', '--wait=true', '--timeout=60s']);
        // Its scrapes are load of their own: not beside the later cases' measurements.
        await c.kubectl(['delete', '-f', join(MONITORING, 'prometheus.yaml'), '--wait=true', '--timeout=120s']);
      }
    }),
);

/** GET https://NODE:10266/PATH from the LAN host (outside the cluster), with a bearer token or none: the status and body. */
async function scrapeFromLan(i: number, path: string, token?: string, scheme = 'https'): Promise<{ status: number; body: string }> {
  const script = `const m=require(${JSON.stringify(scheme)});const r=m.request(${JSON.stringify(`${scheme}://198.18.252.${10 + i}:10266${path}`)},{rejectUnauthorized:false,headers:${JSON.stringify(token ? { authorization: `Bearer ${token}` } : {})}},(res)=>{let b='';res.on('data',(d)=>b+=d);res.on('end',()=>{console.log(JSON.stringify({status:res.statusCode,body:b.slice(0,4000)}))})});r.on('error',(e)=>{console.log(JSON.stringify({status:0,body:e.message}))});r.end()`;
  const r = await execa('ip', ['netns', 'exec', LAN_HOST.netns, process.execPath, '-e', script]);
  return JSON.parse(r.stdout) as { status: number; body: string };
}

serialTest(
  'metricsAuth kubernetes through the chart (helm upgrade): one more binding (system:auth-delegator); /metrics over TLS answers a service account allowed get on /metrics, refuses one that is not (403) and no token (401), as the real API server reviews them; /healthz stays open; back to the defaults, the binding goes and /metrics is plain HTTP again',
  async (t) => {
    const reader = {
      apiVersion: 'rbac.authorization.k8s.io/v1',
      kind: 'ClusterRole',
      metadata: { name: 'kubenet-e2e-metrics-reader' },
      rules: [{ nonResourceURLs: ['/metrics'], verbs: ['get'] }],
    };
    const binding = {
      apiVersion: 'rbac.authorization.k8s.io/v1',
      kind: 'ClusterRoleBinding',
      metadata: { name: 'kubenet-e2e-metrics-reader' },
      roleRef: { apiGroup: 'rbac.authorization.k8s.io', kind: 'ClusterRole', name: reader.metadata.name },
      subjects: [{ kind: 'ServiceAccount', name: 'e2e-scraper', namespace: 'default' }],
    };
    try {
      const up = await c.helm([
        'upgrade',
        'kubenet',
        CHART,
        '--namespace',
        'kube-system',
        '--set',
        'config.metricsAuth=kubernetes',
        '--wait',
        '--timeout',
        '180s',
      ]);
      t.log(up.all?.split('\n').find((l) => l.startsWith('REVISION')) ?? '');
      await c.kubectl(['-n', 'kube-system', 'rollout', 'status', 'daemonset/kubenet', '--timeout=180s']);
      t.is(
        (await c.json<{ roleRef: { name: string } }>(['get', 'clusterrolebinding', 'kubenet-auth-delegator'])).roleRef.name,
        'system:auth-delegator',
      );
      await c.kubectl(['create', 'serviceaccount', 'e2e-scraper', '-n', 'default']);
      await c.kubectl(['create', 'serviceaccount', 'e2e-nobody', '-n', 'default']);
      await c.kubectl(['apply', '-f', '-'], { input: JSON.stringify({ apiVersion: 'v1', kind: 'List', items: [reader, binding] }) });
      const scraper = (await c.kubectl(['create', 'token', 'e2e-scraper', '-n', 'default'])).stdout.trim();
      const nobody = (await c.kubectl(['create', 'token', 'e2e-nobody', '-n', 'default'])).stdout.trim();
      for (const i of NODES) {
        const none = await scrapeFromLan(i, '/metrics');
        t.is(none.status, 401, `${node(i)} without a token: ${none.body}`);
        const denied = await scrapeFromLan(i, '/metrics', nobody);
        t.is(denied.status, 403, `${node(i)} e2e-nobody: ${denied.body}`);
        t.regex(denied.body, /system:serviceaccount:default:e2e-nobody" may not get \/metrics/);
        const allowed = await scrapeFromLan(i, '/metrics', scraper);
        t.is(allowed.status, 200, `${node(i)} e2e-scraper: ${allowed.body.slice(0, 200)}`);
        t.regex(allowed.body, /^kubenet_pods \d+$/m);
        const health = await scrapeFromLan(i, '/healthz');
        t.is(health.status, 200, `${node(i)} /healthz without a token`);
        t.is((await scrapeFromLan(i, '/v1/status', scraper)).status, 404, 'nothing but /metrics and /healthz, token or not');
      }
    } finally {
      await c.kubectl(['delete', 'clusterrolebinding,clusterrole', 'kubenet-e2e-metrics-reader', '--ignore-not-found']);
      await c.kubectl(['delete', 'serviceaccount', 'e2e-scraper', 'e2e-nobody', '-n', 'default', '--ignore-not-found']);
      await c.helm(['upgrade', 'kubenet', CHART, '--namespace', 'kube-system', '--reset-values', '--wait', '--timeout', '180s']);
      await c.kubectl(['-n', 'kube-system', 'rollout', 'status', 'daemonset/kubenet', '--timeout=180s']);
    }
    t.is(
      (await c.kubectl(['get', 'clusterrolebinding', 'kubenet-auth-delegator'], { reject: false })).exitCode,
      1,
      'the binding goes with the setting',
    );
    const plain = await scrapeFromLan(1, '/metrics', undefined, 'http');
    t.is(plain.status, 200, 'plain HTTP, open, again');
  },
);

serialTest(
  "kubectl kubenet (the plugin, found by kubectl on PATH): top lists every node's pods through the API server, the throttled pod first at its limit; --node and --namespace narrow it; status NODE shows one node",
  (t) =>
    withTrafficLock(async () => {
      const kubeconfig = join(c.dir, 'kubeconfig');
      const items = [
        pausePod('top-1', { 'kubernetes.io/ingress-bandwidth': '10M' }, node(1)),
        pausePod('top-2', { 'kubernetes.io/egress-bandwidth': '5M' }, node(2)),
      ];
      await c.kubectl(['apply', '-f', '-'], { input: JSON.stringify({ apiVersion: 'v1', kind: 'List', items }) });
      const unroute = await lanRoutes([
        { cidr: (await c.json<{ spec: { podCIDR: string } }>(['get', 'node', node(1)])).spec.podCIDR, node: 1 },
      ]);
      try {
        await c.kubectl(['wait', '--for=condition=Ready', 'pod/top-1', 'pod/top-2', '--timeout=90s']);
        const ip = async (name: string) => (await c.json<{ status: { podIP: string } }>(['get', 'pod', name])).status.podIP;
        const ip1 = await ip('top-1');
        const ip2 = await ip('top-2');
        // The throttled pod: as much as TCP gets from the LAN host, for the time `top` looks.
        const flow = iperf({ netns: '', netnsPath: `/proc/${pausePidOf(ip1) ?? 'none'}/ns/net`, ip4: ip1 }, LAN_HOST, {
          onRetry: retryLog(t),
          seconds: 14,
        });
        await new Promise((r) => setTimeout(r, 4000));
        // Through kubectl's own plugin lookup, as an operator runs it.
        const dir = await pluginPathDir(join(c.dir, 'plugin-bin'));
        const kubectl = join(upstreamDir('kubernetes'), 'kubectl');
        const viaKubectl = await execa(kubectl, ['kubenet', 'top', '--json', '--kubeconfig', kubeconfig], {
          env: { PATH: `${dir}:${process.env.PATH ?? ''}` },
          reject: false,
        });
        t.is(viaKubectl.exitCode, 0, viaKubectl.stderr);
        const top = JSON.parse(viaKubectl.stdout) as TopJson;
        const text = await kubectlKubenet(kubeconfig, ['top']);
        await flow;
        t.log(`kubectl kubenet top:\n${text.stdout}`);
        t.deepEqual(top.nodes.map((n) => n.node).sort(), NODES.map(node), 'every node read');
        t.deepEqual(top.unreachable, []);
        const first = top.pods[0];
        t.like(first, { node: node(1), namespace: 'default', pod: 'top-1', direction: 'ingress', limit: 10e6 }, 'the throttled pod first');
        t.true((first?.rate ?? 0) >= 0.85 * 10e6 && (first?.rate ?? 0) <= 1.1 * 10e6, `top-1 at its limit: ${first?.rate}`);
        t.true((first?.overlimitsPerS ?? 0) > 0, 'and throttled');
        t.like(
          top.pods.find((p) => p.pod === 'top-2' && p.direction === 'egress'),
          { node: node(2), limit: 5e6 },
        );
        t.regex(text.stdout, /top-1/);
        const n2 = await clusterTop(kubeconfig, ['--node', node(2)]);
        t.deepEqual([...new Set(n2.pods.map((p) => p.node))], [node(2)]);
        t.true(n2.pods.some((p) => p.pod === 'top-2'));
        const ns = await clusterTop(kubeconfig, ['--namespace', 'kube-system']);
        t.false(
          ns.pods.some((p) => p.namespace === 'default'),
          '--namespace narrows to that namespace',
        );
        const status = await kubectlKubenet(kubeconfig, ['status', node(2)]);
        t.is(status.exitCode, 0, status.stderr);
        t.log(`kubectl kubenet status ${node(2)}:\n${status.stdout}`);
        const podCidr2 = (await c.json<{ spec: { podCIDR: string } }>(['get', 'node', node(2)])).spec.podCIDR;
        t.true(status.stdout.includes(podCidr2), 'its pod CIDR');
        t.true(status.stdout.includes(ip2), "top-2's address");
        t.false(status.stdout.includes(ip1), 'nothing of another node');
      } finally {
        await unroute();
        await c.kubectl(['delete', 'pod', 'top-1', 'top-2', '--wait=true', '--timeout=60s']);
      }
    }),
);

const fakeNode = (name: string, cidrs: string[], ip: string) => ({
  apiVersion: 'v1',
  kind: 'Node',
  metadata: { name, labels: { 'kubenet-e2e': 'fake' } },
  spec: { podCIDR: cidrs[0], podCIDRs: cidrs, unschedulable: true },
  status: { addresses: [{ type: 'InternalIP', address: ip }] },
});

serialTest(
  'a Node added or deleted is routed or unrouted on every other node within 1 s; a Node off the LAN is tunnelled (route, neighbour, FDB entry) and untunnelled within 1 s; a Node no way reaches gets a Warning Event instead of a route',
  async (t) => {
    const dst = '10.244.200.0/24';
    const t0 = Date.now();
    await c.kubectl(['create', '-f', '-'], { input: JSON.stringify(fakeNode('kcl-fake', [dst], '198.18.252.99')) });
    const added = await Promise.all(NODES.map((i) => msUntilRoutes(i, (r) => r.includes(`${dst} via 198.18.252.99 dev kcl${i}u`), t0)));
    const t1 = Date.now();
    await c.kubectl(['delete', 'node', 'kcl-fake']);
    const removed = await Promise.all(NODES.map((i) => msUntilRoutes(i, (r) => !r.some((x) => x.startsWith(dst)), t1)));
    t.log(
      `route to a new Node's pod CIDR on n1..n3 after ${added.join(' / ')} ms (from before kubectl create); gone ${removed.join(' / ')} ms after kubectl delete started`,
    );
    for (const ms of [...added, ...removed]) t.true(ms <= 1000, `within 1 s: ${ms} ms`);

    // Off the LAN (routes: auto, the manifest's): reached through VXLAN, a route, neighbour and FDB entry on every node.
    const t2 = Date.now();
    await c.kubectl(['create', '-f', '-'], { input: JSON.stringify(fakeNode('kcl-far', ['10.244.201.0/24'], '203.0.113.9')) });
    const tunnelled = await Promise.all(
      NODES.map((i) => msUntilRoutes(i, (r) => r.includes('10.244.201.0/24 via 10.244.201.0 dev kubenet-vx4'), t2)),
    );
    t.log(`a Node off the LAN tunnelled on n1..n3 after ${tunnelled.join(' / ')} ms`);
    for (const ms of tunnelled) t.true(ms <= 1000, `within 1 s: ${ms} ms`);
    for (const i of NODES) {
      const fdb = (await execa('bridge', ['-n', node(i), 'fdb', 'show', 'dev', 'kubenet-vx4'])).stdout;
      t.regex(fdb, /^0e:6b:cb:00:71:09 dst 203\.0\.113\.9 self permanent\s*$/m, `${node(i)}'s FDB entry`);
      const neigh = (await execa('ip', ['-n', node(i), 'neigh', 'show', 'dev', 'kubenet-vx4'])).stdout;
      t.regex(neigh, /^10\.244\.201\.0 lladdr 0e:6b:cb:00:71:09 PERMANENT proto 98\s*$/m, `${node(i)}'s neighbour`);
    }
    await c.kubectl(['delete', 'node', 'kcl-far']);
    const untunnelled = await Promise.all(
      NODES.map(async (i) => {
        const ms = await msUntilRoutes(i, (r) => !r.some((x) => x.startsWith('10.244.201.')), Date.now());
        const left = (await execa('bridge', ['-n', node(i), 'fdb', 'show', 'dev', 'kubenet-vx4'])).stdout;
        return { ms, left: left.includes('203.0.113.9') };
      }),
    );
    for (const u of untunnelled) {
      t.true(u.ms <= 1000, `untunnelled within 1 s: ${u.ms} ms`);
      t.false(u.left, 'its FDB entry goes with its route');
    }

    // A Node no way can reach (its pod CIDR IPv4, its only InternalIP IPv6): a Warning Event instead of a route.
    await c.kubectl(['create', '-f', '-'], { input: JSON.stringify(fakeNode('kcl-far', ['10.244.203.0/24'], 'fd00:4b:999::9')) });
    let events: Array<{ source: { host: string }; message: string; type: string }> = [];
    for (const end = Date.now() + 10_000; Date.now() < end && events.length < 3; await new Promise((r) => setTimeout(r, 200))) {
      events = (
        await c.json<{ items: typeof events }>([
          'get',
          'events',
          '-n',
          'default',
          '--field-selector',
          'involvedObject.kind=Node,involvedObject.name=kcl-far,reason=NodeRouteUnavailable',
        ])
      ).items;
    }
    t.deepEqual(events.map((e) => e.source.host).sort(), NODES.map(node), 'one Warning Event from every node');
    for (const e of events) {
      t.is(e.type, 'Warning');
      t.regex(e.message, /no InternalIP of IPv4 for pod CIDR 10\.244\.203\.0\/24/);
    }
    t.log(`Event: ${events[0]?.message ?? '(none)'}`);
    for (const i of NODES)
      t.false(
        (await ourRoutes(i)).some((r) => r.startsWith('10.244.203.')),
        `no route on ${node(i)}`,
      );
    await c.kubectl(['delete', 'node', 'kcl-far']);
  },
);

serialTest(
  "killing one node's agent disturbs neither the other nodes' pods nor its own routes; a Node deleted while it was down is unrouted when it starts again",
  (t) =>
    withTrafficLock(async () => {
      const ips = new Map(
        (await c.json<PodList>(['get', 'pods'])).items
          .filter((p) => p.metadata.name.startsWith('mesh-'))
          .map((p) => [p.metadata.name, p.status.podIP ?? '']),
      );
      const from = pausePidOf(ips.get('mesh-1') ?? '') ?? '';
      // A Node that n3 routes; n3's agent is frozen, the Node deleted, then the agent killed.
      await c.kubectl(['create', '-f', '-'], { input: JSON.stringify(fakeNode('kcl-gone', ['10.244.202.0/24'], '198.18.252.98')) });
      t.true((await msUntilRoutes(3, (r) => r.some((x) => x.startsWith('10.244.202.0/24')), Date.now())) < 5000, 'n3 routes the new Node');
      const before = await ourRoutes(3);
      const monitor = execa('ip', ['-n', node(3), 'monitor', 'route'], { reject: false });
      const pinger = pingThroughout(
        (cmd, args) => execa('nsenter', ['-t', from, '-n', cmd, ...args], { reject: false }),
        ips.get('mesh-2') ?? '',
        120,
      );
      const pid = await agentPid(3);
      const restarts = (await agentPod(3)).restarts;
      await execa('kill', ['-STOP', pid]);
      await c.kubectl(['delete', 'node', 'kcl-gone']);
      await new Promise((r) => setTimeout(r, 1500));
      t.deepEqual(await ourRoutes(3), before, 'a frozen agent changes nothing');
      const t0 = Date.now();
      await execa('kill', ['-KILL', pid]);
      let pod = await agentPod(3);
      for (const end = Date.now() + 90_000; Date.now() < end && pod.restarts <= restarts; await new Promise((r) => setTimeout(r, 250)))
        pod = await agentPod(3);
      t.true(pod.restarts > restarts, 'kubelet restarted the agent container');
      const gone = await msUntilRoutes(3, (r) => !r.some((x) => x.startsWith('10.244.202.')), t0, 90_000);
      t.log(`n3's agent killed; restarted by kubelet; the deleted Node's route removed ${gone} ms after the kill`);
      await c.kubectl(['-n', 'kube-system', 'wait', '--for=condition=Ready', `pod/${pod.name}`, '--timeout=90s']);
      await new Promise((r) => setTimeout(r, 1000));
      const ping = await pinger.stop();
      monitor.kill();
      const changes = (await monitor).stdout.split('\n').filter((l) => /proto 98/.test(l));
      t.log(
        `mesh-1 (n1) → mesh-2 (n2) while n3's agent died and restarted: ${ping.sent} sent, ${ping.lost} lost; n3's route changes: ${changes.join(' | ') || 'none'}`,
      );
      checkPingLoss(t, ping);
      t.is(ping.lost, 0, 'no ping lost between the other two nodes');
      t.deepEqual(
        changes.filter((l) => !l.startsWith('Deleted 10.244.202.0/24 ')),
        [],
        "no route of n3 flapped: the only change is the deleted Node's",
      );
      t.is(changes.length, 1);
      t.deepEqual(
        await ourRoutes(3),
        before.filter((r) => !r.startsWith('10.244.202.')),
        'every other route as before',
      );
    }),
);

/** The ceils of the htb classes on node i's egress shards (the pods' egress limits in the kernel), as tc prints them. */
async function egressCeils(i: number): Promise<string[]> {
  const stdout = await tcOnShards(async (cmd, args) => (await c.inNode(i, cmd, args, false)).stdout, 'egress', 'class');
  return [...stdout.matchAll(/ ceil (\S+)/g)].map((m) => m[1] ?? '');
}

/** What pods leave on node i: host-local reservations and the agent's pod records. */
async function podState(i: number): Promise<string[]> {
  const ls = async (dir: string) =>
    (await c.inNode(i, 'ls', [dir], false)).stdout.split('\n').filter((f) => f !== '' && f !== 'lock' && !f.startsWith('last_reserved'));
  return [...(await ls('/var/lib/cni/networks/kubenet')), ...(await ls('/var/lib/kubenet/pods'))].sort();
}

/**
 * The faults, and how soon after the first accepted write every node must show the changes. After
 * etcd comes back the API server accepts writes before its own watch cache has resumed its etcd
 * watch (measured: the Node change reached every node's watch 0.75-2.3 s after, the pod change
 * 1.2 s, 9.1 s and 13.8 s in three runs, on all three nodes at the same instant each time): that
 * lag is the API server's, not the agents', so there the bound is the watch cache's.
 */
/**
 * A bound that tells recovery from the old backoff (37 s) in one run on a loaded CI machine; the 3 s
 * p99 goal is bench/api-outage.ts's, over 5 outages (one run here took 3 006 ms on one node while the
 * other suites ran beside it).
 */
const RECOVERY_BOUND_MS = 10_000;

const FAULTS = [
  {
    what: 'kube-apiserver stopped 20 s',
    withinMs: RECOVERY_BOUND_MS,
    run: async () => {
      await c.stop('kube-apiserver');
      await new Promise((r) => setTimeout(r, 20_000));
      await c.start('kube-apiserver');
    },
  },
  {
    what: 'etcd stopped 20 s',
    withinMs: 30_000,
    run: async () => {
      await c.stop('etcd');
      await new Promise((r) => setTimeout(r, 20_000));
      await c.start('etcd');
    },
  },
  {
    what: 'kube-controller-manager restarted',
    withinMs: RECOVERY_BOUND_MS,
    run: async () => {
      await c.restart('kube-controller-manager');
    },
  },
];

serialTest(
  "control-plane faults (kube-apiserver stopped 20 s, etcd stopped 20 s, kube-controller-manager restarted): pods on different nodes lose no ping and no route flaps; once the API server accepts writes, a new Node is routed and an annotation change is in the kernel on every node within 10 s (the 3 s p99 goal: bench/api-outage.ts; after etcd: as soon as the API server's watch cache has resumed), a new pod runs with its limits; nothing left after",
  async (t) => {
    // Three faults of ~40 s each: longer than ava's 120 s without a test result (a local run of this file alone timed out).
    t.timeout(360_000);
    // The traffic lock one fault at a time: held through all three (~150 s) it would starve the suites waiting on it.
    const ips = new Map(
      (await c.json<PodList>(['get', 'pods'])).items
        .filter((p) => p.metadata.name.startsWith('mesh-'))
        .map((p) => [p.metadata.name, p.status.podIP ?? '']),
    );
    const from = pausePidOf(ips.get('mesh-1') ?? '') ?? '';
    t.truthy(from, 'mesh-1 runs');
    const stateBefore = await Promise.all(NODES.map(podState));
    try {
      for (const [k, fault] of FAULTS.entries())
        await withTrafficLock(async () => {
          const routesBefore = await Promise.all(NODES.map(ourRoutes));
          const monitors = NODES.map((i) => execa('ip', ['-n', node(i), 'monitor', 'route'], { reject: false }));
          const pinger = pingThroughout(
            (cmd, args) => execa('nsenter', ['-t', from, '-n', cmd, ...args], { reject: false }),
            ips.get('mesh-2') ?? '',
            150,
          );
          // Whatever throws below, the monitors and the pinger end with the fault (a monitor left running
          // keeps the test worker alive after the cluster is gone).
          try {
            const faultStart = Date.now();
            await fault.run();
            // The first write accepted is the new Node; the annotations follow at once.
            const dst = `10.244.${210 + k}.0/24`;
            const gw = `198.18.252.${90 + k}`;
            const t0 = await c.firstWrite(() =>
              c.kubectl(['--request-timeout=3s', 'create', '-f', '-'], { input: JSON.stringify(fakeNode(`kcl-cp-${k}`, [dst], gw)) }),
            );
            const rate = `${21 + k}Mbit`;
            const annotated = Promise.all(
              NODES.map((i) => c.kubectl(['annotate', '--overwrite', 'pod', `mesh-${i}`, `kubernetes.io/egress-bandwidth=${21 + k}M`])),
            );
            const [routed, shaped] = await Promise.all([
              Promise.all(
                NODES.map((i) => msUntilRoutes(i, (r) => r.includes(`${dst} via ${gw} dev kcl${i}u`), t0, fault.withinMs + 10_000)),
              ),
              Promise.all(NODES.map((i) => msUntil(async () => (await egressCeils(i)).includes(rate), t0, fault.withinMs + 10_000))),
            ]);
            await annotated;
            t.log(
              `${fault.what}: writes accepted ${t0 - faultStart} ms after the fault began; the new Node routed on n1..n3 after ${routed.join(' / ')} ms, egress ${rate} in the kernel after ${shaped.join(' / ')} ms`,
            );
            for (const ms of [...routed, ...shaped])
              t.true(ms <= fault.withinMs, `${fault.what}: within ${fault.withinMs} ms of the first accepted write: ${ms} ms`);
            // A new pod on node 3 with its limits.
            const pod = `cp-${k}`;
            await c.kubectl(['create', '-f', '-'], {
              input: JSON.stringify(pausePod(pod, { 'kubernetes.io/egress-bandwidth': `${31 + k}M` }, node(3))),
            });
            await c.kubectl(['wait', '--for=condition=Ready', `pod/${pod}`, '--timeout=90s']);
            t.true((await egressCeils(3)).includes(`${31 + k}Mbit`), `${fault.what}: the new pod's egress limit is in the kernel`);
            await new Promise((r) => setTimeout(r, 500));
            const ping = await pinger.stop();
            for (const m of monitors) m.kill();
            const changes = (await Promise.all(monitors)).map((m) =>
              m.stdout.split('\n').filter((l) => /proto 98/.test(l) && !l.includes(dst)),
            );
            t.log(
              `${fault.what}: mesh-1 (n1) → mesh-2 (n2): ${ping.sent} sent, ${ping.lost} lost; other route changes: ${changes.flat().join(' | ') || 'none'}`,
            );
            const ranMs = Date.now() - faultStart;
            t.true(ping.sent >= (0.8 * ranMs) / 50, `the ping ran through the fault (${ping.sent} sent in ${ranMs} ms)`);
            t.is(ping.lost, 0, `${fault.what}: no ping lost between pods on different nodes`);
            t.deepEqual(changes, [[], [], []], `${fault.what}: no route flapped`);
            const routesAfter = await Promise.all(NODES.map(ourRoutes));
            t.deepEqual(
              routesAfter.map((r) => r.filter((x) => !x.startsWith(dst))),
              routesBefore,
              'every other route as before',
            );
            await c.kubectl(['delete', 'node', `kcl-cp-${k}`]);
            await c.kubectl(['delete', 'pod', pod, '--wait=true', '--timeout=60s']);
          } finally {
            for (const m of monitors) m.kill();
            await pinger.stop().catch(() => undefined);
          }
        });
    } finally {
      for (const [k] of FAULTS.entries()) await c.kubectl(['delete', 'node', `kcl-cp-${k}`, `--ignore-not-found`], { reject: false });
      for (const [k] of FAULTS.entries())
        await c.kubectl(['delete', 'pod', `cp-${k}`, '--ignore-not-found', '--wait=true', '--timeout=60s'], { reject: false });
      for (const i of NODES) await c.kubectl(['annotate', 'pod', `mesh-${i}`, 'kubernetes.io/egress-bandwidth-'], { reject: false });
    }
    // Nothing of the pods made here is left on any node (reservations, records).
    let after: string[][] = [];
    for (const end = Date.now() + 30_000; Date.now() < end; await new Promise((r) => setTimeout(r, 500))) {
      after = await Promise.all(NODES.map(podState));
      if (JSON.stringify(after) === JSON.stringify(stateBefore)) break;
    }
    t.deepEqual(after, stateBefore, 'no reservation or record left');
  },
);

serialTest('deleting a real Node removes its routes on the others within 1 s', async (t: ExecutionContext) => {
  const cidrs = (await c.json<NodeJson>(['get', 'node', node(3)])).spec.podCIDRs ?? [];
  t.is(cidrs.length, 2);
  const t0 = Date.now();
  await c.kubectl(['delete', 'node', node(3), '--wait=false']);
  const ms = await Promise.all(
    [1, 2].map((i) => msUntilRoutes(i, (r) => !r.some((x) => cidrs.some((cidr) => x.startsWith(`${cidr} `))), t0)),
  );
  t.log(`${node(3)} (${cidrs.join(', ')}) deleted: its routes gone on n1 / n2 after ${ms.join(' / ')} ms`);
  for (const x of ms) t.true(x <= 1000, `within 1 s: ${x} ms`);
});
