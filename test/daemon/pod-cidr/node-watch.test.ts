/**
 * The Kubernetes side of the node agent against a fake API server on 127.0.0.1 speaking the real
 * list/watch protocol: the Node pod-CIDR source (NodeWatchPodCidrSource) and the pod annotation
 * lookup (ClusterPodLookup). No root needed; no traffic except to the fake on 127.0.0.1.
 */
import test, { type ExecutionContext } from 'ava';
import { spawn } from 'node:child_process';
import { createInterface } from 'node:readline';
import { setTimeout as sleep } from 'node:timers/promises';
import { fileURLToPath } from 'node:url';
import { pino } from 'pino';
import { KubenetError } from '../../../src/errors.js';
import { ApiHealth } from '../../../src/daemon/kube/api-health.js';
import { NodeWatchPodCidrSource } from '../../../src/daemon/pod-cidr/node-watch.js';
import { ClusterPodLookup } from '../../../src/daemon/cluster/pod-lookup.js';
import { FakeApiServer, fakeKubeConfig, node, pod } from '../../kit/fake-apiserver.js';
import { until } from '../../kit/until.js';

const ROOT = fileURLToPath(new URL('../../..', import.meta.url));
const NODES = '/api/v1/nodes';
const PODS = '/api/v1/pods';
const V4 = '10.244.1.0/24';
const V4B = '10.244.7.0/24';
const V4C = '10.244.9.0/24';
const V6 = 'fd00:10:244:1::/64';
const RETRY = { retryMinMs: 20, retryMaxMs: 200 };

interface LogLine {
  level: number;
  msg: string;
  err?: { message: string; code?: string; status?: number; type?: string };
  retryInMs?: number;
  attempt?: number;
  relist?: boolean;
  [k: string]: unknown;
}

/** A pino logger whose lines the test can read. */
function capturingLogger() {
  const lines: LogLine[] = [];
  const logger = pino({ level: 'debug' }, { write: (s: string) => void lines.push(JSON.parse(s) as LogLine) });
  return { logger, lines, having: (msg: string) => lines.filter((l) => l.msg.includes(msg)) };
}

async function fakeApi(t: ExecutionContext): Promise<FakeApiServer> {
  const api = await FakeApiServer.start();
  t.teardown(() => api.stop());
  return api;
}

/** A started node source for node-a; `cidrs` collects every onCidr call. */
async function nodeSource(t: ExecutionContext, api: FakeApiServer, onCidr?: (c: string) => void) {
  const log = capturingLogger();
  const cidrs: string[] = [];
  const source = new NodeWatchPodCidrSource({ nodeName: 'node-a', logger: log.logger, kubeConfig: fakeKubeConfig(api), ...RETRY });
  t.teardown(() => source.stop()); // teardowns run last-registered first: before api.stop()
  await source.start((c) => {
    cidrs.push(c);
    onCidr?.(c);
  });
  return { source, cidrs, ...log };
}

async function podLookup(t: ExecutionContext, api: FakeApiServer) {
  const log = capturingLogger();
  const lookup = new ClusterPodLookup({ nodeName: 'node-a', logger: log.logger, kubeConfig: fakeKubeConfig(api), ...RETRY });
  t.teardown(() => lookup.stop());
  await lookup.start();
  return { lookup, ...log };
}

const GET = (ns: string, name: string) => `/api/v1/namespaces/${ns}/pods/${name}`;

// ---- NodeWatchPodCidrSource ----

test('node source: the pod CIDR comes from the list of its own Node; list then watch from the list resourceVersion', async (t) => {
  const api = await fakeApi(t);
  api.setNode(node('node-a', { podCIDR: V4 }));
  const listRv = api.resourceVersion;
  const { cidrs } = await nodeSource(t, api);
  await until('the pod CIDR', () => cidrs.length >= 1);
  t.deepEqual(cidrs, [V4]);
  await until('the watch', () => api.openWatches === 1);
  const [list, watch] = api.requests;
  t.is(list?.path, NODES);
  t.false(list?.watch);
  t.is(list?.query.get('fieldSelector'), 'metadata.name=node-a');
  t.true(watch?.watch);
  t.is(watch?.query.get('resourceVersion'), listRv);
  t.is(watch?.query.get('fieldSelector'), 'metadata.name=node-a');
  // The credentials of the kubeconfig go on every request.
  t.true(api.requests.every((r) => r.authorization === 'Bearer fake-token'));
});

test('node source: a new CIDR in a MODIFIED Node calls onCidr again; the same CIDR does not', async (t) => {
  const api = await fakeApi(t);
  api.setNode(node('node-a', { podCIDR: V4 }));
  const { cidrs } = await nodeSource(t, api);
  await until('the first CIDR', () => cidrs.length >= 1);
  api.setNode(node('node-a', { podCIDR: V4 }, { heartbeat: '1' })); // same CIDR: nothing
  api.setNode(node('node-a', { podCIDR: V4B }));
  api.setNode(node('node-a', { podCIDR: V4B }, { heartbeat: '2' })); // same again: nothing
  api.setNode(node('node-a', { podCIDR: V4C }));
  // Events are handled in order, so once V4C is in, the same-CIDR events have been handled too.
  await until('the third CIDR', () => cidrs.length >= 3);
  t.deepEqual(cidrs, [V4, V4B, V4C]);
  t.is(api.count(NODES, 'list'), 1, 'changes came through the watch, not re-lists');
});

test('node source: dual-stack podCIDRs give "v4,v6"', async (t) => {
  const api = await fakeApi(t);
  api.setNode(node('node-a', { podCIDR: V4, podCIDRs: [V4, V6] }));
  const { cidrs } = await nodeSource(t, api);
  await until('the CIDR', () => cidrs.length >= 1);
  t.deepEqual(cidrs, [`${V4},${V6}`]);
  api.setNode(node('node-a', { podCIDR: V4B, podCIDRs: [V4B, V6] }));
  await until('the changed CIDR', () => cidrs.length >= 2);
  t.is(cidrs[1], `${V4B},${V6}`);
});

test('node source: waits (and says so once) for the Node and for its pod CIDR', async (t) => {
  const api = await fakeApi(t);
  const { cidrs, having } = await nodeSource(t, api);
  await until('the "not registered" log', () => having('not registered yet').length === 1);
  api.setNode(node('node-a'));
  await until('the "no pod CIDR" log', () => having('no pod CIDR yet').length === 1);
  api.setNode(node('node-a', {}, { heartbeat: '1' }));
  api.setNode(node('node-a', {}, { heartbeat: '2' }));
  api.setNode(node('node-a', { podCIDR: V4 }));
  await until('the CIDR', () => cidrs.length >= 1);
  t.deepEqual(cidrs, [V4]);
  t.is(having('no pod CIDR yet').length, 1, 'heartbeats without a CIDR do not repeat the waiting message');
  t.is(having('not registered yet').length, 1);
});

test('node source: only its own Node counts', async (t) => {
  const api = await fakeApi(t);
  api.setNode(node('node-b', { podCIDR: '10.99.0.0/24' }));
  api.setNode(node('node-a', { podCIDR: V4 }));
  const { cidrs } = await nodeSource(t, api);
  await until('the CIDR', () => cidrs.length >= 1);
  api.setNode(node('node-b', { podCIDR: '10.99.1.0/24' }));
  api.deleteNode('node-b');
  api.setNode(node('node-c', { podCIDR: '10.99.2.0/24' }));
  api.setNode(node('node-a', { podCIDR: V4B }));
  await until('the second CIDR', () => cidrs.length >= 2);
  t.deepEqual(cidrs, [V4, V4B]);
  t.true(api.requests.every((r) => r.query.get('fieldSelector') === 'metadata.name=node-a'));
});

test('node source: an error thrown by onCidr is logged, not fatal', async (t) => {
  const api = await fakeApi(t);
  api.setNode(node('node-a', { podCIDR: V4 }));
  const { cidrs, lines } = await nodeSource(t, api, (c) => {
    if (c === V4) throw new Error('plugin refused it');
  });
  await until('the first CIDR', () => cidrs.length >= 1);
  const logged = await until('the error log', () => lines.find((l) => l.level === 50 && l.err?.message === 'plugin refused it'));
  t.is(logged.podCIDR, V4);
  api.setNode(node('node-a', { podCIDR: V4B }));
  await until('the next CIDR', () => cidrs.length >= 2);
  t.deepEqual(cidrs, [V4, V4B]);
});

/** A node source whose every retry wait would take a minute: whatever it does within a test's time, it does at once. */
const NO_WAIT = { retryMinMs: 60_000, retryMaxMs: 60_000 };

test("node source: when the server ends a watch it watches again at once from the last resourceVersion, a bookmark's included; no re-list", async (t) => {
  const api = await fakeApi(t);
  api.setNode(node('node-a', { podCIDR: V4 }));
  const log = capturingLogger();
  const cidrs: string[] = [];
  const source = new NodeWatchPodCidrSource({ nodeName: 'node-a', logger: log.logger, kubeConfig: fakeKubeConfig(api), ...NO_WAIT });
  t.teardown(() => source.stop());
  await source.start((c) => void cidrs.push(c));
  await until('the watch', () => cidrs.length === 1 && api.openWatches === 1);
  api.setNode(node('node-a', { podCIDR: V4B })); // an event on this watch: it made progress
  await until('the change', () => cidrs.length === 2);
  api.advance(5); // writes this watch does not see; a bookmark carries the resourceVersion
  api.bookmark();
  const bookmarked = api.resourceVersion;
  await sleep(50);
  api.closeWatches();
  await until('a new watch at once (a retry wait would take a minute)', () => api.openWatches === 1, 5_000);
  const watches = api.requests.filter((r) => r.path === NODES && r.query.get('watch') === 'true');
  t.is(watches.length, 2);
  t.is(watches[1]?.query.get('resourceVersion'), bookmarked, 'watched again from the bookmark');
  t.is(watches[0]?.query.get('allowWatchBookmarks'), 'true');
  api.setNode(node('node-a', { podCIDR: V4C }));
  await until('a later change', () => cidrs.length >= 3);
  t.deepEqual(cidrs, [V4, V4B, V4C]);
  t.is(api.count(NODES, 'list'), 1, 'a clean close needs no re-list: the resourceVersion is still good');
  t.is(log.lines.filter((l) => l.level >= 40).length, 0, 'a watch the server ends is no failure');
});

test('node source: a watch the server ends at once without an event counts as a failure (paced, not a hot loop)', async (t) => {
  const api = await fakeApi(t);
  api.setNode(node('node-a', { podCIDR: V4 }));
  const { cidrs, lines } = await nodeSource(t, api);
  await until('the watch', () => cidrs.length === 1 && api.openWatches === 1);
  api.closeWatches();
  await until('a new watch', () => api.openWatches === 1);
  t.is(lines.filter((l) => /ended after \d+ ms without an event/.test(l.err?.message ?? '')).length, 1);
  api.setNode(node('node-a', { podCIDR: V4B }));
  await until('the change', () => cidrs.length >= 2);
});

test('API server gone and back on the same port: the node source and the pod lookup share one ApiHealth: about one attempt per period between them, one warning; both back at once when it answers, with the change made meanwhile', async (t) => {
  const api = await fakeApi(t);
  api.setNode(node('node-a', { podCIDR: V4 }));
  const log = capturingLogger();
  const PERIOD = 50;
  const health = new ApiHealth({ periodMs: PERIOD, logger: log.logger });
  const kube = { nodeName: 'node-a', logger: log.logger, kubeConfig: fakeKubeConfig(api), health, retryMaxMs: 200 };
  const cidrs: string[] = [];
  const source = new NodeWatchPodCidrSource(kube);
  const lookup = new ClusterPodLookup(kube);
  t.teardown(() => lookup.stop());
  t.teardown(() => source.stop());
  await source.start((c) => void cidrs.push(c));
  await lookup.start();
  await until('both watches', () => cidrs.length === 1 && api.openWatches === 2);
  await api.stop();
  await until('away', () => health.isDown);
  const since = Date.now();
  const before = health.stats.attempts;
  await sleep(40 * PERIOD);
  const attempts = health.stats.attempts - before;
  const perPeriod = attempts / ((Date.now() - since) / PERIOD);
  // Each of the two loops on its own would try once per period or more: together they stay near one.
  t.true(perPeriod > 0.5 && perPeriod < 1.5, `${attempts} attempts in ${Date.now() - since} ms (${perPeriod.toFixed(2)} per period)`);
  t.is(
    log.having('the API server is away').filter((l) => l.level === 40).length,
    1,
    'one warning for the outage, not one per loop or attempt',
  );
  t.true(log.having('the API server is away').every((l) => typeof l.err?.message === 'string' && l.err.message !== ''));
  api.setNode(node('node-a', { podCIDR: V4B }));
  api.setPod(pod('default', 'web', 'node-a', { 'kubernetes.io/ingress-bandwidth': '1M' }));
  await api.start();
  await until('the change made while the server was away', () => cidrs.length >= 2 && lookup.has('default', 'web'));
  await until('both watches again', () => api.openWatches === 2);
  t.false(health.isDown);
  t.deepEqual(cidrs, [V4, V4B]);
  t.is(log.having('the API server answers again').length, 1);
  api.setNode(node('node-a', { podCIDR: V4C }));
  await until('a later change', () => cidrs.length >= 3);
});

for (const mode of ['event', 'status'] as const) {
  test(`node source: 410 Gone (${mode === 'event' ? 'ERROR event' : 'HTTP 410'}) makes it re-list at once, then watch from the new list`, async (t) => {
    const api = await fakeApi(t);
    api.goneMode = mode;
    api.setNode(node('node-a', { podCIDR: V4 }));
    const log = capturingLogger();
    const cidrs: string[] = [];
    const source = new NodeWatchPodCidrSource({ nodeName: 'node-a', logger: log.logger, kubeConfig: fakeKubeConfig(api), ...NO_WAIT });
    t.teardown(() => source.stop());
    await source.start((c) => void cidrs.push(c));
    await until('the watch', () => cidrs.length === 1 && api.openWatches === 1);
    api.setNode(node('node-a', { podCIDR: V4 }, { seen: 'yes' })); // an event: the watch made progress (an empty watch ended at once would be paced)
    await until('the event', () => api.requests.length >= 2 && log.lines.some((l) => l.msg.includes('listed')));
    await sleep(50);
    api.expire(); // every resourceVersion handed out so far is now too old; the watch ends
    api.setNode(node('node-a', { podCIDR: V4B }));
    await until('the change, at once (a retry wait would take a minute)', () => cidrs.length >= 2, 5_000);
    await until('a new watch', () => api.openWatches === 1);
    api.setNode(node('node-a', { podCIDR: V4C }));
    await until('a later change', () => cidrs.length >= 3);
    t.deepEqual(cidrs, [V4, V4B, V4C]);
    t.is(api.count(NODES, 'list'), 2, 'exactly one re-list');
    const gone = log.lines.filter((l) => l.err?.status === 410);
    t.is(gone.length, 1);
    t.regex(gone[0]?.msg ?? '', /listing again/);
    t.regex(gone[0]?.err?.message ?? '', /too old resource version/);
  });
}

test("node source: an error answer (403) backs off on its own, jittered and growing; the API server is not 'away'", async (t) => {
  const api = await fakeApi(t);
  api.setNode(node('node-a', { podCIDR: V4 }));
  api.failWith = (r) => (r.path === NODES ? 403 : undefined);
  const log = capturingLogger();
  const health = new ApiHealth({ periodMs: 20 });
  const source = new NodeWatchPodCidrSource({
    nodeName: 'node-a',
    logger: log.logger,
    kubeConfig: fakeKubeConfig(api),
    health,
    retryMinMs: 20,
    retryMaxMs: 160,
  });
  t.teardown(() => source.stop());
  await source.start(() => undefined);
  await until('six failures', () => log.having('list/watch failed; retrying').length >= 6);
  const delays = log
    .having('list/watch failed; retrying')
    .slice(0, 6)
    .map((l) => l.retryInMs ?? -1);
  // Steps 20, 40, 80, 160, 160, 160: each wait within [step/2, step].
  for (const [i, step] of [20, 40, 80, 160, 160, 160].entries()) {
    t.true((delays[i] ?? -1) >= step / 2 && (delays[i] ?? Infinity) <= step, `delays ${delays.join(',')}`);
  }
  t.false(health.isDown);
  t.is(health.stats.outages, 0);
  api.failWith = undefined;
});

test('node source: start() returns at once when the API server does not answer; stop() cuts the hanging request', async (t) => {
  const api = await fakeApi(t);
  api.stall = true;
  const log = capturingLogger();
  const source = new NodeWatchPodCidrSource({ nodeName: 'node-a', logger: log.logger, kubeConfig: fakeKubeConfig(api), ...RETRY });
  const started = Date.now();
  await source.start(() => t.fail('no CIDR can come from a stalled server'));
  t.true(Date.now() - started < 1000);
  await until('the stalled list request', () => api.requests.length === 1 && api.connections === 1);
  const stopping = Date.now();
  await source.stop();
  t.true(Date.now() - stopping < 1000, 'stop() did not wait for the request');
  await until('the client to let go of the connection', () => api.connections === 0);
});

test('node source: stop() ends the watch and any retry wait; no request or callback afterwards', async (t) => {
  const api = await fakeApi(t);
  api.setNode(node('node-a', { podCIDR: V4 }));
  const { source, cidrs } = await nodeSource(t, api);
  await until('the watch', () => cidrs.length === 1 && api.openWatches === 1);
  await source.stop();
  const seen = api.requests.length;
  await until('the watch to close on the server', () => api.openWatches === 0 && api.connections === 0);
  api.setNode(node('node-a', { podCIDR: V4B }));
  api.closeWatches();
  await sleep(5 * RETRY.retryMaxMs); // an absence can only be observed for a while
  t.is(api.requests.length, seen);
  t.deepEqual(cidrs, [V4]);

  // Stopping during a long backoff wait returns at once (the timer is cleared, not waited for).
  const log = capturingLogger();
  const slow = new NodeWatchPodCidrSource({
    nodeName: 'node-a',
    logger: log.logger,
    kubeConfig: fakeKubeConfig(api),
    retryMinMs: 60_000,
    retryMaxMs: 60_000,
  });
  t.teardown(() => slow.stop());
  await api.stop();
  await slow.start(() => undefined);
  await until('the refused list', () => log.having('list/watch failed').length === 1);
  const stopping = Date.now();
  await slow.stop();
  t.true(Date.now() - stopping < 1000);
});

/** A separate process running a node source: it must exit by itself once stop() resolved. */
const CHILD = `
import { pino } from 'pino';
import { NodeWatchPodCidrSource } from './src/daemon/pod-cidr/node-watch.ts';
import { fakeKubeConfig } from './test/kit/fake-apiserver.ts';
const source = new NodeWatchPodCidrSource({
  nodeName: 'node-a', logger: pino({ level: 'debug' }, process.stdout),
  kubeConfig: fakeKubeConfig(process.env.FAKE_URL), retryMinMs: 20, retryMaxMs: 200,
});
await source.start((c) => console.log('cidr ' + c));
console.log('started');
process.stdin.once('data', async () => {
  process.stdin.destroy();
  await source.stop();
  console.log('stopped');
});
`;

function spawnSource(t: ExecutionContext, url: string) {
  const child = spawn(process.execPath, ['--import', 'tsx', '--input-type=module', '-e', CHILD], {
    cwd: ROOT,
    env: { ...process.env, FAKE_URL: url },
    stdio: ['pipe', 'pipe', 'inherit'],
  });
  const out: string[] = [];
  createInterface({ input: child.stdout }).on('line', (l) => out.push(l));
  const exit = new Promise<number | null>((ok) => child.once('exit', (code) => ok(code)));
  t.teardown(() => void child.kill());
  return { out, exit, stop: () => child.stdin.write('stop\n') };
}

test('node source: after stop() nothing holds the process open (watching, backing off, or connecting)', async (t) => {
  const watching = await fakeApi(t);
  watching.setNode(node('node-a', { podCIDR: V4 }));
  const down = await fakeApi(t);
  await down.stop(); // its port now refuses: the source keeps backing off
  const stalled = await fakeApi(t);
  stalled.stall = true; // accepts and never answers: the source is stuck in its first request
  const a = spawnSource(t, watching.url);
  const b = spawnSource(t, down.url);
  const c = spawnSource(t, stalled.url);
  await until('child a to watch', () => a.out.includes(`cidr ${V4}`) && watching.openWatches === 1, 30_000);
  await until('child b to fail twice', () => b.out.filter((l) => l.includes('list/watch failed')).length >= 2, 30_000);
  await until('child c to be stuck', () => c.out.includes('started') && stalled.connections === 1, 30_000);
  for (const child of [a, b, c]) child.stop();
  const codes = await Promise.race([Promise.all([a.exit, b.exit, c.exit]), sleep(10_000, 'still running', { ref: false })]);
  t.deepEqual(codes, [0, 0, 0]);
  for (const child of [a, b, c]) t.true(child.out.includes('stopped'));
});

// ---- ClusterPodLookup ----

test('pod lookup: annotations of a pod on this node come from the watch cache, without a GET', async (t) => {
  const api = await fakeApi(t);
  api.setPod(pod('default', 'web', 'node-a', { 'kubernetes.io/ingress-bandwidth': '1M' }));
  api.setPod(pod('default', 'elsewhere', 'node-b'));
  const { lookup } = await podLookup(t, api);
  await until('the pod in the cache', () => lookup.has('default', 'web'));
  t.deepEqual(await lookup.annotations('default', 'web'), { 'kubernetes.io/ingress-bandwidth': '1M' });
  t.false(lookup.has('default', 'elsewhere'), 'only pods of this node are cached');
  api.setPod(pod('default', 'web', 'node-a', { 'kubernetes.io/egress-bandwidth': '2M' }));
  await until(
    'the updated annotations',
    async () => (await lookup.annotations('default', 'web'))?.['kubernetes.io/egress-bandwidth'] === '2M',
  );
  t.is(api.count(GET('default', 'web')), 0);
  t.true(api.requests.filter((r) => r.path === PODS).every((r) => r.query.get('fieldSelector') === 'spec.nodeName=node-a'));
});

test('pod lookup: a pod not in the cache yet is fetched with one GET; a missing pod is undefined', async (t) => {
  const api = await fakeApi(t);
  api.setPod(pod('default', 'web', 'node-a'));
  const { lookup } = await podLookup(t, api);
  await until('the cache', () => lookup.has('default', 'web') && api.openWatches === 1);
  // Hold the watch back (re-watches fail) so that only a GET can know the new pod.
  api.failWith = (r) => (r.watch ? 503 : undefined);
  api.closeWatches();
  api.setPod(pod('kube-system', 'fresh', 'node-a', { 'kubernetes.io/egress-bandwidth': '10M' }));
  t.false(lookup.has('kube-system', 'fresh'));
  t.deepEqual(await lookup.annotations('kube-system', 'fresh'), { 'kubernetes.io/egress-bandwidth': '10M' });
  t.is(api.count(GET('kube-system', 'fresh')), 1);
  t.is(await lookup.annotations('default', 'nope'), undefined);
  t.is(api.count(GET('default', 'nope')), 1);
  // Once the watch is back the cache catches up, and the GET is not needed any more.
  api.failWith = undefined;
  await until('the watch to deliver the pod', () => lookup.has('kube-system', 'fresh'));
  t.deepEqual(await lookup.annotations('kube-system', 'fresh'), { 'kubernetes.io/egress-bandwidth': '10M' });
  t.is(api.count(GET('kube-system', 'fresh')), 1);
});

test('pod lookup: a pod deleted from the cache is looked up with a GET and is then undefined', async (t) => {
  const api = await fakeApi(t);
  api.setPod(pod('default', 'web', 'node-a', { a: 'b' }));
  const { lookup } = await podLookup(t, api);
  await until('the cache', () => lookup.has('default', 'web'));
  api.deletePod('default', 'web');
  await until('the deletion', () => !lookup.has('default', 'web'));
  t.is(await lookup.annotations('default', 'web'), undefined);
  t.is(api.count(GET('default', 'web')), 1);
});

test('pod lookup: other API failures throw a KubenetError naming the pod', async (t) => {
  const api = await fakeApi(t);
  const { lookup } = await podLookup(t, api);
  api.failWith = (r) => (r.path === GET('default', 'web') ? 403 : undefined);
  const forbidden = await t.throwsAsync(lookup.annotations('default', 'web'), { instanceOf: KubenetError });
  t.regex(forbidden?.message ?? '', /default\/web.*403 Forbidden/);
  await api.stop();
  const down = await t.throwsAsync(lookup.annotations('default', 'web'), { instanceOf: KubenetError });
  t.regex(down?.message ?? '', /default\/web.*ECONNREFUSED/);
});

test('pod lookup: a re-list after 410 drops pods deleted while it was disconnected', async (t) => {
  const api = await fakeApi(t);
  api.goneMode = 'status';
  api.setPod(pod('default', 'web', 'node-a'));
  api.setPod(pod('default', 'db', 'node-a'));
  const { lookup } = await podLookup(t, api);
  await until('the cache', () => lookup.has('default', 'web') && lookup.has('default', 'db') && api.openWatches === 1);
  await api.stop();
  api.deletePod('default', 'web');
  api.expire(); // the deletion event is compacted away: only a re-list can tell
  await api.start();
  await until('the re-list', () => !lookup.has('default', 'web'));
  t.true(lookup.has('default', 'db'));
  t.is(api.count(PODS, 'list'), 2);
});
