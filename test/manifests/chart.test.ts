/**
 * The Helm chart (manifests/chart), rendered by the pinned Helm: with its defaults it renders
 * manifests/kubenet.yaml exactly (the plain manifest is generated from it), its values schema is the
 * config-key table's, `helm lint` finds nothing, and each value does what it says: metricsAuth grows
 * the RBAC by the one binding it needs and switches the probe to HTTPS, the metrics address moves
 * the port or takes it away, a TLS Secret is mounted and named in the config, and values the agent
 * would refuse are refused at render time.
 */
import test from 'ava';
import { execa } from 'execa';
import yaml from 'js-yaml';
import { mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { loadConfig } from '../../src/daemon/config/config.js';
import { chartValuesSchema } from '../../hack/support/chart-schema.js';
import { upstreamBlocker, upstreamDir } from '../kit/upstream.js';

const ROOT = fileURLToPath(new URL('../../', import.meta.url));
const CHART = join(ROOT, 'manifests/chart');
const HELM = join(upstreamDir('helm'), 'helm');
const blocker = upstreamBlocker('helm', ['helm']);
const hTest = blocker ? test.skip : test;
if (blocker) console.warn(`chart tests skipped: ${blocker}`);

interface Doc {
  kind: string;
  metadata: { name: string; namespace?: string };
  roleRef?: { name: string };
  data?: Record<string, string>;
  spec?: any;
}

async function render(...set: string[]): Promise<Doc[]> {
  const r = await execa(HELM, ['template', 'kubenet', CHART, '--namespace', 'kube-system', ...set.flatMap((s) => ['--set', s])]);
  return (yaml.loadAll(r.stdout) as Array<Doc | null>).filter((d): d is Doc => d !== null);
}

const container = (docs: Doc[]) => docs.find((d) => d.kind === 'DaemonSet')?.spec.template.spec.containers[0];
const configOf = async (docs: Doc[]) => {
  const dir = await mkdtemp(join(tmpdir(), 'kchart-'));
  try {
    const file = join(dir, 'config.yaml');
    await writeFile(file, docs.find((d) => d.kind === 'ConfigMap')?.data?.['config.yaml'] ?? '');
    return await loadConfig({ file, flags: {}, env: { NODE_NAME: 'node-1' } });
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
};

hTest('the default values render manifests/kubenet.yaml exactly; values.schema.json is the config-key table', async (t) => {
  const r = await execa('bash', [join(ROOT, 'hack/render-manifest.sh'), '--stdout']);
  t.is(`${r.stdout}\n`, await readFile(join(ROOT, 'manifests/kubenet.yaml'), 'utf8'), 'run bash hack/render-manifest.sh');
  t.deepEqual(
    JSON.parse(await readFile(join(CHART, 'values.schema.json'), 'utf8')),
    chartValuesSchema(),
    'run bash hack/render-manifest.sh',
  );
  const chart = yaml.load(await readFile(join(CHART, 'Chart.yaml'), 'utf8')) as { version: string; appVersion: string };
  const pkg = JSON.parse(await readFile(join(ROOT, 'package.json'), 'utf8')) as { version: string };
  t.is(chart.appVersion, pkg.version, "the chart's appVersion is the package's (the image tag)");
  t.is(chart.version, pkg.version);
});

hTest('helm lint: no warning, no error', async (t) => {
  const r = await execa(HELM, ['lint', CHART, '--strict'], { reject: false });
  t.is(r.exitCode, 0, r.stdout + r.stderr);
  t.notRegex(r.stdout, /\[(WARNING|ERROR)\]/);
});

hTest(
  'metricsAuth kubernetes: exactly one more object, the auth-delegator binding; the probe speaks HTTPS; the config loads',
  async (t) => {
    const plain = await render();
    const auth = await render('config.metricsAuth=kubernetes');
    const key = (d: Doc) => `${d.kind}/${d.metadata.namespace ?? ''}/${d.metadata.name}`;
    const added = auth.filter((d) => !plain.some((p) => key(p) === key(d)));
    t.deepEqual(added.map(key), ['ClusterRoleBinding//kubenet-auth-delegator']);
    t.is(added[0]?.roleRef?.name, 'system:auth-delegator');
    t.is(container(auth).livenessProbe.httpGet.scheme, 'HTTPS');
    t.is(container(plain).livenessProbe.httpGet.scheme, 'HTTP');
    t.is((await configOf(auth)).metricsAuth, 'kubernetes');
  },
);

hTest('the metrics address moves the declared port, and "off" takes the port and the liveness probe away', async (t) => {
  const moved = await render('config.metricsAddress=127.0.0.1:9999');
  t.deepEqual(container(moved).ports, [{ name: 'metrics', containerPort: 9999, protocol: 'TCP' }]);
  t.is((await configOf(moved)).metricsAddress, '127.0.0.1:9999');
  const off = await render('config.metricsAddress=off');
  t.is(container(off).ports, undefined);
  t.is(container(off).livenessProbe, undefined);
  t.truthy(container(off).readinessProbe, 'readiness stays (the socket)');
});

hTest('a TLS Secret is mounted and named in the config; image, tag and resources follow the values', async (t) => {
  const docs = await render(
    'metricsTLSSecret=kubenet-metrics-tls',
    'image.repository=registry.example/kubenet-ts',
    'image.tag=9.9.9',
    'resources.limits.memory=1Gi',
  );
  const c = container(docs);
  const ds = docs.find((d) => d.kind === 'DaemonSet')?.spec.template.spec;
  t.is(c.image, 'registry.example/kubenet-ts:9.9.9');
  t.is(c.resources.limits.memory, '1Gi');
  t.true(c.volumeMounts.some((m: any) => m.name === 'metrics-tls' && m.mountPath === '/etc/kubenet/metrics-tls' && m.readOnly === true));
  t.true(ds.volumes.some((v: any) => v.name === 'metrics-tls' && v.secret?.secretName === 'kubenet-metrics-tls'));
  const config = await configOf(docs);
  t.is(config.metricsTLSCertFile, '/etc/kubenet/metrics-tls/tls.crt');
  t.is(config.metricsTLSKeyFile, '/etc/kubenet/metrics-tls/tls.key');
  t.is(c.livenessProbe.httpGet.scheme, 'HTTPS');
});

hTest('values the agent would refuse are refused when the chart renders, naming the value', async (t) => {
  for (const [set, why] of [
    ['config.routes=bogus', /\/config\/routes.*one of 'none', 'direct'/],
    ['config.podCidr=10.0.0.0/24', /additional properties 'podCidr' not allowed/],
    ['config.mtu=big', /\/config\/mtu/],
    ['image.pullPolicy=Sometimes', /\/image\/pullPolicy/],
  ] as const) {
    const r = await execa(HELM, ['template', 'kubenet', CHART, '--set', set], { reject: false });
    t.not(r.exitCode, 0, set);
    t.regex(r.stderr, why, set);
  }
});
