/**
 * What the pod network core's operations share (network.ts holds it and the state behind it; the
 * ADD in add.ts, DEL in del.ts, and the reconcile and sweep in sweep.ts work on it). Types only.
 */
import type { CniRuntime } from '../cni/runtime.js';
import type { CniResult, NetConf, NetConfList, RuntimeConf } from '../cni/types.js';
import type { Logger } from '../log.js';
import type { Subnet } from '../net/ip.js';
import type { Shaper } from '../shaper/tc.js';
import type { KeyedMutex } from '../util/keyed-mutex.js';
import type { AddressMode } from './address-mode.js';
import type { AddressModes } from './address-modes.js';
import type { BridgeSettings } from './bridge.js';
import type { DedupKeeper } from './dedup-keeper.js';
import type { PodRecord, PodStore } from './record.js';
import type { PodNetworkOptions } from './requests.js';

export interface Core {
  readonly opts: PodNetworkOptions;
  readonly store: PodStore;
  /** Per attachment (record key), per netns (`netns:dev:ino`) and `dedup`. */
  readonly locks: KeyedMutex;
  /** Attachments whose ADD is running now (their records say `adding`). */
  readonly adding: Set<string>;
  /** The allocations the mode started beside the bridge exec for ADDs running now, by record key. */
  readonly prefetched: Map<string, Promise<CniResult>>;
  /** Called when the bridge plugin of an ADD running now asks for its addresses (the shim), by record key. */
  readonly ipamAsked: Map<string, () => void>;
  readonly cni: CniRuntime;
  readonly shaper: Shaper;
  /** The address mode in force, and the mode of each record's network. */
  readonly modes: AddressModes;
  readonly dedup: DedupKeeper;
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
  /** Undoes an attachment, every step; its record goes when all succeeded (del.ts). */
  teardown(record: PodRecord, log: Logger): Promise<void>;
  /** The network's DEL by the mode whose addresses it holds. */
  delNetwork(network: NetConf | NetConfList, rt: RuntimeConf, prev?: CniResult): Promise<void>;
}
