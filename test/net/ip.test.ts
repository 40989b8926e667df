import test from 'ava';
import { ConfigError } from '../../src/errors.js';
import { cidrContains, familyOf, lastByte, parseCidr, parsePodCidrs, parsePrefixed } from '../../src/net/ip.js';

test('parseCidr clears host bits and normalizes both families', (t) => {
  t.deepEqual(parseCidr('10.244.1.7/24'), { family: 4, network: '10.244.1.0', prefixLen: 24, cidr: '10.244.1.0/24' });
  t.is(parseCidr('10.244.1.9/29').cidr, '10.244.1.8/29');
  t.is(parseCidr('FD00:10:244:1::5/64').cidr, 'fd00:10:244:1::/64');
  t.is(parseCidr('fd00:0:0:0:0:0:0:1/128').cidr, 'fd00::1/128');
  t.is(parseCidr('0.0.0.0/0').cidr, '0.0.0.0/0');
});

test('parseCidr refuses malformed input with a ConfigError naming it', (t) => {
  for (const bad of [
    '10.0.0.0',
    '10.0.0.0/',
    '10.0.0.256/24',
    '10.0.0.0/33',
    'fd00::/129',
    'x/8',
    ' /24',
    '10.0.0.0/24/1',
    '10.0.0.0/-1',
  ]) {
    const err = t.throws(() => parseCidr(bad), { instanceOf: ConfigError }, bad);
    t.true(err?.message.includes(JSON.stringify(bad.trim())) || err?.message.includes(bad), err?.message);
  }
});

test('parsePodCidrs accepts one CIDR or a dual-stack pair', (t) => {
  t.deepEqual(
    parsePodCidrs('10.244.1.0/24, fd00:10:244:1::/64').map((s) => s.cidr),
    ['10.244.1.0/24', 'fd00:10:244:1::/64'],
  );
  t.throws(() => parsePodCidrs('10.1.0.0/24,10.2.0.0/24'), { instanceOf: ConfigError, message: /same family/ });
  t.throws(() => parsePodCidrs('10.1.0.0/24,fd00::/64,fd01::/64'), { instanceOf: ConfigError });
  t.throws(() => parsePodCidrs(''), { instanceOf: ConfigError });
  t.throws(() => parsePodCidrs(undefined), { instanceOf: ConfigError });
  t.throws(() => parsePodCidrs('10.1.0.0/31'), { instanceOf: ConfigError, message: /too small/ });
});

test('containment is exact, across families', (t) => {
  const s = parseCidr('10.244.1.0/24');
  t.true(cidrContains(s, '10.244.1.255'));
  t.false(cidrContains(s, '10.244.2.0'));
  t.false(cidrContains(s, 'fd00::1'));
  t.true(cidrContains(parseCidr('fd00:1::/64'), 'fd00:1::abcd'));
  t.false(cidrContains(parseCidr('fd00:1::/64'), 'fd00:2::1'));
  t.true(cidrContains(parseCidr('0.0.0.0/0'), '203.0.113.9'));
});

test('plain and prefixed addresses', (t) => {
  t.is(familyOf('10.0.0.1'), 4);
  t.is(familyOf('::ffff:10.0.0.1'), 6);
  t.is(familyOf('10.0.0.1/24'), 0);
  t.is(familyOf(7), 0);
  t.deepEqual(parsePrefixed('10.1.2.3/24'), { family: 4, ip: '10.1.2.3', prefixLen: 24 });
  t.deepEqual(parsePrefixed('fd00::7/64'), { family: 6, ip: 'fd00::7', prefixLen: 64 });
  for (const bad of ['10.1.2.3', '10.1.2.3/33', 'fd00::/129', 'x/1', 5]) t.is(parsePrefixed(bad), undefined, String(bad));
});

test('the last byte of an address (the shaper hash bucket)', (t) => {
  t.is(lastByte('10.98.1.17'), 17);
  t.is(lastByte('fd00:98::1:ab'), 0xab);
  t.is(lastByte('::ffff:10.0.0.200'), 200);
  t.is(lastByte('fd00::'), 0);
});
