/**
 * Routes between nodes at scale (src/daemon/cluster/routes.ts): one agent against the real API
 * server of a local cluster (hack/cluster.sh up, one node) holding `--nodes` simulated Node objects
 * (default 1 000; no real node behind them: each has a pod CIDR out of the cluster CIDR
 * 10.128.0.0/9 and an InternalIP in one of `--subnets` /20s of 198.19.0.0/16, node k in subnet
 * k % subnets). Subnet 0 (198.19.0.0/20) is added to the node's uplink on the test LAN: its Nodes
 * are routed directly; the others' are on no connected subnet, so with `--subnets` > 1 the agent
 * runs `routes: auto` and reaches them through VXLAN (a route, a neighbour and an FDB entry each).
 * The agent is the compiled package (dist/, as the image runs it) with the manifest ConfigMap's
 * config (its `routes`, or `auto` with several subnets), in node 1's namespaces, with the admin
 * kubeconfig. Prints:
 * - converge: from the agent's first log line (and from its spawn) until the kernel holds a route
 *   for every simulated Node, and a neighbour and an FDB entry for every tunnelled one (ip -ts
 *   monitor route neigh in the node's netns: FDB entries show there too);
 * - one change: `--changes` times (default 100), one Node's InternalIP patched (status subresource,
 *   straight over HTTPS) and the time until the kernel had it: a direct Node's route moved, a
 *   tunnelled Node's neighbour and FDB entry at its new VTEP MAC (derived from the address); p50/p99
 *   per way;
 * - the agent's CPU per change and its RSS with all the Nodes.
 * Goals (issues 21, 43): converge ≤ 2 s, one change ≤ 50 ms p99, RSS ≤ 120 MB. No reference: no
 * plugin of the reference set routes between nodes. Root only; takes the cluster down at the end,
 * also on failure.
 *
 * Usage: npx tsx bench/routes.ts [--nodes 1000] [--changes 100] [--subnets 10]
 */
import { execa, type ResultPromise } from 'execa';
import { readFile, writeFile } from 'node:fs/promises';
import yaml from 'js-yaml';
import { request } from 'node:https';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { BenchArgs, percentile, processUsage } from '../test/kit/bench-kit.js';
import { uniq } from '../test/kit/kernel.js';
import { kclNodeHolder } from '../test/kit/kcl.js';
import { CLUSTER_LOCK, holdLock, TRAFFIC_LOCK } from '../test/kit/traffic-lock.js';
import { upstreamDir } from '../test/kit/upstream.js';
import { VXLAN_ANNOTATION, vtepMac } from '../src/daemon/cluster/route-plan.js';
import { DEFAULT_VXLAN_NAMES } from '../src/daemon/cluster/vxlan.js';

const ROOT = fileURLToPath(new URL('../', import.meta.url));
const args = BenchArgs.parse('usage: npx tsx bench/routes.ts [--nodes 1000] [--changes 100] [--subnets 10]', [
  'nodes',
  'changes',
  'subnets',
]);
const NODES = args.num('nodes', 1000);
const CHANGES = args.num('changes', 100);
const SUBNETS = args.num('subnets', 1);
if (!Number.isInteger(SUBNETS) || SUBNETS < 1 || SUBNETS > 15) throw new Error('--subnets: 1 to 15');
if (Math.ceil(NODES / SUBNETS) > 2000) throw new Error('--nodes: at most 2 000 per subnet');
const VX = DEFAULT_VXLAN_NAMES[4];
const DIR = `/tmp/kcl-routes-${uniq(6)}`;
const ENV = { KCL_DIR: DIR, KCL_API_PORT: String(20000 + (process.pid % 10000)), KCL_CLUSTER_CIDR: '10.128.0.0/9' };
const KUBECTL = join(upstreamDir('kubernetes'), 'kubectl');
const kubectl = (args: string[], input?: string) =>
  execa(KUBECTL, ['--kubeconfig', join(DIR, 'kubeconfig'), ...args], input !== undefined ? { input, maxBuffer: 1e9 } : {});
const now = () => performance.timeOrigin + performance.now();

/**
 * Simulated Node k: pod CIDR 10.(130 + k / 256).(k % 256).0/24; InternalIP the (16 + k / subnets)th
 * address of subnet k % subnets, 198.19.(16 * (k % subnets)).0/20 (the alternate: 2 048 further).
 */
const gw = (k: number, alt = false) => {
  const n = 16 + Math.floor(k / SUBNETS) + (alt ? 2048 : 0);
  return `198.19.${16 * (k % SUBNETS) + (n >> 8)}.${n & 255}`;
};
const cidr = (k: number) => `10.${130 + (k >> 8)}.${k & 255}.0/24`;
const tunnelled = (k: number) => k % SUBNETS !== 0;
const simNode = (k: number) => ({
  apiVersion: 'v1',
  kind: 'Node',
  metadata: { name: `sim-${k}`, labels: { 'kubenet-bench': 'sim' } },
  spec: { podCIDR: cidr(k), podCIDRs: [cidr(k)], unschedulable: true },
  status: { addresses: [{ type: 'InternalIP', address: gw(k) }] },
});

/** PATCHes a Node's status over HTTPS with the cluster's admin credentials. */
async function patchAddress(k: number, ip: string, creds: { ca: Buffer; cert: Buffer; key: Buffer }, port: string): Promise<void> {
  const body = JSON.stringify({ status: { addresses: [{ type: 'InternalIP', address: ip }] } });
  await new Promise<void>((resolve, reject) => {
    const req = request(
      {
        host: '127.0.0.1',
        port,
        method: 'PATCH',
        path: `/api/v1/nodes/sim-${k}/status`,
        headers: { 'Content-Type': 'application/merge-patch+json', 'Content-Length': Buffer.byteLength(body) },
        ...creds,
      },
      (res) => {
        res.resume();
        res.on('end', () => (res.statusCode === 200 ? resolve() : reject(new Error(`PATCH sim-${k}: ${res.statusCode}`))));
      },
    );
    req.on('error', reject);
    req.end(body);
  });
}

/** `ip -ts monitor route neigh` in node 1's netns (FDB entries too): each line with its wall-clock time (ms). */
function monitor(): { lines: Array<{ at: number; text: string }>; proc: ResultPromise } {
  const lines: Array<{ at: number; text: string }> = [];
  const proc = execa('ip', ['-n', 'kcl-n1', '-ts', 'monitor', 'route', 'neigh'], { reject: false, buffer: false, env: { TZ: 'UTC' } });
  let buf = '';
  proc.stdout?.on('data', (d: Buffer) => {
    buf += d.toString();
    for (let nl = buf.indexOf('\n'); nl >= 0; nl = buf.indexOf('\n')) {
      const line = buf.slice(0, nl);
      buf = buf.slice(nl + 1);
      const m = /^\[(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d+)\]\s*(.*)$/.exec(line);
      // "2026-11-26T13:50:00.123456" (UTC: TZ is set below): whole seconds plus the fraction.
      const [secs, frac = '0'] = (m?.[1] ?? '').split('.');
      if (m) lines.push({ at: Date.parse(`${secs}Z`) + Number(`0.${frac}`) * 1000, text: m[2] ?? '' });
    }
  });
  return { lines, proc };
}

/**
 * What a monitor line adds, as the bench matches it: `route CIDR` (or `route CIDR via GW` with
 * `withGateway`), `neigh IP MAC` (a permanent neighbour on the VXLAN device, protocol 98) or `fdb
 * DST MAC` (an FDB entry of the device, which ip monitor neigh shows as `DST dev VX lladdr MAC NOARP
 * PERMANENT`); undefined for anything else, deletions included.
 */
function entryOf(text: string, withGateway = false): string | undefined {
  const route = /^(\d+\.\d+\.\d+\.\d+\/24) via (\S+) .*proto 98/.exec(text);
  if (route) return withGateway ? `route ${route[1]} via ${route[2]}` : `route ${route[1]}`;
  const neigh = new RegExp(`^(\\S+) dev ${VX} lladdr (\\S+) (NOARP )?PERMANENT`).exec(text);
  if (neigh) return `${neigh[3] ? 'fdb' : 'neigh'} ${neigh[1]} ${neigh[2]}`;
  return undefined;
}

const t0 = Date.now();
// One local cluster at a time on the machine (its namespaces are kcl-*), and no measurement beside this one.
const releaseCluster = await holdLock(CLUSTER_LOCK, {
  waitMs: 45 * 60_000,
  onWait: () => console.log('waiting for another local cluster to go down'),
});
const releaseTraffic = await holdLock(TRAFFIC_LOCK, { onWait: () => console.log('waiting for the traffic lock') });
let stopAgent = async () => undefined as unknown;
try {
  const up = await execa('bash', [join(ROOT, 'hack/cluster.sh'), 'up'], { env: ENV, all: true, reject: false });
  if (up.exitCode !== 0) throw new Error(`cluster up failed:\n${up.all ?? ''}`);
  await execa('ip', ['-n', 'kcl-n1', 'addr', 'add', '198.19.0.1/20', 'dev', 'kcl1u']);
  console.log(
    `kubenet-ts routes bench: ${NODES} simulated Nodes in ${SUBNETS} subnet(s), ${CHANGES} changes; Kubernetes ${(await kubectl(['version', '-o', 'json'])).stdout.match(/"gitVersion": "([^"]+)"/)?.[1]}`,
  );
  const tc = Date.now();
  for (let b = 0; b < NODES; b += 250) {
    const items = Array.from({ length: Math.min(250, NODES - b) }, (_, j) => simNode(b + j));
    await kubectl(['create', '-f', '-'], JSON.stringify({ apiVersion: 'v1', kind: 'List', items }));
  }
  console.log(`${NODES} Nodes created in ${Date.now() - tc} ms`);
  // Let the controller-manager finish with the new Nodes first: it marks a Node that never
  // reported NotReady and taints it 50 s after it appeared (node-monitor-grace-period), a storm of
  // 1 000 Node updates through the API server and etcd that would be measured instead of the agent.
  const settle = Math.max(0, 65_000 - (Date.now() - tc));
  await new Promise((r) => setTimeout(r, settle));

  // The manifest's ConfigMap config, as the DaemonSet gives it, to the compiled agent (dist/, what
  // the image runs) in node 1's namespaces. Not the DaemonSet itself: it would also place a pod on
  // each of the 1 000 simulated Nodes, which no kubelet ever runs.
  await execa('npx', ['tsc', '-p', 'tsconfig.build.json'], { cwd: ROOT });
  const docs = yaml.loadAll(await readFile(join(ROOT, 'manifests/kubenet.yaml'), 'utf8')) as Array<{
    kind?: string;
    data?: Record<string, string>;
  } | null>;
  const configFile = join(DIR, 'agent-config.yaml');
  const config = yaml.load(docs.find((d) => d?.kind === 'ConfigMap')?.data?.['config.yaml'] ?? '') as Record<string, unknown>;
  // Nodes on no connected subnet: only `auto` reaches them (`direct` gives each a Warning).
  if (SUBNETS > 1) config.routes = 'auto';
  console.log(`agent config: the manifest's, routes: ${String(config.routes)}`);
  await writeFile(configFile, yaml.dump(config));
  const mon = monitor();
  await new Promise((r) => setTimeout(r, 300));
  const spawned = now();
  const agent = execa(
    'nsenter',
    [
      '-t',
      kclNodeHolder(DIR),
      '-m',
      '-n',
      `--wdns=${ROOT}`,
      process.execPath,
      join(ROOT, 'dist/src/cli/main.js'),
      'daemon',
      '--config',
      configFile,
      '--kubeconfig',
      join(DIR, 'admin.kubeconfig'),
    ],
    { env: { NODE_NAME: 'kcl-n1' }, reject: false, buffer: false, all: true },
  );
  stopAgent = async () => {
    agent.kill('SIGTERM');
    await agent;
  };
  const log: string[] = [];
  agent.all?.on('data', (d: Buffer) => log.push(...d.toString().split('\n').filter(Boolean)));
  // Converged: a route for every Node; for every tunnelled one, its neighbour (the pod CIDR's
  // network address -> its VTEP MAC) and its FDB entry (the MAC -> its InternalIP).
  const want = new Set<string>();
  for (let k = 0; k < NODES; k++) {
    want.add(`route ${cidr(k)}`);
    if (tunnelled(k)) want.add(`neigh ${cidr(k).split('/')[0]} ${vtepMac(gw(k))}`).add(`fdb ${gw(k)} ${vtepMac(gw(k))}`);
  }
  const seen = new Set<string>();
  let convergedAt = 0;
  let read = 0;
  for (const end = Date.now() + 60_000; Date.now() < end && !convergedAt; await new Promise((r) => setTimeout(r, 50))) {
    for (; read < mon.lines.length; read++) {
      const l = mon.lines[read] as { at: number; text: string };
      const key = entryOf(l.text);
      if (key && want.has(key) && !seen.has(key)) {
        seen.add(key);
        if (seen.size === want.size) convergedAt = l.at;
      }
    }
  }
  if (!convergedAt) throw new Error(`not converged after 60 s: ${seen.size}/${want.size} entries\n${log.slice(-20).join('\n')}`);
  const firstLog = Number((JSON.parse(log.find((l) => l.startsWith('{')) ?? '{}') as { time?: number }).time ?? NaN);
  const routesStart = Number((JSON.parse(log.find((l) => l.includes('routing the pod CIDRs')) ?? '{}') as { time?: number }).time ?? NaN);
  if (config.routes === 'auto') {
    // The real API server's answer to the status PATCH that carries it (the fake of the tests is not proof).
    const published = await kubectl(['get', 'node', 'kcl-n1', '-o', `jsonpath={.metadata.annotations.kubenet\\.io/vxlan}`]);
    console.log(`kcl-n1's ${VXLAN_ANNOTATION} as the API server holds it: ${published.stdout || '(none)'}`);
  }
  // nsenter (without -p) execs the agent: same pid.
  const pid = String(agent.pid);
  await new Promise((r) => setTimeout(r, 2000));
  const settled = await processUsage(pid);

  const [ca, cert, key] = await Promise.all(['ca.crt', 'admin.crt', 'admin.key'].map((f) => readFile(join(DIR, 'pki', f))));
  const creds = { ca: ca as Buffer, cert: cert as Buffer, key: key as Buffer };
  const lat: { direct: number[]; tunnel: number[] } = { direct: [], tunnel: [] };
  const before = await processUsage(pid);
  for (let i = 0; i < CHANGES; i++) {
    const k = (i * 7919) % NODES;
    const target = gw(k, true);
    // A direct Node's route moves to the new address; a tunnelled one's route stays (via its pod
    // CIDR's network address) while its neighbour and FDB entry move to the new VTEP MAC.
    const needs = tunnelled(k)
      ? [`neigh ${cidr(k).split('/')[0]} ${vtepMac(target)}`, `fdb ${target} ${vtepMac(target)}`]
      : [`route ${cidr(k)} via ${target}`];
    const from = mon.lines.length;
    const sent = now();
    await patchAddress(k, target, creds, ENV.KCL_API_PORT);
    let at = 0;
    for (const end = Date.now() + 5000; Date.now() < end && !at; await new Promise((r) => setTimeout(r, 2))) {
      const hits = needs.map((n) => mon.lines.slice(from).find((l) => entryOf(l.text, true) === n)?.at);
      if (hits.every((h) => h !== undefined)) at = Math.max(...(hits as number[]));
    }
    if (!at) throw new Error(`change ${i}: sim-${k} did not move to ${target} within 5 s (${needs.join(', ')})`);
    lat[tunnelled(k) ? 'tunnel' : 'direct'].push(at - sent);
    await patchAddress(k, gw(k), creds, ENV.KCL_API_PORT); // back, for the next round
    await new Promise((r) => setTimeout(r, 20));
  }
  const after = await processUsage(pid);
  const conv = convergedAt - firstLog;
  console.log('\nconverge with all Nodes (ms)');
  console.log(`  from the agent's first log line   ${conv.toFixed(0)}`);
  console.log(`  from the routes controller start  ${(convergedAt - routesStart).toFixed(0)}`);
  console.log(`  from spawn                        ${(convergedAt - spawned).toFixed(0)}`);
  for (const way of ['direct', 'tunnel'] as const) {
    const l = lat[way];
    if (l.length > 0)
      console.log(
        `one Node change -> kernel, ${way} (ms, ${l.length} changes): p50 ${percentile(l, 50).toFixed(1)}  p99 ${percentile(l, 99).toFixed(1)}  max ${Math.max(...l).toFixed(1)}`,
      );
  }
  const all = [...lat.direct, ...lat.tunnel];
  console.log(
    `agent CPU per change: ${((after.cpuMs - before.cpuMs) / (2 * all.length)).toFixed(2)} ms (each round is 2 changes; includes every other watch event meanwhile)`,
  );
  console.log(
    `agent RSS with ${NODES} Nodes: ${settled.rssMb.toFixed(0)} MB after converging, ${after.rssMb.toFixed(0)} MB after the changes`,
  );
  console.log(`${conv <= 2000 ? 'PASS' : 'MISS'}  converge <= 2 s: ${conv.toFixed(0)} ms`);
  console.log(`${percentile(all, 99) <= 50 ? 'PASS' : 'MISS'}  one change <= 50 ms p99: ${percentile(all, 99).toFixed(1)} ms`);
  console.log(
    `${Math.max(settled.rssMb, after.rssMb) <= 120 ? 'PASS' : 'MISS'}  RSS <= 120 MB: ${Math.max(settled.rssMb, after.rssMb).toFixed(0)} MB`,
  );
  mon.proc.kill();
} finally {
  await stopAgent();
  const down = await execa('bash', [join(ROOT, 'hack/cluster.sh'), 'down'], { env: ENV, all: true, reject: false });
  await releaseTraffic();
  await releaseCluster();
  console.log(`cluster down: ${down.all?.trim().split('\n').pop() ?? ''} (total ${((Date.now() - t0) / 1000).toFixed(0)} s)`);
}
