/**
 * The agent's HTTP API on its unix socket (mode 0600 from the moment it exists): `POST /v1/cni`
 * (forwarded CNI calls, see protocol.ts), `GET /healthz`, `GET /metrics`, `GET /v1/status`
 * (`?window=S`: the seconds the measured rates are taken over), `POST /v1/pods/NS/NAME/limits`
 * (`kubenet shape`: body `{"ingress"?: "10M", "egress"?: "5M", "clear"?: true}`; 200 with the pod's
 * attachments and their limits, 400 for a bad request, 404 for a pod not attached here).
 *
 * With `ipamSocket`, a second socket (0600 too) serves `POST /v1/ipam` only: the IPAM shim of the
 * agent's own bridge config (native/kubenet-cni.c as `kubenet-ipam`) fetching the host-local result
 * of a pod ADD the agent is running. It has a socket of its own because it must answer until the
 * last CNI call in flight is done: the main socket stops accepting when close() begins.
 *
 * Bounded in every direction a client controls: a request body over MAX_REQUEST_BYTES is refused
 * (413) without being read whole; a request must arrive completely within `requestTimeoutMs`; on
 * close, connections still sending their request are cut at once, CNI calls already running get
 * `shutdownGraceMs` to finish, and then every connection is closed, whatever clients do.
 */
import { chmodSync, mkdirSync, rmSync } from 'node:fs';
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import { dirname } from 'node:path';
import { performance } from 'node:perf_hooks';
import type { Logger } from '../../log.js';
import { fsError, fsTry } from '../../util/fs-error.js';
import type { CniAnswer } from '../cni/handler.js';
import { CniRequestError, parseJsonBounded } from '../cni/request.js';
import {
  CNI_API_PATH,
  CNI_ERR_DECODE,
  cniErrorBody,
  HEALTH_PATH,
  IPAM_API_PATH,
  MAX_REQUEST_BYTES,
  parseCniRequest,
  type CniRequest,
} from '../protocol.js';

export const STATUS_PATH = '/v1/status';
export const METRICS_PATH = '/metrics';
/** POST /v1/pods/<namespace>/<name>/limits */
export const LIMITS_PATH = /^\/v1\/pods\/([^/]+)\/([^/]+)\/limits$/;
export const limitsPath = (namespace: string, name: string) =>
  `/v1/pods/${encodeURIComponent(namespace)}/${encodeURIComponent(name)}/limits`;
/** A limits request is a few dozen bytes. */
const MAX_LIMITS_BODY = 4096;

export interface ApiHandlers {
  cni(req: CniRequest): Promise<CniAnswer>;
  health(): { ok: boolean; reason?: string };
  /** The exposition, in parts sent one after the other. */
  metrics(): Promise<{ contentType: string; parts: Array<string | Buffer> }>;
  /** `windowS`: the seconds measured rates are taken over (default: the agent's). */
  status(windowS?: number): unknown;
  /** New limits for a pod: an HTTP status and a JSON body. */
  limits(namespace: string, name: string, body: unknown): Promise<{ status: number; body: unknown }>;
  /** One CNI call answered (metrics, logs). */
  answered(answer: CniAnswer, seconds: number): void;
  /** The IPAM shim's ADD (on `ipamSocket`). */
  ipam?(req: CniRequest): Promise<CniAnswer>;
}

export interface ApiOptions {
  socket: string;
  log: Logger;
  /** A request must be received completely within this. Default 10 s. */
  requestTimeoutMs?: number;
  /** On close, CNI calls in flight get this long to finish. Default 10 s. */
  shutdownGraceMs?: number;
  /** Default MAX_REQUEST_BYTES. */
  maxBodyBytes?: number;
  /** Where `POST /v1/ipam` is served (with the `ipam` handler). */
  ipamSocket?: string;
}

class BodyTooLarge extends Error {}

/** The answer to a CNI or IPAM request whose body is too large: 413, code 6. */
function tooLarge(err: BodyTooLarge): CniAnswer {
  return { status: 413, command: 'unknown', code: CNI_ERR_DECODE, body: JSON.stringify(cniErrorBody(CNI_ERR_DECODE, err.message)) };
}

/** The request envelope of a CNI or IPAM call, or the 400 answer (with the spec's code) to one that is not. */
function parseEnvelope(body: string): CniRequest | CniAnswer {
  try {
    return parseCniRequest(parseJsonBounded(body, 'the request body'));
  } catch (err) {
    const code = err instanceof CniRequestError ? err.code : CNI_ERR_DECODE;
    return {
      status: 400,
      command: 'unknown',
      code,
      body: JSON.stringify(cniErrorBody(code, err instanceof Error ? err.message : String(err))),
    };
  }
}

/** An answer of known length, its body in parts written one after the other (`headOnly`: the headers alone, for HEAD). */
export function sendParts(
  res: ServerResponse,
  status: number,
  contentType: string,
  body: string | Array<string | Buffer>,
  headOnly = false,
): void {
  const parts = typeof body === 'string' ? [body] : body;
  res.writeHead(status, {
    'content-type': contentType,
    'content-length': parts.reduce((n, p) => n + (typeof p === 'string' ? Buffer.byteLength(p) : p.length), 0),
  });
  if (headOnly) return void res.end();
  for (const p of parts.slice(0, -1)) res.write(p);
  res.end(parts[parts.length - 1]);
}

/** How much of a refused body is read and dropped so its client can read the refusal. */
const DISCARD_BYTES = 64 * 1024 * 1024;
const DISCARD_MS = 2_000;

export class AgentApi {
  private server: Server | undefined;
  private ipamServer: Server | undefined;
  /** Requests whose body is still arriving (no CNI call started for them yet). */
  private readonly receiving = new Set<IncomingMessage>();
  private calls = 0;
  private idle: Array<() => void> = [];
  private stopping = false;
  private readonly maxBody: number;

  constructor(
    private readonly handlers: ApiHandlers,
    private readonly opts: ApiOptions,
  ) {
    this.maxBody = opts.maxBodyBytes ?? MAX_REQUEST_BYTES;
  }

  /** CNI calls being handled right now. */
  callsInFlight(): number {
    return this.calls;
  }

  async listen(): Promise<void> {
    const { socket, ipamSocket, log } = this.opts;
    if (ipamSocket !== undefined && this.handlers.ipam) {
      this.ipamServer = await this.serve(ipamSocket, (req, res) => this.routeIpam(req, res));
    }
    try {
      this.server = await this.serve(socket, (req, res) => this.route(req, res));
    } catch (err) {
      this.ipamServer?.close();
      this.ipamServer = undefined;
      if (ipamSocket !== undefined) rmSync(ipamSocket, { force: true });
      throw err;
    }
    log.info({ socket, ...(this.ipamServer ? { ipamSocket } : {}) }, 'serving the CNI API');
  }

  private async serve(socket: string, route: (req: IncomingMessage, res: ServerResponse) => Promise<void>): Promise<Server> {
    const { log } = this.opts;
    fsTry('create', "the agent's socket directory", dirname(socket), () => mkdirSync(dirname(socket), { recursive: true }));
    fsTry('remove', 'the old agent socket', socket, () => rmSync(socket, { force: true }));
    const server = createServer(
      { requestTimeout: this.opts.requestTimeoutMs ?? 10_000, headersTimeout: 5_000, connectionsCheckingInterval: 500 },
      (req, res) => {
        route(req, res).catch((err: unknown) => {
          log.error({ err }, 'request failed');
          if (!res.headersSent) res.writeHead(500);
          res.end();
        });
      },
    );
    server.maxConnections = 512;
    // The socket is born 0600: nobody else can connect between bind and chmod.
    const umask = process.umask(0o177);
    try {
      await new Promise<void>((ok, fail) => {
        server.once('error', (err) => fail(fsError(err, 'create', 'the agent socket', socket)));
        server.listen(socket, () => ok());
      });
    } finally {
      process.umask(umask);
    }
    fsTry('set the mode of', 'the agent socket', socket, () => chmodSync(socket, 0o600));
    return server;
  }

  /** The IPAM socket: POST /v1/ipam, nothing else. Not a CNI call of its own (no metrics): part of a pod ADD's. */
  private async routeIpam(req: IncomingMessage, res: ServerResponse): Promise<void> {
    const handler = this.handlers.ipam;
    if (req.method !== 'POST' || req.url !== IPAM_API_PATH || !handler) {
      req.resume();
      return this.reply(res, 404, 'text/plain', 'not found\n');
    }
    let body: string;
    try {
      // Not among the requests close() cuts: the ADD waiting for it may be one close() lets finish.
      body = await this.readBody(req, this.maxBody, false);
    } catch (err) {
      if (!(err instanceof BodyTooLarge)) return;
      this.reply(res, 413, 'application/json', tooLarge(err).body);
      this.discardRest(req);
      return;
    }
    const call = parseEnvelope(body);
    const answer = 'status' in call ? call : await handler(call);
    this.reply(res, answer.status, 'application/json', answer.body);
  }

  private async route(req: IncomingMessage, res: ServerResponse): Promise<void> {
    const url = req.url ?? '';
    if (req.method === 'POST' && url === CNI_API_PATH) return this.serveCni(req, res);
    const limits = req.method === 'POST' ? LIMITS_PATH.exec(url) : null;
    if (limits) return this.serveLimits(req, res, decodeURIComponent(limits[1] ?? ''), decodeURIComponent(limits[2] ?? ''));
    const [path, search] = url.split('?', 2) as [string, string | undefined];
    if (req.method === 'GET' && path === STATUS_PATH) {
      const w = Number(new URLSearchParams(search ?? '').get('window') ?? NaN);
      const status = await this.handlers.status(Number.isFinite(w) && w > 0 ? Math.min(w, 30) : undefined);
      return this.reply(res, 200, 'application/json', JSON.stringify(status));
    }
    if (req.method === 'GET' && url === HEALTH_PATH) {
      const ready = this.handlers.health();
      return this.reply(res, ready.ok ? 200 : 503, 'application/json', JSON.stringify(ready));
    }
    if (req.method === 'GET' && url === METRICS_PATH) {
      const m = await this.handlers.metrics();
      return this.reply(res, 200, m.contentType, m.parts);
    }
    req.resume();
    this.reply(res, 404, 'text/plain', 'not found\n');
  }

  private reply(res: ServerResponse, status: number, contentType: string, body: string | Array<string | Buffer>): void {
    // While stopping, each answer closes its connection so that close() is not held by keep-alive.
    if (this.stopping) res.setHeader('connection', 'close');
    sendParts(res, status, contentType, body);
  }

  private async serveLimits(req: IncomingMessage, res: ServerResponse, namespace: string, name: string): Promise<void> {
    let body: string;
    try {
      body = await this.readBody(req, MAX_LIMITS_BODY);
    } catch (err) {
      if (!(err instanceof BodyTooLarge)) return;
      this.reply(res, 413, 'application/json', JSON.stringify({ error: err.message }));
      this.discardRest(req);
      return;
    }
    let parsed: unknown;
    try {
      parsed = JSON.parse(body);
    } catch {
      return this.reply(res, 400, 'application/json', JSON.stringify({ error: 'limits request: the body is not JSON' }));
    }
    const answer = await this.handlers.limits(namespace, name, parsed);
    this.reply(res, answer.status, 'application/json', JSON.stringify(answer.body));
  }

  private async serveCni(req: IncomingMessage, res: ServerResponse): Promise<void> {
    // The call's time, as the metrics report it, runs from the request's arrival to its answer written.
    const arrived = performance.now();
    let body: string;
    try {
      body = await this.readBody(req);
    } catch (err) {
      if (!(err instanceof BodyTooLarge)) return; // the client went away, or close() cut it
      const answer = tooLarge(err);
      this.handlers.answered(answer, 0);
      this.reply(res, 413, 'application/json', answer.body);
      this.discardRest(req);
      return;
    }
    this.calls++;
    const started = performance.now();
    let answer: CniAnswer | undefined;
    try {
      const call = parseEnvelope(body);
      answer = 'status' in call ? call : await this.handlers.cni(call);
    } finally {
      this.calls--;
      if (this.calls === 0) for (const done of this.idle.splice(0)) done();
    }
    answer ??= { status: 500, command: 'unknown', code: 999, body: JSON.stringify(cniErrorBody(999, 'no answer')) };
    const handled = performance.now();
    this.reply(res, answer.status, 'application/json', answer.body);
    const replied = performance.now();
    this.handlers.answered(answer, (replied - arrived) / 1000);
    if (this.opts.log.isLevelEnabled('debug')) {
      const r = (x: number) => Math.round(x * 100) / 100;
      this.opts.log.debug(
        { command: answer.command, bodyMs: r(started - arrived), handleMs: r(handled - started), replyMs: r(replied - handled) },
        'CNI call timing',
      );
    }
  }

  /**
   * After a refusal, lets a client that is still sending finish its write and read the answer (a
   * client that gets EPIPE mid-write never reads it, and the CNI binary would then report the agent
   * unreachable): the rest of the body is read and dropped, never kept, for at most DISCARD_BYTES
   * or DISCARD_MS, after which the connection is cut.
   */
  private discardRest(req: IncomingMessage): void {
    let dropped = 0;
    const cut = () => req.socket.destroy();
    const timer = setTimeout(cut, DISCARD_MS);
    timer.unref();
    req.removeAllListeners('data');
    req.on('data', (c: Buffer) => {
      dropped += c.length;
      if (dropped > DISCARD_BYTES) cut();
    });
    req.on('end', () => clearTimeout(timer));
    req.on('close', () => clearTimeout(timer));
    req.resume();
  }

  /** The request body, refused past maxBody without reading it whole; `cutOnClose`: among the requests close() cuts. */
  private readBody(req: IncomingMessage, maxBody = this.maxBody, cutOnClose = true): Promise<string> {
    const declared = Number(req.headers['content-length']);
    if (Number.isFinite(declared) && declared > maxBody) {
      return Promise.reject(new BodyTooLarge(`request body of ${declared} bytes is larger than ${maxBody}`));
    }
    if (cutOnClose) this.receiving.add(req);
    return new Promise<string>((resolve, reject) => {
      const chunks: Buffer[] = [];
      let size = 0;
      const done = () => this.receiving.delete(req);
      req.on('data', (c: Buffer) => {
        size += c.length;
        if (size > maxBody) {
          done();
          req.removeAllListeners('data');
          req.pause();
          reject(new BodyTooLarge(`request body is larger than ${maxBody} bytes`));
          return;
        }
        chunks.push(c);
      });
      req.on('end', () => {
        done();
        resolve(Buffer.concat(chunks).toString('utf8'));
      });
      req.on('close', () => {
        done();
        reject(new Error('request aborted'));
      });
      req.on('error', (err) => {
        done();
        reject(err);
      });
    });
  }

  /**
   * Stops taking requests: connections still sending one are cut, CNI calls in flight get the grace
   * period to finish (their answers close their connections), then every connection is closed.
   */
  async close(): Promise<void> {
    this.stopping = true;
    const server = this.server;
    this.server = undefined;
    if (!server) return;
    const closed = new Promise<void>((ok) => server.close(() => ok()));
    server.closeIdleConnections();
    for (const req of this.receiving) req.socket.destroy();
    this.receiving.clear();
    if (this.calls > 0) {
      const grace = this.opts.shutdownGraceMs ?? 10_000;
      let timer: NodeJS.Timeout | undefined;
      await Promise.race([new Promise<void>((r) => this.idle.push(r)), new Promise<void>((r) => (timer = setTimeout(r, grace)))]);
      clearTimeout(timer);
      if (this.calls > 0)
        this.opts.log.warn(
          { calls: this.calls, graceMs: grace },
          'CNI calls still running at the end of the grace period: closing their connections',
        );
    }
    server.closeAllConnections();
    await closed;
    rmSync(this.opts.socket, { force: true });
    // The IPAM socket answered the calls above until they were done.
    const ipam = this.ipamServer;
    this.ipamServer = undefined;
    if (ipam) {
      const ipamClosed = new Promise<void>((ok) => ipam.close(() => ok()));
      ipam.closeAllConnections();
      await ipamClosed;
      if (this.opts.ipamSocket !== undefined) rmSync(this.opts.ipamSocket, { force: true });
    }
  }
}
