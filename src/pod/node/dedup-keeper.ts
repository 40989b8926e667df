/**
 * Keeps the node's promiscuous-bridge dedup rules (node/dedup-rules.ts) matching the mode, the pod CIDR and
 * the bridge's MAC (pinned by ensureBridge, so ports coming and going no longer change it; an
 * operator still can). They are kept by a reconcile, not checked per ADD (two ebtables listings,
 * costly on the ADD path: docs/pod.md, "Dedup rules"): when the pod CIDR is set, at init, every
 * `resyncMs` (rules removed by hand come back then) and when an ADD finds a bridge made anew
 * (`syncIfNewBridge`); other modes remove them once, at init. Without a bridge there is nothing to
 * protect and no rule. One sync at a time. Failures are logged, not thrown: duplicates are not
 * worth failing a pod's setup for, and the next check tries again.
 */
import type { Logger } from '../../log.js';
import * as nl from '../../netlink/index.js';
import type { Subnet } from '../../net/ip.js';
import type { KeyedMutex } from '../../util/keyed-mutex.js';
import { bridgeMac, syncDedup, type DedupTarget } from './dedup-rules.js';

export interface DedupKeeperOptions {
  bridgeName: string;
  /** The core's locks: the sync runs under the key `dedup`. */
  locks: KeyedMutex;
  resyncMs: number;
  log: Logger;
  /** Whether the node wants the rules (promiscuous-bridge, pod CIDR on the bridge). */
  wanted: () => boolean;
  /** The pod CIDR's subnets, undefined while it is not known. */
  subnets: () => Subnet[] | undefined;
}

export class DedupKeeper {
  /** The bridge (ifindex) the rules were last synced for; another one is a new MAC. */
  private bridge: number | undefined;
  private timer: NodeJS.Timeout | undefined;

  constructor(private readonly o: DedupKeeperOptions) {}

  /** Makes the rules match now (see the module doc). */
  sync(): Promise<void> {
    return this.o.locks.run('dedup', async () => {
      const wanted = this.o.wanted();
      const subnets = this.o.subnets();
      // Until the pod CIDR is known the rules (of the last run) stay: setting it syncs them.
      if (wanted && subnets === undefined) return;
      let target: DedupTarget | undefined;
      const bridge = nl.linkIndexByName(this.o.bridgeName);
      if (wanted && subnets !== undefined && bridge !== undefined) {
        const mac = bridgeMac(this.o.bridgeName);
        if (mac) target = { bridgeMac: mac, subnets };
      }
      try {
        await syncDedup(target, this.o.log);
        this.bridge = target ? bridge : undefined;
      } catch (err) {
        this.o.log.error({ err }, 'could not sync the promiscuous-bridge dedup rules (ebtables)');
      }
    });
  }

  /** A bridge made anew has a new MAC: its rules now, not at the next periodic check. */
  async syncIfNewBridge(bridgeIndex: number): Promise<void> {
    if (this.o.wanted() && bridgeIndex !== this.bridge) await this.sync();
  }

  /** (Re)starts the periodic check while the node wants the rules. */
  schedule(): void {
    this.close();
    if (!this.o.wanted()) return;
    this.timer = setInterval(() => void this.sync(), this.o.resyncMs);
    this.timer.unref();
  }

  close(): void {
    clearInterval(this.timer);
    this.timer = undefined;
  }
}
