/** Waiting for a condition in tests and benches. */
import { setTimeout as sleep } from 'node:timers/promises';

/** Polls `probe` every `intervalMs` until it returns something truthy, and returns that; throws after `timeoutMs`. */
export async function until<T>(what: string, probe: () => T | Promise<T>, timeoutMs = 10_000, intervalMs = 10): Promise<NonNullable<T>> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const v = await probe();
    if (v) return v as NonNullable<T>;
    if (Date.now() > deadline) throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}`);
    await sleep(intervalMs);
  }
}

/**
 * Polls `ok` every `intervalMs` until it holds; returns the ms since `t0` (Infinity after `limitMs`
 * from t0): a time measured, not a wait that fails.
 */
export async function msUntil(ok: () => boolean | Promise<boolean>, t0: number, limitMs = 10_000, intervalMs = 20): Promise<number> {
  while (Date.now() - t0 < limitMs) {
    if (await ok()) return Date.now() - t0;
    await sleep(intervalMs);
  }
  return Infinity;
}
