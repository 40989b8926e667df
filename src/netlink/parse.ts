/**
 * The argument checks of the netlink API (pure): interface names, address families, addresses with
 * a prefix, unsigned values. Each throws a ConfigError naming the operation before anything reaches
 * the kernel.
 */
import { AF_INET, AF_INET6, AF_UNSPEC } from './libnl.js';
import { ConfigError } from '../errors.js';
import { isValidIfName } from '../net/ifname.js';
import { parsePrefixed, type PrefixedAddress } from '../net/ip.js';

/** The kernel's dev_valid_name: 1-15 bytes, not "." or "..", no '/', ':' or whitespace. */
export function checkIfname(op: string, name: string): void {
  if (!isValidIfName(name)) throw new ConfigError(`${op}: invalid interface name ${JSON.stringify(name)}`);
}

export function afOf(op: string, family: 4 | 6 | undefined): number {
  if (family === undefined) return AF_UNSPEC;
  if (family === 4) return AF_INET;
  if (family === 6) return AF_INET6;
  throw new ConfigError(`${op}: family must be 4 or 6, got ${JSON.stringify(family)}`);
}

export function parseAddrCidr(op: string, cidr: string): PrefixedAddress {
  const p = parsePrefixed(cidr);
  if (!p) throw new ConfigError(`${op}: invalid address ${JSON.stringify(cidr)} (want "10.1.2.3/24" or "fd00::1/64")`);
  return p;
}

export function checkUint(op: string, what: string, v: number, max: number): void {
  if (!Number.isInteger(v) || v < 0 || v > max) throw new ConfigError(`${op}: invalid ${what} ${JSON.stringify(v)}`);
}
