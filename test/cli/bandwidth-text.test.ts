/** `kubenet status`'s bandwidth lines (src/cli/bandwidth-text.ts): capacity, guarantees, the trees' shares and steering. Pure. */
import test from 'ava';
import { bandwidthLines } from '../../src/cli/bandwidth-text.js';
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
