/**
 * The ADDs running now, and what each shares with the requests that arrive while it runs: the one
 * owner of that state (an ADD begins and ends here; the sweep, GC and reconcile ask what runs; the
 * shim's IPAM request finds its ADD's allocation here and tells the ADD that its plugin asked).
 *
 * The handshake with the shim: the ADD starts the bridge plugin's exec and, beside it, the address
 * mode's allocation (`prefetch`). The plugin makes the pod's veth a port of the bridge and then asks
 * its IPAM (the shim → the agent's socket → `ipamAsked`), which answers with that allocation and
 * wakes `whenIpamAsked`: the ADD then finds the veth and shapes it while the plugin still works in
 * the pod's netns (add.ts).
 */
import type { CniResult } from '../../cni/types.js';

/** One running ADD, by its record key (container ID @ interface). */
export class PendingAdd {
  private allocation: Promise<CniResult> | undefined;
  private asked = false;
  private readonly waiters: Array<() => void> = [];

  constructor(
    readonly key: string,
    private readonly onEnd: () => void,
  ) {}

  /** The allocation the mode started beside the bridge exec: what the shim's request is answered with. */
  prefetch(allocation: Promise<CniResult>): void {
    this.allocation = allocation;
  }

  /** Resolves once the ADD's bridge plugin has asked its IPAM (at once if it already has). */
  whenIpamAsked(): Promise<void> {
    if (this.asked) return Promise.resolve();
    return new Promise((resolve) => this.waiters.push(resolve));
  }

  /** The shim's request: the allocation (undefined when none was started), and the ADD woken. */
  ipamAsked(): Promise<CniResult> | undefined {
    if (!this.asked) {
      this.asked = true;
      // After this turn of the event loop, in which the answer (ready by then) goes out first.
      for (const w of this.waiters.splice(0)) setImmediate(w);
    }
    return this.allocation;
  }

  /** The ADD is over (done or undone): nothing of it is pending any more. */
  end(): void {
    this.onEnd();
  }
}

export class PendingAdds {
  private readonly adds = new Map<string, PendingAdd>();

  /**
   * An ADD of `key` begins (its record already says `adding`). One at a time per key: the caller
   * holds the attachment's lock.
   * @throws Error when an ADD of `key` is already pending (a lock not held: a bug)
   */
  begin(key: string): PendingAdd {
    if (this.adds.has(key)) throw new Error(`an ADD of ${key} is already running`);
    const add: PendingAdd = new PendingAdd(key, () => {
      if (this.adds.get(key) === add) this.adds.delete(key);
    });
    this.adds.set(key, add);
    return add;
  }

  /** Whether an ADD of `key` runs now. */
  has(key: string): boolean {
    return this.adds.has(key);
  }

  /** How many ADDs run now. */
  get size(): number {
    return this.adds.size;
  }

  /** The keys of the ADDs running now. */
  keys(): string[] {
    return [...this.adds.keys()];
  }

  /** The running ADD of `key`, for the shim's IPAM request; undefined when none runs. */
  get(key: string): PendingAdd | undefined {
    return this.adds.get(key);
  }
}
