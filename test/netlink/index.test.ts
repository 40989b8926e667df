/**
 * src/netlink against the real kernel, compared with `ip -j` for every function. Each test makes its
 * own bridge / veth pair (names `knl` + this run's tag + random) and, where needed, its own network
 * namespace (`knl-<tag>-<random>`); t.teardown removes them even on failure and test.after.always
 * sweeps anything of this run that is left. Nothing sends traffic: links stay down except the bridge,
 * which has no carrier, and IPv6 addresses are added with nodad.
 */
import test, { type ExecutionContext } from 'ava';
import { readlinkSync } from 'node:fs';
import { ConfigError, NetlinkError } from '../../src/errors.js';
import {
  addrDel,
  addrList,
  classGet,
  classList,
  linkStats,
  linkBasics,
  linkByIndex,
  linkByName,
  linkDelete,
  linkDeletionCounts,
  linkDeletionsInFlight,
  linkDeletionsSettled,
  linkIndexExists,
  linkList,
  linkSetMtu,
  linkSetTxQLen,
  minHostMtu,
  netnsAddrList,
  netnsLinkByName,
  netnsLinkIndex,
  NLE,
  nleToErrno,
  setPromiscOff,
  setPromiscOn,
  type AddrInfo,
  type LinkInfo,
} from '../../src/netlink/index.js';
import { ipJson, isRoot, sh, uniq } from '../kit/kernel.js';

const ENOENT = 2;
const ENODEV = 19;
const EINVAL = 22;

const blocker = isRoot ? undefined : `needs root (creates bridges, veths and network namespaces; running as uid ${process.getuid?.()})`;
const kTest = blocker ? test.skip : test;
/** Serial: its figures are this process's deletion counts and groups, which a concurrent test's deletes would move. */
const kSerialTest = blocker ? test.serial.skip : test.serial;

/** This run's tag: every name starts with knl<tag>, so the final sweep only touches what we made. */
const TAG = uniq(4);
const linkName = (role: 'b' | 'v' | 'p') => `knl${TAG}${role}${uniq(6)}`; // 3+4+1+6 = 14 ≤ 15

interface IpLink {
  ifindex: number;
  ifname: string;
  flags: string[];
  mtu: number;
  txqlen?: number;
  master?: string;
  /** The peer of a veth in the same namespace (by name), or its index when it is in another one. */
  link?: string;
  link_index?: number;
  /** Present when the peer is in another namespace (its id as this one knows it). */
  link_netnsid?: number;
  address?: string;
  linkinfo?: { info_kind?: string };
}
interface IpAddrInfo {
  family: 'inet' | 'inet6';
  local: string;
  prefixlen: number;
  scope: string;
}

const SCOPES: Record<string, number> = { global: 0, site: 200, link: 253, host: 254, nowhere: 255 };

async function ipLinks(netns?: string): Promise<IpLink[]> {
  return ipJson<IpLink[]>([...(netns ? ['-n', netns] : []), '-d', 'link', 'show']);
}

async function ipAddrs(dev: string, netns?: string): Promise<AddrInfo[]> {
  const r = await ipJson<Array<{ addr_info: IpAddrInfo[] }>>([...(netns ? ['-n', netns] : []), 'addr', 'show', 'dev', dev]);
  return (r[0]?.addr_info ?? []).map((a) => ({
    family: a.family === 'inet' ? 4 : 6,
    ip: a.local,
    prefixLen: a.prefixlen,
    cidr: `${a.local}/${a.prefixlen}`,
    scope: SCOPES[a.scope] ?? Number(a.scope),
  }));
}

/** What LinkInfo must be for a link as `ip -j -d link` shows it. */
function expectedLink(l: IpLink, all: IpLink[]): LinkInfo {
  const has = (f: string) => l.flags.includes(f);
  return {
    name: l.ifname,
    index: l.ifindex,
    mtu: l.mtu,
    txQLen: l.txqlen ?? 0,
    flags: -1, // compared separately (ip shows names, not the number)
    up: has('UP'),
    promisc: has('PROMISC'),
    loopback: has('LOOPBACK'),
    pointToPoint: has('POINTOPOINT'),
    master: l.master ? (all.find((m) => m.ifname === l.master)?.ifindex ?? -1) : 0,
    type: l.linkinfo?.info_kind,
    peerIndex: l.link_index ?? (l.link ? (all.find((m) => m.ifname === l.link)?.ifindex ?? -1) : 0),
    peerElsewhere: l.link_netnsid !== undefined,
    mac: l.address ?? '',
  };
}

function withoutFlags(l: LinkInfo): LinkInfo {
  return { ...l, flags: -1 };
}

interface Links {
  bridge: string;
  veth: string;
  peer: string;
}

/** A bridge (up, no carrier) and a down veth pair whose host end is a port of it. */
async function makeLinks(t: ExecutionContext): Promise<Links> {
  const links = { bridge: linkName('b'), veth: linkName('v'), peer: linkName('p') };
  t.teardown(async () => {
    await sh('ip', ['link', 'del', links.veth], { reject: false });
    await sh('ip', ['link', 'del', links.bridge], { reject: false });
  });
  await sh('ip', ['link', 'add', links.bridge, 'type', 'bridge']);
  await sh('ip', ['link', 'add', links.veth, 'type', 'veth', 'peer', 'name', links.peer]);
  await sh('ip', ['link', 'set', links.veth, 'master', links.bridge]);
  await sh('ip', ['link', 'set', links.bridge, 'up']);
  return links;
}

async function makeNetns(t: ExecutionContext): Promise<{ name: string; path: string }> {
  const name = `knl-${TAG}-${uniq(8)}`;
  t.teardown(() => sh('ip', ['netns', 'del', name], { reject: false }));
  await sh('ip', ['netns', 'add', name]);
  return { name, path: `/var/run/netns/${name}` };
}

/**
 * Other test files create and remove links in the host namespace at the same time, so a whole-list
 * comparison is only meaningful when `ip` sees the same list before and after our call.
 */
async function stableSnapshot<T>(t: ExecutionContext, ours: () => Promise<T>): Promise<{ before: IpLink[]; result: T }> {
  const key = (ls: IpLink[]) => JSON.stringify(ls.map((l) => [l.ifindex, l.ifname, l.mtu, l.txqlen, l.flags, l.master]));
  for (let attempt = 1; attempt <= 20; attempt++) {
    const before = await ipLinks();
    const result = await ours();
    const after = await ipLinks();
    if (key(before) === key(after)) return { before, result };
    t.log(`host links changed during attempt ${attempt} (other tests running); retrying`);
    await new Promise((r) => setTimeout(r, 50));
  }
  throw new Error('host link list never stable across 20 attempts');
}

/** `fn` fails (throws or rejects) with a NetlinkError carrying `errno`. */
async function netlinkErrno(t: ExecutionContext, fn: () => unknown, errno: number, what: string): Promise<void> {
  const err = await t.throwsAsync(async () => fn(), { instanceOf: NetlinkError }, what);
  t.is(err?.errno, errno, `${what}: ${err?.message}`);
}

test.after.always('remove every link and netns of this run', async () => {
  if (!isRoot) return;
  for (const l of await ipLinks().catch(() => [])) {
    if (l.ifname.startsWith(`knl${TAG}`)) await sh('ip', ['link', 'del', l.ifname], { reject: false });
  }
  const ns = await sh('ip', ['netns', 'list'], { reject: false });
  for (const line of ns.stdout.split('\n')) {
    const name = line.split(' ')[0];
    if (name?.startsWith(`knl-${TAG}-`)) await sh('ip', ['netns', 'del', name], { reject: false });
  }
});

if (blocker) console.warn(`SKIPPING netlink kernel tests: ${blocker}`);

test('NLE codes map to Linux errno by an explicit table', (t) => {
  t.is(nleToErrno(-NLE.EXIST), 17);
  t.is(nleToErrno(-NLE.NODEV), ENODEV);
  t.is(nleToErrno(-NLE.OBJ_NOTFOUND), ENODEV);
  t.is(nleToErrno(-NLE.OBJ_NOTFOUND, ENOENT), ENOENT);
  t.is(nleToErrno(-NLE.PERM), 1);
  t.is(nleToErrno(-NLE.NOACCESS), 13);
  t.is(nleToErrno(-NLE.INVAL), EINVAL);
  t.is(nleToErrno(-NLE.BUSY), 16);
  t.is(nleToErrno(-NLE.NOADDR), 99);
  t.is(nleToErrno(-NLE.RANGE), 34);
  t.is(nleToErrno(-NLE.AGAIN), 11);
  t.is(nleToErrno(-NLE.NOMEM), 12);
  t.is(nleToErrno(-NLE.OPNOTSUPP), 95);
  t.is(nleToErrno(NLE.EXIST), 17, 'sign does not matter');
  t.is(nleToErrno(-999), 5, 'unknown code: EIO');
  for (let code = 1; code <= 34; code++) t.true(nleToErrno(-code) > 0, `NLE ${code} has an errno`);
});

test('invalid input is a ConfigError before any kernel call', async (t) => {
  await t.throwsAsync(linkByName(''), { instanceOf: ConfigError });
  await t.throwsAsync(linkByName('a'.repeat(16)), { instanceOf: ConfigError });
  await t.throwsAsync(linkByName('a/b'), { instanceOf: ConfigError });
  await t.throwsAsync(addrDel('lo', '127.0.0.1'), { instanceOf: ConfigError });
  await t.throwsAsync(addrDel('lo', '127.0.0.1/33'), { instanceOf: ConfigError });
  await t.throwsAsync(addrDel('lo', 'fd00::1/129'), { instanceOf: ConfigError });
  await t.throwsAsync(linkSetMtu('lo', -1), { instanceOf: ConfigError });
  await t.throwsAsync(linkSetTxQLen('lo', 1.5), { instanceOf: ConfigError });
  await t.throwsAsync(addrList('lo', 5 as 4), { instanceOf: ConfigError });
});

kTest('linkByName matches ip -j link for lo, a bridge, a veth port and its peer', async (t) => {
  const links = await makeLinks(t);
  const all = await ipLinks();
  for (const name of ['lo', links.bridge, links.veth, links.peer]) {
    const ip = all.find((l) => l.ifname === name);
    if (!ip) return t.fail(`ip does not show ${name}`);
    const ours = await linkByName(name);
    t.deepEqual(withoutFlags(ours), expectedLink(ip, all), name);
  }
  const br = await linkByName(links.bridge);
  t.is(br.type, 'bridge');
  t.true(br.up);
  t.is((await linkByName(links.veth)).type, 'veth');
  t.is((await linkByName(links.veth)).master, br.index);
  t.is((await linkByName(links.peer)).master, 0);
  t.false((await linkByName(links.peer)).up);
  t.is((await linkByName('lo')).type, undefined);
  t.true((await linkByName('lo')).loopback);
  t.is((await linkByName('lo')).flags & 0x9, 0x9, 'IFF_UP|IFF_LOOPBACK in flags');
});

kTest('linkList equals ip -j link (whole list when stable)', async (t) => {
  const links = await makeLinks(t);
  const { before, result } = await stableSnapshot(t, () => linkList());
  const byIndex = (a: { index: number }, b: { index: number }) => a.index - b.index;
  t.deepEqual(result.map(withoutFlags).sort(byIndex), before.map((l) => expectedLink(l, before)).sort(byIndex));
  for (const n of Object.values(links))
    t.true(
      result.some((l) => l.name === n),
      n,
    );
  t.true(new Set(result.map((l) => l.index)).size === result.length, 'no duplicates');
});

kTest('minHostMtu is the smallest MTU of up, non-loopback, non-point-to-point links', async (t) => {
  const links = await makeLinks(t);
  await linkSetMtu(links.bridge, 1280); // up, so it counts; the smallest on any sane host
  const { before, result } = await stableSnapshot(t, () => minHostMtu());
  const mtus = before
    .filter((l) => l.flags.includes('UP') && !l.flags.includes('LOOPBACK') && !l.flags.includes('POINTOPOINT'))
    .map((l) => l.mtu);
  t.is(result, mtus.length > 0 ? Math.min(...mtus) : undefined);
  t.true(result !== undefined && result <= 1280);
});

kTest('minHostMtu is undefined in a namespace with only loopback (checked through a child netns)', async (t) => {
  // minHostMtu works on the process's namespace; run it in a child process inside a fresh netns.
  const ns = await makeNetns(t);
  await sh('ip', ['-n', ns.name, 'link', 'set', 'lo', 'up']);
  const script = `import('${new URL('../../src/netlink/index.ts', import.meta.url).href}').then(async (m) => console.log(JSON.stringify({ v: (await m.minHostMtu()) ?? null })))`;
  const r = await sh('ip', ['netns', 'exec', ns.name, process.execPath, '--import=tsx', '-e', script]);
  t.deepEqual(JSON.parse(r.stdout.trim().split('\n').pop() ?? '{}'), { v: null });
});

kTest('linkSetMtu and linkSetTxQLen change the link as ip sees it, and are idempotent', async (t) => {
  const links = await makeLinks(t);
  await linkSetMtu(links.veth, 1400);
  await linkSetTxQLen(links.veth, 4321);
  let ip = (await ipLinks()).find((l) => l.ifname === links.veth);
  t.is(ip?.mtu, 1400);
  t.is(ip?.txqlen, 4321);
  t.is((await linkByName(links.veth)).mtu, 1400);
  t.is((await linkByName(links.veth)).txQLen, 4321);
  await linkSetMtu(links.veth, 1400);
  await linkSetTxQLen(links.veth, 4321);
  await linkSetMtu(links.bridge, 9000);
  await linkSetTxQLen(links.bridge, 0);
  ip = (await ipLinks()).find((l) => l.ifname === links.bridge);
  t.is(ip?.mtu, 9000);
  t.is(ip?.txqlen ?? 0, 0);
  // Other attributes are left alone.
  t.true((await linkByName(links.bridge)).up);
  t.is((await linkByName(links.veth)).master, (await linkByName(links.bridge)).index);
});

kTest('link changes report kernel refusals and absence by errno', async (t) => {
  const links = await makeLinks(t);
  await netlinkErrno(t, () => linkSetMtu(links.veth, 70000), EINVAL, 'MTU above the veth maximum');
  await netlinkErrno(t, () => linkSetMtu(links.veth, 60), EINVAL, 'MTU below the minimum');
  t.is((await linkByName(links.veth)).mtu, 1500, 'unchanged');
  const missing = linkName('v');
  await netlinkErrno(t, () => linkByName(missing), ENODEV, 'linkByName missing');
  await netlinkErrno(t, () => linkSetMtu(missing, 1400), ENODEV, 'linkSetMtu missing');
  await netlinkErrno(t, () => linkSetTxQLen(missing, 10), ENODEV, 'linkSetTxQLen missing');
  await netlinkErrno(t, () => setPromiscOn(missing), ENODEV, 'setPromiscOn missing');
  await netlinkErrno(t, () => setPromiscOff(missing), ENODEV, 'setPromiscOff missing');
  await netlinkErrno(t, () => addrList(missing), ENODEV, 'addrList missing');
  const err = await t.throwsAsync(linkByName(missing), { instanceOf: NetlinkError });
  t.true(err?.message.includes(missing), 'message names the link');
  // The host socket still works after errors.
  t.is((await linkByName(links.veth)).name, links.veth);
});

kTest('linkByIndex finds the same link as linkByName; a missing index is ENODEV', async (t) => {
  const links = await makeLinks(t);
  for (const name of ['lo', links.bridge, links.veth])
    t.deepEqual(withoutFlags(await linkByIndex((await linkByName(name)).index)), withoutFlags(await linkByName(name)), name);
  const gone = (await linkByName(links.peer)).index;
  await sh('ip', ['link', 'del', links.veth]);
  await netlinkErrno(t, () => linkByIndex(gone), ENODEV, 'deleted veth peer by index');
  await t.throwsAsync(linkByIndex(0), { instanceOf: ConfigError });
  await t.throwsAsync(linkByIndex(-3), { instanceOf: ConfigError });
});

kTest(
  'a veth whose peer is in another netns: peerIndex is the index there and peerElsewhere is set, from both sides, as ip -d shows',
  async (t) => {
    const links = await makeLinks(t);
    t.false((await linkByName(links.veth)).peerElsewhere, 'both ends in one namespace');
    const ns = await makeNetns(t);
    await sh('ip', ['link', 'set', links.peer, 'netns', ns.name]);
    const host = await linkByName(links.veth);
    const inPod = await netnsLinkByName(ns.path, links.peer);
    t.truthy(inPod);
    t.true(host.peerElsewhere && (inPod?.peerElsewhere ?? false));
    t.is(host.peerIndex, inPod?.index ?? -1, 'the host end names the pod end by its index in the pod netns');
    t.is(inPod?.peerIndex, host.index, 'and the other way round');
    const ip = (await ipLinks()).find((l) => l.ifname === links.veth);
    t.deepEqual(withoutFlags(host), withoutFlags(expectedLink(ip as IpLink, await ipLinks())));
  },
);

kTest(
  'linkDelete: the veth pair is gone (both ends, peer in a netns) when it resolves; the request then finishes without error',
  async (t) => {
    const links = await makeLinks(t);
    const ns = await makeNetns(t);
    await sh('ip', ['link', 'set', links.peer, 'netns', ns.name]);
    await sh('ip', ['-n', ns.name, 'addr', 'add', '10.250.0.2/24', 'dev', links.peer]);
    await sh('ip', ['link', 'set', links.veth, 'up']);
    const index = (await linkByName(links.veth)).index;
    t.true(linkIndexExists(index));
    const started = performance.now();
    const { goneMs, finished } = await linkDelete(index);
    t.false(linkIndexExists(index), 'no link by that index once linkDelete resolved');
    let answered = false;
    void finished.then(() => (answered = true));
    t.true(answered || linkDeletionsInFlight() >= 1, 'counted in flight until the kernel answers');
    const host = await ipLinks();
    t.false(
      host.some((l) => l.ifname === links.veth || l.ifindex === index),
      'host end gone',
    );
    t.true(
      host.some((l) => l.ifname === links.bridge),
      'the bridge stays',
    );
    t.false(
      (await ipLinks(ns.name)).some((l) => l.ifname === links.peer),
      'peer gone from the pod netns',
    );
    await t.notThrowsAsync(finished, 'the kernel finished the delete without error');
    await linkDeletionsSettled();
    t.is(linkDeletionsInFlight(), 0);
    t.log(`gone after ${goneMs.toFixed(2)} ms; the kernel answered after ${(performance.now() - started).toFixed(2)} ms or less`);
    // Deleting what is already gone succeeds at once (idempotent, as the contract says).
    const again = await linkDelete(index);
    await t.notThrowsAsync(again.finished);
    await t.throwsAsync(linkDelete(0), { instanceOf: ConfigError });
    // A delete the kernel refuses rejects with its errno and leaves the link: loopback cannot be
    // deleted (EOPNOTSUPP), so this is the one refusal that is safe to ask for in the host namespace.
    const lo = (await linkByName('lo')).index;
    const refused = await t.throwsAsync(linkDelete(lo), { instanceOf: NetlinkError });
    t.is(refused?.errno, 95, refused?.message);
    t.is((await linkByName('lo')).index, lo, 'lo is still there');
    t.true(linkIndexExists(lo));
    t.false(linkIndexExists(0x7ffffff0), 'an index no link has');
  },
);

kTest('linkDelete: many at once (more than its worker budget) all end gone and finished', async (t) => {
  const pairs = Array.from({ length: 8 }, () => ({ veth: linkName('v'), peer: linkName('p') }));
  t.teardown(async () => {
    for (const p of pairs) await sh('ip', ['link', 'del', p.veth], { reject: false });
  });
  for (const p of pairs) await sh('ip', ['link', 'add', p.veth, 'type', 'veth', 'peer', 'name', p.peer]);
  const dels = await Promise.all(pairs.map(async (p) => linkDelete((await linkByName(p.veth)).index)));
  await Promise.all(dels.map((d) => d.finished));
  const names = new Set((await ipLinks()).map((l) => l.ifname));
  for (const p of pairs) t.false(names.has(p.veth) || names.has(p.peer), `${p.veth} and ${p.peer} gone`);
});

kSerialTest(
  'linkDelete veth: veths asked while one is being deleted go together in one group request; a bystander and its group stay',
  async (t) => {
    const ns = await makeNetns(t);
    const pairs = Array.from({ length: 9 }, () => ({ veth: linkName('v'), peer: linkName('p') }));
    const bystander = { veth: linkName('v'), peer: linkName('p') };
    t.teardown(async () => {
      for (const p of [...pairs, bystander]) await sh('ip', ['link', 'del', p.veth], { reject: false });
    });
    for (const p of pairs) {
      await sh('ip', ['link', 'add', p.veth, 'type', 'veth', 'peer', 'name', p.peer, 'netns', ns.name]);
      await sh('ip', ['link', 'set', p.veth, 'up']);
    }
    await sh('ip', ['link', 'add', bystander.veth, 'type', 'veth', 'peer', 'name', bystander.peer]);
    await sh('ip', ['link', 'set', bystander.veth, 'group', '7']);
    const indexes = await Promise.all(pairs.map(async (p) => (await linkByName(p.veth)).index));
    // One of the batch is already gone when its turn comes: a success, as for any delete.
    const goneBefore = pairs.pop()!;
    const goneIndex = indexes.pop()!;
    await sh('ip', ['link', 'del', goneBefore.veth]);
    indexes.splice(3, 0, goneIndex);
    const before = linkDeletionCounts();
    const dels = await Promise.all(indexes.map((i) => linkDelete(i, { veth: true })));
    const after = linkDeletionCounts();
    t.is(after.links - before.links, 9);
    // The first went alone (nothing in flight); the eight asked meanwhile went in one request, the
    // one already gone without any.
    t.deepEqual(
      dels.map((d) => d.together),
      [1, 7, 7, 0, 7, 7, 7, 7, 7],
    );
    for (const i of indexes) t.false(linkIndexExists(i), `index ${i} gone once linkDelete resolved`);
    await Promise.all(dels.map((d) => d.finished));
    const host = await ipLinks();
    const inNs = await ipLinks(ns.name);
    for (const p of pairs)
      t.false(host.some((l) => l.ifname === p.veth) || inNs.some((l) => l.ifname === p.peer), `${p.veth} and its peer gone`);
    const kept = (await ipJson<Array<{ ifname: string; group: string }>>(['-d', 'link', 'show', 'dev', bystander.veth]))[0];
    t.is(kept?.group, '7', 'the bystander is still there, in its own group');
    t.true(
      (await ipLinks()).some((l) => l.ifname === bystander.peer),
      "the bystander's peer too",
    );
    await linkDeletionsSettled();
  },
);

kTest('setPromiscOn / setPromiscOff toggle PROMISC as ip sees it, idempotently', async (t) => {
  const links = await makeLinks(t);
  const flagsOf = async () => (await ipLinks()).find((l) => l.ifname === links.bridge)?.flags ?? [];
  t.false((await flagsOf()).includes('PROMISC'));
  await setPromiscOn(links.bridge);
  await setPromiscOn(links.bridge);
  t.true((await flagsOf()).includes('PROMISC'));
  t.true((await linkByName(links.bridge)).promisc);
  t.true((await linkByName(links.bridge)).up, 'UP kept');
  t.true(((await linkByName(links.bridge)).flags & 0x100) !== 0);
  await setPromiscOff(links.bridge);
  await setPromiscOff(links.bridge);
  t.false((await flagsOf()).includes('PROMISC'));
  t.false((await linkByName(links.bridge)).promisc);
  t.true((await linkByName(links.bridge)).up, 'UP kept');
});

kTest('addrList equals ip -j addr, per family', async (t) => {
  const links = await makeLinks(t);
  const o = 1 + Math.floor(Math.random() * 250);
  await sh('ip', ['addr', 'add', `198.18.${o}.1/24`, 'dev', links.bridge]);
  await sh('ip', ['addr', 'add', `198.19.${o}.7/30`, 'dev', links.bridge]);
  await sh('ip', ['addr', 'add', `fd6b:6e6c:${o.toString(16)}::1/64`, 'dev', links.bridge, 'nodad']);
  await sh('ip', ['addr', 'add', `fd6b:6e6c:${o.toString(16)}:0:0:0:0:abcd/128`, 'dev', links.bridge, 'nodad']);
  const expected = await ipAddrs(links.bridge);
  const ours = await addrList(links.bridge);
  t.deepEqual(ours, expected);
  t.true(ours.some((a) => a.cidr === `198.18.${o}.1/24` && a.family === 4 && a.scope === 0));
  t.true(
    ours.some((a) => a.cidr === `fd6b:6e6c:${o.toString(16)}::abcd/128`),
    'IPv6 in canonical form',
  );
  t.deepEqual(
    await addrList(links.bridge, 4),
    expected.filter((a) => a.family === 4),
  );
  t.deepEqual(
    await addrList(links.bridge, 6),
    expected.filter((a) => a.family === 6),
  );
  t.deepEqual(await addrList('lo'), await ipAddrs('lo'));
  t.deepEqual(await addrList(links.peer), await ipAddrs(links.peer));
});

kTest('addrDel removes one address and is idempotent (absent address, wrong prefix, absent link)', async (t) => {
  const links = await makeLinks(t);
  const o = 1 + Math.floor(Math.random() * 250);
  const v4 = `198.18.${o}.1/24`;
  const v4b = `198.19.${o}.2/24`; // another subnet: deleting a primary also drops its secondaries (kernel)
  const v6 = `fd6b:6e6c:${o.toString(16)}::1/64`;
  await sh('ip', ['addr', 'add', v4, 'dev', links.bridge]);
  await sh('ip', ['addr', 'add', v4b, 'dev', links.bridge]);
  await sh('ip', ['addr', 'add', v6, 'dev', links.bridge, 'nodad']);
  await addrDel(links.bridge, `198.18.${o}.1/16`); // same IP, other prefix: not this address
  t.true(
    (await ipAddrs(links.bridge)).some((a) => a.cidr === v4),
    'wrong prefix deletes nothing',
  );
  await addrDel(links.bridge, v4);
  let now = await ipAddrs(links.bridge);
  t.false(now.some((a) => a.cidr === v4));
  t.true(
    now.some((a) => a.cidr === v4b),
    'the other address stays',
  );
  await addrDel(links.bridge, v4);
  await addrDel(links.bridge, v6);
  await addrDel(links.bridge, v6);
  now = await ipAddrs(links.bridge);
  t.false(now.some((a) => a.cidr === v6));
  t.deepEqual(await addrList(links.bridge), now);
  await t.notThrowsAsync(addrDel(linkName('b'), v4), 'absent link');
  await t.notThrowsAsync(addrDel(links.peer, '198.51.100.1/24'), 'link without addresses');
});

kTest('netnsAddrList reads a link inside another namespace and leaves the thread where it was', async (t) => {
  const links = await makeLinks(t);
  const ns = await makeNetns(t);
  const o = 1 + Math.floor(Math.random() * 250);
  await sh('ip', ['link', 'set', links.peer, 'netns', ns.name]);
  await sh('ip', ['-n', ns.name, 'addr', 'add', `198.18.${o}.5/24`, 'dev', links.peer]);
  await sh('ip', ['-n', ns.name, 'addr', 'add', `fd6b:6e6c:${o.toString(16)}::5/64`, 'dev', links.peer, 'nodad']);
  const nsBefore = readlinkSync('/proc/thread-self/ns/net');

  const ours = await netnsAddrList(ns.path, links.peer);
  t.is(readlinkSync('/proc/thread-self/ns/net'), nsBefore, 'back in the host namespace');
  t.deepEqual(ours, await ipAddrs(links.peer, ns.name));
  t.is(ours.length, 2);
  t.deepEqual(await netnsAddrList(ns.path, links.peer, 4), [
    { family: 4, ip: `198.18.${o}.5`, prefixLen: 24, cidr: `198.18.${o}.5/24`, scope: 0 },
  ]);
  t.deepEqual(
    (await netnsAddrList(ns.path, links.peer, 6)).map((a) => a.cidr),
    [`fd6b:6e6c:${o.toString(16)}::5/64`],
  );
  t.deepEqual(await netnsAddrList(ns.path, 'lo'), await ipAddrs('lo', ns.name), 'lo is down: no addresses');

  // The link is gone from the host namespace, and host calls still use the host socket.
  await netlinkErrno(t, () => linkByName(links.peer), ENODEV, 'moved link not in host');
  await netlinkErrno(t, () => netnsAddrList(ns.path, links.veth), ENODEV, 'host link not in pod netns');
  t.is((await linkByName(links.veth)).name, links.veth);
  t.is(readlinkSync('/proc/thread-self/ns/net'), nsBefore);
});

kTest('linkBasics and netnsLinkIndex (ioctls, no netlink) match ip -j link; absent links are undefined', async (t) => {
  const links = await makeLinks(t);
  await setPromiscOn(links.bridge);
  await linkSetMtu(links.bridge, 1400);
  const ip = (await ipLinks()).find((l) => l.ifname === links.bridge);
  const basics = linkBasics(links.bridge);
  t.like(basics, { index: ip?.ifindex, mtu: 1400, txQLen: ip?.txqlen ?? 0, up: true, promisc: true });
  t.is(basics?.flags, (await linkByName(links.bridge)).flags, 'the flags netlink reports');
  t.is(linkBasics(linkName('b')), undefined);
  const ns = await makeNetns(t);
  await sh('ip', ['link', 'set', links.peer, 'netns', ns.name]);
  const nsBefore = readlinkSync('/proc/thread-self/ns/net');
  const inPod = (await ipLinks(ns.name)).find((l) => l.ifname === links.peer);
  t.is(netnsLinkIndex(ns.path, links.peer), inPod?.ifindex);
  t.is(netnsLinkIndex(ns.path, links.veth), undefined, 'the host end is not in the pod netns');
  t.is(readlinkSync('/proc/thread-self/ns/net'), nsBefore, 'back in the host namespace');
  await netlinkErrno(t, () => netnsLinkIndex(`/var/run/netns/knl-${TAG}-absent`, 'eth0'), ENOENT, 'missing netns path');
  await netlinkErrno(t, () => netnsLinkIndex('/proc/self/stat', 'lo'), EINVAL, 'not a namespace file');
  t.throws(() => netnsLinkIndex(ns.path, 'a/b'), { instanceOf: ConfigError });
});

kTest('netnsAddrList errors: missing path ENOENT, not a netns EINVAL, thread unchanged', async (t) => {
  const nsBefore = readlinkSync('/proc/thread-self/ns/net');
  await netlinkErrno(t, () => netnsAddrList(`/var/run/netns/knl-${TAG}-absent`, 'eth0'), ENOENT, 'missing netns path');
  await netlinkErrno(t, () => netnsAddrList('/proc/self/stat', 'lo'), EINVAL, 'not a namespace file');
  t.is(readlinkSync('/proc/thread-self/ns/net'), nsBefore);
  t.is((await linkByName('lo')).name, 'lo');
});

kTest('netnsAddrList on a deleted netns (after ip netns del) is ENOENT', async (t) => {
  const ns = await makeNetns(t);
  t.deepEqual(await netnsAddrList(ns.path, 'lo'), []);
  await sh('ip', ['netns', 'del', ns.name]);
  await netlinkErrno(t, () => netnsAddrList(ns.path, 'lo'), ENOENT, 'deleted netns');
});

/** `tc -s class show dev X` (iproute2 6.1 has no JSON for classes): the fields compared. */
interface TcTextClass {
  kind: string;
  handle: string;
  parent: string | undefined;
  stats: { bytes: number; packets: number; drops: number; overlimits: number; backlog: number; qlen: number };
}

function parseTcClasses(text: string): TcTextClass[] {
  const out: TcTextClass[] = [];
  for (const block of text.split(/\n(?=class )/)) {
    const head = /^class (\S+) (\S+) (?:root|parent (\S+))/.exec(block);
    const sent = /Sent (\d+) bytes (\d+) pkt \(dropped (\d+), overlimits (\d+)/.exec(block);
    const backlog = /backlog (\d+)b (\d+)p/.exec(block);
    if (!head || !sent || !backlog) continue;
    const n = (s: string | undefined) => Number(s);
    out.push({
      kind: head[1] ?? '',
      handle: head[2] ?? '',
      parent: head[3],
      stats: {
        bytes: n(sent[1]),
        packets: n(sent[2]),
        drops: n(sent[3]),
        overlimits: n(sent[4]),
        backlog: n(backlog[1]),
        qlen: n(backlog[2]),
      },
    });
  }
  return out;
}

kTest('classList reads every class of a device with the kernel counters tc -s shows; linkStats matches ip -s', async (t) => {
  const ns = await makeNetns(t);
  const veth = linkName('v');
  t.teardown(() => sh('ip', ['link', 'del', veth], { reject: false }));
  const o = 1 + Math.floor(Math.random() * 250);
  await sh('ip', ['link', 'add', veth, 'type', 'veth', 'peer', 'name', 'eth0', 'netns', ns.name]);
  // No IPv6 on either end: its own chatter (MLD reports, neighbour discovery) would move the
  // counters between two reads that must agree (seen once: one 110-byte packet).
  await sh('sysctl', ['-q', '-w', `net.ipv6.conf.${veth}.disable_ipv6=1`]);
  await sh('ip', ['netns', 'exec', ns.name, 'sysctl', '-q', '-w', 'net.ipv6.conf.eth0.disable_ipv6=1']);
  await sh('ip', ['addr', 'add', `198.18.${o}.1/24`, 'dev', veth]);
  await sh('ip', ['link', 'set', veth, 'up']);
  await sh('ip', ['-n', ns.name, 'addr', 'add', `198.18.${o}.2/24`, 'dev', 'eth0']);
  await sh('ip', ['-n', ns.name, 'link', 'set', 'eth0', 'up']);
  t.deepEqual(classList(veth), [], 'no classes yet');
  await sh('tc', ['qdisc', 'add', 'dev', veth, 'root', 'handle', '2:', 'htb', 'default', '3']);
  await sh('tc', ['class', 'add', 'dev', veth, 'parent', '2:', 'classid', '2:1', 'htb', 'rate', '8mbit', 'ceil', '8mbit']);
  await sh('tc', ['class', 'add', 'dev', veth, 'parent', '2:1', 'classid', '2:3', 'htb', 'rate', '3mbit', 'ceil', '8mbit', 'prio', '1']);
  await sh('tc', ['qdisc', 'add', 'dev', veth, 'parent', '2:3', 'handle', '23:', 'bfifo', 'limit', '3000']);
  // Traffic through the classes (replies of the pod end, sent out of the veth): ours only.
  await sh('ping', ['-q', '-c', '5', '-i', '0.05', '-s', '1200', '-W', '1', `198.18.${o}.2`], { reject: false });
  const ours = classList(veth);
  const theirs = parseTcClasses((await sh('tc', ['-s', 'class', 'show', 'dev', veth])).stdout);
  const toHandle = (h: string) => {
    const [maj, min] = h.split(':');
    return ((parseInt(maj ?? '0', 16) << 16) | parseInt(min || '0', 16)) >>> 0;
  };
  const htb = ours.filter((c) => c.kind === 'htb');
  t.deepEqual(htb.map((c) => c.handle).sort(), [toHandle('2:1'), toHandle('2:3')]);
  t.is(theirs.filter((x) => x.kind === 'htb').length, 2);
  for (const c of theirs.filter((x) => x.kind === 'htb')) {
    const mine = ours.find((x) => x.handle === toHandle(c.handle));
    t.truthy(mine, c.handle);
    t.like(
      mine,
      {
        bytes: c.stats.bytes,
        packets: c.stats.packets,
        drops: c.stats.drops,
        overlimits: c.stats.overlimits,
        backlog: c.stats.backlog,
        qlen: c.stats.qlen,
      },
      c.handle,
    );
    t.is(mine?.parent, c.parent === undefined ? 0xffffffff : toHandle(c.parent), `${c.handle} parent`);
  }
  const pod = ours.find((c) => c.handle === toHandle('2:1'));
  t.is(pod?.rate, 8_000_000);
  t.is(pod?.ceil, 8_000_000);
  t.is(ours.find((c) => c.handle === toHandle('2:3'))?.rate, 3_000_000);
  t.true((pod?.packets ?? 0) >= 5 && (pod?.bytes ?? 0) >= 5 * 1200, `the replies went through 2:1: ${JSON.stringify(pod)}`);
  t.deepEqual(classList((await linkByName(veth)).index), ours, 'by ifindex: the same');
  // One class by its handle, without the dump: the same figures; absent ones are undefined, and the
  // socket stays in step (every reply and ACK read) for the calls after them.
  const index = (await linkByName(veth)).index;
  for (const c of ours) t.deepEqual(classGet(index, c.handle), c, `classGet ${c.handle.toString(16)}`);
  t.is(classGet(index, toHandle('2:9')), undefined, 'no class 2:9');
  t.is(classGet(index, toHandle('7:1')), undefined, 'no qdisc 7:');
  t.deepEqual(classGet(index, toHandle('2:1')), pod, 'after two misses');
  t.deepEqual(classList(veth), ours, 'a dump after the gets');
  await netlinkErrno(t, () => classGet(0x7ffffff0, toHandle('2:1')), ENODEV, 'classGet on a missing ifindex');

  const stats = linkStats(veth);
  const ip = (
    await ipJson<
      Array<{
        stats64: { rx: { bytes: number; packets: number; dropped: number }; tx: { bytes: number; packets: number; dropped: number } };
      }>
    >(['-s', 'link', 'show', 'dev', veth])
  )[0];
  t.deepEqual(stats, {
    rxBytes: ip?.stats64.rx.bytes,
    txBytes: ip?.stats64.tx.bytes,
    rxPackets: ip?.stats64.rx.packets,
    txPackets: ip?.stats64.tx.packets,
    rxDropped: ip?.stats64.rx.dropped,
    txDropped: ip?.stats64.tx.dropped,
  });
  t.deepEqual(linkStats((await linkByName(veth)).index), stats);
  await netlinkErrno(t, () => classList(linkName('v')), ENODEV, 'classList of a missing link');
  await netlinkErrno(t, () => linkStats(linkName('v')), ENODEV, 'linkStats of a missing link');
  t.throws(() => classList('a/b'), { instanceOf: ConfigError });
});
