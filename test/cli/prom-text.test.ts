/**
 * The Prometheus text-format parser of `kubectl kubenet` (src/cli/prom-text.ts): HELP and TYPE,
 * comments, labels with escapes, special values, timestamps, histogram and summary samples in their
 * families, and the malformed input it refuses with the line.
 */
import test from 'ava';
import { ExpositionError, parseExposition, samplesOf } from '../../src/cli/prom-text.js';

test('HELP (escaped), TYPE, comments, samples with and without labels, in order', (t) => {
  const f = parseExposition(
    [
      '# a comment, not HELP nor TYPE',
      '# HELP kubenet_pods Pods attached to the bridge\\nsecond line with a \\\\ backslash',
      '# TYPE kubenet_pods gauge',
      'kubenet_pods 3',
      '',
      '# HELP kubenet_pod_shaped_bytes_total Bytes',
      '# TYPE kubenet_pod_shaped_bytes_total counter',
      'kubenet_pod_shaped_bytes_total{namespace="default",pod="a",direction="ingress"} 1000',
      'kubenet_pod_shaped_bytes_total{namespace="default",pod="a",direction="egress",} 2.5e3 1700000000123',
      'untyped_thing{a="1"} -7',
    ].join('\n'),
  );
  t.deepEqual([...f.keys()], ['kubenet_pods', 'kubenet_pod_shaped_bytes_total', 'untyped_thing']);
  t.is(f.get('kubenet_pods')?.help, 'Pods attached to the bridge\nsecond line with a \\ backslash');
  t.is(f.get('kubenet_pods')?.type, 'gauge');
  t.deepEqual(f.get('kubenet_pods')?.samples, [{ name: 'kubenet_pods', labels: {}, value: 3 }]);
  t.deepEqual(samplesOf(f, 'kubenet_pod_shaped_bytes_total', { direction: 'egress' }), [
    {
      name: 'kubenet_pod_shaped_bytes_total',
      labels: { namespace: 'default', pod: 'a', direction: 'egress' },
      value: 2500,
      timestampMs: 1700000000123,
    },
  ]);
  t.is(f.get('untyped_thing')?.type, 'untyped');
  t.is(samplesOf(f, 'untyped_thing')[0]?.value, -7);
});

test('label values: escaped quote, backslash and newline; braces, commas and = inside quotes; spaces around', (t) => {
  const f = parseExposition('m{a="say \\"hi\\"",b="C:\\\\dir",c="two\\nlines", d = "x,y}=z" } 1\n');
  t.deepEqual(f.get('m')?.samples[0]?.labels, { a: 'say "hi"', b: 'C:\\dir', c: 'two\nlines', d: 'x,y}=z' });
  t.deepEqual(parseExposition('m{} 2\r\n').get('m')?.samples[0], { name: 'm', labels: {}, value: 2 }, 'empty braces; CRLF');
});

test('special values: NaN, +Inf, -Inf', (t) => {
  const f = parseExposition('a NaN\nb +Inf\nc -Inf\nd 1e-3\ne .5\n');
  t.true(Number.isNaN(samplesOf(f, 'a')[0]?.value));
  t.is(samplesOf(f, 'b')[0]?.value, Infinity);
  t.is(samplesOf(f, 'c')[0]?.value, -Infinity);
  t.is(samplesOf(f, 'd')[0]?.value, 0.001);
  t.is(samplesOf(f, 'e')[0]?.value, 0.5);
});

test('histogram and summary samples belong to their family; a _count without a histogram is its own', (t) => {
  const f = parseExposition(
    [
      '# TYPE lat histogram',
      'lat_bucket{le="0.1"} 1',
      'lat_bucket{le="+Inf"} 3',
      'lat_sum 0.7',
      'lat_count 3',
      '# TYPE q summary',
      'q{quantile="0.5"} 2',
      'q_sum 9',
      'q_count 4',
      'other_count 5',
    ].join('\n'),
  );
  t.deepEqual([...f.keys()], ['lat', 'q', 'other_count']);
  t.is(f.get('lat')?.samples.length, 4);
  t.deepEqual(
    samplesOf(f, 'lat_bucket').map((s) => s.labels.le),
    ['0.1', '+Inf'],
  );
  t.is(samplesOf(f, 'lat_count')[0]?.value, 3);
  t.is(samplesOf(f, 'q_count')[0]?.value, 4);
  t.is(samplesOf(f, 'other_count')[0]?.value, 5);
});

test('malformed text is refused with its line', (t) => {
  const bad: Array<[string, RegExp]> = [
    ['m{a="x} 1', /line 1: unterminated value of label a/],
    ['ok 1\nm{a="\\t"} 1', /line 2: invalid escape \\t/],
    ['m{a="1",a="2"} 1', /label a twice/],
    ['m{a="1"} 1\nm{a="1"} 2', /line 2: series m\{a="1"\} twice/],
    ['m{a="1",b="2"} 1\nm{b="2",a="1"} 2', /series .* twice/],
    ['# TYPE m gauge\n# TYPE m counter', /line 2: second TYPE for m/],
    ['m 1\n# TYPE m gauge', /TYPE for m after its samples/],
    ['# TYPE m gauges', /unknown type "gauges"/],
    ['m one', /value "one" is not a number/],
    ['m 1 2 3', /expected a value/],
    ['m', /expected a value/],
    ['m 1 1.5', /timestamp "1.5" is not an integer/],
    ['m{1a="x"} 1', /invalid label name/],
    ['m{a "x"} 1', /expected = after label a/],
    ['m{a=x} 1', /expected " to open/],
    ['m{a="x" b="y"} 1', /expected , or \}/],
    ['{a="x"} 1', /not a sample/],
  ];
  for (const [text, message] of bad) {
    const err = t.throws(() => parseExposition(text), { instanceOf: ExpositionError, message }, text);
    t.true((err?.line ?? 0) >= 1, text);
  }
});
