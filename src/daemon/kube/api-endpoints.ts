/**
 * In a pod the API server is reached at its Service address (KUBERNETES_SERVICE_HOST, e.g.
 * 10.96.0.1:443), which kube-proxy translates to the API servers' own addresses. After a control
 * plane restart that path lags the API server: a kube-apiserver shutting down takes itself out of
 * the `kubernetes` Service's endpoints, so kube-proxy rejects the Service address until it has seen
 * the API server put itself back, and kube-proxy's own watch is then in client-go's backoff
 * (measured on the local cluster: the Service address refused connections 8-10 s after the API
 * server accepted writes on its own address). A network plugin should not wait on kube-proxy.
 *
 * So in cluster mode the agent learns the API servers' own addresses from the `kubernetes`
 * EndpointSlice in `default` (RBAC: get/list/watch on that one object) and connects to them
 * directly, the Service address last: `ApiEndpoints` is the agent's one KubeClientConfig, whose
 * target is the first of [API server addresses..., Service address]; a connection that fails (the
 * API server away) moves it to the next. An empty EndpointSlice (an API server shutting down)
 * keeps the addresses known: they are where it comes back. TLS is verified against the Service
 * address's host, as before (the API server's certificate names it), whatever address is dialled.
 * Without the RBAC (an older manifest) the Service address alone is used, said once.
 */
import { checkServerIdentity, type PeerCertificate } from 'node:tls';
import type { RequestOptions } from 'node:https';
import type { Logger } from '../../log.js';
import { moduleLogger } from '../../util/module-logger.js';
import type { KubeClientConfig } from './kubeconfig.js';
import { KubeApi, KubeApiError, ListWatchLoop, type RetryOptions } from './watch.js';

/** The EndpointSlice of the `kubernetes` Service (the fields read here). */
export interface ApiEndpointSlice {
  metadata?: { name?: string; resourceVersion?: string };
  addressType?: string;
  endpoints?: Array<{ addresses?: string[]; conditions?: { ready?: boolean | null } }>;
  ports?: Array<{ name?: string | null; port?: number | null }>;
}

/** The https URLs of a slice's ready endpoints (its `https` port, or its only port). */
export function endpointUrls(slice: ApiEndpointSlice): string[] {
  const ports = slice.ports ?? [];
  const port = (ports.find((p) => p.name === 'https') ?? (ports.length === 1 ? ports[0] : undefined))?.port;
  if (!port) return [];
  const out: string[] = [];
  for (const e of slice.endpoints ?? []) {
    if (e.conditions?.ready === false) continue;
    for (const a of e.addresses ?? []) out.push(`https://${a.includes(':') ? `[${a}]` : a}:${port}`);
  }
  return [...new Set(out)].sort();
}

export class ApiEndpoints implements KubeClientConfig {
  private direct: string[] = [];
  /** Index into targets(): where requests go now. */
  private at = 0;
  private readonly verifyHost: string;
  private readonly log: Logger | undefined;

  constructor(
    private readonly base: KubeClientConfig,
    logger?: Logger,
  ) {
    const server = base.getCurrentCluster()?.server ?? '';
    this.verifyHost = new URL(server).hostname.replace(/^\[(.*)\]$/, '$1');
    this.log = logger ? moduleLogger(logger, 'api-endpoints') : undefined;
  }

  /** The Service address (the configuration's server). */
  get service(): string {
    return this.base.getCurrentCluster()?.server ?? '';
  }

  /** Where requests go, in order of preference. */
  targets(): string[] {
    return [...this.direct, this.service];
  }

  getCurrentCluster(): { server: string } {
    const t = this.targets();
    return { server: t[this.at % t.length] ?? this.service };
  }

  async applyToHTTPSOptions(opts: RequestOptions): Promise<void> {
    await this.base.applyToHTTPSOptions(opts);
    if (this.getCurrentCluster().server === this.service) return;
    // Dialled by address: the certificate must still name the Service address, as it would via kube-proxy.
    const host = this.verifyHost;
    opts.checkServerIdentity = (_dialled: string, cert: PeerCertificate) => checkServerIdentity(host, cert);
  }

  unauthorized(opts: RequestOptions): boolean {
    return this.base.unauthorized?.(opts) ?? false;
  }

  /** A connection to `server` failed (refused, reset, timed out): the next target, if it still was the current one. */
  requestFailed(server: string): void {
    const t = this.targets();
    if (t.length < 2 || t[this.at % t.length] !== server) return;
    this.at = (this.at + 1) % t.length;
    this.log?.debug({ failed: server, next: t[this.at] }, 'the API server address failed; trying the next');
  }

  /** The `kubernetes` EndpointSlice as watched: its ready addresses (an empty one keeps those known). */
  setSlice(slice: ApiEndpointSlice | undefined): void {
    const urls = slice ? endpointUrls(slice) : [];
    if (urls.length === 0 || urls.join() === this.direct.join()) return;
    const current = this.getCurrentCluster().server;
    this.direct = urls;
    const i = this.targets().indexOf(current);
    this.at = i >= 0 && current !== this.service ? i : 0;
    this.log?.info(
      { addresses: urls, service: this.service },
      "the API servers' own addresses: connecting to them directly, the Service address last",
    );
  }
}

/** Where the `kubernetes` Service's EndpointSlice is (the API server writes it under the Service's name). */
export const API_ENDPOINTSLICE_PATH = '/apis/discovery.k8s.io/v1/namespaces/default/endpointslices';

/**
 * Keeps `endpoints` up to date from the `kubernetes` EndpointSlice (list + watch through the same
 * endpoints). A 403 (the manifest's Role not applied) or 404 ends it: the Service address alone is
 * used, and the log says what to apply.
 */
export class ApiEndpointsWatch {
  private readonly loop: ListWatchLoop<ApiEndpointSlice & { metadata?: { name?: string } }>;

  constructor(endpoints: ApiEndpoints, o: RetryOptions & { logger: Logger }) {
    const log = moduleLogger(o.logger, 'api-endpoints');
    this.loop = new ListWatchLoop({
      api: new KubeApi(endpoints),
      log,
      path: API_ENDPOINTSLICE_PATH,
      fieldSelector: 'metadata.name=kubernetes',
      retry: o,
      onList: (slices) => endpoints.setSlice(slices.find((x) => x.metadata?.name === 'kubernetes')),
      onEvent: (type, slice) => {
        if (type !== 'DELETED') endpoints.setSlice(slice);
      },
      stopOn: (err) => {
        if (!(err instanceof KubeApiError) || (err.status !== 403 && err.status !== 404)) return false;
        log.warn(
          { err },
          "cannot read the kubernetes EndpointSlice: the API server is reached through its Service address only (apply manifests/kubenet.yaml's Role kubenet-api-endpoints)",
        );
        return true;
      },
    });
  }

  start(): void {
    this.loop.start();
  }

  stop(): Promise<void> {
    return this.loop.stop();
  }
}
