/**
 * src/netlink/stats-dump.ts against the real kernel, in network namespaces of the test's own: a
 * veth whose htb holds hundreds of classes (a dump of many datagrams), pings through it, and every
 * figure compared with `tc -s class show` and `ip -s -j link` of the same objects; classes asked by
 * handle (missing ones, a missing device), and a device deleted while its classes are being read.
 */
import test from 'ava';
import { execa } from 'execa';
import { NetlinkError } from '../../src/errors.js';
import { StatsSocket, type TcClassStats } from '../../src/netlink/index.js';
import { isRoot, sh, uniq } from '../kit/kernel.js';

const blocker = isRoot ? undefined : `needs root (creates network namespaces; running as uid ${process.getuid?.()})`;
const CLASSES = 400;

/** What `tc -s class show` prints of a class, as the netlink layer's own type names it. */
type TextClass = Omit<TcClassStats, 'rate' | 'ceil' | 'ctokens'> & { ctokens?: number };

const handleOf = (s: string) => {
  const [maj, min] = s.split(':');
  return ((parseInt(maj ?? '0', 16) << 16) | parseInt(min || '0', 16)) >>> 0;
};

/**
 * `tc -s class show dev X` in `ns` (iproute2 6.1 prints no JSON for classes), by handle; a class
 * tc prints without counters (tbf's own) only by its handle, parent and kind.
 */
async function tcClasses(ns: string, dev: string): Promise<Map<number, TextClass | Pick<TextClass, 'handle' | 'parent' | 'kind'>>> {
  const out = new Map<number, TextClass | Pick<TextClass, 'handle' | 'parent' | 'kind'>>();
  const text = (await execa('tc', ['-n', ns, '-s', 'class', 'show', 'dev', dev])).stdout;
  for (const block of text.split(/\n(?=class )/)) {
    const head = /^class (\S+) (\S+) (?:root|parent (\S+))/.exec(block);
    const sent = /Sent (\d+) bytes (\d+) pkt \(dropped (\d+), overlimits (\d+)/.exec(block);
    const backlog = /backlog (\d+)b (\d+)p/.exec(block);
    const ctokens = / ctokens: (-?\d+)/.exec(block);
    if (!head?.[1] || !head[2]) continue;
    const handle = handleOf(head[2]);
    const parent = head[3] ? handleOf(head[3]) : 0xffffffff;
    if (!sent || !backlog) {
      out.set(handle, { handle, parent, kind: head[1] });
      continue;
    }
    out.set(handle, {
      handle,
      parent,
      kind: head[1],
      bytes: +sent[1]!,
      packets: +sent[2]!,
      drops: +sent[3]!,
      overlimits: +sent[4]!,
      backlog: +backlog[1]!,
      qlen: +backlog[2]!,
      ...(ctokens ? { ctokens: +ctokens[1]! } : {}),
    });
  }
  return out;
}

async function ifindexOf(ns: string, dev: string): Promise<number> {
  return (JSON.parse((await execa('ip', ['-n', ns, '-j', 'link', 'show', dev])).stdout) as Array<{ ifindex: number }>)[0]?.ifindex ?? 0;
}

/** Two namespaces joined by a veth; `a`'s end has an htb with CLASSES classes, default 1:10. */
async function setup(t: import('ava').ExecutionContext): Promise<{ a: string; b: string; dev: string; peer: string }> {
  const tag = uniq(6);
  const [a, b, dev, peer] = [`kns-${tag}-a`, `kns-${tag}-b`, `kns${tag}`, `knp${tag}`];
  t.teardown(async () => {
    await sh('ip', ['netns', 'del', a], { reject: false });
    await sh('ip', ['netns', 'del', b], { reject: false });
  });
  await sh('ip', ['netns', 'add', a]);
  await sh('ip', ['netns', 'add', b]);
  // No IPv6: a veth coming up sends router solicitations and MLD reports on its own, which would
  // move the counters between the dump and tc's listing.
  for (const ns of [a, b])
    await sh('ip', ['netns', 'exec', ns, 'sysctl', '-qw', 'net.ipv6.conf.all.disable_ipv6=1', 'net.ipv6.conf.default.disable_ipv6=1']);
  await sh('ip', ['-n', a, 'link', 'add', dev, 'type', 'veth', 'peer', 'name', peer, 'netns', b]);
  await sh('ip', ['-n', a, 'addr', 'add', '198.18.60.1/24', 'dev', dev]);
  await sh('ip', ['-n', b, 'addr', 'add', '198.18.60.2/24', 'dev', peer]);
  await sh('ip', ['-n', a, 'link', 'set', dev, 'up']);
  await sh('ip', ['-n', b, 'link', 'set', peer, 'up']);
  const lines = [
    `qdisc add dev ${dev} root handle 1: htb default 10`,
    `class add dev ${dev} parent 1: classid 1:1 htb rate 100mbit ceil 100mbit`,
  ];
  for (let i = 0; i < CLASSES - 1; i++)
    lines.push(`class add dev ${dev} parent 1:1 classid 1:${(0x10 + i).toString(16)} htb rate ${1000 + i}kbit ceil ${(i % 7) + 10}gbit`);
  lines.push(
    `qdisc add dev ${dev} parent 1:10 handle 10: bfifo limit 30000`,
    `qdisc add dev ${dev} parent 1:11 handle 11: tbf rate 5mbit burst 20000b limit 100000b`,
  );
  await execa('tc', ['-n', a, '-batch', '-'], { input: lines.join('\n') });
  await sh('ip', ['netns', 'exec', a, 'ping', '-q', '-c', '5', '-i', '0.02', '-s', '800', '-W', '2', '198.18.60.2']);
  return { a, b, dev, peer };
}

test('a class dump of hundreds of classes (many datagrams) gives what tc -s shows, rates and ceils above 4 Gbit/s included', async (t) => {
  if (blocker) return t.fail(blocker);
  const { a, dev } = await setup(t);
  const sock = StatsSocket.open(`/var/run/netns/${a}`);
  t.teardown(() => sock.close());
  const ifindex = await ifindexOf(a, dev);
  const dumped = await sock.classDump(ifindex);
  const text = await tcClasses(a, dev);
  t.is(dumped.length, text.size, "every class of the device, the tbf leaf's own class too");
  t.true(dumped.length > CLASSES, `${dumped.length} classes: more than one 32 KiB datagram`);
  for (const c of dumped) {
    const { rate: _r, ceil: _c, ...figures } = c;
    const tc = text.get(c.handle);
    if (tc && !('bytes' in tc)) t.like(c, tc, `class ${c.handle.toString(16)} (tc shows no counters for it)`);
    else t.deepEqual(figures, tc, `class ${c.handle.toString(16)}`);
  }
  const byHandle = new Map(dumped.map((c) => [c.handle, c]));
  t.like(byHandle.get(0x10001), { kind: 'htb', rate: 100e6, ceil: 100e6 });
  t.like(byHandle.get(0x10010), { rate: 1000e3, ceil: 10e9 });
  t.like(byHandle.get(0x10016), { rate: 1006e3, ceil: 16e9 }, 'a ceil past 2^32 bytes/s comes from TCA_HTB_CEIL64');
  const def = byHandle.get(0x10010);
  t.true((def?.packets ?? 0) >= 5 && (def?.bytes ?? 0) >= 5 * 800, `the pings went through the default class: ${JSON.stringify(def)}`);
  t.deepEqual(await sock.classDump(0x7ffffff0), [], 'a device that does not exist has no classes');
});

test('classes asked by handle, in one datagram: the same figures as the dump, ENOENT for a missing class, ENODEV for a missing device', async (t) => {
  if (blocker) return t.fail(blocker);
  const { a, dev } = await setup(t);
  const sock = StatsSocket.open(`/var/run/netns/${a}`);
  t.teardown(() => sock.close());
  const ifindex = await ifindexOf(a, dev);
  const dumped = new Map((await sock.classDump(ifindex)).map((c) => [c.handle, c]));
  const handles = [...dumped.keys()].filter((h) => h >>> 16 === 1);
  const answers = await sock.classGet([
    ...handles.map((handle) => ({ ifindex, handle })),
    { ifindex, handle: 0x10fff },
    { ifindex: 0x7ffffff0, handle: 0x10001 },
    { ifindex, handle: 0x90001 },
  ]);
  t.is(answers.length, handles.length + 3);
  for (const [i, h] of handles.entries()) t.deepEqual(answers[i], dumped.get(h), `class ${h.toString(16)}`);
  const errno = (x: unknown) => (x instanceof NetlinkError ? x.errno : x);
  t.deepEqual(answers.slice(-3).map(errno), [2, 19, 2], 'no such class, no such device, no such qdisc');
});

test("every link's counters in one dump equal ip -s link", async (t) => {
  if (blocker) return t.fail(blocker);
  const { a, dev } = await setup(t);
  const sock = StatsSocket.open(`/var/run/netns/${a}`);
  t.teardown(() => sock.close());
  type IpLink = {
    ifindex: number;
    stats64: { rx: { bytes: number; packets: number; dropped: number }; tx: { bytes: number; packets: number; dropped: number } };
  };
  const ipLinks = async () => JSON.parse((await execa('ip', ['-n', a, '-s', '-j', 'link', 'show'])).stdout) as IpLink[];
  // Between two listings that agree (a stray IPv6 router solicitation moves them): at most 10 tries.
  let ip = await ipLinks();
  let links = await sock.linkStats();
  for (let i = 0; i < 10; i++) {
    const again = await ipLinks();
    if (JSON.stringify(again) === JSON.stringify(ip)) break;
    ip = again;
    links = await sock.linkStats();
    ip = await ipLinks();
  }
  t.deepEqual([...links.keys()].sort(), ip.map((l) => l.ifindex).sort());
  for (const l of ip) {
    const s = l.stats64;
    t.deepEqual(
      links.get(l.ifindex),
      {
        rxPackets: s.rx.packets,
        txPackets: s.tx.packets,
        rxBytes: s.rx.bytes,
        txBytes: s.tx.bytes,
        rxDropped: s.rx.dropped,
        txDropped: s.tx.dropped,
      },
      `link ${l.ifindex}`,
    );
  }
  t.true((links.get(await ifindexOf(a, dev))?.txPackets ?? 0) >= 5, 'the pings');
});

test('a device deleted while its classes are read: each answer is its figures or ENODEV, and the socket goes on', async (t) => {
  if (blocker) return t.fail(blocker);
  const { a, dev } = await setup(t);
  const sock = StatsSocket.open(`/var/run/netns/${a}`);
  t.teardown(() => sock.close());
  const ifindex = await ifindexOf(a, dev);
  const refs = Array.from({ length: 3000 }, (_, i) => ({ ifindex, handle: 0x10010 + (i % (CLASSES - 1)) }));
  const reading = sock.classGet(refs);
  const dumping = sock.classDump(ifindex);
  await sh('ip', ['-n', a, 'link', 'del', dev]);
  const answers = await reading;
  t.is(answers.length, refs.length);
  const gone = answers.filter((x) => x instanceof NetlinkError);
  t.true(
    gone.every((x) => x instanceof NetlinkError && x.errno === 19),
    'ENODEV only',
  );
  t.true(answers.every((x) => x instanceof NetlinkError || x.handle >>> 16 === 1));
  t.log(`${answers.length - gone.length} answered before the device went, ${gone.length} ENODEV`);
  t.true(Array.isArray(await dumping), 'the dump queued behind the gets ends too (empty once the device is gone)');
  t.true((await sock.linkStats()).size > 0, 'the socket still answers');
});
