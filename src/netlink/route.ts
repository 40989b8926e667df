/**
 * Routes, named after iproute2: `ip route show proto P`, `ip route replace DST via GW dev IFINDEX
 * [onlink] [mtu M] proto P`, `ip route del DST proto P`, in the main table of the process's own
 * namespace (or, given `netns`, of the namespace mounted there: `ip -n NS route ...`), each off the
 * event loop on a socket of its own (./socket.ts withHostSocket, withNetnsSocket).
 *
 * Every function here names a routing protocol number: routes are listed by it and deleted only when
 * they carry it, so a caller that owns a protocol number can never change or remove anyone else's
 * route (the kernel's, DHCP's, a cloud agent's, an operator's).
 */
import {
  AF_INET,
  AF_INET6,
  nl,
  NLM_F_REPLACE,
  rt,
  RT_SCOPE_UNIVERSE,
  RT_TABLE_MAIN,
  RTAX_MTU,
  RTN_UNICAST,
  RTNH_F_ONLINK,
  type Out,
  type Ptr,
} from './libnl.js';
import { ConfigError, NetlinkError } from '../errors.js';
import { familyOf, parseCidr } from '../net/ip.js';
import { E, NLE, nlError } from './errno.js';
import { withHostSocket, withNetnsSocket, type Lease } from './socket.js';

export interface RouteInfo {
  family: 4 | 6;
  /** "10.244.1.0/24": canonical, host bits cleared. */
  dst: string;
  /** The first nexthop's gateway, when it has one. */
  gateway: string | undefined;
  /** The first nexthop's output link. */
  ifindex: number;
  protocol: number;
  /** The route's MTU metric (`mtu M`), when it has one. */
  mtu?: number;
  /** The first nexthop is flagged onlink. */
  onlink?: boolean;
}

export interface RouteSpec {
  dst: string;
  gateway: string;
  ifindex: number;
  protocol: number;
  /** `mtu M`: the path MTU of the route (locked by nothing: PMTU discovery may lower it further). */
  mtu?: number;
  /** `onlink`: the gateway is reachable on the link though no address of the link covers it (a tunnel's peer). */
  onlink?: boolean;
}

/** A socket of the process's own namespace, or of the one mounted at `netns`. */
function withSocket<T>(op: string, netns: string | undefined, use: (l: Lease) => Promise<T>): Promise<T> {
  return netns === undefined ? withHostSocket(op, use) : withNetnsSocket(op, netns, use);
}

const buf = Buffer.alloc(128);

function addrText(a: Ptr, family: 4 | 6): string {
  const text = nl.nl_addr2str(a, buf, buf.length) as string;
  return text.includes('/') ? text : `${text}/${family === 4 ? 32 : 128}`;
}

function checkProto(op: string, protocol: number): void {
  // 0-4 are the kernel's own (unspec, redirect, kernel, boot, static): never ours to manage.
  if (!Number.isInteger(protocol) || protocol < 5 || protocol > 255)
    throw new ConfigError(`${op}: routing protocol must be 5..255, got ${JSON.stringify(protocol)}`);
}

/** nl_addr_parse of a canonical text; the caller puts the result. */
function parseNlAddr(op: string, text: string, family: 4 | 6): Ptr {
  const out: Out = [null];
  const rc = nl.nl_addr_parse(text, family === 4 ? AF_INET : AF_INET6, out) as number;
  if (rc < 0 || !out[0]) throw nlError(op, rc < 0 ? rc : -NLE.PARSE_ERR);
  return out[0];
}

/** A route object for DST in the main table with PROTOCOL (and, for add, one nexthop). The caller puts it. */
function buildRoute(
  op: string,
  dst: string,
  protocol: number,
  nexthop?: { gateway: string; ifindex: number; onlink?: boolean },
  mtu?: number,
): Ptr {
  const d = parseCidr(dst);
  const route = rt.rtnl_route_alloc() as Ptr;
  if (!route) throw new NetlinkError(op, E.ENOMEM, 'rtnl_route_alloc failed');
  try {
    rt.rtnl_route_set_family(route, d.family === 4 ? AF_INET : AF_INET6);
    rt.rtnl_route_set_table(route, RT_TABLE_MAIN);
    rt.rtnl_route_set_protocol(route, protocol);
    // Our routes all go via a gateway (universe scope); a delete must name that scope to match them.
    rt.rtnl_route_set_scope(route, RT_SCOPE_UNIVERSE);
    const dstAddr = parseNlAddr(op, d.cidr, d.family);
    try {
      const rc = rt.rtnl_route_set_dst(route, dstAddr) as number;
      if (rc < 0) throw nlError(op, rc);
    } finally {
      nl.nl_addr_put(dstAddr);
    }
    if (nexthop) {
      if (familyOf(nexthop.gateway) !== d.family)
        throw new ConfigError(`${op}: gateway ${JSON.stringify(nexthop.gateway)} is not an IPv${d.family} address`);
      const nh = rt.rtnl_route_nh_alloc() as Ptr;
      if (!nh) throw new NetlinkError(op, E.ENOMEM, 'rtnl_route_nh_alloc failed');
      const gwAddr = parseNlAddr(op, nexthop.gateway, d.family);
      try {
        rt.rtnl_route_nh_set_gateway(nh, gwAddr);
      } finally {
        nl.nl_addr_put(gwAddr);
      }
      rt.rtnl_route_nh_set_ifindex(nh, nexthop.ifindex);
      if (nexthop.onlink) rt.rtnl_route_nh_set_flags(nh, RTNH_F_ONLINK);
      rt.rtnl_route_add_nexthop(route, nh); // the route owns it now
    }
    if (mtu !== undefined) {
      if (!Number.isInteger(mtu) || mtu < 68 || mtu > 65535)
        throw new ConfigError(`${op}: mtu must be 68..65535, got ${JSON.stringify(mtu)}`);
      const rc = rt.rtnl_route_set_metric(route, RTAX_MTU, mtu) as number;
      if (rc < 0) throw nlError(op, rc);
    }
    return route;
  } catch (err) {
    rt.rtnl_route_put(route);
    throw err;
  }
}

const metricOut: [number] = [0];

/** `ip route show table main proto PROTOCOL` (both families, unicast routes only). */
export async function routeList(protocol: number, netns?: string): Promise<RouteInfo[]> {
  const op = `routeList proto ${protocol}`;
  checkProto(op, protocol);
  return withSocket(op, netns, async (l) => {
    const result: RouteInfo[] = [];
    for (const af of [AF_INET, AF_INET6]) {
      const cache = await l.dump((out) => l.call(rt.rtnl_route_alloc_cache, l.sk, af, 0, out));
      try {
        for (let r = nl.route_cache_first(cache) as Ptr; r; r = nl.route_cache_next(r) as Ptr) {
          if ((rt.rtnl_route_get_protocol(r) as number) !== protocol) continue;
          if ((rt.rtnl_route_get_table(r) as number) !== RT_TABLE_MAIN || (rt.rtnl_route_get_type(r) as number) !== RTN_UNICAST) continue;
          const family = af === AF_INET ? 4 : 6;
          const dst = rt.rtnl_route_get_dst(r) as Ptr;
          if (!dst) continue;
          let gateway: string | undefined;
          let ifindex = 0;
          let onlink = false;
          if ((rt.rtnl_route_get_nnexthops(r) as number) > 0) {
            const nh = rt.rtnl_route_nexthop_n(r, 0) as Ptr;
            const gw = rt.rtnl_route_nh_get_gateway(nh) as Ptr;
            if (gw) gateway = (nl.nl_addr2str(gw, buf, buf.length) as string).split('/')[0];
            ifindex = rt.rtnl_route_nh_get_ifindex(nh) as number;
            onlink = ((rt.rtnl_route_nh_get_flags(nh) as number) & RTNH_F_ONLINK) !== 0;
          }
          const mtu = (rt.rtnl_route_get_metric(r, RTAX_MTU, metricOut) as number) === 0 && metricOut[0] > 0 ? metricOut[0] : undefined;
          // The kernel keeps destinations with host bits cleared; libnl prints them canonically.
          result.push({
            family,
            dst: addrText(dst, family),
            gateway,
            ifindex,
            protocol,
            ...(mtu !== undefined ? { mtu } : {}),
            ...(onlink ? { onlink } : {}),
          });
        }
      } finally {
        nl.nl_cache_free(cache);
      }
    }
    return result;
  });
}

/** `ip route replace DST via GATEWAY dev IFINDEX [onlink] [mtu M] proto PROTOCOL` in the main table. */
export async function routeReplace(spec: RouteSpec, netns?: string): Promise<void> {
  const op = `routeReplace ${spec.dst} via ${spec.gateway}`;
  checkProto(op, spec.protocol);
  const route = buildRoute(
    op,
    spec.dst,
    spec.protocol,
    { gateway: spec.gateway, ifindex: spec.ifindex, onlink: spec.onlink === true },
    spec.mtu,
  );
  try {
    await withSocket(op, netns, async (l) => l.check(await l.call(rt.rtnl_route_add, l.sk, route, NLM_F_REPLACE), E.ENODEV));
  } finally {
    rt.rtnl_route_put(route);
  }
}

/**
 * `ip route del DST table main proto PROTOCOL`: only a route carrying PROTOCOL matches (the kernel
 * compares it). Idempotent: no such route is success.
 */
export async function routeDel(dst: string, protocol: number, netns?: string): Promise<void> {
  const op = `routeDel ${dst} proto ${protocol}`;
  checkProto(op, protocol);
  const route = buildRoute(op, dst, protocol);
  try {
    await withSocket(op, netns, async (l) => {
      const rc = await l.call(rt.rtnl_route_delete, l.sk, route, 0);
      if (rc < 0 && Math.abs(rc) === NLE.OBJ_NOTFOUND) return; // ESRCH: no such route
      l.check(rc, E.ENOENT);
    });
  } finally {
    rt.rtnl_route_put(route);
  }
}
