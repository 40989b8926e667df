/**
 * IP addresses and CIDRs, the one place kubenet-ts parses them: plain addresses (a pod's IPs),
 * addresses with a prefix length as interfaces carry them ("10.1.2.3/24", host bits kept), and
 * subnets (pod CIDRs, the non-masquerade CIDR: host bits cleared, canonical text).
 *
 * Built on `ip-address` (the library beneath `ip-cidr`): its parser and subnet arithmetic, with
 * node:net's `isIP` as the validity check. `ip-cidr` itself was measured and left out: it adds only
 * range iteration, prints IPv6 uncompressed, refuses embedded IPv4 (::ffff:1.2.3.4), and pulls
 * an older ip-address with two more dependencies (docs/net.md).
 */
import { Address4, Address6 } from 'ip-address';
import { isIP } from 'node:net';
import { ConfigError } from '../errors.js';

export type Family = 4 | 6;

/** A subnet, normalized to its network address ("10.244.1.0/24"). */
export interface Subnet {
  family: Family;
  /** Network address, host bits cleared, canonical text (IPv6 compressed). */
  network: string;
  prefixLen: number;
  /** `network/prefixLen`. */
  cidr: string;
}

/** An address with the prefix length of its subnet, host bits kept ("10.1.2.3/24"). */
export interface PrefixedAddress {
  family: Family;
  ip: string;
  prefixLen: number;
}

/** 4 or 6 for an address given without prefix, 0 for anything else. */
export function familyOf(ip: unknown): 0 | Family {
  return typeof ip === 'string' ? (isIP(ip) as 0 | Family) : 0;
}

export function isIpAddress(ip: unknown): ip is string {
  return familyOf(ip) !== 0;
}

/** The family of an address given without prefix; ConfigError naming `what` otherwise. */
export function ipFamily(ip: string, what = 'IP address'): Family {
  const f = familyOf(ip);
  if (f === 0) throw new ConfigError(`${what} ${JSON.stringify(ip)} is not an IPv4 or IPv6 address without prefix`);
  return f;
}

/** The canonical text of an address given without prefix (IPv6 compressed, lower case); ConfigError otherwise. */
export function canonicalIp(ip: string, what = 'IP address'): string {
  const f = ipFamily(ip, what);
  return f === 4 ? new Address4(ip).correctForm() : new Address6(ip).correctForm();
}

/** "ADDRESS/PREFIX" with host bits kept, or undefined when it is not one. */
export function parsePrefixed(text: unknown): PrefixedAddress | undefined {
  if (typeof text !== 'string') return undefined;
  const m = /^([^/\s]+)\/(\d{1,3})$/.exec(text);
  const ip = m?.[1] ?? '';
  const family = familyOf(ip);
  const prefixLen = Number(m?.[2]);
  if (!m || family === 0 || prefixLen > (family === 4 ? 32 : 128)) return undefined;
  return { family, ip, prefixLen };
}

function address(ip: string, family: Family, prefixLen: number): Address4 | Address6 {
  return family === 4 ? new Address4(`${ip}/${prefixLen}`) : new Address6(`${ip}/${prefixLen}`);
}

/** Parses one CIDR ("10.244.1.0/24", "fd00:10:244:1::/64"), clearing host bits. */
export function parseCidr(text: string): Subnet {
  const p = parsePrefixed(typeof text === 'string' ? text.trim() : text);
  if (!p) throw new ConfigError(`malformed CIDR ${JSON.stringify(text)}: want ADDRESS/PREFIX with a valid address and prefix length`);
  const network = address(p.ip, p.family, p.prefixLen).startAddress().correctForm();
  return { family: p.family, network, prefixLen: p.prefixLen, cidr: `${network}/${p.prefixLen}` };
}

/**
 * Parses a pod-CIDR value: one CIDR or a dual-stack pair "v4,v6" (at most one per family).
 * Pod subnets must leave room for a gateway and pods: IPv4 at most /30, IPv6 at most /126.
 */
export function parsePodCidrs(value: unknown): Subnet[] {
  if (typeof value !== 'string' || value.trim() === '') {
    throw new ConfigError(
      `pod CIDR must be a non-empty string such as "10.244.1.0/24" or "10.244.1.0/24,fd00:10:244:1::/64", got ${JSON.stringify(value)}`,
    );
  }
  const subnets = value.split(',').map((part) => parseCidr(part.trim()));
  if (subnets.length > 2) throw new ConfigError(`pod CIDR ${JSON.stringify(value)}: at most one IPv4 and one IPv6 CIDR`);
  const families = new Set(subnets.map((s) => s.family));
  if (families.size !== subnets.length) throw new ConfigError(`pod CIDR ${JSON.stringify(value)}: two CIDRs of the same family`);
  for (const s of subnets) {
    const max = s.family === 4 ? 30 : 126;
    if (s.prefixLen > max) throw new ConfigError(`pod CIDR ${s.cidr} is too small for pods: use a prefix of at most /${max}`);
  }
  return subnets;
}

/** True when `ip` (without prefix) lies inside `subnet`. */
export function cidrContains(subnet: Subnet, ip: string): boolean {
  const fam = familyOf(ip);
  if (fam !== subnet.family) return false;
  const net = address(subnet.network, subnet.family, subnet.prefixLen);
  return (fam === 4 ? new Address4(ip) : new Address6(ip)).isInSubnet(net);
}

/** The last byte of an address: the u32 hash bucket the shaper files it under. */
export function lastByte(ip: string): number {
  const fam = ipFamily(ip);
  const bytes = fam === 4 ? new Address4(ip).toArray() : new Address6(ip).toByteArray();
  return bytes[bytes.length - 1] ?? 0;
}

/** The subnet's first host address (network + 1): host-local's default gateway, which the bridge takes. */
export function firstHost(subnet: Subnet): string {
  if (subnet.family === 4) return Address4.fromBigInt(new Address4(subnet.network).bigInt() + 1n).correctForm();
  return Address6.fromBigInt(new Address6(subnet.network).bigInt() + 1n).correctForm();
}
