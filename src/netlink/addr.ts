/**
 * Addresses, named after iproute2: `ip addr show` (one link, every link), `ip addr del`, each off
 * the event loop on a socket of its own (./socket.ts withHostSocket); and the listing on a given
 * socket that ./netns.ts uses inside other namespaces.
 */
import { AF_INET, AF_INET6, AF_UNSPEC, nl, route, type Out, type Ptr } from './libnl.js';
import { NetlinkError } from '../errors.js';
import { E, NLE, nlError } from './errno.js';
import { linkIndexOn } from './link.js';
import { afOf, checkIfname, parseAddrCidr } from './parse.js';
import { withHostSocket, withNetnsSocket, type Lease } from './socket.js';

export interface AddrInfo {
  family: 4 | 6;
  ip: string;
  prefixLen: number;
  /** "10.1.2.3/24": the address with its prefix length, host bits kept. */
  cidr: string;
  /** rtm scope: 0 universe/global, 200 site, 253 link, 254 host. */
  scope: number;
}

const addrBuf = Buffer.alloc(128);

function toAddrInfo(addr: Ptr): AddrInfo | undefined {
  const af = route.rtnl_addr_get_family(addr) as number;
  if (af !== AF_INET && af !== AF_INET6) return undefined;
  const local = route.rtnl_addr_get_local(addr) as Ptr; // borrowed
  if (!local) return undefined;
  // nl_addr2str appends "/len" unless the prefix is full; the prefix comes from the rtnl_addr.
  const text = nl.nl_addr2str(local, addrBuf, addrBuf.length) as string;
  const ip = text.split('/')[0] ?? text;
  const prefixLen = route.rtnl_addr_get_prefixlen(addr) as number;
  return { family: af === AF_INET ? 4 : 6, ip, prefixLen, cidr: `${ip}/${prefixLen}`, scope: route.rtnl_addr_get_scope(addr) as number };
}

/** The addresses of the link `ifname` as seen through the leased socket (`ip addr show dev IFNAME [-4|-6]`). Missing link → ENODEV. */
export async function addrListOn(l: Lease, ifname: string, family: 4 | 6 | undefined): Promise<AddrInfo[]> {
  checkIfname(l.op, ifname);
  const af = afOf(l.op, family);
  const ifindex = await linkIndexOn(l, ifname);
  const cache = await l.dump((out) => l.call(route.rtnl_addr_alloc_cache, l.sk, out));
  try {
    const result: AddrInfo[] = [];
    for (let a = nl.addr_cache_first(cache) as Ptr; a; a = nl.addr_cache_next(a) as Ptr) {
      if ((route.rtnl_addr_get_ifindex(a) as number) !== ifindex) continue;
      if (af !== AF_UNSPEC && (route.rtnl_addr_get_family(a) as number) !== af) continue;
      const info = toAddrInfo(a);
      if (info) result.push(info);
    }
    return result;
  } finally {
    nl.nl_cache_free(cache);
  }
}

/** `ip addr show dev NAME [-4|-6]`, in kernel order (IPv4 first). Missing link → ENODEV. */
export async function addrList(name: string, family?: 4 | 6): Promise<AddrInfo[]> {
  const op = `addrList ${name}`;
  checkIfname(op, name);
  afOf(op, family);
  return withHostSocket(op, (l) => addrListOn(l, name, family));
}

/** `ip addr show` of every link: each address with the ifindex of its link (given `netns`, `ip -n NS addr show`). */
export async function addrListAll(netns?: string): Promise<Array<AddrInfo & { ifindex: number }>> {
  const list = async (l: Lease) => {
    const cache = await l.dump((out) => l.call(route.rtnl_addr_alloc_cache, l.sk, out));
    try {
      const result: Array<AddrInfo & { ifindex: number }> = [];
      for (let a = nl.addr_cache_first(cache) as Ptr; a; a = nl.addr_cache_next(a) as Ptr) {
        const info = toAddrInfo(a);
        if (info) result.push({ ...info, ifindex: route.rtnl_addr_get_ifindex(a) as number });
      }
      return result;
    } finally {
      nl.nl_cache_free(cache);
    }
  };
  return netns === undefined ? withHostSocket('addrListAll', list) : withNetnsSocket('addrListAll', netns, list);
}

/**
 * `ip addr del CIDR dev NAME`. Idempotent: an absent address or an absent link is success.
 * The prefix length is part of the match, as in the kernel: "10.1.2.3/16" does not remove 10.1.2.3/24.
 */
export async function addrDel(name: string, cidr: string): Promise<void> {
  const op = `addrDel ${name} ${cidr}`;
  checkIfname(op, name);
  const parsed = parseAddrCidr(op, cidr);
  await withHostSocket(op, async (l) => {
    let ifindex: number;
    try {
      ifindex = await linkIndexOn(l, name);
    } catch (err) {
      if (err instanceof NetlinkError && err.errno === E.ENODEV) return;
      throw err;
    }
    const outAddr: Out = [null];
    const prc = nl.nl_addr_parse(`${parsed.ip}/${parsed.prefixLen}`, parsed.family === 4 ? AF_INET : AF_INET6, outAddr) as number;
    if (prc < 0 || !outAddr[0]) throw nlError(op, prc < 0 ? prc : -NLE.PARSE_ERR);
    const local = outAddr[0];
    try {
      const addr = route.rtnl_addr_alloc() as Ptr;
      if (!addr) throw new NetlinkError(op, E.ENOMEM, 'rtnl_addr_alloc failed');
      try {
        route.rtnl_addr_set_ifindex(addr, ifindex);
        route.rtnl_addr_set_family(addr, parsed.family === 4 ? AF_INET : AF_INET6);
        const src = route.rtnl_addr_set_local(addr, local) as number;
        if (src < 0) throw nlError(op, src);
        route.rtnl_addr_set_prefixlen(addr, parsed.prefixLen);
        const rc = await l.call(route.rtnl_addr_delete, l.sk, addr, 0);
        if (rc >= 0) return;
        const nle = Math.abs(rc);
        // EADDRNOTAVAIL (no such address), ENOENT/ESRCH, ENODEV (link gone meanwhile): already absent.
        if (nle === NLE.NOADDR || nle === NLE.OBJ_NOTFOUND || nle === NLE.NODEV) return;
        l.check(rc, E.ENOENT);
      } finally {
        route.rtnl_addr_put(addr);
      }
    } finally {
      nl.nl_addr_put(local);
    }
  });
}
