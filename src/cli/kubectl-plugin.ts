/**
 * `kubectl kubenet` (the bin kubectl-kubenet.ts): the cluster-wide view, read through the API
 * server only. `top`: every node's pods by throttling, from two scrapes of each agent's /metrics
 * (pod proxy) `--interval` apart; `status NODE`: one node as its agent describes itself in
 * /metrics (kubenet_info, kubenet_pod_info), with its pods' limits and rates. Agents that cannot be
 * reached are named on stderr; the exit code is 1 when none could be (2: a usage error).
 */
import { parseArgs } from 'node:util';
import { setTimeout as sleep } from 'node:timers/promises';
import { ConfigError } from '../errors.js';
import { KubeApi } from '../daemon/kube/watch.js';
import { kubectlCredentials, type KubeClientConfig } from '../daemon/kube/kubeconfig.js';
import { DEFAULT_AGENT_NAMESPACE, DEFAULT_AGENT_SELECTOR, listAgents, mapBounded, scrapeAgent, type AgentPod } from './cluster-scrape.js';
import {
  renderClusterTop,
  renderNodeStatus,
  rowsOf,
  snapshotOf,
  sortRows,
  windowOf,
  type NodeSnapshot,
  type PodRow,
} from './cluster-view.js';
import { wrap } from './wrap.js';

export const HELP = [
  'usage:',
  '  kubectl kubenet top [--node NODE] [-n|--namespace NS] [--interval SECONDS] [--json] [options]',
  '  kubectl kubenet status NODE [--interval SECONDS] [--json] [options]',
  '',
  ...wrap(
    "The cluster-wide view of kubenet-ts, read through the API server only: each node's agent pod (the DaemonSet's) is scraped twice, --interval apart, through the API server's pod proxy (GET pods/proxy on the agent pods: /api/v1/namespaces/NS/pods/POD:PORT/proxy/metrics, PORT the container port named metrics, default 10266).",
    100,
    '',
  ),
  '',
  ...wrap(
    "top: every pod and direction (ingress: to the pod, egress: from it): RATE (bits/s of the L2 frames that passed its shaping), LIMIT, USE (% of the limit), DROPS/s, OVERLIMITS/s (times it hit its limit and waited), GUARANTEE where a pod has one; the most throttled first (overlimits/s, then drops/s, then use). status NODE: the node's pod CIDR, bridge, agent version, and its pods with their addresses, limits and rates.",
    100,
    '',
  ),
  '',
  'options:',
  '  --node NODE              top: only this node',
  '  -n, --namespace NS       top: only pods of this namespace',
  '  --interval SECONDS       time between the two scrapes (default 2)',
  '  --json                   the result as JSON',
  '  --kubeconfig FILE        kubeconfig (default: $KUBECONFIG, else ~/.kube/config)',
  '  --context NAME           kubeconfig context (default: the current one)',
  `  --agent-namespace NS     namespace of the agent pods (default ${DEFAULT_AGENT_NAMESPACE})`,
  `  -l, --selector SELECTOR  label selector of the agent pods (default ${DEFAULT_AGENT_SELECTOR})`,
  '  --parallel N             agents scraped at once (default 16)',
  '  -h, --help               this help',
  '',
  ...wrap('Exit status: 0; 1 when no agent could be read (each agent that could not is named on stderr); 2 on a usage error.', 100, ''),
].join('\n');

export interface PluginIo {
  out(text: string): void;
  err(text: string): void;
  env?: NodeJS.ProcessEnv;
  /** Instead of the kubeconfig search (tests). */
  kubeConfig?: KubeClientConfig;
  /** Whether standard input is a terminal, for an exec credential plugin's interactiveMode (default: process.stdin.isTTY). */
  stdinIsTerminal?: boolean;
}

class UsageError extends ConfigError {}

const OPTIONS = {
  node: { type: 'string' },
  namespace: { type: 'string', short: 'n' },
  interval: { type: 'string' },
  json: { type: 'boolean' },
  kubeconfig: { type: 'string' },
  context: { type: 'string' },
  'agent-namespace': { type: 'string' },
  selector: { type: 'string', short: 'l' },
  parallel: { type: 'string' },
  help: { type: 'boolean', short: 'h' },
} as const;

function positive(v: string | undefined, flag: string, fallback: number, integer = false): number {
  if (v === undefined) return fallback;
  const n = Number(v);
  if (v.trim() === '' || !Number.isFinite(n) || n <= 0 || (integer && !Number.isInteger(n)))
    throw new UsageError(`${flag} wants a positive ${integer ? 'integer' : 'number'}, got ${JSON.stringify(v)}`);
  return n;
}

/** Runs `kubectl kubenet ARGS`; resolves with the exit code. */
export async function run(argv: string[], io: PluginIo): Promise<number> {
  try {
    return await dispatch(argv, io);
  } catch (err) {
    io.err(`kubectl kubenet: ${err instanceof Error ? err.message : String(err)}${err instanceof UsageError ? `\n\n${HELP}` : ''}\n`);
    return err instanceof UsageError ? 2 : 1;
  }
}

async function dispatch(argv: string[], io: PluginIo): Promise<number> {
  let parsed: ReturnType<typeof parseArgs<{ args: string[]; options: typeof OPTIONS; allowPositionals: true; strict: true }>>;
  try {
    parsed = parseArgs({ args: argv, options: OPTIONS, allowPositionals: true, strict: true });
  } catch (err) {
    throw new UsageError(err instanceof Error ? err.message : String(err));
  }
  const { values: v, positionals } = parsed;
  const [cmd, ...args] = positionals;
  if (v.help || cmd === 'help' || cmd === undefined) {
    io.out(`${HELP}\n`);
    return cmd === undefined && !v.help ? 2 : 0;
  }
  if (cmd !== 'top' && cmd !== 'status') throw new UsageError(`unknown command ${JSON.stringify(cmd)}`);
  if (cmd === 'top' && args.length > 0) throw new UsageError(`unexpected argument ${JSON.stringify(args[0])}`);
  if (cmd === 'status' && args.length !== 1)
    throw new UsageError(args.length === 0 ? 'status wants a NODE' : `unexpected argument ${JSON.stringify(args[1])}`);
  if (cmd === 'status' && (v.node !== undefined || v.namespace !== undefined))
    throw new UsageError('--node and --namespace are options of top; status takes the NODE as its argument');
  const intervalS = positive(v.interval, '--interval', 2);
  const parallel = positive(v.parallel, '--parallel', 16, true);
  const kc =
    io.kubeConfig ??
    kubectlCredentials({
      ...(v.kubeconfig !== undefined ? { kubeconfig: v.kubeconfig } : {}),
      ...(v.context !== undefined ? { context: v.context } : {}),
      ...(io.env ? { env: io.env } : {}),
      // An exec credential plugin's prompts and messages reach the user as kubectl's would.
      exec: {
        stderr: io.err,
        ...(io.env ? { env: io.env } : {}),
        ...(io.stdinIsTerminal !== undefined ? { stdinIsTerminal: io.stdinIsTerminal } : {}),
      },
    });
  const api = new KubeApi(kc);
  const where = { namespace: v['agent-namespace'] ?? DEFAULT_AGENT_NAMESPACE, selector: v.selector ?? DEFAULT_AGENT_SELECTOR };
  const node = cmd === 'status' ? args[0] : v.node;
  const agents = await listAgents(api, { ...where, ...(node !== undefined ? { node } : {}) });
  if (agents.length === 0) {
    io.err(
      `kubectl kubenet: no kubenet agent pod${node !== undefined ? ` on node ${node}` : ''} (namespace ${where.namespace}, selector ${where.selector})\n`,
    );
    return 1;
  }
  if (cmd === 'top' && node === undefined) await nodesWithoutAgent(api, agents, io);
  const { read, failed } = await scrapeTwice(api, agents, intervalS, parallel);
  for (const f of failed) io.err(`${f.agent.node}: kubenet agent ${f.agent.namespace}/${f.agent.name} unreachable: ${f.error}\n`);
  if (read.length === 0) return 1; // each agent named on stderr: no empty table
  if (cmd === 'status') return status(read[0], intervalS, v.json === true, io);
  let rows = read.flatMap((r) => rowsOf(r.agent.node, r.first, r.second));
  if (v.namespace !== undefined) rows = rows.filter((r) => r.namespace === v.namespace);
  sortRows(rows);
  if (v.json) {
    const nodes = read.map((r) => ({
      node: r.agent.node,
      agent: `${r.agent.namespace}/${r.agent.name}`,
      ...(r.second.info ? { version: r.second.info.version } : {}),
      windowS: windowOf(r.first, r.second) ?? null,
    }));
    const unreachable = failed.map((f) => ({ node: f.agent.node, agent: `${f.agent.namespace}/${f.agent.name}`, error: f.error }));
    io.out(`${JSON.stringify({ intervalS, nodes, unreachable, pods: rows }, null, 2)}\n`);
  } else {
    io.out(`${renderClusterTop(rows, { nodes: read.length, unreachable: failed.length, intervalS }).join('\n')}\n`);
  }
  return 0;
}

interface Read {
  agent: AgentPod;
  first: NodeSnapshot;
  second: NodeSnapshot;
}

/** How many more times an agent that served the same counters twice is scraped again (its metricsMaxAge is longer than the interval). */
const SAME_READ_RETRIES = 2;

/** Each agent scraped, then again `intervalS` later (again when it served the same read); those that failed either time, with why. */
async function scrapeTwice(
  api: KubeApi,
  agents: AgentPod[],
  intervalS: number,
  parallel: number,
): Promise<{ read: Read[]; failed: Array<{ agent: AgentPod; error: string }> }> {
  const failed: Array<{ agent: AgentPod; error: string }> = [];
  const scrape = async (agent: AgentPod): Promise<NodeSnapshot | undefined> => {
    try {
      const families = await scrapeAgent(api, agent);
      return snapshotOf(families, Date.now());
    } catch (err) {
      failed.push({ agent, error: err instanceof Error ? err.message : String(err) });
      return undefined;
    }
  };
  const first = await mapBounded(agents, parallel, scrape);
  let pending = agents.flatMap((agent, i) => (first[i] ? [{ agent, first: first[i] }] : []));
  const read: Read[] = [];
  for (let attempt = 0; pending.length > 0; attempt++) {
    await sleep(intervalS * 1000);
    const second = await mapBounded(pending, parallel, (p) => scrape(p.agent));
    const again: typeof pending = [];
    pending.forEach((p, i) => {
      const s = second[i];
      if (!s) return;
      if (windowOf(p.first, s) === undefined && attempt < SAME_READ_RETRIES) again.push(p);
      else read.push({ ...p, second: s });
    });
    pending = again;
  }
  const order = (a: AgentPod) => agents.indexOf(a);
  read.sort((a, b) => order(a.agent) - order(b.agent));
  failed.sort((a, b) => order(a.agent) - order(b.agent));
  return { read, failed };
}

/** Nodes that have no agent pod, on stderr (when the Nodes can be listed at all). */
async function nodesWithoutAgent(api: KubeApi, agents: AgentPod[], io: PluginIo): Promise<void> {
  let names: string[];
  try {
    names = (await api.getJson<{ items: Array<{ metadata?: { name?: string } }> }>('/api/v1/nodes')).items.map(
      (n) => n.metadata?.name ?? '',
    );
  } catch {
    return; // not allowed to list Nodes: the agents are all we know of
  }
  const have = new Set(agents.map((a) => a.node));
  for (const n of names.sort()) if (n !== '' && !have.has(n)) io.err(`${n}: no kubenet agent pod on this node\n`);
}

function status(r: Read | undefined, intervalS: number, json: boolean, io: PluginIo): number {
  if (!r) return 1;
  const rows: PodRow[] = rowsOf(r.agent.node, r.first, r.second);
  const agent = `${r.agent.namespace}/${r.agent.name}`;
  if (json) {
    io.out(
      `${JSON.stringify({ node: r.agent.node, agent, info: r.second.info ?? null, windowS: windowOf(r.first, r.second) ?? null, pods: rows }, null, 2)}\n`,
    );
  } else {
    io.out(`${renderNodeStatus(r.agent.node, agent, r.second, rows, intervalS).join('\n')}\n`);
  }
  return 0;
}
