/**
 * The capacity's split over the egress shards (src/shaper/shares.ts), pure: floors, saturated shards,
 * weights, headroom, and when a change is worth a tc line.
 */
import test from 'ava';
import {
  bandWeight,
  CHANGE,
  GROWING,
  HOLD_MS,
  HEADROOM,
  LEAST_SHARE,
  SATURATED,
  ShardShares,
  sharesToSet,
  waterFill,
  wantOf,
} from '../../src/shaper/shares.js';

const C = 1000e6;
const sum = (xs: number[]) => xs.reduce((a, b) => a + b, 0);
const near = (a: number, b: number) => Math.abs(a - b) < 1;

test('idle shards: an even split (headroom for whoever starts)', (t) => {
  const s = waterFill(
    C,
    [0, 1, 2, 3].map(() => ({ floor: 0, rate: 0, share: C / 4, weight: 0 })),
  );
  t.true(
    s.every((v) => near(v, C / 4)),
    String(s),
  );
});

test('one saturated shard takes all but what the others send times HEADROOM and their least shares', (t) => {
  const s = waterFill(C, [
    { floor: 0, rate: 240e6, share: 250e6, weight: 1 },
    { floor: 0, rate: 10e6, share: 250e6, weight: 1 },
    { floor: 0, rate: 0, share: 250e6, weight: 0 },
  ]);
  t.true(near(sum(s), C));
  t.true(near(s[1] ?? 0, 10e6 * HEADROOM), `the busy-but-unsaturated shard gets its rate times HEADROOM: ${s[1]}`);
  t.true(near(s[2] ?? 0, (C / 3) * LEAST_SHARE), `the idle one its least share: ${s[2]}`);
  t.true(near(s[0] ?? 0, C - 15e6 - (C / 3) * LEAST_SHARE));
});

test('saturated shards split by their active pods; floors (guarantees) first', (t) => {
  const s = waterFill(C, [
    { floor: 0, rate: 500e6, share: 500e6, weight: 1 },
    { floor: 0, rate: 500e6, share: 500e6, weight: 3 },
  ]);
  const least = (C / 2) * LEAST_SHARE;
  t.true(near(s[0] ?? 0, least + (C - 2 * least) / 4) && near(s[1] ?? 0, least + ((C - 2 * least) * 3) / 4), String(s));
  const g = waterFill(C, [
    { floor: 600e6, rate: 100e6, share: 500e6, weight: 1 },
    { floor: 0, rate: 500e6, share: 500e6, weight: 1 },
  ]);
  t.true((g[0] ?? 0) >= 600e6, `the guarantees of a shard hold whatever it sends: ${g}`);
  t.true(near(sum(g), C));
});

test('floors past the capacity: in proportion, never more than the capacity', (t) => {
  const s = waterFill(C, [
    { floor: 800e6, rate: 0, share: 500e6, weight: 0 },
    { floor: 800e6, rate: 0, share: 500e6, weight: 0 },
  ]);
  t.true(near(s[0] ?? 0, C / 2) && near(sum(s), C));
});

test('a shard is saturated at SATURATED of its share', (t) => {
  const below = waterFill(C, [
    { floor: 0, rate: SATURATED * 100e6 - 1e6, share: 100e6, weight: 1 },
    { floor: 0, rate: 900e6, share: 900e6, weight: 1 },
  ]);
  t.true(near(below[0] ?? 0, (SATURATED * 100e6 - 1e6) * HEADROOM), String(below));
  const at = waterFill(C, [
    { floor: 0, rate: SATURATED * 100e6, share: 100e6, weight: 1 },
    { floor: 0, rate: 900e6, share: 900e6, weight: 1 },
  ]);
  t.true(near(at[0] ?? 0, C / 2), `both saturated: halves (${at})`);
});

test('sharesToSet: only moves of CHANGE of an even split, or a share under its floor; rounded down to kbit/s', (t) => {
  const even = C / 2;
  t.is(sharesToSet(C, [even, even], [even + CHANGE * even * 0.5, even - CHANGE * even * 0.5], [0, 0]), undefined);
  t.deepEqual(sharesToSet(C, [even, even], [even + CHANGE * even, even - CHANGE * even], [0, 0]), [525e6, 475e6]);
  t.deepEqual(sharesToSet(C, [even, even], [even + 1500, even - 1500], [even + 1000, 0]), [500_001_000, 499_998_000]);
  t.true(sum(sharesToSet(C, [0, 0], [333_333_333.7, 666_666_666.3], [0, 0]) ?? []) <= C);
});

test('ShardShares: even at first; a restart keeps sane shares it finds, else stays even', (t) => {
  const s = new ShardShares(C, ['kif0', 'kif0.1', 'kif0.2', 'kif0.3']);
  t.deepEqual(s.all(), [250e6, 250e6, 250e6, 250e6]);
  t.deepEqual(s.tree(1), { capacity: C, share: 250e6 });
  t.false(s.adopt([500e6, 500e6, 250e6, 250e6]), 'more than the capacity');
  t.false(s.adopt([500e6, undefined, 250e6, 250e6]), 'a shard without its node class');
  t.deepEqual(s.all(), [250e6, 250e6, 250e6, 250e6]);
  t.true(s.adopt([700e6, 100e6, 100e6, 100e6]));
  t.deepEqual(s.all(), [700e6, 100e6, 100e6, 100e6]);
  t.regex(s.lines()[0] ?? '', /^class replace dev kif0 parent 1: classid 1:fffe htb rate 700000000bit ceil 700000000bit /);
  // A change: the shares that drop come first, so the sum never passes the capacity between two lines.
  const lines = s.change([400e6, 400e6, 100e6, 100e6]);
  t.regex(lines[0] ?? '', /^class replace dev kif0 .* rate 400000000bit /);
  t.regex(lines[3] ?? '', /^class replace dev kif0\.1 .* rate 400000000bit /);
  t.deepEqual(s.all(), [400e6, 400e6, 100e6, 100e6]);
});

test('bands between shards: an active pod weighs 16, 4 or 1 by band, so band 0 on one shard takes most from band 2 on another', (t) => {
  t.deepEqual([0, 1, 2, 5].map(bandWeight), [16, 4, 1, 1]);
  const s = waterFill(C, [
    { floor: 0, rate: 500e6, share: 500e6, weight: bandWeight(0) },
    { floor: 0, rate: 500e6, share: 500e6, weight: bandWeight(2) },
  ]);
  t.true((s[0] ?? 0) / C >= 0.9, `band 0's shard: ${((s[0] ?? 0) / C).toFixed(3)} of the capacity (the trees' goal: >= 0.75)`);
});

test('a shard that wanted more within HOLD_MS keeps its share through a pause (a retransmission timeout), and the split leaves it there', (t) => {
  const total = 40e6;
  const a = { floor: 0, rate: 19.5e6, share: 20e6, weight: 1 };
  // b's flow waits out an RTO: it sent nothing this tick, but wanted more a tick ago.
  t.is(wantOf({ floor: 0, rate: 0, share: 20e6, weight: 0, held: true }), 20e6, 'held: its share');
  t.deepEqual(waterFill(total, [a, { floor: 0, rate: 0, share: 20e6, weight: 0, held: true }]), [20e6, 20e6], 'kept through the pause');
  // Without the hold the pause hands it all to a, and b starts again from the least share.
  const [, bare] = waterFill(total, [a, { floor: 0, rate: 0, share: 20e6, weight: 0 }]);
  t.true((bare ?? 0) < 1e6, `no hold: ${bare}`);
  t.true(HOLD_MS >= 200, "at least TCP's least retransmission timeout");
});

test('a shard below SATURATED whose flows still grow (GROWING over the tick before) keeps its share; one that does not, or idles, gives it back', (t) => {
  const share = 90e6;
  t.is(wantOf({ floor: 0, rate: 30e6, share, weight: 1, last: 20e6 }), share, 'ramping into a share that just grew: kept');
  t.is(wantOf({ floor: 0, rate: 30e6 * GROWING, share, weight: 1, last: 30e6 }), share, 'exactly GROWING: kept');
  t.is(
    wantOf({ floor: 0, rate: 30e6, share, weight: 1, last: 30e6 }),
    30e6 * HEADROOM,
    'steady below its share: what it sends and headroom',
  );
  t.is(wantOf({ floor: 0, rate: 30e6, share, weight: 1 }), 30e6 * HEADROOM, 'no tick before: not growing');
  t.is(wantOf({ floor: 0, rate: 0, share, weight: 1, last: 0 }), 0, 'idle: nothing');
  t.is(wantOf({ floor: 0, rate: share * SATURATED, share, weight: 1, last: 1e9 }), Number.POSITIVE_INFINITY, 'saturated: more');
  t.is(
    wantOf({ floor: 0, rate: 1e6, share: 1.4e6, weight: 1, last: 1e6, limited: true }),
    Number.POSITIVE_INFINITY,
    'its class went over its ceil (a backlog waits) though it sent under SATURATED of its share: more',
  );
  // Band 0 ramping on one shard keeps its weighted part (16 to 1) against a saturated band-2 shard;
  // steady at the same rate it would give all but HEADROOM times its rate away.
  const loads = (last: number) => [
    { floor: 0, rate: 40e6, share: 94e6, weight: 16, last },
    { floor: 0, rate: 5.9e6, share: 6e6, weight: 1, last: 5.9e6 },
  ];
  const [a, b] = waterFill(100e6, loads(25e6));
  const least = 50e6 * LEAST_SHARE;
  t.is(Math.round(a ?? 0), Math.round(least + ((100e6 - 2 * least) * 16) / 17), 'ramping: its weighted part');
  t.is(Math.round(b ?? 0), Math.round(least + (100e6 - 2 * least) / 17));
  t.is(waterFill(100e6, loads(40e6))[0], 40e6 * HEADROOM, 'steady: what it sends and headroom');
});
