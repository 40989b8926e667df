/**
 * Routes between nodes, the pure part: which route every other Node's pod CIDRs need on this node
 * (`routes: direct`, src/daemon/cluster/routes.ts applies them), and what must change in the kernel to get
 * there. No I/O: the Nodes, this node's addresses and the kernel's routes come in as values.
 *
 * A Node gets one route per pod CIDR (spec.podCIDRs, else spec.podCIDR): via its InternalIP of the
 * same family, out of the link whose subnet holds that address. It gets none, with a reason (the
 * Warning Event on the Node), when it has no InternalIP of that family, when the address is on no
 * subnet directly connected to this node (a route via it would need another router: that is what
 * `routes: direct` never guesses), when the address is this node's own, or when another Node (first
 * by name) already claims the same CIDR. Nodes without a pod CIDR yet are skipped without a reason.
 */
import type { V1Node } from '@kubernetes/client-node';
import { BlockList } from 'node:net';
import { canonicalIp, familyOf, parseCidr, type Family, type Subnet } from '../../net/ip.js';
import type { RouteInfo } from '../../netlink/route.js';

/** What a route needs of a Node. */
export interface NodeRouteSource {
  name: string;
  /** Canonical CIDRs, at most one per family. */
  podCIDRs: string[];
  /** The family of each of podCIDRs (parsed once, when the Node is seen). */
  families: Family[];
  /** The first InternalIP of each family (canonical text). */
  internalIPs: Partial<Record<Family, string>>;
}

/** One address of this node, on the link with `ifindex` (the pod bridge's and loopback's left out by the caller). */
export interface LocalAddress {
  ifindex: number;
  /** The address with its prefix: "198.18.252.11/24". */
  cidr: string;
}

export interface WantedRoute {
  node: string;
  family: Family;
  dst: string;
  gateway: string;
  ifindex: number;
}

export interface RoutePlan {
  routes: WantedRoute[];
  /** Node name → why (some of) its pod CIDRs get no route. */
  problems: Map<string, string>;
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
  return { name, podCIDRs, families, internalIPs };
}

/** Equal as far as routes are concerned (a Node's heartbeat changes nothing here). */
export function sameRouteSource(a: NodeRouteSource | undefined, b: NodeRouteSource | undefined): boolean {
  if (a === undefined || b === undefined) return a === b;
  return (
    a.name === b.name &&
    a.podCIDRs.join(',') === b.podCIDRs.join(',') &&
    a.internalIPs[4] === b.internalIPs[4] &&
    a.internalIPs[6] === b.internalIPs[6]
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
export function planRoutes(self: string, nodes: Iterable<NodeRouteSource>, local: LocalAddress[]): RoutePlan {
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
  const problems = new Map<string, string>();
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
        why.push(
          `its InternalIP ${gateway} is not on a subnet directly connected to this node (${subnets.join(', ') || `no IPv${family} subnet`}): pod CIDR ${dst} needs a router, not a direct route`,
        );
        continue;
      }
      claimed.set(dst, n.name);
      routes.push({ node: n.name, family, dst, gateway, ifindex: link.ifindex });
    }
    if (why.length > 0) problems.set(n.name, why.join('; '));
  }
  return { routes, problems };
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
    return r === undefined || r.gateway !== w.gateway || r.ifindex !== w.ifindex;
  });
  return { replace, remove };
}
