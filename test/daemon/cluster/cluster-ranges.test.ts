/**
 * src/daemon/cluster/cluster-ranges.ts against the fake API server, without root: the unshaped destinations
 * with `routes: direct` are exactly every Node's pod CIDRs (from the route controller's own Node
 * watch: no second one) and the ServiceCIDRs' ranges, merged; nothing is applied before both are
 * known; changes and deletions follow; a burst is one rewrite; an API server without ServiceCIDRs
 * (404) leaves the Service ranges out, said once, and is not asked again; one that forbids them (403)
 * too, until allowed; a failed rewrite is retried.
 * The kernel side (Shaper.setUnshaped on a real ifb): test/shaper/unshaped-live.test.ts.
 */
import test, { type ExecutionContext } from 'ava';
import { pino } from 'pino';
import { FakeApiServer, fakeKubeConfig, serviceCidr, type FakeObject } from '../../kit/fake-apiserver.js';
import { until } from '../../kit/until.js';
import { ClusterRanges, SERVICE_CIDRS_PATH } from '../../../src/daemon/cluster/cluster-ranges.js';
import { noEvents } from '../../../src/daemon/kube/events.js';
import { NodeRoutes, type RouteKernel } from '../../../src/daemon/cluster/routes.js';

const node = (name: string, cidrs: string[], ip: string): FakeObject => ({
  apiVersion: 'v1',
  kind: 'Node',
  metadata: { name },
  spec: { podCIDR: cidrs[0], podCIDRs: cidrs },
  status: { addresses: [{ type: 'InternalIP', address: ip }] },
});

/** Routes are not what these tests look at: a kernel that holds nothing and accepts everything. */
const kernel: RouteKernel = {
  list: async () => [],
  replace: async () => undefined,
  del: async () => undefined,
  localAddresses: async () => [{ ifindex: 2, cidr: '198.18.0.1/24' }],
};

/** A logger whose lines the test reads. */
function capture() {
  const lines: Array<{ level: number; msg: string; [k: string]: unknown }> = [];
  const logger = pino({ level: 'debug' }, { write: (s: string) => void lines.push(JSON.parse(s) as (typeof lines)[number]) });
  return { logger, lines };
}

/** The fake API server, the route controller feeding the ranges, and every set the ranges applied. */
async function setup(t: ExecutionContext, prepare: (api: FakeApiServer) => void, opts: { fail?: number } = {}) {
  const api = await FakeApiServer.start();
  t.teardown(() => api.stop());
  prepare(api);
  const { logger, lines } = capture();
  const kube = { nodeName: 'self', logger, kubeConfig: fakeKubeConfig(api), retryMinMs: 20, retryMaxMs: 200 };
  const ranges = new ClusterRanges({ ...kube, coalesceMs: 50, retryMs: 50 });
  const routes = new NodeRoutes({ ...kube, events: noEvents, kernel, onPodCidrs: (c) => ranges.setPodCidrs(c) });
  const applied: string[][] = [];
  let fail = opts.fail ?? 0;
  ranges.start(async (cidrs) => {
    if (fail-- > 0) throw new Error('injected: tc refused');
    applied.push(cidrs);
  });
  routes.start();
  t.teardown(async () => {
    await routes.stop();
    await ranges.stop();
  });
  return { api, ranges, applied, lines };
}

const settle = (ms = 200) => new Promise((r) => setTimeout(r, ms));

test("the set is every Node's pod CIDRs (this node's too) and every ServiceCIDR's ranges, merged, applied once both are known", async (t) => {
  const { api, ranges, applied } = await setup(t, (api) => {
    api.setNode(node('self', ['10.244.0.0/24', 'fd00:10:244::/64'], '198.18.0.1'));
    api.setNode(node('b', ['10.244.1.0/24', 'fd00:10:244:1::/64'], '198.18.0.2'));
    api.setNode(node('c', ['10.244.3.0/24'], '198.18.0.3'));
    api.setServiceCidr(serviceCidr('kubernetes', ['10.96.0.0/16', 'fd00:10:96::/112']));
    api.setServiceCidr(serviceCidr('extra', ['10.97.0.0/16']));
  });
  await until('the first set', () => applied.length >= 1, 5000);
  await settle();
  t.deepEqual(
    applied,
    [['10.96.0.0/15', '10.244.0.0/23', '10.244.3.0/24', 'fd00:10:96::/112', 'fd00:10:244::/63']],
    'one rewrite; halves joined, never an address more',
  );
  t.like(ranges.state(), { podCidrs: 5, services: 'api', serviceCidrs: ['10.96.0.0/16', '10.97.0.0/16', 'fd00:10:96::/112'] });
  t.is(api.count(SERVICE_CIDRS_PATH, 'list'), 1);
  t.true(api.count(SERVICE_CIDRS_PATH, 'watch') >= 1, 'the ServiceCIDRs are watched');
  t.is(api.count('/api/v1/nodes', 'list'), 1, "the Nodes are listed once: the route controller's watch");
  t.is(api.count('/api/v1/nodes', 'watch'), 1, 'and watched once');
});

test('changes follow live: a Node added, moved, deleted, a ServiceCIDR added, changed, deleted; a heartbeat changes nothing', async (t) => {
  const { api, applied } = await setup(t, (api) => {
    api.setNode(node('self', ['10.244.0.0/24'], '198.18.0.1'));
    api.setServiceCidr(serviceCidr('kubernetes', ['10.96.0.0/16']));
  });
  await until('the first set', () => applied.length === 1, 5000);
  t.deepEqual(applied.at(-1), ['10.96.0.0/16', '10.244.0.0/24']);
  const next = async (what: string, n: number) => {
    await until(what, () => applied.length === n, 5000);
    return applied.at(-1);
  };
  api.setNode(node('b', ['10.244.8.0/24'], '198.18.0.2'));
  t.deepEqual(await next('a Node added', 2), ['10.96.0.0/16', '10.244.0.0/24', '10.244.8.0/24']);
  api.setNode(node('b', ['10.244.8.0/24'], '198.18.0.9'));
  api.setNode({ ...node('b', ['10.244.8.0/24'], '198.18.0.9'), metadata: { name: 'b', labels: { beat: '1' } } });
  await settle();
  t.is(applied.length, 2, 'a new address or a heartbeat: the pod CIDRs are the same, nothing rewritten');
  api.setNode(node('b', ['10.244.9.0/24'], '198.18.0.9'));
  t.deepEqual(await next("a Node's pod CIDR moved", 3), ['10.96.0.0/16', '10.244.0.0/24', '10.244.9.0/24']);
  api.deleteNode('b');
  t.deepEqual(await next('a Node deleted', 4), ['10.96.0.0/16', '10.244.0.0/24']);
  api.setServiceCidr(serviceCidr('extra', ['10.100.0.0/24', 'fd00:10:100::/112']));
  t.deepEqual(await next('a ServiceCIDR added', 5), ['10.96.0.0/16', '10.100.0.0/24', '10.244.0.0/24', 'fd00:10:100::/112']);
  api.setServiceCidr(serviceCidr('extra', ['10.100.0.0/24']));
  t.deepEqual(await next('a ServiceCIDR changed', 6), ['10.96.0.0/16', '10.100.0.0/24', '10.244.0.0/24']);
  // Being deleted (a finalizer waits for its Services): its range stays until it is gone.
  api.setServiceCidr({
    ...serviceCidr('extra', ['10.100.0.0/24']),
    metadata: { name: 'extra', deletionTimestamp: new Date().toISOString(), finalizers: ['networking.k8s.io/service-cidr-finalizer'] },
  });
  await settle();
  t.is(applied.length, 6);
  api.deleteServiceCidr('extra');
  t.deepEqual(await next('a ServiceCIDR deleted', 7), ['10.96.0.0/16', '10.244.0.0/24']);
});

test('a burst of Node events is one rewrite', async (t) => {
  const { api, ranges, applied } = await setup(t, (api) => {
    api.setNode(node('self', ['10.244.0.0/24'], '198.18.0.1'));
    api.setServiceCidr(serviceCidr('kubernetes', ['10.96.0.0/16']));
  });
  await until('the first set', () => applied.length === 1, 5000);
  for (let i = 1; i < 64; i++) api.setNode(node(`n${i}`, [`10.244.${i}.0/24`], `198.18.0.${i + 1}`));
  await until('the burst applied', () => applied.at(-1)?.includes('10.244.0.0/18') === true, 5000);
  await settle();
  t.is(applied.length, 2, '63 Nodes added at once: one rewrite');
  t.deepEqual(applied[1], ['10.96.0.0/16', '10.244.0.0/18'], '64 /24s side by side are one /18');
  t.is(ranges.counters.rewrites, 2);
});

test('an API server without ServiceCIDRs (404): the pod CIDRs alone, said once, not asked again', async (t) => {
  const { api, ranges, applied, lines } = await setup(t, (api) => {
    api.serveServiceCidrs = false;
    api.setNode(node('self', ['10.244.0.0/24'], '198.18.0.1'));
  });
  await until('the first set', () => applied.length === 1, 5000);
  t.deepEqual(applied, [['10.244.0.0/24']]);
  t.like(ranges.state(), { services: 'unserved', serviceCidrs: [] });
  await settle(400);
  t.is(api.count(SERVICE_CIDRS_PATH, 'any'), 1, 'one list answered 404; no retries');
  const said = lines.filter((l) => /serves no ServiceCIDRs/.test(l.msg));
  t.is(said.length, 1);
  t.regex(said[0]?.msg ?? '', /Services stays shaped; list the Service range in unshapedCIDRs/);
  api.setNode(node('b', ['10.244.1.0/24'], '198.18.0.2'));
  await until('the pod CIDRs still follow', () => applied.length === 2, 5000);
  t.deepEqual(applied[1], ['10.244.0.0/23']);
});

test('forbidden to list ServiceCIDRs (RBAC not updated): the pod CIDRs meanwhile, said once; the Service ranges join once allowed', async (t) => {
  let forbidden = true;
  const { api, ranges, applied, lines } = await setup(t, (api) => {
    api.failWith = (req) => (forbidden && req.path === SERVICE_CIDRS_PATH ? 403 : undefined);
    api.setNode(node('self', ['10.244.0.0/24'], '198.18.0.1'));
    api.setServiceCidr(serviceCidr('kubernetes', ['10.96.0.0/16']));
  });
  await until('the pod CIDRs alone', () => applied.length === 1, 5000);
  t.deepEqual(applied, [['10.244.0.0/24']]);
  t.like(ranges.state(), { services: 'forbidden' });
  await until('asked again', () => api.count(SERVICE_CIDRS_PATH, 'list') >= 3, 5000);
  t.is(lines.filter((l) => /not allowed to list ServiceCIDRs/.test(l.msg)).length, 1, 'said once');
  forbidden = false;
  await until('the Service ranges joined', () => applied.length === 2, 5000);
  t.deepEqual(applied[1], ['10.96.0.0/16', '10.244.0.0/24']);
  t.like(ranges.state(), { services: 'api' });
});

test('nothing is applied before the Nodes are listed; a failed rewrite is tried again', async (t) => {
  const api = await FakeApiServer.start();
  t.teardown(() => api.stop());
  api.setServiceCidr(serviceCidr('kubernetes', ['10.96.0.0/16']));
  const { logger } = capture();
  const ranges = new ClusterRanges({ logger, kubeConfig: fakeKubeConfig(api), coalesceMs: 20, retryMs: 50 });
  const applied: string[][] = [];
  let fail = 2;
  ranges.start(async (cidrs) => {
    if (fail-- > 0) throw new Error('injected: tc refused');
    applied.push(cidrs);
  });
  t.teardown(() => ranges.stop());
  await settle(300);
  t.deepEqual(applied, [], 'the ServiceCIDRs alone: the Nodes not known yet, the kernel keeps what it had');
  ranges.setPodCidrs(['10.244.0.0/24']);
  await until('applied after two failures', () => applied.length === 1, 5000);
  t.deepEqual(applied, [['10.96.0.0/16', '10.244.0.0/24']]);
  t.like(ranges.counters, { failures: 2, rewrites: 1 });
  t.deepEqual(ranges.state().applied, ['10.96.0.0/16', '10.244.0.0/24']);
});
