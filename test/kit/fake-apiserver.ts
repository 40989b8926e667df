/**
 * A fake Kubernetes API server (node:http on 127.0.0.1) speaking enough of the real protocol for
 * the node agent: lists and watches of nodes, pods, namespaces and ServiceCIDRs (networking.k8s.io/v1,
 * or 404 as an API server before 1.33 answers: `serveServiceCidrs`) with field selectors and
 * resourceVersions, 410 for compacted resourceVersions, GET of one pod or namespace, creation (POST)
 * of core/v1 Events, which it records, and JSON merge patches (RFC 7386) of a Node's status
 * (`PATCH /api/v1/nodes/NAME/status`, as the agent publishes its bandwidth capacity), which it
 * applies (open watches get the Node MODIFIED) and records; pod lists of one namespace and label
 * selectors (equality terms); the pod proxy (`GET /api/v1/namespaces/NS/pods/NAME:PORT/proxy/PATH`),
 * answered by `proxy` (as `kubectl kubenet` scrapes the agents' /metrics), else 503 as kube-apiserver
 * answers when nothing listens there. Tests drive it: change objects (open watches get the events: a pod's new annotations
 * reach the agent as MODIFIED), close watches, expire resourceVersions, stall, fail, stop and
 * restart on the same port.
 */
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import { createServer as createTlsServer } from 'node:https';
import type { AddressInfo, Socket } from 'node:net';
import type { TLSSocket } from 'node:tls';
import { KubeConfig } from '@kubernetes/client-node';

type Kind = 'nodes' | 'pods' | 'namespaces' | 'servicecidrs';
type EventType = 'ADDED' | 'MODIFIED' | 'DELETED';

export interface FakeObject {
  metadata: { name: string; namespace?: string; resourceVersion?: string; annotations?: Record<string, string>; [k: string]: unknown };
  spec?: Record<string, unknown>;
  [k: string]: unknown;
}

export interface RecordedRequest {
  method: string;
  path: string;
  query: URLSearchParams;
  watch: boolean;
  authorization: string | undefined;
  /** TLS only: the subject CN of the client certificate the request came with (verified against `tls.ca`). */
  clientCert: string | undefined;
}

/** Serve HTTPS instead of HTTP. With `ca`, client certificates are asked for and verified against it. */
export interface FakeTls {
  key: Buffer | string;
  cert: Buffer | string;
  ca?: Buffer | string;
  /** Answer 401 to a request without a valid client certificate. */
  requireClientCert?: boolean;
}

/** One change; `before` is the object before it (undefined on create), `object` the object after (the last state on delete). */
interface Change {
  rv: number;
  kind: Kind;
  type: EventType;
  before: FakeObject | undefined;
  object: FakeObject;
}

type Selector = Array<[field: string, value: string]>;

interface WatchStream {
  kind: Kind;
  selector: Selector;
  res: ServerResponse;
  /** The client asked for bookmarks (allowWatchBookmarks=true). */
  bookmarks: boolean;
}

/** A core/v1 Event as the agent POSTs it (the fields the tests read). */
export interface RecordedEvent {
  metadata: { name: string; namespace: string };
  involvedObject: { kind: string; namespace: string; name: string; uid?: string };
  reason: string;
  message: string;
  type: 'Normal' | 'Warning';
  source?: { component?: string; host?: string };
  /** When the fake received it (Date.now()). */
  receivedAt: number;
  [k: string]: unknown;
}

/** A request through the pod proxy: the pod, the port asked for (undefined: none given) and the path after /proxy. */
export interface ProxyRequest {
  namespace: string;
  pod: string;
  port: number | undefined;
  path: string;
}

/** The pod's answer through the proxy; `status` 503 is also how kube-apiserver says it could not reach the pod. */
export interface ProxyAnswer {
  status: number;
  body: string;
  contentType?: string;
}

/** A PATCH of a Node's status as received. */
export interface RecordedPatch {
  node: string;
  contentType: string | undefined;
  patch: unknown;
}

export class FakeApiServer {
  readonly requests: RecordedRequest[] = [];
  /** Node status patches, in arrival order (also those refused). */
  readonly patches: RecordedPatch[] = [];
  /** Events created through POST /api/v1/namespaces/NS/events, in arrival order. */
  readonly events: RecordedEvent[] = [];
  /** How a watch from a compacted resourceVersion is refused: 200 + ERROR event (as kube-apiserver does) or HTTP 410. */
  goneMode: 'event' | 'status' = 'event';
  /** When true, requests are accepted and never answered (an API server that hangs). */
  stall = false;
  /** Return an HTTP status to fail a request with it (a Status body is sent). */
  failWith: ((req: RecordedRequest) => number | undefined) | undefined;
  /** Answers requests through the pod proxy to pods that exist; undefined (or answering undefined): 503, nothing reachable there. */
  proxy: ((req: ProxyRequest) => ProxyAnswer | undefined | Promise<ProxyAnswer | undefined>) | undefined;
  /** False: /apis/networking.k8s.io/v1/servicecidrs is 404, as on an API server that does not serve it (Kubernetes < 1.33). */
  serveServiceCidrs = true;
  port = 0;
  private rv = 1;
  /** Watches from a resourceVersion below this get 410 Gone. */
  private compactedRv = 0;
  private readonly objects: Record<Kind, Map<string, FakeObject>> = {
    nodes: new Map(),
    pods: new Map(),
    namespaces: new Map(),
    servicecidrs: new Map(),
  };
  private readonly history: Change[] = [];
  private readonly watches = new Set<WatchStream>();
  private readonly sockets = new Set<Socket>();
  /** "kind/key" → the highest resourceVersion of that object written to an open watch (handed to the kernel). */
  private readonly deliveredRv = new Map<string, number>();
  private server: Server | undefined;

  constructor(private readonly tls?: FakeTls) {}

  static async start(tls?: FakeTls): Promise<FakeApiServer> {
    const s = new FakeApiServer(tls);
    await s.start();
    return s;
  }

  get url(): string {
    return `${this.tls ? 'https' : 'http'}://127.0.0.1:${this.port}`;
  }

  get running(): boolean {
    return this.server !== undefined;
  }

  get openWatches(): number {
    return this.watches.size;
  }

  /** Open client connections (0 once every client has let go). */
  get connections(): number {
    return this.sockets.size;
  }

  /** The current resourceVersion (what a list returns now). */
  get resourceVersion(): string {
    return String(this.rv);
  }

  /** Listens on 127.0.0.1: a fresh port the first time, the same port after stop(). State is kept. */
  async start(): Promise<void> {
    const tls = this.tls;
    const server = tls
      ? createTlsServer(
          { key: tls.key, cert: tls.cert, ...(tls.ca ? { ca: tls.ca, requestCert: true, rejectUnauthorized: false } : {}) },
          (req, res) => this.handle(req, res),
        )
      : createServer((req, res) => this.handle(req, res));
    server.on(tls ? 'secureConnection' : 'connection', (s: Socket) => {
      this.sockets.add(s);
      s.once('close', () => this.sockets.delete(s));
    });
    await new Promise<void>((ok, fail) => {
      server.once('error', fail);
      server.listen(this.port, '127.0.0.1', () => ok());
    });
    this.port = (server.address() as AddressInfo).port;
    this.server = server;
  }

  /** The API server goes away: every connection is cut (watches break off), the port refuses. */
  async stop(): Promise<void> {
    const server = this.server;
    if (!server) return;
    this.server = undefined;
    this.watches.clear();
    await new Promise<void>((ok) => {
      server.close(() => ok());
      server.closeAllConnections();
    });
  }

  /** Ends every open watch cleanly (as the API server does at timeoutSeconds). */
  closeWatches(): void {
    for (const w of this.watches) w.res.end();
    this.watches.clear();
  }

  /**
   * A BOOKMARK on every open watch that asked for them: an object of the watch's kind carrying only
   * the current resourceVersion (as kube-apiserver sends about once a minute).
   */
  bookmark(): void {
    for (const w of this.watches)
      if (w.bookmarks)
        writeEvent(w.res, 'BOOKMARK', {
          kind: KIND_OF[w.kind],
          apiVersion: w.kind === 'servicecidrs' ? 'networking.k8s.io/v1' : 'v1',
          metadata: { resourceVersion: String(this.rv) },
        });
  }

  /** Writes that no watch sees (another kind, or objects outside every selector): the resourceVersion moves on. */
  advance(by = 1): void {
    this.rv += by;
  }

  /** Compacts history: every resourceVersion handed out so far becomes too old (410); open watches end (with an ERROR event in 'event' mode). */
  expire(): void {
    this.compactedRv = ++this.rv;
    for (const w of this.watches) {
      if (this.goneMode === 'event') writeEvent(w.res, 'ERROR', goneStatus(this.compactedRv - 1, this.compactedRv));
      w.res.end();
    }
    this.watches.clear();
  }

  setNode(node: FakeObject): void {
    this.put('nodes', node.metadata.name, node);
  }

  deleteNode(name: string): void {
    this.remove('nodes', name);
  }

  setPod(pod: FakeObject): void {
    this.put('pods', `${pod.metadata.namespace ?? 'default'}/${pod.metadata.name}`, {
      ...pod,
      metadata: { namespace: 'default', ...pod.metadata },
    });
  }

  deletePod(namespace: string, name: string): void {
    this.remove('pods', `${namespace}/${name}`);
  }

  /** The pod as stored now (a copy), or undefined. */
  getPod(namespace: string, name: string): FakeObject | undefined {
    const p = this.objects.pods.get(`${namespace}/${name}`);
    return p ? structuredClone(p) : undefined;
  }

  /**
   * Changes a pod's annotations as `kubectl annotate` does (null removes one): the stored pod gets
   * a new resourceVersion and open watches a MODIFIED event.
   */
  annotatePod(namespace: string, name: string, changes: Record<string, string | null>): void {
    const p = this.getPod(namespace, name);
    if (!p) throw new Error(`fake API server: no pod ${namespace}/${name}`);
    const annotations = { ...p.metadata.annotations };
    for (const [k, v] of Object.entries(changes)) {
      if (v === null) delete annotations[k];
      else annotations[k] = v;
    }
    this.setPod({ ...p, metadata: { ...p.metadata, annotations } });
  }

  setNamespace(ns: FakeObject): void {
    this.put('namespaces', ns.metadata.name, ns);
  }

  deleteNamespace(name: string): void {
    this.remove('namespaces', name);
  }

  /** Changes a namespace's annotations as `kubectl annotate namespace` does (null removes one; a missing namespace is made). */
  annotateNamespace(name: string, changes: Record<string, string | null>): void {
    const ns = structuredClone(this.objects.namespaces.get(name) ?? namespace(name));
    const annotations = { ...ns.metadata.annotations };
    for (const [k, v] of Object.entries(changes)) {
      if (v === null) delete annotations[k];
      else annotations[k] = v;
    }
    this.setNamespace({ ...ns, metadata: { ...ns.metadata, annotations } });
  }

  setServiceCidr(obj: FakeObject): void {
    this.put('servicecidrs', obj.metadata.name, obj);
  }

  deleteServiceCidr(name: string): void {
    this.remove('servicecidrs', name);
  }

  /** Events about one pod, optionally of one reason. */
  eventsFor(namespace: string, name: string, reason?: string): RecordedEvent[] {
    return this.events.filter(
      (e) => e.involvedObject.namespace === namespace && e.involvedObject.name === name && (reason === undefined || e.reason === reason),
    );
  }

  /**
   * Whether the object's current state has been written to an open watch that selects it (handed to
   * the kernel; the watcher may still be reading it). Keys: a Node's name, a pod's "namespace/name".
   */
  delivered(kind: Kind, key: string): boolean {
    const obj = this.objects[kind].get(key);
    return obj !== undefined && (this.deliveredRv.get(`${kind}/${key}`) ?? 0) >= Number(obj.metadata.resourceVersion);
  }

  /** Waits until `delivered` holds for every key; throws after `timeoutMs`. */
  async waitDelivered(kind: Kind, keys: string[], timeoutMs = 10_000): Promise<void> {
    const deadline = Date.now() + timeoutMs;
    while (!keys.every((k) => this.delivered(kind, k))) {
      if (Date.now() > deadline)
        throw new Error(
          `fake API server: ${kind} ${keys.filter((k) => !this.delivered(kind, k)).join(', ')} not delivered to a watch within ${timeoutMs} ms`,
        );
      await new Promise((r) => setTimeout(r, 2));
    }
  }

  /** Requests by path (exact) and kind of request. */
  count(path: string, what: 'list' | 'watch' | 'get' | 'any' = 'any'): number {
    return this.requests.filter((r) => r.path === path && (what === 'any' || (what === 'watch') === r.watch)).length;
  }

  private put(kind: Kind, k: string, obj: FakeObject): void {
    const before = this.objects[kind].get(k);
    const object = structuredClone(obj);
    object.metadata.resourceVersion = String(++this.rv);
    this.objects[kind].set(k, object);
    this.emit({ rv: this.rv, kind, type: before ? 'MODIFIED' : 'ADDED', before, object });
  }

  private remove(kind: Kind, k: string): void {
    const before = this.objects[kind].get(k);
    if (!before) return;
    this.objects[kind].delete(k);
    const object = { ...before, metadata: { ...before.metadata, resourceVersion: String(++this.rv) } };
    this.emit({ rv: this.rv, kind, type: 'DELETED', before, object });
  }

  private emit(change: Change): void {
    this.history.push(change);
    for (const w of this.watches) if (w.kind === change.kind) this.sendChange(w, change);
  }

  /** A change as the watcher sees it through its selector: objects entering it are ADDED, leaving it DELETED. */
  private sendChange(w: WatchStream, c: Change): void {
    const was = c.before !== undefined && matches(w.selector, c.before);
    const is = c.type !== 'DELETED' && matches(w.selector, c.object);
    if (is) this.writeObject(w, was ? 'MODIFIED' : 'ADDED', c.object);
    else if (was) writeEvent(w.res, 'DELETED', c.object);
  }

  /** Writes an ADDED/MODIFIED event and notes, once the kernel has it, that this state was delivered. */
  private writeObject(w: WatchStream, type: 'ADDED' | 'MODIFIED', obj: FakeObject): void {
    const key = `${w.kind}/${w.kind === 'pods' ? `${obj.metadata.namespace ?? 'default'}/${obj.metadata.name}` : obj.metadata.name}`;
    const rv = Number(obj.metadata.resourceVersion);
    writeEvent(w.res, type, obj, () => {
      if ((this.deliveredRv.get(key) ?? 0) < rv) this.deliveredRv.set(key, rv);
    });
  }

  private handle(req: IncomingMessage, res: ServerResponse): void {
    const url = new URL(req.url ?? '/', 'http://fake');
    const watch = ['true', '1'].includes(url.searchParams.get('watch') ?? '');
    const peer = this.tls?.ca ? (req.socket as TLSSocket) : undefined;
    const cn = peer?.authorized ? peer.getPeerCertificate().subject?.CN : undefined;
    const rec: RecordedRequest = {
      method: req.method ?? '',
      path: url.pathname,
      query: url.searchParams,
      watch,
      authorization: req.headers.authorization,
      clientCert: cn,
    };
    this.requests.push(rec);
    if (this.tls?.requireClientCert && !cn) return sendStatus(res, 401, 'Unauthorized', 'a client certificate is required');
    if (this.stall) return; // never answered; cut by the client or by stop()
    const failure = this.failWith?.(rec);
    if (failure) return sendStatus(res, failure, REASONS[failure] ?? 'InternalError', `injected failure ${failure}`);
    const ev = /^\/api\/v1\/namespaces\/([^/]+)\/events$/.exec(url.pathname);
    if (req.method === 'POST' && ev) return this.createEvent(decodeURIComponent(ev[1] ?? ''), req, res);
    const st = /^\/api\/v1\/nodes\/([^/]+)\/status$/.exec(url.pathname);
    if (req.method === 'PATCH' && st) return this.patchNodeStatus(decodeURIComponent(st[1] ?? ''), req, res);
    if (req.method !== 'GET') return sendStatus(res, 405, 'MethodNotAllowed', `${req.method} is not supported by the fake`);
    if (url.pathname === '/api/v1/nodes') return this.collection('nodes', url, watch, res);
    if (url.pathname === '/api/v1/pods') return this.collection('pods', url, watch, res);
    if (url.pathname === '/api/v1/namespaces') return this.collection('namespaces', url, watch, res);
    const nsPods = /^\/api\/v1\/namespaces\/([^/]+)\/pods$/.exec(url.pathname);
    if (nsPods) return this.collection('pods', url, watch, res, [['metadata.namespace', decodeURIComponent(nsPods[1] ?? '')]]);
    const proxy = /^\/api\/v1\/namespaces\/([^/]+)\/pods\/([^/]+)\/proxy(\/.*)?$/.exec(url.pathname);
    if (proxy) return void this.proxyTo(decodeURIComponent(proxy[1] ?? ''), decodeURIComponent(proxy[2] ?? ''), proxy[3] ?? '/', res);
    if (url.pathname === '/apis/networking.k8s.io/v1/servicecidrs' && this.serveServiceCidrs)
      return this.collection('servicecidrs', url, watch, res);
    const n = /^\/api\/v1\/namespaces\/([^/]+)$/.exec(url.pathname);
    if (n) {
      const name = decodeURIComponent(n[1] ?? '');
      const ns = this.objects.namespaces.get(name);
      if (ns) return sendJson(res, 200, { apiVersion: 'v1', kind: 'Namespace', ...ns });
      return sendStatus(res, 404, 'NotFound', `namespaces "${name}" not found`);
    }
    const m = /^\/api\/v1\/namespaces\/([^/]+)\/pods\/([^/]+)$/.exec(url.pathname);
    if (m) {
      const [ns, name] = [decodeURIComponent(m[1] ?? ''), decodeURIComponent(m[2] ?? '')];
      const pod = this.objects.pods.get(`${ns}/${name}`);
      if (pod) return sendJson(res, 200, { apiVersion: 'v1', kind: 'Pod', ...pod });
      return sendStatus(res, 404, 'NotFound', `pods "${name}" not found`);
    }
    sendStatus(res, 404, 'NotFound', `the server could not find the requested resource (${url.pathname})`);
  }

  /** POST of a core/v1 Event: checked as the API server would for the fields the agent sets, recorded, 201. */
  private createEvent(namespace: string, req: IncomingMessage, res: ServerResponse): void {
    const chunks: Buffer[] = [];
    req.on('data', (c: Buffer) => chunks.push(c));
    req.on('end', () => {
      let ev: RecordedEvent;
      try {
        ev = JSON.parse(Buffer.concat(chunks).toString('utf8')) as RecordedEvent;
      } catch {
        return sendStatus(res, 400, 'BadRequest', 'the body is not JSON');
      }
      const bad =
        ev.kind !== 'Event'
          ? 'kind must be Event'
          : !ev.metadata?.name
            ? 'metadata.name is required'
            : ev.metadata.namespace !== namespace
              ? 'metadata.namespace does not match the request'
              : ev.involvedObject?.namespace !== namespace
                ? 'involvedObject.namespace does not match the event namespace'
                : !ev.reason || !ev.message
                  ? 'reason and message are required'
                  : ev.type !== 'Normal' && ev.type !== 'Warning'
                    ? 'type must be Normal or Warning'
                    : undefined;
      if (bad) return sendStatus(res, 422, 'Invalid', `Event "${ev.metadata?.name}" is invalid: ${bad}`);
      if (this.events.some((e) => e.metadata.namespace === namespace && e.metadata.name === ev.metadata.name)) {
        return sendStatus(res, 409, 'AlreadyExists', `events "${ev.metadata.name}" already exists`);
      }
      const stored = {
        ...ev,
        metadata: { ...ev.metadata, resourceVersion: String(++this.rv), uid: `event-${this.rv}` },
        receivedAt: Date.now(),
      };
      this.events.push(stored);
      const { receivedAt: _t, ...answer } = stored;
      sendJson(res, 201, answer);
    });
  }

  /** PATCH of a Node's status: a JSON merge patch of `status` and `metadata` (the subresource resets only `spec`), applied; 200 with the Node. */
  private patchNodeStatus(name: string, req: IncomingMessage, res: ServerResponse): void {
    const chunks: Buffer[] = [];
    req.on('data', (c: Buffer) => chunks.push(c));
    req.on('end', () => {
      const contentType = req.headers['content-type'];
      let patch: unknown;
      try {
        patch = JSON.parse(Buffer.concat(chunks).toString('utf8'));
      } catch {
        return sendStatus(res, 400, 'BadRequest', 'the body is not JSON');
      }
      this.patches.push({ node: name, contentType, patch });
      if (contentType !== 'application/merge-patch+json')
        return sendStatus(res, 415, 'UnsupportedMediaType', `the fake takes merge patches only, not ${contentType}`);
      const node = this.objects.nodes.get(name);
      if (!node) return sendStatus(res, 404, 'NotFound', `nodes "${name}" not found`);
      // A Node's status subresource resets only spec (pkg/registry/core/node nodeStatusStrategy): status and metadata apply.
      const { status, metadata } = (patch ?? {}) as { status?: unknown; metadata?: unknown };
      const next = structuredClone(node);
      next.status = mergePatch(next.status ?? {}, status ?? {}) as Record<string, unknown>;
      if (metadata !== undefined) next.metadata = mergePatch(next.metadata ?? {}, metadata) as typeof next.metadata;
      this.setNode(next);
      sendJson(res, 200, { apiVersion: 'v1', kind: 'Node', ...this.objects.nodes.get(name) });
    });
  }

  /** GET through the pod proxy: 404 for a pod that does not exist, else `proxy`'s answer or 503. */
  private async proxyTo(namespace: string, nameAndPort: string, path: string, res: ServerResponse): Promise<void> {
    const m = /^([^:]+)(?::(\d+))?$/.exec(nameAndPort);
    const name = m?.[1] ?? nameAndPort;
    if (!this.objects.pods.has(`${namespace}/${name}`)) return sendStatus(res, 404, 'NotFound', `pods "${name}" not found`);
    const port = m?.[2] !== undefined ? Number(m[2]) : undefined;
    // A hook that throws: nothing answered, as when the pod's port is closed.
    const answer = await Promise.resolve(this.proxy?.({ namespace, pod: name, port, path })).catch(() => undefined);
    if (!answer)
      return sendStatus(
        res,
        503,
        'ServiceUnavailable',
        `error trying to reach service: dial tcp 10.0.0.1:${port ?? 80}: connect: connection refused`,
      );
    res.writeHead(answer.status, { 'content-type': answer.contentType ?? 'text/plain; version=0.0.4; charset=utf-8' });
    res.end(answer.body);
  }

  /** The Node as stored now (a copy), or undefined. */
  getNode(name: string): FakeObject | undefined {
    const n = this.objects.nodes.get(name);
    return n ? structuredClone(n) : undefined;
  }

  private collection(kind: Kind, url: URL, watch: boolean, res: ServerResponse, scope: Selector = []): void {
    const fields = parseSelector(url.searchParams.get('fieldSelector') ?? '');
    if (!fields) return sendStatus(res, 400, 'BadRequest', `unsupported fieldSelector ${url.searchParams.get('fieldSelector')}`);
    const labels = parseLabelSelector(url.searchParams.get('labelSelector') ?? '');
    if (!labels) return sendStatus(res, 400, 'BadRequest', `unsupported labelSelector ${url.searchParams.get('labelSelector')}`);
    const selector = [...scope, ...fields, ...labels];
    const current = [...this.objects[kind].values()].filter((o) => matches(selector, o));
    if (!watch) {
      const listKind =
        kind === 'nodes' ? 'NodeList' : kind === 'pods' ? 'PodList' : kind === 'namespaces' ? 'NamespaceList' : 'ServiceCIDRList';
      return sendJson(res, 200, {
        apiVersion: kind === 'servicecidrs' ? 'networking.k8s.io/v1' : 'v1',
        kind: listKind,
        metadata: { resourceVersion: String(this.rv) },
        items: current,
      });
    }
    const from = url.searchParams.get('resourceVersion') ?? '';
    const fromRv = from === '' || from === '0' ? undefined : Number(from);
    if (fromRv !== undefined && (!Number.isInteger(fromRv) || fromRv < this.compactedRv)) {
      if (this.goneMode === 'status') return sendJson(res, 410, goneStatus(fromRv, this.compactedRv));
      res.writeHead(200, { 'content-type': 'application/json' });
      writeEvent(res, 'ERROR', goneStatus(fromRv, this.compactedRv));
      res.end();
      return;
    }
    res.writeHead(200, { 'content-type': 'application/json', 'transfer-encoding': 'chunked' });
    res.flushHeaders();
    const w: WatchStream = { kind, selector, res, bookmarks: url.searchParams.get('allowWatchBookmarks') === 'true' };
    // No resourceVersion: the current state as ADDED events, then changes. Else every change after it.
    if (fromRv === undefined) for (const o of current) this.writeObject(w, 'ADDED', o);
    else for (const c of this.history) if (c.rv > fromRv && c.kind === kind) this.sendChange(w, c);
    this.watches.add(w);
    res.on('close', () => this.watches.delete(w));
  }
}

/** RFC 7386: objects merge key by key, null removes a key, anything else replaces. */
function mergePatch(target: unknown, patch: unknown): unknown {
  if (patch === null || typeof patch !== 'object' || Array.isArray(patch)) return patch;
  const out: Record<string, unknown> =
    target !== null && typeof target === 'object' && !Array.isArray(target) ? { ...(target as Record<string, unknown>) } : {};
  for (const [k, v] of Object.entries(patch)) {
    if (v === null) delete out[k];
    else out[k] = mergePatch(out[k], v);
  }
  return out;
}

const KIND_OF: Record<Kind, string> = { nodes: 'Node', pods: 'Pod', namespaces: 'Namespace', servicecidrs: 'ServiceCIDR' };

function writeEvent(res: ServerResponse, type: EventType | 'ERROR' | 'BOOKMARK', object: unknown, written?: () => void): void {
  res.write(JSON.stringify({ type, object }) + '\n', written && ((err) => !err && written()));
}

/** "a=b,c==d" → [[a,b],[c,d]]; undefined for anything else (!=, set-based). */
function parseSelector(s: string): Selector | undefined {
  const out: Selector = [];
  for (const term of s.split(',').filter((t) => t !== '')) {
    const m = /^([\w.]+)==?([^=!]*)$/.exec(term);
    if (!m) return undefined;
    out.push([m[1] ?? '', m[2] ?? '']);
  }
  return out;
}

/** "a=b,c==d" on labels → [["label:a","b"],["label:c","d"]]; undefined for anything else (!=, set-based). */
function parseLabelSelector(s: string): Selector | undefined {
  const out: Selector = [];
  for (const term of s.split(',').filter((t) => t !== '')) {
    const m = /^\s*([\w./-]+)\s*==?\s*([\w.-]*)\s*$/.exec(term);
    if (!m) return undefined;
    out.push([`label:${m[1] ?? ''}`, m[2] ?? '']);
  }
  return out;
}

function matches(selector: Selector, obj: FakeObject): boolean {
  return selector.every(([field, value]) => {
    if (field.startsWith('label:')) return ((obj.metadata.labels ?? {}) as Record<string, string>)[field.slice('label:'.length)] === value;
    const v = field.split('.').reduce<unknown>((o, p) => (o && typeof o === 'object' ? (o as Record<string, unknown>)[p] : undefined), obj);
    return String(v ?? '') === value;
  });
}

function goneStatus(fromRv: number, compactedRv: number) {
  return {
    kind: 'Status',
    apiVersion: 'v1',
    metadata: {},
    status: 'Failure',
    reason: 'Expired',
    code: 410,
    message: `too old resource version: ${fromRv} (${compactedRv})`,
  };
}

const REASONS: Record<number, string> = {
  401: 'Unauthorized',
  403: 'Forbidden',
  404: 'NotFound',
  429: 'TooManyRequests',
  503: 'ServiceUnavailable',
};

function sendJson(res: ServerResponse, status: number, body: unknown): void {
  res.writeHead(status, { 'content-type': 'application/json' });
  res.end(JSON.stringify(body));
}

function sendStatus(res: ServerResponse, code: number, reason: string, message: string): void {
  sendJson(res, code, { kind: 'Status', apiVersion: 'v1', metadata: {}, status: 'Failure', reason, message, code });
}

/**
 * A KubeConfig for the fake over plain http. client-node 1.4.0 refuses an http:// server unless
 * skipTLSVerify is set ("HTTP protocol is not allowed when skipTLSVerify is not set or false").
 */
export function fakeKubeConfig(server: string | FakeApiServer, token = 'fake-token'): KubeConfig {
  const kc = new KubeConfig();
  kc.loadFromOptions({
    clusters: [{ name: 'fake', server: typeof server === 'string' ? server : server.url, skipTLSVerify: true }],
    users: [{ name: 'tester', token }],
    contexts: [{ name: 'fake', cluster: 'fake', user: 'tester' }],
    currentContext: 'fake',
  });
  return kc;
}

/** Test object builders. */
export function node(name: string, spec: { podCIDR?: string; podCIDRs?: string[] } = {}, labels: Record<string, string> = {}): FakeObject {
  return { apiVersion: 'v1', kind: 'Node', metadata: { name, labels }, spec: { ...spec } };
}

/** A ServiceCIDR (networking.k8s.io/v1) holding `cidrs` (at most one per family). */
export function serviceCidr(name: string, cidrs: string[]): FakeObject {
  return { apiVersion: 'networking.k8s.io/v1', kind: 'ServiceCIDR', metadata: { name }, spec: { cidrs } };
}

export function namespace(name: string, annotations: Record<string, string> = {}): FakeObject {
  return { apiVersion: 'v1', kind: 'Namespace', metadata: { name, annotations, uid: `uid-ns-${name}` }, spec: {} };
}

export function pod(namespace: string, name: string, nodeName: string, annotations: Record<string, string> = {}): FakeObject {
  return {
    apiVersion: 'v1',
    kind: 'Pod',
    metadata: { namespace, name, annotations, uid: `uid-${namespace}-${name}` },
    spec: { nodeName, containers: [{ name: 'c', image: 'pause' }] },
  };
}
