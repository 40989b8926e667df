/**
 * The pod network core: attachments of pods to the bridge, made with the reference CNI plugins,
 * recorded in the pod store, shaped by the shaper. Both front ends drive it: the kubelet-style
 * `KubenetPlugin` and the node agent's CNI handler.
 *
 * Every operation is: check the request completely (pure, and the netns by identity) → take the
 * attachment's lock → act → record. The rules it keeps:
 * - Nothing changes before the request is known to be valid; a refused request changes nothing.
 * - What an ADD will make (the config about to run, host ports, limits) is recorded before any
 *   plugin runs, so DEL, GC and the startup reconcile can undo it after a crash at any point.
 * - ADD is idempotent per (container ID, interface): repeated with the same parameters it returns
 *   the recorded result; with others it fails without touching the attachment. A failed ADD undoes
 *   what it made and nothing else: the pod's netns must not hold the interface beforehand, so an
 *   interface found there afterwards is its own.
 * - No request removes or alters an attachment it does not name. DEL of a complete attachment never
 *   enters the pod's netns: it deletes the pod's veth from the host side (the record names it; the
 *   ifindex proves it is the same link) and lets the bridge plugin release the address with an
 *   empty CNI_NETNS. Only an ADD cut short, whose interface never reached the bridge, is removed
 *   from inside its netns (veth.ts), where that ADD had checked no such interface existed.
 * - Leftovers of attachments that no longer exist are removed by the sweep GC and the startup
 *   reconcile share (sweep.ts).
 * - Where addresses come from is the address mode's (addresses/mode.ts: host-local run by the
 *   bridge plugin, host-local's allocator in the agent, dhcp): the core asks the mode in force for
 *   node setup, the config and each ADD, and the mode of a record's own network for its DEL and
 *   CHECK. With the agent's allocator the addresses are allocated beside the bridge plugin's exec,
 *   whose IPAM (the shim) fetches them (`prefetchedIpam`); a failed ADD waits for the allocation
 *   before its undo releases the address.
 */
import { CniRuntime, deepFreeze } from '../cni/runtime.js';
import type { CniResult, NetConf } from '../cni/types.js';
import { AggregateKubenetError, NotReadyError, UnknownPodError } from '../errors.js';
import type { Logger } from '../log.js';
import { moduleLogger } from '../util/module-logger.js';
import * as nl from '../netlink/index.js';
import { parsePodCidrs, type Subnet } from '../net/ip.js';
import { checkLimits, type BandwidthLimits, type LimitSources } from '../bandwidth/limits.js';
import { Shaper } from '../shaper/tc.js';
import { parseUnshaped } from '../shaper/unshaped.js';
import { KeyedMutex } from '../util/keyed-mutex.js';
import { applyShaping, setUp } from './lifecycle/add.js';
import type { AddressMode } from './addresses/mode.js';
import { addressModes, type AddressModes } from './addresses/modes.js';
import { checkAttachment, podName, reshapedRecord, shortId } from './attachment.js';
import { NETWORK_NAME, POD_IFNAME, type BridgeSettings, type HairpinMode } from './bridge-conf.js';
import { ensureBridge, removeStaleBridgeAddresses, tuneBridgeIfPresent } from './node/bridge-link.js';
import type { Core } from './lifecycle/deps.js';
import { PendingAdds } from './lifecycle/pending-adds.js';
import { nodeKernel } from './node/pod-kernel.js';
import { DedupKeeper } from './node/dedup-keeper.js';
import { releaseUnknown, teardown } from './lifecycle/del.js';
import { ensureBridgeNetfilter } from './node/host-setup.js';
import { podNetnsId } from './netns.js';
import { PodStore, recordKey, recordsDir, type PodRecord } from './records/record.js';
import {
  DEDUP_RESYNC_MS,
  PLUGIN_TYPES,
  type AttachRequest,
  type Attachment,
  type CheckRequest,
  type DetachRequest,
  type IpamSettings,
  type PodNetworkOptions,
  type PodTraffic,
} from './requests.js';
import { checkAttached, podTraffic } from './lifecycle/inspect.js';
import { reconcile, sweep } from './lifecycle/sweep.js';
import { releaseOldUplink } from './node/uplink.js';
import { upgradeFromV010 } from './records/upgrade.js';

const DEFAULT_MTU = 1460;

type State = { phase: 'uninitialized' } | { phase: 'waiting-for-pod-cidr' } | { phase: 'ready'; subnets: Subnet[]; conf: NetConf };

export class PodNetwork {
  readonly store: PodStore;
  readonly bridgeName: string;
  private readonly log: Logger;
  private readonly cni: CniRuntime;
  private readonly shaper: Shaper;
  private readonly locks = new KeyedMutex();
  /** The ADDs running now (their records say `adding`), and their handshake with the shim. */
  private readonly pending = new PendingAdds();
  /** The address mode in force, and the mode of each record's network. */
  private readonly modes: AddressModes;
  private readonly dedup: DedupKeeper;
  private state: State = { phase: 'uninitialized' };
  private hairpinMode: HairpinMode = 'hairpin-veth';
  private mtu = DEFAULT_MTU;
  private swept = false;
  /** What the operations in add.ts, del.ts and sweep.ts share with this object. */
  private readonly core: Core;

  constructor(private readonly opts: PodNetworkOptions) {
    this.bridgeName = opts.bridgeName;
    this.log = moduleLogger(opts.logger, 'pod-network');
    this.store = new PodStore(recordsDir(opts.stateDir), this.log);
    this.cni = new CniRuntime({
      binDirs: opts.pluginBinDirs,
      allowedTypes: PLUGIN_TYPES,
      logger: this.log,
      ...(opts.cniTimeoutMs !== undefined ? { timeoutMs: opts.cniTimeoutMs } : {}),
    });
    this.shaper = new Shaper({
      logger: this.log,
      ...(opts.capacity !== undefined ? { capacity: opts.capacity } : {}),
      ...(opts.ifbName !== undefined ? { ifbName: opts.ifbName } : {}),
      shards: opts.ifbShards ?? 1,
      ...(opts.unshapedCIDRs !== undefined ? { unshaped: { subnets: parseUnshaped(opts.unshapedCIDRs), bridge: opts.bridgeName } } : {}),
    });
    const { bridgeName, stateDir, ipamDataDir, pluginBinDirs } = opts;
    this.modes = addressModes(opts, { bridgeName, stateDir, ipamDataDir, pluginBinDirs, cni: this.cni, log: this.log });
    this.dedup = new DedupKeeper({
      bridgeName,
      locks: this.locks,
      resyncMs: opts.dedupResyncMs ?? DEDUP_RESYNC_MS,
      log: this.log,
      wanted: () => this.wantsDedup(),
      subnets: () => (this.state.phase === 'ready' ? this.state.subnets : undefined),
    });
    const core: Core = {
      opts,
      store: this.store,
      locks: this.locks,
      pending: this.pending,
      kernel: nodeKernel,
      cni: this.cni,
      shaper: this.shaper,
      modes: this.modes,
      dedup: this.dedup,
      bridgeName,
      log: this.log,
      mode: () => this.mode,
      settings: () => this.settings(),
      ready: () => (this.state.phase === 'ready' ? this.state : undefined),
      requireReady: (what) => this.requireReady(what),
      hasPodCidr: () => this.podCidr() !== undefined,
    };
    this.core = core;
  }

  private get mode(): AddressMode {
    return this.modes.current;
  }

  get ipamMode(): IpamSettings['mode'] {
    return this.mode.name;
  }

  get phase(): State['phase'] {
    return this.state.phase;
  }

  /**
   * Node setup (MTU, br_netfilter, masquerade rule, the shaper's ifb), then the pod records: loaded,
   * upgraded from 0.1.0, and reconciled with the node (an interrupted ADD is undone, a pod whose
   * netns and veth are both gone is removed). Leftovers are swept once the pod CIDR is known.
   * The address mode sets up its part of the node (addresses/mode.ts); a mode whose addresses are
   * not the pod CIDR's (dhcp) is ready at once.
   */
  async init(hairpinMode: HairpinMode, nonMasqueradeCIDR: string): Promise<void> {
    this.hairpinMode = hairpinMode;
    if (this.opts.mtu !== undefined) {
      this.mtu = this.opts.mtu;
    } else {
      const detected = await nl.minHostMtu();
      this.mtu = detected ?? DEFAULT_MTU;
      this.log.info({ mtu: this.mtu, detected: detected !== undefined }, 'bridge MTU from host links');
    }
    await ensureBridgeNetfilter(this.log);
    await releaseOldUplink({ bridgeName: this.bridgeName, stateDir: this.opts.stateDir, keep: this.mode.uplink }, this.log);
    await this.mode.setUpNode({ settings: this.settings(), nonMasqueradeCIDR, mtu: this.mtu }, this.log);
    const { legacy } = this.store.load();
    await upgradeFromV010({
      store: this.store,
      legacy,
      legacyCniCacheDir: this.opts.legacyCniCacheDir,
      legacyShaperStateDir: this.opts.legacyShaperStateDir,
      bridgeName: this.bridgeName,
      log: this.log,
    });
    // The shaper takes over what the records say it installed (the one source of pod state).
    await this.shaper.init(this.store.all().flatMap((r) => (r.shaping ? [r.shaping] : [])));
    if (this.state.phase === 'uninitialized') {
      if (this.mode.podCidrAddresses) {
        this.state = { phase: 'waiting-for-pod-cidr' };
      } else {
        this.state = { phase: 'ready', subnets: [], conf: deepFreeze(this.mode.conf(this.settings(), [])) };
        this.swept = true; // the reconcile below sweeps: no pod CIDR is waited for
      }
    }
    // The hairpin mode in force now (promiscuous or not); other modes hold no dedup rules, and
    // promiscuous-bridge syncs them once the pod CIDR is known.
    await tuneBridgeIfPresent(this.settings(), this.log);
    if (!this.wantsDedup()) await this.dedup.sync();
    this.dedup.schedule();
    await reconcile(this.core);
  }

  /** Sets the pod CIDR ("v4" or "v4,v6"); a malformed value is refused and the old one stays. */
  async setPodCidr(value: string): Promise<void> {
    if (this.state.phase === 'uninitialized') throw new NotReadyError('kubenet: pod CIDR set before init()');
    const subnets = parsePodCidrs(value);
    const cidrs = subnets.map((s) => s.cidr).join(',');
    if (this.state.phase === 'ready' && this.state.subnets.map((s) => s.cidr).join(',') === cidrs) return;
    if (!this.mode.podCidrAddresses && this.state.phase === 'ready') {
      // Informational (status): the config and the bridge's addresses stay as they are.
      this.state = { ...this.state, subnets };
      this.log.info({ podCIDR: cidrs, ipam: this.mode.name }, 'pod CIDR known (pods take their addresses elsewhere)');
      return;
    }
    await removeStaleBridgeAddresses(this.bridgeName, subnets, this.log);
    // Frozen: the CNI runtime checks and serializes it once, not on every ADD.
    this.state = { phase: 'ready', subnets, conf: deepFreeze(this.mode.conf(this.settings(), subnets)) };
    this.log.info({ podCIDR: cidrs }, 'pod CIDR set; CNI config generated');
    await ensureBridge(this.settings(), this.log);
    await this.dedup.sync();
    if (!this.swept) {
      this.swept = true;
      // What the reconcile at init could not do without a config (records of 0.1.0 without one).
      await reconcile(this.core);
    }
  }

  /** The bridge config in force, or undefined while no pod CIDR is known. */
  currentConfig(): NetConf | undefined {
    return this.state.phase === 'ready' ? this.state.conf : undefined;
  }

  podCidr(): string | undefined {
    return this.state.phase === 'ready' && this.state.subnets.length > 0 ? this.state.subnets.map((s) => s.cidr).join(',') : undefined;
  }

  /** kubenet's dedup rules belong to promiscuous-bridge mode with the pod CIDR on the bridge. */
  private wantsDedup(): boolean {
    return this.mode.podCidrAddresses && this.hairpinMode === 'promiscuous-bridge';
  }

  private settings(): BridgeSettings {
    return { bridgeName: this.bridgeName, mtu: this.mtu, hairpinMode: this.hairpinMode, ipamDataDir: this.opts.ipamDataDir };
  }

  private requireReady(what: string): Extract<State, { phase: 'ready' }> {
    if (this.state.phase === 'ready') return this.state;
    throw new NotReadyError(
      this.state.phase === 'uninitialized' ? `kubenet: cannot ${what}: not initialized` : `kubenet: cannot ${what}: no pod CIDR yet`,
    );
  }

  list(): PodRecord[] {
    return this.store.all();
  }

  get(containerId: string, ifName = POD_IFNAME): PodRecord | undefined {
    return this.store.get(containerId, ifName);
  }

  // ---------------------------------------------------------------------------------------------
  // ADD

  /** Attaches a pod (CNI ADD). Returns its record and the CNI result. */
  async attach(req: AttachRequest): Promise<{ record: PodRecord; result: CniResult; repeated: boolean }> {
    checkAttachment(req);
    checkLimits(req.limits, `pod ${podName(req)}`);
    const ready = this.requireReady(`set up pod ${podName(req)}`);
    const netnsId = podNetnsId(req.netns);
    const key = recordKey(req.containerId, req.ifName);
    return this.locks.run(key, () =>
      this.locks.run(`netns:${netnsId.dev}:${netnsId.ino}`, () => setUp(this.core, req, netnsId, ready.conf)),
    );
  }

  /**
   * The shim's IPAM ADD (ipamPrefetchSocket): the result of the host-local ADD started for this
   * attachment's ADD, once it is there. Only the bridge plugin of an ADD of ours asks.
   * @throws UnknownPodError when no ADD of this attachment is running (the bridge plugin run by
   *   hand with the agent's config): nothing is allocated for it.
   */
  prefetchedIpam(containerId: string, ifName: string): Promise<CniResult> {
    // The plugin asks once the veth is a port of the bridge: the ADD shapes it now (add.ts).
    const running = this.pending.get(recordKey(containerId, ifName))?.ipamAsked();
    if (running) return running;
    return Promise.reject(
      new UnknownPodError(
        `kubenet-ipam: no pod ADD of container ${containerId} ${ifName} is running in this agent; it answers only the bridge plugin the agent runs`,
      ),
    );
  }

  /** Changes a running pod's limits (empty limits remove its shaping); the record follows. */
  async reshape(containerId: string, ifName: string, limits: BandwidthLimits, limitSources?: LimitSources): Promise<PodRecord> {
    checkLimits(limits, `container ${containerId}`);
    return this.locks.run(recordKey(containerId, ifName), async () => {
      const record = this.store.get(containerId, ifName);
      if (record?.phase !== 'ready') throw new UnknownPodError(`container ${containerId} ${ifName} is not attached to ${NETWORK_NAME}`);
      const next = reshapedRecord(record, limits, limitSources);
      if (!next) return record;
      if (next.rates) await applyShaping(this.core, next.record);
      this.store.put(next.record);
      this.log.info({ pod: podName(record), from: record.limits, to: limits, sources: limitSources }, 'pod limits changed');
      return next.record;
    });
  }

  // ---------------------------------------------------------------------------------------------
  // DEL, GC, reconcile

  /**
   * Detaches a pod (CNI DEL): its shaping, its veth, its host ports, its address and its record. An
   * unknown attachment releases whatever the reference plugins still hold for its container ID (an
   * address, host ports the request names) and succeeds. The request's netns is never entered.
   */
  async detach(req: DetachRequest): Promise<void> {
    checkAttachment(req);
    const key = recordKey(req.containerId, req.ifName);
    return this.locks.run(key, async () => {
      const record = this.store.get(req.containerId, req.ifName);
      const log = this.log.child({ pod: record ? podName(record) : '', id: shortId(req.containerId) });
      if (record) {
        await teardown(this.core, record, log);
        return;
      }
      await releaseUnknown(this.core, req.containerId, req.ifName, req.portMappings ?? [], log);
    });
  }

  /** After the address source restarted (dhcp's lease daemon): every known pod's address taken again. */
  readoptLeases(): Promise<{ adopted: number; failed: string[] }> {
    return this.mode.readopt(this.store, this.locks);
  }

  /**
   * CNI GC: tears down every attachment not in `valid` (except ADDs still running, which their
   * runtime may not list yet), then sweeps leftovers of attachments that no longer exist.
   */
  async gc(valid: Attachment[]): Promise<void> {
    for (const a of valid) checkAttachment(a);
    const keep = new Set(valid.map((a) => recordKey(a.containerId, a.ifName)));
    const errors: unknown[] = [];
    for (const r of this.store.all()) {
      const key = recordKey(r.containerId, r.ifName);
      if (keep.has(key) || this.pending.has(key)) continue;
      await this.locks
        .run(key, async () => {
          const cur = this.store.get(r.containerId, r.ifName);
          if (!cur || this.pending.has(key)) return;
          await teardown(this.core, cur, this.log.child({ pod: podName(cur), id: shortId(cur.containerId), gc: true }));
        })
        .catch((err: unknown) => errors.push(err));
    }
    await sweep(this.core, keep).catch((err: unknown) => errors.push(err));
    if (errors.length > 0) throw new AggregateKubenetError('kubenet: GC', errors);
  }

  // ---------------------------------------------------------------------------------------------
  // CHECK, status

  /** CNI CHECK (inspect.ts). */
  async check(req: CheckRequest): Promise<void> {
    checkAttachment(req);
    const netnsId = podNetnsId(req.netns);
    return this.locks.run(recordKey(req.containerId, req.ifName), () => checkAttached(this.core, req, netnsId));
  }

  /** Throws NotReadyError while the network cannot set pods up (no pod CIDR, plugins missing). */
  status(missingPlugins: () => string[]): void {
    this.requireReady('set up pods');
    const missing = missingPlugins();
    if (missing.length > 0) {
      throw new NotReadyError(`kubenet: CNI plugin(s) ${missing.join(', ')} not found in ${this.opts.pluginBinDirs.join(', ')}`);
    }
  }

  /** Every ready pod with the kernel's counters of its traffic (inspect.ts). */
  traffic(opts: { links?: boolean } = {}): Promise<PodTraffic[]> {
    return podTraffic(this.core, opts);
  }

  /**
   * The node's trees as /metrics shows them: each shard's share of its direction's capacity, and
   * per direction with a tree whether its best-effort pods are in it now (src/shaper/steering.ts).
   */
  bandwidthShares(): {
    shares: Array<{ direction: 'egress' | 'ingress'; ifb: string; share: number }>;
    steered: { egress?: boolean; ingress?: boolean };
  } {
    return { shares: this.shaper.shareView(), steered: this.shaper.steered() };
  }

  /** Replaces the destinations whose traffic with shaped pods is not shaped, live (src/shaper/unshaped.ts). @throws ConfigError for a bad CIDR */
  setUnshaped(cidrs: string[]): Promise<void> {
    return this.shaper.setUnshaped({ subnets: parseUnshaped(cidrs), bridge: this.bridgeName });
  }

  /** Resolves once the kernel has finished every pod veth deletion this process started. */
  settled(): Promise<void> {
    return nl.linkDeletionsSettled();
  }

  /** Pod veths deleted (DEL has answered) that the kernel is still freeing. */
  vethDeletionsInFlight(): number {
    return nl.linkDeletionsInFlight();
  }

  /** The global addresses on the pod's interface inside `netns` (a pod this process may not know). */
  async addressesIn(netns: string, ifName = POD_IFNAME): Promise<string[]> {
    return (await nl.netnsAddrList(netns, ifName)).filter((a) => a.scope === 0).map((a) => a.ip);
  }

  close(): void {
    this.dedup.close();
    this.shaper.close();
    this.store.close();
  }
}
