/**
 * src/netlink/neigh.ts against the real kernel, in a network namespace of the test's own with a
 * VXLAN device like the agent's (nolearning, no group or remote): each change is compared with
 * `ip -j neigh` and `bridge -j fdb` in the same namespace.
 */
import test from 'ava';
import { execa } from 'execa';
import { NetlinkError } from '../../src/errors.js';
import { neighApply, netnsLinkByName } from '../../src/netlink/index.js';
import { isRoot, sh, uniq } from '../kit/kernel.js';

const blocker = isRoot ? undefined : `needs root (creates a network namespace; running as uid ${process.getuid?.()})`;

async function neighs(ns: string, dev: string): Promise<string[]> {
  const { stdout } = await execa('ip', ['-n', ns, '-j', 'neigh', 'show', 'dev', dev]);
  return (JSON.parse(stdout || '[]') as Array<{ dst: string; lladdr?: string; state?: string[]; protocol?: string | number }>)
    .map((n) => `${n.dst} ${n.lladdr} ${(n.state ?? []).join(',')} proto ${n.protocol ?? '-'}`)
    .sort();
}
async function fdb(ns: string, dev: string): Promise<string[]> {
  const { stdout } = await execa('bridge', ['-n', ns, '-j', 'fdb', 'show', 'dev', dev]);
  return (JSON.parse(stdout || '[]') as Array<{ mac: string; dst?: string; port?: number; vni?: number; flags?: string[]; state?: string }>)
    .map(
      (e) =>
        `${e.mac} ${e.dst ?? '-'}${e.port ? ` port ${e.port}` : ''}${e.vni ? ` vni ${e.vni}` : ''} ${(e.flags ?? []).join(',')} ${e.state ?? ''}`,
    )
    .sort();
}

test('neighbours and FDB entries: replace (port and VNI where given), replace again, delete, delete what is absent; bad input changes nothing', async (t) => {
  if (blocker) return t.fail(blocker);
  const ns = `knn-${uniq(6)}`;
  const dev = `knn${uniq(5)}`;
  const path = `/var/run/netns/${ns}`;
  t.teardown(() => sh('ip', ['netns', 'del', ns], { reject: false }));
  await sh('ip', ['netns', 'add', ns]);
  await sh('ip', ['-n', ns, 'link', 'add', 'under0', 'type', 'veth', 'peer', 'name', 'under1']);
  await sh('ip', ['-n', ns, 'addr', 'add', '198.18.41.1/24', 'dev', 'under0']);
  await sh('ip', ['-n', ns, 'link', 'set', 'under0', 'up']);
  await sh('ip', [
    '-n',
    ns,
    'link',
    'add',
    dev,
    'type',
    'vxlan',
    'id',
    '98',
    'dstport',
    '8475',
    'local',
    '198.18.41.1',
    'nolearning',
    'dev',
    'under0',
  ]);
  await sh('ip', ['-n', ns, 'link', 'set', dev, 'up']);
  const ifindex = (await netnsLinkByName(path, dev))?.index ?? 0;
  t.true(ifindex > 0);

  const add = [
    { kind: 'fdb', op: 'replace', ifindex, mac: '0e:6b:c6:12:02:21', dst: '198.18.2.33' },
    { kind: 'fdb', op: 'replace', ifindex, mac: '0e:6b:c6:12:02:22', dst: '198.18.2.34', port: 8472, vni: 1 },
    { kind: 'neigh', op: 'replace', ifindex, ip: '10.244.3.0', mac: '0e:6b:c6:12:02:21', protocol: 98 },
    { kind: 'neigh', op: 'replace', ifindex, ip: 'fd00:10:244:3::', mac: '0e:6b:c6:12:02:22', protocol: 98 },
  ] as const;
  await neighApply(add, path);
  t.deepEqual(await fdb(ns, dev), [
    '0e:6b:c6:12:02:21 198.18.2.33 self permanent',
    '0e:6b:c6:12:02:22 198.18.2.34 port 8472 vni 1 self permanent',
  ]);
  t.deepEqual(await neighs(ns, dev), [
    '10.244.3.0 0e:6b:c6:12:02:21 PERMANENT proto 98',
    'fd00:10:244:3:: 0e:6b:c6:12:02:22 PERMANENT proto 98',
  ]);
  // Replace is idempotent, and moves an entry: one FDB entry per MAC (the destination changed), the neighbour's MAC.
  await neighApply(add, path);
  await neighApply(
    [
      { kind: 'fdb', op: 'replace', ifindex, mac: '0e:6b:c6:12:02:21', dst: '198.18.2.99' },
      { kind: 'neigh', op: 'replace', ifindex, ip: '10.244.3.0', mac: '0e:6b:c6:12:02:23', protocol: 98 },
    ],
    path,
  );
  t.deepEqual(await fdb(ns, dev), [
    '0e:6b:c6:12:02:21 198.18.2.99 self permanent',
    '0e:6b:c6:12:02:22 198.18.2.34 port 8472 vni 1 self permanent',
  ]);
  t.deepEqual((await neighs(ns, dev))[0], '10.244.3.0 0e:6b:c6:12:02:23 PERMANENT proto 98');

  // Bad input: refused before anything is sent, the change listed before it included.
  const bad = await t.throwsAsync(
    neighApply(
      [
        { kind: 'neigh', op: 'del', ifindex, ip: '10.244.3.0' },
        { kind: 'fdb', op: 'replace', ifindex, mac: 'not-a-mac', dst: '198.18.2.1' },
      ],
      path,
    ),
    { instanceOf: NetlinkError },
  );
  t.regex(bad?.message ?? '', /fdb replace not-a-mac .*not a MAC address/);
  t.is((await neighs(ns, dev)).length, 2, 'the delete listed before it was not sent either');

  // The kernel refusing one (no such device) names it.
  const refused = await t.throwsAsync(
    neighApply([{ kind: 'neigh', op: 'replace', ifindex: 999_999, ip: '10.9.9.9', mac: '0e:00:00:00:00:01' }], path),
    {
      instanceOf: NetlinkError,
    },
  );
  t.regex(refused?.message ?? '', /neigh replace 10\.9\.9\.9 lladdr 0e:00:00:00:00:01 dev 999999/);

  // Delete (the FDB entry by MAC and destination, port and VNI included), then again: absent is success.
  const del = [
    { kind: 'fdb', op: 'del', ifindex, mac: '0e:6b:c6:12:02:21', dst: '198.18.2.99' },
    { kind: 'fdb', op: 'del', ifindex, mac: '0e:6b:c6:12:02:22', dst: '198.18.2.34', port: 8472, vni: 1 },
    { kind: 'neigh', op: 'del', ifindex, ip: '10.244.3.0' },
    { kind: 'neigh', op: 'del', ifindex, ip: 'fd00:10:244:3::' },
  ] as const;
  await neighApply(del, path);
  t.deepEqual(await fdb(ns, dev), []);
  t.deepEqual(await neighs(ns, dev), []);
  await neighApply(del, path);
});
