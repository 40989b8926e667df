/**
 * host-local's ranges, pure: the `ipam.ranges` of a host-local config parsed and canonicalized as
 * the reference plugin does it (plugins/ipam/host-local/backend/allocator: config.go
 * LoadIPAMConfig, range.go Canonicalize, range_set.go), the text it gives addresses (Go's
 * net.IP.String: dotted IPv4, RFC 5952 IPv6: the reservation files' names), and its round-robin
 * iterator (allocator.go GetIter/Next), transcribed step by step. Addresses are bigints.
 *
 * Not supported (the agent's configs never carry them; host-local does): addresses requested by
 * CNI_ARGS `IP=`, `args.cni.ips` or `runtimeConfig.ips`, and `runtimeConfig.ipRanges`.
 */
import { Address6 } from 'ip-address';
import { isIP } from 'node:net';
import { ConfigError } from '../../../errors.js';

export type Family = 4 | 6;

export interface Addr {
  family: Family;
  value: bigint;
}

/** One canonicalized range: start and end inclusive, the subnet's mask, its gateway. */
export interface Range {
  family: Family;
  /** Network address and prefix length of the subnet. */
  network: bigint;
  prefixLen: number;
  rangeStart: bigint;
  rangeEnd: bigint;
  gateway: bigint;
}

/** One address is allocated from each range set; a set's ranges are of one family and do not overlap. */
export type RangeSet = Range[];

/** A range as the config gives it (host-local's JSON names). */
export interface RangeConf {
  subnet?: unknown;
  rangeStart?: unknown;
  rangeEnd?: unknown;
  gateway?: unknown;
}

const BITS: Record<Family, number> = { 4: 32, 6: 128 };

/** Parses an address without prefix (Go's net.ParseIP: no leading zeros in IPv4); undefined when it is none. */
export function parseAddr(text: unknown): Addr | undefined {
  if (typeof text !== 'string') return undefined;
  const family = isIP(text);
  if (family === 4) {
    let v = 0n;
    for (const part of text.split('.')) {
      if (part.length > 1 && part.startsWith('0')) return undefined;
      v = (v << 8n) | BigInt(Number(part));
    }
    return { family: 4, value: v };
  }
  if (family === 6) {
    if (text.includes('%')) return undefined;
    const value = new Address6(text).bigInt();
    // An IPv4-mapped address is IPv4 to Go (net.IP.To4): canonicalizeIP makes it 4 bytes.
    if (value >> 32n === 0xffffn) return { family: 4, value: value & 0xffffffffn };
    return { family: 6, value };
  }
  return undefined;
}

/** An address as Go's net.IP.String() writes it: the name of its reservation file. */
export function formatAddr(family: Family, value: bigint): string {
  if (family === 4) return [24n, 16n, 8n, 0n].map((s) => String((value >> s) & 0xffn)).join('.');
  const groups: number[] = [];
  for (let i = 7; i >= 0; i--) groups.push(Number((value >> BigInt(i * 16)) & 0xffffn));
  // RFC 5952: the longest run of two or more zero groups becomes "::" (the first such run on a tie).
  let bestStart = -1;
  let bestLen = 1;
  for (let i = 0; i < 8; ) {
    if (groups[i] !== 0) {
      i++;
      continue;
    }
    let j = i;
    while (j < 8 && groups[j] === 0) j++;
    if (j - i > bestLen) {
      bestStart = i;
      bestLen = j - i;
    }
    i = j;
  }
  const hex = (gs: number[]) => gs.map((g) => g.toString(16)).join(':');
  if (bestStart < 0) return hex(groups);
  return `${hex(groups.slice(0, bestStart))}::${hex(groups.slice(bestStart + bestLen))}`;
}

function mask(family: Family, prefixLen: number): bigint {
  const bits = BigInt(BITS[family]);
  return ((1n << bits) - 1n) ^ ((1n << (bits - BigInt(prefixLen))) - 1n);
}

export function rangeContains(r: Range, a: Addr): boolean {
  return a.family === r.family && (a.value & mask(r.family, r.prefixLen)) === r.network && a.value >= r.rangeStart && a.value <= r.rangeEnd;
}

/** The index of the range of the set holding `a`, or -1 (RangeSet.RangeFor). */
export function rangeIndexFor(set: RangeSet, a: Addr): number {
  return set.findIndex((r) => rangeContains(r, a));
}

/** "start-end" (range.go String). */
export function rangeString(r: Range): string {
  return `${formatAddr(r.family, r.rangeStart)}-${formatAddr(r.family, r.rangeEnd)}`;
}

/** "start-end,start-end" (range_set.go String): how host-local's errors name a set. */
export function rangeSetString(set: RangeSet): string {
  return set.map(rangeString).join(',');
}

function cidrString(family: Family, network: bigint, prefixLen: number): string {
  return `${formatAddr(family, network)}/${prefixLen}`;
}

/** One range canonicalized (range.go Canonicalize), with host-local's messages. */
export function canonicalizeRange(conf: RangeConf): Range {
  const m = typeof conf.subnet === 'string' ? /^([^/]+)\/(\d{1,3})$/.exec(conf.subnet) : null;
  const ip = parseAddr(m?.[1]);
  const prefixLen = Number(m?.[2]);
  if (!m || !ip || prefixLen > (ip.family === 4 && !(m[1] ?? '').includes(':') ? 32 : 128)) {
    throw new ConfigError(`invalid CIDR address: ${String(conf.subnet)}`);
  }
  // "::ffff:10.0.0.0/120": a 4-byte address under a 16-byte mask to Go.
  if (ip.family === 4 && (m[1] ?? '').includes(':')) throw new ConfigError('IPNet IP and Mask version mismatch');
  const family = ip.family;
  const bits = BITS[family];
  const ones = prefixLen;
  if (ones > bits - 2) throw new ConfigError(`Network ${cidrString(family, ip.value, ones)} too small to allocate from`);
  const network = ip.value & mask(family, ones);
  if (network !== ip.value) {
    throw new ConfigError(
      `Network has host bits set. For a subnet mask of length ${ones} the network address is ${formatAddr(family, network)}`,
    );
  }
  const r: Range = { family, network, prefixLen: ones, rangeStart: network + 1n, rangeEnd: 0n, gateway: network + 1n };
  const inSubnet = (a: Addr) => a.family === family && (a.value & mask(family, ones)) === network;
  const subnetText = cidrString(family, network, ones);
  if (conf.gateway !== undefined && conf.gateway !== null && conf.gateway !== '') {
    const gw = parseAddr(conf.gateway);
    if (!gw) throw new ConfigError(`invalid IP address: ${String(conf.gateway)}`);
    if (!inSubnet(gw)) throw new ConfigError(`gateway ${formatAddr(gw.family, gw.value)} not in network ${subnetText}`);
    r.gateway = gw.value;
  }
  const broadcast = network | (((1n << BigInt(bits)) - 1n) ^ mask(family, ones));
  // Default end: the last address, less the broadcast address in IPv4 (lastIP).
  const defaultEnd = family === 4 ? broadcast - 1n : broadcast;
  const bound = (what: 'RangeStart' | 'RangeEnd', v: unknown, dflt: bigint): bigint => {
    if (v === undefined || v === null || v === '') return dflt;
    const a = parseAddr(v);
    if (!a) throw new ConfigError(`invalid IP address: ${String(v)}`);
    const partial: Range = { ...r, rangeStart: 0n, rangeEnd: (1n << 128n) - 1n };
    if (!rangeContains(partial, a) || (what === 'RangeEnd' && a.value < r.rangeStart)) {
      throw new ConfigError(`${what} ${formatAddr(a.family, a.value)} not in network ${subnetText}`);
    }
    return a.value;
  };
  r.rangeStart = bound('RangeStart', conf.rangeStart, network + 1n);
  r.rangeEnd = bound('RangeEnd', conf.rangeEnd, defaultEnd);
  if (r.rangeStart > r.rangeEnd) {
    throw new ConfigError(
      `RangeStart ${formatAddr(family, r.rangeStart)} is after RangeEnd ${formatAddr(family, r.rangeEnd)} in network ${subnetText}`,
    );
  }
  return r;
}

function overlaps(a: Range, b: Range): boolean {
  if (a.family !== b.family) return false;
  const at = (r: Range, v: bigint) => rangeContains(r, { family: r.family, value: v });
  return at(a, b.rangeStart) || at(a, b.rangeEnd) || at(b, a.rangeStart) || at(b, a.rangeEnd);
}

/**
 * The range sets of a host-local `ipam` section (an old-style top-level `subnet` first), each
 * canonicalized; ConfigError with host-local's message when one is invalid.
 */
export function parseRangeSets(ipam: { ranges?: unknown; subnet?: unknown } & RangeConf): RangeSet[] {
  const raw: unknown[] = [];
  if (typeof ipam.subnet === 'string' && ipam.subnet !== '')
    raw.push([{ subnet: ipam.subnet, rangeStart: ipam.rangeStart, rangeEnd: ipam.rangeEnd, gateway: ipam.gateway }]);
  if (ipam.ranges !== undefined && !Array.isArray(ipam.ranges))
    throw new ConfigError('host-local: ipam.ranges must be a list of range sets');
  raw.push(...((ipam.ranges as unknown[] | undefined) ?? []));
  if (raw.length === 0) throw new ConfigError('no IP ranges specified');
  const sets = raw.map((set, i) => {
    if (!Array.isArray(set)) throw new ConfigError(`invalid range set ${i}: a range set is a list of ranges`);
    if (set.length === 0) throw new ConfigError(`invalid range set ${i}: empty range set`);
    try {
      const rs = set.map((c) => canonicalizeRange((c ?? {}) as RangeConf));
      if (rs.some((r) => r.family !== rs[0]?.family)) throw new ConfigError('mixed address families');
      for (let a = 0; a < rs.length; a++) {
        for (let b = a + 1; b < rs.length; b++) {
          const [ra, rb] = [rs[a] as Range, rs[b] as Range];
          if (overlaps(ra, rb)) throw new ConfigError(`subnets ${rangeString(ra)} and ${rangeString(rb)} overlap`);
        }
      }
      return rs;
    } catch (err) {
      if (!(err instanceof ConfigError)) throw err;
      throw new ConfigError(`invalid range set ${i}: ${err.message}`, { cause: err });
    }
  });
  for (let a = 0; a < sets.length; a++) {
    for (let b = a + 1; b < sets.length; b++) {
      if ((sets[a] as RangeSet).some((ra) => (sets[b] as RangeSet).some((rb) => overlaps(ra, rb))))
        throw new ConfigError(`range set ${a} overlaps with ${b}`);
    }
  }
  return sets;
}

/** A candidate of the iterator: the address and its range (for the mask and the gateway). */
export interface Candidate {
  value: bigint;
  range: Range;
}

/**
 * host-local's round-robin (allocator.go GetIter + RangeIter.Next): from the address after the
 * last reserved one when the set holds it (the last reserved one is then tried last), else from
 * the first range's start; across the set's ranges in order, wrapping; gateways skipped; each
 * address once.
 */
export function* candidates(set: RangeSet, lastReserved: Addr | undefined): Generator<Candidate> {
  let idx = 0;
  let cur: bigint | undefined;
  let startIP: bigint | undefined;
  const lastIdx = lastReserved ? rangeIndexFor(set, lastReserved) : -1;
  if (lastReserved && lastIdx >= 0) {
    idx = lastIdx;
    cur = lastReserved.value;
  } else {
    startIP = set[0]?.rangeStart;
  }
  for (;;) {
    let r = set[idx] as Range;
    if (cur === undefined) {
      cur = r.rangeStart;
      startIP = cur;
      if (cur === r.gateway) continue;
      yield { value: cur, range: r };
      continue;
    }
    if (cur === r.rangeEnd) {
      idx = (idx + 1) % set.length;
      r = set[idx] as Range;
      cur = r.rangeStart;
    } else {
      cur++;
    }
    if (startIP === undefined) startIP = cur;
    else if (cur === startIP) return;
    if (cur === r.gateway) continue;
    yield { value: cur, range: r };
  }
}
