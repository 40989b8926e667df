/**
 * A namespace's total split over the shards its pods are on (src/shaper/groups.ts GroupSplit): pure,
 * the lines it asks for and the shares it keeps.
 */
import test from 'ava';
import { GroupSplit, type GroupMember } from '../../src/shaper/groups.js';

const TREE = { capacity: 1e9 };
const GID = 0x1001;
const split = () => new GroupSplit((d) => (d === 'egress' ? TREE : undefined));
const m = (ifb: string, guarantee = 0, veth?: string): GroupMember => ({ ifb, guarantee, band: 1, ...(veth ? { veth } : {}) });
/** The ceil a line gives the namespace class, bits/s (tc's own notation: rate and ceil in bit). */
const ceilOf = (line: string) => Number(/ ceil (\d+)bit/.exec(line)?.[1] ?? NaN);
const devOf = (line: string) => / dev (\S+) /.exec(line)?.[1];

test('one shard: the whole total; two: even, each guaranteed its pods first; the lines make the class on each shard', (t) => {
  const g = split();
  const one = g.sync('egress', GID, 40e6, [m('ifb0'), m('ifb0')]);
  t.is(one.replace.length, 1);
  t.regex(one.replace[0] ?? '', /^class replace dev ifb0 parent 1:fffe classid 1:1001 htb /);
  t.is(ceilOf(one.replace[0] ?? ''), 40e6);
  t.deepEqual(one.del, []);

  const two = g.sync('egress', GID, 40e6, [m('ifb0', 10e6), m('ifb1')]);
  const by = new Map(two.replace.map((l) => [devOf(l), ceilOf(l)]));
  // Floors: 10M on ifb0, 2 % of an even split on ifb1; the 29.6M left split evenly.
  t.is(by.get('ifb0'), 24.8e6);
  t.is(by.get('ifb1'), 15.2e6);
  t.is(
    [...by.values()].reduce((a, b) => a + b, 0),
    40e6,
    'the shares add up to the total',
  );
  t.is(devOf(two.replace[0] ?? ''), 'ifb0', 'the shrinking share first (ifb0 had the whole total)');
});

test('the split is kept while its shards, total and floors allow; split anew when one changes', (t) => {
  const g = split();
  g.sync('egress', GID, 40e6, [m('ifb0'), m('ifb1')]);
  const [view] = g.views('egress', () => [m('ifb0', 0, 'v0'), m('ifb1', 0, 'v1')]);
  t.truthy(view);
  if (!view) return;
  g.change('egress', view, [30e6, 10e6]);
  const kept = g.sync('egress', GID, 40e6, [m('ifb0'), m('ifb1'), m('ifb1')]);
  t.deepEqual(
    kept.replace.map((l) => [devOf(l), ceilOf(l)]),
    [
      ['ifb0', 30e6],
      ['ifb1', 10e6],
    ],
    'another pod on a shard it is on: the moved shares stay',
  );
  const floor = g.sync('egress', GID, 40e6, [m('ifb0'), m('ifb1', 15e6)]);
  t.is(new Map(floor.replace.map((l) => [devOf(l), ceilOf(l)])).get('ifb1'), 27.3e6, "a guarantee above its shard's share: split anew");
  t.deepEqual(
    g.sync('egress', GID, 40e6, [m('ifb0'), m('ifb2')]).replace.map((l) => [devOf(l), ceilOf(l)]),
    [
      ['ifb0', 20e6],
      ['ifb2', 20e6],
    ],
    'as many shards, but another one: split anew',
  );
  const total = g.sync('egress', GID, 20e6, [m('ifb0'), m('ifb1')]);
  t.deepEqual(total.replace.map(ceilOf), [10e6, 10e6], 'another total: split anew');
  g.invalidate('egress', GID);
  g.change('egress', { ...view, total: 20e6 }, [15e6, 5e6]);
  t.deepEqual(g.sync('egress', GID, 20e6, [m('ifb0'), m('ifb1')]).replace.map(ceilOf), [15e6, 5e6], 'a change records the shares again');
  g.invalidate('egress', GID);
  t.deepEqual(g.sync('egress', GID, 20e6, [m('ifb0'), m('ifb1')]).replace.map(ceilOf), [10e6, 10e6], 'after a failed batch: split anew');
});

test("a shard without the namespace's pods loses its class (a delete, run after the pods' own); the last pod takes the last", (t) => {
  const g = split();
  g.sync('egress', GID, 40e6, [m('ifb0'), m('ifb1')]);
  const left = g.sync('egress', GID, 40e6, [m('ifb0')]);
  t.deepEqual(left.del, ['class del dev ifb1 classid 1:1001']);
  t.deepEqual(left.replace.map(ceilOf), [40e6], 'the shard left has the whole total');
  const none = g.sync('egress', GID, 40e6, []);
  t.deepEqual(none, { replace: [], del: ['class del dev ifb0 classid 1:1001'] });
  t.deepEqual(g.sync('egress', GID, 40e6, []), { replace: [], del: [] }, 'nothing more to delete');
});

test('views: only namespaces on several shards, with each shard floor, share and veths; none without a tree that way', (t) => {
  const g = split();
  g.sync('egress', GID, 40e6, [m('ifb0', 5e6)]);
  t.deepEqual(
    g.views('egress', () => [m('ifb0', 5e6, 'v0')]),
    [],
    'one shard: nothing to move',
  );
  g.sync('egress', GID, 40e6, [m('ifb0', 5e6), m('ifb1')]);
  const views = g.views('egress', () => [m('ifb0', 5e6, 'v0'), m('ifb1', 0, 'v1'), m('ifb1')]);
  t.deepEqual(views, [
    {
      gid: GID,
      total: 40e6,
      shards: [
        { ifb: 'ifb0', floor: 5e6, share: 22.3e6, veths: [{ veth: 'v0', band: 1, guarantee: 5e6 }] },
        { ifb: 'ifb1', floor: 0, share: 17.7e6, veths: [{ veth: 'v1', band: 1, guarantee: 0 }] },
      ],
    },
  ]);
  t.deepEqual(
    g.views('egress', () => [m('ifb0')]),
    [],
    'its shards changed since: the next sync sees them first',
  );
  t.deepEqual(split().sync('ingress', GID, 40e6, [m('ifb0.in')]), { replace: [], del: [] }, 'no ingress tree: no class');
});
