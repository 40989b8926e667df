/**
 * The agent's TCP port (config `metricsAddress`): `GET /metrics` and `GET /healthz`, nothing else:
 * the CNI API and `kubenet shape` stay on the unix socket, whose mode keeps them root's. `/healthz`
 * is the DaemonSet's liveness probe: 200 while the agent runs (its body says whether it is ready
 * for CNI calls, which is the readiness probe's business: `kubenet health` on the socket); a hung
 * event loop answers nothing and the kubelet restarts the agent.
 *
 * With an authorizer (`metricsAuth: kubernetes`, metrics-auth.ts) `/metrics` answers only callers
 * the API server authenticates and authorizes; `/healthz` stays open, as kubelet probes carry no
 * token. With TLS (a certificate configured, or self-signed with auth) it serves HTTPS.
 *
 * Bounded like the socket API: a request must arrive within 10 s, bodies are not read, at most 64
 * connections.
 */
import { readFileSync } from 'node:fs';
import { createServer as createHttpServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import { createServer as createHttpsServer } from 'node:https';
import { networkInterfaces } from 'node:os';
import { ConfigError } from '../../errors.js';
import type { Logger } from '../../log.js';
import { formatListenAddress, parseListenAddress } from '../../net/listen-address.js';
import { selfSignedCertificate } from '../../util/self-signed.js';
import type { MetricsAuthorizer } from './metrics-auth.js';
import { HEALTH_PATH } from '../protocol.js';
import { METRICS_PATH, sendParts } from './socket-api.js';

export interface MetricsHttpHandlers {
  /** The exposition, in parts sent one after the other. */
  metrics(): Promise<{ contentType: string; parts: Array<string | Buffer> }>;
  /** Readiness for CNI calls, reported in /healthz's body (the status is 200 regardless). */
  ready(): { ok: boolean; reason?: string };
}

export interface MetricsHttpOptions {
  /** `HOST:PORT` or `:PORT` (config metricsAddress; not "off"). */
  address: string;
  log: Logger;
  /** Answers /metrics only for callers it allows. */
  auth?: MetricsAuthorizer;
  /** PEM files; without them, TLS only with `auth` (a self-signed certificate for `nodeName`). */
  tls?: { certFile: string; keyFile: string };
  /** The certificate's name when it is self-signed. */
  nodeName?: string;
}

export class MetricsHttp {
  private server: Server | undefined;
  private bound: { host: string; port: number } | undefined;
  private readonly https: boolean;

  constructor(
    private readonly handlers: MetricsHttpHandlers,
    private readonly opts: MetricsHttpOptions,
  ) {
    this.https = opts.tls !== undefined || opts.auth !== undefined;
  }

  /** Where it listens, once listening: `http(s)://HOST:PORT` (an every-address bind shows as the loopback address). */
  url(): string | undefined {
    if (!this.bound) return undefined;
    const host = this.bound.host === '::' ? '::1' : this.bound.host === '0.0.0.0' ? '127.0.0.1' : this.bound.host;
    return `${this.https ? 'https' : 'http'}://${formatListenAddress({ host, port: this.bound.port })}`;
  }

  async listen(): Promise<void> {
    const { log } = this.opts;
    const { host, port } = parseListenAddress(this.opts.address);
    const handler = (req: IncomingMessage, res: ServerResponse) => {
      this.route(req, res).catch((err: unknown) => {
        log.error({ err }, 'metrics request failed');
        if (!res.headersSent) res.writeHead(500);
        res.end();
      });
    };
    const serverOpts = { requestTimeout: 10_000, headersTimeout: 5_000, connectionsCheckingInterval: 1_000 };
    const server = this.https
      ? createHttpsServer({ ...serverOpts, ...this.credentials() }, handler)
      : createHttpServer(serverOpts, handler);
    server.maxConnections = 64;
    // Every address: "::" takes IPv4 too (dual-stack socket); a node without IPv6 has only 0.0.0.0.
    const hosts = host !== undefined ? [host] : ['::', '0.0.0.0'];
    for (const [i, h] of hosts.entries()) {
      try {
        await new Promise<void>((ok, fail) => {
          server.once('error', fail);
          server.listen({ host: h, port }, () => {
            server.off('error', fail);
            ok();
          });
        });
        break;
      } catch (err) {
        const code = (err as NodeJS.ErrnoException).code;
        if (i < hosts.length - 1 && (code === 'EAFNOSUPPORT' || code === 'EADDRNOTAVAIL')) continue;
        const what =
          code === 'EADDRINUSE'
            ? 'the port is in use by another process (`ss -ltnp sport = :PORT` names it)'
            : code === 'EADDRNOTAVAIL'
              ? 'no interface of this node has that address'
              : code === 'EACCES'
                ? 'not permitted'
                : String(code ?? err);
        throw new ConfigError(
          `metricsAddress ${this.opts.address}: cannot listen on ${formatListenAddress({ host: h, port })}: ${what.replace('PORT', String(port))}; set metricsAddress to a free port, or "off"`,
          { cause: err },
        );
      }
    }
    const a = server.address();
    this.bound = a && typeof a === 'object' ? { host: a.address, port: a.port } : { host: hosts[0] ?? '', port };
    this.server = server;
    log.info(
      {
        metricsAddress: this.opts.address,
        url: this.url(),
        auth: this.opts.auth ? 'kubernetes' : 'none',
        tls: this.https ? (this.opts.tls ? 'configured' : 'self-signed') : 'off',
      },
      `serving ${METRICS_PATH} and ${HEALTH_PATH} over TCP`,
    );
  }

  private credentials(): { cert: string | Buffer; key: string | Buffer } {
    const tls = this.opts.tls;
    if (tls) {
      const read = (file: string, what: string) => {
        try {
          return readFileSync(file);
        } catch (err) {
          throw new ConfigError(`${what} ${file}: cannot read it: ${(err as Error).message}`, { cause: err });
        }
      };
      return { cert: read(tls.certFile, 'metricsTLSCertFile'), key: read(tls.keyFile, 'metricsTLSKeyFile') };
    }
    const name = this.opts.nodeName ?? 'kubenet';
    const ips = Object.values(networkInterfaces()).flatMap((list) => (list ?? []).map((a) => a.address.replace(/%.*$/, '')));
    return selfSignedCertificate(name, [...new Set([name, 'localhost'])], [...new Set(['127.0.0.1', '::1', ...ips])]);
  }

  private async route(req: IncomingMessage, res: ServerResponse): Promise<void> {
    req.resume();
    const path = (req.url ?? '').split('?', 1)[0];
    if (path !== METRICS_PATH && path !== HEALTH_PATH)
      return this.reply(res, req, 404, 'text/plain', 'not found: this port serves /metrics and /healthz only\n');
    if (req.method !== 'GET' && req.method !== 'HEAD') {
      res.setHeader('allow', 'GET, HEAD');
      return this.reply(res, req, 405, 'text/plain', `method ${req.method ?? ''} not allowed\n`);
    }
    if (path === HEALTH_PATH)
      return this.reply(res, req, 200, 'application/json', JSON.stringify({ live: true, ready: this.handlers.ready() }));
    if (this.opts.auth) {
      const d = await this.opts.auth.authorize(req.headers.authorization, path);
      if (d.status !== 200) {
        if (d.status === 401) res.setHeader('www-authenticate', 'Bearer realm="kubenet metrics"');
        return this.reply(res, req, d.status, 'text/plain', `${d.reason ?? 'refused'}\n`);
      }
    }
    const m = await this.handlers.metrics();
    this.reply(res, req, 200, m.contentType, m.parts);
  }

  private reply(
    res: ServerResponse,
    req: IncomingMessage,
    status: number,
    contentType: string,
    body: string | Array<string | Buffer>,
  ): void {
    sendParts(res, status, contentType, body, req.method === 'HEAD');
  }

  async close(): Promise<void> {
    const server = this.server;
    this.server = undefined;
    if (!server) return;
    const closed = new Promise<void>((ok) => server.close(() => ok()));
    server.closeAllConnections();
    await closed;
  }
}
