/**
 * Routes between nodes, the pure part: which route every other Node's pod CIDRs need on this node
 * (`routes: direct` and `routes: auto`, src/daemon/cluster/routes.ts applies them), and what must
 * change in the kernel to get there. No I/O: the Nodes, this node's addresses, its tunnel devices and
 * the kernel's routes and entries come in as values.
 *
 * A Node gets one route per pod CIDR (spec.podCIDRs, else spec.podCIDR): via its InternalIP of the
 * same family, out of the link whose subnet holds that address. It gets none, with a reason (the
 * Warning Event on the Node), when it has no InternalIP of that family, when the address is on no
 * subnet directly connected to this node (a route via it would need another router: that is what
 * `routes: direct` never guesses), when the address is this node's own, or when another Node (first
 * by name) already claims the same CIDR. Nodes without a pod CIDR yet are skipped without a reason.
 *
 * With tunnels (`routes: auto`: a VXLAN device per family, given as `tunnels`), a Node whose
 * InternalIP is on no connected subnet is not a problem but a tunnel peer: its pod CIDR is routed
 * `via GW dev VXLAN onlink mtu M`, where GW is the pod CIDR's network address (its node's inner
 * address, as flannel's vxlan backend does), with a permanent neighbour GW -> the peer's VTEP MAC and
 * an FDB entry VTEP MAC -> its InternalIP on the device. A VTEP MAC is derived from the node's
 * InternalIP (vtepMac), so no node publishes anything for it. A Node on a connected subnet is routed
 * directly as with `direct`: full MTU, no encapsulation.
 *
 * Each agent with tunnels publishes its UDP port and VNI on its Node ({@link VXLAN_ANNOTATION}). A
 * peer that publishes others than this node's is still reached: its FDB entry carries its port and
 * VNI (the kernel sends to them; the peer, doing the same, sends back to ours), and the plan names
 * it in `mismatched` for a Warning, since every node is meant to use the same.
 */
import type { V1Node } from '@kubernetes/client-node';
import { BlockList } from 'node:net';
import { canonicalIp, familyOf, parseCidr, type Family, type Subnet } from '../../net/ip.js';
import type { RouteInfo } from '../../netlink/route.js';
import { parseVxlanSettings, peerMac, VXLAN_ANNOTATION, vtepMac, type VxlanSettings } from './vtep.js';

export { formatVxlanSettings, parseVxlanSettings, VXLAN_ANNOTATION, vtepMac, type VxlanSettings } from './vtep.js';

/** What a route needs of a Node. */
export interface NodeRouteSource {
  name: string;
  /** Canonical CIDRs, at most one per family. */
  podCIDRs: string[];
  /** The family of each of podCIDRs (parsed once, when the Node is seen). */
  families: Family[];
  /** The first InternalIP of each family (canonical text). */
  internalIPs: Partial<Record<Family, string>>;
  /** The VXLAN port and VNI its agent publishes ({@link VXLAN_ANNOTATION}); unknown for agents before it, or without tunnels. */
  vxlan?: VxlanSettings;
}

/** One address of this node, on the link with `ifindex` (the pod bridge's and loopback's left out by the caller). */
export interface LocalAddress {
  ifindex: number;
  /** The address with its prefix: "198.18.252.11/24". */
  cidr: string;
}

/** How a Node's pods are reached: a route via its InternalIP, or through this node's VXLAN device. */
export type RouteWay = 'direct' | 'tunnel';

export interface WantedRoute {
  node: string;
  family: Family;
  dst: string;
  gateway: string;
  ifindex: number;
  way: RouteWay;
  /** The Node's InternalIP: the gateway (direct) or the VXLAN packets' destination (tunnel). */
  underlay: string;
  /** Tunnel routes: the path MTU (the device's, below the uplink's by the encapsulation). */
  mtu?: number;
  /** Tunnel routes: the gateway is on the device though no address of it covers the gateway. */
  onlink?: boolean;
}

/** A permanent neighbour on a VXLAN device: a tunnel peer's inner address -> its VTEP MAC. */
export interface WantedNeighbour {
  family: Family;
  node: string;
  ip: string;
  mac: string;
}

/** An FDB entry on a VXLAN device: a tunnel peer's VTEP MAC -> its InternalIP (the outer destination). */
export interface WantedFdb {
  family: Family;
  node: string;
  mac: string;
  dst: string;
  /** The peer's own port and VNI, where it publishes others than this node's. */
  port?: number;
  vni?: number;
}

/** This node's VXLAN device of a family, as the kernel has it. */
export interface TunnelDevice {
  ifindex: number;
  mtu: number;
  /** Its MAC (this node's VTEP MAC): no peer may derive the same. */
  mac: string;
}

export interface PlanOptions {
  /** `routes: auto`: this node's VXLAN device per family, where it has one. */
  tunnels?: Partial<Record<Family, TunnelDevice>>;
  /** `routes: auto`: why a family has no device (this node has no InternalIP of it, say). */
  tunnelProblems?: Partial<Record<Family, string>>;
  /** `routes: auto`: this node's VXLAN port and VNI (the devices'). */
  vxlan?: VxlanSettings;
}

export interface RoutePlan {
  routes: WantedRoute[];
  neighbours: WantedNeighbour[];
  fdb: WantedFdb[];
  /** Node name → why (some of) its pod CIDRs get no route. */
  problems: Map<string, string>;
  /** Tunnel peers whose agent publishes another VXLAN port or VNI than this node's: node name → what differs. */
  mismatched: Map<string, string>;
}

/** Encapsulation overhead of VXLAN (outer Ethernet excluded): IP + UDP + VXLAN + inner Ethernet. */
export const VXLAN_OVERHEAD: Record<Family, number> = { 4: 50, 6: 70 };

/** This node's VXLAN endpoint of a family: its InternalIP (the outer source), the link holding it, its MAC; or why there is none. */
export function tunnelEndpoint(
  self: NodeRouteSource | undefined,
  local: LocalAddress[],
  family: Family,
): { local: string; uplink: number; mac: string } | { problem: string } {
  const ip = self?.internalIPs[family];
  if (ip === undefined) return { problem: `this node has no InternalIP of IPv${family} to send VXLAN from` };
  const link = local.find((a) => {
    const text = a.cidr.split('/')[0] ?? '';
    return familyOf(text) === family && canonicalIp(text) === ip;
  });
  if (!link) return { problem: `this node's InternalIP ${ip} is on none of its links` };
  return { local: ip, uplink: link.ifindex, mac: vtepMac(ip) };
}

/** The fields routes depend on; null for a Node that has none of them yet. */
export function nodeRouteSource(node: V1Node): NodeRouteSource | undefined {
  const name = node.metadata?.name;
  if (!name) return undefined;
  const raw = (node.spec?.podCIDRs ?? []).filter((c) => c !== '');
  if (raw.length === 0 && node.spec?.podCIDR) raw.push(node.spec.podCIDR);
  const podCIDRs: string[] = [];
  const families: Family[] = [];
  for (const c of raw) {
    try {
      const p = parseCidr(c);
      podCIDRs.push(p.cidr);
      families.push(p.family);
    } catch {
      // The API server validates podCIDRs; anything unparsable is left out (and has no route).
    }
  }
  const internalIPs: Partial<Record<Family, string>> = {};
  for (const a of node.status?.addresses ?? []) {
    const f = familyOf(a.address);
    if (a.type !== 'InternalIP' || f === 0 || internalIPs[f] !== undefined) continue;
    internalIPs[f] = canonicalIp(a.address);
  }
  const vxlan = parseVxlanSettings(node.metadata?.annotations?.[VXLAN_ANNOTATION]);
  return { name, podCIDRs, families, internalIPs, ...(vxlan ? { vxlan } : {}) };
}

/** Equal as far as routes are concerned (a Node's heartbeat changes nothing here). */
export function sameRouteSource(a: NodeRouteSource | undefined, b: NodeRouteSource | undefined): boolean {
  if (a === undefined || b === undefined) return a === b;
  return (
    a.name === b.name &&
    a.podCIDRs.join(',') === b.podCIDRs.join(',') &&
    a.internalIPs[4] === b.internalIPs[4] &&
    a.internalIPs[6] === b.internalIPs[6] &&
    a.vxlan?.port === b.vxlan?.port &&
    a.vxlan?.vni === b.vxlan?.vni
  );
}

interface Connected {
  subnet: Subnet;
  /** Whether an address of the subnet's family lies in it: u32 arithmetic for IPv4 (far cheaper), node:net's BlockList for IPv6 (docs/agent.md). */
  has: (ip: string) => boolean;
  ifindex: number;
  ip: string;
}

/** A dotted quad as an unsigned 32-bit number (the address is known to be valid IPv4). */
function u32(ip: string): number {
  let n = 0;
  let part = 0;
  for (let i = 0; i < ip.length; i++) {
    const c = ip.charCodeAt(i);
    if (c === 46) {
      n = n * 256 + part;
      part = 0;
    } else part = part * 10 + (c - 48);
  }
  return n * 256 + part;
}

function containment(subnet: Subnet): (ip: string) => boolean {
  if (subnet.family === 4) {
    const size = 2 ** (32 - subnet.prefixLen);
    const start = u32(subnet.network);
    return (ip) => {
      const v = u32(ip);
      return v >= start && v < start + size;
    };
  }
  const block = new BlockList();
  block.addSubnet(subnet.network, subnet.prefixLen, 'ipv6');
  return (ip) => block.check(ip, 'ipv6');
}

/** The routes this node (`self`) should hold for the other Nodes. */
export function planRoutes(self: string, nodes: Iterable<NodeRouteSource>, local: LocalAddress[], opts: PlanOptions = {}): RoutePlan {
  const connected: Connected[] = [];
  for (const a of local) {
    try {
      const ip = a.cidr.split('/')[0] ?? '';
      const subnet = parseCidr(a.cidr);
      connected.push({ subnet, has: containment(subnet), ifindex: a.ifindex, ip: canonicalIp(ip) });
    } catch {
      // not an address with a prefix: ignore
    }
  }
  // The longest prefix wins, as the kernel would choose the link.
  connected.sort((x, y) => y.subnet.prefixLen - x.subnet.prefixLen);
  const own = new Set(connected.map((c) => c.ip));
  const sorted = [...nodes].sort((a, b) => (a.name < b.name ? -1 : a.name > b.name ? 1 : 0));
  const ownCidrs = new Set(sorted.find((n) => n.name === self)?.podCIDRs ?? []);
  const claimed = new Map<string, string>();
  const routes: WantedRoute[] = [];
  const neighbours: WantedNeighbour[] = [];
  const fdb: WantedFdb[] = [];
  const problems = new Map<string, string>();
  const mismatched = new Map<string, string>();
  /** FDB entries planned, by family and MAC: a lookup, not a scan (quadratic at 1 000 peers). */
  const fdbMacs = new Set<string>();
  /** Per family: VTEP MAC -> the node that has it (this node's device first). */
  const macs: Record<Family, Map<string, string>> = { 4: new Map(), 6: new Map() };
  for (const f of [4, 6] as const) {
    const d = opts.tunnels?.[f];
    if (d) macs[f].set(d.mac, self);
  }
  for (const n of sorted) {
    if (n.name === self) continue;
    const why: string[] = [];
    for (const [k, dst] of n.podCIDRs.entries()) {
      const family = n.families[k] ?? 4;
      const gateway = n.internalIPs[family];
      if (gateway === undefined) {
        why.push(`no InternalIP of IPv${family} for pod CIDR ${dst}`);
        continue;
      }
      if (own.has(gateway)) {
        why.push(`its InternalIP ${gateway} is an address of this node`);
        continue;
      }
      if (ownCidrs.has(dst) || claimed.has(dst)) {
        why.push(`pod CIDR ${dst} is also ${ownCidrs.has(dst) ? "this node's" : `node ${claimed.get(dst) ?? ''}'s`}`);
        continue;
      }
      const link = connected.find((c) => c.subnet.family === family && c.has(gateway));
      if (!link) {
        const subnets = connected.filter((c) => c.subnet.family === family).map((c) => c.subnet.cidr);
        const notConnected = `its InternalIP ${gateway} is not on a subnet directly connected to this node (${subnets.join(', ') || `no IPv${family} subnet`})`;
        if (opts.tunnels === undefined && opts.tunnelProblems === undefined) {
          why.push(`${notConnected}: pod CIDR ${dst} needs a router, not a direct route`);
          continue;
        }
        const device = opts.tunnels?.[family];
        if (!device) {
          why.push(`${notConnected} and no tunnel for pod CIDR ${dst}: ${opts.tunnelProblems?.[family] ?? `no IPv${family} VXLAN device`}`);
          continue;
        }
        const mac = peerMac(gateway);
        const holder = macs[family].get(mac);
        if (holder !== undefined && holder !== n.name) {
          why.push(
            `its VTEP MAC ${mac} (derived from ${gateway}) is also ${holder === self ? "this node's" : `node ${holder}'s`}: pod CIDR ${dst} cannot be tunnelled`,
          );
          continue;
        }
        macs[family].set(mac, n.name);
        claimed.set(dst, n.name);
        // Canonical (host bits cleared, nodeRouteSource): the address part is the network address.
        const inner = dst.slice(0, dst.indexOf('/'));
        routes.push({
          node: n.name,
          family,
          dst,
          gateway: inner,
          ifindex: device.ifindex,
          way: 'tunnel',
          underlay: gateway,
          mtu: device.mtu,
          onlink: true,
        });
        neighbours.push({ family, node: n.name, ip: inner, mac });
        if (!fdbMacs.has(`${family} ${mac}`)) {
          fdbMacs.add(`${family} ${mac}`);
          fdb.push({ family, node: n.name, mac, dst: gateway, ...otherVxlan(n, opts, mismatched) });
        }
        continue;
      }
      claimed.set(dst, n.name);
      routes.push({ node: n.name, family, dst, gateway, ifindex: link.ifindex, way: 'direct', underlay: gateway });
    }
    if (why.length > 0) problems.set(n.name, why.join('; '));
  }
  return { routes, neighbours, fdb, problems, mismatched };
}

/** A tunnel peer's port and VNI where its agent publishes others than this node's (noted in `mismatched`); none otherwise. */
function otherVxlan(n: NodeRouteSource, opts: PlanOptions, mismatched: Map<string, string>): { port?: number; vni?: number } {
  const mine = opts.vxlan;
  const theirs = n.vxlan;
  if (!mine || !theirs || (mine.port === theirs.port && mine.vni === theirs.vni)) return {};
  mismatched.set(
    n.name,
    `its agent uses VXLAN port ${theirs.port} and VNI ${theirs.vni}, this node's port ${mine.port} and VNI ${mine.vni}`,
  );
  return { ...(theirs.port !== mine.port ? { port: theirs.port } : {}), ...(theirs.vni !== mine.vni ? { vni: theirs.vni } : {}) };
}

/** What to change so that the kernel's routes of our protocol (`current`) become `wanted`. */
export function diffRoutes(current: RouteInfo[], wanted: WantedRoute[]): { replace: WantedRoute[]; remove: RouteInfo[] } {
  const want = new Map(wanted.map((w) => [w.dst, w]));
  const have = new Map<string, RouteInfo>();
  const remove: RouteInfo[] = [];
  for (const r of current) {
    // Two of ours to one destination cannot happen through routeReplace; if it did, drop the extra.
    if (have.has(r.dst) || !want.has(r.dst)) remove.push(r);
    else have.set(r.dst, r);
  }
  const replace = wanted.filter((w) => {
    const r = have.get(w.dst);
    return (
      r === undefined ||
      r.gateway !== w.gateway ||
      r.ifindex !== w.ifindex ||
      (r.mtu ?? 0) !== (w.mtu ?? 0) ||
      (r.onlink ?? false) !== (w.onlink ?? false)
    );
  });
  return { replace, remove };
}

/** A neighbour or FDB entry as the kernel holds it on a VXLAN device. */
export interface TunnelEntry {
  /** The neighbour's IP, or the FDB entry's MAC. */
  key: string;
  /** The neighbour's MAC, or the FDB entry's destination (its InternalIP). */
  value: string;
}

/** What to change so that a device's entries (`current`, all ours: the device is the agent's) become `wanted`. */
export function diffEntries(current: TunnelEntry[], wanted: TunnelEntry[]): { replace: TunnelEntry[]; remove: TunnelEntry[] } {
  const want = new Map(wanted.map((w) => [w.key, w.value]));
  const have = new Map<string, string>();
  const remove: TunnelEntry[] = [];
  for (const e of current) {
    if (have.has(e.key) || !want.has(e.key)) remove.push(e);
    else have.set(e.key, e.value);
  }
  return { replace: wanted.filter((w) => have.get(w.key) !== w.value), remove };
}
