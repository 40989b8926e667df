/** Guarantees from a pod's requests, its priority band, ceilings raised to guarantees (src/bandwidth/guarantees.ts). */
import test from 'ava';
import {
  BANDWIDTH_RESOURCES,
  guaranteesFromSpec,
  priorityOf,
  PRIORITY_ANNOTATION,
  raisedMessage,
  withGuarantees,
} from '../../src/bandwidth/guarantees.js';
import { ConfigError } from '../../src/errors.js';

const E = BANDWIDTH_RESOURCES.egress;
const I = BANDWIDTH_RESOURCES.ingress;

test('the guarantee is the sum over containers, in Mbit/s units; a limit alone counts as the request', (t) => {
  const g = guaranteesFromSpec({
    containers: [{ resources: { requests: { [E]: '200', cpu: '1' } } }, { resources: { limits: { [E]: '50', [I]: 10 } } }, {}],
  });
  t.deepEqual(g, { egress: 250_000_000, ingress: 10_000_000 });
});

test('an init container asking more than the containers together sets the guarantee', (t) => {
  t.deepEqual(
    guaranteesFromSpec({
      containers: [{ resources: { requests: { [E]: '100' } } }],
      initContainers: [{ resources: { requests: { [E]: '300' } } }, { resources: { requests: { [E]: '20' } } }],
    }),
    {
      egress: 300_000_000,
    },
  );
  t.deepEqual(
    guaranteesFromSpec({
      containers: [{ resources: { requests: { [E]: '100' } } }, { resources: { requests: { [E]: '100' } } }],
      initContainers: [{ resources: { requests: { [E]: '150' } } }],
    }),
    {
      egress: 200_000_000,
    },
  );
});

test('no request, no guarantee; a bad quantity names the resource', (t) => {
  t.deepEqual(guaranteesFromSpec(undefined), {});
  t.deepEqual(guaranteesFromSpec({ containers: [{ resources: { requests: { cpu: '1' } } }] }), {});
  const err = t.throws(() => guaranteesFromSpec({ containers: [{ resources: { requests: { [E]: '10 Mbit' } } }] }), {
    instanceOf: ConfigError,
  });
  t.regex(err.message, /kubenet\.io\/egress-bandwidth: invalid quantity "10 Mbit"/);
});

test('the band is the QoS class, overridden by the annotation; a bad annotation is a problem and the QoS class stands', (t) => {
  t.deepEqual(priorityOf({}, 'Guaranteed'), { priority: 0 });
  t.deepEqual(priorityOf(undefined, 'Burstable'), { priority: 1 });
  t.deepEqual(priorityOf(undefined, 'BestEffort'), { priority: 2 });
  t.deepEqual(priorityOf(undefined, undefined), { priority: 1 });
  t.deepEqual(priorityOf({ [PRIORITY_ANNOTATION]: 'high' }, 'BestEffort'), { priority: 0 });
  const bad = priorityOf({ [PRIORITY_ANNOTATION]: 'urgent' }, 'BestEffort');
  t.is(bad.priority, 2);
  t.regex(bad.problem ?? '', /kubenet\.io\/bandwidth-priority "urgent" is not one of high, medium, low/);
});

test('a ceiling below the guarantee is raised to it and reported; guarantees and band join the limits', (t) => {
  const r = withGuarantees({ egress: 100e6, egressBurst: 8000, ingress: 50e6 }, { egress: 200e6, ingress: 20e6 }, 0);
  t.deepEqual(r.limits, { egress: 200e6, ingress: 50e6, egressGuarantee: 200e6, ingressGuarantee: 20e6, priority: 0 });
  t.deepEqual(r.raised, [{ direction: 'egress', ceiling: 100e6, guarantee: 200e6 }]);
  t.is(
    raisedMessage(r.raised[0]!),
    "kubernetes.io/egress-bandwidth 100M is below the pod's guarantee (kubenet.io/egress-bandwidth request, 200M): egress ceiling raised to 200M",
  );
  // Guarantees gone from the spec leave the limits.
  t.deepEqual(withGuarantees({ egress: 1e6, egressGuarantee: 5e5, priority: 2 }, {}, undefined).limits, { egress: 1e6 });
});

test('checked limits take guarantees and a band 0..2; isUnshaped counts a guarantee alone as shaping', async (t) => {
  const { checkLimits, isUnshaped, describeLimits } = await import('../../src/bandwidth/limits.js');
  t.notThrows(() => checkLimits({ egressGuarantee: 1e6, ingressGuarantee: 2e6, priority: 2 }, 'pod x'));
  t.throws(() => checkLimits({ priority: 3 }, 'pod x'), { message: /priority must be an integer 0\.\.2, got 3/ });
  t.throws(() => checkLimits({ egressGuarantee: 10 }, 'pod x'), { message: /egressGuarantee 10 bits\/s is outside/ });
  t.false(isUnshaped({ egressGuarantee: 1e6 }));
  t.true(isUnshaped({ priority: 0 }));
  t.is(
    describeLimits({ egressGuarantee: 1e6, ingress: 5e6, ingressGuarantee: 2e6 }),
    'ingress 5M (guaranteed 2M), egress no ceiling (guaranteed 1M)',
  );
});
