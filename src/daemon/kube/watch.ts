/**
 * The Kubernetes API as the node agent uses it: GET, POST (Events), PATCH (its Node's status) and
 * list + watch of one collection with reconnects (a small reflector). Shared by the Node pod-CIDR
 * source, the pod lookup, the event recorder and the Node capacity publisher.
 *
 * Requests are plain node:http(s) requests; the configuration (src/daemon/kube/kubeconfig.ts: a
 * kubeconfig file or the in-cluster service account) supplies the server, TLS agent and
 * credentials (`applyToHTTPSOptions`). @kubernetes/client-node is used for its types only: loading
 * it costs ~75 MB of RSS. (Its `Watch` would not do either: in 1.4.0 `Watch.watch()` hands out its
 * AbortController only once response headers have arrived, so a watch still connecting (API
 * server slow or gone) cannot be aborted, and stop() could neither finish it nor let the process exit.)
 */
import { setMaxListeners } from 'node:events';
import { request as httpRequest, type IncomingMessage } from 'node:http';
import { request as httpsRequest, type RequestOptions } from 'node:https';
import type { KubernetesListObject, KubernetesObject, V1Status } from '@kubernetes/client-node';
import { ConfigError, KubenetError } from '../../errors.js';
import type { Logger } from '../../log.js';
import { inClusterCredentials, kubeconfigCredentials, type KubeClientConfig } from './kubeconfig.js';
import { ApiHealth, Backoff, BACKOFF_INITIAL_MS, BACKOFF_MAX_MS, isOutage } from './api-health.js';

/**
 * An AbortController whose signal many requests share (each request in flight listens on it): Node
 * warns of a leak past 10 listeners, so the limit is set to how many may be in flight at once.
 */
export function sharedAborter(maxInFlight: number): AbortController {
  const c = new AbortController();
  setMaxListeners(maxInFlight + 1, c.signal);
  return c;
}

/** A list or GET that receives no byte for this long fails. */
const REQUEST_IDLE_MS = 30_000;
/** Objects per list request (client-go's reflector pages by 500 too). */
const LIST_PAGE_SIZE = 500;
/** Watches ask the server to end them after 5-10 min (randomized, as client-go does). */
const WATCH_TIMEOUT_S = 300;

/** Constructor options shared by the Kubernetes-backed sources. */
export interface KubeClientOptions {
  /** This node's name (the Node object; pods with spec.nodeName equal to it). */
  nodeName: string;
  logger: Logger;
  /** Path of a kubeconfig file; without it (and without kubeConfig) the in-cluster config. */
  kubeconfig?: string;
  /** A ready configuration (tests: a client-node KubeConfig fits); wins over kubeconfig. */
  kubeConfig?: KubeClientConfig;
  /**
   * The agent's API health (api-health.ts), shared by all its clients: paces retries while the API
   * server is away. Without it each loop has its own, with a period of retryMinMs (default 1 s).
   */
  health?: ApiHealth | undefined;
  /** Backoff after an error answer: first step (default 800 ms), doubled per failure up to retryMaxMs (30 s), jittered. */
  retryMinMs?: number | undefined;
  retryMaxMs?: number | undefined;
}

/** How a client retries (KubeClientOptions satisfies it). */
export type RetryOptions = Pick<KubeClientOptions, 'health' | 'retryMinMs' | 'retryMaxMs'>;

/** The shared health of `o`, or one of its own (its period: retryMinMs, default 1 s). */
export function healthOf(o: RetryOptions = {}): ApiHealth {
  return o.health ?? new ApiHealth(o.retryMinMs !== undefined ? { periodMs: o.retryMinMs } : {});
}

/** The API server answered with an error (`status`: HTTP status or Status.code) or broke the protocol. */
export class KubeApiError extends KubenetError {
  readonly status: number | undefined;
  /** Status.reason, e.g. NotFound, Expired, Forbidden. */
  readonly reason: string | undefined;
  /** No answer came (a request idle too long, a watch cut): the API server is away (api-health.ts). */
  readonly away: boolean;
  constructor(
    message: string,
    init: { status?: number | undefined; reason?: string | undefined; away?: boolean } = {},
    options?: { cause?: unknown },
  ) {
    super(message, options);
    this.status = init.status;
    this.reason = init.reason;
    this.away = init.away === true;
  }
}

/** 410 Gone: the resourceVersion is too old (compacted); only a fresh list helps. */
export function isGone(err: unknown): boolean {
  return err instanceof KubeApiError && err.status === 410;
}

export function loadKubeConfig(opts: Pick<KubeClientOptions, 'kubeconfig' | 'kubeConfig'>): KubeClientConfig {
  if (opts.kubeConfig) return opts.kubeConfig;
  return opts.kubeconfig ? kubeconfigCredentials(opts.kubeconfig) : inClusterCredentials();
}

/** Requests against the API server of one configuration. */
export class KubeApi {
  constructor(readonly kc: KubeClientConfig) {}

  /** GET and parse a JSON answer; a non-200 answer throws KubeApiError with the Status details. */
  async getJson<T>(path: string, query: Record<string, string> = {}, signal?: AbortSignal): Promise<T> {
    const res = await this.open(path, query, REQUEST_IDLE_MS, signal);
    return parseAnswer<T>('GET', path, res, [200]);
  }

  /** POST a JSON object (a create); a 200/201 answer is parsed, any other throws KubeApiError with the Status details. */
  async postJson<T>(path: string, body: unknown, signal?: AbortSignal): Promise<T> {
    const res = await this.send('POST', path, {}, REQUEST_IDLE_MS, signal, JSON.stringify(body));
    return parseAnswer<T>('POST', path, res, [200, 201]);
  }

  /** PATCH with a JSON merge patch (RFC 7386: null removes a key); a 200 answer is parsed, any other throws KubeApiError with the Status details. */
  async mergePatch<T>(path: string, patch: unknown, signal?: AbortSignal): Promise<T> {
    const res = await this.send('PATCH', path, {}, REQUEST_IDLE_MS, signal, JSON.stringify(patch), 'application/merge-patch+json');
    return parseAnswer<T>('PATCH', path, res, [200]);
  }

  /** Sends a GET and resolves with the response (any status). `idleMs`: fail when the socket is idle that long. */
  open(path: string, query: Record<string, string>, idleMs: number, signal?: AbortSignal): Promise<IncomingMessage> {
    return this.send('GET', path, query, idleMs, signal);
  }

  private async send(
    method: 'GET' | 'POST' | 'PATCH',
    path: string,
    query: Record<string, string>,
    idleMs: number,
    signal?: AbortSignal,
    body?: string,
    contentType = 'application/json',
    again = false,
  ): Promise<IncomingMessage> {
    const server = this.kc.getCurrentCluster()?.server;
    if (!server) throw new ConfigError('kubeconfig has no current cluster');
    const url = new URL(server.replace(/\/+$/, '') + path);
    for (const [k, v] of Object.entries(query)) url.searchParams.set(k, v);
    const headers: Record<string, string | number> = { Accept: 'application/json' };
    if (body !== undefined) {
      headers['Content-Type'] = contentType;
      headers['Content-Length'] = Buffer.byteLength(body);
    }
    const opts: RequestOptions = { method, headers };
    await this.kc.applyToHTTPSOptions(opts); // agent (TLS or proxy), Authorization header, basic auth
    signal?.throwIfAborted();
    const res = await new Promise<IncomingMessage>((resolve, reject) => {
      const req = (url.protocol === 'https:' ? httpsRequest : httpRequest)(url, { ...opts, ...(signal ? { signal } : {}) }, resolve);
      // `on`, not `once`: a second error (mid-response) must not become uncaught.
      req.on('error', (err) => {
        if (!signal?.aborted && isOutage(err)) this.kc.requestFailed?.(server, err);
        reject(err);
      });
      req.on('socket', (s) => s.setKeepAlive(true, 30_000));
      req.setTimeout(idleMs, () =>
        req.destroy(new KubeApiError(`${method} ${path}: no data from the API server for ${idleMs} ms`, { away: true })),
      );
      req.end(body);
    });
    // 401: renewed credentials (an exec plugin run again) get one more try.
    if (res.statusCode !== 401 || again || !this.kc.unauthorized?.(opts)) return res;
    res.resume();
    return this.send(method, path, query, idleMs, signal, body, contentType, true);
  }
}

/** The JSON body of an answer whose status is one of `ok`; else a KubeApiError with the Status details. */
async function parseAnswer<T>(method: string, path: string, res: IncomingMessage, ok: number[]): Promise<T> {
  const body = await readBody(res);
  if (!ok.includes(res.statusCode ?? 0)) throw statusError(path, res.statusCode, body, method);
  try {
    return JSON.parse(body) as T;
  } catch (err) {
    throw new KubeApiError(`${method} ${path}: the API server answered with invalid JSON`, {}, { cause: err });
  }
}

async function readBody(res: IncomingMessage): Promise<string> {
  res.setEncoding('utf8');
  let body = '';
  for await (const chunk of res) body += chunk as string;
  return body;
}

/** A KubeApiError from an error answer, with the message and reason of its Status body when it has one. */
function statusError(path: string, httpStatus: number | undefined, body: string, method = 'GET'): KubeApiError {
  let st: V1Status | undefined;
  try {
    st = JSON.parse(body) as V1Status;
  } catch {
    // not a Status object: keep the raw text
  }
  const text = st?.message ?? (body.trim().slice(0, 200) || 'no details');
  return new KubeApiError(`${method} ${path}: ${httpStatus} ${st?.reason ?? ''} ${text}`.replace(/\s+/g, ' '), {
    status: httpStatus,
    reason: st?.reason,
  });
}

type WatchEventType = 'ADDED' | 'MODIFIED' | 'DELETED';

export interface ListWatchOptions<T extends KubernetesObject> {
  api: KubeApi;
  log: Logger;
  /** Collection path, e.g. /api/v1/nodes. */
  path: string;
  fieldSelector: string;
  retry?: RetryOptions | undefined;
  /** The full state after each (re-)list: replaces whatever was known. */
  onList(items: T[]): void | Promise<void>;
  /** One watch event. Handlers run one at a time, in order. */
  onEvent(type: WatchEventType, obj: T): void | Promise<void>;
  /** A failure for which this returns true ends the loop instead of a retry (e.g. 404: the API is not served); the caller tells why. */
  stopOn?(err: unknown): boolean;
}

/** A watch the server ends sooner than this without an event counts as a failure (client-go: "very short watch"), so a server that closes every watch at once is not hammered. */
const SHORT_WATCH_MS = 1000;

/**
 * Lists the collection, then watches it from the list's resourceVersion, forever, as client-go's
 * reflector does where it matters (api-health.ts says when it tries again):
 *
 * - the server ends the watch (timeoutSeconds, a shutdown): watched again at once from the last
 *   resourceVersion seen (events and bookmarks keep it fresh through quiet periods);
 * - 410 Gone / Expired (the resourceVersion was compacted while away): re-listed at once;
 * - the API server away (refused, broken, 429, 5xx): the agent's shared ApiHealth paces the next
 *   attempt (about one request a second per agent; all loops go once it answers); after a refused
 *   connection (no API server listening: it restarts, and a new one would answer an old
 *   resourceVersion with 410) the next attempt is a list;
 * - an error answer (403, 404, ...): this loop's own jittered backoff (800 ms doubling to 30 s).
 *
 * Every failure is logged, an outage once per agent. A failure the caller's `stopOn` accepts ends the loop.
 */
export class ListWatchLoop<T extends KubernetesObject> {
  private readonly backoff: Backoff;
  private readonly health: ApiHealth;
  private aborter: AbortController | undefined;
  private running: Promise<void> | undefined;

  constructor(private readonly o: ListWatchOptions<T>) {
    const min = Math.max(1, o.retry?.retryMinMs ?? BACKOFF_INITIAL_MS);
    this.backoff = new Backoff(min, Math.max(min, o.retry?.retryMaxMs ?? BACKOFF_MAX_MS));
    this.health = healthOf(o.retry);
  }

  /** Starts the loop in the background; returns at once. */
  start(): void {
    if (this.running) return;
    const aborter = new AbortController();
    this.aborter = aborter;
    this.running = this.run(aborter.signal);
  }

  /** Aborts the request in flight or the backoff wait; resolves once no handler runs any more. */
  async stop(): Promise<void> {
    this.aborter?.abort();
    await this.running;
    this.running = undefined;
  }

  private async run(signal: AbortSignal): Promise<void> {
    const { log, path } = this.o;
    let rv = '';
    while (!signal.aborted) {
      const progress = { events: 0, openedAt: 0 };
      let failure: unknown;
      try {
        await this.health.turn(signal); // at once while the API server answers; paced while it is away
        if (!rv) {
          rv = await this.list(signal);
          this.health.answered();
        }
        await this.watch(
          rv,
          signal,
          () => {
            progress.openedAt = Date.now();
            this.health.answered();
          },
          (next, event) => {
            rv = next;
            if (event) progress.events++;
          },
        );
      } catch (err) {
        failure = err;
      }
      if (signal.aborted) break;
      if (failure === undefined) {
        const openMs = Date.now() - progress.openedAt;
        if (progress.events > 0 || openMs >= SHORT_WATCH_MS) {
          log.debug({ path, resourceVersion: rv, openMs }, 'watch closed by the API server; watching again');
          continue;
        }
        failure = new KubeApiError(`watch of ${path} ended after ${openMs} ms without an event`, { away: true });
      }
      if (this.o.stopOn?.(failure) === true) break;
      if (isGone(failure)) {
        rv = ''; // compacted away: only a fresh list helps, and it is made now
        log.info({ path, err: failure }, 'the resourceVersion expired; listing again');
        continue;
      }
      if (isOutage(failure)) {
        const first = !this.health.isDown;
        this.health.failed(failure);
        // Refused: no API server listens (restarting). A new one's watch cache starts at the current
        // revision, so a watch from ours would only earn a 410: list at once when it answers.
        if ((failure as { code?: unknown }).code === 'ECONNREFUSED') rv = '';
        log[first ? 'warn' : 'debug'](
          { err: failure, path, retryEveryMs: this.health.periodMs },
          'list/watch failed: the API server is away; retrying about once a period (jittered) until it answers',
        );
        continue;
      }
      this.health.answered(); // an error answer is an answer
      const delay = this.backoff.next();
      log.warn({ err: failure, path, retryInMs: delay, relist: rv === '' }, 'list/watch failed; retrying');
      await ApiHealth.pause(delay, signal);
    }
  }

  /** A whole list (all pages), handed to onList; its resourceVersion. */
  private async list(signal: AbortSignal): Promise<string> {
    // In pages of LIST_PAGE_SIZE, as client-go's reflector lists: no answer of thousands of
    // objects held as one string (a Node is 2-4 kB of JSON).
    const { path } = this.o;
    const items: T[] = [];
    let cont = '';
    let listRv = '';
    do {
      const query: Record<string, string> = {
        fieldSelector: this.o.fieldSelector,
        limit: String(LIST_PAGE_SIZE),
        ...(cont ? { continue: cont } : {}),
      };
      const page = await this.o.api.getJson<KubernetesListObject<T>>(path, query, signal);
      for (const item of page.items ?? []) items.push(item);
      // Raw JSON: the field is `continue` (client-node's type calls it `_continue` after its own mapping).
      cont = (page.metadata as { continue?: string } | undefined)?.continue ?? '';
      listRv = page.metadata?.resourceVersion ?? '';
    } while (cont);
    await this.o.onList(items);
    this.o.log.debug({ path, resourceVersion: listRv, items: items.length }, 'listed');
    return listRv; // only a whole list (all pages, handed over) is a place to watch from
  }

  /** One watch request from `rv`; resolves when the server ends it, throws when it fails or breaks. */
  private async watch(rv: string, signal: AbortSignal, opened: () => void, seen: (rv: string, event: boolean) => void): Promise<void> {
    const timeoutS = Math.round(WATCH_TIMEOUT_S * (1 + Math.random()));
    const query = {
      fieldSelector: this.o.fieldSelector,
      resourceVersion: rv,
      watch: 'true',
      allowWatchBookmarks: 'true',
      timeoutSeconds: String(timeoutS),
    };
    const res = await this.o.api.open(this.o.path, query, (timeoutS + 30) * 1000, signal);
    if (res.statusCode !== 200) throw statusError(this.o.path, res.statusCode, await readBody(res));
    opened();
    res.setEncoding('utf8');
    let buf = '';
    for await (const chunk of res) {
      buf += chunk as string;
      for (let nl = buf.indexOf('\n'); nl >= 0; nl = buf.indexOf('\n')) {
        const line = buf.slice(0, nl).trim();
        buf = buf.slice(nl + 1);
        if (line) await this.event(line, seen);
      }
    }
    if (!res.complete) throw new KubeApiError(`watch of ${this.o.path} broke off`, { away: true });
  }

  private async event(line: string, seen: (rv: string, event: boolean) => void): Promise<void> {
    let ev: { type?: string; object?: T & Partial<V1Status> };
    try {
      ev = JSON.parse(line) as typeof ev;
    } catch (err) {
      throw new KubeApiError(`watch of ${this.o.path}: invalid event line ${JSON.stringify(line.slice(0, 100))}`, {}, { cause: err });
    }
    const obj = ev.object;
    if (ev.type === 'ERROR') {
      // A Status; 410 Expired means our resourceVersion is too old. Either way this watch is over.
      throw new KubeApiError(
        `watch of ${this.o.path}: ${obj?.code ?? ''} ${obj?.reason ?? ''} ${obj?.message ?? ''}`.replace(/\s+/g, ' '),
        { status: obj?.code, reason: obj?.reason },
      );
    }
    if (!obj) return;
    const change = ev.type === 'ADDED' || ev.type === 'MODIFIED' || ev.type === 'DELETED';
    if (change) await this.o.onEvent(ev.type as WatchEventType, obj);
    const next = obj.metadata?.resourceVersion;
    if (next) seen(next, change); // a BOOKMARK only moves the resourceVersion
  }
}
