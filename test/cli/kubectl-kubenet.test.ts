/**
 * `kubectl kubenet` (src/cli/kubectl-plugin.ts, cluster-view.ts, cluster-scrape.ts): the rates,
 * order and tables from two scrapes (pure), then the whole command against the fake API server,
 * whose pod proxy answers with what the agent's own metrics code writes (AgentMetrics), a
 * different scrape each time: every node's pods by throttling, an unreachable agent (503) named on
 * stderr, a node without an agent, the --node and --namespace filters, status NODE, --json, the
 * exit codes; and the bin itself, with a kubeconfig file, and with an exec credential plugin (a real
 * script). No root; traffic only to 127.0.0.1.
 */
import test, { type ExecutionContext } from 'ava';
import yaml from 'js-yaml';
import { chmod, mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { AgentMetrics, type AgentInfo } from '../../src/daemon/http/metrics.js';
import type { BandwidthLimits, LimitSources, PodTraffic } from '../../src/pod/index.js';
import {
  renderClusterTop,
  renderNodeStatus,
  rowsOf,
  snapshotOf,
  sortRows,
  type NodeSnapshot,
  type PodRow,
} from '../../src/cli/cluster-view.js';
import { parseExposition } from '../../src/cli/prom-text.js';
import { HELP, run } from '../../src/cli/kubectl-plugin.js';
import { listAgents, mapBounded } from '../../src/cli/cluster-scrape.js';
import { KubeApi } from '../../src/daemon/kube/watch.js';
import { FakeApiServer, fakeKubeConfig, node, type FakeObject, type ProxyRequest } from '../kit/fake-apiserver.js';
import { kubectlKubenet, type TopJson } from '../kit/kubectl-kubenet.js';
import { podRecord } from '../kit/fake-core.js';

const M = 1_000_000;
type Counters = { bytes: number; drops?: number; overlimits?: number };
interface AgentPodSpec {
  namespace: string;
  name: string;
  ips: string[];
  limits?: BandwidthLimits;
  sources?: LimitSources;
  ingress?: Counters;
  egress?: Counters;
}

/** One scrape of an agent, as its own metrics code writes it: the pods, their counters, read at `readAtS`. */
async function agentText(info: AgentInfo, pods: AgentPodSpec[], readAtS: number): Promise<string> {
  const records = pods.map((p) => ({
    ...podRecord(p.name, p.limits ?? {}, { namespace: p.namespace, ...(p.sources ? { limitSources: p.sources } : {}) }),
    ips: p.ips,
  }));
  const traffic: PodTraffic[] = pods.map((p, i) => {
    const record = records[i] ?? records[0];
    if (!record) throw new Error('no record');
    const dir = (c: Counters | undefined, limit: number | undefined) =>
      c ? { limit: limit ?? 1e9, bytes: c.bytes, packets: 0, drops: c.drops ?? 0, overlimits: c.overlimits ?? 0, backlog: 0 } : undefined;
    const ingress = dir(p.ingress, p.limits?.ingress);
    const egress = dir(p.egress, p.limits?.egress);
    return {
      record,
      ...(ingress || egress
        ? { shaping: { id: record.containerId, hostVeth: 'v', ...(ingress ? { ingress } : {}), ...(egress ? { egress } : {}) } }
        : {}),
    };
  });
  return (await new AgentMetrics(() => info).text(records, 0, traffic, readAtS * 1000)).body;
}

const info = (nodeName: string, podCIDR: string): AgentInfo => ({
  node: nodeName,
  version: '0.2.0',
  podCIDR,
  bridge: 'cbr0',
  ipam: 'host-local',
  routes: 'direct',
});

/** node-a's two scrapes, 2 s apart by the agent's clock. */
const NODE_A = (n: 1 | 2): AgentPodSpec[] => [
  {
    namespace: 'default',
    name: 'web',
    ips: ['10.244.1.5'],
    limits: { egress: 10 * M },
    egress: n === 1 ? { bytes: 0 } : { bytes: 2_500_000, drops: 4, overlimits: 40 },
  },
  { namespace: 'default', name: 'idle', ips: ['10.244.1.6'], limits: { ingress: 5 * M }, ingress: { bytes: 1000 } },
  { namespace: 'kube-system', name: 'dns', ips: ['10.244.1.7', 'fd00::7'] },
];
const NODE_B = (n: 1 | 2): AgentPodSpec[] => [
  {
    namespace: 'team',
    name: 'batch',
    ips: ['10.244.2.5'],
    limits: { egress: 100 * M, egressGuarantee: 60 * M },
    egress: n === 1 ? { bytes: 0 } : { bytes: 12_500_000, drops: 10 },
  },
  // The counter went down: the pod was re-shaped between the scrapes; its new value is the increase.
  {
    namespace: 'team',
    name: 'api',
    ips: ['10.244.2.6'],
    limits: { ingress: 20 * M },
    sources: { ingress: 'namespace-default' },
    ingress: { bytes: n === 1 ? 1_000_000 : 500_000 },
  },
];

async function snapshots(i: AgentInfo, pods: (n: 1 | 2) => AgentPodSpec[]): Promise<[NodeSnapshot, NodeSnapshot]> {
  return [
    snapshotOf(parseExposition(await agentText(i, pods(1), 1000)), 0),
    snapshotOf(parseExposition(await agentText(i, pods(2), 1002)), 99_000),
  ];
}

test("rows: rates between the agent's reads (not between the answers), use of the limit, drops/s, overlimits/s, a reset counter, a guarantee, an unshaped pod", async (t) => {
  const [a1, a2] = await snapshots(info('node-a', '10.244.1.0/24'), NODE_A);
  const rows = rowsOf('node-a', a1, a2);
  t.deepEqual(
    rows.find((r) => r.pod === 'web'),
    {
      node: 'node-a',
      namespace: 'default',
      pod: 'web',
      ips: ['10.244.1.5'],
      direction: 'egress',
      rate: 10 * M,
      limit: 10 * M,
      source: 'pod',
      use: 100,
      dropsPerS: 2,
      overlimitsPerS: 20,
    },
  );
  t.deepEqual(
    rows.find((r) => r.pod === 'dns'),
    { node: 'node-a', namespace: 'kube-system', pod: 'dns', ips: ['10.244.1.7', 'fd00::7'], direction: undefined },
  );
  t.is(rows.find((r) => r.pod === 'idle')?.rate, 0);
  const [b1, b2] = await snapshots(info('node-b', '10.244.2.0/24'), NODE_B);
  const b = rowsOf('node-b', b1, b2);
  t.like(
    b.find((r) => r.pod === 'batch'),
    { rate: 50 * M, limit: 100 * M, use: 50, guarantee: 60 * M, dropsPerS: 5, overlimitsPerS: 0 },
  );
  t.like(
    b.find((r) => r.pod === 'api'),
    { rate: 2 * M, use: 10, source: 'namespace-default' },
  );
  // Without the agent's read time (an older agent): the time between the answers.
  const strip = (s: NodeSnapshot, at: number): NodeSnapshot => ({ pods: s.pods, receivedAtMs: at });
  t.is(rowsOf('node-a', strip(a1, 0), strip(a2, 4000)).find((r) => r.pod === 'web')?.rate, 5 * M);
  // The same read served twice: no rate at all, not a rate of 0.
  t.is(rowsOf('node-a', a1, a1).find((r) => r.pod === 'web')?.rate, undefined);
  // A pod new in the second scrape: no rate yet.
  const fresh = rowsOf('node-a', { pods: new Map(), receivedAtMs: 0, countersReadAtS: 1 }, a2).find((r) => r.pod === 'web');
  t.is(fresh?.rate, undefined);
  t.is(fresh?.limit, 10 * M);
});

test('order: overlimits/s, then drops/s, then use %, highest first; then node, namespace, pod, direction', (t) => {
  const row = (pod: string, o: Partial<PodRow>): PodRow => ({ node: 'n', namespace: 'ns', pod, direction: 'egress', ...o });
  const rows = [
    row('unshaped', { direction: undefined }),
    row('used', { use: 90, dropsPerS: 0, overlimitsPerS: 0 }),
    row('dropping', { use: 10, dropsPerS: 3, overlimitsPerS: 0 }),
    row('b-throttled', { use: 99, dropsPerS: 1, overlimitsPerS: 50 }),
    row('a-throttled', { use: 99, dropsPerS: 1, overlimitsPerS: 50 }),
    row('a-throttled', { use: 99, dropsPerS: 1, overlimitsPerS: 50, direction: 'ingress' }),
    row('idle', { use: 0, dropsPerS: 0, overlimitsPerS: 0 }),
  ];
  t.deepEqual(
    sortRows(rows).map((r) => `${r.pod}/${r.direction ?? '-'}`),
    ['a-throttled/egress', 'a-throttled/ingress', 'b-throttled/egress', 'dropping/egress', 'used/egress', 'idle/egress', 'unshaped/-'],
  );
});

test('the top table: a summary, the columns, a row per pod and direction; GUARANTEE only when a pod has one', async (t) => {
  const [a1, a2] = await snapshots(info('node-a', '10.244.1.0/24'), NODE_A);
  const [b1, b2] = await snapshots(info('node-b', '10.244.2.0/24'), NODE_B);
  const lines = renderClusterTop(sortRows([...rowsOf('node-a', a1, a2), ...rowsOf('node-b', b1, b2)]), {
    nodes: 2,
    unreachable: 1,
    intervalS: 2,
  });
  t.deepEqual(lines, [
    '2 node(s) (1 unreachable), 5 pod(s) (4 shaped), rates over 2 s',
    '',
    'NODE    NAMESPACE    POD    DIRECTION   RATE           LIMIT   USE  DROPS/s  OVERLIMITS/s  GUARANTEE',
    'node-a  default      web    egress     10.0M             10M  100%      2.0            20          -',
    'node-b  team         batch  egress     50.0M            100M   50%      5.0             0        60M',
    'node-b  team         api    ingress     2.0M  20M ns-default   10%        0             0          -',
    'node-a  default      idle   ingress        0              5M    0%        0             0          -',
    'node-a  kube-system  dns    -              -               -     -        -             -          -',
  ]);
  t.notRegex(
    renderClusterTop(sortRows(rowsOf('node-a', a1, a2)), { nodes: 1, unreachable: 0, intervalS: 2 }).join('\n'),
    /GUARANTEE|unreachable/,
  );
  t.deepEqual(renderClusterTop([], { nodes: 1, unreachable: 0, intervalS: 2 }).slice(2), ['(no pods)']);
});

test('the status view: the node as its agent describes it, each pod with its addresses, limits (a guarantee first) and rates', async (t) => {
  const [b1, b2] = await snapshots(info('node-b', '10.244.2.0/24,fd00:2::/64'), NODE_B);
  const lines = renderNodeStatus('node-b', 'kube-system/kubenet-b', b2, rowsOf('node-b', b1, b2), 2);
  t.deepEqual(lines.slice(0, 7), [
    'node:     node-b',
    'agent:    kube-system/kubenet-b (kubenet-ts 0.2.0)',
    'pod CIDR: 10.244.2.0/24,fd00:2::/64',
    'bridge:   cbr0',
    'ipam:     host-local',
    'routes:   direct',
    'pods:     2 (2 shaped)',
  ]);
  t.regex(lines[7] ?? '', /^ {2}POD +IPS +INGRESS +IN RATE +IN DROP\/s +EGRESS +OUT RATE +OUT DROP\/s$/);
  t.regex(lines[8] ?? '', /^ {2}team\/api +10\.244\.2\.6 +20M ns-default +2\.0M +0 +- +- +-$/);
  t.regex(lines[9] ?? '', /^ {2}team\/batch +10\.244\.2\.5 +- +- +- +60M\.\.100M +50\.0M +5\.0$/);
  const old = renderNodeStatus('node-b', 'kube-system/kubenet-b', { ...b2, info: undefined } as NodeSnapshot, [], 2);
  t.regex(old.join('\n'), /publishes no kubenet_info/);
});

// ---- the whole command against the fake API server ----

function agentPod(
  name: string,
  nodeName: string,
  o: { port?: number; namespace?: string; labels?: Record<string, string> } = {},
): FakeObject {
  return {
    apiVersion: 'v1',
    kind: 'Pod',
    metadata: { namespace: o.namespace ?? 'kube-system', name, labels: o.labels ?? { 'app.kubernetes.io/name': 'kubenet' } },
    spec: {
      nodeName,
      hostNetwork: true,
      containers: [
        {
          name: 'kubenet',
          image: 'kubenet-ts:0.2.0',
          ...(o.port !== undefined ? { ports: [{ name: 'metrics', containerPort: o.port, protocol: 'TCP' }] } : {}),
        },
      ],
    },
    status: { phase: 'Running' },
  };
}

interface Cluster {
  api: FakeApiServer;
  proxied: ProxyRequest[];
}

/** node-a and node-b answer (each scrape a newer read), node-c's agent does not (503), node-d has none. */
async function cluster(t: ExecutionContext): Promise<Cluster> {
  const api = await FakeApiServer.start();
  t.teardown(() => api.stop());
  for (const n of ['node-a', 'node-b', 'node-c', 'node-d']) api.setNode(node(n));
  api.setPod(agentPod('kubenet-a', 'node-a', { port: 10266 }));
  api.setPod(agentPod('kubenet-b', 'node-b', { port: 9100 }));
  api.setPod(agentPod('kubenet-c', 'node-c'));
  // Neither is an agent: another label, another namespace.
  api.setPod(agentPod('coredns-1', 'node-a', { labels: { 'k8s-app': 'kube-dns' } }));
  api.setPod(agentPod('kubenet-elsewhere', 'node-d', { namespace: 'default' }));
  const proxied: ProxyRequest[] = [];
  const scrapes = new Map<string, number>();
  api.proxy = async (req) => {
    proxied.push(req);
    if (req.path !== '/metrics') return { status: 404, body: 'not found\n' };
    const n = (scrapes.get(req.pod) ?? 0) + 1;
    scrapes.set(req.pod, n);
    const which = (n === 1 ? 1 : 2) as 1 | 2;
    if (req.pod === 'kubenet-a')
      return { status: 200, body: await agentText(info('node-a', '10.244.1.0/24'), NODE_A(which), 1000 + 2 * (n - 1)) };
    if (req.pod === 'kubenet-b')
      return { status: 200, body: await agentText(info('node-b', '10.244.2.0/24'), NODE_B(which), 1000 + 2 * (n - 1)) };
    return undefined; // kubenet-c: nothing listens (the API server answers 503)
  };
  return { api, proxied };
}

async function kubenet(c: Cluster, args: string[]): Promise<{ code: number; out: string; err: string }> {
  let out = '';
  let err = '';
  const code = await run(args, { out: (s) => (out += s), err: (s) => (err += s), kubeConfig: fakeKubeConfig(c.api) });
  return { code, out, err };
}

test("top: every reachable node's pods, throttled first, through the pod proxy at the port named metrics; the unreachable agent and the node without one on stderr; exit 0", async (t) => {
  const c = await cluster(t);
  const r = await kubenet(c, ['top', '--interval', '0.05']);
  t.is(r.code, 0, r.err);
  const lines = r.out.trimEnd().split('\n');
  t.is(lines[0], '2 node(s) (1 unreachable), 5 pod(s) (4 shaped), rates over 0.05 s');
  t.deepEqual(
    lines.slice(3).map((l) => l.split(/ +/).slice(0, 4).join(' ')),
    [
      'node-a default web egress',
      'node-b team batch egress',
      'node-b team api ingress',
      'node-a default idle ingress',
      'node-a kube-system dns -',
    ],
  );
  t.regex(
    lines[3] ?? '',
    /^node-a +default +web +egress +10\.0M +10M +100% +2\.0 +20 +-$/,
    "rates over the agent's 2 s between reads, not the 0.05 s between scrapes",
  );
  t.deepEqual(r.err.trimEnd().split('\n'), [
    'node-d: no kubenet agent pod on this node',
    'node-c: kubenet agent kube-system/kubenet-c unreachable: 503: error trying to reach service: dial tcp 10.0.0.1:10266: connect: connection refused',
  ]);
  t.deepEqual(
    [...new Set(c.proxied.map((p) => `${p.namespace}/${p.pod}:${p.port}${p.path}`))].sort(),
    ['kube-system/kubenet-a:10266/metrics', 'kube-system/kubenet-b:9100/metrics', 'kube-system/kubenet-c:10266/metrics'],
    'the declared metrics port, else 10266',
  );
  t.is(c.proxied.filter((p) => p.pod === 'kubenet-c').length, 1, 'an agent that failed the first scrape is not scraped again');
  const list = c.api.requests.find((q) => q.path === '/api/v1/namespaces/kube-system/pods');
  t.is(list?.query.get('labelSelector'), 'app.kubernetes.io/name=kubenet');
});

test("top --node and --namespace: one node's agent only; one namespace's pods only", async (t) => {
  const c = await cluster(t);
  const b = await kubenet(c, ['top', '--node', 'node-b', '--interval', '0.05']);
  t.is(b.code, 0, b.err);
  t.is(b.err, '', 'the other nodes are not looked at');
  t.deepEqual(
    b.out
      .trimEnd()
      .split('\n')
      .slice(3)
      .map((l) => l.split(/ +/)[2]),
    ['batch', 'api'],
  );
  t.deepEqual([...new Set(c.proxied.map((p) => p.pod))], ['kubenet-b']);
  t.is(c.api.requests.find((q) => q.path === '/api/v1/namespaces/kube-system/pods')?.query.get('fieldSelector'), 'spec.nodeName=node-b');

  const ns = await kubenet(c, ['top', '-n', 'default', '--interval', '0.05']);
  t.is(ns.code, 0);
  t.deepEqual(
    ns.out
      .trimEnd()
      .split('\n')
      .slice(3)
      .map((l) => l.split(/ +/).slice(0, 3).join(' ')),
    ['node-a default web', 'node-a default idle'],
  );
  t.regex(ns.out, /^2 node\(s\) \(1 unreachable\), 2 pod\(s\) \(2 shaped\)/);
});

test('top: exit 1 when no agent can be read (unreachable, or none at all), each named', async (t) => {
  const c = await cluster(t);
  const down = await kubenet(c, ['top', '--node', 'node-c', '--interval', '0.05']);
  t.is(down.code, 1);
  t.regex(down.err, /^node-c: kubenet agent kube-system\/kubenet-c unreachable: 503: /);
  t.is(down.out, '', 'no empty table');
  const none = await kubenet(c, ['top', '--node', 'node-d']);
  t.is(none.code, 1);
  t.is(none.err, 'kubectl kubenet: no kubenet agent pod on node node-d (namespace kube-system, selector app.kubernetes.io/name=kubenet)\n');
  const other = await kubenet(c, ['top', '--agent-namespace', 'default', '-l', 'app.kubernetes.io/name=kubenet', '--interval', '0.05']);
  t.is(other.code, 1, 'the agent found elsewhere does not answer either');
  t.regex(other.err, /node-d: kubenet agent default\/kubenet-elsewhere unreachable: 503/);
  c.api.failWith = (q) => (q.path.endsWith('/pods') ? 403 : undefined);
  const forbidden = await kubenet(c, ['top']);
  t.is(forbidden.code, 1);
  t.regex(forbidden.err, /^kubectl kubenet: GET \/api\/v1\/namespaces\/kube-system\/pods: 403 Forbidden/);
});

test('top --json: the nodes read, those unreachable, the rows in order', async (t) => {
  const c = await cluster(t);
  const r = await kubenet(c, ['top', '--json', '--interval', '0.05']);
  t.is(r.code, 0);
  const j = JSON.parse(r.out) as TopJson;
  t.deepEqual(j.nodes, [
    { node: 'node-a', agent: 'kube-system/kubenet-a', version: '0.2.0', windowS: 2 },
    { node: 'node-b', agent: 'kube-system/kubenet-b', version: '0.2.0', windowS: 2 },
  ]);
  t.deepEqual(
    j.unreachable.map((u) => u.node),
    ['node-c'],
  );
  t.deepEqual(
    j.pods.map((p) => `${p.node} ${p.namespace}/${p.pod} ${p.direction ?? '-'}`),
    [
      'node-a default/web egress',
      'node-b team/batch egress',
      'node-b team/api ingress',
      'node-a default/idle ingress',
      'node-a kube-system/dns -',
    ],
  );
  t.like(j.pods[1], { rate: 50 * M, limit: 100 * M, use: 50, guarantee: 60 * M, ips: ['10.244.2.5'] });
});

test('an agent that serves the same read twice (its metricsMaxAge longer than --interval) is scraped again', async (t) => {
  const c = await cluster(t);
  let n = 0;
  c.api.proxy = async () => {
    n++;
    // Reads 1, 1 (the same, served again), then 3.
    const readAt = n <= 2 ? 1000 : 1004;
    return { status: 200, body: await agentText(info('node-a', '10.244.1.0/24'), NODE_A(n <= 2 ? 1 : 2), readAt) };
  };
  const r = await kubenet(c, ['top', '--node', 'node-a', '--json', '--interval', '0.05']);
  t.is(r.code, 0, r.err);
  t.is(n, 3);
  const j = JSON.parse(r.out) as TopJson;
  t.is(j.nodes[0]?.windowS, 4);
  t.is(j.pods.find((p) => p.pod === 'web')?.rate, 5 * M);
});

test('status NODE: the node, its agent, pod CIDR, bridge and pods; --json; an unreachable node exits 1', async (t) => {
  const c = await cluster(t);
  const a = await kubenet(c, ['status', 'node-a', '--interval', '0.05']);
  t.is(a.code, 0, a.err);
  const lines = a.out.trimEnd().split('\n');
  t.deepEqual(lines.slice(0, 3), ['node:     node-a', 'agent:    kube-system/kubenet-a (kubenet-ts 0.2.0)', 'pod CIDR: 10.244.1.0/24']);
  t.true(lines.includes('pods:     3 (2 shaped)'));
  t.regex(a.out, /\n {2}kube-system\/dns +10\.244\.1\.7,fd00::7 +- +- +- +- +- +-\n/);
  t.regex(a.out, /\n {2}default\/web +10\.244\.1\.5 +- +- +- +10M +10\.0M +2\.0\n/);
  const j = JSON.parse((await kubenet(c, ['status', 'node-a', '--json', '--interval', '0.05'])).out) as {
    node: string;
    info: { podCIDR: string };
    pods: PodRow[];
  };
  t.is(j.info.podCIDR, '10.244.1.0/24');
  t.is(j.pods.length, 3);
  const down = await kubenet(c, ['status', 'node-c', '--interval', '0.05']);
  t.is(down.code, 1);
  t.regex(down.err, /node-c: kubenet agent kube-system\/kubenet-c unreachable: 503/);
  t.is(down.out, '');
});

test('usage: help exits 0, no command and bad arguments exit 2 with the help', async (t) => {
  const c = await cluster(t);
  t.deepEqual(await kubenet(c, ['--help']), { code: 0, out: `${HELP}\n`, err: '' });
  t.is((await kubenet(c, ['help'])).code, 0);
  t.is((await kubenet(c, [])).code, 2);
  for (const [args, message] of [
    [['status'], /status wants a NODE/],
    [['status', 'a', 'b'], /unexpected argument "b"/],
    [['top', 'x'], /unexpected argument "x"/],
    [['top', '--interval', '0'], /--interval wants a positive number, got "0"/],
    [['top', '--parallel', '1.5'], /--parallel wants a positive integer/],
    [['top', '--bogus'], /Unknown option '--bogus'/],
    [['status', 'node-a', '--node', 'node-b'], /options of top/],
    [['shape'], /unknown command "shape"/],
  ] as Array<[string[], RegExp]>) {
    const r = await kubenet(c, args);
    t.is(r.code, 2, args.join(' '));
    t.regex(r.err, message, args.join(' '));
    t.true(r.err.includes('usage:'), args.join(' '));
  }
  t.is(c.api.requests.length, 0, 'nothing asked of the API server');
});

test('the bin: a kubeconfig file (--kubeconfig, --context), the table on stdout, the unreachable on stderr, the exit code', async (t) => {
  const c = await cluster(t);
  const dir = await mkdtemp(join(tmpdir(), 'kubectl-kubenet-'));
  t.teardown(() => rm(dir, { recursive: true, force: true }));
  const kubeconfig = join(dir, 'config');
  const doc = {
    clusters: [
      { name: 'fake', cluster: { server: c.api.url, 'insecure-skip-tls-verify': true } },
      { name: 'gone', cluster: { server: 'http://127.0.0.1:1', 'insecure-skip-tls-verify': true } },
    ],
    users: [{ name: 'me', user: { token: 'tok' } }],
    contexts: [
      { name: 'fake', context: { cluster: 'fake', user: 'me' } },
      { name: 'gone', context: { cluster: 'gone', user: 'me' } },
    ],
    'current-context': 'gone',
  };
  await writeFile(kubeconfig, yaml.dump(doc));
  const r = await kubectlKubenet(kubeconfig, ['top', '--context', 'fake', '--interval', '0.05']);
  t.is(r.exitCode, 0, r.stderr);
  t.regex(r.stdout, /^2 node\(s\) \(1 unreachable\)/);
  t.regex(r.stdout, /\nnode-a +default +web +egress +10\.0M/);
  t.regex(r.stderr, /node-c: kubenet agent kube-system\/kubenet-c unreachable/);
  t.is(c.api.requests.find((q) => q.path.endsWith('/proxy/metrics'))?.authorization, 'Bearer tok');
  const gone = await kubectlKubenet(kubeconfig, ['top', '--interval', '0.05']);
  t.is(gone.exitCode, 1, "the current context's API server refuses");
  t.regex(gone.stderr, /^kubectl kubenet: .*ECONNREFUSED/);
  const help = await kubectlKubenet(kubeconfig, ['--help']);
  t.is(help.exitCode, 0);
  t.regex(help.stdout, /kubectl kubenet top/);
});

test('an exec credential plugin (EKS/GKE/kubelogin style): its token on every request, one run for the whole command; its failure exits 1 naming the command and the installHint', async (t) => {
  const c = await cluster(t);
  const dir = await mkdtemp(join(tmpdir(), 'kubectl-kubenet-exec-'));
  t.teardown(() => rm(dir, { recursive: true, force: true }));
  // A real plugin: counts its runs, prints an ExecCredential with a token valid for an hour, or fails.
  const plugin = join(dir, 'fake-get-token');
  await writeFile(
    plugin,
    [
      '#!/bin/sh',
      'info="$KUBERNETES_EXEC_INFO"',
      `echo run >> ${JSON.stringify(join(dir, 'runs'))}`,
      'if [ "$FAIL" = yes ]; then echo "error: session expired, log in again" >&2; exit 2; fi',
      'case "$info" in *\'"interactive":false\'*) ;; *) echo "unexpected KUBERNETES_EXEC_INFO: $info" >&2; exit 9 ;; esac',
      `printf '{"apiVersion":"client.authentication.k8s.io/v1","kind":"ExecCredential","status":{"token":"exec-%s","expirationTimestamp":"%s"}}' "$1" "$(date -u -d '+1 hour' +%Y-%m-%dT%H:%M:%SZ)"`,
      '',
    ].join('\n'),
  );
  await chmod(plugin, 0o755);
  const kubeconfig = async (fail: boolean) => {
    const path = join(dir, fail ? 'failing' : 'config');
    const user = {
      exec: {
        apiVersion: 'client.authentication.k8s.io/v1',
        command: './fake-get-token',
        args: ['abc'],
        env: fail ? [{ name: 'FAIL', value: 'yes' }] : [],
        interactiveMode: 'IfAvailable',
        installHint: 'fake-get-token is part of the test kit',
      },
    };
    await writeFile(
      path,
      yaml.dump({
        clusters: [{ name: 'fake', cluster: { server: c.api.url, 'insecure-skip-tls-verify': true } }],
        users: [{ name: 'me', user }],
        contexts: [{ name: 'fake', context: { cluster: 'fake', user: 'me' } }],
        'current-context': 'fake',
      }),
    );
    return path;
  };
  let err = '';
  const code = await run(['top', '--interval', '0.05', '--kubeconfig', await kubeconfig(false)], {
    out: () => undefined,
    err: (s) => void (err += s),
    stdinIsTerminal: false,
  });
  t.is(code, 0, err);
  t.true(c.api.requests.length >= 5, `${c.api.requests.length} requests`);
  t.deepEqual([...new Set(c.api.requests.map((q) => q.authorization))], ['Bearer exec-abc']);
  t.is((await readFile(join(dir, 'runs'), 'utf8')).split('\n').filter(Boolean).length, 1, 'one run for every request');

  const failed = await kubectlKubenet(await kubeconfig(true), ['top', '--interval', '0.05']);
  t.is(failed.exitCode, 1);
  t.regex(
    failed.stderr,
    /^kubectl kubenet: kubeconfig .*failing: user "me": exec plugin .*fake-get-token failed with exit code 2: error: session expired, log in again\nfake-get-token is part of the test kit$/m,
  );
  t.regex(failed.stderr, /^error: session expired, log in again$/m, "the plugin's own stderr, as it came");
});

test("scrapes run in parallel, at most --parallel at a time, and keep the agents' order", async (t) => {
  t.deepEqual(await mapBounded([5, 1, 3], 2, async (x, i) => `${i}:${x}`), ['0:5', '1:1', '2:3']);
  t.deepEqual(await mapBounded([], 4, async (x) => x), []);
  const c = await cluster(t);
  for (const n of ['node-e', 'node-f', 'node-g']) {
    c.api.setNode(node(n));
    c.api.setPod(agentPod(`kubenet-${n.slice(-1)}`, n));
  }
  let inFlight = 0;
  let most = 0;
  c.api.proxy = async (req) => {
    inFlight++;
    most = Math.max(most, inFlight);
    await new Promise((r) => setTimeout(r, 30));
    inFlight--;
    return { status: 200, body: await agentText(info(req.pod, ''), [], 1000 + c.proxied.push(req)) };
  };
  const serial = await kubenet(c, ['top', '--parallel', '1', '--interval', '0.01', '--json']);
  t.is(serial.code, 0, serial.err);
  t.is(most, 1);
  t.deepEqual(
    (JSON.parse(serial.out) as TopJson).nodes.map((n) => n.node),
    ['node-a', 'node-b', 'node-c', 'node-e', 'node-f', 'node-g'],
  );
  most = 0;
  t.is((await kubenet(c, ['top', '--parallel', '4', '--interval', '0.01'])).code, 0);
  t.is(most, 4, 'six agents, four at a time');
});

test('one agent per node: of several (a rollout), the running one not being deleted', async (t) => {
  const c = await cluster(t);
  const old = agentPod('kubenet-old', 'node-a');
  old.metadata.deletionTimestamp = '2026-01-01T00:00:00Z';
  c.api.setPod(old);
  c.api.setPod({ ...agentPod('kubenet-pending', 'node-a'), status: { phase: 'Pending' } });
  const agents = await listAgents(new KubeApi(fakeKubeConfig(c.api)), {
    namespace: 'kube-system',
    selector: 'app.kubernetes.io/name=kubenet',
  });
  t.deepEqual(
    agents.map((a) => `${a.node} ${a.name}:${a.port}`),
    ['node-a kubenet-a:10266', 'node-b kubenet-b:9100', 'node-c kubenet-c:10266'],
  );
  c.api.deletePod('kube-system', 'kubenet-a');
  const next = await listAgents(new KubeApi(fakeKubeConfig(c.api)), {
    namespace: 'kube-system',
    selector: 'app.kubernetes.io/name=kubenet',
    node: 'node-a',
  });
  t.deepEqual(
    next.map((a) => a.name),
    ['kubenet-old'],
    'running but being deleted, before one not running',
  );
});

test("the plugin loads nothing of the node's side: no netlink (koffi, libnl), no CNI, no pod core; only js-yaml of the packages", async (t) => {
  const root = fileURLToPath(new URL('../../src/', import.meta.url));
  const seen = new Set<string>();
  const packages = new Set<string>();
  const visit = async (file: string): Promise<void> => {
    if (seen.has(file)) return;
    seen.add(file);
    const text = await readFile(file, 'utf8');
    // Imports that load a module at run time (`import type` / `export type` are erased).
    for (const m of text.matchAll(/^\s*(?:import|export)\s+(?!type\s)(?:[^;]*?\sfrom\s+)?'([^']+)'/gm)) {
      const spec = m[1] ?? '';
      if (spec.startsWith('.')) await visit(join(dirname(file), spec.replace(/\.js$/, '.ts')));
      else if (!spec.startsWith('node:')) packages.add(spec);
    }
  };
  await visit(join(root, 'cli/kubectl-kubenet.ts'));
  const modules = [...seen].map((f) => f.slice(root.length)).sort();
  t.true(modules.includes('cli/prom-text.ts') && modules.includes('daemon/kube/watch.ts'), modules.join(' '));
  t.deepEqual(
    modules.filter((m) => /^(netlink|shaper|pod|cni|plugin)\/|^daemon\/(config\/|agent|http\/|protocol)/.test(m)),
    [],
  );
  t.deepEqual([...packages], ['js-yaml']);
});
