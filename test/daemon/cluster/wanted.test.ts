/**
 * wantedShaping (src/daemon/cluster/wanted.ts): a pod's wanted limits as one pure function of its
 * own rates, annotations, namespace policy, ask and the node's capacity, and what it has now; the
 * ADD path and every live re-shape call it.
 */
import test from 'ava';
import type { NodeCapacity } from '../../../src/bandwidth/capacity.js';
import { NAMESPACE_ANNOTATIONS } from '../../../src/bandwidth/namespace-policy.js';
import { wantedShaping } from '../../../src/daemon/cluster/wanted.js';

const M = 1e6;
const IN = 'kubernetes.io/ingress-bandwidth';
const EG = 'kubernetes.io/egress-bandwidth';
const CAP: NodeCapacity = { egress: 1000 * M, ingress: 1000 * M, source: { egress: 'config', ingress: 'config' } };
const policy = {
  [NAMESPACE_ANNOTATIONS.default.ingress]: '5M',
  [NAMESPACE_ANNOTATIONS.max.egress]: '20M',
  [NAMESPACE_ANNOTATIONS.total.egress]: '50M',
};

test("the runtime's rates win over the annotations; without either, nothing", (t) => {
  const w = wantedShaping({ own: { egress: 7 * M }, annotations: { [EG]: '9M' }, namespace: 'a' });
  t.deepEqual(w.limits, { egress: 7 * M });
  t.is(w.sources, undefined, 'no policy: no sources recorded');
  t.deepEqual(wantedShaping({ namespace: 'a' }).limits, {});
});

test("the annotations' rates; one that cannot be parsed throws", (t) => {
  t.deepEqual(wantedShaping({ annotations: { [IN]: '10M', [EG]: '1G' }, namespace: 'a' }).limits, { ingress: 10 * M, egress: 1000 * M });
  t.throws(() => wantedShaping({ annotations: { [IN]: 'ten' }, namespace: 'a' }), { message: /kubernetes\.io\/ingress-bandwidth/ });
});

test("the namespace's default, ceiling and total, with their sources and the capped ask", (t) => {
  const w = wantedShaping({ annotations: { [EG]: '30M' }, policy, namespace: 'team' });
  t.deepEqual(w.limits, { ingress: 5 * M, egress: 20 * M, egressTotal: 50 * M });
  t.deepEqual(w.sources, { ingress: 'namespace-default', egress: 'namespace-ceiling' });
  t.deepEqual(
    w.resolved.capped.map((c) => [c.direction, c.asked, c.ceiling]),
    [['egress', 30 * M, 20 * M]],
  );
});

test('a re-shape keeps what the new rates leave alone (guarantees, band, a burst whose rate stays) and follows the totals', (t) => {
  const current = { limits: { egress: 10 * M, egressBurst: 123_456, egressGuarantee: 5 * M, priority: 1, ingressTotal: 9 * M } };
  t.deepEqual(wantedShaping({ annotations: { [EG]: '10M' }, namespace: 'a', current }).limits, {
    egress: 10 * M,
    egressBurst: 123_456,
    egressGuarantee: 5 * M,
    priority: 1,
  });
  t.deepEqual(wantedShaping({ annotations: { [EG]: '12M' }, namespace: 'a', current }).limits, {
    egress: 12 * M,
    egressGuarantee: 5 * M,
    priority: 1,
  });
});

test('keepRates: only the guarantees and band are resolved; the rates and their sources stay', (t) => {
  const current = { limits: { ingress: 3 * M }, sources: { ingress: 'namespace-default' as const } };
  const w = wantedShaping({
    annotations: {},
    namespace: 'a',
    current,
    keepRates: true,
    ask: { guarantees: { egress: 40 * M }, qosClass: 'Burstable' },
    node: { capacity: CAP },
  });
  t.deepEqual(w.limits, { ingress: 3 * M, egressGuarantee: 40 * M, priority: 1 });
  t.deepEqual(w.sources, current.sources);
});

test('the ask enters only where the node hands out guarantees: with a capacity, a ceiling below a guarantee raised; without one, a Warning and no guarantee', (t) => {
  const ask = { guarantees: { egress: 40 * M }, qosClass: 'Guaranteed' };
  const on = wantedShaping({ annotations: { [EG]: '30M' }, namespace: 'a', ask, node: { capacity: CAP } });
  t.deepEqual(on.limits, { egress: 40 * M, egressGuarantee: 40 * M, priority: 0 });
  t.deepEqual(
    on.notes.map((n) => n.reason),
    ['BandwidthCeilingRaised'],
  );
  const off = wantedShaping({ annotations: { [EG]: '30M' }, namespace: 'a', ask, node: { capacity: undefined } });
  t.deepEqual(off.limits, { egress: 30 * M });
  t.deepEqual(
    off.notes.map((n) => n.reason),
    ['BandwidthGuaranteeUnavailable'],
  );
  t.deepEqual(wantedShaping({ annotations: { [EG]: '30M' }, namespace: 'a', ask }).limits, { egress: 30 * M }, 'static mode: no ask');
});
