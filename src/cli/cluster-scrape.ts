/**
 * `kubectl kubenet`'s reads, through the API server only: the agent pods (a namespace and a label
 * selector: the DaemonSet's), one per node, and each agent's /metrics through the API server's pod
 * proxy (`/api/v1/namespaces/NS/pods/POD:PORT/proxy/metrics`; PORT: the container port named
 * `metrics`, else 10266), many agents at once but at most `parallel` at a time.
 */
import type { IncomingMessage } from 'node:http';
import type { V1Pod, V1PodList } from '@kubernetes/client-node';
import { KubenetError } from '../errors.js';
import type { KubeApi } from '../daemon/kube/watch.js';
import { parseExposition, type MetricFamily } from './prom-text.js';

export const DEFAULT_AGENT_NAMESPACE = 'kube-system';
export const DEFAULT_AGENT_SELECTOR = 'app.kubernetes.io/name=kubenet';
export const DEFAULT_METRICS_PORT = 10266;
/** A scrape that receives no byte for this long fails. */
const SCRAPE_IDLE_MS = 10_000;

export interface AgentPod {
  namespace: string;
  name: string;
  node: string;
  port: number;
}

/** The answer of a request that failed: the Status message when the body is one, else its text. */
export class ScrapeError extends KubenetError {
  constructor(
    message: string,
    readonly status?: number,
  ) {
    super(message);
  }
}

/**
 * The agent pods, one per node (of several, a running one not being deleted, then the newest),
 * sorted by node; pods not scheduled yet are left out. `node`: only that node's.
 */
export async function listAgents(api: KubeApi, o: { namespace: string; selector: string; node?: string }): Promise<AgentPod[]> {
  const query: Record<string, string> = { labelSelector: o.selector };
  if (o.node !== undefined) query.fieldSelector = `spec.nodeName=${o.node}`;
  const list = await api.getJson<V1PodList>(`/api/v1/namespaces/${encodeURIComponent(o.namespace)}/pods`, query);
  const rank = (p: V1Pod) => (p.status?.phase === 'Running' ? 2 : 0) + (p.metadata?.deletionTimestamp ? 0 : 1);
  const byNode = new Map<string, V1Pod>();
  for (const p of list.items) {
    const node = p.spec?.nodeName;
    if (!node || (o.node !== undefined && node !== o.node)) continue;
    const had = byNode.get(node);
    const created = (x: V1Pod) => String(x.metadata?.creationTimestamp ?? '');
    if (!had || rank(p) > rank(had) || (rank(p) === rank(had) && created(p) > created(had))) byNode.set(node, p);
  }
  return [...byNode.entries()]
    .sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0))
    .map(([node, p]) => ({ namespace: p.metadata?.namespace ?? o.namespace, name: p.metadata?.name ?? '', node, port: metricsPort(p) }));
}

/** The container port named `metrics`, else DEFAULT_METRICS_PORT. */
export function metricsPort(p: V1Pod): number {
  for (const c of p.spec?.containers ?? [])
    for (const port of c.ports ?? []) if (port.name === 'metrics' && Number.isInteger(port.containerPort)) return port.containerPort;
  return DEFAULT_METRICS_PORT;
}

/** The path of an agent's /metrics through the API server's pod proxy. */
export function proxyPath(a: AgentPod): string {
  return `/api/v1/namespaces/${encodeURIComponent(a.namespace)}/pods/${encodeURIComponent(a.name)}:${a.port}/proxy/metrics`;
}

async function readText(res: IncomingMessage): Promise<string> {
  res.setEncoding('utf8');
  let body = '';
  for await (const chunk of res) body += chunk as string;
  return body;
}

/** An agent's /metrics, parsed. @throws ScrapeError (the API server's or the agent's answer was not 200), ExpositionError, a connection error */
export async function scrapeAgent(api: KubeApi, a: AgentPod, signal?: AbortSignal): Promise<Map<string, MetricFamily>> {
  const res = await api.open(proxyPath(a), {}, SCRAPE_IDLE_MS, signal);
  const body = await readText(res);
  if (res.statusCode !== 200) {
    let message = body.trim().slice(0, 300) || 'no details';
    try {
      const st = JSON.parse(body) as { message?: unknown };
      if (typeof st.message === 'string') message = st.message;
    } catch {
      // not a Status: the text as it is
    }
    throw new ScrapeError(`${res.statusCode ?? 0}: ${message}`, res.statusCode);
  }
  return parseExposition(body);
}

/** `fn` of every item, at most `limit` at a time; results in the items' order. */
export async function mapBounded<T, R>(items: readonly T[], limit: number, fn: (item: T, index: number) => Promise<R>): Promise<R[]> {
  const out = new Array<R>(items.length);
  let next = 0;
  const worker = async () => {
    while (next < items.length) {
      const i = next++;
      out[i] = await fn(items[i] as T, i);
    }
  };
  await Promise.all(Array.from({ length: Math.max(1, Math.min(limit, items.length)) }, worker));
  return out;
}
