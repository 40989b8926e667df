/**
 * The namespace bandwidth policy resolver (src/bandwidth/namespace-policy.ts): pod annotations and
 * namespace annotations in, limits with the source of each direction, the capped asks and the
 * refused namespace values out. Pure: exact outputs, no root.
 */
import test from 'ava';
import { ConfigError } from '../../src/errors.js';
import {
  applyNamespacePolicy,
  cappedAskMessage,
  cappedMessage,
  capToCeilings,
  describeSourcedLimits,
  NAMESPACE_ANNOTATIONS,
  NAMESPACE_POLICY_ANNOTATIONS,
  policyAnnotations,
  rawPolicy,
  resolveLimits,
  sourceTag,
} from '../../src/bandwidth/namespace-policy.js';
import { sameSources } from '../../src/bandwidth/limits.js';

const M = 1e6;
const IN = 'kubernetes.io/ingress-bandwidth';
const EG = 'kubernetes.io/egress-bandwidth';
const DEF_IN = 'kubenet.io/default-ingress-bandwidth';
const DEF_EG = 'kubenet.io/default-egress-bandwidth';
const MAX_IN = 'kubenet.io/max-ingress-bandwidth';
const MAX_EG = 'kubenet.io/max-egress-bandwidth';
const TOT_IN = 'kubenet.io/max-ingress-bandwidth-total';
const TOT_EG = 'kubenet.io/max-egress-bandwidth-total';

test('the annotation names, defined once', (t) => {
  t.deepEqual(NAMESPACE_ANNOTATIONS, {
    default: { ingress: DEF_IN, egress: DEF_EG },
    max: { ingress: MAX_IN, egress: MAX_EG },
    total: { ingress: TOT_IN, egress: TOT_EG },
  });
  t.deepEqual([...NAMESPACE_POLICY_ANNOTATIONS].sort(), [DEF_EG, DEF_IN, MAX_EG, TOT_EG, MAX_IN, TOT_IN]);
});

test("a namespace without policy changes nothing: the pod's own limits, bursts included, source pod", (t) => {
  const own = { ingress: 20 * M, ingressBurst: 8000, egress: 5 * M };
  for (const ns of [undefined, {}, { 'other/annotation': 'x', [IN]: '1M' }] as Array<Record<string, string> | undefined>) {
    const r = applyNamespacePolicy(own, ns);
    t.deepEqual(r, { limits: own, sources: { ingress: 'pod', egress: 'pod' }, capped: [], problems: [], policy: false });
    t.is(r.limits, own, 'the very same object');
  }
  t.deepEqual(resolveLimits({}, {}), { limits: {}, sources: {}, capped: [], problems: [], policy: false });
});

test('defaults fill the directions a pod asks nothing for; its own limits stand', (t) => {
  const ns = { [DEF_IN]: '10M', [DEF_EG]: '5M' };
  t.deepEqual(resolveLimits({}, ns), {
    limits: { ingress: 10 * M, egress: 5 * M },
    sources: { ingress: 'namespace-default', egress: 'namespace-default' },
    capped: [],
    problems: [],
    policy: true,
  });
  t.deepEqual(resolveLimits({ [EG]: '50M' }, ns), {
    limits: { ingress: 10 * M, egress: 50 * M },
    sources: { ingress: 'namespace-default', egress: 'pod' },
    capped: [],
    problems: [],
    policy: true,
  });
  t.deepEqual(resolveLimits({ [IN]: '1M', [EG]: '2M' }, ns).sources, { ingress: 'pod', egress: 'pod' });
});

test('a ceiling: a pod above it gets the ceiling (capped), at or below keeps its own, one asking nothing gets the ceiling uncapped', (t) => {
  const ns = { [MAX_IN]: '20M', [MAX_EG]: '10M' };
  t.deepEqual(resolveLimits({ [IN]: '50M', [EG]: '10M' }, ns), {
    limits: { ingress: 20 * M, egress: 10 * M },
    sources: { ingress: 'namespace-ceiling', egress: 'pod' },
    capped: [{ direction: 'ingress', asked: 50 * M, ceiling: 20 * M }],
    problems: [],
    policy: true,
  });
  t.deepEqual(resolveLimits({ [IN]: '5M' }, ns), {
    limits: { ingress: 5 * M, egress: 10 * M },
    sources: { ingress: 'pod', egress: 'namespace-ceiling' },
    capped: [],
    problems: [],
    policy: true,
  });
  t.deepEqual(resolveLimits({}, { [MAX_EG]: '10M' }), {
    limits: { egress: 10 * M },
    sources: { egress: 'namespace-ceiling' },
    capped: [],
    problems: [],
    policy: true,
  });
});

test('default and ceiling together; a default above its ceiling gives the ceiling and says so', (t) => {
  const ns = { [DEF_IN]: '10M', [MAX_IN]: '20M', [DEF_EG]: '30M', [MAX_EG]: '15M' };
  const r = resolveLimits({}, ns, 'team-a');
  t.deepEqual(r.limits, { ingress: 10 * M, egress: 15 * M });
  t.deepEqual(r.sources, { ingress: 'namespace-default', egress: 'namespace-ceiling' });
  t.deepEqual(r.capped, []);
  t.deepEqual(r.problems, [
    'annotation kubenet.io/default-egress-bandwidth 30M of namespace team-a is above its ceiling kubenet.io/max-egress-bandwidth 15M; the ceiling applies',
  ]);
  t.deepEqual(resolveLimits({ [IN]: '25M' }, ns, 'team-a').capped, [{ direction: 'ingress', asked: 25 * M, ceiling: 20 * M }]);
});

test('runtimeConfig limits: a burst stays with a rate that stands and goes with a capped one', (t) => {
  const r = applyNamespacePolicy(
    { ingress: 50 * M, ingressBurst: 1e6, egress: 1 * M, egressBurst: 2e5 },
    { [MAX_IN]: '20M', [MAX_EG]: '20M' },
  );
  t.deepEqual(r.limits, { ingress: 20 * M, egress: 1 * M, egressBurst: 2e5 });
  t.deepEqual(Object.keys(r.limits), ['ingress', 'egress', 'egressBurst'], "keys in the order the pod's own limits have them");
});

test('an invalid namespace value is ignored, named in problems; the rest of the policy applies', (t) => {
  const r = resolveLimits({ [IN]: '50M' }, { [MAX_IN]: 'lots', [DEF_EG]: '5M', [MAX_EG]: '0.5k' }, 'team-b');
  t.deepEqual(r.limits, { ingress: 50 * M, egress: 5 * M });
  t.deepEqual(r.sources, { ingress: 'pod', egress: 'namespace-default' });
  t.deepEqual(r.problems, [
    'namespace team-b: annotation kubenet.io/max-ingress-bandwidth: "lots" is not a bandwidth: want a number of bits/s with an optional suffix k, M, G, T (or Ki, Mi, Gi, Ti) and no space or unit, e.g. "10M" or "500k"; ignored',
    'namespace team-b: annotation kubenet.io/max-egress-bandwidth: bandwidth "0.5k" is below the minimum 1k (1000 bit/s); ignored',
  ]);
  t.true(r.policy);
  // Every key invalid: no policy, the pod's own limits as they came.
  const none = resolveLimits({ [IN]: '50M' }, { [MAX_IN]: '-1' });
  t.deepEqual([none.limits, none.sources, none.policy, none.problems.length], [{ ingress: 50 * M }, { ingress: 'pod' }, false, 1]);
});

test("the pod's own invalid value still throws, naming its annotation", (t) => {
  const err = t.throws(() => resolveLimits({ [EG]: '10 Mbit' }, { [MAX_EG]: '5M' }), { instanceOf: ConfigError });
  t.regex(err?.message ?? '', /kubernetes\.io\/egress-bandwidth/);
});

test('helpers: policy annotations kept, raw comparison, texts for Events, status and top', (t) => {
  t.deepEqual(policyAnnotations({ [MAX_IN]: '1M', other: 'x' }), { [MAX_IN]: '1M' });
  t.is(rawPolicy({ [MAX_IN]: '1M', other: 'x' }), rawPolicy({ [MAX_IN]: '1M' }));
  t.not(rawPolicy({ [MAX_IN]: '1M' }), rawPolicy({ [MAX_IN]: '2M' }));
  t.is(
    describeSourcedLimits({ ingress: 20 * M, egress: 5 * M }, { ingress: 'namespace-ceiling', egress: 'pod' }),
    'ingress 20M (namespace ceiling), egress 5M',
  );
  t.is(describeSourcedLimits({ egress: 10 * M }, { egress: 'namespace-default' }), 'egress 10M (namespace default)');
  t.is(describeSourcedLimits({ ingress: 1 * M }, undefined), 'ingress 1M');
  t.is(describeSourcedLimits({}, undefined), 'none');
  t.deepEqual(
    ['pod', 'namespace-default', 'namespace-ceiling', undefined].map((s) => sourceTag(s as never)),
    ['', 'ns-default', 'ns-ceiling', ''],
  );
  t.is(
    cappedMessage({ direction: 'egress', asked: 50 * M, ceiling: 20 * M }, 'team-a'),
    'kubernetes.io/egress-bandwidth 50M is above the ceiling kubenet.io/max-egress-bandwidth 20M of namespace team-a: egress limited to 20M',
  );
  t.true(sameSources(undefined, {}));
  t.false(sameSources({ ingress: 'pod' }, { ingress: 'namespace-ceiling' }));
});

test("kubenet shape's asks held to the ceilings: above or unlimited gets the ceiling, below stands, defaults and invalid ceilings do not apply", (t) => {
  const ns = { [MAX_EG]: '100M', [DEF_IN]: '5M', [MAX_IN]: 'lots' };
  t.deepEqual(capToCeilings({ egress: 500 * M, ingress: 50 * M }, ns, 'team'), {
    rates: { ingress: 50 * M, egress: 100 * M },
    capped: [{ direction: 'egress', asked: 500 * M, ceiling: 100 * M }],
  });
  t.deepEqual(
    capToCeilings({ egress: 100 * M }, ns, 'team'),
    { rates: { egress: 100 * M }, capped: [] },
    'at the ceiling: as asked; no ingress asked, no default forced',
  );
  t.deepEqual(capToCeilings({}, ns, 'team'), {
    rates: { egress: 100 * M },
    capped: [{ direction: 'egress', asked: undefined, ceiling: 100 * M }],
  });
  t.deepEqual(capToCeilings({ egress: 500 * M }, undefined), { rates: { egress: 500 * M }, capped: [] }, 'no namespace policy');
  t.is(
    cappedAskMessage({ direction: 'egress', asked: 500 * M, ceiling: 100 * M }, 'team'),
    'egress 500M is above the ceiling kubenet.io/max-egress-bandwidth 100M of namespace team: egress limited to 100M',
  );
  t.is(
    cappedAskMessage({ direction: 'ingress', asked: undefined, ceiling: 20 * M }, 'team'),
    'no ingress limit is above the ceiling kubenet.io/max-ingress-bandwidth 20M of namespace team: ingress limited to 20M',
  );
});

test("a namespace's totals (issue 33) ride in every pod's limits; the pod's own guarantees and band pass through", async (t) => {
  const {
    resolveLimits: resolve,
    applyNamespacePolicy: apply,
    NAMESPACE_POLICY_ANNOTATIONS: keys,
  } = await import('../../src/bandwidth/namespace-policy.js');
  t.true(keys.includes('kubenet.io/max-egress-bandwidth-total') && keys.includes('kubenet.io/max-ingress-bandwidth-total'));
  const r = resolve(
    { 'kubernetes.io/egress-bandwidth': '10M' },
    { 'kubenet.io/max-egress-bandwidth-total': '50M', 'kubenet.io/max-ingress-bandwidth-total': '1G' },
    'team-a',
  );
  t.deepEqual(r.limits, { egress: 10e6, ingressTotal: 1e9, egressTotal: 50e6 });
  t.true(r.policy);
  t.deepEqual(apply({ egressGuarantee: 5e6, priority: 0 }, { 'kubenet.io/max-egress-bandwidth-total': '50M' }).limits, {
    egressGuarantee: 5e6,
    priority: 0,
    egressTotal: 50e6,
  });
  const bad = resolve({}, { 'kubenet.io/max-egress-bandwidth-total': '50 M' }, 'team-a');
  t.deepEqual(bad.limits, {});
  t.regex(bad.problems[0] ?? '', /namespace team-a: annotation kubenet\.io\/max-egress-bandwidth-total: "50 M" is not a bandwidth/);
});
