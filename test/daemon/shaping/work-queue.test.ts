/**
 * The live re-shapes' queue (src/daemon/shaping/work-queue.ts): one worker, keys in the order they
 * came, a key waiting once (a newer item merged into it, in its place), a failing work logged and
 * passed, stop() dropping what waits. Pure; no kernel.
 */
import test from 'ava';
import { KeyedWorkQueue } from '../../../src/daemon/shaping/work-queue.js';

/** A queue whose work waits for `release()` of each item, recording what it started and how many ran at once. */
function gated() {
  const started: string[] = [];
  const failures: string[] = [];
  let running = 0;
  let most = 0;
  const gates: Array<() => void> = [];
  const q = new KeyedWorkQueue<string>(
    async (key, item) => {
      running++;
      most = Math.max(most, running);
      started.push(`${key}=${item}`);
      await new Promise<void>((r) => gates.push(r));
      running--;
      if (item === 'boom') throw new Error('refused');
    },
    (a, b) => `${a}+${b}`,
    (key, err) => failures.push(`${key}: ${(err as Error).message}`),
  );
  const release = async () => {
    for (let i = 0; i < 50 && gates.length === 0; i++) await new Promise((r) => setImmediate(r));
    gates.shift()?.();
    await new Promise((r) => setImmediate(r));
  };
  return { q, started, failures, release, most: () => most };
}

test('one worker takes the keys in the order they came; a key already waiting is merged into its place', async (t) => {
  const g = gated();
  const done = [g.q.add('a', '1'), g.q.add('b', '1'), g.q.add('c', '1'), g.q.add('b', '2'), g.q.add('a', '2')];
  t.is(g.q.size, 3, "a is being worked on; b, c and a's second item (a new key once a started) wait");
  for (let i = 0; i < 4; i++) await g.release();
  await Promise.all(done);
  t.deepEqual(g.started, ['a=1', 'b=1+2', 'c=1', 'a=2']);
  t.is(g.most(), 1, 'never two at once');
  t.is(g.q.worked, 4);
  t.is(g.q.size, 0);
});

test('a work that throws is told to failed() and the worker goes on', async (t) => {
  const g = gated();
  const done = [g.q.add('a', 'boom'), g.q.add('b', 'fine')];
  await g.release();
  await g.release();
  await Promise.all(done);
  t.deepEqual(g.failures, ['a: refused']);
  t.deepEqual(g.started, ['a=boom', 'b=fine']);
});

test('stop() drops what waits (their promises settle) and nothing is queued after it', async (t) => {
  const g = gated();
  const first = g.q.add('a', '1');
  const waiting = g.q.add('b', '1');
  g.q.stop();
  await waiting;
  t.is(g.q.size, 0);
  await g.release();
  await first;
  await g.q.add('c', '1');
  t.deepEqual(g.started, ['a=1'], 'b was dropped, c never queued');
});
