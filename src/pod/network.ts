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
 * - Leftovers of attachments that no longer exist (reservations, veths on the bridge, host-port
 *   rules, tc objects) are removed by the sweep that GC and the reconcile share.
 * - Addresses come from host-local (the pod CIDR). With `ipamPrefetchSocket` (the agent) they are
 *   allocated in-process by host-local's own allocator on host-local's own store (host-local/), no
 *   host-local exec'd: the ADD starts the allocation beside the bridge plugin's exec, whose IPAM
 *   (the shim) then fetches that result (`prefetchedIpam`); a failed ADD waits for the allocation
 *   before its undo releases the address. DEL releases in-process too, without the bridge plugin:
 *   its DEL without a netns is only its IPAM DEL; host-port rules (portmap) go before the address.
 *   The generated config still describes bridge + host-local (through the shim), and the real
 *   host-local can release, check and collect what the agent reserved, and the agent what it did.
 * - In dhcp mode addresses come from the LAN's DHCP server through the reference dhcp IPAM plugin
 *   and its lease daemon (dhcp.ts): the bridge is then no gateway, the uplink is one of its ports
 *   (uplink.ts), DEL releases the lease through the plugin while the pod's interface still exists
 *   (the release leaves through it), and `readoptLeases` has a restarted lease daemon take every
 *   known pod's lease again.
 */
import { performance } from 'node:perf_hooks';
import { PluginTimeoutError } from '../cni/errors.js';
import { CniRuntime, deepFreeze } from '../cni/runtime.js';
import { convertResult, parseResult } from '../cni/result.js';
import type { CniResult, NetConf, NetConfList, RuntimeConf } from '../cni/types.js';
import { AggregateKubenetError, ConflictError, KubenetError, NotReadyError, UnknownPodError } from '../errors.js';
import type { Logger } from '../log.js';
import * as nl from '../netlink/index.js';
import { cidrContains, parsePodCidrs, type Subnet } from '../net/ip.js';
import { checkLimits, isUnshaped, type BandwidthLimits, type LimitSources } from '../shaper/limits.js';
import { Shaper } from '../shaper/tc.js';
import { KeyedMutex } from '../util/keyed-mutex.js';
import {
  afterBridge,
  bridgeConf,
  CNI_VERSION,
  dhcpBridgeConf,
  dhcpIpamOf,
  NETWORK_NAME,
  POD_IFNAME,
  portmapOnly,
  prefetchedIpamNetwork,
  hostLocalIpamNetwork,
  withPortmap,
  type BridgeSettings,
  type HairpinMode,
} from './bridge.js';
import { bridgeVeths, ensureBridge, removeStaleBridgeAddresses, tuneBridgeIfPresent } from './bridge-kernel.js';
import { bridgeMac, syncDedup, type DedupTarget } from './dedup.js';
import { DhcpLeaseError, leaseSubnets, readoptLeases, releaseLease, socketAnswers } from './dhcp.js';
import { checkHostPorts, ensureBridgeNetfilter, ensureMasquerade, hostPortRules, removeMasquerade } from './host-setup.js';
import { netnsIdIfAlive, NetnsError, podNetnsId, sameNetns, type NetnsId } from './netns.js';
import { PodStore, RECORD_VERSION, recordKey, type PodRecord, type PortMapping } from './record.js';
import {
  DEDUP_RESYNC_MS,
  LOOPBACK_NETWORK_NAME,
  PLUGIN_TYPES,
  type AttachRequest,
  type Attachment,
  type CheckRequest,
  type DetachRequest,
  type DhcpSettings,
  type IpamSettings,
  type PodNetworkOptions,
  type PodTraffic,
} from './requests.js';
import { bridgeOnly, checkAttachment, differences, PLACEHOLDER_PORT, podCniArgs, podName, reshapedRecord, round, runtimeConf, safeParseResult, shortId } from './attachment.js';
import { listReservations, readReservations, removeEmptyReservations } from './reservations.js';
import { ensureUplink, markedUplink, releaseOldUplink } from './uplink.js';
import { deletePodVeth, podVethPresent } from './veth.js';
import { upgradeFromV010 } from './upgrade.js';
import { StepTimer } from './step-timer.js';
import { HostLocalAllocator, parseHostLocal } from './host-local/allocator.js';

const DEFAULT_MTU = 1460;

type State = { phase: 'uninitialized' } | { phase: 'waiting-for-pod-cidr' } | { phase: 'ready'; subnets: Subnet[]; conf: NetConf };

export class PodNetwork {
  readonly store: PodStore;
  readonly bridgeName: string;
  private readonly log: Logger;
  private readonly cni: CniRuntime;
  private readonly shaper: Shaper;
  private readonly locks = new KeyedMutex();
  /** Attachments whose ADD is running now (their records say `adding`). */
  private readonly adding = new Set<string>();
  /** The host-local ADDs started for ADDs running now (ipamPrefetchSocket), by record key. */
  private readonly prefetched = new Map<string, Promise<CniResult>>();
  /** host-local's allocator, in-process (ipamPrefetchSocket). */
  private readonly hostLocal = new HostLocalAllocator();
  private state: State = { phase: 'uninitialized' };
  private hairpinMode: HairpinMode = 'hairpin-veth';
  private mtu = DEFAULT_MTU;
  private swept = false;
  /** The bridge (ifindex) the dedup rules were last synced for; another one is a new MAC. */
  private dedupBridge: number | undefined;
  private dedupTimer: NodeJS.Timeout | undefined;
  private readonly dhcp: DhcpSettings | undefined;
  /** dhcp: plugin execs bounded by the lease timeout (the bridge ADD waits for the lease). */
  private readonly dhcpCni: CniRuntime | undefined;
  private readonly loopbackConf: NetConf = { cniVersion: CNI_VERSION, name: LOOPBACK_NETWORK_NAME, type: 'loopback' };

  constructor(private readonly opts: PodNetworkOptions) {
    this.bridgeName = opts.bridgeName;
    this.log = opts.logger.child({ module: 'pod-network' });
    this.store = new PodStore(`${opts.stateDir}/pods`, this.log);
    this.cni = new CniRuntime({
      binDirs: opts.pluginBinDirs,
      allowedTypes: PLUGIN_TYPES,
      logger: this.log,
      ...(opts.cniTimeoutMs !== undefined ? { timeoutMs: opts.cniTimeoutMs } : {}),
    });
    this.shaper = new Shaper({ logger: this.log, ...(opts.ifbName !== undefined ? { ifbName: opts.ifbName } : {}) });
    this.dhcp = opts.ipam?.mode === 'dhcp' ? opts.ipam : undefined;
    this.dhcpCni = this.dhcp ? new CniRuntime({ binDirs: opts.pluginBinDirs, allowedTypes: PLUGIN_TYPES, logger: this.log, timeoutMs: this.dhcp.timeoutMs }) : undefined;
  }

  get ipamMode(): IpamSettings['mode'] {
    return this.dhcp ? 'dhcp' : 'host-local';
  }

  get phase(): State['phase'] {
    return this.state.phase;
  }

  /**
   * Node setup (MTU, br_netfilter, masquerade rule, the shaper's ifb), then the pod records: loaded,
   * upgraded from 0.1.0, and reconciled with the node (an interrupted ADD is undone, a pod whose
   * netns and veth are both gone is removed). Leftovers are swept once the pod CIDR is known.
   * In dhcp mode: no masquerade rule (one left by host-local mode is removed), the uplink is
   * enslaved to the bridge, and the network is ready at once (the pod CIDR is not the pods'
   * addresses there); the lease daemon must already answer on its socket.
   */
  async init(hairpinMode: HairpinMode, nonMasqueradeCIDR: string): Promise<void> {
    this.hairpinMode = hairpinMode;
    if (this.opts.mtu !== undefined) {
      this.mtu = this.opts.mtu;
    } else {
      const detected = nl.minHostMtu();
      this.mtu = detected ?? DEFAULT_MTU;
      this.log.info({ mtu: this.mtu, detected: detected !== undefined }, 'bridge MTU from host links');
    }
    await ensureBridgeNetfilter(this.log);
    await releaseOldUplink({ bridgeName: this.bridgeName, stateDir: this.opts.stateDir, keep: this.dhcp?.uplink }, this.log);
    if (this.dhcp) {
      await removeMasquerade(nonMasqueradeCIDR);
      this.log.info({ uplink: this.dhcp.uplink }, 'ipam dhcp: pods take addresses from the LAN; no masquerade rule');
      await ensureUplink({ bridgeName: this.bridgeName, uplink: this.dhcp.uplink, mtu: this.mtu, stateDir: this.opts.stateDir }, this.log);
      await ensureBridge(this.settings(), this.log);
    } else {
      await ensureMasquerade(nonMasqueradeCIDR, this.log);
    }
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
      this.state = this.dhcp ? { phase: 'ready', subnets: [], conf: dhcpBridgeConf(this.settings(), this.dhcp.daemonSocket) } : { phase: 'waiting-for-pod-cidr' };
      if (this.dhcp) this.swept = true; // the reconcile below sweeps: no pod CIDR is waited for
    }
    // The hairpin mode in force now (promiscuous or not); other modes hold no dedup rules, and
    // promiscuous-bridge syncs them once the pod CIDR is known.
    tuneBridgeIfPresent(this.settings(), this.log);
    if (!this.wantsDedup()) await this.syncDedup();
    this.scheduleDedupCheck();
    await this.reconcile();
  }

  /** promiscuous-bridge mode: the periodic check that restores dedup rules someone removed. */
  private scheduleDedupCheck(): void {
    clearInterval(this.dedupTimer);
    this.dedupTimer = undefined;
    if (!this.wantsDedup()) return;
    this.dedupTimer = setInterval(() => void this.syncDedup(), this.opts.dedupResyncMs ?? DEDUP_RESYNC_MS);
    this.dedupTimer.unref();
  }

  /** Sets the pod CIDR ("v4" or "v4,v6"); a malformed value is refused and the old one stays. */
  async setPodCidr(value: string): Promise<void> {
    if (this.state.phase === 'uninitialized') throw new NotReadyError('kubenet: pod CIDR set before init()');
    const subnets = parsePodCidrs(value);
    const cidrs = subnets.map((s) => s.cidr).join(',');
    if (this.state.phase === 'ready' && this.state.subnets.map((s) => s.cidr).join(',') === cidrs) return;
    if (this.dhcp && this.state.phase === 'ready') {
      // Informational in dhcp mode (status); the config and the bridge's addresses stay as they are.
      this.state = { ...this.state, subnets };
      this.log.info({ podCIDR: cidrs }, 'pod CIDR known (ipam dhcp: pods take their addresses from the LAN)');
      return;
    }
    removeStaleBridgeAddresses(this.bridgeName, subnets, this.log);
    // Frozen: the CNI runtime checks and serializes it once, not on every ADD.
    this.state = { phase: 'ready', subnets, conf: deepFreeze(bridgeConf(this.settings(), subnets)) };
    this.log.info({ podCIDR: cidrs }, 'pod CIDR set; CNI config generated');
    await ensureBridge(this.settings(), this.log);
    await this.syncDedup();
    if (!this.swept) {
      this.swept = true;
      // What the reconcile at init could not do without a config (records of 0.1.0 without one).
      await this.reconcile();
    }
  }

  /** The bridge config in force, or undefined while no pod CIDR is known. */
  currentConfig(): NetConf | undefined {
    return this.state.phase === 'ready' ? this.state.conf : undefined;
  }

  podCidr(): string | undefined {
    return this.state.phase === 'ready' && this.state.subnets.length > 0 ? this.state.subnets.map((s) => s.cidr).join(',') : undefined;
  }

  /** kubenet's dedup rules belong to promiscuous-bridge mode with the pod CIDR on the bridge (host-local). */
  private wantsDedup(): boolean {
    return !this.dhcp && this.hairpinMode === 'promiscuous-bridge';
  }

  /**
   * Makes the node's dedup rules match the mode, the pod CIDR and the bridge's MAC (pinned by
   * ensureBridge, so ports coming and going no longer change it; an operator still can). In
   * promiscuous-bridge mode they are kept by a reconcile, not checked per ADD (two ebtables
   * listings, ~10 ms): when the pod CIDR is set, at init, every `dedupResyncMs` (rules removed by
   * hand come back then) and when an ADD finds a bridge made anew; other modes remove them once,
   * at init. Without a bridge there is nothing to protect and no rule. One sync at a time. Failures
   * are logged, not thrown: duplicates are not worth failing a pod's setup for, and the next check
   * tries again.
   */
  private syncDedup(): Promise<void> {
    return this.locks.run('dedup', async () => {
      // Until the pod CIDR is known the rules (of the last run) stay: setPodCidr syncs them.
      if (this.wantsDedup() && this.state.phase !== 'ready') return;
      let target: DedupTarget | undefined;
      const bridge = nl.linkIndexByName(this.bridgeName);
      if (this.wantsDedup() && this.state.phase === 'ready' && bridge !== undefined) {
        const mac = bridgeMac(this.bridgeName);
        if (mac) target = { bridgeMac: mac, subnets: this.state.subnets };
      }
      try {
        await syncDedup(target, this.log);
        this.dedupBridge = target ? bridge : undefined;
      } catch (err) {
        this.log.error({ err }, 'could not sync the promiscuous-bridge dedup rules (ebtables)');
      }
    });
  }

  private settings(): BridgeSettings {
    const prefetch = this.dhcp ? undefined : this.opts.ipamPrefetchSocket;
    return {
      bridgeName: this.bridgeName,
      mtu: this.mtu,
      hairpinMode: this.hairpinMode,
      ipamDataDir: this.opts.ipamDataDir,
      ...(prefetch !== undefined ? { ipamPrefetchSocket: prefetch } : {}),
    };
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
    return this.locks.run(key, () => this.locks.run(`netns:${netnsId.dev}:${netnsId.ino}`, () => this.doAttach(req, netnsId, ready.conf)));
  }

  private async doAttach(req: AttachRequest, netnsId: NetnsId, conf: NetConf): Promise<{ record: PodRecord; result: CniResult; repeated: boolean }> {
    const started = performance.now();
    const steps = new StepTimer(started);
    const key = recordKey(req.containerId, req.ifName);
    const log = this.log.child({ pod: podName(req), id: shortId(req.containerId) });
    const existing = this.store.get(req.containerId, req.ifName);
    if (existing?.phase === 'ready') {
      const diff = differences(existing, req, netnsId);
      if (diff.length === 0 && existing.result) {
        log.info('ADD repeated with the same parameters: returning the recorded result');
        return { record: existing, result: parseResult(existing.result), repeated: true };
      }
      throw new ConflictError(
        `container ${req.containerId} ${req.ifName} is already attached with other ${diff.join(', ')}; refusing a second ADD (DEL it first)`,
      );
    }
    if (existing) {
      log.warn({ since: existing.addedAt }, 'an earlier ADD of this attachment did not finish; undoing it before this one');
      await this.teardown(existing, log);
    }
    const other = this.store.findByNetns(netnsId).find((r) => recordKey(r.containerId, r.ifName) !== key);
    if (other) throw new NetnsError(req.netns, `already holds pod ${podName(other)} (container ${other.containerId}); a second pod cannot be attached to it`);
    steps.mark('lookup');
    if (nl.netnsLinkByName(req.netns, req.ifName)) {
      throw new NetnsError(req.netns, `already has an interface ${req.ifName} that kubenet did not make`);
    }
    const lease = dhcpIpamOf(conf);
    if (lease && !(await socketAnswers(lease.daemonSocketPath))) {
      throw new NotReadyError(`kubenet: cannot set up pod ${podName(req)}: the DHCP lease daemon does not answer on ${lease.daemonSocketPath} (yet)`);
    }
    steps.mark('precheck');

    const network: NetConf | NetConfList = req.portMappings.length > 0 ? withPortmap(conf) : conf;
    const record: PodRecord = {
      version: RECORD_VERSION,
      containerId: req.containerId,
      ifName: req.ifName,
      namespace: req.namespace,
      name: req.name,
      netns: req.netns,
      netnsId,
      phase: 'adding',
      network,
      cniArgs: podCniArgs(req),
      portMappings: req.portMappings,
      limits: req.limits,
      ...(req.limitSources ? { limitSources: req.limitSources } : {}),
      ips: [],
      addedAt: new Date().toISOString(),
    };
    // The intent, before any plugin runs.
    this.store.put(record);
    steps.mark('record');
    this.adding.add(key);
    const rt = runtimeConf(record, req.netns);
    // host-local's allocation runs now, in-process, beside the bridge plugin's exec, which gets its
    // result when it asks its IPAM (the shim).
    const ipamNetwork = prefetchedIpamNetwork(network);
    const prefetch = ipamNetwork ? this.allocate(ipamNetwork, rt) : undefined;
    if (prefetch) {
      prefetch.catch(() => undefined); // its failure reaches the bridge plugin through the shim
      this.prefetched.set(key, prefetch);
      void prefetch.then(() => steps.note('hostLocal', performance.now() - started), () => undefined);
    }
    // The egress side on the shared ifb needs only the pod's addresses: made beside the bridge exec
    // too, once they are allocated; after the exec only the veth's part is left to shape.
    const egressFirst = prefetch && req.limits.egress !== undefined ? prefetch.then((r) => this.shaper.ensure({ id: req.containerId, hostVeth: '', ips: resultIps(r), limits: req.limits })) : undefined;
    egressFirst?.then(() => steps.note('egressIfb', performance.now() - started), () => undefined);
    try {
      // The bridge exists, pinned and tuned, before the bridge plugin adds the pod's veth to it.
      const bridge = await ensureBridge(this.settings(), log);
      // A bridge made anew has a new MAC: its dedup rules now, not at the next periodic check.
      if (this.wantsDedup() && bridge.index !== this.dedupBridge) await this.syncDedup();
      if (this.opts.manageLoopback) await this.cni.add(this.loopbackConf, { ...rt, ifName: 'lo', capabilityArgs: {} });
      const result = await this.addNetwork(network, rt, req);
      steps.mark('bridge');
      const ips = resultIps(result);
      if (ips.length === 0) throw new KubenetError(`pod ${podName(req)}: the bridge plugin returned no IP`);
      const hostVeth = result.interfaces.find((i) => !i.sandbox && i.name !== this.bridgeName)?.name;
      if (!hostVeth) throw new KubenetError(`pod ${podName(req)}: the bridge plugin returned no host veth`);
      record.ips = ips;
      record.hostVeth = hostVeth;
      const hostVethIndex = nl.linkIndexByName(hostVeth);
      if (hostVethIndex === undefined) throw new KubenetError(`pod ${podName(req)}: the host veth ${hostVeth} the bridge plugin reported does not exist`);
      record.hostVethIndex = hostVethIndex;
      steps.mark('veth');
      await egressFirst;
      await this.applyShaping(record);
      steps.mark('shape');
      record.phase = 'ready';
      record.result = convertResult(result, network.cniVersion);
      this.store.put(record);
      steps.mark('record2');
      log.info({ ips, hostVeth, limits: req.limits, hostPorts: req.portMappings.length, ms: round(performance.now() - started), ...steps.fields(log) }, 'pod set up');
      return { record, result, repeated: false };
    } catch (err) {
      log.warn({ err }, 'pod setup failed; undoing what it made');
      // A host-local ADD still running would reserve an address after the undo's release of it.
      await prefetch?.catch(() => undefined);
      await egressFirst?.catch(() => undefined);
      try {
        await this.teardown(record, log);
      } catch (undoErr) {
        // The record stays (phase adding): the runtime's DEL, or the next start, finishes the undo.
        log.error({ err: undoErr }, 'undoing the failed setup left something behind; the record is kept for DEL');
      }
      throw err;
    } finally {
      this.adding.delete(key);
      this.prefetched.delete(key);
    }
  }

  /**
   * The shim's IPAM ADD (ipamPrefetchSocket): the result of the host-local ADD started for this
   * attachment's ADD, once it is there. Only the bridge plugin of an ADD of ours asks.
   * @throws UnknownPodError when no ADD of this attachment is running (the bridge plugin run by
   *   hand with the agent's config): nothing is allocated for it.
   */
  prefetchedIpam(containerId: string, ifName: string): Promise<CniResult> {
    const running = this.prefetched.get(recordKey(containerId, ifName));
    if (running) return running;
    return Promise.reject(
      new UnknownPodError(`kubenet-ipam: no pod ADD of container ${containerId} ${ifName} is running in this agent; it answers only the bridge plugin the agent runs`),
    );
  }

  /** host-local's ADD for the attachment, in-process (host-local/allocator.ts). */
  private async allocate(ipamNetwork: NetConf, rt: RuntimeConf): Promise<CniResult> {
    return this.hostLocal.add(parseHostLocal(ipamNetwork), rt.containerId, rt.ifName);
  }

  /**
   * The network's ADD. In dhcp mode it is bounded by the lease timeout: a bridge plugin still waiting
   * for its lease then is killed, and the ADD fails with a DhcpLeaseError (undone like any failure).
   */
  private async addNetwork(network: NetConf | NetConfList, rt: RuntimeConf, req: AttachRequest): Promise<CniResult> {
    if (!this.dhcp || !this.dhcpCni || !dhcpIpamOf(network)) return this.cni.add(network, rt);
    try {
      return await this.dhcpCni.add(network, rt);
    } catch (err) {
      if (!(err instanceof PluginTimeoutError)) throw err;
      throw new DhcpLeaseError(
        `pod ${podName(req)}: no DHCP lease within ${this.dhcp.timeoutMs / 1000} s: no DHCP server answered through uplink ${this.dhcp.uplink} (or the lease daemon is stuck)`,
        { cause: err },
      );
    }
  }

  /** Shapes the pod as its limits say (without limits, any old shaping goes); the record keeps what was installed. */
  private async applyShaping(record: PodRecord): Promise<void> {
    if (isUnshaped(record.limits)) {
      await this.shaper.remove(record.containerId);
      delete record.shaping;
      return;
    }
    if (!record.hostVeth) throw new KubenetError(`pod ${podName(record)}: no host veth to shape`);
    const state = await this.shaper.ensure({ id: record.containerId, hostVeth: record.hostVeth, ips: record.ips, limits: record.limits });
    if (state) record.shaping = state;
  }

  /** Changes a running pod's limits (empty limits remove its shaping) and where they came from; the record follows. */
  async reshape(containerId: string, ifName: string, limits: BandwidthLimits, limitSources?: LimitSources): Promise<PodRecord> {
    checkLimits(limits, `container ${containerId}`);
    return this.locks.run(recordKey(containerId, ifName), async () => {
      const record = this.store.get(containerId, ifName);
      if (!record || record.phase !== 'ready') throw new UnknownPodError(`container ${containerId} ${ifName} is not attached to ${NETWORK_NAME}`);
      const next = reshapedRecord(record, limits, limitSources);
      if (!next) return record;
      if (next.rates) await this.applyShaping(next.record);
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
        await this.teardown(record, log);
        return;
      }
      await this.releaseUnknown(req.containerId, req.ifName, req.portMappings ?? [], log);
    });
  }

  /**
   * Undoes an attachment, every step even after failures, and removes its record only when all
   * succeeded (else a retried DEL runs them again; each is idempotent).
   */
  private async teardown(record: PodRecord, log: Logger): Promise<void> {
    const started = performance.now();
    const errors: unknown[] = [];
    const step = async (fn: () => Promise<unknown> | unknown) => {
      try {
        await fn();
      } catch (err) {
        errors.push(err);
      }
    };
    // A DHCP lease is released through the pod's interface: before its veth goes.
    if (dhcpIpamOf(record.network)) await step(() => releaseLease(this.dhcpCni ?? this.cni, record, log));
    // The veth and the shaping together: the veth's qdiscs and its redirect to the ifb go with it,
    // the pod's classes and filters on the ifb (matched by its addresses) are removed meanwhile.
    // The address is released only after both, so no new pod gets it while they still match it.
    await Promise.all([step(() => this.shaper.remove(record.containerId, { vethDeleted: true })), step(() => this.deleteVeth(record, log))]);
    await step(async () => {
      const network = record.network ?? this.recordedOrCurrent(record);
      const rt = runtimeConf(record, '');
      const prev = record.result ? safeParseResult(record.result, log) : undefined;
      await this.delNetwork(network, rt, prev);
    });
    if (errors.length > 0) {
      for (const err of errors) log.error({ err }, 'teardown step failed');
      throw new AggregateKubenetError(`kubenet: teardown of pod ${podName(record)} (container ${record.containerId}) failed`, errors);
    }
    this.store.delete(record.containerId, record.ifName);
    log.info({ phase: record.phase, ms: round(performance.now() - started) }, record.phase === 'ready' ? 'pod torn down' : 'unfinished setup undone');
  }

  /**
   * The config for a record that kept none (converted from 0.1.0, which knew host-local only): the
   * bridge + host-local config of the current pod CIDR, with portmap for host ports.
   */
  private recordedOrCurrent(record: PodRecord): NetConf | NetConfList {
    const what = `tear down pod ${podName(record)} (its record keeps no network config)`;
    const ready = this.requireReady(what);
    if (ready.subnets.length === 0) throw new NotReadyError(`kubenet: cannot ${what}: no pod CIDR yet`);
    const conf = this.dhcp ? bridgeConf(this.settings(), ready.subnets) : ready.conf;
    return record.portMappings.length > 0 ? withPortmap(conf) : conf;
  }

  /**
   * DEL of a network with the reference plugins. For a dhcp network only the plugins after the
   * bridge run (portmap): the bridge plugin's DEL without a netns is only its IPAM DEL, and the
   * lease was released before the veth went (releaseLease), or its daemon is gone. For host-local
   * (ipamPrefetchSocket) the same plugins run, then the address is released in-process.
   */
  private async delNetwork(network: NetConf | NetConfList, rt: RuntimeConf, prev?: CniResult): Promise<void> {
    // The agent releases host-local's addresses itself: the bridge plugin's DEL without a netns
    // would only exec host-local (through the shim, or its own IPAM) to do the same.
    const hostLocal = this.opts.ipamPrefetchSocket !== undefined && !this.dhcp && rt.netns === '' ? hostLocalIpamNetwork(network) : undefined;
    if (!dhcpIpamOf(network) && !hostLocal) return this.cni.del(network, rt, prev);
    // As libcni runs a list's DELs: the plugins after the bridge first, the address last.
    const rest = afterBridge(network);
    if (rest) await this.cni.del(rest, rt, prev);
    if (hostLocal) await this.hostLocal.del(parseHostLocal(hostLocal), rt.containerId, rt.ifName);
  }

  /** dhcp: every known pod's lease acquired again after the lease daemon (re)started (dhcp.ts). */
  readoptLeases(): Promise<{ adopted: number; failed: string[] }> {
    if (!this.dhcpCni) return Promise.resolve({ adopted: 0, failed: [] });
    return readoptLeases({ cni: this.dhcpCni, store: this.store, locks: this.locks, log: this.log });
  }

  /** The pod's veth, deleted from the host side (veth.ts: only a link provably the pod's). */
  private deleteVeth(record: PodRecord, log: Logger): Promise<void> {
    return deletePodVeth(record, this.bridgeName, this.store.all(), log);
  }

  /** DEL of an attachment without a record: what the plugins may still hold for the container ID. */
  private async releaseUnknown(containerId: string, ifName: string, portMappings: PortMapping[], log: Logger): Promise<void> {
    // dhcp mode keeps no reservations; a lease is only ever held for a recorded pod.
    const held = !this.dhcp && (await listReservations(this.opts.ipamDataDir, NETWORK_NAME)).some((r) => r.containerId === containerId && r.ifName === ifName);
    const hostPorts = portMappings.length > 0 || (await hostPortRules(NETWORK_NAME)).has(containerId);
    if (!held && !hostPorts) {
      log.debug('DEL of an unknown attachment: nothing held for it');
      return;
    }
    // Only an address needs the bridge config (host-local's ranges), so only it waits for the pod
    // CIDR; host ports alone go with portmap alone (a restarted agent may not know the CIDR yet).
    let network: NetConf | NetConfList = portmapOnly();
    if (held) {
      const conf = this.requireReady(`release the address container ${containerId} holds`).conf;
      network = hostPorts ? withPortmap(conf) : conf;
    }
    const rt: RuntimeConf = { containerId, ifName, netns: '', args: podCniArgs({ namespace: '', name: '', containerId }) };
    if (hostPorts) rt.capabilityArgs = { portMappings: portMappings.length > 0 ? portMappings : [PLACEHOLDER_PORT] };
    await this.delNetwork(network, rt);
    log.info({ address: held, hostPorts }, 'released what an unknown attachment still held');
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
      if (keep.has(key) || this.adding.has(key)) continue;
      await this.locks
        .run(key, async () => {
          const cur = this.store.get(r.containerId, r.ifName);
          if (!cur || this.adding.has(key)) return;
          await this.teardown(cur, this.log.child({ pod: podName(cur), id: shortId(cur.containerId), gc: true }));
        })
        .catch((err: unknown) => errors.push(err));
    }
    await this.sweep(keep).catch((err: unknown) => errors.push(err));
    if (errors.length > 0) throw new AggregateKubenetError('kubenet: GC', errors);
  }

  /**
   * The startup reconcile: an ADD that never finished is undone; a pod whose netns is gone and whose
   * veth is gone too is torn down (a netns path that merely vanished, with the veth still there, is
   * kept: the runtime's DEL will come); shaping of unknown pods is removed; once the pod CIDR is
   * known, leftovers are swept.
   */
  private async reconcile(): Promise<void> {
    const errors: unknown[] = [];
    for (const r of this.store.all()) {
      const log = this.log.child({ pod: podName(r), id: shortId(r.containerId), reconcile: true });
      const key = recordKey(r.containerId, r.ifName);
      if (this.adding.has(key)) continue;
      const gone = r.phase === 'ready' && !sameNetns(netnsIdIfAlive(r.netns), r.netnsId) && !podVethPresent(r);
      if (r.phase === 'ready' && !gone) continue;
      if (!r.network && this.podCidr() === undefined) continue; // needs the pod CIDR's config
      log.info({ phase: r.phase, netns: r.netns }, r.phase === 'adding' ? 'undoing an ADD that never finished' : 'the pod is gone (netns and veth): removing it');
      await this.locks.run(key, () => this.teardown(r, log)).catch((err: unknown) => errors.push(err));
    }
    // Shaping: gone for pods without a record, put back as recorded for every live shaped pod.
    const shaped = this.store.all().filter((r) => r.phase === 'ready' && r.hostVeth && !isUnshaped(r.limits));
    const known = new Set(this.store.all().map((r) => r.containerId));
    const unknown = this.shaper.list().filter((s) => !known.has(s.id)).length;
    if (unknown > 0) this.log.info({ pods: unknown }, 'removing the shaping of pods with no record');
    await this.shaper
      .reconcile(shaped.map((r) => ({ id: r.containerId, hostVeth: r.hostVeth ?? '', ips: r.ips, limits: r.limits })))
      .catch((err: unknown) => errors.push(err));
    const states = new Map(this.shaper.states().map((st) => [st.id, st]));
    for (const r of shaped) {
      const st = states.get(r.containerId);
      if (st && JSON.stringify(st) !== JSON.stringify(r.shaping)) this.store.put({ ...r, shaping: st });
    }
    if (this.state.phase === 'ready') await this.sweep(new Set()).catch((err: unknown) => errors.push(err));
    for (const err of errors) this.log.error({ err }, 'reconcile step failed');
  }

  /**
   * Removes what attachments that no longer exist left behind: host-local reservations, veths on the
   * bridge, portmap's host-port rules, tc objects. The node is listed FIRST and the records after:
   * a record is written before its plugins run, so anything a concurrent ADD makes has its record by
   * the time the records are read. Veths are skipped while an ADD runs (its veth is not named in its
   * record until the bridge plugin returns).
   */
  private async sweep(keep: Set<string>): Promise<void> {
    if (this.state.phase !== 'ready') return;
    const { conf } = this.state;
    // dhcp mode: no reservations; host-port rules are ours when they forward into the LAN subnets of our pods' leases.
    const subnets = this.dhcp ? leaseSubnets(this.store.all()) : this.state.subnets;
    const { held: reservations, empty: emptyReservations } = this.dhcp ? { held: [], empty: [] } : await readReservations(this.opts.ipamDataDir, NETWORK_NAME);
    // The uplink (and one an earlier start enslaved) is a port of the bridge too, and may be a veth.
    const uplinks = new Set([this.dhcp?.uplink, markedUplink(this.opts.stateDir)]);
    const veths = bridgeVeths(this.bridgeName).filter((v) => !uplinks.has(v.name));
    const portRules = await hostPortRules(NETWORK_NAME);
    const records = this.store.all();
    const liveKeys = new Set([...keep, ...this.adding, ...records.map((r) => recordKey(r.containerId, r.ifName))]);
    const liveIds = new Set([...liveKeys].map((k) => k.slice(0, k.indexOf('@'))));
    const errors: unknown[] = [];
    const removed = { reservations: 0, veths: 0, hostPorts: 0, shaping: 0 };

    const stale = new Map<string, { containerId: string; ifName: string; ports: boolean }>();
    for (const r of reservations) {
      const key = recordKey(r.containerId, r.ifName);
      if (!liveKeys.has(key)) stale.set(key, { containerId: r.containerId, ifName: r.ifName, ports: false });
    }
    for (const [id, ips] of portRules) {
      // Only rules that forward into this node's pod CIDR are this agent's to remove.
      if (liveIds.has(id) || ips.length === 0 || !ips.every((ip) => subnets.some((sub) => cidrContains(sub, ip)))) continue;
      const key = recordKey(id, POD_IFNAME);
      stale.set(key, { containerId: id, ifName: POD_IFNAME, ports: true });
    }
    for (const [key, s] of stale) {
      await this.locks
        .run(key, async () => {
          if (this.store.get(s.containerId, s.ifName) || this.adding.has(key)) return;
          const rt: RuntimeConf = { containerId: s.containerId, ifName: s.ifName, netns: '', args: podCniArgs({ namespace: '', name: '', containerId: s.containerId }) };
          if (s.ports) rt.capabilityArgs = { portMappings: [PLACEHOLDER_PORT] };
          await this.delNetwork(s.ports ? withPortmap(conf) : conf, rt);
          if (s.ports) removed.hostPorts++;
          if (reservations.some((r) => r.containerId === s.containerId)) removed.reservations++;
        })
        .catch((err: unknown) => errors.push(err));
    }
    if (emptyReservations.length > 0) {
      // Files a host-local killed mid-ADD created but never wrote (reservations.ts).
      await removeEmptyReservations(this.opts.ipamDataDir, NETWORK_NAME, emptyReservations).then(
        (freed) => {
          removed.reservations += freed.length;
          if (freed.length > 0) this.log.info({ addresses: freed }, 'released addresses a killed host-local had reserved without an owner');
        },
        (err: unknown) => errors.push(err),
      );
    }
    if (this.adding.size === 0) {
      const known = new Set(this.store.all().flatMap((r) => (r.hostVeth ? [r.hostVeth] : [])));
      for (const v of veths) {
        if (known.has(v.name)) continue;
        try {
          await nl.linkDelete(v.index);
          removed.veths++;
        } catch (err) {
          errors.push(err);
        }
      }
    }
    const liveNow = new Set(this.store.all().map((r) => r.containerId));
    for (const s of this.shaper.list()) {
      if (liveNow.has(s.id) || liveIds.has(s.id)) continue;
      await this.shaper.remove(s.id).then(() => removed.shaping++, (err: unknown) => errors.push(err));
    }
    if (removed.reservations + removed.veths + removed.hostPorts + removed.shaping > 0) this.log.info(removed, 'removed leftovers of attachments that no longer exist');
    if (errors.length > 0) throw new AggregateKubenetError('kubenet: sweep of leftovers', errors);
  }

  // ---------------------------------------------------------------------------------------------
  // CHECK, status

  /**
   * CNI CHECK: the attachment is recorded and complete, in the same netns; the reference bridge
   * plugin checks the pod's interface, addresses and routes against the recorded result; host ports
   * have their DNAT rules; a shaped pod is installed in the shaper.
   */
  async check(req: CheckRequest): Promise<void> {
    checkAttachment(req);
    const netnsId = podNetnsId(req.netns);
    return this.locks.run(recordKey(req.containerId, req.ifName), async () => {
      const record = this.store.get(req.containerId, req.ifName);
      if (!record || record.phase !== 'ready' || !record.result) {
        throw new UnknownPodError(`container ${req.containerId} ${req.ifName} is not attached to ${NETWORK_NAME}`);
      }
      if (!sameNetns(record.netnsId, netnsId)) {
        throw new NetnsError(req.netns, `is not the network namespace container ${req.containerId} was attached in (${record.netns})`);
      }
      const network = record.network ?? this.recordedOrCurrent(record);
      // portmap's own CHECK (plugins 1.1.1) fails for every IPv4-only pod, looking for ip6tables
      // chains it never made (containernetworking/plugins#819): bridge alone, and the DNAT rules here.
      // dhcp: the dhcp plugin's CHECK has the lease daemon look at the lease (or acquire it again).
      await (dhcpIpamOf(network) ? (this.dhcpCni ?? this.cni) : this.cni).check(bridgeOnly(network), runtimeConf(record, req.netns), parseResult(record.result));
      if (record.portMappings.length > 0) await checkHostPorts(record.ips, record.portMappings);
      if (!isUnshaped(record.limits) && !this.shaper.list().some((s) => s.id === record.containerId)) {
        throw new KubenetError(`pod ${podName(record)}: bandwidth limits are recorded but not installed`);
      }
    });
  }

  /** Throws NotReadyError while the network cannot set pods up (no pod CIDR, plugins missing). */
  status(missingPlugins: () => string[]): void {
    this.requireReady('set up pods');
    const missing = missingPlugins();
    if (missing.length > 0) {
      throw new NotReadyError(`kubenet: CNI plugin(s) ${missing.join(', ')} not found in ${this.opts.pluginBinDirs.join(', ')}`);
    }
  }

  /**
   * Every ready pod with the kernel's counters of its traffic, read over netlink (nothing exec'd):
   * the tc counters of each shaped direction (one class dump of the ifb, one of each ingress-shaped
   * veth), and with `links` the host veth's own counters too (one request per pod).
   */
  traffic(opts: { links?: boolean } = {}): PodTraffic[] {
    const ready = this.store.all().filter((r) => r.phase === 'ready');
    const byId = new Map(ready.map((r) => [r.containerId, r]));
    const shaping = new Map(this.shaper.counters((id) => byId.get(id)?.hostVethIndex).map((c) => [c.id, c]));
    return ready.map((record) => {
      const t: PodTraffic = { record };
      const s = shaping.get(record.containerId);
      if (s && (s.ingress || s.egress)) t.shaping = s;
      if (opts.links && record.hostVethIndex) {
        const link = nl.ifPresent(() => nl.linkStats(record.hostVethIndex ?? 0));
        if (link) t.link = link;
      }
      return t;
    });
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
  addressesIn(netns: string, ifName = POD_IFNAME): string[] {
    return nl.netnsAddrList(netns, ifName).filter((a) => a.scope === 0).map((a) => a.ip);
  }

  close(): void {
    clearInterval(this.dedupTimer);
    this.dedupTimer = undefined;
    this.shaper.close();
    this.store.close();
  }
}

/** A CNI result's addresses without their prefix length. */
function resultIps(result: CniResult): string[] {
  return result.ips.map((i) => i.address.split('/')[0] ?? '').filter((ip) => ip !== '');
}
