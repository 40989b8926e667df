/**
 * Retries of refused work per key (a pod's re-shape: live-shaping.ts), with backoff: 1 s doubling to
 * 60 s, each wait jittered over [step/2, step], starting over after 10 min without a refusal
 * (kube/api-health.ts Backoff). One timer per key: a newer refusal replaces the pending retry (the
 * newest work is what is wanted), work that ends otherwise drops it, and stop() drops them all.
 */
import { Backoff } from '../kube/api-health.js';

const FIRST_MS = 1000;
const MAX_MS = 60_000;
const RESET_MS = 10 * 60_000;

interface Pending {
  backoff: Backoff;
  attempt: number;
  timer?: NodeJS.Timeout;
}

export class KeyedRetries {
  private readonly pending = new Map<string, Pending>();
  private stopped = false;
  /** Refusals since the start, retried or not (`counted` ones too). */
  failures = 0;

  /** Keys waiting for a retry. */
  get size(): number {
    return this.pending.size;
  }

  /** A refusal that is not retried (an operator's request, answered with the error): counted only. */
  counted(): void {
    this.failures++;
  }

  /**
   * `key`'s work was refused: counted, and `retry` runs after the key's next wait (unless a newer
   * refusal, done() or stop() comes first). Returns the wait and which refusal in a row this is;
   * undefined after stop() (counted, never retried).
   */
  refused(key: string, retry: (attempt: number) => void): { waitMs: number; attempt: number } | undefined {
    this.failures++;
    if (this.stopped) return undefined;
    const p = this.pending.get(key) ?? { backoff: new Backoff(FIRST_MS, MAX_MS, RESET_MS), attempt: 0 };
    clearTimeout(p.timer);
    const attempt = ++p.attempt;
    this.pending.set(key, p);
    const waitMs = p.backoff.next();
    p.timer = setTimeout(() => {
      p.timer = undefined;
      retry(attempt);
    }, waitMs);
    p.timer.unref();
    return { waitMs, attempt };
  }

  /** `key`'s work ended without a refusal (applied, nothing to do, or given up): its pending retry goes. */
  done(key: string): void {
    const p = this.pending.get(key);
    if (!p) return;
    clearTimeout(p.timer);
    this.pending.delete(key);
  }

  /** Drops every pending retry; none is scheduled afterwards. */
  stop(): void {
    this.stopped = true;
    for (const p of this.pending.values()) clearTimeout(p.timer);
    this.pending.clear();
  }
}
