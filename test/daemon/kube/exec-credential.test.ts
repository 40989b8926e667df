/**
 * Exec credential plugins (src/daemon/kube/exec-credential.ts through kubeconfig.ts's loader and
 * KubeApi) against a real plugin: a node script the test writes into a temp dir, which records each
 * run (its KUBERNETES_EXEC_INFO, args and env) and answers what the test's plan.json says; the API
 * server is the fake on 127.0.0.1 (http, or TLS with client certificates from a throwaway PKI),
 * which records the Authorization header and the client certificate of each request.
 * Covered: a token from the plugin, cached across requests (one run for concurrent ones), re-run
 * once expired, re-run once on a 401, the plugin's failures (named command, exit code, stderr,
 * installHint), interactiveMode without a terminal, provideClusterInfo, a client certificate from
 * the plugin, kubectl's precedence (a token file or a certificate in the kubeconfig wins), the
 * refused configurations. No root; no traffic except to 127.0.0.1.
 */
import test, { type ExecutionContext } from 'ava';
import yaml from 'js-yaml';
import { chmod, mkdir, readFile, rm, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { ConfigError } from '../../../src/errors.js';
import { ExecPluginError, type ExecOptions } from '../../../src/daemon/kube/exec-credential.js';
import { kubeconfigCredentials, kubectlCredentials } from '../../../src/daemon/kube/kubeconfig.js';
import { KubeApi, KubeApiError } from '../../../src/daemon/kube/watch.js';
import { FakeApiServer, node, type FakeTls } from '../../kit/fake-apiserver.js';
import { makeTmpDir, rmrf } from '../../kit/kernel.js';
import { base64Of, makePki, type Pki } from '../../kit/pki.js';

const NODES = '/api/v1/nodes';
const V1 = 'client.authentication.k8s.io/v1';
const V1BETA1 = 'client.authentication.k8s.io/v1beta1';

let root = '';
let pki: Pki;
test.before(async () => {
  root = await makeTmpDir('kfx-exec-cred');
  await mkdir(join(root, 'pki'));
  pki = await makePki(join(root, 'pki'));
});
test.after.always(async () => {
  if (root) await rmrf(root);
});

/** What the plugin does on its next runs (plan.json beside it). */
interface Plan {
  /** Exit with this code after writing `stderr`. */
  exitCode?: number;
  stderr?: string;
  /** The token is `${tokenPrefix}-${run number}` (default "tok"); false: no token. */
  tokenPrefix?: string | false;
  /** The prefix of some runs' tokens, by run number (1 is the first). */
  prefixOfRun?: Record<number, string>;
  /** Answer this certificate and key (PEM file paths). */
  certFile?: string;
  keyFile?: string;
  /** expirationTimestamp this far from now (RFC 3339, with milliseconds). */
  expiresInMs?: number;
  /** Answer with this apiVersion instead of the one asked for. */
  apiVersion?: string;
  /** Print this instead of an ExecCredential. */
  raw?: string;
}

/** What one run of the plugin saw. */
interface Run {
  info: { apiVersion: string; kind: string; spec: { interactive?: boolean; cluster?: Record<string, unknown> } } | null;
  args: string[];
  greeting: string | null;
}

const PLUGIN = `
const fs = require('node:fs');
const path = require('node:path');
const runs = path.join(__dirname, 'runs.jsonl');
const info = process.env.KUBERNETES_EXEC_INFO;
fs.appendFileSync(runs, JSON.stringify({ info: info ? JSON.parse(info) : null, args: process.argv.slice(2), greeting: process.env.PLUGIN_GREETING ?? null }) + '\\n');
const n = fs.readFileSync(runs, 'utf8').trim().split('\\n').length;
const plan = JSON.parse(fs.readFileSync(path.join(__dirname, 'plan.json'), 'utf8'));
if (plan.stderr) process.stderr.write(plan.stderr + '\\n');
if (plan.exitCode) process.exit(plan.exitCode);
if (plan.raw !== undefined) { process.stdout.write(plan.raw); process.exit(0); }
const status = {};
if (plan.tokenPrefix !== false) status.token = ((plan.prefixOfRun ?? {})[n] ?? plan.tokenPrefix ?? 'tok') + '-' + n;
if (plan.certFile) {
  status.clientCertificateData = fs.readFileSync(plan.certFile, 'utf8');
  status.clientKeyData = fs.readFileSync(plan.keyFile, 'utf8');
}
if (plan.expiresInMs !== undefined) status.expirationTimestamp = new Date(Date.now() + plan.expiresInMs).toISOString();
process.stdout.write(JSON.stringify({ apiVersion: plan.apiVersion ?? JSON.parse(info).apiVersion, kind: 'ExecCredential', status }));
`;

interface Plugin {
  dir: string;
  /** The plugin's path. */
  command: string;
  plan(p: Plan): Promise<void>;
  runs(): Promise<Run[]>;
}

let n = 0;
/** A fresh directory holding the plugin script (`kubenet-test-plugin`) and its plan. */
async function plugin(t: ExecutionContext, plan: Plan = {}): Promise<Plugin> {
  const dir = join(root, `p${++n}`);
  await mkdir(dir);
  t.teardown(() => rm(dir, { recursive: true, force: true }));
  const command = join(dir, 'kubenet-test-plugin');
  await writeFile(command, `#!${process.execPath}\n${PLUGIN}`);
  await chmod(command, 0o755);
  const p: Plugin = {
    dir,
    command,
    plan: (next) => writeFile(join(dir, 'plan.json'), JSON.stringify(next)),
    runs: async () => {
      const text = await readFile(join(dir, 'runs.jsonl'), 'utf8').catch(() => '');
      return text
        .trim()
        .split('\n')
        .filter((l) => l !== '')
        .map((l) => JSON.parse(l) as Run);
    },
  };
  await p.plan(plan);
  return p;
}

/** A kubeconfig beside the plugin with one cluster, user and context. */
async function kubeconfig(p: Plugin, cluster: Record<string, unknown>, user: Record<string, unknown>): Promise<string> {
  const path = join(p.dir, 'config');
  const doc = {
    apiVersion: 'v1',
    kind: 'Config',
    clusters: [{ name: 'c', cluster }],
    users: [{ name: 'u', user }],
    contexts: [{ name: 'ctx', context: { cluster: 'c', user: 'u' } }],
    'current-context': 'ctx',
  };
  await writeFile(path, yaml.dump(doc, { skipInvalid: true })); // an undefined key is left out
  return path;
}

const exec = (p: Plugin, extra: Record<string, unknown> = {}) => ({
  exec: { apiVersion: V1, command: p.command, interactiveMode: 'Never', ...extra },
});

async function fakeApi(t: ExecutionContext, tls?: FakeTls): Promise<FakeApiServer> {
  const api = await FakeApiServer.start(tls);
  t.teardown(() => api.stop());
  api.setNode(node('node-a', { podCIDR: '10.244.1.0/24' }));
  return api;
}

/** The plugin's stderr as the loader forwards it, and no terminal on stdin. */
function quiet(): ExecOptions & { seen: string[] } {
  const seen: string[] = [];
  return { seen, stdinIsTerminal: false, stderr: (s) => void seen.push(s) };
}

const http = (api: FakeApiServer) => ({ server: api.url, 'insecure-skip-tls-verify': true });

test('a token from the plugin: KUBERNETES_EXEC_INFO, args and env as configured; the credential cached across requests, one run for concurrent ones', async (t) => {
  const api = await fakeApi(t);
  const p = await plugin(t);
  const path = await kubeconfig(
    p,
    http(api),
    exec(p, { args: ['get-token', '--cluster', 'x'], env: [{ name: 'PLUGIN_GREETING', value: 'hi' }] }),
  );
  const kube = new KubeApi(kubeconfigCredentials(path, { exec: quiet() }));
  await Promise.all([kube.getJson(NODES), kube.getJson(NODES), kube.getJson(NODES)]);
  await kube.getJson(NODES);
  t.deepEqual(
    api.requests.map((r) => r.authorization),
    ['Bearer tok-1', 'Bearer tok-1', 'Bearer tok-1', 'Bearer tok-1'],
  );
  const runs = await p.runs();
  t.is(runs.length, 1, 'one run for all four requests');
  t.deepEqual(runs[0], {
    info: { kind: 'ExecCredential', apiVersion: V1, spec: { interactive: false } },
    args: ['get-token', '--cluster', 'x'],
    greeting: 'hi',
  });
});

test('an expired credential runs the plugin again; one with an expiry still ahead is kept', async (t) => {
  const api = await fakeApi(t);
  const p = await plugin(t, { expiresInMs: 1500 });
  const kube = new KubeApi(kubeconfigCredentials(await kubeconfig(p, http(api), exec(p)), { exec: quiet() }));
  await kube.getJson(NODES);
  await kube.getJson(NODES);
  t.is((await p.runs()).length, 1, 'still valid: cached');
  await sleep(1600);
  await kube.getJson(NODES);
  t.is((await p.runs()).length, 2, 'expired: run again');
  t.deepEqual(
    api.requests.map((r) => r.authorization),
    ['Bearer tok-1', 'Bearer tok-1', 'Bearer tok-2'],
  );
  // A credential that comes already expired is used for its request, and the next runs the plugin again.
  await p.plan({ expiresInMs: -1000 });
  await sleep(1600); // tok-2 expires
  await kube.getJson(NODES);
  await kube.getJson(NODES);
  t.is((await p.runs()).length, 4);
});

test('a 401 runs the plugin again and sends the request once more; a second 401 is the answer', async (t) => {
  const api = await fakeApi(t);
  // The plugin's first answer is refused: it runs again, and its new token is accepted.
  const p = await plugin(t, { prefixOfRun: { 1: 'revoked' } });
  const kube = new KubeApi(kubeconfigCredentials(await kubeconfig(p, http(api), exec(p)), { exec: quiet() }));
  api.failWith = (r) => (r.authorization?.startsWith('Bearer revoked') ? 401 : undefined);
  await kube.getJson(NODES);
  t.deepEqual(
    api.requests.map((r) => r.authorization),
    ['Bearer revoked-1', 'Bearer tok-2'],
  );
  t.is((await p.runs()).length, 2);
  // Every answer refused: one re-run, one more request, then the 401 is the caller's.
  api.requests.length = 0;
  api.failWith = () => 401;
  const err = await t.throwsAsync(kube.getJson(NODES), { instanceOf: KubeApiError });
  t.is(err.status, 401);
  t.deepEqual(
    api.requests.map((r) => r.authorization),
    ['Bearer tok-2', 'Bearer tok-3'],
  );
  t.is((await p.runs()).length, 3);
});

test("a plugin that fails: ExecPluginError naming the command, its exit code, its stderr and the kubeconfig's installHint; its stderr also forwarded", async (t) => {
  const api = await fakeApi(t);
  const p = await plugin(t, { exitCode: 3, stderr: 'error: you must be logged in to the server' });
  const hint = 'Install the test plugin: see https://example.invalid/install';
  const opts = quiet();
  const kube = new KubeApi(kubeconfigCredentials(await kubeconfig(p, http(api), exec(p, { installHint: hint })), { exec: opts }));
  const err = await t.throwsAsync(kube.getJson(NODES), { instanceOf: ExecPluginError });
  t.is(err.command, p.command);
  t.is(err.exitCode, 3);
  t.true(err.message.includes(`exec plugin ${p.command} failed with exit code 3`), err.message);
  t.true(err.message.includes('you must be logged in'), err.message);
  t.true(err.message.includes(hint), err.message);
  t.true(err.message.includes('user "u"'), err.message);
  t.is(opts.seen.join(''), 'error: you must be logged in to the server\n');
  t.is(api.requests.length, 0, 'no request without a credential');

  // Not installed: named, with the hint.
  const missing = join(p.dir, 'no-such-plugin');
  const gone = new KubeApi(
    kubeconfigCredentials(await kubeconfig(p, http(api), exec(p, { command: missing, installHint: hint })), { exec: quiet() }),
  );
  const notFound = await t.throwsAsync(gone.getJson(NODES), { instanceOf: ExecPluginError });
  t.regex(notFound.message, /exec plugin .*no-such-plugin was not found/);
  t.true(notFound.message.includes(hint), notFound.message);

  // Answers that are not credentials.
  const bad = async (plan: Plan, message: RegExp) => {
    await p.plan(plan);
    const k = new KubeApi(kubeconfigCredentials(await kubeconfig(p, http(api), exec(p)), { exec: quiet() }));
    await t.throwsAsync(k.getJson(NODES), { instanceOf: ExecPluginError, message });
  };
  await bad({ raw: 'not json' }, /printed no ExecCredential JSON/);
  await bad(
    { apiVersion: V1BETA1 },
    /answered with apiVersion "client.authentication.k8s.io\/v1beta1", not the client.authentication.k8s.io\/v1/,
  );
  await bad({ tokenPrefix: false }, /answered neither a token nor a client certificate/);
  const raw = (status: unknown) => JSON.stringify({ apiVersion: V1, kind: 'ExecCredential', status });
  await bad({ raw: raw(undefined) }, /answered an ExecCredential without a status/);
  await bad({ raw: raw({ clientCertificateData: 'x' }) }, /answered clientCertificateData without clientKeyData/);
  await bad({ raw: raw({ token: 'a', expirationTimestamp: 'tomorrow' }) }, /expirationTimestamp that is not an RFC 3339 time: "tomorrow"/);
});

test('interactiveMode: Always without a terminal fails before running the plugin; IfAvailable runs it non-interactive; v1beta1 defaults to IfAvailable', async (t) => {
  const api = await fakeApi(t);
  const p = await plugin(t);
  const always = new KubeApi(
    kubeconfigCredentials(await kubeconfig(p, http(api), exec(p, { interactiveMode: 'Always' })), { exec: quiet() }),
  );
  const err = await t.throwsAsync(always.getJson(NODES), { instanceOf: ExecPluginError });
  t.regex(err.message, /interactiveMode Always, and standard input is not a terminal/);
  t.true(err.message.includes(p.command), err.message);
  t.is((await p.runs()).length, 0, 'never ran');

  const ifAvailable = new KubeApi(
    kubeconfigCredentials(await kubeconfig(p, http(api), exec(p, { interactiveMode: 'IfAvailable' })), { exec: quiet() }),
  );
  await ifAvailable.getJson(NODES);
  t.is((await p.runs())[0]?.info?.spec.interactive, false);

  const beta = new KubeApi(
    kubeconfigCredentials(await kubeconfig(p, http(api), exec(p, { apiVersion: V1BETA1, interactiveMode: undefined })), {
      exec: { ...quiet(), stdinIsTerminal: true },
    }),
  );
  await beta.getJson(NODES);
  const run = (await p.runs())[1];
  t.is(run?.info?.apiVersion, V1BETA1);
  t.is(run?.info?.spec.interactive, true, 'IfAvailable with a terminal: interactive');
  t.is(api.requests.at(-1)?.authorization, 'Bearer tok-2');
});

test("provideClusterInfo: spec.cluster has the server, CA, TLS name and the cluster's exec extension as config", async (t) => {
  const api = await fakeApi(t, { key: await readFile(pki.serverKey), cert: await readFile(pki.serverCert) });
  const p = await plugin(t);
  const cluster = {
    server: api.url,
    'certificate-authority': pki.caCert,
    'tls-server-name': 'localhost',
    extensions: [{ name: 'client.authentication.k8s.io/exec', extension: { audience: 'kubenet' } }],
  };
  const kube = new KubeApi(kubeconfigCredentials(await kubeconfig(p, cluster, exec(p, { provideClusterInfo: true })), { exec: quiet() }));
  await kube.getJson(NODES);
  t.deepEqual((await p.runs())[0]?.info?.spec, {
    interactive: false,
    cluster: {
      server: api.url,
      'tls-server-name': 'localhost',
      'certificate-authority-data': await base64Of(pki.caCert),
      config: { audience: 'kubenet' },
    },
  });
  t.is(api.requests[0]?.authorization, 'Bearer tok-1');
});

test('a client certificate from the plugin is presented over TLS (one run for both requests); a token alone is refused there', async (t) => {
  const api = await fakeApi(t, {
    key: await readFile(pki.serverKey),
    cert: await readFile(pki.serverCert),
    ca: await readFile(pki.caCert),
    requireClientCert: true,
  });
  const p = await plugin(t, { tokenPrefix: false, certFile: pki.clientCert, keyFile: pki.clientKey });
  const path = await kubeconfig(p, { server: api.url, 'certificate-authority-data': await base64Of(pki.caCert) }, exec(p));
  const kube = new KubeApi(kubeconfigCredentials(path, { exec: quiet() }));
  await kube.getJson(NODES);
  await kube.getJson(NODES);
  t.deepEqual(
    api.requests.map((r) => [r.clientCert, r.authorization]),
    [
      ['system:node:node-a', undefined],
      ['system:node:node-a', undefined],
    ],
  );
  t.is((await p.runs()).length, 1);
  // Without the plugin's certificate the fake refuses (401): the loader really presents it.
  await p.plan({ tokenPrefix: 'tok' });
  const tokenOnly = new KubeApi(kubeconfigCredentials(path, { exec: quiet() }));
  await t.throwsAsync(tokenOnly.getJson(NODES), { instanceOf: KubeApiError, message: /401/ });
});

test("kubectl's precedence: a token file or a client certificate in the kubeconfig wins over the exec plugin, which then never runs", async (t) => {
  const api = await fakeApi(t);
  const p = await plugin(t);
  await writeFile(join(p.dir, 'token'), 'from-file\n');
  const withFile = await kubeconfig(p, http(api), { tokenFile: 'token', ...exec(p) });
  await new KubeApi(kubeconfigCredentials(withFile, { exec: quiet() })).getJson(NODES);
  t.is(api.requests.at(-1)?.authorization, 'Bearer from-file');

  const tls = await fakeApi(t, {
    key: await readFile(pki.serverKey),
    cert: await readFile(pki.serverCert),
    ca: await readFile(pki.caCert),
    requireClientCert: true,
  });
  const withCert = await kubeconfig(
    p,
    { server: tls.url, 'certificate-authority': pki.caCert },
    { 'client-certificate': pki.clientCert, 'client-key': pki.clientKey, ...exec(p) },
  );
  await new KubeApi(kubeconfigCredentials(withCert, { exec: quiet() })).getJson(NODES);
  t.deepEqual([tls.requests[0]?.clientCert, tls.requests[0]?.authorization], ['system:node:node-a', undefined]);
  t.is((await p.runs()).length, 0);
});

test("a relative command with a '/' is relative to the kubeconfig's directory, in $KUBECONFIG's merged files too", async (t) => {
  const api = await fakeApi(t);
  const p = await plugin(t);
  const path = await kubeconfig(p, http(api), exec(p, { command: './kubenet-test-plugin' }));
  const other = join(root, `other-${++n}`);
  await writeFile(other, yaml.dump({ apiVersion: 'v1', kind: 'Config', users: [{ name: 'v', user: { token: 'x' } }] }));
  const kc = kubectlCredentials({ env: { KUBECONFIG: `${other}:${path}` }, exec: quiet() });
  await new KubeApi(kc).getJson(NODES);
  t.is(api.requests.at(-1)?.authorization, 'Bearer tok-1');
});

test('refused exec and auth-provider configurations: ConfigErrors naming the kubeconfig, the user, the field and what to do', async (t) => {
  const p = await plugin(t);
  const server = { server: 'https://127.0.0.1:6443' };
  const refused = async (user: Record<string, unknown>, message: RegExp) => {
    const path = await kubeconfig(p, server, user);
    const err = t.throws(() => kubeconfigCredentials(path), { instanceOf: ConfigError });
    t.true(err.message.includes(`kubeconfig ${path}: user "u"`), err.message);
    t.regex(err.message, message);
  };
  await refused(
    exec(p, { interactiveMode: undefined }),
    /exec.interactiveMode \(.*kubenet-test-plugin\): must be given with client.authentication.k8s.io\/v1/,
  );
  await refused(exec(p, { interactiveMode: 'Sometimes' }), /exec.interactiveMode .*"Sometimes" is not Never, IfAvailable or Always/);
  await refused(exec(p, { apiVersion: 'client.authentication.k8s.io/v1alpha1' }), /exec.apiVersion .*v1alpha1.* is not supported/);
  await refused(exec(p, { command: '' }), /exec.command: must be a non-empty string/);
  await refused(exec(p, { env: [{ value: 'x' }] }), /exec.env .*each entry needs a name/);
  await refused({ 'auth-provider': { name: 'gcp' } }, /auth-provider \(gcp\): .*gke-gcloud-auth-plugin/);
  await refused({ 'auth-provider': { name: 'azure' } }, /auth-provider \(azure\): .*kubelogin/);
  await refused({ 'auth-provider': { name: 'oidc', config: {} } }, /auth-provider \(oidc\): .*exec plugin such as kubelogin/);
  t.is((await p.runs()).length, 0);
});
