/**
 * manifests/monitoring/ against the agent and the manifest: the scrape config and the PodMonitor
 * select the DaemonSet's pods and its `metrics` port; the Grafana dashboard asks only for families
 * the agent exposes, uses only the variables it defines, and every PromQL expression in it parses
 * (the pinned promtool, offline: each expression as a recording rule). That the expressions return
 * series from a real Prometheus scraping real agents is the multinode e2e's.
 */
import test from 'ava';
import { execa } from 'execa';
import yaml from 'js-yaml';
import { mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { AgentMetrics } from '../../src/daemon/http/metrics.js';
import { dashboardQueries, type Dashboard } from '../kit/dashboard.js';
import { upstreamBlocker, upstreamDir } from '../kit/upstream.js';

const ROOT = fileURLToPath(new URL('../../', import.meta.url));
const MON = join(ROOT, 'manifests/monitoring');
const promBlocker = upstreamBlocker('prometheus', ['promtool']);
const pTest = promBlocker ? test.skip : test;
if (promBlocker) console.warn(`promtool checks skipped: ${promBlocker}`);

const load = async (f: string) => yaml.load(await readFile(join(MON, f), 'utf8')) as any;
const daemonSet = async () =>
  (yaml.loadAll(await readFile(join(ROOT, 'manifests/kubenet.yaml'), 'utf8')) as any[]).find((d) => d?.kind === 'DaemonSet');
const dashboard = async () => JSON.parse(await readFile(join(MON, 'grafana-dashboard.json'), 'utf8')) as Dashboard;

test('the scrape config and the PodMonitor select the DaemonSet pods and their metrics port, labelled by node', async (t) => {
  const ds = await daemonSet();
  const labels = ds.spec.template.metadata.labels as Record<string, string>;
  const port = ds.spec.template.spec.containers[0].ports.find((p: any) => p.name === 'metrics');
  t.truthy(port, 'the DaemonSet declares the metrics port');
  const job = (await load('scrape-config.yaml')).scrape_configs.find((j: any) => j.job_name === 'kubenet');
  const sd = job.kubernetes_sd_configs[0];
  t.is(sd.role, 'pod');
  t.deepEqual(sd.namespaces.names, [ds.metadata.namespace]);
  const [k, v] = (sd.selectors[0].label as string).split('=');
  t.is(labels[k ?? ''], v, 'the label selector matches the pod template');
  t.true(
    job.relabel_configs.some(
      (r: any) => r.action === 'keep' && r.regex === 'metrics' && r.source_labels[0] === '__meta_kubernetes_pod_container_port_name',
    ),
  );
  t.true(job.relabel_configs.some((r: any) => r.target_label === 'node' && r.source_labels[0] === '__meta_kubernetes_pod_node_name'));
  t.false(
    job.relabel_configs.some((r: any) => ['pod', 'namespace'].includes(r.target_label)),
    "no target label would clash with the metrics' own pod and namespace",
  );
  const pm = await load('podmonitor.yaml');
  t.is(pm.kind, 'PodMonitor');
  for (const [key, value] of Object.entries(pm.spec.selector.matchLabels as Record<string, string>)) t.is(labels[key], value);
  t.deepEqual(pm.spec.namespaceSelector.matchNames, [ds.metadata.namespace]);
  t.is(pm.spec.podMetricsEndpoints[0].port, 'metrics');
  t.true(pm.spec.podMetricsEndpoints[0].relabelings.some((r: any) => r.targetLabel === 'node'));
});

test("prometheus.yaml embeds scrape-config.yaml's job as it is, and may discover pods and read /metrics", async (t) => {
  const docs = (yaml.loadAll(await readFile(join(MON, 'prometheus.yaml'), 'utf8')) as any[]).filter(Boolean);
  const cm = docs.find((d) => d.kind === 'ConfigMap');
  const embedded = yaml.load(cm.data['prometheus.yml']) as { scrape_configs: unknown[] };
  t.deepEqual(embedded.scrape_configs, (await load('scrape-config.yaml')).scrape_configs);
  const role = docs.find((d) => d.kind === 'ClusterRole');
  t.deepEqual(role.rules, [
    { apiGroups: [''], resources: ['pods'], verbs: ['get', 'list', 'watch'] },
    { nonResourceURLs: ['/metrics'], verbs: ['get'] },
  ]);
  const binding = docs.find((d) => d.kind === 'ClusterRoleBinding');
  const deploy = docs.find((d) => d.kind === 'Deployment');
  t.is(binding.subjects[0].name, deploy.spec.template.spec.serviceAccountName);
  t.is(binding.subjects[0].namespace, deploy.metadata.namespace);
});

test('the dashboard asks only for families the agent exposes, with the variables it defines, panels apart', async (t) => {
  const d = await dashboard();
  const exposed = new Set(
    [...(await new AgentMetrics().text([], 0, [])).body.matchAll(/^# TYPE (\S+) (\S+)/gm)].flatMap((m) =>
      m[2] === 'histogram' ? [`${m[1]}_bucket`, `${m[1]}_sum`, `${m[1]}_count`] : [m[1] ?? ''],
    ),
  );
  const queries = dashboardQueries(d);
  t.true(queries.length >= 15, `${queries.length} queries`);
  for (const q of queries) {
    const names = [...q.expr.matchAll(/\b(kubenet_[a-z_]+)\b/g)].map((m) => m[1] ?? '');
    t.true(names.length > 0 || q.expr.includes('up{'), q.expr);
    for (const n of names) t.true(exposed.has(n), `${q.title}: ${n} is not a family the agent exposes`);
    for (const v of q.expr.matchAll(/\$(\w+)/g))
      t.true(['node', 'namespace', '__rate_interval'].includes(v[1] ?? ''), `${q.title}: $${v[1]}`);
  }
  const vars = d.templating.list.map((v) => v.name);
  t.deepEqual(vars, ['datasource', 'node', 'namespace']);
  const ids = d.panels.map((p) => p.id);
  t.is(new Set(ids).size, ids.length, 'panel ids unique');
  for (const family of [
    'kubenet_pod_shaped_bytes_total',
    'kubenet_pod_bandwidth_limit_bits_per_second',
    'kubenet_pod_shaped_drops_total',
    'kubenet_pod_shaped_overlimits_total',
    'kubenet_node_bandwidth_committed_bits_per_second',
    'kubenet_cni_add_seconds_bucket',
    'kubenet_cni_del_seconds_bucket',
    'kubenet_cni_errors_total',
  ]) {
    t.true(
      queries.some((q) => q.expr.includes(family)),
      `the dashboard shows ${family}`,
    );
  }
});

pTest('promtool: every dashboard expression parses; the scrape config is a valid Prometheus config', async (t) => {
  const dir = await mkdtemp(join(tmpdir(), 'kmon-'));
  t.teardown(() => rm(dir, { recursive: true, force: true }));
  const queries = dashboardQueries(await dashboard());
  const rules = { groups: [{ name: 'dashboard', rules: queries.map((q, i) => ({ record: `kubenet:dashboard_${i}`, expr: q.query })) }] };
  await writeFile(join(dir, 'rules.yaml'), yaml.dump(rules));
  const promtool = join(upstreamDir('prometheus'), 'promtool');
  const r = await execa(promtool, ['check', 'rules', join(dir, 'rules.yaml')], { reject: false });
  t.is(r.exitCode, 0, r.stdout + r.stderr);
  t.regex(r.stdout, new RegExp(`SUCCESS: ${queries.length} rules found`));
  const scrape = await load('scrape-config.yaml');
  await writeFile(join(dir, 'prometheus.yml'), yaml.dump({ global: { scrape_interval: '15s' }, ...scrape }));
  const c = await execa(promtool, ['check', 'config', '--syntax-only', join(dir, 'prometheus.yml')], { reject: false });
  t.is(c.exitCode, 0, c.stdout + c.stderr);
});
