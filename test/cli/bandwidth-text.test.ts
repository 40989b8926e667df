/** `kubenet status`'s bandwidth lines (src/cli/bandwidth-text.ts): capacity, guarantees, the trees' shares and steering. Pure. */
import test from 'ava';
import { bandwidthLines, treesSummary } from '../../src/cli/bandwidth-text.js';
import { renderTop } from '../../src/cli/top.js';
import type { StatusReport } from '../../src/daemon/agent.js';
import type { BandwidthReport } from '../../src/daemon/cluster/pod-guarantees.js';

const M = 1e6;
const report: BandwidthReport = {
  capacity: { egress: 100 * M, ingress: 100 * M },
  description: 'egress 100M (config), ingress 100M (config)',
  committed: { egress: 60 * M, ingress: 120 * M },
  free: { egress: 40 * M, ingress: -20 * M },
};

test('each direction: guaranteed, free (or over) of the capacity; with the trees, the shards and their shares, and where best-effort pods are', (t) => {
  const lines = bandwidthLines(report, {
    shares: [
      { direction: 'egress', ifb: 'kubenet-ifb0', share: 40 * M },
      { direction: 'egress', ifb: 'kubenet-ifb0.1', share: 60 * M },
      { direction: 'ingress', ifb: 'kubenet-ifb0.in', share: 100 * M },
    ],
    steered: { egress: false, ingress: true },
  });
  t.deepEqual(lines, [
    'capacity: egress 100M (config), ingress 100M (config)',
    '  egress  60M guaranteed, 40M free of 100M',
    '          2 shards, shares 40M / 60M; pods that asked for nothing kept out (node far from its capacity)',
    '  ingress 120M guaranteed, over by 20M of 100M',
    '          1 tree, at 100M; pods that asked for nothing in the trees (node near its capacity)',
  ]);
});

test('without the trees (an older agent, or none yet) the lines are as before; no capacity either way is one line', (t) => {
  t.deepEqual(bandwidthLines(report), [
    'capacity: egress 100M (config), ingress 100M (config)',
    '  egress  60M guaranteed, 40M free of 100M',
    '  ingress 120M guaranteed, over by 20M of 100M',
  ]);
  t.deepEqual(bandwidthLines(report, { shares: [], steered: {} }).length, 3);
  const off: BandwidthReport = {
    capacity: {},
    description: 'unknown',
    committed: { egress: 0, ingress: 0 },
    free: {},
    off: { egress: 'why', ingress: 'why' },
  };
  t.deepEqual(bandwidthLines(off), ['guarantees: off: why']);
  const half: BandwidthReport = { ...report, capacity: { egress: 100 * M }, free: { egress: 40 * M }, off: { ingress: 'no link speed' } };
  t.deepEqual(bandwidthLines(half, { shares: [{ direction: 'egress', ifb: 'i', share: 100 * M }], steered: {} }), [
    'capacity: egress 100M (config), ingress 100M (config)',
    '  egress  60M guaranteed, 40M free of 100M',
    '          1 tree, at 100M',
    '  ingress guarantees off: no link speed',
  ]);
});

test("kubenet top: one line under the header with each direction's shares and where best-effort pods are; empty without trees", (t) => {
  const trees = {
    shares: [
      { direction: 'egress' as const, ifb: 'a', share: 40 * M },
      { direction: 'egress' as const, ifb: 'b', share: 60 * M },
      { direction: 'ingress' as const, ifb: 'c', share: 100 * M },
    ],
    steered: { egress: false, ingress: true },
  };
  t.is(treesSummary(trees), 'trees: egress 40M/60M, best effort out  ingress 100M, best effort in');
  t.is(treesSummary({ shares: [], steered: {} }), undefined);
  const s: StatusReport = { podCIDR: '10.0.0.0/24', bridge: 'b', ready: true, pods: [], trees };
  t.is(renderTop(s, { intervalS: 1 })[1], 'trees: egress 40M/60M, best effort out  ingress 100M, best effort in');
  t.is(renderTop({ ...s, trees: undefined }, { intervalS: 1 })[1], '');
});
