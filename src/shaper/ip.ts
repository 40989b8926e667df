/** Small address helpers for the shaper's u32 classifier. */
import { isIP } from 'node:net';
import { ConfigError } from '../errors.js';

export type Family = 4 | 6;

/** The family of a pod IP given without prefix; ConfigError otherwise. */
export function ipFamily(ip: string): Family {
  const f = isIP(ip);
  if (f === 4 || f === 6) return f;
  throw new ConfigError(`pod IP ${JSON.stringify(ip)} is not an IPv4 or IPv6 address without prefix`);
}

/** The 16 bytes of an IPv6 address (isIP-validated input). */
export function ipv6Bytes(ip: string): Uint8Array {
  let text = ip;
  const out = new Uint8Array(16);
  // Embedded IPv4 tail (::ffff:1.2.3.4) becomes two hex groups.
  const v4 = /(\d+)\.(\d+)\.(\d+)\.(\d+)$/.exec(text);
  if (v4) {
    const b = v4.slice(1, 5).map(Number) as [number, number, number, number];
    text = text.slice(0, v4.index) + `${((b[0] << 8) | b[1]).toString(16)}:${((b[2] << 8) | b[3]).toString(16)}`;
  }
  const zone = text.indexOf('%');
  if (zone >= 0) text = text.slice(0, zone);
  const [head = '', tail] = text.split('::') as [string, string | undefined];
  const headGroups = head === '' ? [] : head.split(':');
  const tailGroups = tail === undefined || tail === '' ? [] : tail.split(':');
  const zeros = 8 - headGroups.length - tailGroups.length;
  const groups = [...headGroups, ...Array<string>(tail === undefined ? 0 : zeros).fill('0'), ...tailGroups];
  groups.forEach((g, i) => {
    const v = parseInt(g, 16);
    out[i * 2] = (v >> 8) & 0xff;
    out[i * 2 + 1] = v & 0xff;
  });
  return out;
}

/** The last byte of the address: the u32 hash bucket the shaper files it under. */
export function lastByte(ip: string): number {
  if (ipFamily(ip) === 4) return Number(ip.split('.')[3]) & 0xff;
  return ipv6Bytes(ip)[15] ?? 0;
}
