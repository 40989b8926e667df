/** The node's capacity: config first, else the uplink's link speed (src/bandwidth/capacity.ts), on files the test writes. */
import test from 'ava';
import { mkdtemp, mkdir, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { defaultRouteDevice, describeCapacity, linkSpeed, resolveCapacity } from '../../src/bandwidth/capacity.js';

async function sysfs(t: { teardown(fn: () => Promise<void>): void }, speeds: Record<string, string>): Promise<string> {
  const dir = await mkdtemp(join(tmpdir(), 'kubenet-cap-'));
  t.teardown(() => rm(dir, { recursive: true, force: true }));
  for (const [dev, speed] of Object.entries(speeds)) {
    await mkdir(join(dir, dev));
    await writeFile(join(dir, dev, 'speed'), `${speed}\n`);
  }
  return dir;
}

test('link speed in bits/s; -1, garbage or no device is none', async (t) => {
  const dir = await sysfs(t, { eth0: '10000', veth1: '-1', odd: 'x' });
  t.is(await linkSpeed('eth0', dir), 10e9);
  t.is(await linkSpeed('veth1', dir), undefined);
  t.is(await linkSpeed('odd', dir), undefined);
  t.is(await linkSpeed('nope', dir), undefined);
});

test('the default route device from /proc/net/route', async (t) => {
  const dir = await sysfs(t, {});
  const file = join(dir, 'route');
  await writeFile(
    file,
    'Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT\n' +
      'cbr0\t0001F40A\t00000000\t0001\t0\t0\t0\t00FFFFFF\t0\t0\t0\n' +
      'ens3\t00000000\t0101A8C0\t0003\t0\t0\t100\t00000000\t0\t0\t0\n',
  );
  t.is(await defaultRouteDevice(file), 'ens3');
  t.is(await defaultRouteDevice(join(dir, 'missing')), undefined);
});

test('config wins per direction; the rest comes from the link speed; no speed leaves guarantees off', async (t) => {
  const io = { linkSpeed: async (d: string) => (d === 'eth0' ? 1e9 : undefined), defaultRouteDevice: async () => 'eth0' };
  const both = await resolveCapacity({ egress: 10e9 }, io);
  t.deepEqual(both, { egress: 10e9, ingress: 1e9, source: { egress: 'config', ingress: 'link-speed' }, device: 'eth0' });
  t.is(describeCapacity(both), 'egress 10G (config), ingress 1G (link speed of eth0)');
  const none = await resolveCapacity({ uplink: 'wg0' }, io);
  t.deepEqual(none, { source: { egress: 'unknown', ingress: 'unknown' }, device: 'wg0' });
  t.regex(describeCapacity(none), /egress unknown \(guarantees off: set egressCapacity\)/);
});
