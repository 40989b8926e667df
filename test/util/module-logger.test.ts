/**
 * src/util/module-logger.ts: a module's logger writes each key once, whatever logger its owner handed it (the
 * agent's lines once read `"module":"pod-network","module":"shaper"`). Without root.
 */
import test from 'ava';
import { pino } from 'pino';
import { Writable } from 'node:stream';
import { moduleLogger } from '../../src/util/module-logger.js';
import { topLevelKeys } from '../kit/log-lines.js';

function capture(): { lines: string[]; stream: Writable } {
  const lines: string[] = [];
  const stream = new Writable({
    write(chunk: Buffer, _enc, cb) {
      lines.push(
        ...chunk
          .toString()
          .split('\n')
          .filter((l) => l !== ''),
      );
      cb();
    },
  });
  return { lines, stream };
}

test('a module of a module, and a per-pod child, write one module key: the innermost', (t) => {
  const { lines, stream } = capture();
  const root = pino({ name: 'kubenet', level: 'info' }, stream);
  const network = moduleLogger(root, 'pod-network');
  const shaper = moduleLogger(network, 'shaper', { ifb: 'kubenet-ifb0' });
  shaper.info('shaper ready');
  shaper.child({ pod: 'abc' }).info('pod shaped');
  network.child({ pod: 'default/web' }).info('pod set up');
  moduleLogger(moduleLogger(network.child({ request: 7 }), 'cni'), 'dhcp').info('deep');
  t.is(lines.length, 4);
  for (const l of lines) {
    const keys = topLevelKeys(l);
    t.deepEqual(
      keys.filter((k, i) => keys.indexOf(k) !== i),
      [],
      `each key once: ${l}`,
    );
    t.is((JSON.parse(l) as { name: string }).name, 'kubenet');
  }
  const parsed = lines.map((l) => JSON.parse(l) as Record<string, unknown>);
  t.like(parsed[0], { module: 'shaper', ifb: 'kubenet-ifb0', msg: 'shaper ready' });
  t.like(parsed[1], { module: 'shaper', pod: 'abc' });
  t.like(parsed[2], { module: 'pod-network', pod: 'default/web' });
  // The owner's own bindings stay (request 7), the module is the last one named.
  t.like(parsed[3], { module: 'dhcp', request: 7 });
});

test("topLevelKeys reads a line's keys at depth 1 only, strings with braces and escaped quotes included", (t) => {
  t.deepEqual(topLevelKeys('{"a":1,"b":{"a":2,"c":[{"a":3}]},"d":"x\\"}{\\"a\\":","a":4}'), ['a', 'b', 'd', 'a']);
  t.deepEqual(topLevelKeys('{}'), []);
});
