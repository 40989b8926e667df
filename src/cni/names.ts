/**
 * The CNI identifiers that end up in file names, chain names and plugin arguments, each checked by
 * the strictest rule a runtime applies, so that anything accepted here is accepted everywhere.
 */
import { ConfigError } from '../errors.js';
import { checkIfName } from '../net/ifname.js';

/**
 * Container IDs: containerd's identifier rule (alphanumeric runs joined by single '.', '_' or '-',
 * at most 76 characters: pkg/identifiers), which also satisfies libcni's ValidateContainerID
 * (`^[a-zA-Z0-9][a-zA-Z0-9_.-]*$`). Runtimes use 64 hex digits.
 */
export const MAX_CONTAINER_ID = 76;
const CONTAINER_ID_RE = /^[A-Za-z0-9]+(?:[._-][A-Za-z0-9]+)*$/;

export function isValidContainerId(id: unknown): id is string {
  return typeof id === 'string' && id.length <= MAX_CONTAINER_ID && CONTAINER_ID_RE.test(id);
}

/** Throws a ConfigError naming `what` and the value unless it is a valid container ID. */
export function checkContainerId(id: unknown, what = 'container ID'): string {
  if (typeof id === 'string' && id.length > MAX_CONTAINER_ID) {
    throw new ConfigError(`${what} is ${id.length} characters long: at most ${MAX_CONTAINER_ID} (${JSON.stringify(id.slice(0, 24))}…)`);
  }
  if (!isValidContainerId(id)) {
    throw new ConfigError(
      `${what} ${JSON.stringify(id)} is not a valid container ID (letters and digits, joined by single ".", "_" or "-")`,
    );
  }
  return id;
}

/** Kubernetes names carried in CNI_ARGS: namespaces are DNS labels, pod names DNS subdomains. */
const DNS_LABEL_RE = /^[a-z0-9]([-a-z0-9]*[a-z0-9])?$/;

export function isDnsLabel(s: string): boolean {
  return s.length <= 63 && DNS_LABEL_RE.test(s);
}

export function isDnsSubdomain(s: string): boolean {
  return s.length <= 253 && s.split('.').every((part) => isDnsLabel(part));
}

/** libcni's rule for network names and container IDs (they become part of a cache file name). */
const LIBCNI_NAME_RE = /^[a-zA-Z0-9][a-zA-Z0-9_.-]*$/;

/** libcni's ValidateContainerID (the CNI runtime side; requests to the agent use checkContainerId). */
export function validateContainerId(id: string): void {
  if (typeof id !== 'string' || !LIBCNI_NAME_RE.test(id))
    throw new ConfigError(`invalid container ID ${JSON.stringify(id)}: must match ${LIBCNI_NAME_RE.source}`);
}

/** libcni's ValidateNetworkName. */
export function validateNetworkName(name: string): void {
  if (typeof name !== 'string' || !LIBCNI_NAME_RE.test(name))
    throw new ConfigError(`invalid network name ${JSON.stringify(name)}: must match ${LIBCNI_NAME_RE.source}`);
}

/** libcni's ValidateInterfaceName: the kernel's rule (src/net/ifname.ts). */
export function validateInterfaceName(name: string): void {
  checkIfName(name, 'interface name');
}
