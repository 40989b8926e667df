/**
 * src/daemon/stop-steps.ts: the agent's stop runs every step in order, a hung or failing one is
 * logged by name and passed, and the whole ends within its deadline (the DaemonSet's 30 s grace).
 * Without root.
 */
import test from 'ava';
import { pino } from 'pino';
import { Writable } from 'node:stream';
import { runStopSteps } from '../../src/daemon/stop-steps.js';
import type { Logger } from '../../src/log.js';

function capture(): { lines: Array<{ level: number; msg: string; step?: string }>; log: Logger } {
  const lines: Array<{ level: number; msg: string; step?: string }> = [];
  const stream = new Writable({
    write(chunk: Buffer, _enc, cb) {
      for (const l of chunk.toString().split('\n')) if (l !== '') lines.push(JSON.parse(l));
      cb();
    },
  });
  return { lines, log: pino({ level: 'debug' }, stream) as unknown as Logger };
}

test('every step runs in order; one that hangs is cut at its bound and named, one that throws is named, the rest still run', async (t) => {
  const { lines, log } = capture();
  const ran: string[] = [];
  const started = Date.now();
  await runStopSteps(log, [
    { name: 'a', run: () => void ran.push('a') },
    { name: 'the hung watch', run: () => new Promise(() => ran.push('hung')), boundMs: 200 },
    {
      name: 'the broken one',
      run: async () => {
        ran.push('broken');
        throw new Error('boom');
      },
    },
    { name: 'events', run: () => new Promise(() => ran.push('events')), boundMs: 100, cutIsExpected: true },
    { name: 'z', run: async () => void ran.push('z') },
  ]);
  const ms = Date.now() - started;
  t.deepEqual(ran, ['a', 'hung', 'broken', 'events', 'z']);
  t.true(ms >= 300 && ms < 2_000, `${ms} ms: the two bounds, not more`);
  const warns = lines.filter((l) => l.level === 40).map((l) => l.msg);
  t.is(warns.length, 2, JSON.stringify(warns));
  t.regex(warns[0] ?? '', /^stopping: the hung watch did not finish in \d+ ms; going on without it$/);
  t.is(warns[1], 'stopping: the broken one failed; going on');
  // An expected cut is not a warning, but the log still has it.
  t.true(lines.some((l) => l.level === 20 && l.step === 'events' && /cut after/.test(l.msg)));
  t.true(lines.some((l) => l.level === 20 && l.step === 'z'));
});

test('past the deadline the remaining steps still run, each cut short: the whole stop ends near its deadline', async (t) => {
  const { lines, log } = capture();
  const ran: string[] = [];
  const hang = (name: string) => ({ name, run: () => new Promise(() => ran.push(name)), boundMs: 10_000 });
  const started = Date.now();
  await runStopSteps(log, [hang('first'), hang('second'), { name: 'close', run: () => void ran.push('close') }], 400);
  const ms = Date.now() - started;
  t.deepEqual(ran, ['first', 'second', 'close'], 'the last (synchronous) step ran');
  t.true(ms >= 400 && ms < 1_500, `${ms} ms: the deadline (400) and one short bound, not the 10 s bounds`);
  t.is(lines.filter((l) => l.level === 40).length, 2);
});
