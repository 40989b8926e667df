/**
 * host-local's allocator in the agent (plugins/ipam/host-local main.go cmdAdd/cmdDel and
 * backend/allocator/allocator.go, reference plugins v1.10.0) over host-local's own disk store
 * (store.ts), so that the real `host-local` and the agent can each release, check and collect what
 * the other reserved. Parse (pure: `parseHostLocal`) → allocate or release under host-local's lock
 * → a typed result: the CNI result host-local prints, the addresses released.
 *
 * What it keeps of host-local: one address per range set, in set order, each set tracking its own
 * `last_reserved_ip.<index>`; round-robin from the address after the last reserved one (ranges.ts
 * `candidates`), gateways skipped, IPv4 broadcast never in a default range; an attachment that
 * already holds an address of a set is refused; a failed ADD releases what it reserved in earlier
 * sets; a release removes every file naming the container ID and interface, or (only when there is
 * none) every file naming the ID alone (host-local < 0.8.6). Its errors carry host-local's words.
 * One difference: an ADD holds the lock across all its range sets, where host-local takes it per
 * set. Cost: host-local reads every reservation file of the network on each ADD (its duplicate
 * check) and DEL; the store reads them once and keeps them while nobody else changes the directory
 * (store.ts), so an ADD or DEL no longer grows with the node's reservations unless host-local, or
 * anyone else, changed the directory since (measured: docs/pod.md, "host-local's allocator in the
 * agent").
 */
import { ConflictError, ConfigError, KubenetError } from '../../../errors.js';
import type { CniResult, Route } from '../../../cni/types.js';
import { candidates, formatAddr, parseAddr, parseRangeSets, rangeIndexFor, rangeSetString, type RangeSet } from './ranges.js';
import { DiskStore, LINE_BREAK, type LockedStore } from './store.js';

/** host-local's default data directory. */
export const DEFAULT_DATA_DIR = '/var/lib/cni/networks';

/** A range set has no free address: host-local's "no IP addresses available in range set: …". */
export class AddressesExhaustedError extends KubenetError {
  constructor(
    readonly rangeIndex: number,
    readonly rangeSet: string,
  ) {
    super(`failed to allocate for range ${rangeIndex}: no IP addresses available in range set: ${rangeSet}`);
  }
}

/** The attachment already holds an address of the set (host-local refuses a second allocation). */
export class DuplicateAllocationError extends ConflictError {
  constructor(
    readonly rangeIndex: number,
    readonly address: string,
    readonly containerId: string,
  ) {
    super(
      `failed to allocate for range ${rangeIndex}: ${address} has been allocated to ${containerId}, duplicate allocation is not allowed`,
    );
  }
}

/** A host-local network, parsed: what an allocation needs. */
export interface HostLocalNetwork {
  /** The network name: reservations live under `<dataDir>/<name>`. */
  name: string;
  cniVersion: string;
  dataDir: string;
  rangeSets: RangeSet[];
  routes: Route[];
}

/**
 * Parses a network config whose `ipam` is host-local's (its `type` is not looked at, as host-local
 * does not): pure; ConfigError with host-local's message for an invalid range.
 */
export function parseHostLocal(network: { name?: unknown; cniVersion?: unknown; ipam?: unknown }): HostLocalNetwork {
  const ipam = network.ipam as Record<string, unknown> | undefined;
  if (!ipam || typeof ipam !== 'object') throw new ConfigError("IPAM config missing 'ipam' key");
  if (typeof network.name !== 'string' || network.name === '') throw new ConfigError('host-local: the network has no name');
  if (ipam.resolvConf !== undefined && ipam.resolvConf !== '')
    throw new ConfigError('host-local in the agent: ipam.resolvConf is not supported');
  const routes = ipam.routes ?? [];
  if (!Array.isArray(routes)) throw new ConfigError('host-local: ipam.routes must be a list');
  return {
    name: network.name,
    cniVersion: typeof network.cniVersion === 'string' ? network.cniVersion : '',
    dataDir: typeof ipam.dataDir === 'string' && ipam.dataDir !== '' ? ipam.dataDir : DEFAULT_DATA_DIR,
    rangeSets: parseRangeSets(ipam),
    routes: routes as Route[],
  };
}

/** One address reserved by `allocate`: the set it came from, the address, its prefix length, its gateway. */
export interface Allocated {
  rangeIndex: number;
  address: string;
  prefixLen: number;
  gateway: string;
}

/** The files naming the attachment (GetByID: new format, or the ID alone). */
function heldBy(store: LockedStore, containerId: string, ifName: string): string[] {
  const id = containerId.trim();
  const match = id + LINE_BREAK + ifName;
  return store.reservations().flatMap((r) => (r.key === match || r.key === id ? [r.name] : []));
}

/**
 * host-local's ADD over a locked store (pure apart from the store): one address per range set.
 * Throws DuplicateAllocationError or AddressesExhaustedError after releasing what it reserved.
 */
export function allocate(store: LockedStore, sets: RangeSet[], containerId: string, ifName: string): Allocated[] {
  const out: Allocated[] = [];
  // One scan for all sets (host-local scans per set): under the one lock, what this ADD reserves in
  // a set is in no other set's ranges, so the later sets would find nothing more.
  const held = heldBy(store, containerId, ifName);
  try {
    for (const [idx, set] of sets.entries()) {
      for (const name of held) {
        const a = parseAddr(name);
        if (a && rangeIndexFor(set, a) >= 0) throw new DuplicateAllocationError(idx, formatAddr(a.family, a.value), containerId);
      }
      const last = parseAddr(store.lastReserved(idx));
      let got: Allocated | undefined;
      for (const c of candidates(set, last)) {
        const address = formatAddr(c.range.family, c.value);
        if (store.reserve(containerId, ifName, address, idx)) {
          got = { rangeIndex: idx, address, prefixLen: c.range.prefixLen, gateway: formatAddr(c.range.family, c.range.gateway) };
          break;
        }
      }
      if (!got) throw new AddressesExhaustedError(idx, rangeSetString(set));
      out.push(got);
    }
  } catch (err) {
    if (out.length > 0) release(store, containerId, ifName);
    throw err;
  }
  return out;
}

/** host-local's release (ReleaseByID): the addresses whose files were removed. */
export function release(store: LockedStore, containerId: string, ifName: string): string[] {
  const id = containerId.trim();
  const all = store.reservations();
  const removeWhere = (key: string) => all.filter((r) => r.key === key && store.remove(r.name)).map((r) => r.name);
  const removed = removeWhere(id + LINE_BREAK + ifName);
  return removed.length > 0 ? removed : removeWhere(id);
}

/** The CNI result host-local prints for these addresses (in the network's version; no DNS). */
export function hostLocalResult(net: HostLocalNetwork, allocated: Allocated[]): CniResult {
  return {
    cniVersion: net.cniVersion,
    interfaces: [],
    ips: allocated.map((a) => ({ address: `${a.address}/${a.prefixLen}`, gateway: a.gateway })),
    routes: net.routes.map((r) => ({ ...r })),
    dns: {},
  };
}

/** host-local in the agent: ADD and DEL on the network's store, under host-local's lock. */
export class HostLocalAllocator {
  private readonly stores = new Map<string, DiskStore>();

  private store(net: HostLocalNetwork): DiskStore {
    const key = `${net.dataDir}\0${net.name}`;
    let s = this.stores.get(key);
    if (!s) this.stores.set(key, (s = new DiskStore(net.dataDir, net.name)));
    return s;
  }

  /** host-local's ADD: one address per range set, as its CNI result. */
  async add(net: HostLocalNetwork, containerId: string, ifName: string): Promise<CniResult> {
    const allocated = await this.store(net).locked((s) => allocate(s, net.rangeSets, containerId, ifName));
    return hostLocalResult(net, allocated);
  }

  /** host-local's DEL: the addresses released (none held is success). */
  del(net: HostLocalNetwork, containerId: string, ifName: string): Promise<string[]> {
    return this.store(net).locked((s) => release(s, containerId, ifName));
  }
}
