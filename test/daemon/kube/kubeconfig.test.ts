/**
 * The agent's own kubeconfig loader (src/daemon/kube/kubeconfig.ts) against the fake API server over
 * http and over TLS (a throwaway PKI made with openssl): bearer tokens, token files re-read,
 * basic auth, client certificates (files and -data), CA verification and insecure-skip-tls-verify,
 * the in-cluster service account; and every refused kubeconfig with its ConfigError (exec credential
 * plugins: exec-credential.test.ts).
 * No root needed; no traffic except to the fake on 127.0.0.1.
 */
import test, { type ExecutionContext } from 'ava';
import yaml from 'js-yaml';
import { mkdir, readFile, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { pino } from 'pino';
import { ConfigError } from '../../../src/errors.js';
import { inClusterCredentials, kubeconfigCredentials, kubectlCredentials } from '../../../src/daemon/kube/kubeconfig.js';
import { KubeApi, loadKubeConfig } from '../../../src/daemon/kube/watch.js';
import { ApiEndpoints, endpointUrls } from '../../../src/daemon/kube/api-endpoints.js';
import { NodeWatchPodCidrSource } from '../../../src/daemon/pod-cidr/node-watch.js';
import { FakeApiServer, node, type FakeTls } from '../../kit/fake-apiserver.js';
import { makeTmpDir, rmrf } from '../../kit/kernel.js';
import { base64Of, makePki, type Pki } from '../../kit/pki.js';

const V4 = '10.244.1.0/24';
const NODES = '/api/v1/nodes';

let root = '';
let pki: Pki;
test.before(async () => {
  root = await makeTmpDir('kfx-kubeconfig');
  await mkdir(join(root, 'pki'));
  pki = await makePki(join(root, 'pki'));
});
test.after.always(async () => {
  if (root) await rmrf(root);
});

let n = 0;
/** Writes a kubeconfig (as YAML) with one cluster, user and context into a fresh directory; returns its path. */
async function kubeconfig(
  cluster: Record<string, unknown>,
  user: Record<string, unknown>,
  extra: Record<string, unknown> = {},
): Promise<string> {
  const dir = join(root, `k${++n}`);
  await mkdir(dir);
  const path = join(dir, 'config');
  const doc = {
    apiVersion: 'v1',
    kind: 'Config',
    clusters: [{ name: 'c', cluster }],
    users: [{ name: 'u', user }],
    contexts: [{ name: 'ctx', context: { cluster: 'c', user: 'u' } }],
    'current-context': 'ctx',
    ...extra,
  };
  await writeFile(path, yaml.dump(doc, { skipInvalid: true })); // an undefined key is left out
  return path;
}

async function fakeApi(t: ExecutionContext, tls?: FakeTls): Promise<FakeApiServer> {
  const api = await FakeApiServer.start(tls);
  t.teardown(() => api.stop());
  api.setNode(node('node-a', { podCIDR: V4 }));
  return api;
}

function capturingLogger() {
  const lines: Array<{ msg: string; err?: { message: string } }> = [];
  const logger = pino({ level: 'debug' }, { write: (s: string) => void lines.push(JSON.parse(s) as (typeof lines)[number]) });
  return { logger, lines };
}

/** Starts a Node source on `opts`; resolves with the first CIDR (or fails after `ms`). */
async function firstCidr(
  t: ExecutionContext,
  opts: { kubeconfig?: string; kubeConfig?: ReturnType<typeof inClusterCredentials> },
  ms = 10_000,
) {
  const log = capturingLogger();
  const source = new NodeWatchPodCidrSource({ nodeName: 'node-a', logger: log.logger, retryMinMs: 20, retryMaxMs: 200, ...opts });
  t.teardown(() => source.stop());
  const got = new Promise<string>((ok) => void source.start(ok));
  const cidr = await Promise.race([got, sleep(ms, undefined, { ref: false })]);
  return { cidr, lines: log.lines };
}

test('kubeconfig over http (insecure-skip-tls-verify): bearer token; basic auth', async (t) => {
  const api = await fakeApi(t);
  const path = await kubeconfig({ server: api.url, 'insecure-skip-tls-verify': true }, { token: 'tok-1' });
  t.is((await firstCidr(t, { kubeconfig: path })).cidr, V4);
  t.is(api.requests[0]?.authorization, 'Bearer tok-1');

  const basic = await kubeconfig({ server: api.url, 'insecure-skip-tls-verify': true }, { username: 'ann', password: 'p:w' });
  await new KubeApi(loadKubeConfig({ kubeconfig: basic })).getJson(NODES);
  t.is(api.requests.at(-1)?.authorization, `Basic ${Buffer.from('ann:p:w').toString('base64')}`);
});

test('kubeconfig tokenFile (relative to the kubeconfig): read again once the copy is older than tokenRereadMs', async (t) => {
  const api = await fakeApi(t);
  const path = await kubeconfig({ server: api.url, 'insecure-skip-tls-verify': true }, { tokenFile: 'token' });
  const tokenPath = join(path, '..', 'token');
  await writeFile(tokenPath, 'first\n');
  const cached = new KubeApi(kubeconfigCredentials(path)); // default: 1 min
  const fresh = new KubeApi(kubeconfigCredentials(path, { tokenRereadMs: 0 }));
  await cached.getJson(NODES);
  await fresh.getJson(NODES);
  await writeFile(tokenPath, 'second\n');
  await cached.getJson(NODES);
  await fresh.getJson(NODES);
  t.deepEqual(
    api.requests.map((r) => r.authorization),
    ['Bearer first', 'Bearer first', 'Bearer first', 'Bearer second'],
  );
  // A re-read that fails keeps the token it had.
  await rmrf(tokenPath);
  await fresh.getJson(NODES);
  t.is(api.requests.at(-1)?.authorization, 'Bearer second');
});

test('kubeconfig with a client certificate over TLS: CA and certificate files, then the -data forms', async (t) => {
  const api = await fakeApi(t, {
    key: await readText(pki.serverKey),
    cert: await readText(pki.serverCert),
    ca: await readText(pki.caCert),
    requireClientCert: true,
  });
  const files = await kubeconfig(
    { server: api.url, 'certificate-authority': pki.caCert },
    { 'client-certificate': pki.clientCert, 'client-key': pki.clientKey },
  );
  t.is((await firstCidr(t, { kubeconfig: files })).cidr, V4);
  t.is(api.requests[0]?.clientCert, 'system:node:node-a');
  t.is(api.requests[0]?.authorization, undefined);

  const inline = await kubeconfig(
    { server: api.url.replace('127.0.0.1', 'localhost'), 'certificate-authority-data': await base64Of(pki.caCert) },
    { 'client-certificate-data': await base64Of(pki.clientCert), 'client-key-data': await base64Of(pki.clientKey) },
  );
  const before = api.requests.length;
  await new KubeApi(loadKubeConfig({ kubeconfig: inline })).getJson(NODES);
  t.is(api.requests[before]?.clientCert, 'system:node:node-a');
});

test("kubectl's search (kubectl kubenet): --kubeconfig, else $KUBECONFIG's files merged (first wins, missing skipped, paths relative to their own file), else ~/.kube/config; --context", async (t) => {
  const [api1, api2] = [await fakeApi(t), await fakeApi(t)];
  const one = await kubeconfig({ server: api1.url, 'insecure-skip-tls-verify': true }, { tokenFile: 'tok' }, { 'current-context': 'ctx' });
  await writeFile(join(one, '..', 'tok'), 'tok-1\n');
  // The second file: its own current context, a context of the same name as the first's (shadowed), and one of its own.
  const twoDir = join(root, `k${++n}`);
  await mkdir(join(twoDir, '.kube'), { recursive: true });
  const two = join(twoDir, '.kube', 'config');
  const doc = {
    clusters: [
      { name: 'c', cluster: { server: 'http://127.0.0.1:1', 'insecure-skip-tls-verify': true } },
      { name: 'c2', cluster: { server: api2.url, 'insecure-skip-tls-verify': true } },
    ],
    users: [{ name: 'u2', user: { token: 'tok-2' } }],
    contexts: [
      { name: 'ctx', context: { cluster: 'c2', user: 'u2' } },
      { name: 'other', context: { cluster: 'c2', user: 'u2' } },
    ],
    'current-context': 'other',
  };
  await writeFile(two, yaml.dump(doc));
  const get = async (o: Parameters<typeof kubectlCredentials>[0]) => {
    const kc = kubectlCredentials(o);
    await new KubeApi(kc).getJson(NODES);
    return kc.server === api1.url
      ? `api1 ${api1.requests.at(-1)?.authorization}`
      : kc.server === api2.url
        ? `api2 ${api2.requests.at(-1)?.authorization}`
        : kc.server;
  };
  const list = [join(root, 'missing'), one, two].join(':');
  t.is(
    await get({ env: { KUBECONFIG: list } }),
    'api1 Bearer tok-1',
    "the first file's current context, cluster and user (its tokenFile relative to it)",
  );
  t.is(await get({ env: { KUBECONFIG: list }, context: 'other' }), 'api2 Bearer tok-2', 'a context only the second file has');
  t.is(await get({ env: { KUBECONFIG: [two, one].join(':') } }), 'api2 Bearer tok-2', 'the other order: the other file wins');
  t.is(await get({ env: { KUBECONFIG: list }, kubeconfig: two }), 'api2 Bearer tok-2', '--kubeconfig wins over $KUBECONFIG');
  t.is(await get({ env: { KUBECONFIG: list }, kubeconfig: one, context: 'ctx' }), 'api1 Bearer tok-1');
  t.is(await get({ env: {}, home: twoDir }), 'api2 Bearer tok-2', 'no $KUBECONFIG: ~/.kube/config');
  t.throws(() => kubectlCredentials({ env: { KUBECONFIG: join(root, 'missing') } }), {
    instanceOf: ConfigError,
    message: /none of the kubeconfig files in \$KUBECONFIG exists/,
  });
  t.throws(() => kubectlCredentials({ env: { KUBECONFIG: list }, context: 'nope' }), {
    instanceOf: ConfigError,
    message: /no context named "nope"/,
  });
  t.throws(() => kubectlCredentials({ kubeconfig: join(root, 'missing') }), { instanceOf: ConfigError, message: /cannot load kubeconfig/ });
});

test('TLS: a server certificate the configured CA did not sign is refused; insecure-skip-tls-verify accepts it', async (t) => {
  const api = await fakeApi(t, { key: await readText(pki.serverKey), cert: await readText(pki.serverCert) });
  const wrongCa = await kubeconfig({ server: api.url, 'certificate-authority': pki.otherCaCert }, { token: 't' });
  const refused = await firstCidr(t, { kubeconfig: wrongCa }, 1500);
  t.is(refused.cidr, undefined);
  const failure = refused.lines.find((l) => l.msg.includes('list/watch failed'));
  t.regex(failure?.err?.message ?? '', /certificate/i);
  t.is(api.requests.length, 0, 'no request got past the handshake');

  const insecure = await kubeconfig({ server: api.url, 'insecure-skip-tls-verify': true }, { token: 't' });
  t.is((await firstCidr(t, { kubeconfig: insecure })).cidr, V4);
  t.is(api.requests[0]?.authorization, 'Bearer t');
});

test('in cluster: KUBERNETES_SERVICE_HOST/PORT, the service account CA and token (re-read); IPv6 hosts in brackets', async (t) => {
  const api = await fakeApi(t, { key: await readText(pki.serverKey), cert: await readText(pki.serverCert) });
  const sa = join(root, 'sa');
  await mkdir(sa, { recursive: true });
  await writeFile(join(sa, 'ca.crt'), await readText(pki.caCert));
  await writeFile(join(sa, 'token'), 'sa-token-1');
  const env = { KUBERNETES_SERVICE_HOST: '127.0.0.1', KUBERNETES_SERVICE_PORT: String(api.port) };
  const creds = inClusterCredentials({ env, serviceAccountDir: sa, tokenRereadMs: 0 });
  t.is(creds.getCurrentCluster().server, `https://127.0.0.1:${api.port}`);
  t.is((await firstCidr(t, { kubeConfig: creds })).cidr, V4);
  t.is(api.requests[0]?.authorization, 'Bearer sa-token-1');
  await writeFile(join(sa, 'token'), 'sa-token-2');
  await new KubeApi(creds).getJson(NODES);
  t.is(api.requests.at(-1)?.authorization, 'Bearer sa-token-2');

  const v6 = inClusterCredentials({ env: { KUBERNETES_SERVICE_HOST: 'fd00::1', KUBERNETES_SERVICE_PORT: '443' }, serviceAccountDir: sa });
  t.is(v6.getCurrentCluster().server, 'https://[fd00::1]:443');
});

test('refused configurations are ConfigErrors naming the kubeconfig and the field', async (t) => {
  const server = 'https://127.0.0.1:6443';
  const refused = async (
    cluster: Record<string, unknown>,
    user: Record<string, unknown>,
    message: RegExp,
    extra: Record<string, unknown> = {},
  ) => {
    const path = await kubeconfig(cluster, user, extra);
    const err = t.throws(() => loadKubeConfig({ kubeconfig: path }), { instanceOf: ConfigError });
    t.true(err.message.includes(path), err.message);
    t.regex(err.message, message);
  };
  // Exec plugins are supported (exec-credential.test.ts); one kubectl would refuse is refused too.
  await refused(
    { server },
    { exec: { apiVersion: 'client.authentication.k8s.io/v1', command: 'aws-iam-authenticator' } },
    /user "u": exec.interactiveMode \(aws-iam-authenticator\): must be given/,
  );
  await refused(
    { server },
    { 'auth-provider': { name: 'oidc' } },
    /auth-provider \(oidc\): auth-provider plugins are not supported by kubenet; use an OIDC exec plugin/,
  );
  await refused({ server }, { token: 't', as: 'admin' }, /as: impersonation is not supported/);
  await refused({ server, 'proxy-url': 'http://proxy:3128' }, { token: 't' }, /proxy-url is not supported/);
  await refused({ server: 'http://127.0.0.1:8080' }, { token: 't' }, /http:\/\/ server needs insecure-skip-tls-verify/);
  await refused({ server: 'ftp://x' }, { token: 't' }, /has no http\(s\) server/);
  await refused({}, { token: 't' }, /has no http\(s\) server/);
  await refused({ server }, { 'client-certificate': pki.clientCert }, /a client certificate needs both/);
  await refused({ server }, { tokenFile: 'no-such-token' }, /cannot read token file .*no-such-token/);
  await refused(
    { server, 'certificate-authority': 'missing-ca.crt' },
    { token: 't' },
    /cannot read certificate-authority .*missing-ca\.crt/,
  );
  await refused({ server }, { token: 't' }, /has no current cluster/, { 'current-context': undefined });
  await refused({ server }, { token: 't' }, /no context named "other"/, { 'current-context': 'other' });
  await refused({ server }, { token: 't' }, /no user named "v"/, { contexts: [{ name: 'ctx', context: { cluster: 'c', user: 'v' } }] });

  const garbage = join(root, 'garbage');
  await writeFile(garbage, 'clusters: [unclosed');
  t.throws(() => loadKubeConfig({ kubeconfig: garbage }), { instanceOf: ConfigError, message: /cannot load kubeconfig .*garbage/ });
  t.throws(() => loadKubeConfig({ kubeconfig: join(root, 'absent') }), {
    instanceOf: ConfigError,
    message: /cannot load kubeconfig .*absent/,
  });

  t.throws(() => inClusterCredentials({ env: {} }), {
    instanceOf: ConfigError,
    message: /not running in a pod \(KUBERNETES_SERVICE_HOST\/PORT unset\)/,
  });
  t.throws(
    () =>
      inClusterCredentials({
        env: { KUBERNETES_SERVICE_HOST: '10.0.0.1', KUBERNETES_SERVICE_PORT: '443' },
        serviceAccountDir: join(root, 'no-sa'),
      }),
    {
      instanceOf: ConfigError,
      message: /\(in-cluster\): cannot read token file .*no-sa\/token/,
    },
  );
});

function readText(path: string): Promise<string> {
  return readFile(path, 'utf8');
}

test("the API servers' own addresses: endpointUrls takes the ready endpoints of the https port (IPv6 in brackets)", (t) => {
  t.deepEqual(
    endpointUrls({
      endpoints: [
        { addresses: ['10.0.0.2'] },
        { addresses: ['10.0.0.3'], conditions: { ready: false } },
        { addresses: ['fd00::2'], conditions: { ready: true } },
      ],
      ports: [{ name: 'https', port: 6443 }],
    }),
    ['https://10.0.0.2:6443', 'https://[fd00::2]:6443'],
  );
  t.deepEqual(endpointUrls({ endpoints: [{ addresses: ['10.0.0.2'] }], ports: [] }), [], 'no port: nothing');
  t.deepEqual(endpointUrls({ endpoints: [], ports: [{ name: 'https', port: 6443 }] }), []);
});

test("ApiEndpoints: requests go to the API server's own address first (TLS verified against the Service host), move on when it refuses, come back when the Service address refuses; an empty EndpointSlice keeps the addresses", async (t) => {
  const tls = { key: await readText(pki.serverKey), cert: await readText(pki.serverCert) };
  const service = await fakeApi(t, tls);
  const own = await fakeApi(t, tls);
  for (const a of [service, own]) a.setNode(node('node-a', { podCIDR: V4 }));
  const sa = join(root, 'sa-endpoints');
  await mkdir(sa, { recursive: true });
  await writeFile(join(sa, 'ca.crt'), await readText(pki.caCert));
  await writeFile(join(sa, 'token'), 'sa-token');
  // The Service address by name (the certificate names localhost and 127.0.0.1); the own address dialled by IP.
  const creds = inClusterCredentials({
    env: { KUBERNETES_SERVICE_HOST: 'localhost', KUBERNETES_SERVICE_PORT: String(service.port) },
    serviceAccountDir: sa,
  });
  const endpoints = new ApiEndpoints(creds);
  const api = new KubeApi(endpoints);
  await api.getJson(NODES);
  t.is(service.requests.length, 1, 'no address known yet: the Service address');
  endpoints.setSlice({ endpoints: [{ addresses: ['127.0.0.1'] }], ports: [{ name: 'https', port: own.port }] });
  t.deepEqual(endpoints.targets(), [`https://127.0.0.1:${own.port}`, `https://localhost:${service.port}`]);
  await api.getJson(NODES);
  t.is(own.requests.length, 1, 'the own address, verified against the Service host');
  t.is(own.requests[0]?.authorization, 'Bearer sa-token');
  endpoints.setSlice({ endpoints: [], ports: [{ name: 'https', port: own.port }] });
  t.deepEqual(
    endpoints.targets(),
    [`https://127.0.0.1:${own.port}`, `https://localhost:${service.port}`],
    'an API server shutting down empties the slice: the addresses stay',
  );
  await own.stop();
  const away = async () =>
    t.regex(String(((await t.throwsAsync(api.getJson(NODES))) as NodeJS.ErrnoException | undefined)?.code), /^ECONN(REFUSED|RESET)$/);
  await away();
  await api.getJson(NODES);
  t.is(service.requests.length, 2, 'refused: the next address');
  await own.start();
  await service.stop();
  await away();
  await api.getJson(NODES);
  t.is(own.requests.length, 2, 'and round again');
});
