/**
 * What the pod lifecycle's operations are given (network.ts builds it and owns the state behind
 * it): the ADD in add.ts, the DEL in del.ts, the reconcile and sweep in sweep.ts, CHECK and traffic
 * in inspect.ts. Each operation names the narrow part it needs (`TeardownDeps`, `SetUpDeps`); every
 * piece of mutable state has one owner with named operations (the store, the locks, `PendingAdds`),
 * and the kernel, the plugins and the shaper are interfaces, so the rules are unit-tested over
 * fakes without root (test/pod/lifecycle.test.ts). Types only.
 */
import type { CniRuntime } from '../../cni/runtime.js';
import type { NetConf } from '../../cni/types.js';
import type { Logger } from '../../log.js';
import type { Subnet } from '../../net/ip.js';
import type { Shaper } from '../../shaper/tc.js';
import type { KeyedMutex } from '../../util/keyed-mutex.js';
import type { AddressMode } from '../addresses/mode.js';
import type { AddressModes } from '../addresses/modes.js';
import type { BridgeSettings } from '../bridge-conf.js';
import type { DedupKeeper } from '../node/dedup-keeper.js';
import type { PendingAdds } from './pending-adds.js';
import type { PodKernel } from '../node/pod-kernel.js';
import type { PodStore } from '../records/record.js';
import type { PodNetworkOptions } from '../requests.js';

/** The shaper as the lifecycle uses it (src/shaper/tc.ts `Shaper`). */
export type PodShaper = Pick<Shaper, 'ensure' | 'remove' | 'wants' | 'shapesEgress' | 'list' | 'states' | 'reconcile' | 'counters'>;

export interface Core {
  readonly opts: Pick<PodNetworkOptions, 'manageLoopback' | 'stateDir'>;
  readonly store: PodStore;
  /** Per attachment (record key), per netns (`netns:dev:ino`), `portmap` and `dedup`. */
  readonly locks: KeyedMutex;
  /** The ADDs running now, and their handshake with the shim's IPAM requests. */
  readonly pending: PendingAdds;
  /** Links, namespaces and host-port rules (pod-kernel.ts). */
  readonly kernel: PodKernel;
  /** The loopback plugin's ADD (when the core manages the pod's lo). */
  readonly cni: Pick<CniRuntime, 'add'>;
  readonly shaper: PodShaper;
  /** The address mode in force, and the mode of each record's network. */
  readonly modes: AddressModes;
  readonly dedup: Pick<DedupKeeper, 'syncIfNewBridge'>;
  readonly bridgeName: string;
  readonly log: Logger;
  /** The address mode in force. */
  mode(): AddressMode;
  /** The bridge as the node has it now (MTU, hairpin mode). */
  settings(): BridgeSettings;
  /** The config and subnets once the network is ready, else undefined. */
  ready(): { conf: NetConf; subnets: Subnet[] } | undefined;
  /** The same, or a NotReadyError saying what could not be done. */
  requireReady(what: string): { conf: NetConf; subnets: Subnet[] };
  /** Whether the pod CIDR is known (a dhcp node is ready without one). */
  hasPodCidr(): boolean;
}

/** What undoing an attachment needs (del.ts teardown). */
export type TeardownDeps = Pick<Core, 'store' | 'modes' | 'shaper' | 'kernel' | 'bridgeName' | 'settings' | 'requireReady'>;

/** What an ADD needs: a teardown's (it undoes its own failure) and the plugins, the pending ADDs, the bridge. */
export type SetUpDeps = TeardownDeps & Pick<Core, 'opts' | 'locks' | 'pending' | 'cni' | 'dedup' | 'log' | 'mode'>;
