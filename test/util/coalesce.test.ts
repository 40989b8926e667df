import test from 'ava';
import { Coalesced } from '../../src/util/coalesce.js';

test('coalesced reads: one read serves everyone within its max age, a read in flight is joined, a failure is not kept', async (t) => {
  let now = 0;
  let reads = 0;
  let fail = false;
  let release: (() => void) | undefined;
  const c = new Coalesced(
    async () => {
      reads++;
      await new Promise<void>((r) => (release = r));
      if (fail) throw new Error('boom');
      return reads;
    },
    2000,
    () => now,
  );
  const a = c.get();
  const b = c.get();
  release?.();
  t.deepEqual(await Promise.all([a, b]), [1, 1], 'two callers, one read');
  now = 2000;
  t.is(await c.get(), 1, 'within its max age (from when the read started)');
  now = 2001;
  const d = c.get();
  release?.();
  t.is(await d, 2, 'aged out: read again');
  now = 5000;
  fail = true;
  const e = c.get();
  release?.();
  await t.throwsAsync(e, { message: 'boom' });
  fail = false;
  const f = c.get();
  release?.();
  t.is(await f, 4, 'the failure was not kept');
});

test('max age 0: every caller not joining a read in flight reads', async (t) => {
  let now = 0;
  let n = 0;
  const c = new Coalesced(
    async () => ++n,
    0,
    () => now,
  );
  t.is(await c.get(), 1);
  now = 1;
  t.is(await c.get(), 2);
});

test('a key: a result or a read in flight serves only callers with the same key', async (t) => {
  const now = 0;
  let n = 0;
  const pending: Array<() => void> = [];
  const c = new Coalesced(
    async () => {
      const mine = ++n;
      await new Promise<void>((r) => pending.push(r));
      return mine;
    },
    2000,
    () => now,
  );
  const release = () => {
    for (const r of pending.splice(0)) r();
  };
  const a = c.get(1);
  const a2 = c.get(1);
  t.is(n, 1, 'the same key joins the read in flight');
  const b = c.get(2);
  t.is(n, 2, 'another key starts its own read');
  release();
  t.deepEqual(await Promise.all([a, a2, b]), [1, 1, 2]);
  t.is(await c.get(2), 2, 'the newest result serves its key within the max age');
  t.is(n, 2);
  const d = c.get(3);
  release();
  t.is(await d, 3, 'a result of another key is not served');
});
