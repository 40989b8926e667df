/**
 * When the agent's Kubernetes clients try again after a failure (kube/watch.ts), as client-go's
 * reflector does where it matters, and better where the agent can do better:
 *
 * - **The API server answered with an error** (403, 404, 400, a broken answer): each list/watch
 *   loop backs off on its own, as client-go's reflector does (`Backoff`: 800 ms doubling to 30 s,
 *   full jitter, reset after 2 min without a failure). Such an error does not go away by itself.
 * - **The API server is away** (refused, reset, timed out, no answer, 429 or 5xx: restarting,
 *   overloaded, or its etcd gone): one `ApiHealth` per agent, shared by every loop and writer. The
 *   first failure after a healthy period is retried after a short pause, uniform over 0-1 s (mean
 *   0.5 s, where client-go waits 0.8-1.6 s: a load balancer that dropped one connection costs
 *   little, and a cluster of agents whose connections all broke at once spreads its first retries
 *   over a second instead of sending them in one burst); after that the agent tries once per
 *   `periodMs` (1 s) on average, jittered uniformly over 0.5-1.5 periods, one waiting caller at a
 *   time, however many loops wait. The first answer lets every waiting loop go at once. So during
 *   an outage of any length an agent sends about one request a second, and a cluster of them
 *   spreads its requests over the second instead of retrying in step; after it, each agent is back
 *   within about 1.5 s (client-go's reflector, backing off to 30 s, may sit up to ~30 s in a wait).
 *
 * What counts as "away" is `isOutage`. Nothing here sleeps on a timer that `stop` cannot cut.
 */
import { setTimeout as sleep } from 'node:timers/promises';
import type { Logger } from '../../log.js';
import { moduleLogger } from '../../util/module-logger.js';

/** client-go's reflector backoff (NewExponentialBackoffManager(800ms, 30s, 2min, 2.0, 1.0)). */
export const BACKOFF_INITIAL_MS = 800;
export const BACKOFF_MAX_MS = 30_000;
export const BACKOFF_RESET_MS = 120_000;
/** Mean time between an agent's attempts while the API server is away. */
export const OUTAGE_PERIOD_MS = 1_000;
/** The first retry after a healthy period waits up to this (uniformly): one period, so a cluster's first retries are no burst. */
export const FIRST_RETRY_MAX_MS = 1_000;

type Random = () => number;

/** Exponential backoff with full jitter, reset after `resetMs` without a failure. */
export class Backoff {
  private failures = 0;
  private lastAt = -Infinity;

  constructor(
    private readonly initialMs = BACKOFF_INITIAL_MS,
    private readonly maxMs = BACKOFF_MAX_MS,
    private readonly resetMs = BACKOFF_RESET_MS,
    private readonly random: Random = Math.random,
  ) {}

  /** The wait before the next attempt: uniform over [step/2, step] (step doubling from initialMs to maxMs), so never 0. */
  next(now = Date.now()): number {
    if (now - this.lastAt >= this.resetMs) this.failures = 0;
    this.lastAt = now;
    const step = Math.min(this.maxMs, this.initialMs * 2 ** Math.min(this.failures, 30));
    this.failures++;
    return Math.round(step / 2 + this.random() * (step / 2));
  }

  reset(): void {
    this.failures = 0;
    this.lastAt = -Infinity;
  }
}

/** Node error codes of a connection that failed or broke: the API server (or the path to it) is away. */
const AWAY_CODES = new Set([
  'ECONNREFUSED',
  'ECONNRESET',
  'ETIMEDOUT',
  'EHOSTUNREACH',
  'ENETUNREACH',
  'EPIPE',
  'EAI_AGAIN',
  'ENOTFOUND',
  'ECONNABORTED',
  'UND_ERR_SOCKET',
]);

/**
 * Whether a failure means the API server is away or overloaded (try again soon, shared per agent)
 * rather than an answer that will not change by itself (back off per loop). `status`: the HTTP
 * status or Status.code of a KubeApiError; absent for a connection that failed or broke.
 */
export function isOutage(err: unknown): boolean {
  if (typeof err !== 'object' || err === null) return false;
  const e = err as { status?: unknown; code?: unknown; away?: unknown };
  if (e.away === true) return true;
  if (typeof e.status === 'number') return e.status === 429 || e.status >= 500;
  return typeof e.code === 'string' && AWAY_CODES.has(e.code);
}

export interface ApiHealthOptions {
  /** Mean time between attempts while away (default 1 s; tests shorter). */
  periodMs?: number;
  /** The first retry after a healthy period waits uniformly up to this. */
  firstRetryMaxMs?: number;
  logger?: Logger;
  random?: Random;
}

/** What the agent's API health has been through: tests, benches and metrics. */
export interface ApiHealthStats {
  /** Outages begun (a failure while healthy). */
  outages: number;
  /** Attempts let through while away. */
  attempts: number;
  /** When the current outage began (ms since the epoch), or undefined while healthy. */
  downSince: number | undefined;
}

/**
 * The agent's view of whether the API server is reachable, shared by all its clients: while it is
 * away, attempts are let through one at a time about once per period; the first answer lets
 * everyone go (see the module doc).
 */
export class ApiHealth {
  readonly periodMs: number;
  readonly firstRetryMaxMs: number;
  private readonly random: Random;
  private readonly log: Logger | undefined;
  private readonly waiters: Array<() => void> = [];
  private timer: NodeJS.Timeout | undefined;
  private down = false;
  private readonly s: ApiHealthStats = { outages: 0, attempts: 0, downSince: undefined };
  private lastError = '';

  constructor(o: ApiHealthOptions = {}) {
    this.periodMs = Math.max(1, o.periodMs ?? OUTAGE_PERIOD_MS);
    this.firstRetryMaxMs = Math.max(0, o.firstRetryMaxMs ?? Math.min(FIRST_RETRY_MAX_MS, this.periodMs));
    this.random = o.random ?? Math.random;
    this.log = o.logger ? moduleLogger(o.logger, 'api-health') : undefined;
  }

  get isDown(): boolean {
    return this.down;
  }

  get stats(): Readonly<ApiHealthStats> {
    return { ...this.s };
  }

  /** A request failed because the API server is away (isOutage): from now on attempts are paced. */
  failed(err: unknown): void {
    this.lastError = err instanceof Error ? err.message : String(err);
    if (this.down) return;
    this.down = true;
    this.s.outages++;
    this.s.downSince = Date.now(); // the caller logs the failure, once per outage
    this.schedule(this.random() * this.firstRetryMaxMs);
  }

  /** The API server answered (any HTTP answer that is not an outage): every waiting caller goes at once. */
  answered(): void {
    if (!this.down) return;
    const awayMs = Date.now() - (this.s.downSince ?? Date.now());
    this.down = false;
    this.s.downSince = undefined;
    clearTimeout(this.timer);
    this.timer = undefined;
    this.log?.info(
      { awayMs, attempts: this.s.attempts, waiting: this.waiters.length, lastError: this.lastError },
      'the API server answers again',
    );
    for (const go of this.waiters.splice(0)) go();
  }

  /**
   * Resolves when the caller may try: at once while healthy; while away, when its turn comes (one
   * caller per tick, oldest first) or the API server answered someone else. Rejects when `signal` aborts.
   */
  turn(signal?: AbortSignal): Promise<void> {
    if (!this.down) return Promise.resolve();
    if (signal?.aborted) return Promise.reject(new Error('aborted while waiting for the API server', { cause: signal.reason }));
    return new Promise<void>((resolve, reject) => {
      const go = () => {
        signal?.removeEventListener('abort', abort);
        resolve();
      };
      const abort = () => {
        const i = this.waiters.indexOf(go);
        if (i >= 0) this.waiters.splice(i, 1);
        reject(new Error('aborted while waiting for the API server', { cause: signal?.reason }));
      };
      signal?.addEventListener('abort', abort, { once: true });
      this.waiters.push(go);
      if (this.down && this.timer === undefined) this.schedule(this.tickMs());
    });
  }

  /** Waits `ms` unless aborted (then resolves early): a loop's own backoff. */
  static async pause(ms: number, signal: AbortSignal): Promise<void> {
    await sleep(ms, undefined, { signal }).catch(() => undefined);
  }

  private tickMs(): number {
    return this.periodMs * (0.5 + this.random());
  }

  private schedule(ms: number): void {
    clearTimeout(this.timer);
    this.timer = setTimeout(() => this.tick(), ms);
    this.timer.unref();
  }

  private tick(): void {
    this.timer = undefined;
    if (!this.down) return;
    const go = this.waiters.shift();
    if (go) {
      this.s.attempts++;
      go();
    }
    // Keep ticking while someone waits; a caller arriving later starts the clock again (turn()).
    if (this.waiters.length > 0) this.schedule(this.tickMs());
  }
}
