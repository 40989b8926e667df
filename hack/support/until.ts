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
