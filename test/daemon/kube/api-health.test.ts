/**
 * The agent's retry rules (src/daemon/kube/api-health.ts), without a server: the backoff after an error
 * answer (client-go's steps, jittered within each, reset after a quiet period), which failures mean
 * "the API server is away", and the shared pace while it is: one waiting caller per tick, everyone
 * at once when it answers, an aborted wait leaves the queue.
 */
import test from 'ava';
import { ApiHealth, Backoff, isOutage } from '../../../src/daemon/kube/api-health.js';
import { KubeApiError } from '../../../src/daemon/kube/watch.js';

test('Backoff: steps of 800 ms doubling to 30 s, each wait within [step/2, step]; reset after 2 min without a failure', (t) => {
  const low = new Backoff(800, 30_000, 120_000, () => 0);
  const high = new Backoff(800, 30_000, 120_000, () => 1);
  const at = (i: number) => 1_000 + i; // failures 1 ms apart
  const lows = Array.from({ length: 8 }, (_, i) => low.next(at(i)));
  const highs = Array.from({ length: 8 }, (_, i) => high.next(at(i)));
  t.deepEqual(highs, [800, 1600, 3200, 6400, 12800, 25600, 30000, 30000]);
  t.deepEqual(
    lows,
    highs.map((x) => x / 2),
  );
  t.is(high.next(at(8) + 119_000), 30_000, 'failures less than 2 min apart keep the step');
  t.is(high.next(at(9) + 119_000 + 120_000), 800, '2 min without a failure: from the start');
  high.reset();
  t.is(high.next(500_000), 800);
});

test('isOutage: refused, reset, timed out, 429 and 5xx are the API server away; other answers (401, 403, 404, 410) are not', (t) => {
  for (const code of ['ECONNREFUSED', 'ECONNRESET', 'ETIMEDOUT', 'EHOSTUNREACH'])
    t.true(isOutage(Object.assign(new Error(code), { code })), code);
  for (const status of [429, 500, 502, 503, 504]) t.true(isOutage(new KubeApiError('x', { status })), String(status));
  t.true(isOutage(new KubeApiError('watch broke off', { away: true })));
  for (const status of [400, 401, 403, 404, 409, 410]) t.false(isOutage(new KubeApiError('x', { status })), String(status));
  t.false(isOutage(new Error('certificate has expired')));
  t.false(isOutage(undefined));
});

test('ApiHealth: while away, one waiting caller per tick, oldest first; the first answer lets every waiter go; an aborted wait leaves the queue', async (t) => {
  const h = new ApiHealth({ periodMs: 40, firstRetryMaxMs: 0, random: () => 0.5 });
  await h.turn(); // healthy: at once
  h.failed(new Error('refused'));
  t.true(h.isDown);
  const order: string[] = [];
  const waiting = ['a', 'b', 'c'].map((n) => h.turn().then(() => order.push(n)));
  const aborter = new AbortController();
  const gone = h.turn(aborter.signal);
  aborter.abort();
  await t.throwsAsync(gone);
  await new Promise((r) => setTimeout(r, 10)); // the first tick (after 0 ms)
  t.deepEqual(order, ['a'], 'one caller per tick');
  await new Promise((r) => setTimeout(r, 45)); // one period later
  t.deepEqual(order, ['a', 'b']);
  h.answered();
  await Promise.all(waiting);
  t.deepEqual(order, ['a', 'b', 'c'], 'the answer lets the rest go at once');
  t.false(h.isDown);
  t.is(h.stats.outages, 1);
  t.is(h.stats.attempts, 2);
  await h.turn();
});
