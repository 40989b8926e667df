import test from 'ava';
import { Coalesced } from '../../src/util/coalesce.js';

test('coalesced reads: one read serves everyone within its max age, a read in flight is joined, a failure is not kept', async (t) => {
  let now = 0;
  let reads = 0;
  let fail = false;
  let release: (() => void) | undefined;
  const c = new Coalesced(async () => {
    reads++;
    await new Promise<void>((r) => (release = r));
    if (fail) throw new Error('boom');
    return reads;
  }, 2000, () => now);
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
  const c = new Coalesced(async () => ++n, 0, () => now);
  t.is(await c.get(), 1);
  now = 1;
  t.is(await c.get(), 2);
});
