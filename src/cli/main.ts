#!/usr/bin/env node
/**
 * The `kubenet` command: `daemon` (the node agent), `status` (what the agent knows, with each pod's
 * measured rates), `shape` (change a running pod's limits), `top` (a refreshing per-pod view),
 * `health` (exit 0 when the agent answers /healthz with 200; the DaemonSet's readiness probe),
 * `uninstall` (removes what the agent made on the node once it is gone: uninstall.ts).
 */
// First: sizes libuv's thread pool before any import can use it.
import './threadpool.js';
// Second: V8 heap settings for a long-running agent (heap.ts has the measurements).
import './heap.js';
import { parseArgs } from 'node:util';
import { Agent, type StatusReport } from '../daemon/agent.js';
import { limitsPath, STATUS_PATH } from '../daemon/http/socket-api.js';
import type { ShapedPod } from '../daemon/shaping/live-shaping.js';
import { StaticCidr, type PodCidrSource } from '../daemon/pod-cidr/source.js';
import type { PodLookup } from '../daemon/cluster/pod-lookup.js';
import { CONFIG_KEYS, loadConfig, type AgentConfig } from '../daemon/config/config.js';
import { KubeEventRecorder } from '../daemon/kube/events.js';
import type { MetricsAuthorizer } from '../daemon/http/metrics-auth.js';
import { loadKubeConfig, type KubeClientOptions } from '../daemon/kube/watch.js';
import type { NamespaceLookup } from '../daemon/cluster/namespace-lookup.js';
import type { NodeRoutes } from '../daemon/cluster/routes.js';
import type { ClusterRanges } from '../daemon/cluster/cluster-ranges.js';
import type { NodeCapacity, NodeCapacityPublisher } from '../daemon/cluster/node-capacity.js';
import { agentGet, agentPost, HEALTH_PATH } from '../daemon/protocol.js';
import { createLogger, type Logger } from '../log.js';
import { describeLimits } from '../pod/index.js';
import { bandwidthLines } from './bandwidth-text.js';
import { commandHelp, usage } from './help.js';
import { bandText, directionText, rateText, top } from './top.js';
import { uninstall } from './uninstall.js';

const USAGE = usage();

/** Every config key is also a flag (CONFIG_KEYS[k].flag, e.g. --pod-cidr); then each command's own. */
function flagOptions() {
  const options: Record<string, { type: 'string' | 'boolean'; multiple?: boolean; short?: string }> = {
    config: { type: 'string' },
    json: { type: 'boolean' },
    help: { type: 'boolean' },
    window: { type: 'string' },
    ingress: { type: 'string' },
    egress: { type: 'string' },
    clear: { type: 'boolean' },
    delay: { type: 'string', short: 'd' },
    batch: { type: 'boolean', short: 'b' },
    iterations: { type: 'string', short: 'n' },
    'dry-run': { type: 'boolean' },
    force: { type: 'boolean' },
  };
  for (const spec of Object.values(CONFIG_KEYS))
    options[spec.flag.replace(/^--/, '')] = { type: 'string', ...(spec.type === 'string[]' ? { multiple: true } : {}) };
  return options;
}

function flagsToConfig(values: Record<string, unknown>): Partial<AgentConfig> {
  const out: Record<string, unknown> = {};
  for (const [key, spec] of Object.entries(CONFIG_KEYS)) {
    const v = values[spec.flag.replace(/^--/, '')];
    if (v === undefined) continue;
    // A list flag may repeat and/or hold commas: --plugin-bin-dirs /opt/cni/bin,/usr/lib/cni
    out[key] =
      spec.type === 'integer'
        ? Number(v)
        : spec.type === 'string[]'
          ? (v as string[]).flatMap((x) => x.split(',')).filter((x) => x !== '')
          : v;
  }
  return out as Partial<AgentConfig>;
}

async function main(argv: string[]): Promise<number> {
  const [cmd, ...rest] = argv;
  if (!cmd || cmd === '--help' || cmd === '-h' || (cmd === 'help' && rest.length === 0)) {
    console.log(USAGE);
    return cmd ? 0 : 2;
  }
  const helpOf = cmd === 'help' ? rest[0] : rest.includes('--help') || rest.includes('-h') ? cmd : undefined;
  if (helpOf !== undefined) {
    const text = commandHelp(helpOf);
    if (text === undefined) {
      console.error(`unknown command ${JSON.stringify(helpOf)}\n${USAGE}`);
      return 2;
    }
    console.log(text);
    return 0;
  }
  const { values, positionals } = parseArgs({ args: rest, options: flagOptions(), strict: true, allowPositionals: true });
  const own: Record<string, string[]> = {
    status: ['json', 'window'],
    shape: ['ingress', 'egress', 'clear'],
    top: ['delay', 'batch', 'iterations'],
    uninstall: ['dry-run', 'force'],
  };
  for (const flag of Object.values(own).flat()) {
    if (values[flag] !== undefined && !own[cmd]?.includes(flag))
      throw new Error(
        `--${flag} is an option of \`kubenet ${Object.keys(own).find((c) => own[c]?.includes(flag))}\`, not of \`kubenet ${cmd}\`\n${USAGE}`,
      );
  }
  if (positionals.length > (cmd === 'shape' ? 1 : 0))
    throw new Error(`unexpected argument ${JSON.stringify(positionals[cmd === 'shape' ? 1 : 0])}\n${USAGE}`);
  const config = await loadConfig({ ...(typeof values.config === 'string' ? { file: values.config } : {}), flags: flagsToConfig(values) });
  switch (cmd) {
    case 'daemon':
      return daemon(config);
    case 'status':
      return status(config.socket, values.json === true, positiveNumber(values.window, '--window'));
    case 'shape':
      return shape(config.socket, positionals[0], values);
    case 'top':
      return top({
        socket: config.socket,
        intervalS: positiveNumber(values.delay, '-d') ?? 1,
        batch: values.batch === true,
        iterations: positiveNumber(values.iterations, '-n'),
      });
    case 'uninstall':
      // The rules to remove are in the backend the agent wrote through.
      await useNodeXtables(createLogger({ level: 'warn' }));
      return uninstall(config, { dryRun: values['dry-run'] === true, force: values.force === true });
    case 'health': {
      const r = await agentGet(config.socket, HEALTH_PATH).catch((err: unknown) => ({ status: 0, body: String(err) }));
      if (r.status !== 200) console.error(`kubenet agent not ready: ${r.body}`);
      return r.status === 200 ? 0 : 1;
    }
    default:
      console.error(`unknown command ${JSON.stringify(cmd)}\n${USAGE}`);
      return 2;
  }
}

/** In the image: iptables, ip6tables and ebtables through the backend the node uses (src/daemon/host/xtables.ts). */
async function useNodeXtables(log: Logger): Promise<void> {
  const xtablesLinks = process.env.KUBENET_XTABLES_LINKS;
  if (xtablesLinks) await (await import('../daemon/host/xtables.js')).selectXtablesBackend(xtablesLinks, log);
}

async function daemon(config: AgentConfig): Promise<number> {
  const log = createLogger({ level: config.logLevel });
  let source: PodCidrSource;
  let pods: PodLookup | undefined;
  let events: KubeEventRecorder | undefined;
  let routes: NodeRoutes | undefined;
  let namespaces: NamespaceLookup | undefined;
  let ranges: ClusterRanges | undefined;
  let capacity: NodeCapacity | undefined;
  let nodeCapacity: NodeCapacityPublisher | undefined;
  let apiEndpoints: { start(): void; stop(): Promise<void> } | undefined;
  let metricsAuth: MetricsAuthorizer | undefined;
  if (config.podCIDR) {
    // The embedded default: no Kubernetes API; bandwidth only from runtimeConfig (a capacity only as configured).
    source = new StaticCidr(config.podCIDR);
    capacity = (await import('../daemon/cluster/node-capacity.js')).configuredCapacity(config);
  } else {
    // In a cluster: the Node's spec.podCIDRs, and pod annotations when the runtime passes no bandwidth.
    const [{ NodeWatchPodCidrSource }, { ClusterPodLookup }] = await Promise.all([
      import('../daemon/pod-cidr/node-watch.js'),
      import('../daemon/cluster/pod-lookup.js'),
    ]);
    // One ApiHealth for every client of the agent: while the API server is away they try about once a second together, not each on its own.
    const health = new (await import('../daemon/kube/api-health.js')).ApiHealth({ logger: log });
    let kube: KubeClientOptions = {
      nodeName: config.nodeName,
      logger: log,
      health,
      ...(config.kubeconfig ? { kubeconfig: config.kubeconfig } : {}),
    };
    if (!config.kubeconfig) {
      // In a pod: the API servers' own addresses first, the Service address last (src/daemon/kube/api-endpoints.ts).
      const { ApiEndpoints, ApiEndpointsWatch } = await import('../daemon/kube/api-endpoints.js');
      const endpoints = new ApiEndpoints(loadKubeConfig({}), log);
      kube = { ...kube, kubeConfig: endpoints };
      apiEndpoints = new ApiEndpointsWatch(endpoints, kube);
    }
    // The node's bandwidth capacity: the shaper's node class, published on the Node for the scheduler.
    const { NodeCapacityPublisher, resolveNodeCapacity } = await import('../daemon/cluster/node-capacity.js');
    capacity = await resolveNodeCapacity(config);
    const publisher = (nodeCapacity = new NodeCapacityPublisher(kube));
    // The VXLAN settings for the other nodes' tunnels to this one (none without tunnels: a stale one goes).
    const { VXLAN_ANNOTATION, formatVxlanSettings } = await import('../daemon/cluster/route-plan.js');
    publisher.annotate({
      [VXLAN_ANNOTATION]: config.routes === 'auto' ? formatVxlanSettings({ port: config.vxlanPort, vni: config.vxlanVNI }) : null,
    });
    source = new NodeWatchPodCidrSource({ ...kube, onNode: (node) => publisher.nodeSeen(node) });
    pods = new ClusterPodLookup(kube);
    namespaces = new (await import('../daemon/cluster/namespace-lookup.js')).ClusterNamespaceLookup(kube);
    events = new KubeEventRecorder(kube);
    if (config.metricsAuth === 'kubernetes')
      metricsAuth = (await import('../daemon/http/metrics-auth.js')).KubeMetricsAuth.fromClient(kube);
    if (config.routes === 'direct' || config.routes === 'auto') {
      const { NodeRoutes, netlinkRouteKernel, ROUTE_PROTOCOL } = await import('../daemon/cluster/routes.js');
      const vxlan = config.routes === 'auto' ? await import('../daemon/cluster/vxlan.js') : undefined;
      // unshapedCIDRs unset: the cluster's pod CIDRs (from the routes' Node watch) and Service ranges, live.
      const r =
        config.unshapedCIDRs === undefined ? new (await import('../daemon/cluster/cluster-ranges.js')).ClusterRanges(kube) : undefined;
      ranges = r;
      routes = new NodeRoutes({
        ...kube,
        events,
        kernel: netlinkRouteKernel(config.bridgeName, vxlan ? { exclude: Object.values(vxlan.DEFAULT_VXLAN_NAMES) } : {}),
        ...(r ? { onPodCidrs: (c: string[]) => r.setPodCidrs(c) } : {}),
        ...(vxlan
          ? {
              tunnel: {
                kernel: vxlan.iprouteTunnelKernel({ protocol: ROUTE_PROTOCOL }),
                vni: config.vxlanVNI,
                port: config.vxlanPort,
              },
            }
          : {}),
      });
    }
    log.info({ nodeName: config.nodeName, kubeconfig: config.kubeconfig ?? '(in-cluster)' }, 'watching this Node for its pod CIDR');
  }
  await useNodeXtables(log);
  const agent = new Agent(config, source, log, pods, {
    ...(events ? { events } : {}),
    ...(routes ? { routes } : {}),
    ...(namespaces ? { namespaces } : {}),
    ...(ranges ? { ranges } : {}),
    ...(capacity ? { capacity } : {}),
    ...(nodeCapacity ? { nodeCapacity } : {}),
    ...(metricsAuth ? { metricsAuth } : {}),
  });
  // Listening before the start: a SIGTERM while it runs (the agent answers /healthz before its
  // last step) stops the agent once started, rather than killing it half-way with Node's default.
  const signalled = new Promise<string>((resolve) => {
    process.once('SIGTERM', () => resolve('SIGTERM'));
    process.once('SIGINT', () => resolve('SIGINT'));
  });
  apiEndpoints?.start();
  // A start that hangs (it should not) must not keep a signalled agent alive until the kubelet's SIGKILL.
  const startHung = signalled.then(() => new Promise<'hung'>((r) => setTimeout(() => r('hung'), START_GRACE_MS).unref()));
  if ((await Promise.race([agent.start(), startHung])) === 'hung') {
    log.error(`stopping: the start had not finished ${START_GRACE_MS} ms after the signal; exiting without an orderly stop`);
    return 1;
  }
  log.info({ signal: await signalled }, 'stopping: finishing CNI calls in flight');
  await agent.stop();
  await apiEndpoints?.stop();
  return 0;
}

/** How long a signal received during the start waits for it to finish (the DaemonSet's grace is 30 s). */
const START_GRACE_MS = 20_000;

function positiveNumber(v: unknown, flag: string): number | undefined {
  if (v === undefined) return undefined;
  const n = Number(v);
  if (typeof v !== 'string' || !Number.isFinite(n) || n <= 0) throw new Error(`${flag} wants a positive number, got ${JSON.stringify(v)}`);
  return n;
}

async function shape(socket: string, target: string | undefined, values: Record<string, unknown>): Promise<number> {
  const m = /^([^/]+)\/([^/]+)$/.exec(target ?? '');
  if (!m) throw new Error(`kubenet shape wants NAMESPACE/NAME, got ${JSON.stringify(target ?? '')}\n${USAGE}`);
  const body: Record<string, unknown> = {};
  if (typeof values.ingress === 'string') body.ingress = values.ingress;
  if (typeof values.egress === 'string') body.egress = values.egress;
  if (values.clear === true) body.clear = true;
  const r = await agentPost(socket, limitsPath(m[1] ?? '', m[2] ?? ''), body).catch((err: unknown) => {
    throw new Error(`kubenet agent unreachable at ${socket}: ${err instanceof Error ? err.message : String(err)}`);
  });
  const answer = JSON.parse(r.body || '{}') as { pods?: ShapedPod[]; error?: string };
  if (r.status !== 200) {
    console.error(`kubenet shape ${target}: ${answer.error ?? `the agent answered ${r.status}`}`);
    return 1;
  }
  for (const p of answer.pods ?? []) {
    const what = p.changed ? `${describeLimits(p.limits)} (was ${describeLimits(p.previous)})` : `unchanged: ${describeLimits(p.limits)}`;
    console.log(`${p.namespace}/${p.name} ${p.id.slice(0, 12)}: ${what}`);
    for (const c of p.capped ?? []) console.log(`  capped: ${c}`);
  }
  return 0;
}

async function status(socket: string, json: boolean, windowS: number | undefined): Promise<number> {
  const r = await agentGet(socket, windowS ? `${STATUS_PATH}?window=${windowS}` : STATUS_PATH).catch((err: unknown) => {
    throw new Error(`kubenet agent unreachable at ${socket}: ${err instanceof Error ? err.message : String(err)}`);
  });
  if (r.status !== 200) throw new Error(`kubenet agent answered ${r.status}: ${r.body}`);
  const s = JSON.parse(r.body) as StatusReport;
  if (json) {
    console.log(JSON.stringify(s, null, 2));
    return 0;
  }
  console.log(`pod CIDR: ${s.podCIDR ?? '(none yet)'}\nbridge:   ${s.bridge}\nready:    ${s.ready}\npods:     ${s.pods.length}`);
  // Limits hold for everything else; an older agent does not say.
  if (s.unshapedCIDRs) console.log(`unshaped: ${s.unshapedCIDRs.join(', ') || '(none: limits hold for all traffic)'}`);
  if (s.bandwidth) for (const line of bandwidthLines(s.bandwidth, s.trees)) console.log(line);
  const ports = (p: StatusReport['pods'][number]) =>
    (p.portMappings ?? []).map((m) => `${m.hostPort}->${m.containerPort}/${m.protocol}`).join(',') || '-';
  const seconds = s.pods.find((p) => p.rate)?.rate?.seconds;
  // A limit from the pod's namespace says so ("10M ns-default", "20M ns-ceiling"); the column widens for it.
  // A guarantee stands before its ceiling ("60M..100M"); the band (PRIO) only on a node that gives them.
  const limits = s.pods.map(
    (p) =>
      [directionText(p.limits, 'ingress', p.limitSources?.ingress), directionText(p.limits, 'egress', p.limitSources?.egress)] as const,
  );
  const lw = Math.max(9, ...limits.flat().map((c) => c.length));
  const banded = s.pods.some((p) => p.limits.priority !== undefined);
  if (s.pods.length > 0) {
    console.log(
      `  ${'POD'.padEnd(32)} ${'IP'.padEnd(28)} ${'INGRESS'.padEnd(lw)} ${'IN RATE'.padEnd(9)} ${'EGRESS'.padEnd(lw)} ${'OUT RATE'.padEnd(9)} ${banded ? 'PRIO   ' : ''}HOST PORTS`,
    );
  }
  s.pods.forEach((p, i) => {
    const [ingress, egress] = limits[i] ?? ['-', '-'];
    const cells = [
      ingress.padEnd(lw),
      rateText(p.rate?.ingress).padEnd(9),
      egress.padEnd(lw),
      rateText(p.rate?.egress).padEnd(9),
      ...(banded ? [bandText(p.limits.priority).padEnd(6)] : []),
    ];
    console.log(`  ${`${p.namespace}/${p.name}`.padEnd(32)} ${p.ips.join(',').padEnd(28)} ${cells.join(' ')} ${ports(p)}`);
  });
  if (seconds !== undefined)
    console.log(`(INGRESS/EGRESS: limits to/from the pod; IN/OUT RATE: measured over the last ${seconds} s, bits/s on the wire)`);
  if (s.pods.some((p) => p.limits.ingressGuarantee !== undefined || p.limits.egressGuarantee !== undefined)) {
    console.log("(60M..100M: guaranteed 60M, may borrow up to 100M; 60M..: up to the node's capacity)");
  }
  if (s.pods.some((p) => p.limitSources?.ingress?.startsWith('namespace') || p.limitSources?.egress?.startsWith('namespace'))) {
    console.log("(ns-default / ns-ceiling: the limit is the default or the ceiling of the pod's namespace, not its own)");
  }
  if (s.routes) {
    const problems = Object.entries(s.routes.problems);
    const tunnelled = s.routes.routes.filter((r) => r.way === 'tunnel').length;
    console.log(
      `routes:   ${s.routes.routes.length} to other nodes' pods (proto 98)${tunnelled > 0 ? `, ${tunnelled} through VXLAN` : ''}${problems.length > 0 ? `, ${problems.length} node(s) without` : ''}`,
    );
    for (const r of s.routes.routes) {
      const way =
        r.way === 'tunnel'
          ? `tunnel to ${r.underlay ?? '?'}${r.mtu !== undefined ? ` mtu ${r.mtu}` : ''}`
          : `direct via ${r.underlay ?? r.via}`;
      console.log(`  ${r.dst.padEnd(28)} ${way.padEnd(40)} ${r.node}`);
    }
    for (const [node, why] of problems) console.log(`  no route to ${node}: ${why}`);
  }
  return 0;
}

main(process.argv.slice(2)).then(
  (code) => process.exit(code),
  (err: unknown) => {
    console.error(err instanceof Error ? err.message : err);
    process.exit(1);
  },
);
