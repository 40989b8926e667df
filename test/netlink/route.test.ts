/**
 * src/netlink/route.ts against the real kernel, in a network namespace of the test's own (never the
 * host's routing table): the functions run in a worker started with `ip netns exec`, and every
 * result is compared with `ip -j route` in the same namespace.
 */
import test from 'ava';
import { execa } from 'execa';
import { fileURLToPath } from 'node:url';
import { isRoot, sh, uniq } from '../kit/kernel.js';

const WORKER = fileURLToPath(new URL('./route-worker.ts', import.meta.url));
const blocker = isRoot ? undefined : `needs root (creates a network namespace; running as uid ${process.getuid?.()})`;
const PROTO = 98;

async function inNs(ns: string, ops: unknown[]): Promise<Array<{ ok?: unknown; err?: { name: string; errno?: number; message: string } }>> {
  const { stdout } = await execa('ip', ['netns', 'exec', ns, process.execPath, '--import', 'tsx', WORKER, JSON.stringify(ops)]);
  return stdout
    .trim()
    .split('\n')
    .map((l) => JSON.parse(l) as { ok?: unknown; err?: { name: string; errno?: number; message: string } });
}

async function ipRoutes(
  ns: string,
  family: 4 | 6,
): Promise<Array<{ dst: string; gateway?: string; dev: string; protocol: string | number }>> {
  const { stdout } = await execa('ip', ['-n', ns, `-${family}`, '-j', 'route', 'show', 'table', 'main']);
  return JSON.parse(stdout || '[]') as Array<{ dst: string; gateway?: string; dev: string; protocol: string | number }>;
}

test('routes: replace, list and delete only routes of our protocol, both families, idempotently', async (t) => {
  if (blocker) return t.fail(blocker);
  const ns = `knr-${uniq(6)}`;
  const veth = `knr${uniq(6)}`;
  t.teardown(() => sh('ip', ['netns', 'del', ns], { reject: false }));
  await sh('ip', ['netns', 'add', ns]);
  await sh('ip', ['-n', ns, 'link', 'add', veth, 'type', 'veth', 'peer', 'name', `${veth}p`]);
  await sh('ip', ['-n', ns, 'link', 'set', veth, 'up']);
  await sh('ip', ['-n', ns, 'link', 'set', `${veth}p`, 'up']);
  await sh('ip', ['-n', ns, 'addr', 'add', '198.18.40.1/24', 'dev', veth]);
  await sh('ip', ['-n', ns, 'addr', 'add', 'fd00:4e:40::1/64', 'dev', veth, 'nodad']);
  const ifindex =
    (JSON.parse((await execa('ip', ['-n', ns, '-j', 'link', 'show', veth])).stdout) as Array<{ ifindex: number }>)[0]?.ifindex ?? 0;
  // Someone else's route to the same kind of destination: never touched.
  await sh('ip', ['-n', ns, 'route', 'add', '10.244.9.0/24', 'via', '198.18.40.9', 'dev', veth, 'proto', 'static']);
  const r = await inNs(ns, [
    { op: 'replace', dst: '10.244.2.0/24', gateway: '198.18.40.12', ifindex, protocol: PROTO },
    { op: 'replace', dst: '10.244.2.0/24', gateway: '198.18.40.12', ifindex, protocol: PROTO },
    { op: 'replace', dst: '10.244.3.7/24', gateway: '198.18.40.13', ifindex, protocol: PROTO },
    { op: 'replace', dst: 'fd00:10:244:2::/64', gateway: 'FD00:4E:40:0::12', ifindex, protocol: PROTO },
    { op: 'list', protocol: PROTO },
  ]);
  t.deepEqual(
    r.slice(0, 4).map((x) => x.err),
    [undefined, undefined, undefined, undefined],
  );
  t.deepEqual(r[4]?.ok, [
    { family: 4, dst: '10.244.2.0/24', gateway: '198.18.40.12', ifindex, protocol: PROTO },
    { family: 4, dst: '10.244.3.0/24', gateway: '198.18.40.13', ifindex, protocol: PROTO },
    { family: 6, dst: 'fd00:10:244:2::/64', gateway: 'fd00:4e:40::12', ifindex, protocol: PROTO },
  ]);
  const v4 = (await ipRoutes(ns, 4)).filter((x) => x.dst.startsWith('10.244.'));
  t.deepEqual(
    v4.map((x) => [x.dst, x.gateway, x.dev, String(x.protocol)]),
    [
      ['10.244.2.0/24', '198.18.40.12', veth, String(PROTO)],
      ['10.244.3.0/24', '198.18.40.13', veth, String(PROTO)],
      ['10.244.9.0/24', '198.18.40.9', veth, 'static'],
    ],
  );
  t.deepEqual(
    (await ipRoutes(ns, 6)).filter((x) => x.dst.startsWith('fd00:10:')).map((x) => [x.dst, x.gateway, String(x.protocol)]),
    [['fd00:10:244:2::/64', 'fd00:4e:40::12', String(PROTO)]],
  );
  // A replace moves the route to another gateway; a delete names the protocol, so the static route
  // to 10.244.9.0/24 survives a delete of that destination with ours, and deleting twice is fine.
  const d = await inNs(ns, [
    { op: 'replace', dst: '10.244.2.0/24', gateway: '198.18.40.22', ifindex, protocol: PROTO },
    { op: 'del', dst: '10.244.3.0/24', protocol: PROTO },
    { op: 'del', dst: '10.244.3.0/24', protocol: PROTO },
    { op: 'del', dst: '10.244.9.0/24', protocol: PROTO },
    { op: 'del', dst: 'fd00:10:244:2::/64', protocol: PROTO },
    { op: 'list', protocol: PROTO },
    { op: 'replace', dst: '10.244.4.0/24', gateway: '198.19.1.1', ifindex, protocol: PROTO },
    { op: 'replace', dst: '10.244.4.0/24', gateway: 'fd00::1', ifindex, protocol: PROTO },
    { op: 'list', protocol: 3 },
  ]);
  t.deepEqual(
    d.slice(0, 5).map((x) => x.err),
    [undefined, undefined, undefined, undefined, undefined],
  );
  t.deepEqual(d[5]?.ok, [{ family: 4, dst: '10.244.2.0/24', gateway: '198.18.40.22', ifindex, protocol: PROTO }]);
  // A gateway not on a connected subnet: the kernel refuses (ENETUNREACH, which libnl reports as its
  // unspecific failure); a family mismatch or a kernel protocol number: ConfigError before any request.
  t.is(d[6]?.err?.name, 'NetlinkError');
  t.regex(d[6]?.err?.message ?? '', /routeReplace 10\.244\.4\.0\/24 via 198\.19\.1\.1/);
  t.is(d[7]?.err?.name, 'ConfigError');
  t.is(d[8]?.err?.name, 'ConfigError');
  t.deepEqual(
    (await ipRoutes(ns, 4)).filter((x) => x.dst.startsWith('10.244.')).map((x) => [x.dst, x.gateway, String(x.protocol)]),
    [
      ['10.244.2.0/24', '198.18.40.22', String(PROTO)],
      ['10.244.9.0/24', '198.18.40.9', 'static'],
    ],
  );
});
