/**
 * A forwarded CNI call, parsed and checked completely before anything on the node changes: the
 * command, container ID, interface, netns path, CNI_ARGS, the network config on stdin (version,
 * name, type) and its runtimeConfig (bandwidth, host ports) or GC list. Pure: the netns itself is
 * examined by the core (by identity). Every refusal is a `CniRequestError` carrying the CNI spec's
 * error code and a message naming the field and the value.
 */
import { checkContainerId, isDnsLabel, isDnsSubdomain } from '../../cni/names.js';
import { compareVersions, isSupportedVersion } from '../../cni/result.js';
import { ConfigError } from '../../errors.js';
import { isValidIfName } from '../../net/ifname.js';
import { isIpAddress } from '../../net/ip.js';
import { limitsFromRuntimeConfig, POD_IFNAME, type Attachment, type BandwidthLimits, type PortMapping } from '../../pod/index.js';
import {
  CNI_COMMANDS,
  CNI_ERR_DECODE,
  CNI_ERR_INCOMPATIBLE_VERSION,
  CNI_ERR_INVALID_CONFIG,
  CNI_ERR_INVALID_ENV,
  SUPPORTED_CNI_VERSIONS,
  type CniCommand,
  type CniRequest,
} from '../protocol.js';

/** The network and plugin type of the conflist the agent writes: a call for anything else is not ours. */
export const CONF_NETWORK_NAME = 'kubenet';
export const CONF_PLUGIN_TYPE = 'kubenet';
/** JSON nested deeper than this is refused before it is parsed. */
export const MAX_JSON_DEPTH = 64;
/** At most this many host ports per pod. */
export const MAX_PORT_MAPPINGS = 256;

/** A refused request: the CNI error code to answer with, and what was wrong. */
export class CniRequestError extends ConfigError {
  readonly code: number;
  constructor(code: number, message: string) {
    super(message);
    this.code = code;
  }
}

interface Common {
  cniVersion: string;
}
export interface AddCall extends Common {
  command: 'ADD';
  containerId: string;
  ifName: string;
  netns: string;
  namespace: string;
  name: string;
  /** From runtimeConfig.bandwidth; undefined: none given (the pod's annotations apply in a cluster). */
  limits: BandwidthLimits | undefined;
  portMappings: PortMapping[];
}
export interface DelCall extends Common {
  command: 'DEL';
  containerId: string;
  ifName: string;
  /** '' when the runtime has none any more. */
  netns: string;
  portMappings: PortMapping[];
}
export interface CheckCall extends Common {
  command: 'CHECK';
  containerId: string;
  ifName: string;
  netns: string;
}
export interface GcCall extends Common {
  command: 'GC';
  valid: Attachment[];
}
export interface OtherCall extends Common {
  command: 'STATUS' | 'VERSION';
}
export type CniCall = AddCall | DelCall | CheckCall | GcCall | OtherCall;

const env4 = (msg: string) => new CniRequestError(CNI_ERR_INVALID_ENV, msg);
const conf7 = (msg: string) => new CniRequestError(CNI_ERR_INVALID_CONFIG, msg);

function isObj(v: unknown): v is Record<string, unknown> {
  return typeof v === 'object' && v !== null && !Array.isArray(v);
}

function describe(v: unknown): string {
  const s = JSON.stringify(v) ?? String(v);
  return s.length > 80 ? `${s.slice(0, 80)}…` : s;
}

/**
 * Nesting depth of JSON text (arrays and objects), counted without parsing, so a document nested
 * deep enough to exhaust the parser's stack is refused first. Linear, allocation-free.
 */
export function jsonDepth(text: string): number {
  let depth = 0;
  let max = 0;
  let inString = false;
  for (let i = 0; i < text.length; i++) {
    const c = text.charCodeAt(i);
    if (inString) {
      if (c === 0x5c)
        i++; // backslash: skip the escaped character
      else if (c === 0x22) inString = false;
      continue;
    }
    if (c === 0x22) inString = true;
    else if (c === 0x5b || c === 0x7b) {
      depth++;
      if (depth > max) max = depth;
    } else if (c === 0x5d || c === 0x7d) depth--;
  }
  return max;
}

/** JSON.parse, refusing text nested deeper than MAX_JSON_DEPTH (code 6, like any undecodable input). */
export function parseJsonBounded(text: string, what: string): unknown {
  const depth = jsonDepth(text);
  if (depth > MAX_JSON_DEPTH)
    throw new CniRequestError(CNI_ERR_DECODE, `${what} is nested ${depth} levels deep: at most ${MAX_JSON_DEPTH}`);
  try {
    return JSON.parse(text);
  } catch (err) {
    throw new CniRequestError(CNI_ERR_DECODE, `${what} is not JSON: ${err instanceof Error ? err.message : String(err)}`);
  }
}

/** Parses and checks one forwarded call. @throws CniRequestError */
export function parseCniCall(req: CniRequest): CniCall {
  const command = req.env.CNI_COMMAND;
  if (command === undefined || command === '') throw env4('CNI_COMMAND is required');
  if (!(CNI_COMMANDS as readonly string[]).includes(command))
    throw env4(`CNI_COMMAND ${describe(command)} is not one of ${CNI_COMMANDS.join(', ')}`);
  const conf = parseConf(req.stdin);
  const cniVersion = conf.cniVersion as string;
  switch (command as CniCommand) {
    case 'VERSION':
      return { command: 'VERSION', cniVersion };
    case 'STATUS':
      requireVersion(cniVersion, '1.1.0', 'STATUS');
      return { command: 'STATUS', cniVersion };
    case 'GC':
      requireVersion(cniVersion, '1.1.0', 'GC');
      return { command: 'GC', cniVersion, valid: validAttachments(conf['cni.dev/valid-attachments']) };
    case 'ADD': {
      const a = attachment(req, true);
      const rc = runtimeConfig(conf);
      const pod = podIdentity(req.env.CNI_ARGS ?? '', a.containerId);
      return { command: 'ADD', cniVersion, ...a, ...pod, limits: bandwidthOf(rc), portMappings: portMappingsOf(rc) };
    }
    case 'CHECK': {
      const a = attachment(req, true);
      runtimeConfig(conf);
      podIdentity(req.env.CNI_ARGS ?? '', a.containerId);
      return { command: 'CHECK', cniVersion, ...a };
    }
    case 'DEL': {
      const a = attachment(req, false);
      const rc = runtimeConfig(conf);
      podIdentity(req.env.CNI_ARGS ?? '', a.containerId);
      return { command: 'DEL', cniVersion, ...a, portMappings: portMappingsOf(rc) };
    }
  }
}

/** The IPAM shim's call (POST /v1/ipam): the bridge plugin's IPAM ADD, with the agent's bridge config on stdin. */
export interface IpamCall {
  containerId: string;
  ifName: string;
  cniVersion: string;
}

export function parseIpamCall(req: CniRequest): IpamCall {
  const command = req.env.CNI_COMMAND;
  if (command !== 'ADD')
    throw env4(`CNI_COMMAND ${describe(command)}: the agent answers only the IPAM shim's ADD (the shim runs host-local for the rest)`);
  const a = attachment(req, true);
  if (req.stdin.trim() === '') throw new CniRequestError(CNI_ERR_DECODE, 'the network config on stdin is empty');
  const v = parseJsonBounded(req.stdin, 'the network config on stdin');
  if (!isObj(v) || typeof v.cniVersion !== 'string' || !isSupportedVersion(v.cniVersion)) {
    throw new CniRequestError(
      CNI_ERR_INCOMPATIBLE_VERSION,
      `the bridge config's cniVersion ${describe(isObj(v) ? v.cniVersion : v)} is not supported`,
    );
  }
  return { containerId: a.containerId, ifName: a.ifName, cniVersion: v.cniVersion };
}

/** The network config on stdin: a JSON object of a supported version, for network kubenet, plugin kubenet. */
function parseConf(stdin: string): Record<string, unknown> {
  if (stdin.trim() === '') throw new CniRequestError(CNI_ERR_DECODE, 'the network config on stdin is empty');
  const v = parseJsonBounded(stdin, 'the network config on stdin');
  if (!isObj(v)) throw new CniRequestError(CNI_ERR_DECODE, `the network config on stdin must be a JSON object, got ${describe(v)}`);
  if (v.cniVersion === undefined) throw conf7('the network config has no "cniVersion"');
  if (typeof v.cniVersion !== 'string' || !isSupportedVersion(v.cniVersion)) {
    throw new CniRequestError(
      CNI_ERR_INCOMPATIBLE_VERSION,
      `cniVersion ${describe(v.cniVersion)} is not supported (supported: ${SUPPORTED_CNI_VERSIONS.join(', ')})`,
    );
  }
  if (v.name !== CONF_NETWORK_NAME)
    throw conf7(
      `network name ${describe(v.name)} is not ${JSON.stringify(CONF_NETWORK_NAME)}: this agent serves only the network it wrote`,
    );
  if (v.type !== CONF_PLUGIN_TYPE) throw conf7(`plugin type ${describe(v.type)} is not ${JSON.stringify(CONF_PLUGIN_TYPE)}`);
  return v;
}

function requireVersion(v: string, min: string, what: string): void {
  if (compareVersions(v, min) < 0)
    throw new CniRequestError(CNI_ERR_INCOMPATIBLE_VERSION, `${what} needs cniVersion ${min} or later, got ${JSON.stringify(v)}`);
}

/** CNI_CONTAINERID, CNI_IFNAME and CNI_NETNS (required for ADD and CHECK; may be empty on DEL). */
function attachment(req: CniRequest, needNetns: boolean): { containerId: string; ifName: string; netns: string } {
  const id = req.env.CNI_CONTAINERID;
  if (id === undefined || id === '') throw env4('CNI_CONTAINERID is required');
  try {
    checkContainerId(id, 'CNI_CONTAINERID');
  } catch (err) {
    throw env4((err as Error).message);
  }
  const ifName = req.env.CNI_IFNAME;
  if (ifName === undefined || ifName === '') throw env4('CNI_IFNAME is required');
  if (!isValidIfName(ifName)) throw env4(`CNI_IFNAME ${describe(ifName)} is not a valid interface name`);
  if (ifName !== POD_IFNAME) throw env4(`CNI_IFNAME ${describe(ifName)}: kubenet attaches pods as ${POD_IFNAME} only`);
  const netns = req.env.CNI_NETNS ?? '';
  if (netns === '' && needNetns) throw env4('CNI_NETNS is required');
  if (netns !== '' && (!netns.startsWith('/') || netns.includes('\0') || netns.length > 4096))
    throw env4(`CNI_NETNS ${describe(netns)} is not an absolute path`);
  return { containerId: id, ifName, netns };
}

/**
 * CNI_ARGS: `K=V` pairs separated by ';'. The pod identity (K8S_POD_NAMESPACE: a DNS label,
 * K8S_POD_NAME: a DNS subdomain) is what the agent uses; K8S_POD_INFRA_CONTAINER_ID, when given,
 * must be the container ID. Other keys are ignored, as with IgnoreUnknown.
 */
export function podIdentity(cniArgs: string, containerId: string): { namespace: string; name: string } {
  const args = new Map<string, string>();
  if (cniArgs !== '') {
    for (const kv of cniArgs.split(';')) {
      const i = kv.indexOf('=');
      if (i <= 0) throw env4(`CNI_ARGS entry ${describe(kv)} is not KEY=VALUE`);
      const k = kv.slice(0, i);
      const v = kv.slice(i + 1);
      if (/[\0-\x1f\x7f]/.test(kv)) throw env4(`CNI_ARGS entry ${describe(kv)} holds control characters`);
      if (args.has(k)) throw env4(`CNI_ARGS names ${k} twice`);
      args.set(k, v);
    }
  }
  const namespace = args.get('K8S_POD_NAMESPACE') ?? '';
  const name = args.get('K8S_POD_NAME') ?? '';
  if (namespace !== '' && !isDnsLabel(namespace))
    throw env4(`CNI_ARGS K8S_POD_NAMESPACE ${describe(namespace)} is not a Kubernetes namespace name`);
  if (name !== '' && !isDnsSubdomain(name)) throw env4(`CNI_ARGS K8S_POD_NAME ${describe(name)} is not a Kubernetes pod name`);
  const infra = args.get('K8S_POD_INFRA_CONTAINER_ID');
  if (infra !== undefined && infra !== '' && infra !== containerId)
    throw env4(`CNI_ARGS K8S_POD_INFRA_CONTAINER_ID ${describe(infra)} is not CNI_CONTAINERID`);
  return { namespace, name };
}

function runtimeConfig(conf: Record<string, unknown>): Record<string, unknown> {
  const rc = conf.runtimeConfig;
  if (rc === undefined || rc === null) return {};
  if (!isObj(rc)) throw conf7(`runtimeConfig must be an object, got ${describe(rc)}`);
  return rc;
}

/** runtimeConfig.bandwidth (src/bandwidth/limits.ts), its refusals as code 7. */
export function bandwidthOf(rc: Record<string, unknown>): BandwidthLimits | undefined {
  try {
    return limitsFromRuntimeConfig(rc.bandwidth);
  } catch (err) {
    if (err instanceof ConfigError) throw conf7(err.message);
    throw err;
  }
}

const PROTOCOLS = ['tcp', 'udp', 'sctp'] as const;

/**
 * The object's keys matched without regard to case, as Go's JSON decoding (so the reference plugins)
 * matches struct fields: containerd 1.6 sends portMappings as HostPort/ContainerPort/Protocol/HostIP,
 * CRI-O in camelCase. Unknown keys and two spellings of one key are refused.
 */
function caseFolded(obj: Record<string, unknown>, keys: string[], where: string): Record<string, unknown> {
  const out: Record<string, unknown> = {};
  for (const [k, v] of Object.entries(obj)) {
    const key = keys.find((c) => c.toLowerCase() === k.toLowerCase());
    if (!key) throw conf7(`${where} has an unknown key ${JSON.stringify(k)} (keys are ${keys.join(', ')})`);
    if (key in out) throw conf7(`${where} gives ${key} twice (${JSON.stringify(k)})`);
    out[key] = v;
  }
  return out;
}

/** runtimeConfig.portMappings as containerd and CRI-O pass a pod's hostPorts; [] when none. */
export function portMappingsOf(rc: Record<string, unknown>): PortMapping[] {
  const pm = rc.portMappings;
  if (pm === undefined || pm === null) return [];
  if (!Array.isArray(pm)) throw conf7(`runtimeConfig.portMappings must be a list, got ${describe(pm)}`);
  if (pm.length > MAX_PORT_MAPPINGS) throw conf7(`runtimeConfig.portMappings has ${pm.length} entries: at most ${MAX_PORT_MAPPINGS}`);
  const seen = new Set<string>();
  return pm.map((entry: unknown, i): PortMapping => {
    const where = `runtimeConfig.portMappings[${i}]`;
    if (!isObj(entry)) throw conf7(`${where} must be an object, got ${describe(entry)}`);
    const m = caseFolded(entry, ['hostPort', 'containerPort', 'protocol', 'hostIP'], where);
    const port = (key: string): number => {
      const v = m[key];
      if (typeof v !== 'number' || !Number.isInteger(v) || v < 1 || v > 65535)
        throw conf7(`${where}.${key} must be a port 1..65535, got ${describe(v)}`);
      return v;
    };
    const protocol =
      typeof m.protocol === 'string' ? m.protocol.toLowerCase() : m.protocol === undefined || m.protocol === '' ? 'tcp' : m.protocol;
    if (!(PROTOCOLS as readonly unknown[]).includes(protocol))
      throw conf7(`${where}.protocol must be one of ${PROTOCOLS.join(', ')}, got ${describe(m.protocol)}`);
    const out: PortMapping = {
      hostPort: port('hostPort'),
      containerPort: port('containerPort'),
      protocol: protocol as PortMapping['protocol'],
    };
    if (m.hostIP !== undefined && m.hostIP !== '') {
      if (typeof m.hostIP !== 'string' || !isIpAddress(m.hostIP))
        throw conf7(`${where}.hostIP must be an IP address, got ${describe(m.hostIP)}`);
      out.hostIP = m.hostIP;
    }
    const key = `${out.hostIP ?? ''}/${out.hostPort}/${out.protocol}`;
    if (seen.has(key))
      throw conf7(`${where}: host port ${out.hostPort}/${out.protocol}${out.hostIP ? ` on ${out.hostIP}` : ''} is mapped twice`);
    seen.add(key);
    return out;
  });
}

/**
 * GC's `cni.dev/valid-attachments`: a list of `{containerID, ifname}` objects (spec 1.1.0), checked
 * whole before anything is collected. Any malformed entry refuses the GC: acting on a list misread
 * would tear down pods that are valid.
 */
export function validAttachments(v: unknown): Attachment[] {
  if (v === undefined) throw conf7('GC: cni.dev/valid-attachments is required');
  if (!Array.isArray(v)) throw conf7(`GC: cni.dev/valid-attachments must be a list, got ${describe(v)}`);
  return v.map((a: unknown, i): Attachment => {
    const where = `GC: cni.dev/valid-attachments[${i}]`;
    if (!isObj(a)) throw conf7(`${where} must be an object {"containerID", "ifname"}, got ${describe(a)}`);
    for (const k of Object.keys(a)) {
      if (k !== 'containerID' && k !== 'ifname')
        throw conf7(`${where} has an unknown key ${JSON.stringify(k)} (keys are "containerID" and "ifname")`);
    }
    if (typeof a.containerID !== 'string') throw conf7(`${where}.containerID must be a string, got ${describe(a.containerID)}`);
    try {
      checkContainerId(a.containerID, `${where}.containerID`);
    } catch (err) {
      throw conf7((err as Error).message);
    }
    if (!isValidIfName(a.ifname)) throw conf7(`${where}.ifname must be an interface name, got ${describe(a.ifname)}`);
    return { containerId: a.containerID, ifName: a.ifname };
  });
}
