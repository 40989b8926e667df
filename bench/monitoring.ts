/**
 * The monitoring path on a real cluster, end to end, and the picture README shows: a 2-node local
 * cluster (hack/cluster.sh), kubenet installed with its Helm chart, Prometheus from
 * manifests/monitoring/prometheus.yaml; two pods limited to 20M and 10M take as much as TCP gets
 * from a LAN host for `--seconds` (default 90); halfway the second's annotation goes to 30M (a live
 * re-shape). Then the dashboard's "Ingress: rate and limit" panel, its own two PromQL expressions
 * (grafana-dashboard.json, `$__rate_interval` as Grafana sets it for a 15 s scrape: 1m), over the run
 * by query_range, drawn as an SVG (`--svg`, default docs/img/dashboard-ingress.svg). Goals: the
 * PromQL rate of the steady pod over the run within ±5 % of iperf3's figure on the wire; the new
 * limit in Prometheus within 30 s of the annotation (a scrape every 15 s).
 *
 * Usage (root): npx tsx bench/monitoring.ts [--seconds 90] [--svg docs/img/dashboard-ingress.svg]
 */
import { readFile, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { BenchArgs } from '../test/kit/bench-kit.js';
import { lineChart } from '../test/kit/svg-chart.js';
import { iperf } from '../test/kit/topo.js';
import { withTrafficLock } from '../test/kit/traffic-lock.js';
import { dashboardQueries, type Dashboard } from '../test/kit/dashboard.js';
import { CHART, LAN_HOST, lanRoutes, LocalCluster, pausePidOf, pausePod } from '../test/kit/kcl.js';

const ROOT = fileURLToPath(new URL('../', import.meta.url));
const args = BenchArgs.parse('usage: npx tsx bench/monitoring.ts [--seconds 90] [--svg docs/img/dashboard-ingress.svg]', [
  'seconds',
  'svg',
]);
const SECONDS = args.num('seconds', 90);
const SVG = args.str('svg') ?? join(ROOT, 'docs/img/dashboard-ingress.svg');
const c = new LocalCluster();
const node = (i: number) => `kcl-n${i}`;
const mbit = (v: number) => `${(v / 1e6).toFixed(v >= 1e7 ? 0 : 1)}M`;

interface Matrix {
  result: Array<{ metric: Record<string, string>; values: Array<[number, string]> }>;
}

async function rangeQuery(query: string, start: number, end: number, step = 5): Promise<Matrix> {
  const q = new URLSearchParams({ query, start: String(start), end: String(end), step: String(step) });
  const r = JSON.parse(
    (await c.kubectl(['get', '--raw', `/api/v1/namespaces/kubenet-monitoring/services/prometheus:9090/proxy/api/v1/query_range?${q}`]))
      .stdout,
  ) as { status: string; data: Matrix; error?: string };
  if (r.status !== 'success') throw new Error(`${query}: ${r.error ?? r.status}`);
  return r.data;
}

async function main(): Promise<void> {
  const t0 = Date.now();
  const up = await c.up(['--nodes', '2'], () => console.log('waiting for another cluster to go down'));
  try {
    if (up.exitCode !== 0) throw new Error(`hack/cluster.sh up failed:\n${up.all ?? ''}`);
    await c.helm(['install', 'kubenet', CHART, '--namespace', 'kube-system', '--wait', '--timeout', '180s']);
    await c.kubectl(['wait', '--for=condition=Ready', 'node', '--all', '--timeout=120s']);
    await c.kubectl(['apply', '-f', join(ROOT, 'manifests/monitoring/prometheus.yaml')]);
    await c.kubectl(['-n', 'kubenet-monitoring', 'rollout', 'status', 'deployment/prometheus', '--timeout=180s']);
    for (
      const end = Date.now() + 120_000;
      (await c.promQuery('up{job="kubenet"} == 1').catch(() => ({ result: [] }))).result.length < 2;
    ) {
      if (Date.now() > end) throw new Error('Prometheus does not scrape both agents');
      await new Promise((r) => setTimeout(r, 1000));
    }
    console.log(`cluster, chart and Prometheus up in ${((Date.now() - t0) / 1000).toFixed(0)} s`);
    const items = [
      pausePod('mon-a', { 'kubernetes.io/ingress-bandwidth': '20M' }, node(1)),
      pausePod('mon-b', { 'kubernetes.io/ingress-bandwidth': '10M' }, node(2)),
    ];
    await c.kubectl(['apply', '-f', '-'], { input: JSON.stringify({ apiVersion: 'v1', kind: 'List', items }) });
    await c.kubectl(['wait', '--for=condition=Ready', 'pod/mon-a', 'pod/mon-b', '--timeout=90s']);
    const cidr = async (i: number) => (await c.json<{ spec: { podCIDR: string } }>(['get', 'node', node(i)])).spec.podCIDR;
    const unroute = await lanRoutes([
      { cidr: await cidr(1), node: 1 },
      { cidr: await cidr(2), node: 2 },
    ]);
    const ep = async (name: string) => {
      const ip = (await c.json<{ status: { podIP: string } }>(['get', 'pod', name])).status.podIP;
      return { netns: '', netnsPath: `/proc/${pausePidOf(ip) ?? 'none'}/ns/net`, ip4: ip };
    };
    const [a, b] = [await ep('mon-a'), await ep('mon-b')];
    let began = 0;
    let ended = 0;
    let annotated = 0;
    const [ra] = await withTrafficLock(async () => {
      began = Date.now();
      const flows = Promise.all([iperf(a, LAN_HOST, { seconds: SECONDS }), iperf(b, LAN_HOST, { seconds: SECONDS })]);
      await new Promise((r) => setTimeout(r, (SECONDS / 2) * 1000));
      annotated = Date.now();
      await c.kubectl(['annotate', '--overwrite', 'pod', 'mon-b', 'kubernetes.io/ingress-bandwidth=30M']);
      const r = await flows;
      ended = Date.now();
      return r;
    });
    await unroute();
    await new Promise((r) => setTimeout(r, 16_000));
    const panel = dashboardQueries(
      JSON.parse(await readFile(join(ROOT, 'manifests/monitoring/grafana-dashboard.json'), 'utf8')) as Dashboard,
    ).filter((q) => q.title.startsWith('Ingress (to the pod): rate and limit'));
    if (panel.length !== 2) throw new Error(`the dashboard's ingress panel has ${panel.length} queries, not 2`);
    const start = Math.floor(began / 1000);
    const end = Math.ceil(ended / 1000) + 15;
    const series = [];
    for (const pod of ['mon-a', 'mon-b']) {
      for (const [k, q] of panel.entries()) {
        const m = await rangeQuery(q.query.replace('namespace=~".*"', `namespace="default", pod="${pod}"`), start, end);
        const s = m.result[0];
        if (!s) throw new Error(`no series for ${pod}: ${q.query}`);
        series.push({
          label: `default/${pod} ${k === 0 ? 'rate' : 'limit'}`,
          dashed: k === 1,
          points: s.values.map(([t, v]) => [t, Number(v)] as [number, number]),
        });
      }
    }
    const svg = lineChart(series, {
      title: `Ingress (to the pod): rate and limit, from Prometheus (the dashboard's panel); mon-b 10M -> 30M at ${Math.round((annotated - began) / 1000)} s`,
      yFormat: mbit,
    });
    await writeFile(SVG, svg);
    console.log(`wrote ${SVG}`);
    // Goal 1: the steady pod's PromQL rate over the run, past TCP's first seconds, against iperf3 on the wire.
    const at = ended - 1000;
    const windowS = Math.floor((at - (began + 5000)) / 1000);
    const prom = Number(
      (await c.promQuery(`8 * rate(kubenet_pod_shaped_bytes_total{pod="mon-a", direction="ingress"}[${windowS}s])`, at)).result[0]
        ?.value[1] ?? NaN,
    );
    const wire = ra.bytes !== undefined && ra.segments !== undefined ? ra.bps * ((ra.bytes + ra.segments * 66) / ra.bytes) : NaN;
    const ratio = prom / wire;
    console.log(
      `mon-a (20M): iperf3 ${mbit(ra.bps)} payload, ${(wire / 1e6).toFixed(2)}M on the wire; PromQL rate over ${windowS} s ${(prom / 1e6).toFixed(2)}M (${(ratio * 100).toFixed(1)} %)`,
    );
    console.log(
      `goal PromQL rate within ±5 % of iperf3 on the wire (0.95-1.05): ${Math.abs(ratio - 1) <= 0.05 ? 'PASS' : 'MISS'} ${ratio.toFixed(3)}`,
    );
    // Goal 2: the new limit in Prometheus.
    const limits = await rangeQuery(
      'kubenet_pod_bandwidth_limit_bits_per_second{pod="mon-b", direction="ingress"}',
      Math.floor(annotated / 1000),
      end,
      1,
    );
    const seenAt = limits.result[0]?.values.find(([, v]) => Number(v) === 30e6)?.[0];
    const lag = seenAt === undefined ? Infinity : seenAt - annotated / 1000;
    console.log(`goal the new limit in Prometheus within 30 s of the annotation: ${lag <= 30 ? 'PASS' : 'MISS'} ${lag.toFixed(1)} s`);
  } finally {
    const down = await c.down();
    if (down.exitCode !== 0) console.error(`hack/cluster.sh down failed: ${down.all ?? ''}`);
  }
}

main().catch((err: unknown) => {
  console.error(err);
  process.exit(1);
});
