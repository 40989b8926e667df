/**
 * CniRuntime with the reference plugins (loopback; bridge + host-local, chained with tuning) in
 * network namespaces this test makes (`kcn-<tag>-<random>`), on a bridge it makes (`kcn<tag>…`),
 * with host-local's dataDir and the result cache in a temporary directory and 10.99.x.0/24
 * subnets. The bridge is not a gateway (isGateway false, ipMasq false), so nothing on the host
 * changes beyond the bridge and veths, which t.teardown / test.after.always remove. No traffic.
 * Needs root and the plugins; skips and says why otherwise.
 */
import test, { type ExecutionContext } from 'ava';
import { existsSync } from 'node:fs';
import { readdir } from 'node:fs/promises';
import { join } from 'node:path';
import { CniRuntime } from '../../src/cni/runtime.js';
import { findPlugin } from '../../src/cni/exec.js';
import { cidrFamily } from '../../src/cni/result.js';
import type { BridgeNetConf, CniResult, HostLocalIpamConf, LoopbackNetConf, NetConfList, RuntimeConf } from '../../src/cni/types.js';
import { addNetns, CNI_BIN_DIRS, delLink, delNetns, ipJson, isRoot, linkExists, makeTmpDir, rmrf, sh, uniq } from '../kit/kernel.js';

function blocker(): string | undefined {
  if (!isRoot) return `needs root (network namespaces, bridges, veths); running as uid ${process.getuid?.()}`;
  for (const p of ['loopback', 'bridge', 'host-local', 'tuning']) {
    try {
      findPlugin(p, CNI_BIN_DIRS);
    } catch {
      return `needs the reference CNI plugin ${p} in ${CNI_BIN_DIRS.join(' or ')} (bash hack/build-upstream.sh cni-plugins)`;
    }
  }
  return undefined;
}
const why = blocker();
const kTest = why ? test.skip : test;
if (why) console.warn(`real-plugin CNI tests skipped: ${why}`);

const TAG = uniq(4);
/** Everything this run made, removed at the end even if a test's own teardown did not run. */
const made = { netns: new Set<string>(), links: new Set<string>(), dirs: new Set<string>() };
test.after.always(async () => {
  for (const ns of made.netns) await delNetns(ns);
  for (const l of made.links) await delLink(l);
  for (const d of made.dirs) await rmrf(d);
});

interface Env {
  dir: string;
  runtime: CniRuntime;
  netns: { name: string; path: string };
  bridge: string;
  subnet: string;
  ipamDir: string;
  cacheDir: string;
}

async function env(t: ExecutionContext): Promise<Env> {
  const dir = await makeTmpDir('kcn-real');
  made.dirs.add(dir);
  const nsName = `kcn-${TAG}-${uniq(6)}`;
  made.netns.add(nsName);
  const netns = await addNetns(nsName);
  const bridge = `kcn${TAG}${uniq(6)}`; // 3+4+6 = 13 ≤ 15
  made.links.add(bridge);
  t.teardown(async () => {
    await delNetns(nsName);
    await delLink(bridge);
    await rmrf(dir);
  });
  const cacheDir = join(dir, 'cache');
  const runtime = new CniRuntime({ binDirs: CNI_BIN_DIRS, cacheDir, timeoutMs: 30_000 });
  const subnet = `10.99.${Math.floor(Math.random() * 256)}.0/24`;
  return { dir, runtime, netns, bridge, subnet, ipamDir: join(dir, 'ipam'), cacheDir };
}

function bridgeConf(e: Env, name: string): BridgeNetConf {
  const ipam: HostLocalIpamConf = {
    type: 'host-local',
    ranges: [[{ subnet: e.subnet }]],
    routes: [{ dst: '0.0.0.0/0' }],
    dataDir: e.ipamDir,
  };
  return {
    cniVersion: '1.0.0',
    name,
    type: 'bridge',
    bridge: e.bridge,
    isGateway: false,
    ipMasq: false,
    hairpinMode: true,
    mtu: 1400,
    ipam,
  };
}

function chain(e: Env, name: string): NetConfList {
  const { cniVersion: _v, name: _n, ...bridge } = bridgeConf(e, name);
  return {
    cniVersion: '1.0.0',
    name,
    plugins: [bridge, { type: 'tuning', sysctl: { 'net.ipv4.conf.eth0.accept_redirects': '0' }, dataDir: join(e.dir, 'tuning') }],
  };
}

function rtFor(e: Env, id: string, ifName = 'eth0'): RuntimeConf {
  return {
    containerId: id,
    netns: e.netns.path,
    ifName,
    args: [
      ['IgnoreUnknown', '1'],
      ['K8S_POD_NAMESPACE', 'kcn'],
      ['K8S_POD_NAME', id],
    ],
  };
}

/** True when a.b.c.d lies in the /24 `subnet`. */
function inSubnet24(ip: string, subnet: string): boolean {
  return ip.split('.').slice(0, 3).join('.') === subnet.split('.').slice(0, 3).join('.') && ip !== subnet.split('/')[0];
}

async function reservations(e: Env, net: string): Promise<string[]> {
  const d = join(e.ipamDir, net);
  if (!existsSync(d)) return [];
  return (await readdir(d)).filter((f) => /^\d+\.\d+\.\d+\.\d+$/.test(f));
}

const cacheFile = (e: Env, net: string, rt: RuntimeConf) => join(e.cacheDir, 'results', `${net}-${rt.containerId}-${rt.ifName}`);

function podAddress(r: CniResult): string {
  const a = r.ips.find((i) => cidrFamily(i.address) === 4)?.address;
  if (!a) throw new Error(`no IPv4 address in ${JSON.stringify(r)}`);
  return a;
}

kTest('loopback: ADD, CHECK, DEL (twice) in our own netns', async (t) => {
  const e = await env(t);
  const conf: LoopbackNetConf = { cniVersion: '1.0.0', name: 'kcn-lo', type: 'loopback' };
  const rt = rtFor(e, `lo-${uniq()}`, 'lo');
  const r = await e.runtime.addNetwork(conf, rt);
  t.is(r.cniVersion, '1.0.0');
  t.is(r.interfaces.length, 1);
  t.like(r.interfaces[0], { name: 'lo', sandbox: e.netns.path });
  t.true(r.ips.some((i) => i.address === '127.0.0.1/8'));
  const links = await ipJson<Array<{ ifname: string; flags: string[] }>>(['-n', e.netns.name, 'link', 'show', 'lo']);
  t.true(links[0]?.flags.includes('UP'));
  t.true(existsSync(cacheFile(e, 'kcn-lo', rt)));
  await e.runtime.checkNetwork(conf, rt);
  await e.runtime.delNetwork(conf, rt);
  t.false(existsSync(cacheFile(e, 'kcn-lo', rt)));
  await e.runtime.delNetwork(conf, rt);
  const after = await ipJson<Array<{ flags: string[] }>>(['-n', e.netns.name, 'link', 'show', 'lo']);
  t.false(after[0]?.flags.includes('UP'));
});

kTest('bridge + host-local (+ tuning chained): ADD, CHECK, DEL, DEL again; address and cache released', async (t) => {
  const e = await env(t);
  const list = chain(e, 'kcnnet');
  const rt = rtFor(e, `br-${uniq()}`);
  const r = await e.runtime.addNetworkList(list, rt);

  const addr = podAddress(r);
  const ip = addr.split('/')[0] ?? '';
  t.true(addr.endsWith('/24') && inSubnet24(ip, e.subnet), `${addr} in ${e.subnet}`);
  t.deepEqual(await e.runtime.getCachedResult('kcnnet', rt), r);
  t.true(existsSync(cacheFile(e, 'kcnnet', rt)));
  t.deepEqual(await reservations(e, 'kcnnet'), [ip]);
  const sandbox = r.interfaces.find((i) => i.sandbox === e.netns.path);
  t.is(sandbox?.name, 'eth0');
  const hostVeth = r.interfaces.find((i) => !i.sandbox && i.name !== e.bridge)?.name ?? '';
  t.true(r.interfaces.some((i) => i.name === e.bridge));
  t.true(await linkExists(hostVeth), `host veth ${hostVeth}`);
  const addrs = await ipJson<Array<{ addr_info: Array<{ local: string; prefixlen: number }> }>>([
    '-n',
    e.netns.name,
    'addr',
    'show',
    'eth0',
  ]);
  t.true(addrs[0]?.addr_info.some((a) => `${a.local}/${a.prefixlen}` === addr));
  const redirects = await sh('ip', ['netns', 'exec', e.netns.name, 'cat', '/proc/sys/net/ipv4/conf/eth0/accept_redirects']);
  t.is(redirects.stdout.trim(), '0', 'tuning ran with the bridge result as prevResult');

  await e.runtime.checkNetworkList(list, rt);

  await e.runtime.delNetworkList(list, rt);
  t.false(existsSync(cacheFile(e, 'kcnnet', rt)));
  t.deepEqual(await reservations(e, 'kcnnet'), []);
  t.false(await linkExists(hostVeth));
  t.false(await linkExists('eth0', e.netns.name));

  await e.runtime.delNetworkList(list, rt);
  t.false(await e.runtime.delFromCache('kcnnet', rt));
});

kTest('DEL after the netns is gone succeeds and releases the address (cached config, stale path and empty netns)', async (t) => {
  const e = await env(t);
  const conf = bridgeConf(e, 'kcngone');
  const rt = rtFor(e, `gone-${uniq()}`);
  const r = await e.runtime.addNetwork(conf, rt);
  const ip = podAddress(r).split('/')[0] ?? '';
  t.deepEqual(await reservations(e, 'kcngone'), [ip]);
  await delNetns(e.netns.name);
  t.false(existsSync(e.netns.path));

  // As after an agent restart: a new runtime, only the cache to go by, the stale netns path.
  const fresh = new CniRuntime({ binDirs: CNI_BIN_DIRS, cacheDir: e.cacheDir });
  t.true(await fresh.delFromCache('kcngone', rt));
  t.deepEqual(await reservations(e, 'kcngone'), []);
  t.false(existsSync(cacheFile(e, 'kcngone', rt)));
  // And with no netns at all, as kubenet passes once it is gone.
  await fresh.delNetwork(conf, { ...rt, netns: '' });
  await fresh.delNetwork(conf, rt);
});

kTest('two attachments on one bridge get distinct addresses; deleting one leaves the other', async (t) => {
  const e = await env(t);
  const ns2 = `kcn-${TAG}-${uniq(6)}`;
  made.netns.add(ns2);
  const second = await addNetns(ns2);
  t.teardown(() => delNetns(ns2));
  const conf = bridgeConf(e, 'kcntwo');
  const rt1 = rtFor(e, `a-${uniq()}`);
  const rt2: RuntimeConf = { ...rtFor(e, `b-${uniq()}`), netns: second.path };
  const [r1, r2] = await Promise.all([e.runtime.addNetwork(conf, rt1), e.runtime.addNetwork(conf, rt2)]);
  t.not(podAddress(r1), podAddress(r2));
  t.is((await reservations(e, 'kcntwo')).length, 2);
  await e.runtime.delNetwork(conf, rt1);
  t.deepEqual(await reservations(e, 'kcntwo'), [podAddress(r2).split('/')[0]]);
  t.true(existsSync(cacheFile(e, 'kcntwo', rt2)));
  await e.runtime.delNetwork(conf, rt2);
  t.deepEqual(await reservations(e, 'kcntwo'), []);
});

kTest('version() of the reference bridge plugin', async (t) => {
  const runtime = new CniRuntime({ binDirs: CNI_BIN_DIRS, cacheDir: '/nonexistent-unused' });
  const v = await runtime.version('bridge');
  t.true(v.supportedVersions.includes('1.0.0'));
  t.true(v.supportedVersions.includes('0.4.0'));
});
