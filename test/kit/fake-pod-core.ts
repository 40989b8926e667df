/**
 * The pod lifecycle's world, faked at its seams (src/pod/lifecycle/deps.ts): the kernel (`PodKernel`), the
 * address modes (`AddressMode`), the shaper (`PodShaper`) and the loopback plugin, each checked
 * against its interface at compile time (`satisfies`). Every call is written to one ordered journal
 * (`calls`), and any call named in `failAt` throws, so a test can say "the ADD fails at this step"
 * and read what the core did about it. The pod store is the real one, in a temporary directory.
 * No root, no kernel object, no process.
 */
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { pino } from 'pino';
import type { CniResult, NetConf, NetConfList, RuntimeConf } from '../../src/cni/types.js';
import type { Logger } from '../../src/log.js';
import type { Subnet } from '../../src/net/ip.js';
import type { AddressMode } from '../../src/pod/addresses/mode.js';
import { AddressModes } from '../../src/pod/addresses/modes.js';
import type { BridgeSettings } from '../../src/pod/bridge-conf.js';
import type { Core, PodShaper } from '../../src/pod/lifecycle/deps.js';
import { PendingAdds } from '../../src/pod/lifecycle/pending-adds.js';
import type { LinkRef, PodKernel } from '../../src/pod/node/pod-kernel.js';
import { PodStore, recordKey, type PodRecord } from '../../src/pod/records/record.js';
import type { AttachRequest } from '../../src/pod/requests.js';
import type { ShapingState } from '../../src/shaper/tc.js';
import { KeyedMutex } from '../../src/util/keyed-mutex.js';

export const BRIDGE = 'cbr0';
export const BRIDGE_INDEX = 10;
export const POD_CIDR: Subnet[] = [];

/** The host-local network the fake node runs (as the agent's conf, reduced to what the core reads). */
export const HOST_LOCAL_NET: NetConf = {
  cniVersion: '1.0.0',
  name: 'kubenet',
  type: 'bridge',
  bridge: BRIDGE,
  ipam: { type: 'host-local', ranges: [[{ subnet: '10.0.0.0/24' }]] },
} as NetConf;
/** A dhcp network (what `AddressModes.of` tells apart by its IPAM). */
export const DHCP_NET: NetConf = {
  cniVersion: '1.0.0',
  name: 'kubenet',
  type: 'bridge',
  bridge: BRIDGE,
  ipam: { type: 'dhcp', daemonSocketPath: '/run/kubenet/dhcp.sock' },
} as NetConf;

/** An injected failure: the call `failAt` names throws this. */
export class InjectedError extends Error {
  constructor(readonly step: string) {
    super(`injected failure at ${step}`);
  }
}

export interface Journal {
  calls: string[];
  /** Calls that throw InjectedError (each every time it is made, until removed). */
  failAt: Set<string>;
}

function call(j: Journal, name: string, detail = ''): void {
  j.calls.push(detail ? `${name} ${detail}` : name);
  if (j.failAt.has(name)) throw new InjectedError(name);
}

/** The kernel: a bridge, the pods' interfaces by netns, host veths by name. */
export function fakeKernel(j: Journal) {
  let nextIndex = 100;
  const state = {
    /** Interfaces inside pod netns: `netns/ifName` → index (the pod's end of its veth). */
    inPod: new Map<string, number>(),
    /** Host veths on the bridge: name → index, and which pod end each pairs with. */
    veths: new Map<string, { index: number; peer: string }>(),
    /** Netns paths that are gone. */
    goneNetns: new Set<string>(),
  };
  const kernel = {
    ensureBridge: async (_s: BridgeSettings, _log: Logger): Promise<LinkRef> => {
      call(j, 'kernel.ensureBridge');
      return { name: BRIDGE, index: BRIDGE_INDEX };
    },
    podInterfaceIndex: (netns: string, ifName: string) => state.inPod.get(`${netns}/${ifName}`),
    hostEndOnBridge: async (netns: string, ifName: string, _bridge: number, claimed: ReadonlySet<number>): Promise<LinkRef | undefined> => {
      const v = [...state.veths].find(([, x]) => x.peer === `${netns}/${ifName}` && !claimed.has(x.index));
      return v ? { name: v[0], index: v[1].index } : undefined;
    },
    linkIndexByName: (name: string) => {
      call(j, 'kernel.linkIndexByName', name);
      return state.veths.get(name)?.index;
    },
    deletePodVeth: async (record: PodRecord, _bridge: string, _records: PodRecord[], _log: Logger) => {
      call(j, 'kernel.deletePodVeth', record.containerId);
      for (const [name, v] of state.veths) {
        if (v.peer === `${record.netns}/${record.ifName}`) {
          state.veths.delete(name);
          state.inPod.delete(v.peer);
        }
      }
    },
    podVethPresent: async (record: PodRecord) => record.hostVeth !== undefined && state.veths.has(record.hostVeth),
    podNetnsAlive: (record: PodRecord) => !state.goneNetns.has(record.netns),
    bridgeVeths: async (_bridge: string): Promise<LinkRef[]> => [...state.veths].map(([name, v]) => ({ name, index: v.index })),
    deleteVeth: async (index: number) => {
      call(j, 'kernel.deleteVeth', String(index));
      for (const [name, v] of state.veths) if (v.index === index) state.veths.delete(name);
    },
    hostPortRules: async (_network: string) => new Map<string, string[]>(),
    checkHostPorts: async (_ips: string[], mappings: Array<{ hostPort: number }>) =>
      call(j, 'kernel.checkHostPorts', mappings.map((m) => m.hostPort).join(',')),
  } satisfies PodKernel;
  /** What the bridge plugin does: a veth pair, the pod's end in its netns, the host's on the bridge. */
  const plug = (rt: RuntimeConf): string => {
    const index = nextIndex++;
    const name = `veth${index}`;
    state.veths.set(name, { index, peer: `${rt.netns}/${rt.ifName}` });
    state.inPod.set(`${rt.netns}/${rt.ifName}`, nextIndex++);
    return name;
  };
  return { kernel, state, plug };
}

/**
 * An address mode named `tag` (`hl`, `dhcp`): its ADD plugs a veth (through the fake kernel) and
 * returns an address; with `prefetch`, it allocates beside the exec as the agent's host-local does.
 * `beforeAdd` runs at the plugin's start (a test reads the store there).
 */
export function fakeMode(
  j: Journal,
  tag: string,
  plug: (rt: RuntimeConf) => string,
  o: { prefetch?: boolean; beforeAdd?: (rt: RuntimeConf) => void; askIpam?: (rt: RuntimeConf) => void } = {},
) {
  let last = 4;
  const result = (rt: RuntimeConf, hostVeth: string, ip: string): CniResult => ({
    cniVersion: '1.0.0',
    interfaces: [{ name: BRIDGE }, { name: hostVeth }, { name: rt.ifName, sandbox: rt.netns }],
    ips: [{ address: `${ip}/24`, gateway: '10.0.0.1', interface: 2 }],
    routes: [],
    dns: {},
  });
  const allocations = new Map<string, string>();
  const mode = {
    name: tag === 'dhcp' ? 'dhcp' : 'host-local',
    podCidrAddresses: tag !== 'dhcp',
    uplink: undefined,
    setUpNode: async () => undefined,
    conf: () => (tag === 'dhcp' ? DHCP_NET : HOST_LOCAL_NET),
    precheck: async (_conf: NetConf, pod: string) => call(j, `${tag}.precheck`, pod),
    startAllocation: (_network: NetConf | NetConfList, rt: RuntimeConf): Promise<CniResult> | undefined => {
      if (!o.prefetch) return undefined;
      const ip = `10.0.0.${++last}`;
      allocations.set(rt.containerId, ip);
      return Promise.resolve(result(rt, '', ip));
    },
    add: async (_network: NetConf | NetConfList, rt: RuntimeConf, _pod: string): Promise<CniResult> => {
      o.beforeAdd?.(rt);
      call(j, `${tag}.add`, rt.containerId);
      if (o.prefetch) await new Promise((r) => setTimeout(r, 2)); // the plugin's start
      const hostVeth = plug(rt);
      if (o.prefetch && o.askIpam) {
        // As the bridge plugin does: the veth on the bridge, then its IPAM asked (the shim), then
        // the pod's netns configured (a few ms, in which the agent shapes the veth).
        o.askIpam(rt);
        await new Promise((r) => setTimeout(r, 5));
      }
      return result(rt, hostVeth, allocations.get(rt.containerId) ?? `10.0.0.${++last}`);
    },
    releaseBeforeVeth: async (record: PodRecord) => call(j, `${tag}.releaseBeforeVeth`, record.containerId),
    del: async (_network: NetConf | NetConfList, rt: RuntimeConf) => call(j, `${tag}.del`, rt.containerId),
    check: async () => call(j, `${tag}.check`),
    reservations: async () => ({ held: [], empty: [] }),
    removeEmptyReservations: async () => [],
    podSubnets: (podCidr: Subnet[]) => podCidr,
    readopt: async () => ({ adopted: 0, failed: [] }),
  } satisfies AddressMode;
  return mode;
}

/** The shaper: what it was asked to shape, by pod. */
export function fakeShaper(j: Journal) {
  const states = new Map<string, ShapingState>();
  const wants = (l: { ingress?: number; egress?: number }) => l.ingress !== undefined || l.egress !== undefined;
  const shaper = {
    wants,
    shapesEgress: (l: { egress?: number }) => l.egress !== undefined,
    ensure: async (pod: { id: string; hostVeth: string; ips: string[]; limits: ShapingState['limits'] }) => {
      call(j, 'shaper.ensure', `${pod.id} ${pod.hostVeth || '(ifb side)'}`);
      const st: ShapingState = {
        version: 3,
        id: pod.id,
        hostVeth: pod.hostVeth,
        ips: [...pod.ips],
        limits: pod.limits,
        classId: 1,
        ingressInstalled: pod.limits.ingress !== undefined,
        egressInstalled: pod.limits.egress !== undefined,
        filters: [],
      };
      states.set(pod.id, st);
      return { ...st };
    },
    remove: async (id: string) => {
      call(j, 'shaper.remove', id);
      states.delete(id);
    },
    list: () => [...states.values()],
    states: () => [...states.values()],
    reconcile: async (live: Array<{ id: string; group?: string }>) => {
      call(j, 'shaper.reconcile', live.map((p) => `${p.id}@${p.group ?? '-'}`).join(' '));
      const keep = new Set(live.map((p) => p.id));
      for (const id of states.keys()) if (!keep.has(id)) states.delete(id);
    },
    counters: async () => ({ pods: [], links: new Map() }),
  } satisfies PodShaper;
  return { shaper, states };
}

/** A node with `current` in force (host-local unless 'dhcp'), both modes faked, and the real store in a temporary directory. */
export function fakePodCore(
  o: { current?: 'hl' | 'dhcp'; prefetch?: boolean; manageLoopback?: boolean; beforeAdd?: (rt: RuntimeConf) => void } = {},
) {
  const j: Journal = { calls: [], failAt: new Set() };
  const dir = mkdtempSync(join(tmpdir(), 'kfc-'));
  const log = pino({ level: 'silent' });
  const store = new PodStore(join(dir, 'pods'), log);
  const { kernel, state, plug } = fakeKernel(j);
  const pending = new PendingAdds();
  const askIpam = (rt: RuntimeConf) => {
    call(j, 'shim.ipamAsked', rt.containerId);
    void pending.get(recordKey(rt.containerId, rt.ifName))?.ipamAsked();
  };
  const hl = fakeMode(j, 'hl', plug, { ...o, askIpam });
  const dhcp = fakeMode(j, 'dhcp', plug, { ...o, askIpam });
  const { shaper, states } = fakeShaper(j);
  const node = { current: (o.current === 'dhcp' ? dhcp : hl) as AddressMode };
  const modes = new AddressModes(node.current, hl, dhcp);
  // The mode in force is the node's now, here as in network.ts.
  Object.defineProperty(modes, 'current', { get: () => node.current });
  const settings: BridgeSettings = { bridgeName: BRIDGE, mtu: 1500, hairpinMode: 'hairpin-veth', ipamDataDir: join(dir, 'ipam') };
  const core = {
    opts: { manageLoopback: o.manageLoopback ?? false, stateDir: dir },
    store,
    locks: new KeyedMutex(),
    pending,
    kernel,
    cni: {
      add: async (_conf: NetConf | NetConfList, rt: RuntimeConf) => {
        call(j, 'loopback.add', rt.containerId);
        return { cniVersion: '1.0.0', interfaces: [], ips: [], routes: [], dns: {} };
      },
    },
    shaper,
    modes,
    dedup: { syncIfNewBridge: async () => undefined },
    bridgeName: BRIDGE,
    log,
    // The mode in force may change while an ADD runs (the test sets node.current).
    mode: () => node.current,
    settings: () => settings,
    ready: () => ({ conf: node.current.conf(settings, POD_CIDR), subnets: POD_CIDR }),
    requireReady: (_what: string) => ({ conf: node.current.conf(settings, POD_CIDR), subnets: POD_CIDR }),
    hasPodCidr: () => true,
  } satisfies Core;
  return {
    core,
    j,
    kernel: state,
    hl,
    dhcp,
    node,
    shaperStates: states,
    /** The journal's calls whose name starts with one of `prefixes`. */
    only: (...prefixes: string[]) => j.calls.filter((c) => prefixes.some((p) => c.startsWith(p))),
    cleanup: () => {
      store.close();
      rmSync(dir, { recursive: true, force: true });
    },
  };
}

/** A pod's ADD request (netns `/run/netns/<name>`). */
export function attachRequest(name: string, o: Partial<AttachRequest> = {}): AttachRequest {
  return {
    containerId: `${name}-id`,
    ifName: 'eth0',
    namespace: 'default',
    name,
    netns: `/run/netns/${name}`,
    limits: {},
    portMappings: [],
    ...o,
  };
}

/** A distinct netns identity per pod name. */
export function netnsIdOf(name: string): { dev: number; ino: number } {
  let h = 0;
  for (const c of name) h = (h * 31 + c.charCodeAt(0)) >>> 0;
  return { dev: 4, ino: 4026531000 + (h % 100000) };
}
