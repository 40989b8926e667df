/**
 * Unshaped destinations, exact output, without root (src/shaper/unshaped.ts): the ifb's filters,
 * the mangle chain's rules as iptables lists them, the jump. test/e2e/unshaped.test.ts proves in a
 * node sandbox that they do what they say; test/shaper/unshaped-live.test.ts that a live change
 * rewrites them.
 */
import test from 'ava';
import {
  mergeCidrs,
  parseUnshaped,
  unshapedIfbLines,
  unshapedJump,
  unshapedRestoreText,
  unshapedRules,
} from '../../src/shaper/unshaped.js';

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
  t.deepEqual(unshapedIfbLines('kifb', []), [
    'filter del dev kifb parent 1: prio 4 protocol ip',
    'filter del dev kifb parent 1: prio 5 protocol ipv6',
  ]);
});

test('mangle: per family, the source CIDRs classified to the veth root htb 2: (direct), as iptables -S lists them', (t) => {
  const subnets = parseUnshaped(['10.0.0.0/8', 'fd00:10::/32', '100.64.0.0/10']);
  t.deepEqual(unshapedRules(subnets, 4), [
    ['-s', '10.0.0.0/8', '-j', 'CLASSIFY', '--set-class', '0002:0000'],
    ['-s', '100.64.0.0/10', '-j', 'CLASSIFY', '--set-class', '0002:0000'],
  ]);
  t.deepEqual(unshapedRules(subnets, 6), [['-s', 'fd00:10::/32', '-j', 'CLASSIFY', '--set-class', '0002:0000']]);
  t.deepEqual(unshapedRules([], 4), []);
  t.deepEqual(unshapedJump('cbr0'), [
    '-o',
    'cbr0',
    '-m',
    'comment',
    '--comment',
    'kubenet-ts: unshaped sources of shaped pods',
    '-j',
    'KUBENET-UNSHAPED',
  ]);
});

test('merged: exactly the same addresses in the fewest CIDRs, by family, ascending', (t) => {
  const merged = (cidrs: string[]) => mergeCidrs(parseUnshaped(cidrs)).map((s) => s.cidr);
  t.deepEqual(merged([]), []);
  t.deepEqual(merged(['10.244.1.0/24', '10.244.0.0/24']), ['10.244.0.0/23'], 'two halves: their whole');
  t.deepEqual(
    merged(['10.244.1.0/24', '10.244.2.0/24']),
    ['10.244.1.0/24', '10.244.2.0/24'],
    'side by side but not halves of one CIDR: kept apart (never an address more)',
  );
  t.deepEqual(
    merged(['10.244.0.0/24', '10.244.1.0/24', '10.244.2.0/24', '10.244.3.0/24', '10.244.5.0/24']),
    ['10.244.0.0/22', '10.244.5.0/24'],
    'joined again and again',
  );
  t.deepEqual(merged(['10.96.0.0/12', '10.100.0.0/16', '10.96.5.0/24']), ['10.96.0.0/12'], 'inside another: dropped');
  t.deepEqual(merged(['0.0.0.0/1', '128.0.0.0/1']), ['0.0.0.0/0']);
  t.deepEqual(merged(['fd00:10:244:1::/64', '10.244.0.0/24', 'fd00:10:244::/64', 'fd00:10:96::/112', '10.96.0.0/16']), [
    '10.96.0.0/16',
    '10.244.0.0/24',
    'fd00:10:96::/112',
    'fd00:10:244::/63',
  ]);
  const many = Array.from({ length: 256 }, (_, i) => `10.244.${i}.0/24`).reverse();
  t.deepEqual(merged(many), ['10.244.0.0/16'], "256 Nodes' /24s: one filter");
});

test('the chain as one iptables-restore: declared (made, or flushed whole) and filled at once', (t) => {
  t.is(
    unshapedRestoreText(unshapedRules(parseUnshaped(['10.0.0.0/8', '100.64.0.0/10']), 4)),
    '*mangle\n:KUBENET-UNSHAPED - [0:0]\n-A KUBENET-UNSHAPED -s 10.0.0.0/8 -j CLASSIFY --set-class 0002:0000\n-A KUBENET-UNSHAPED -s 100.64.0.0/10 -j CLASSIFY --set-class 0002:0000\nCOMMIT\n',
  );
});
