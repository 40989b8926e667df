import { isIPv4, isIPv6 } from 'node:net';
import { ConfigError } from '../errors.js';

/** One pod subnet, normalized to its network address ("10.244.1.0/24"). */
export interface PodSubnet {
  family: 4 | 6;
  /** Network address, host bits cleared. */
  network: string;
  prefixLen: number;
  /** `network/prefixLen`. */
  cidr: string;
}

/** Parses an IPv4 or IPv6 address into a bigint (IPv4 in 32 bits, IPv6 in 128 bits). */
export function ipToBigInt(ip: string): bigint {
  if (isIPv4(ip)) {
    return ip.split('.').reduce((acc, part) => (acc << 8n) | BigInt(Number(part)), 0n);
  }
  if (!isIPv6(ip)) throw new ConfigError(`not an IP address: ${JSON.stringify(ip)}`);
  let text = ip;
  // An embedded IPv4 tail ("::ffff:1.2.3.4") becomes two hextets.
  const v4tail = /(\d+\.\d+\.\d+\.\d+)$/.exec(text);
  if (v4tail?.[1]) {
    const n = ipToBigInt(v4tail[1]);
    text = text.slice(0, -v4tail[1].length) + `${(n >> 16n).toString(16)}:${(n & 0xffffn).toString(16)}`;
  }
  const [head = '', tail] = text.split('::');
  const headParts = head === '' ? [] : head.split(':');
  const tailParts = tail === undefined || tail === '' ? [] : tail.split(':');
  const fill = tail === undefined ? 0 : 8 - headParts.length - tailParts.length;
  const parts = [...headParts, ...Array<string>(fill).fill('0'), ...tailParts];
  return parts.reduce((acc, h) => (acc << 16n) | BigInt(parseInt(h, 16)), 0n);
}

/** Formats a bigint as an address of the given family (IPv6 in RFC 5952 compressed form). */
export function bigIntToIp(n: bigint, family: 4 | 6): string {
  if (family === 4) {
    return [24n, 16n, 8n, 0n].map((s) => String((n >> s) & 0xffn)).join('.');
  }
  const hextets: number[] = [];
  for (let s = 112n; s >= 0n; s -= 16n) hextets.push(Number((n >> s) & 0xffffn));
  // Longest run of zeros (length >= 2) becomes "::".
  let bestStart = -1;
  let bestLen = 0;
  for (let i = 0; i < 8; ) {
    if (hextets[i] !== 0) {
      i++;
      continue;
    }
    let j = i;
    while (j < 8 && hextets[j] === 0) j++;
    if (j - i > bestLen && j - i >= 2) {
      bestStart = i;
      bestLen = j - i;
    }
    i = j;
  }
  const hex = hextets.map((h) => h.toString(16));
  if (bestStart < 0) return hex.join(':');
  return `${hex.slice(0, bestStart).join(':')}::${hex.slice(bestStart + bestLen).join(':')}`;
}

/** Parses one CIDR ("10.244.1.0/24", "fd00:10:244:1::/64"), clearing host bits. */
export function parseCidr(text: string): PodSubnet {
  const m = /^([^/\s]+)\/(\d{1,3})$/.exec(text.trim());
  const addr = m?.[1];
  const bits = m?.[2];
  if (!addr || bits === undefined) throw new ConfigError(`malformed CIDR ${JSON.stringify(text)}: want ADDRESS/PREFIX`);
  const family: 4 | 6 | undefined = isIPv4(addr) ? 4 : isIPv6(addr) ? 6 : undefined;
  if (!family) throw new ConfigError(`malformed CIDR ${JSON.stringify(text)}: ${JSON.stringify(addr)} is not an IP address`);
  const width = family === 4 ? 32 : 128;
  const prefixLen = Number(bits);
  if (prefixLen > width) throw new ConfigError(`malformed CIDR ${JSON.stringify(text)}: prefix /${prefixLen} is longer than ${width} bits`);
  const hostBits = BigInt(width - prefixLen);
  const network = bigIntToIp((ipToBigInt(addr) >> hostBits) << hostBits, family);
  return { family, network, prefixLen, cidr: `${network}/${prefixLen}` };
}

/**
 * Parses a pod-cidr event value: one CIDR or a dual-stack pair "v4,v6" (at most one per family).
 * Pod subnets must leave room for a gateway and pods: IPv4 at most /30, IPv6 at most /126.
 */
export function parsePodCidrs(value: unknown): PodSubnet[] {
  if (typeof value !== 'string' || value.trim() === '') {
    throw new ConfigError(`pod CIDR must be a non-empty string such as "10.244.1.0/24" or "10.244.1.0/24,fd00:10:244:1::/64", got ${JSON.stringify(value)}`);
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

/** True when `ip` lies inside `subnet`. */
export function cidrContains(subnet: PodSubnet, ip: string): boolean {
  const fam = isIPv4(ip) ? 4 : isIPv6(ip) ? 6 : undefined;
  if (fam !== subnet.family) return false;
  const hostBits = BigInt((fam === 4 ? 32 : 128) - subnet.prefixLen);
  return ipToBigInt(ip) >> hostBits === ipToBigInt(subnet.network) >> hostBits;
}
