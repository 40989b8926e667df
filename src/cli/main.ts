#!/usr/bin/env node
/**
 * The `kubenet` command: `daemon` (the node agent), `status` (what the agent knows), `health`
 * (exit 0 when the agent answers /healthz with 200; the DaemonSet's readiness probe).
 */
// First: sizes libuv's thread pool before any import can use it.
import './threadpool.js';
// Second: V8 heap settings for a long-running agent (heap.ts has the measurements).
import './heap.js';
import { parseArgs } from 'node:util';
import { Agent, type StatusReport } from '../daemon/agent.js';
import { STATUS_PATH } from '../daemon/http-api.js';
import { StaticCidr, type PodCidrSource } from '../daemon/pod-cidr.js';
import type { PodLookup } from '../daemon/cni-handler.js';
import { CONFIG_KEYS, loadConfig, type AgentConfig } from '../daemon/config.js';
import { agentGet, HEALTH_PATH } from '../daemon/protocol.js';
import { createLogger } from '../log.js';

const USAGE = `usage:
  kubenet daemon [--config FILE] [--pod-cidr CIDR] [--socket PATH] [--cni-bin-dir DIR] [--cni-conf-dir DIR] [...]
  kubenet status [--config FILE] [--socket PATH] [--json]
  kubenet health [--config FILE] [--socket PATH]`;

/** Every config key is also a flag (CONFIG_KEYS[k].flag, e.g. --pod-cidr). */
function flagOptions() {
  const options: Record<string, { type: 'string' | 'boolean'; multiple?: boolean }> = { config: { type: 'string' }, json: { type: 'boolean' }, help: { type: 'boolean' } };
  for (const spec of Object.values(CONFIG_KEYS)) options[spec.flag.replace(/^--/, '')] = { type: 'string', ...(spec.type === 'string[]' ? { multiple: true } : {}) };
  return options;
}

function flagsToConfig(values: Record<string, unknown>): Partial<AgentConfig> {
  const out: Record<string, unknown> = {};
  for (const [key, spec] of Object.entries(CONFIG_KEYS)) {
    const v = values[spec.flag.replace(/^--/, '')];
    if (v === undefined) continue;
    // A list flag may repeat and/or hold commas: --plugin-bin-dirs /opt/cni/bin,/usr/lib/cni
    out[key] = spec.type === 'integer' ? Number(v) : spec.type === 'string[]' ? (v as string[]).flatMap((x) => x.split(',')).filter((x) => x !== '') : v;
  }
  return out as Partial<AgentConfig>;
}

async function main(argv: string[]): Promise<number> {
  const [cmd, ...rest] = argv;
  if (!cmd || cmd === '--help' || cmd === 'help') {
    console.log(USAGE);
    return cmd ? 0 : 2;
  }
  const { values } = parseArgs({ args: rest, options: flagOptions(), strict: true, allowPositionals: false });
  const config = await loadConfig({ ...(typeof values.config === 'string' ? { file: values.config } : {}), flags: flagsToConfig(values) });
  switch (cmd) {
    case 'daemon':
      return daemon(config);
    case 'status':
      return status(config.socket, values.json === true);
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

async function daemon(config: AgentConfig): Promise<number> {
  const log = createLogger({ level: config.logLevel });
  let source: PodCidrSource;
  let pods: PodLookup | undefined;
  if (config.podCIDR) {
    // The embedded default: no Kubernetes API; bandwidth only from runtimeConfig.
    source = new StaticCidr(config.podCIDR);
  } else {
    // In a cluster: the Node's spec.podCIDRs, and pod annotations when the runtime passes no bandwidth.
    const [{ NodeWatchPodCidrSource }, { ClusterPodLookup }] = await Promise.all([import('../daemon/pod-cidr-source.js'), import('../daemon/pod-lookup.js')]);
    const kube = { nodeName: config.nodeName, logger: log, ...(config.kubeconfig ? { kubeconfig: config.kubeconfig } : {}) };
    source = new NodeWatchPodCidrSource(kube);
    pods = new ClusterPodLookup(kube);
    log.info({ nodeName: config.nodeName, kubeconfig: config.kubeconfig ?? '(in-cluster)' }, 'watching this Node for its pod CIDR');
  }
  const agent = new Agent(config, source, log, pods);
  await agent.start();
  await new Promise<void>((resolve) => {
    const stop = (signal: string) => {
      log.info({ signal }, 'stopping: finishing CNI calls in flight');
      resolve();
    };
    process.once('SIGTERM', () => stop('SIGTERM'));
    process.once('SIGINT', () => stop('SIGINT'));
  });
  await agent.stop();
  return 0;
}

async function status(socket: string, json: boolean): Promise<number> {
  const r = await agentGet(socket, STATUS_PATH).catch((err: unknown) => {
    throw new Error(`kubenet agent unreachable at ${socket}: ${err instanceof Error ? err.message : String(err)}`);
  });
  if (r.status !== 200) throw new Error(`kubenet agent answered ${r.status}: ${r.body}`);
  const s = JSON.parse(r.body) as StatusReport;
  if (json) {
    console.log(JSON.stringify(s, null, 2));
    return 0;
  }
  console.log(`pod CIDR: ${s.podCIDR ?? '(none yet)'}\nbridge:   ${s.bridge}\nready:    ${s.ready}\npods:     ${s.pods.length}`);
  const rate = (bps: number | undefined) => (bps ? `${bps / 1e6}M` : '-');
  const ports = (p: StatusReport['pods'][number]) => (p.portMappings ?? []).map((m) => `${m.hostPort}->${m.containerPort}/${m.protocol}`).join(',') || '-';
  if (s.pods.length > 0) console.log(`  ${'POD'.padEnd(32)} ${'IP'.padEnd(28)} ${'INGRESS'.padEnd(9)} ${'EGRESS'.padEnd(9)} HOST PORTS`);
  for (const p of s.pods) {
    console.log(`  ${`${p.namespace}/${p.name}`.padEnd(32)} ${p.ips.join(',').padEnd(28)} ${rate(p.limits.ingress).padEnd(9)} ${rate(p.limits.egress).padEnd(9)} ${ports(p)}`);
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
