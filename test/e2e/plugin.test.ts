import anyTest, { type TestFn } from 'ava';
import { pino } from 'pino';
import { chmod, readFile, symlink, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { CniPluginError, ConfigError, NotReadyError } from '../../src/errors.js';
import { MASQUERADE_COMMENT, removeMasquerade } from '../../src/pod/node/host-setup.js';
import { syncDedup } from '../../src/pod/node/dedup-rules.js';
import { silentLogger } from '../../src/log.js';
import { cidrContains, parseCidr } from '../../src/net/ip.js';
import { delNetns, ipJson, kernelTestBlocker, linkExists, makeTmpDir, rmrf, sh } from '../kit/kernel.js';
import type { KubenetPlugin } from '../../src/plugin/kubenet.js';
import type { KubenetOptions } from '../../src/plugin/types.js';
import { CNI_BIN_DIRS, PluginHarness } from '../kit/plugin-harness.js';

const blocker = kernelTestBlocker();
const test = anyTest as TestFn;
const serialTest = blocker ? test.skip : test.serial;
const itest = blocker ? test.skip : test;
if (blocker) console.warn(`plugin e2e tests skipped: ${blocker}`);

/** Each test gets its own /24 so tests in parallel never share a subnet. */
let nextSubnet = 10;
const subnet = () => `10.97.${nextSubnet++}.0/24`;

async function harness(t: { teardown: (fn: () => Promise<void>) => void }): Promise<PluginHarness> {
  const h = new PluginHarness();
  t.teardown(() => h.cleanup.run());
  return h;
}

/** A started plugin, initialized (hairpin none, no masquerade) and given a pod CIDR of its own. */
async function ready(h: PluginHarness, opts: Partial<KubenetOptions> = {}): Promise<{ plugin: KubenetPlugin; cidr: string }> {
  const plugin = await h.start(opts);
  await plugin.init(h.host, 'none', '0.0.0.0/0');
  const cidr = subnet();
  await plugin.event('pod-cidr-change', { 'pod-cidr': cidr });
  return { plugin, cidr };
}

interface IpRoute {
  dst: string;
  gateway?: string;
}
interface IpLink {
  ifname: string;
  mtu: number;
  txqlen?: number;
  flags: string[];
  master?: string;
}

serialTest('several pods on one bridge: addresses, routes, reachability, bridge settings, clean teardown', async (t) => {
  const h = await harness(t);
  const plugin = await h.start({ mtu: 1400 });
  // promiscuous-bridge mode keeps kubenet's dedup rules in this (the host's) netns: gone afterwards.
  t.teardown(() => syncDedup(undefined, silentLogger()).then(() => undefined));
  await plugin.init(h.host, 'promiscuous-bridge', '0.0.0.0/0');
  const cidr = subnet();
  await plugin.event('pod-cidr-change', { 'pod-cidr': cidr });
  plugin.status();
  const pods = await Promise.all(['a', 'b', 'c'].map((n) => h.addPod(n)));
  // Different pods set up in parallel.
  await Promise.all(pods.map((p) => plugin.setUpPod(p.namespace, p.name, p.id)));

  const sub = parseCidr(cidr);
  const gateway = sub.network.replace(/\.0$/, '.1');
  const ips: string[] = [];
  for (const p of pods) {
    const status = await plugin.getPodNetworkStatus(p.namespace, p.name, p.id);
    t.true(cidrContains(sub, status.ip), `${status.ip} in ${cidr}`);
    t.deepEqual(status.ips, [status.ip]);
    ips.push(status.ip);
    const routes = await ipJson<IpRoute[]>(['-n', p.netns, 'route', 'show', 'default']);
    t.is(routes[0]?.gateway, gateway, `default route of ${p.name} via the gateway`);
    const [eth0] = await ipJson<IpLink[]>(['-n', p.netns, 'link', 'show', 'eth0']);
    t.is(eth0?.mtu, 1400);
  }
  t.is(new Set(ips).size, 3, 'distinct addresses');

  // The bridge: MTU as configured, txqueuelen non-zero, promiscuous for hairpin, gateway address.
  const [br] = await ipJson<IpLink[]>(['link', 'show', h.bridge]);
  t.is(br?.mtu, 1400);
  t.true((br?.txqlen ?? 0) > 0);
  t.true(br?.flags.includes('PROMISC'));
  const brAddrs = await ipJson<Array<{ addr_info: Array<{ local: string }> }>>(['addr', 'show', h.bridge]);
  t.true(brAddrs[0]?.addr_info.some((a) => a.local === gateway));
  const ports = await ipJson<IpLink[]>(['link', 'show', 'master', h.bridge]);
  t.is(ports.length, 3);

  // Pods reach each other across the bridge (only the test's own namespaces).
  for (const [from, to] of [
    [0, 1],
    [1, 2],
    [2, 0],
  ] as const) {
    const r = await sh('ip', ['netns', 'exec', pods[from]!.netns, 'ping', '-c', '1', '-W', '2', ips[to]!], { reject: false });
    t.is(r.exitCode, 0, `ping ${pods[from]!.name} -> ${ips[to]}: ${r.stdout}`);
  }
  t.is((await h.reservedIps()).length, 3);
  t.is((await h.recordFiles()).length, 3, 'one record per pod');
  t.deepEqual(await h.cacheEntries(), [], 'nothing written where runtimes keep their CNI cache');

  // A fresh plugin (no memory of the pods) reads the status from the pod's netns.
  const fresh = h.newPlugin();
  await fresh.init(h.host, 'none', '0.0.0.0/0');
  t.deepEqual((await fresh.getPodNetworkStatus('default', 'a', pods[0]!.id)).ips, [ips[0]]);

  await Promise.all(pods.map((p) => plugin.tearDownPod(p.namespace, p.name, p.id)));
  t.deepEqual(await ipJson<IpLink[]>(['link', 'show', 'master', h.bridge]), [], 'no veth left on the bridge');
  t.deepEqual(await h.reservedIps(), [], 'no address file left');
  t.deepEqual(await h.recordFiles(), [], 'no record left');
  t.deepEqual(plugin.listPods(), []);
  for (const p of pods) t.false(await linkExists('eth0', p.netns));
});

itest('dual-stack pod CIDR gives each pod an address and default route per family', async (t) => {
  const h = await harness(t);
  const plugin = await h.start();
  await plugin.init(h.host, 'hairpin-veth', '0.0.0.0/0');
  const v4 = subnet();
  const v6prefix = `fd00:97:${nextSubnet}:`;
  await plugin.event('pod-cidr-change', { 'pod-cidr': `${v4},${v6prefix}:/64` });
  const p = await h.addPod('ds');
  await plugin.setUpPod(p.namespace, p.name, p.id);
  const status = await plugin.getPodNetworkStatus(p.namespace, p.name, p.id);
  t.is(status.ips.length, 2);
  t.true(cidrContains(parseCidr(v4), status.ip), 'primary IP is the IPv4 one');
  t.true(
    status.ips.some((ip) => ip.startsWith(v6prefix)),
    status.ips.join(','),
  );
  const v6routes = await ipJson<IpRoute[]>(['-6', '-n', p.netns, 'route', 'show', 'default']);
  t.is(v6routes.length, 1);
  // hairpin-veth mode: the pod's bridge port has hairpin on.
  const ports = await ipJson<Array<{ ifname: string }>>(['link', 'show', 'master', h.bridge]);
  const detail = await ipJson<Array<{ linkinfo?: { info_slave_data?: { hairpin?: boolean } } }>>(['-d', 'link', 'show', ports[0]!.ifname]);
  t.true(detail[0]?.linkinfo?.info_slave_data?.hairpin);
  await plugin.tearDownPod(p.namespace, p.name, p.id);
  t.deepEqual(await h.reservedIps(), []);
});

itest('setUpPod and status before any pod CIDR fail clearly', async (t) => {
  const h = await harness(t);
  const plugin = await h.start();
  t.throws(() => plugin.status(), { instanceOf: NotReadyError, message: /not initialized/ });
  await plugin.init(h.host, 'none', '0.0.0.0/0');
  t.throws(() => plugin.status(), { instanceOf: NotReadyError, message: /no pod CIDR/ });
  const p = await h.addPod('early');
  await t.throwsAsync(plugin.setUpPod(p.namespace, p.name, p.id), { instanceOf: NotReadyError, message: /no pod CIDR/ });
  t.false(await linkExists(h.bridge));
});

itest('malformed pod CIDR is refused and the old config stays', async (t) => {
  const h = await harness(t);
  const { plugin, cidr } = await ready(h);
  const before = JSON.stringify(plugin.currentConfig());
  for (const bad of ['10.97.1.0', '10.97.300.0/24', '10.97.1.0/33', 'banana/24', '', '10.1.0.0/24,10.2.0.0/24', '10.1.0.0/31']) {
    await t.throwsAsync(plugin.event('pod-cidr-change', { 'pod-cidr': bad }), { instanceOf: ConfigError }, bad);
  }
  t.is(JSON.stringify(plugin.currentConfig()), before);
  // And the old config still sets pods up.
  const p = await h.addPod('keep');
  await plugin.setUpPod(p.namespace, p.name, p.id);
  t.true(cidrContains(parseCidr(cidr), (await plugin.getPodNetworkStatus(p.namespace, p.name, p.id)).ip));
  await plugin.tearDownPod(p.namespace, p.name, p.id);
});

itest('a changed pod CIDR removes the stale gateway address from the bridge', async (t) => {
  const h = await harness(t);
  const { plugin, cidr: first } = await ready(h);
  const p = await h.addPod('old');
  await plugin.setUpPod(p.namespace, p.name, p.id);
  await plugin.tearDownPod(p.namespace, p.name, p.id);
  const oldGw = first.replace(/0\/24$/, '1');
  const addrs = async () =>
    (await ipJson<Array<{ addr_info: Array<{ local: string; family: string }> }>>(['addr', 'show', h.bridge]))[0]?.addr_info
      .filter((a) => a.family === 'inet')
      .map((a) => a.local) ?? [];
  t.deepEqual(await addrs(), [oldGw]);
  const second = subnet();
  await plugin.event('pod-cidr-change', { 'pod-cidr': second });
  t.deepEqual(await addrs(), []);
  const q = await h.addPod('new');
  await plugin.setUpPod(q.namespace, q.name, q.id);
  t.deepEqual(await addrs(), [second.replace(/0\/24$/, '1')]);
  await plugin.tearDownPod(q.namespace, q.name, q.id);
});

itest('missing CNI binaries: status and setUpPod name the dirs searched', async (t) => {
  const h = await harness(t);
  const empty = await makeTmpDir('kpl-bin');
  t.teardown(() => rmrf(empty));
  const { plugin } = await ready(h, { cniBinDirs: [empty] });
  const err = t.throws(() => plugin.status(), { instanceOf: NotReadyError });
  t.regex(err?.message ?? '', /bridge, host-local, loopback/);
  t.true(err?.message.includes(empty));
  const p = await h.addPod('nobin');
  const setupErr = await t.throwsAsync(plugin.setUpPod(p.namespace, p.name, p.id), { instanceOf: ConfigError });
  t.true(setupErr?.message.includes(empty), setupErr?.message);
  t.regex(setupErr?.message ?? '', /loopback/);
});

itest('missing netns is refused before any kernel change', async (t) => {
  const h = await harness(t);
  const { plugin } = await ready(h);
  const p = await h.addPod('gone');
  await delNetns(p.netns);
  await t.throwsAsync(plugin.setUpPod(p.namespace, p.name, p.id), { instanceOf: ConfigError, message: /does not exist/ });
  t.deepEqual(await h.reservedIps(), []);
  t.deepEqual(await h.recordFiles(), []);
});

itest('an exhausted pod CIDR fails the next pod and leaks nothing', async (t) => {
  const h = await harness(t);
  const plugin = await h.start();
  await plugin.init(h.host, 'none', '0.0.0.0/0');
  // A /29: network, gateway .1 and broadcast leave .2-.6 for five pods.
  await plugin.event('pod-cidr-change', { 'pod-cidr': `10.97.${nextSubnet++}.8/29` });
  const pods = [];
  for (let i = 0; i < 6; i++) pods.push(await h.addPod(`x${i}`));
  for (const p of pods.slice(0, 5)) await plugin.setUpPod(p.namespace, p.name, p.id);
  const last = pods[5]!;
  const err = await t.throwsAsync(plugin.setUpPod(last.namespace, last.name, last.id), { instanceOf: CniPluginError });
  t.is(err?.plugin, 'bridge');
  t.regex(err?.message ?? '', /no IP addresses available|range/i);
  t.is((await h.reservedIps()).length, 5);
  t.false(await linkExists('eth0', last.netns), 'no veth left in the failed pod');
  t.is((await ipJson<IpLink[]>(['link', 'show', 'master', h.bridge])).length, 5, 'no extra veth on the bridge');
  for (const p of pods.slice(0, 5)) await plugin.tearDownPod(p.namespace, p.name, p.id);
  t.deepEqual(await h.reservedIps(), []);
  t.deepEqual(await h.recordFiles(), []);
});

itest('a plugin returning a CNI error fails setUpPod with its code and leaks nothing', async (t) => {
  const h = await harness(t);
  const bin = await makeTmpDir('kpl-fakebin');
  t.teardown(() => rmrf(bin));
  const realDir = CNI_BIN_DIRS[0]!;
  await symlink(join(realDir, 'loopback'), join(bin, 'loopback'));
  await symlink(join(realDir, 'host-local'), join(bin, 'host-local'));
  // A bridge that refuses ADD with a CNI error object and succeeds on DEL.
  await writeFile(
    join(bin, 'bridge'),
    `#!/bin/sh\ncat >/dev/null\nif [ "$CNI_COMMAND" = ADD ]; then\n  echo '{"cniVersion":"1.0.0","code":7,"msg":"invalid network config","details":"fake bridge says no"}'\n  exit 1\nfi\nexit 0\n`,
  );
  await chmod(join(bin, 'bridge'), 0o755);
  const { plugin } = await ready(h, { cniBinDirs: [bin] });
  const p = await h.addPod('err');
  const err = await t.throwsAsync(plugin.setUpPod(p.namespace, p.name, p.id), { instanceOf: CniPluginError });
  t.is(err?.code, 7);
  t.is(err?.details, 'fake bridge says no');
  t.deepEqual(plugin.listPods(), []);
  t.deepEqual(await h.recordFiles(), [], 'no record of the failed pod');
});

itest('teardown of an unknown pod and of a pod whose netns vanished succeeds and leaks nothing', async (t) => {
  const h = await harness(t);
  const { plugin } = await ready(h);
  await plugin.tearDownPod('default', 'never', 'f'.repeat(64));
  const p = await h.addPod('vanish');
  await plugin.setUpPod(p.namespace, p.name, p.id);
  await plugin.setUpPod(p.namespace, p.name, p.id).catch(() => undefined); // a retry must not break teardown
  await delNetns(p.netns);
  await plugin.tearDownPod(p.namespace, p.name, p.id);
  await plugin.tearDownPod(p.namespace, p.name, p.id); // twice, as runtimes do
  t.deepEqual(await h.reservedIps(), []);
  t.deepEqual(await h.recordFiles(), []);
  t.deepEqual(await ipJson<IpLink[]>(['link', 'show', 'master', h.bridge]), []);
});

itest('a restarted plugin tears down a pod it did not set up, through its record', async (t) => {
  const h = await harness(t);
  const { plugin: first } = await ready(h);
  const p = await h.addPod('restart');
  await first.setUpPod(p.namespace, p.name, p.id);
  // Its logs say which way the veth went: deleted from the host side, found by the recorded ifindex.
  const lines: string[] = [];
  const logger = pino({ level: 'debug' }, { write: (l: string) => void lines.push(l) });
  const second = h.newPlugin({ logger });
  await second.init(h.host, 'none', '0.0.0.0/0');
  t.deepEqual(
    second.listPods().map((r) => [r.containerId, r.phase]),
    [[p.id, 'ready']],
    'the new process knows the pod from its record',
  );
  // No pod CIDR yet in the new process: the recorded config alone drives DEL.
  await second.tearDownPod(p.namespace, p.name, p.id);
  t.true(
    lines.some((l) => l.includes('"msg":"pod veth deleted"')),
    'the recorded veth was deleted from the host side',
  );
  t.deepEqual(await h.reservedIps(), []);
  t.deepEqual(await h.recordFiles(), []);
  t.false(await linkExists('eth0', p.netns));
});

itest(
  "an empty reservation file (host-local killed between creating and writing it) is freed by the next start; a live pod's reservation stays",
  async (t) => {
    const h = await harness(t);
    const { plugin: first, cidr } = await ready(h);
    const p = await h.addPod('live');
    await first.setUpPod(p.namespace, p.name, p.id);
    const [liveIp] = await h.reservedIps();
    // What a SIGKILLed host-local leaves: the address's file, created, never written.
    const orphan = cidr.replace(/0\/24$/, '77');
    await writeFile(join(h.ipamDir, 'kubenet', orphan), '');
    const lines: string[] = [];
    const second = h.newPlugin({ logger: pino({ level: 'info' }, { write: (l: string) => void lines.push(l) }) });
    await second.init(h.host, 'none', '0.0.0.0/0');
    await second.event('pod-cidr-change', { 'pod-cidr': cidr });
    t.deepEqual(await h.reservedIps(), [liveIp], "the empty reservation is gone, the live pod's kept");
    t.true(
      lines.some((l) => l.includes(`"addresses":["${orphan}"]`)),
      'the start says which address it freed',
    );
    await second.tearDownPod(p.namespace, p.name, p.id);
    t.deepEqual(await h.reservedIps(), []);
  },
);

itest("teardown deletes only a veth on the bridge that is provably the pod's; a record naming another link leaves it alone", async (t) => {
  const h = await harness(t);
  const { plugin } = await ready(h);
  const [a, b] = await Promise.all([h.addPod('fast'), h.addPod('guarded')]);
  if (!a || !b) return t.fail('no pods');
  await plugin.setUpPod(a.namespace, a.name, a.id);
  await plugin.setUpPod(b.namespace, b.name, b.id);
  const vethOf = (id: string) => plugin.listPods().find((p) => p.containerId === id)?.hostVeth ?? '';
  const vethA = vethOf(a.id);
  const vethB = vethOf(b.id);
  t.true(vethA !== '' && vethB !== '', 'the bridge plugin reported host veths');

  // The record of pod b names a link that is not on the bridge (a name and index of something else).
  const stranger = `kst${h.tag}`;
  await sh('ip', ['link', 'add', stranger, 'type', 'veth', 'peer', 'name', `ksp${h.tag}`]);
  t.teardown(() => sh('ip', ['link', 'del', stranger], { reject: false }).then(() => undefined));
  const [strangerLink] = await ipJson<Array<{ ifindex: number }>>(['link', 'show', stranger]);
  const recB = plugin.network.get(b.id);
  if (!recB || !strangerLink) return t.fail('no record for pod b');
  plugin.network.store.put({ ...recB, hostVeth: stranger, hostVethIndex: strangerLink.ifindex });

  await plugin.tearDownPod(a.namespace, a.name, a.id);
  await plugin.tearDownPod(b.namespace, b.name, b.id);
  t.true(await linkExists(stranger), 'a veth that is not on the bridge is never deleted');
  for (const [pod, veth] of [
    [a, vethA],
    [b, vethB],
  ] as const) {
    t.false(await linkExists(veth), `${pod.name}: host veth ${veth} gone (pod b's found through its netns)`);
    t.false(await linkExists('eth0', pod.netns), `${pod.name}: eth0 gone`);
  }
  t.deepEqual(await h.reservedIps(), [], 'both addresses released');
  t.deepEqual(await h.recordFiles(), []);
  t.deepEqual(await ipJson<IpLink[]>(['link', 'show', 'master', h.bridge]), [], 'no bridge ports left');
});

serialTest('init ensures exactly one masquerade rule and sets the bridge sysctl when available', async (t) => {
  const h = await harness(t);
  // A superset of 10.0.0.0/8: every test's pod traffic stays inside it, so the rule never
  // masquerades another test's bridged flows (br_netfilter sends them through nat POSTROUTING;
  // a masqueraded flow whose conntrack entry is flushed mid-stream is reset).
  const nonMasq = '10.0.0.0/7';
  t.teardown(() => removeMasquerade(nonMasq));
  const plugin = await h.start();
  await plugin.init(h.host, 'none', nonMasq);
  await plugin.init(h.host, 'none', nonMasq);
  await h.newPlugin().init(h.host, 'none', nonMasq);
  const rules = (await sh('iptables', ['-w', '5', '-t', 'nat', '-S', 'POSTROUTING'])).stdout
    .split('\n')
    .filter((l) => l.includes(MASQUERADE_COMMENT) && l.includes(nonMasq));
  t.is(rules.length, 1, rules.join('\n'));
  t.regex(rules[0] ?? '', /! -d 10\.0\.0\.0\/7/);
  t.regex(rules[0] ?? '', /--dst-type LOCAL/);
  t.regex(rules[0] ?? '', /-j MASQUERADE/);
  await t.throwsAsync(plugin.init(h.host, 'none', 'nonsense'), { instanceOf: ConfigError });
  t.is((await readFile('/proc/sys/net/bridge/bridge-nf-call-iptables', 'utf8')).trim(), '1');
});

// The bridge plugin pins the MAC itself when it is the gateway (host-local mode); kubenet pins it when
// it makes the bridge, which is what keeps it in dhcp mode (no gateway): test/e2e/dhcp.test.ts's CHECK.
itest('the bridge exists once the pod CIDR is known and keeps its MAC when ports with lower MACs join (CHECK compares it)', async (t) => {
  const h = await harness(t);
  const { plugin } = await ready(h);
  const mac = async () => (await ipJson<Array<{ address: string }>>(['link', 'show', h.bridge]))[0]?.address ?? '';
  const before = await mac();
  t.regex(before, /^([0-9a-f]{2}:){5}[0-9a-f]{2}$/, 'the bridge exists once the pod CIDR is known');
  const p = await h.addPod('pinned');
  await plugin.setUpPod(p.namespace, p.name, p.id);
  // A port with the lowest possible MAC: an unpinned bridge would take it.
  const low = `kml${h.tag}`;
  await sh('ip', ['link', 'add', low, 'address', '02:00:00:00:00:01', 'type', 'veth', 'peer', 'name', `kmp${h.tag}`]);
  t.teardown(() => sh('ip', ['link', 'del', low], { reject: false }).then(() => undefined));
  await sh('ip', ['link', 'set', low, 'master', h.bridge, 'up']);
  t.is(await mac(), before, 'the bridge keeps its MAC');
  const recorded = plugin.network.get(p.id)?.result as { interfaces?: Array<{ name: string; mac?: string }> } | undefined;
  t.is(
    recorded?.interfaces?.find((i) => i.name === h.bridge)?.mac,
    before,
    'the result recorded at ADD names the MAC the bridge still has',
  );
  await plugin.tearDownPod(p.namespace, p.name, p.id);
});
