/**
 * Unshaped destinations, exact output, without root (src/shaper/unshaped.ts): the ifb's filters,
 * the mangle chain's rules as iptables lists them, the jump. test/e2e/unshaped.test.ts proves in a
 * node sandbox that they do what they say.
 */
import test from 'ava';
import { parseUnshaped, unshapedIfbLines, unshapedJump, unshapedRules } from '../../src/shaper/unshaped.js';

test('the CIDRs are normalized and deduplicated; a bad one is refused', (t) => {
  t.deepEqual(
    parseUnshaped(['10.1.2.3/8', '10.0.0.0/8', 'fd00:10::/32', '192.168.0.0/16']).map((s) => s.cidr),
    ['10.0.0.0/8', 'fd00:10::/32', '192.168.0.0/16'],
  );
  t.deepEqual(parseUnshaped([]), []);
  t.throws(() => parseUnshaped(['10.0.0.0/33']));
  t.throws(() => parseUnshaped(['pods']));
});

test('ifb: both priorities replaced, one filter per CIDR ahead of the pods, to the htb root (direct)', (t) => {
  t.deepEqual(unshapedIfbLines('kifb', parseUnshaped(['10.0.0.0/8', 'fd00:10::/32', '100.64.0.0/10'])), [
    'filter del dev kifb parent 1: prio 4 protocol ip',
    'filter del dev kifb parent 1: prio 5 protocol ipv6',
    'filter add dev kifb parent 1: prio 4 protocol ip u32 match ip dst 10.0.0.0/8 flowid 1:',
    'filter add dev kifb parent 1: prio 5 protocol ipv6 u32 match ip6 dst fd00:10::/32 flowid 1:',
    'filter add dev kifb parent 1: prio 4 protocol ip u32 match ip dst 100.64.0.0/10 flowid 1:',
  ]);
  t.deepEqual(unshapedIfbLines('kifb', []), ['filter del dev kifb parent 1: prio 4 protocol ip', 'filter del dev kifb parent 1: prio 5 protocol ipv6']);
});

test('mangle: per family, the source CIDRs classified to the veth root htb 2: (direct), as iptables -S lists them', (t) => {
  const subnets = parseUnshaped(['10.0.0.0/8', 'fd00:10::/32', '100.64.0.0/10']);
  t.deepEqual(unshapedRules(subnets, 4), [
    ['-s', '10.0.0.0/8', '-j', 'CLASSIFY', '--set-class', '0002:0000'],
    ['-s', '100.64.0.0/10', '-j', 'CLASSIFY', '--set-class', '0002:0000'],
  ]);
  t.deepEqual(unshapedRules(subnets, 6), [['-s', 'fd00:10::/32', '-j', 'CLASSIFY', '--set-class', '0002:0000']]);
  t.deepEqual(unshapedRules([], 4), []);
  t.deepEqual(unshapedJump('cbr0'), ['-o', 'cbr0', '-m', 'comment', '--comment', 'kubenet-ts: unshaped sources of shaped pods', '-j', 'KUBENET-UNSHAPED']);
});
