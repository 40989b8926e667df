/**
 * The agent's TCP port (http/metrics-port.ts) on the loopback: /metrics and /healthz only, other paths
 * 404 and other methods 405; with an authorizer, /metrics answers what it decides and /healthz stays
 * open; TLS with a self-signed certificate naming the node; a port in use is a clear error. And the
 * TokenReview + SubjectAccessReview authorizer (metrics-auth.ts) against a fake review API: what it
 * asks, what it caches and for how long, what it answers when the API server fails.
 */
import test from 'ava';
import type { X509Certificate } from 'node:crypto';
import { request as httpRequest, type IncomingMessage } from 'node:http';
import { request as httpsRequest } from 'node:https';
import { createServer } from 'node:net';
import { createLogger } from '../../../src/log.js';
import { KubeMetricsAuth, type MetricsAuthorizer, type ReviewApi } from '../../../src/daemon/http/metrics-auth.js';
import { MetricsHttp } from '../../../src/daemon/http/metrics-port.js';

const log = createLogger({ level: 'silent' });
const EXPOSITION = '# HELP kubenet_pods Pods attached to the bridge\n# TYPE kubenet_pods gauge\nkubenet_pods 3\n';

interface Answer {
  status: number;
  headers: IncomingMessage['headers'];
  body: string;
  cert?: X509Certificate;
}

function get(url: string, opts: { method?: string; headers?: Record<string, string> } = {}): Promise<Answer> {
  const u = new URL(url);
  const https = u.protocol === 'https:';
  return new Promise((resolve, reject) => {
    const req = (https ? httpsRequest : httpRequest)(
      u,
      { method: opts.method ?? 'GET', headers: opts.headers ?? {}, ...(https ? { rejectUnauthorized: false } : {}), agent: false },
      (res) => {
        const chunks: Buffer[] = [];
        res.on('data', (c: Buffer) => chunks.push(c));
        res.on('end', () => {
          const peer = https ? (res.socket as import('node:tls').TLSSocket).getPeerX509Certificate?.() : undefined;
          resolve({
            status: res.statusCode ?? 0,
            headers: res.headers,
            body: Buffer.concat(chunks).toString(),
            ...(peer ? { cert: peer } : {}),
          });
        });
      },
    );
    req.on('error', reject);
    req.end();
  });
}

async function serve(t: import('ava').ExecutionContext, opts: { auth?: MetricsAuthorizer; address?: string } = {}): Promise<MetricsHttp> {
  const m = new MetricsHttp(
    {
      metrics: async () => ({
        contentType: 'text/plain; version=0.0.4',
        parts: [EXPOSITION.slice(0, 20), Buffer.from(EXPOSITION.slice(20))],
      }),
      ready: () => ({ ok: false, reason: 'kubenet: no pod CIDR yet' }),
    },
    { address: opts.address ?? '127.0.0.1:0', log, nodeName: 'node-a', ...(opts.auth ? { auth: opts.auth } : {}) },
  );
  t.teardown(() => m.close());
  await m.listen();
  return m;
}

test('serves /metrics and /healthz (liveness: 200 while running, readiness in the body); nothing else', async (t) => {
  const m = await serve(t);
  const url = m.url() ?? '';
  t.regex(url, /^http:\/\/127\.0\.0\.1:\d+$/);
  const metrics = await get(`${url}/metrics`);
  t.is(metrics.status, 200);
  t.is(metrics.body, EXPOSITION);
  t.is(metrics.headers['content-type'], 'text/plain; version=0.0.4');
  t.is(Number(metrics.headers['content-length']), Buffer.byteLength(EXPOSITION));
  const health = await get(`${url}/healthz`);
  t.is(health.status, 200, 'live although not ready');
  t.deepEqual(JSON.parse(health.body), { live: true, ready: { ok: false, reason: 'kubenet: no pod CIDR yet' } });
  t.is((await get(`${url}/metrics?x=1`)).status, 200, 'a query string is ignored');
  const head = await get(`${url}/metrics`, { method: 'HEAD' });
  t.is(head.status, 200);
  t.is(head.body, '');
  for (const path of ['/v1/cni', '/v1/status', '/v1/pods/default/p/limits', '/', '/metricsx']) {
    const r = await get(`${url}${path}`);
    t.is(r.status, 404, path);
    t.regex(r.body, /serves \/metrics and \/healthz only/);
  }
  const post = await get(`${url}/metrics`, { method: 'POST' });
  t.is(post.status, 405);
  t.is(post.headers.allow, 'GET, HEAD');
});

test('every address: ":PORT" listens on IPv4 and IPv6 loopback alike', async (t) => {
  // A free port first (port 0 on "::" would work too, but the URL shows the loopback either way).
  const port = await new Promise<number>((resolve) => {
    const s = createServer().listen(0, '127.0.0.1', () => {
      const p = (s.address() as { port: number }).port;
      s.close(() => resolve(p));
    });
  });
  const m = await serve(t, { address: `:${port}` });
  t.is((await get(`http://127.0.0.1:${port}/metrics`)).status, 200);
  t.is((await get(`http://[::1]:${port}/metrics`)).status, 200);
  t.regex(m.url() ?? '', new RegExp(`:${port}$`));
});

test('a port in use: an error naming the key, the address and what to do', async (t) => {
  const m = await serve(t);
  const port = Number(new URL(m.url() ?? '').port);
  const second = new MetricsHttp(
    { metrics: async () => ({ contentType: 'text/plain', parts: [''] }), ready: () => ({ ok: true }) },
    { address: `127.0.0.1:${port}`, log },
  );
  const err = await t.throwsAsync(second.listen());
  t.regex(
    err?.message ?? '',
    new RegExp(
      `metricsAddress 127\\.0\\.0\\.1:${port}: cannot listen on 127\\.0\\.0\\.1:${port}: the port is in use .*sport = :${port}.*set metricsAddress to a free port, or "off"`,
    ),
  );
});

test('with an authorizer: TLS with a self-signed certificate for the node, /metrics as it decides, /healthz open', async (t) => {
  const seen: Array<{ authorization: string | undefined; path: string }> = [];
  const auth: MetricsAuthorizer = {
    authorize: async (authorization, path) => {
      seen.push({ authorization, path });
      if (!authorization) return { status: 401, reason: 'a bearer token is required' };
      return authorization === 'Bearer good'
        ? { status: 200, user: 'system:serviceaccount:monitoring:prometheus' }
        : { status: 403, reason: 'user "x" may not get /metrics' };
    },
  };
  const m = await serve(t, { auth });
  const url = m.url() ?? '';
  t.regex(url, /^https:\/\//);
  const none = await get(`${url}/metrics`);
  t.is(none.status, 401);
  t.is(none.headers['www-authenticate'], 'Bearer realm="kubenet metrics"');
  t.false(none.body.includes('kubenet_pods'));
  const bad = await get(`${url}/metrics`, { headers: { authorization: 'Bearer bad' } });
  t.is(bad.status, 403);
  t.regex(bad.body, /may not get \/metrics/);
  const good = await get(`${url}/metrics`, { headers: { authorization: 'Bearer good' } });
  t.is(good.status, 200);
  t.is(good.body, EXPOSITION);
  t.deepEqual(
    seen.map((s) => s.path),
    ['/metrics', '/metrics', '/metrics'],
  );
  const health = await get(`${url}/healthz`);
  t.is(health.status, 200, 'the kubelet probe carries no token');
  t.is(seen.length, 3, '/healthz asks nobody');
  const cert = good.cert;
  t.truthy(cert);
  t.is(cert?.subject, 'CN=node-a');
  t.regex(cert?.subjectAltName ?? '', /DNS:node-a/);
  t.regex(cert?.subjectAltName ?? '', /IP Address:127\.0\.0\.1/);
  t.true(cert?.verify(cert.publicKey), 'self-signed');
  t.false(cert?.ca);
  t.true(Date.parse(cert?.validTo ?? '') - Date.now() > 360 * 86400_000, 'valid for a year');
});

/** A review API that answers from tables and counts what it is asked. */
class FakeReviews implements ReviewApi {
  readonly asked: Array<{ path: string; body: any }> = [];
  fail = false;
  delayMs = 5;
  users = new Map<string, { username: string; groups: string[] }>([
    ['tok-prom', { username: 'system:serviceaccount:monitoring:prometheus', groups: ['system:serviceaccounts'] }],
  ]);
  allowed = new Set(['system:serviceaccount:monitoring:prometheus /metrics']);
  async postJson<T>(path: string, body: any): Promise<T> {
    this.asked.push({ path, body });
    if (this.delayMs > 0) await new Promise((r) => setTimeout(r, this.delayMs));
    if (this.fail) throw new Error('connect ECONNREFUSED');
    if (path.endsWith('/tokenreviews')) {
      const user = this.users.get(body.spec.token);
      return { status: user ? { authenticated: true, user } : { authenticated: false, error: 'invalid bearer token' } } as T;
    }
    return { status: { allowed: this.allowed.has(`${body.spec.user} ${body.spec.nonResourceAttributes.path}`) } } as T;
  }
}

test('KubeMetricsAuth: TokenReview then SubjectAccessReview for get on the path, as the user with its groups', async (t) => {
  const api = new FakeReviews();
  const auth = new KubeMetricsAuth(api, log);
  t.deepEqual(await auth.authorize('Bearer tok-prom', '/metrics'), { status: 200, user: 'system:serviceaccount:monitoring:prometheus' });
  t.is(api.asked[0]?.path, '/apis/authentication.k8s.io/v1/tokenreviews');
  t.deepEqual(api.asked[0]?.body.spec, { token: 'tok-prom' });
  t.is(api.asked[1]?.path, '/apis/authorization.k8s.io/v1/subjectaccessreviews');
  t.deepEqual(api.asked[1]?.body.spec, {
    user: 'system:serviceaccount:monitoring:prometheus',
    groups: ['system:serviceaccounts'],
    nonResourceAttributes: { path: '/metrics', verb: 'get' },
  });
  t.is((await auth.authorize(undefined, '/metrics')).status, 401);
  t.is((await auth.authorize('Basic abc', '/metrics')).status, 401);
  t.is((await auth.authorize('Bearer nobody', '/metrics')).status, 401);
  api.users.set('tok-other', { username: 'alice', groups: [] });
  const denied = await auth.authorize('Bearer tok-other', '/metrics');
  t.is(denied.status, 403);
  t.regex(denied.reason ?? '', /user "alice" may not get \/metrics .*nonResourceURLs \["\/metrics"\]/);
});

test('KubeMetricsAuth: answers cached (2 min, refusals 30 s), the same token in flight reviewed once, failures answered 503 and not cached', async (t) => {
  const api = new FakeReviews();
  let now = 1_000_000;
  const auth = new KubeMetricsAuth(api, log, () => now);
  const burst = await Promise.all(Array.from({ length: 20 }, () => auth.authorize('Bearer tok-prom', '/metrics')));
  t.true(burst.every((d) => d.status === 200));
  t.deepEqual(auth.sent, { tokenReviews: 1, accessReviews: 1 }, 'one review of each for a burst');
  now += 119_000;
  t.is((await auth.authorize('Bearer tok-prom', '/metrics')).status, 200);
  t.deepEqual(auth.sent, { tokenReviews: 1, accessReviews: 1 }, 'cached within 2 min');
  now += 2_000;
  t.is((await auth.authorize('Bearer tok-prom', '/metrics')).status, 200);
  t.deepEqual(auth.sent, { tokenReviews: 2, accessReviews: 2 }, 'asked again after 2 min');
  // A refused token: 30 s.
  t.is((await auth.authorize('Bearer nobody', '/metrics')).status, 401);
  t.is((await auth.authorize('Bearer nobody', '/metrics')).status, 401);
  t.is(auth.sent.tokenReviews, 3);
  now += 31_000;
  api.users.set('nobody', { username: 'late', groups: [] });
  t.is((await auth.authorize('Bearer nobody', '/metrics')).status, 403, 'reviewed again after 30 s: now a user, not allowed');
  now += 31_000;
  api.allowed.add('late /metrics');
  t.is((await auth.authorize('Bearer nobody', '/metrics')).status, 200, 'a denial is asked again after 30 s');
  // The API server away: 503, and the next request asks again.
  api.fail = true;
  const before = auth.sent.tokenReviews;
  t.is((await auth.authorize('Bearer fresh', '/metrics')).status, 503);
  api.fail = false;
  api.users.set('fresh', { username: 'system:serviceaccount:monitoring:prometheus', groups: [] });
  t.is((await auth.authorize('Bearer fresh', '/metrics')).status, 200);
  t.is(auth.sent.tokenReviews, before + 2, 'a failed review is not cached');
});

test('KubeMetricsAuth: a flood of made-up tokens costs one review each and a bounded cache', async (t) => {
  const api = new FakeReviews();
  api.delayMs = 0;
  const auth = new KubeMetricsAuth(api, log);
  for (let i = 0; i < 1500; i++) t.is((await auth.authorize(`Bearer made-up-${i}`, '/metrics')).status, 401);
  t.is(auth.sent.tokenReviews, 1500);
  t.is(auth.sent.accessReviews, 0);
  const users = (auth as unknown as { users: { size: number } }).users.size;
  t.true(users <= 1024, `cache bounded: ${users}`);
});
