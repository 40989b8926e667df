/** parseResult / convertResult across every spec version 0.1.0–1.1.0. Pure: no processes, no kernel. */
import test from 'ava';
import { InvalidResultError, UnsupportedVersionError } from '../../src/cni/errors.js';
import { compareVersions, convertResult, parseResult } from '../../src/cni/result.js';
import { CNI_VERSIONS, type CniResult, type Result040, type Result100 } from '../../src/cni/types.js';
import { PARSED, WIRE } from '../kit/cni-fixtures.js';

for (const v of CNI_VERSIONS) {
  test(`parseResult reads ${v} (object, JSON text and bytes) and convertResult writes it back unchanged`, (t) => {
    const wire = WIRE[v];
    t.truthy(wire);
    t.deepEqual(parseResult(wire), PARSED[v]);
    t.deepEqual(parseResult(JSON.stringify(wire)), PARSED[v]);
    t.deepEqual(parseResult(Buffer.from(JSON.stringify(wire))), PARSED[v]);
    t.deepEqual(convertResult(parseResult(wire), v), wire);
  });
}

test('conversion to 0.3.x/0.4.0 adds ips[].version, 1.0.0 drops it, and only 1.1.0 keeps 1.1.0 attributes', (t) => {
  const r = PARSED['1.1.0'] as CniResult;
  const dual: CniResult = { ...PARSED['0.3.1']!, cniVersion: '1.0.0' };
  for (const v of ['0.3.0', '0.3.1', '0.4.0'] as const) {
    const out = convertResult(dual, v) as Result040;
    t.is(out.cniVersion, v);
    t.deepEqual(
      out.ips?.map((ip) => ip.version),
      ['4', '6'],
    );
    const old = convertResult(r, v) as Result040;
    t.deepEqual(old.interfaces, [{ name: 'eth0', mac: '0a:58:0a:63:01:05', sandbox: '/var/run/netns/x' }]);
    t.deepEqual(old.routes, [{ dst: '0.0.0.0/0', gw: '10.99.1.1' }]);
  }
  const v1 = convertResult(dual, '1.0.0') as Result100;
  t.false(v1.ips?.some((ip) => 'version' in ip));
  t.deepEqual(convertResult(r, '1.0.0'), {
    ...WIRE['1.1.0'],
    cniVersion: '1.0.0',
    interfaces: [{ name: 'eth0', mac: '0a:58:0a:63:01:05', sandbox: '/var/run/netns/x' }],
    routes: [{ dst: '0.0.0.0/0', gw: '10.99.1.1' }],
  });
});

test('conversion to 0.2.0 keeps the first address of each family and files routes under their family', (t) => {
  const r: CniResult = {
    cniVersion: '1.0.0',
    interfaces: [{ name: 'eth0' }],
    ips: [
      { address: '10.99.1.5/24', gateway: '10.99.1.1', interface: 0 },
      { address: '10.99.2.5/24' },
      { address: 'fd00:99::5/64', gateway: 'fd00:99::1' },
    ],
    routes: [{ dst: '0.0.0.0/0' }, { dst: '::/0', gw: 'fd00:99::1' }, { dst: '10.0.0.0/8', gw: '10.99.1.1' }],
    dns: { nameservers: ['10.99.1.1'] },
  };
  t.deepEqual(convertResult(r, '0.2.0'), {
    cniVersion: '0.2.0',
    ip4: { ip: '10.99.1.5/24', gateway: '10.99.1.1', routes: [{ dst: '0.0.0.0/0' }, { dst: '10.0.0.0/8', gw: '10.99.1.1' }] },
    ip6: { ip: 'fd00:99::5/64', gateway: 'fd00:99::1', routes: [{ dst: '::/0', gw: 'fd00:99::1' }] },
    dns: { nameservers: ['10.99.1.1'] },
  });
  // loopback's result has no address: still convertible.
  t.deepEqual(convertResult({ cniVersion: '1.0.0', interfaces: [{ name: 'lo' }], ips: [], routes: [], dns: {} }, '0.2.0'), {
    cniVersion: '0.2.0',
    dns: {},
  });
});

test('every version converts to every other and back to the same addresses', (t) => {
  for (const from of CNI_VERSIONS) {
    for (const to of CNI_VERSIONS) {
      const back = parseResult(convertResult(PARSED[from]!, to));
      t.is(back.cniVersion, to);
      // The fixtures hold at most one address per family, so even 0.1.0/0.2.0 keep them all.
      t.deepEqual(
        back.ips.map((i) => i.address),
        PARSED[from]!.ips.map((i) => i.address),
      );
    }
  }
});

test('missing cniVersion: the fallback (config) version, else 0.1.0 for ip4/ip6, else an error', (t) => {
  t.is(parseResult({ ips: [{ address: '10.99.1.5/24' }] }, '1.0.0').cniVersion, '1.0.0');
  t.is(parseResult({ ip4: { ip: '10.99.1.5/24' } }).cniVersion, '0.1.0');
  t.throws(() => parseResult({ ips: [] }), { instanceOf: InvalidResultError, message: /no cniVersion/ });
});

test('invalid results are InvalidResultError with the reason', (t) => {
  const bad: Array<[unknown, RegExp]> = [
    ['not json', /not JSON/],
    ['[1,2]', /not a JSON object/],
    [{ cniVersion: '9.9.9' }, /unsupported cniVersion "9.9.9"/],
    [{ cniVersion: '1.0.0', ips: [{ address: '10.99.1.5' }] }, /ips\[0\]\.address must be an address in CIDR/],
    [{ cniVersion: '1.0.0', ips: [{ address: '10.99.1.5/33' }] }, /CIDR/],
    [{ cniVersion: '1.0.0', ips: [{ address: '10.99.1.5/24', gateway: 'x' }] }, /gateway must be an IP/],
    [{ cniVersion: '1.0.0', ips: [{ address: '10.99.1.5/24', interface: 0 }] }, /not an index into interfaces/],
    [{ cniVersion: '0.4.0', ips: [{ version: '6', address: '10.99.1.5/24' }] }, /does not match/],
    [{ cniVersion: '1.0.0', interfaces: [{ mac: 'x' }] }, /interfaces\[0\]\.name/],
    [{ cniVersion: '1.0.0', routes: [{ gw: '10.99.1.1' }] }, /routes\[0\]\.dst/],
    [{ cniVersion: '1.0.0', ips: {} }, /ips must be an array/],
    [{ cniVersion: '0.2.0', ip4: { ip: 'nope' } }, /ip4\.ip/],
    [{ cniVersion: '1.0.0', dns: { nameservers: 'x' } }, /dns\.nameservers/],
  ];
  for (const [input, re] of bad) t.throws(() => parseResult(input), { instanceOf: InvalidResultError, message: re }, JSON.stringify(input));
});

test('converting to an unknown version is an UnsupportedVersionError', (t) => {
  t.throws(() => convertResult(PARSED['1.0.0']!, '2.0.0'), { instanceOf: UnsupportedVersionError });
});

test('compareVersions orders numerically', (t) => {
  t.is(compareVersions('0.4.0', '1.0.0'), -1);
  t.is(compareVersions('0.10.0', '0.4.0'), 1);
  t.is(compareVersions('1.1.0', '1.1'), 0);
});
