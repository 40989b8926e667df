/**
 * The pure parts of host-local in the agent (src/pod/addresses/allocator/ranges.ts, allocator.ts): address
 * text as Go writes it, ranges canonicalized with host-local's defaults and messages, the exact
 * round-robin order, and allocate/release over an in-memory store.
 */
import test from 'ava';
import { ConfigError } from '../../../../src/errors.js';
import {
  AddressesExhaustedError,
  allocate,
  DuplicateAllocationError,
  hostLocalResult,
  parseHostLocal,
  release,
} from '../../../../src/pod/addresses/allocator/allocator.js';
import {
  candidates,
  formatAddr,
  parseAddr,
  parseRangeSets,
  rangeSetString,
  type RangeSet,
} from '../../../../src/pod/addresses/allocator/ranges.js';
import { LINE_BREAK, type LockedStore } from '../../../../src/pod/addresses/allocator/store.js';

const fmt = (text: string) => {
  const a = parseAddr(text);
  return a ? formatAddr(a.family, a.value) : undefined;
};

test('addresses as Go net.IP.String writes them (reservation file names)', (t) => {
  t.is(fmt('10.244.1.2'), '10.244.1.2');
  t.is(fmt('0.0.0.0'), '0.0.0.0');
  t.is(fmt('FD00:0:0:0:0:0:0:2'), 'fd00::2');
  t.is(fmt('fd00:10:244:1::a'), 'fd00:10:244:1::a');
  t.is(fmt('2001:db8:0:0:1:0:0:1'), '2001:db8::1:0:0:1', 'first of two equal zero runs');
  t.is(fmt('2001:db8:0:1:1:1:1:1'), '2001:db8:0:1:1:1:1:1', 'a single zero group stays');
  t.is(fmt('::'), '::');
  t.is(fmt('::1'), '::1');
  t.is(fmt('1::'), '1::');
  t.is(fmt('::ffff:10.0.0.1'), '10.0.0.1', 'IPv4-mapped is IPv4');
  t.is(fmt('10.0.0.01'), undefined, 'leading zeros refused, as Go does');
  t.is(fmt(''), undefined);
  t.is(fmt('10.0.0.1\n'), undefined);
});

test('ranges: host-local defaults (from .1 to the last address but the IPv4 broadcast, gateway .1)', (t) => {
  const [v4, v6] = parseRangeSets({ ranges: [[{ subnet: '10.244.1.0/24' }], [{ subnet: 'fd00:1::/120' }]] });
  t.is(rangeSetString(v4 as RangeSet), '10.244.1.1-10.244.1.254');
  t.is(rangeSetString(v6 as RangeSet), 'fd00:1::1-fd00:1::ff');
  t.is(formatAddr(4, (v4 as RangeSet)[0]?.gateway ?? 0n), '10.244.1.1');
  const [custom] = parseRangeSets({
    ranges: [[{ subnet: '10.9.0.0/24', rangeStart: '10.9.0.10', rangeEnd: '10.9.0.20', gateway: '10.9.0.254' }, { subnet: '10.9.1.0/30' }]],
  });
  t.is(rangeSetString(custom as RangeSet), '10.9.0.10-10.9.0.20,10.9.1.1-10.9.1.2');
  t.is(rangeSetString(parseRangeSets({ subnet: '10.8.0.0/30' })[0] as RangeSet), '10.8.0.1-10.8.0.2', 'old-style single range');
});

test("ranges: invalid ones refused with host-local's messages", (t) => {
  const err = (ipam: Parameters<typeof parseRangeSets>[0]) => t.throws(() => parseRangeSets(ipam), { instanceOf: ConfigError })?.message;
  t.is(err({ ranges: [] }), 'no IP ranges specified');
  t.is(err({ ranges: [[{ subnet: '10.0.0.0/31' }]] }), 'invalid range set 0: Network 10.0.0.0/31 too small to allocate from');
  t.is(
    err({ ranges: [[{ subnet: '10.0.0.1/24' }]] }),
    'invalid range set 0: Network has host bits set. For a subnet mask of length 24 the network address is 10.0.0.0',
  );
  t.is(
    err({ ranges: [[{ subnet: '10.0.0.0/24', gateway: '10.0.1.1' }]] }),
    'invalid range set 0: gateway 10.0.1.1 not in network 10.0.0.0/24',
  );
  t.is(
    err({ ranges: [[{ subnet: '10.0.0.0/24', rangeStart: '10.0.1.1' }]] }),
    'invalid range set 0: RangeStart 10.0.1.1 not in network 10.0.0.0/24',
  );
  t.is(
    err({ ranges: [[{ subnet: '10.0.0.0/24', rangeStart: '10.0.0.9', rangeEnd: '10.0.0.8' }]] }),
    'invalid range set 0: RangeEnd 10.0.0.8 not in network 10.0.0.0/24',
  );
  t.is(err({ ranges: [[{ subnet: '10.0.0.0/24' }, { subnet: 'fd00::/120' }]] }), 'invalid range set 0: mixed address families');
  t.is(
    err({ ranges: [[{ subnet: '10.0.0.0/24' }, { subnet: '10.0.0.0/25' }]] }),
    'invalid range set 0: subnets 10.0.0.1-10.0.0.254 and 10.0.0.1-10.0.0.126 overlap',
  );
  t.is(err({ ranges: [[{ subnet: '10.0.0.0/24' }], [{ subnet: '10.0.0.0/25' }]] }), 'range set 0 overlaps with 1');
  t.is(err({ ranges: [[{ subnet: 'nonsense' }]] }), 'invalid range set 0: invalid CIDR address: nonsense');
});

const order = (set: RangeSet, last?: string, n = 100) => {
  const out: string[] = [];
  for (const c of candidates(set, parseAddr(last))) {
    out.push(formatAddr(c.range.family, c.value));
    if (out.length >= n) break;
  }
  return out;
};

test("round-robin: exact order of host-local's iterator", (t) => {
  const [s29] = parseRangeSets({ ranges: [[{ subnet: '10.9.0.0/29' }]] }) as [RangeSet];
  t.deepEqual(order(s29), ['10.9.0.2', '10.9.0.3', '10.9.0.4', '10.9.0.5', '10.9.0.6'], 'no hint: from the start, gateway skipped');
  t.deepEqual(
    order(s29, '10.9.0.4'),
    ['10.9.0.5', '10.9.0.6', '10.9.0.2', '10.9.0.3', '10.9.0.4'],
    'after the last reserved, which comes last',
  );
  t.deepEqual(order(s29, '10.9.0.6'), ['10.9.0.2', '10.9.0.3', '10.9.0.4', '10.9.0.5', '10.9.0.6'], 'wraps at the end');
  t.deepEqual(order(s29, '10.9.1.4'), order(s29), 'a hint outside the set is ignored');
  t.deepEqual(order(s29, 'garbage'), order(s29));
  const [two] = parseRangeSets({
    ranges: [[{ subnet: '10.9.0.0/30' }, { subnet: '10.9.1.0/24', rangeStart: '10.9.1.1', rangeEnd: '10.9.1.3', gateway: '10.9.1.2' }]],
  }) as [RangeSet];
  t.deepEqual(order(two), ['10.9.0.2', '10.9.1.1', '10.9.1.3']);
  t.deepEqual(order(two, '10.9.1.1'), ['10.9.1.3', '10.9.0.2', '10.9.1.1'], 'across ranges, wrapping, gateway of each range skipped');
  const [v6] = parseRangeSets({ ranges: [[{ subnet: 'fd00::/126' }]] }) as [RangeSet];
  t.deepEqual(order(v6), ['fd00::2', 'fd00::3'], 'IPv6: the last address is usable');
});

/** An in-memory LockedStore: name -> content. */
function memStore(files = new Map<string, string>()): LockedStore & { files: Map<string, string> } {
  return {
    files,
    reserve(id, ifName, name, rangeId) {
      if (files.has(name)) return false;
      files.set(name, id.trim() + LINE_BREAK + ifName);
      files.set(`last_reserved_ip.${rangeId}`, name);
      return true;
    },
    lastReserved: (rangeId) => files.get(`last_reserved_ip.${rangeId}`),
    reservations: () =>
      [...files].filter(([n]) => n !== 'lock' && !n.startsWith('last_reserved_ip.')).map(([name, c]) => ({ name, key: c.trim() })),
    remove: (name) => files.delete(name),
  };
}

test("allocate/release over a store: one address per set, duplicates refused, exhaustion in host-local's words, earlier sets released", (t) => {
  const net = parseHostLocal({
    name: 'kubenet',
    cniVersion: '1.0.0',
    ipam: { type: 'host-local', ranges: [[{ subnet: '10.9.0.0/30' }], [{ subnet: 'fd00::/125' }]], routes: [{ dst: '0.0.0.0/0' }] },
  });
  const s = memStore();
  const a = allocate(s, net.rangeSets, 'c1', 'eth0');
  t.deepEqual(hostLocalResult(net, a), {
    cniVersion: '1.0.0',
    interfaces: [],
    ips: [
      { address: '10.9.0.2/30', gateway: '10.9.0.1' },
      { address: 'fd00::2/125', gateway: 'fd00::1' },
    ],
    routes: [{ dst: '0.0.0.0/0' }],
    dns: {},
  });
  t.is(s.files.get('10.9.0.2'), 'c1\r\neth0');
  t.is(s.files.get('last_reserved_ip.1'), 'fd00::2');
  const dup = t.throws(() => allocate(s, net.rangeSets, 'c1', 'eth0'), { instanceOf: DuplicateAllocationError });
  t.is(dup?.message, 'failed to allocate for range 0: 10.9.0.2 has been allocated to c1, duplicate allocation is not allowed');
  const full = t.throws(() => allocate(s, net.rangeSets, 'c2', 'eth0'), { instanceOf: AddressesExhaustedError });
  t.is(full?.message, 'failed to allocate for range 0: no IP addresses available in range set: 10.9.0.1-10.9.0.2');
  t.is(s.reservations().length, 2, 'nothing left by the failed ADD');
  // The v6 set full while v4 is not: the v4 address reserved for c3 is released again.
  const s2 = memStore(
    new Map([
      ['fd00::2', 'x'],
      ['fd00::3', 'x'],
      ['fd00::4', 'x'],
      ['fd00::5', 'x'],
      ['fd00::6', 'x'],
      ['fd00::7', 'x'],
    ]),
  );
  t.throws(() => allocate(s2, net.rangeSets, 'c3', 'eth0'), {
    instanceOf: AddressesExhaustedError,
    message: 'failed to allocate for range 1: no IP addresses available in range set: fd00::1-fd00::7',
  });
  t.false(s2.files.has('10.9.0.2'));
  t.deepEqual(release(s, 'c1', 'eth1'), [], 'another interface holds nothing');
  t.deepEqual(release(s, 'c1', 'eth0').sort(), ['10.9.0.2', 'fd00::2']);
  t.deepEqual(s.reservations(), []);
  s.files.set('10.9.0.2', 'old\n');
  s.files.set('10.9.0.3', 'old\r\neth1');
  t.deepEqual(release(s, 'old', 'eth0'), ['10.9.0.2'], 'a file of host-local < 0.8.6 (ID alone) goes when none names ID and interface');
  t.deepEqual(release(s, ' old ', 'eth1'), ['10.9.0.3'], 'the ID is trimmed as host-local trims it');
});

test("parseHostLocal: host-local's defaults and refusals", (t) => {
  const net = parseHostLocal({ name: 'kubenet', ipam: { ranges: [[{ subnet: '10.9.0.0/24' }]] } });
  t.is(net.dataDir, '/var/lib/cni/networks');
  t.deepEqual(net.routes, []);
  t.throws(() => parseHostLocal({ name: 'kubenet' }), { instanceOf: ConfigError, message: "IPAM config missing 'ipam' key" });
  t.throws(() => parseHostLocal({ name: 'kubenet', ipam: { ranges: [] } }), { instanceOf: ConfigError, message: 'no IP ranges specified' });
});
