/**
 * The `-S` line words (src/util/xtables-rules.ts): a rule listed by iptables is split into the
 * words `-D` takes back, quotes undone, and shown again as listed. Pure; no root.
 */
import test from 'ava';
import { ruleText, splitRule } from '../../src/util/xtables-rules.js';

test('splitRule undoes the quoting of -S; ruleText puts it back', (t) => {
  const line =
    '! -d 10.0.0.0/8 -m comment --comment "kubenet-ts: SNAT for outbound traffic from cluster" -m addrtype ! --dst-type LOCAL -j MASQUERADE';
  const words = splitRule(line);
  t.deepEqual(words, [
    '!',
    '-d',
    '10.0.0.0/8',
    '-m',
    'comment',
    '--comment',
    'kubenet-ts: SNAT for outbound traffic from cluster',
    '-m',
    'addrtype',
    '!',
    '--dst-type',
    'LOCAL',
    '-j',
    'MASQUERADE',
  ]);
  t.is(ruleText(words), line);
  t.deepEqual(splitRule('--comment "say \\"hi\\"" -j X'), ['--comment', 'say "hi"', '-j', 'X']);
  t.is(ruleText(['--comment', 'say "hi"']), '--comment "say \\"hi\\""');
  t.deepEqual(splitRule('--comment "" -j X'), ['--comment', '', '-j', 'X']);
  t.deepEqual(splitRule(''), []);
});
