/**
 * The agent's whole /metrics exposition, parsed by a strict reader (src/cli/prom-text.ts: a second
 * TYPE, a TYPE after samples, a series twice, a bad escape all fail): valid with every family
 * present, label values escaped; the info families `kubectl kubenet status` reads (kubenet_info,
 * kubenet_pod_info for every ready pod, shaped or not) and the counters' read time.
 */
import test from 'ava';
import { AgentMetrics, infoSeries, type AgentInfo } from '../../../src/daemon/http/metrics.js';
import type { PodRecord, PodTraffic } from '../../../src/pod/index.js';
import { parseExposition, samplesOf } from '../../../src/cli/prom-text.js';
import { snapshotOf } from '../../../src/cli/cluster-view.js';
import { podRecord } from '../../kit/fake-core.js';

const M = 1_000_000;
const INFO: AgentInfo = {
  node: 'node-a',
  version: '0.2.0',
  podCIDR: '10.244.1.0/24,fd00:10:244:1::/64',
  bridge: 'cbr0',
  ipam: 'host-local',
  routes: 'direct',
};

function shaped(r: PodRecord, ingress?: number, egress?: number): PodTraffic {
  const dir = (bytes: number, limit: number | undefined) => ({
    limit: limit ?? 0,
    bytes,
    packets: 10,
    drops: 2,
    overlimits: 7,
    backlog: 0,
  });
  return {
    record: r,
    shaping: {
      id: r.containerId,
      hostVeth: 'v',
      ...(ingress !== undefined ? { ingress: dir(ingress, r.limits.ingress) } : {}),
      ...(egress !== undefined ? { egress: dir(egress, r.limits.egress) } : {}),
    },
  };
}

test('the whole exposition is valid text format: every family once, typed before its samples, no series twice, escapes read back', async (t) => {
  const odd = { ...podRecord('we"ird\\name\nx', { egress: 5 * M }, { namespace: 'ns' }), ips: ['10.0.0.9'] };
  const gold = {
    ...podRecord('gold', { ingress: 40 * M, egress: 100 * M, egressGuarantee: 60 * M, priority: 0 }),
    ips: ['10.0.0.2', 'fd00::2'],
  };
  // A second attachment of the same pod (another interface): one pod_info series with both attachments' addresses.
  const goldNet1 = { ...podRecord('gold', {}, { id: 'gold-id' }), ifName: 'net1', ips: ['192.168.9.2'] };
  const plain = { ...podRecord('plain', {}), ips: ['10.0.0.3'] };
  const adding = { ...podRecord('adding', {}), phase: 'adding' as const, ips: [] };
  const records = [odd, gold, goldNet1, plain, adding];
  const m = new AgentMetrics(() => INFO);
  m.observe('ADD', 0.02, undefined);
  m.observe('DEL', 0.5, 7);
  const { body } = await m.text(records, 1, [shaped(odd, undefined, 1000), shaped(gold, 2000, 3000)], 1_700_000_000_250);
  const families = parseExposition(body);

  t.is(families.get('kubenet_cni_add_seconds')?.type, 'histogram');
  t.true(samplesOf(families, 'kubenet_cni_add_seconds_bucket').length > 3, 'histogram buckets belong to their family');
  t.is(samplesOf(families, 'kubenet_cni_errors_total', { command: 'DEL', code: '7' })[0]?.value, 1);
  t.is(samplesOf(families, 'kubenet_pods')[0]?.value, 4, 'the ready attachments');

  const info = samplesOf(families, 'kubenet_info');
  t.is(info.length, 1);
  t.deepEqual(info[0]?.labels, {
    node: 'node-a',
    version: '0.2.0',
    pod_cidr: '10.244.1.0/24,fd00:10:244:1::/64',
    bridge: 'cbr0',
    ipam: 'host-local',
    routes: 'direct',
  });
  t.is(info[0]?.value, 1);
  t.is(families.get('kubenet_info')?.type, 'gauge');

  const podInfo = samplesOf(families, 'kubenet_pod_info').map((s) => s.labels);
  t.deepEqual(
    podInfo,
    [
      { namespace: 'ns', pod: 'we"ird\\name\nx', ips: '10.0.0.9' },
      { namespace: 'default', pod: 'gold', ips: '10.0.0.2,fd00::2,192.168.9.2' },
      { namespace: 'default', pod: 'plain', ips: '10.0.0.3' },
    ],
    'every ready pod once, shaped or not; a pod still being added has none',
  );
  t.is(samplesOf(families, 'kubenet_pod_counters_read_timestamp_seconds')[0]?.value, 1_700_000_000.25);

  // Only the *_info families carry labels beyond namespace, pod, direction, source (and prom-client's own).
  for (const f of families.values()) {
    if (!f.name.startsWith('kubenet_pod_')) continue;
    for (const s of f.samples) {
      const extra = Object.keys(s.labels).filter((k) => !['namespace', 'pod', 'direction', 'source'].includes(k));
      t.deepEqual(extra, f.name === 'kubenet_pod_info' ? ['ips'] : [], `${s.name} labels`);
    }
  }

  // What kubectl kubenet reads of it.
  const snap = snapshotOf(families, 0);
  t.deepEqual(snap.info, {
    node: 'node-a',
    version: '0.2.0',
    podCIDR: '10.244.1.0/24,fd00:10:244:1::/64',
    bridge: 'cbr0',
    ipam: 'host-local',
    routes: 'direct',
  });
  t.is(snap.countersReadAtS, 1_700_000_000.25);
  t.deepEqual(snap.pods.get('default/gold'), {
    namespace: 'default',
    pod: 'gold',
    ips: ['10.0.0.2', 'fd00::2', '192.168.9.2'],
    directions: {
      ingress: { limit: 40 * M, source: 'pod', bytes: 2000, drops: 2, overlimits: 7 },
      egress: { limit: 100 * M, source: 'pod', bytes: 3000, drops: 2, overlimits: 7, guarantee: 60 * M },
    },
  });
  t.deepEqual(snap.pods.get('default/plain'), { namespace: 'default', pod: 'plain', ips: ['10.0.0.3'], directions: {} });
  t.is(snap.pods.get('ns/we"ird\\name\nx')?.directions.egress?.bytes, 1000);
});

test('info series: no pod CIDR yet is an empty label; without info or a read time, only kubenet_pod_info', (t) => {
  const none = parseExposition(infoSeries({ ...INFO, podCIDR: undefined }, []));
  t.is(samplesOf(none, 'kubenet_info')[0]?.labels.pod_cidr, '');
  t.is(samplesOf(none, 'kubenet_pod_info').length, 0);
  t.is(none.get('kubenet_pod_info')?.type, 'gauge', 'HELP and TYPE also without series');
  const bare = parseExposition(infoSeries(undefined, [podRecord('a', {})]));
  t.deepEqual([...bare.keys()], ['kubenet_pod_info']);
});

test("the node's trees: each shard's share by direction and shard, and whether best-effort pods are in the trees; none without a capacity", async (t) => {
  let view = {
    shares: [
      { direction: 'egress' as const, ifb: 'kubenet-ifb0', share: 60e6 },
      { direction: 'egress' as const, ifb: 'kubenet-ifb0.1', share: 40e6 },
      { direction: 'ingress' as const, ifb: 'kubenet-ifb0.in', share: 100e6 },
    ],
    steered: { egress: true, ingress: false } as { egress?: boolean; ingress?: boolean },
  };
  const m = new AgentMetrics(
    () => INFO,
    undefined,
    () => view,
  );
  const families = parseExposition((await m.text([], 0, [], undefined)).body);
  t.is(families.get('kubenet_node_bandwidth_share_bits_per_second')?.type, 'gauge');
  t.deepEqual(
    samplesOf(families, 'kubenet_node_bandwidth_share_bits_per_second').map((s) => [s.labels.direction, s.labels.shard, s.value]),
    [
      ['egress', 'kubenet-ifb0', 60e6],
      ['egress', 'kubenet-ifb0.1', 40e6],
      ['ingress', 'kubenet-ifb0.in', 100e6],
    ],
  );
  t.deepEqual(
    samplesOf(families, 'kubenet_node_best_effort_in_trees').map((s) => [s.labels.direction, s.value]),
    [
      ['egress', 1],
      ['ingress', 0],
    ],
  );
  // The shares moved and the ingress tree went: the next scrape shows only what is.
  view = { shares: [{ direction: 'egress', ifb: 'kubenet-ifb0', share: 100e6 }], steered: { egress: false } };
  const next = parseExposition((await m.text([], 0, [], undefined)).body);
  t.deepEqual(
    samplesOf(next, 'kubenet_node_bandwidth_share_bits_per_second').map((s) => [s.labels.shard, s.value]),
    [['kubenet-ifb0', 100e6]],
  );
  t.deepEqual(
    samplesOf(next, 'kubenet_node_best_effort_in_trees').map((s) => [s.labels.direction, s.value]),
    [['egress', 0]],
  );
  view = { shares: [], steered: {} };
  const none = parseExposition((await m.text([], 0, [], undefined)).body);
  t.deepEqual(samplesOf(none, 'kubenet_node_bandwidth_share_bits_per_second'), []);
  t.deepEqual(samplesOf(none, 'kubenet_node_best_effort_in_trees'), []);
});
