/**
 * The pure parts of the bridge configs and the dedup rules (src/pod/bridge-conf.ts, src/pod/node/dedup-rules.ts):
 * what dhcp mode runs, how a recorded network is taken apart for the lease's release, the hairpin
 * flag per mode, and the KUBE-DEDUP rules exactly as `ebtables -L --Lmac2` lists them.
 */
import test from 'ava';
import {
  afterBridge,
  bridgeConf,
  dhcpBridgeConf,
  dhcpIpamNetwork,
  dhcpIpamOf,
  prefetchedIpamNetwork,
  withPortmap,
  type BridgeSettings,
} from '../../src/pod/bridge-conf.js';
import { dedupRules } from '../../src/pod/node/dedup-rules.js';
import { firstHost, parsePodCidrs } from '../../src/net/ip.js';

const S: BridgeSettings = { bridgeName: 'cbr0', mtu: 1500, hairpinMode: 'promiscuous-bridge', ipamDataDir: '/var/lib/cni/networks' };

test('dhcp mode: bridge + dhcp IPAM, no gateway, no masquerade; the lease socket in the IPAM section', (t) => {
  const conf = dhcpBridgeConf(S, '/run/kubenet/dhcp.sock');
  t.like(conf, { type: 'bridge', name: 'kubenet', bridge: 'cbr0', isGateway: false, ipMasq: false, hairpinMode: true });
  t.deepEqual(conf.ipam, { type: 'dhcp', daemonSocketPath: '/run/kubenet/dhcp.sock' });
  t.deepEqual(dhcpIpamOf(conf), { type: 'dhcp', daemonSocketPath: '/run/kubenet/dhcp.sock' });
  t.deepEqual(dhcpIpamOf(withPortmap(conf)), conf.ipam, 'found in a list too');
  t.is(dhcpIpamOf(bridgeConf(S, parsePodCidrs('10.244.1.0/24'))), undefined, 'host-local is not dhcp');
  t.is(dhcpIpamOf(undefined), undefined);
  t.deepEqual(dhcpIpamNetwork(withPortmap(conf)), { cniVersion: '1.0.0', name: 'kubenet', type: 'dhcp', ipam: conf.ipam });
  t.throws(() => dhcpIpamNetwork(bridgeConf(S, parsePodCidrs('10.244.1.0/24'))));
});

test("host-local prefetch: the bridge asks the shim, which has host-local's section; the agent runs host-local with that section", (t) => {
  const subnets = parsePodCidrs('10.244.1.0/24,fd00:1::/64');
  const plain = bridgeConf(S, subnets);
  const shim = bridgeConf({ ...S, ipamPrefetchSocket: '/run/kubenet/kubenet.sock.ipam' }, subnets);
  t.is(plain.ipam?.type, 'host-local');
  t.is(plain.socket, undefined);
  t.deepEqual(
    shim,
    { ...plain, ipam: { ...plain.ipam, type: 'kubenet-ipam' }, socket: '/run/kubenet/kubenet.sock.ipam' },
    'the same config but for the IPAM type and the socket',
  );
  const hostLocal = { cniVersion: '1.0.0', name: 'kubenet', type: 'host-local', ipam: plain.ipam };
  t.deepEqual(prefetchedIpamNetwork(shim), hostLocal);
  t.deepEqual(prefetchedIpamNetwork(withPortmap(shim)), hostLocal, 'found in a list too');
  t.is(prefetchedIpamNetwork(plain), undefined, 'the bridge runs host-local itself');
  t.is(prefetchedIpamNetwork(dhcpBridgeConf(S, '/run/kubenet/dhcp.sock')), undefined);
});

test('afterBridge: the plugins a dhcp network still runs on DEL', (t) => {
  const conf = dhcpBridgeConf(S, '/run/kubenet/dhcp.sock');
  t.is(afterBridge(conf), undefined);
  const rest = afterBridge(withPortmap(conf));
  t.deepEqual(
    rest?.plugins.map((p) => p.type),
    ['portmap'],
  );
  t.is(rest?.name, 'kubenet');
});

test('hairpin on the veths in hairpin-veth and promiscuous-bridge modes, not in none', (t) => {
  const subnets = parsePodCidrs('10.244.1.0/24');
  t.true(bridgeConf({ ...S, hairpinMode: 'hairpin-veth' }, subnets).hairpinMode);
  t.true(bridgeConf({ ...S, hairpinMode: 'promiscuous-bridge' }, subnets).hairpinMode);
  t.false(bridgeConf({ ...S, hairpinMode: 'none' }, subnets).hairpinMode);
});

test('KUBE-DEDUP rules per family: the gateway accepted, the pod CIDR dropped, from the bridge MAC to veths', (t) => {
  t.is(firstHost(parsePodCidrs('10.244.1.0/24')[0]!), '10.244.1.1');
  t.is(firstHost(parsePodCidrs('fd00:10:244:1::/64')[0]!), 'fd00:10:244:1::1');
  const rules = dedupRules({ bridgeMac: '0a:58:0a:f4:01:01', subnets: parsePodCidrs('10.244.1.0/24,fd00:10:244:1::/64') }).map((r) =>
    r.join(' '),
  );
  t.deepEqual(rules, [
    '-p IPv4 -s 0a:58:0a:f4:01:01 -o veth+ --ip-src 10.244.1.1 -j ACCEPT',
    '-p IPv4 -s 0a:58:0a:f4:01:01 -o veth+ --ip-src 10.244.1.0/24 -j DROP',
    '-p IPv6 -s 0a:58:0a:f4:01:01 -o veth+ --ip6-src fd00:10:244:1::1 -j ACCEPT',
    '-p IPv6 -s 0a:58:0a:f4:01:01 -o veth+ --ip6-src fd00:10:244:1::/64 -j DROP',
  ]);
});
