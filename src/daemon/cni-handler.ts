/**
 * The agent side of the CNI forwarding protocol: one forwarded CNI call in, one answer out
 * (status 200 + result, or a CNI error object). Parse → act through KubenetPlugin → typed result.
 */
import { isIP } from 'node:net';
import { convertResult } from '../cni/result.js';
import { CniPluginError, ConfigError, NotReadyError, UnknownPodError } from '../errors.js';
import type { KubenetPlugin, PodRecord, PortMapping } from '../plugin/kubenet.js';
import { bandwidthFromAnnotations, MAX_BANDWIDTH, MIN_BANDWIDTH, type BandwidthLimits } from '../shaper/quantity.js';
import {
  CNI_ERR_INVALID_CONFIG,
  CNI_ERR_INVALID_ENV,
  CNI_ERR_TRY_AGAIN_LATER,
  CNI_ERR_UNKNOWN_CONTAINER,
  CNI_VERSION_ANSWER,
  cniErrorBody,
  type CniRequest,
} from './protocol.js';

/** containerd passes this burst (uint32 max) when the pod sets none: it means "none given". */
const UNSET_BURST = 4294967295;
/** CNI 1.1 STATUS: "the plugin is not available". */
const CNI_ERR_PLUGIN_NOT_AVAILABLE = 50;

export interface CniAnswer {
  status: number;
  body: string;
  /** For metrics and logs. */
  command: string;
  code?: number;
}

export interface PodLookup {
  /** The pod's annotations when the agent knows the pod (cluster mode), else undefined. */
  annotations(namespace: string, name: string): Promise<Record<string, string> | undefined>;
  /** Begin and end whatever feeds the lookup (a watch); the agent calls them around its own life. */
  start?(): Promise<void>;
  stop?(): Promise<void>;
}

export interface CniHandlerHooks {
  onAdd?(record: PodRecord): Promise<void>;
  onDel?(id: string): Promise<void>;
}

export class CniHandler {
  constructor(
    private readonly plugin: KubenetPlugin,
    private readonly pods: PodLookup | undefined,
    private readonly hooks: CniHandlerHooks = {},
  ) {}

  async handle(req: CniRequest): Promise<CniAnswer> {
    const command = req.env.CNI_COMMAND ?? '';
    let cniVersion = '1.1.0';
    try {
      const conf = parseConf(req.stdin);
      cniVersion = typeof conf.cniVersion === 'string' ? conf.cniVersion : cniVersion;
      switch (command) {
        case 'VERSION':
          return { status: 200, body: JSON.stringify(CNI_VERSION_ANSWER), command };
        case 'ADD':
          return { status: 200, body: await this.add(req, conf, cniVersion), command };
        case 'DEL':
          await this.del(req);
          return { status: 200, body: '', command };
        case 'CHECK':
          await this.check(req);
          return { status: 200, body: '', command };
        case 'STATUS':
          try {
            this.plugin.status();
          } catch (err) {
            return errorAnswer(command, cniVersion, CNI_ERR_PLUGIN_NOT_AVAILABLE, err);
          }
          return { status: 200, body: '', command };
        case 'GC':
          await this.gc(conf);
          return { status: 200, body: '', command };
        default:
          throw new EnvError(`CNI_COMMAND ${JSON.stringify(command)} is not one of ADD, DEL, CHECK, STATUS, GC, VERSION`);
      }
    } catch (err) {
      return errorAnswer(command, cniVersion, codeOf(err), err);
    }
  }

  private async add(req: CniRequest, conf: Record<string, unknown>, cniVersion: string): Promise<string> {
    const call = callOf(req, true);
    // runtimeConfig carries the annotations' rates already; else read the pod's annotations.
    const fromRuntime = bandwidthFromRuntimeConfig(conf.runtimeConfig);
    const limits = fromRuntime ?? bandwidthFromAnnotations(await this.pods?.annotations(call.namespace, call.name));
    const portMappings = portMappingsFromRuntimeConfig(conf.runtimeConfig);
    const { record, result } = await this.plugin.attach({ namespace: call.namespace, name: call.name, id: call.id, netns: call.netns, limits, portMappings });
    await this.hooks.onAdd?.(record);
    return JSON.stringify(convertResult(result, cniVersion));
  }

  private async del(req: CniRequest): Promise<void> {
    const call = callOf(req, false);
    await this.plugin.detach(call);
    await this.hooks.onDel?.(call.id);
  }

  private async check(req: CniRequest): Promise<void> {
    await this.plugin.check(callOf(req, true));
  }

  /** CNI 1.1 GC: tear down every attachment not in cni.dev/valid-attachments. */
  private async gc(conf: Record<string, unknown>): Promise<void> {
    const valid = conf['cni.dev/valid-attachments'];
    if (!Array.isArray(valid)) throw new ConfigError('GC: cni.dev/valid-attachments must be a list');
    const keep = new Set(valid.map((a) => (a as { containerID?: unknown }).containerID).filter((x) => typeof x === 'string'));
    for (const p of this.plugin.listPods()) {
      if (keep.has(p.id)) continue;
      await this.plugin.detach({ namespace: p.namespace, name: p.name, id: p.id, netns: p.netns });
      await this.hooks.onDel?.(p.id);
    }
  }
}

class EnvError extends ConfigError {}

function parseConf(stdin: string): Record<string, unknown> {
  if (stdin.trim() === '') return {};
  let v: unknown;
  try {
    v = JSON.parse(stdin);
  } catch (err) {
    throw new ConfigError('network config on stdin is not JSON', { cause: err });
  }
  if (typeof v !== 'object' || v === null || Array.isArray(v)) throw new ConfigError('network config on stdin is not a JSON object');
  return v as Record<string, unknown>;
}

interface Call {
  namespace: string;
  name: string;
  id: string;
  netns: string;
}

/** Pod identity from CNI_ARGS (K8S_POD_NAMESPACE / K8S_POD_NAME), as containerd and CRI-O pass it. */
function callOf(req: CniRequest, needNetns: boolean): Call {
  const id = req.env.CNI_CONTAINERID ?? '';
  if (!id) throw new EnvError('CNI_CONTAINERID is required');
  const netns = req.env.CNI_NETNS ?? '';
  if (needNetns && !netns) throw new EnvError('CNI_NETNS is required');
  const ifname = req.env.CNI_IFNAME ?? 'eth0';
  if (ifname !== 'eth0') throw new EnvError(`CNI_IFNAME ${JSON.stringify(ifname)}: kubenet attaches pods as eth0 only`);
  const args = new Map<string, string>();
  for (const kv of (req.env.CNI_ARGS ?? '').split(';')) {
    const i = kv.indexOf('=');
    if (i > 0) args.set(kv.slice(0, i), kv.slice(i + 1));
  }
  return { id, netns, namespace: args.get('K8S_POD_NAMESPACE') ?? '', name: args.get('K8S_POD_NAME') ?? id };
}

/**
 * runtimeConfig.bandwidth as containerd and CRI-O pass it: rates in bits/s, bursts in bits, keys in
 * camelCase (the CNI convention) or PascalCase (containerd 1.6). A burst of 4294967295 means none.
 */
export function bandwidthFromRuntimeConfig(runtimeConfig: unknown): BandwidthLimits | undefined {
  if (typeof runtimeConfig !== 'object' || runtimeConfig === null) return undefined;
  const bw = (runtimeConfig as Record<string, unknown>).bandwidth;
  if (bw === undefined || bw === null) return undefined;
  if (typeof bw !== 'object' || Array.isArray(bw)) throw new ConfigError('runtimeConfig.bandwidth must be an object');
  const rec = bw as Record<string, unknown>;
  const pick = (camel: string): number | undefined => {
    const pascal = camel[0]!.toUpperCase() + camel.slice(1);
    const v = rec[camel] ?? rec[pascal];
    if (v === undefined || v === null) return undefined;
    if (typeof v !== 'number' || !Number.isFinite(v) || v < 0) {
      throw new ConfigError(`runtimeConfig.bandwidth.${camel} must be a non-negative number, got ${JSON.stringify(v)}`);
    }
    return v;
  };
  const out: BandwidthLimits = {};
  for (const [dir, rate, burst] of [
    ['ingress', 'ingressRate', 'ingressBurst'],
    ['egress', 'egressRate', 'egressBurst'],
  ] as const) {
    const r = pick(rate);
    if (!r) continue; // 0 or absent: no limit that way
    if (r < MIN_BANDWIDTH || r > MAX_BANDWIDTH) {
      throw new ConfigError(`runtimeConfig.bandwidth.${rate} ${r} is outside ${MIN_BANDWIDTH}..${MAX_BANDWIDTH} bits/s`);
    }
    out[dir] = r;
    const b = pick(burst);
    if (b && b !== UNSET_BURST) out[dir === 'ingress' ? 'ingressBurst' : 'egressBurst'] = b;
  }
  return out.ingress || out.egress ? out : undefined;
}

const PROTOCOLS = ['tcp', 'udp', 'sctp'] as const;

/**
 * runtimeConfig.portMappings as containerd and CRI-O pass a pod's hostPorts; [] when none. Keys are
 * matched case-insensitively, as Go's encoding/json (and so the reference portmap plugin) does:
 * containerd 1.6 sends them in PascalCase (`{"HostPort":31000,"ContainerPort":8080,"Protocol":"tcp","HostIP":""}`,
 * go-cni's PortMapping has no JSON tags), CRI-O in camelCase.
 */
export function portMappingsFromRuntimeConfig(runtimeConfig: unknown): PortMapping[] {
  if (typeof runtimeConfig !== 'object' || runtimeConfig === null) return [];
  const pm = (runtimeConfig as Record<string, unknown>).portMappings;
  if (pm === undefined || pm === null) return [];
  if (!Array.isArray(pm)) throw new ConfigError('runtimeConfig.portMappings must be a list');
  return pm.map((m: unknown, i): PortMapping => {
    const where = `runtimeConfig.portMappings[${i}]`;
    if (typeof m !== 'object' || m === null) throw new ConfigError(`${where} must be an object`);
    const r = caseInsensitive(m as Record<string, unknown>);
    const port = (key: string): number => {
      const v = r[key];
      if (typeof v !== 'number' || !Number.isInteger(v) || v < 1 || v > 65535) throw new ConfigError(`${where}.${key} must be a port 1..65535, got ${JSON.stringify(v)}`);
      return v;
    };
    const protocol = typeof r.protocol === 'string' ? r.protocol.toLowerCase() : r.protocol === undefined ? 'tcp' : r.protocol;
    if (!(PROTOCOLS as readonly unknown[]).includes(protocol)) throw new ConfigError(`${where}.protocol must be one of ${PROTOCOLS.join(', ')}, got ${JSON.stringify(r.protocol)}`);
    const out: PortMapping = { hostPort: port('hostPort'), containerPort: port('containerPort'), protocol: protocol as PortMapping['protocol'] };
    if (r.hostIP !== undefined && r.hostIP !== '') {
      if (typeof r.hostIP !== 'string' || isIP(r.hostIP) === 0) throw new ConfigError(`${where}.hostIP must be an IP address, got ${JSON.stringify(r.hostIP)}`);
      out.hostIP = r.hostIP;
    }
    return out;
  });
}

/** The object with its keys found case-insensitively under the camelCase names used here (the first match wins). */
function caseInsensitive(obj: Record<string, unknown>): Record<string, unknown> {
  const names = ['hostPort', 'containerPort', 'protocol', 'hostIP'];
  const out: Record<string, unknown> = {};
  for (const name of names) {
    const key = Object.keys(obj).find((k) => k.toLowerCase() === name.toLowerCase());
    if (key !== undefined) out[name] = obj[key];
  }
  return out;
}

function codeOf(err: unknown): number {
  if (err instanceof CniPluginError && err.code !== undefined) return err.code;
  if (err instanceof EnvError) return CNI_ERR_INVALID_ENV;
  if (err instanceof UnknownPodError) return CNI_ERR_UNKNOWN_CONTAINER;
  if (err instanceof NotReadyError) return CNI_ERR_TRY_AGAIN_LATER;
  if (err instanceof ConfigError) return CNI_ERR_INVALID_CONFIG;
  return 999;
}

function errorAnswer(command: string, cniVersion: string, code: number, err: unknown): CniAnswer {
  const msg = err instanceof Error ? err.message : String(err);
  const details = err instanceof CniPluginError ? err.details : undefined;
  return { status: 500, body: JSON.stringify(cniErrorBody(code, msg, details, cniVersion)), command, code };
}
