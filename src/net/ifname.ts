/**
 * Linux interface names, by the kernel's own rule (net/core/dev.c dev_valid_name): 1 to 15 bytes
 * (IFNAMSIZ − 1, counted in bytes, not characters), not "." or "..", and no '/', ':', NUL or
 * whitespace. The one definition every layer uses (CNI requests, config, netlink, tc).
 */
import { ConfigError } from '../errors.js';

export const MAX_IFNAME_BYTES = 15;

export function isValidIfName(name: unknown): name is string {
  return (
    typeof name === 'string' &&
    name.length > 0 &&
    Buffer.byteLength(name) <= MAX_IFNAME_BYTES &&
    name !== '.' &&
    name !== '..' &&
    !/[/:\0\s]/.test(name)
  );
}

/** Throws a ConfigError naming `what` and the value unless it is a valid interface name. */
export function checkIfName(name: unknown, what: string): string {
  if (!isValidIfName(name)) {
    throw new ConfigError(
      `${what} ${JSON.stringify(name)} is not a valid interface name (1-15 bytes, no "/", ":" or whitespace, not "." or "..")`,
    );
  }
  return name;
}
