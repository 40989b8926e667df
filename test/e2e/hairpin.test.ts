/**
 * Hairpin and kubenet's promiscuous-bridge dedup (issue 13), end to end: the agent as a process in
 * a NodeSandbox (the node's ebtables and iptables are the sandbox netns's own), pods set up through
 * its CNI binary by libcni.
 *
 * Hairpin is a pod reaching itself through a virtual address, the way kube-proxy sends it there: in
 * the node netns a nat PREROUTING DNAT of VIP:80 to the pod's IP:8080, and kube-proxy's masquerade
 * of hairpin traffic (source and destination the pod itself). In `promiscuous-bridge` mode that path
 * goes up through the promiscuous bridge and back out of it; the dedup rules (chain KUBE-DEDUP from
 * the filter OUTPUT, per family) keep the host's copies of pod-to-pod frames from reaching pods a
 * second time: ping between pods shows no "DUP!". Checked: the rules in place for the bridge's MAC
 * and the pod CIDR, what ping shows without them, put back by the next ADD, following a new pod
 * CIDR, gone (with the bridge's promiscuous mode) in `hairpin-veth` mode, where the same hairpin test
 * passes. Traffic only between the sandbox's and the test's own namespaces.
 */
import anyTest, { type ExecutionContext, type TestFn } from 'ava';
import { execa, type ResultPromise } from 'execa';
import { existsSync } from 'node:fs';
import { CNI_BIN_DIRS } from '../kit/kernel.js';
import { SandboxWorld, sandboxTestBlocker } from '../kit/sandbox-libcni.js';
import type { TestPod } from '../kit/test-pod.js';

const blocker = sandboxTestBlocker() ?? (existsSync('/usr/sbin/ebtables') ? undefined : 'needs ebtables (hack/bootstrap.sh installs it)');
const test = anyTest as TestFn;
const serialTest = blocker ? test.serial.skip : test.serial;
if (blocker) console.warn(`hairpin e2e tests skipped: ${blocker}`);

const BRIDGE = 'cbr0';
const NET = 40 + Math.floor(Math.random() * 200);
const CIDR_A = `10.246.${NET}.0/24`;
// Dual-stack: the rules for both families.
const CIDR_B = `10.247.${NET}.0/24,fd00:247:${NET}::/64`;
const CIDR_C = `10.248.${NET}.0/24`;
const VIP = `10.96.${NET}.10`;

let world: SandboxWorld | undefined;
/** The pods' TCP servers (serve), killed when the world goes. */
const servers: ResultPromise[] = [];
function w(): SandboxWorld {
  if (!world) throw new Error('setup failed');
  return world;
}

async function addPod(t: ExecutionContext, name: string): Promise<TestPod> {
  const p = await w().newPod(name);
  const r = await w().call('add', p);
  t.is(r.exitCode, 0, `ADD ${name}: ${r.stderr}`);
  return p;
}

/** The agent; its dedup rules checked every `dedupResyncMs` (the default is 30 s). */
async function startAgent(podCidr: string, hairpinMode: string, dedupResyncMs = 60_000): Promise<void> {
  const args = ['--pod-cidr', podCidr, '--hairpin-mode', hairpinMode, '--plugin-bin-dirs', CNI_BIN_DIRS.join(','), '--log-level', 'info'];
  await w().startAgent(args, { env: { KUBENET_DEDUP_RESYNC_MS: String(dedupResyncMs) } });
}

/** KUBE-DEDUP's rules as `ebtables -L --Lmac2` lists them, or undefined when there is no such chain. */
async function dedupChain(): Promise<string[] | undefined> {
  const r = await w().sb.exec('ebtables', ['-t', 'filter', '-L', 'KUBE-DEDUP', '--Lmac2'], { reject: false });
  return r.exitCode === 0 ? r.stdout.split('\n').filter((l) => l.startsWith('-')) : undefined;
}

async function outputJumps(): Promise<number> {
  return (await w().inNode('ebtables', ['-t', 'filter', '-L', 'OUTPUT'])).split('\n').filter((l) => l.trim() === '-j KUBE-DEDUP').length;
}

function expectedRules(mac: string, cidrs: string): string[] {
  return cidrs
    .split(',')
    .flatMap((cidr) =>
      cidr.includes(':')
        ? [
            `-p IPv6 -s ${mac} -o veth+ --ip6-src ${cidr.replace(/::\/64$/, '::1')} -j ACCEPT`,
            `-p IPv6 -s ${mac} -o veth+ --ip6-src ${cidr} -j DROP`,
          ]
        : [
            `-p IPv4 -s ${mac} -o veth+ --ip-src ${cidr.replace(/\.0\/24$/, '.1')} -j ACCEPT`,
            `-p IPv4 -s ${mac} -o veth+ --ip-src ${cidr} -j DROP`,
          ],
    );
}

/** A TCP server in the pod on :8080 answering "hairpin-ok from <name>". */
async function serve(p: TestPod): Promise<void> {
  const code = `require('net').createServer((s) => s.end('hairpin-ok from ${p.name}')).listen(8080, '0.0.0.0', () => console.log('listening'))`;
  const srv = execa('ip', ['netns', 'exec', p.netns, process.execPath, '-e', code], {
    reject: false,
    stdin: 'ignore',
  }) as unknown as ResultPromise;
  servers.push(srv);
  await new Promise<void>((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error('server did not start')), 10_000);
    srv.stdout?.on('data', (d: Buffer) => {
      if (d.toString().includes('listening')) {
        clearTimeout(timer);
        resolve();
      }
    });
  });
}

/** kube-proxy's rules for a service VIP:80 whose one endpoint is the pod's :8080 (DNAT, hairpin masquerade). */
async function service(p: TestPod): Promise<void> {
  for (const rule of [
    ['-t', 'nat', '-A', 'PREROUTING', '-d', VIP, '-p', 'tcp', '--dport', '80', '-j', 'DNAT', '--to-destination', `${p.ip}:8080`],
    ['-t', 'nat', '-A', 'POSTROUTING', '-s', p.ip ?? '', '-d', p.ip ?? '', '-p', 'tcp', '--dport', '8080', '-j', 'MASQUERADE'],
  ]) {
    await w().sb.exec('iptables', ['-w', '5', ...rule]);
  }
}

/** The pod connects to the VIP (reaching itself) and reads the answer. */
async function hairpin(p: TestPod): Promise<string> {
  const code = `const s = require('net').connect(80, '${VIP}'); let d = ''; s.on('data', (x) => (d += x)); s.on('end', () => { console.log(d); process.exit(0); }); s.on('error', (e) => { console.log('error ' + e.message); process.exit(1); }); setTimeout(() => { console.log('timeout'); process.exit(1); }, 3000);`;
  const r = await execa('ip', ['netns', 'exec', p.netns, process.execPath, '-e', code], { reject: false });
  return r.stdout.trim();
}

async function pingDups(from: TestPod, to: TestPod): Promise<{ exitCode: number; dups: number; out: string }> {
  const r = await execa('ip', ['netns', 'exec', from.netns, 'ping', '-c', '5', '-i', '0.2', '-W', '2', to.ip ?? ''], { reject: false });
  return { exitCode: r.exitCode ?? -1, dups: (r.stdout.match(/DUP!/g) ?? []).length, out: r.stdout.split('\n').slice(-3).join(' | ') };
}

async function bridgeMac(): Promise<string> {
  return (await w().inNode('cat', [`/sys/class/net/${BRIDGE}/address`])).trim();
}

test.before(async (t) => {
  if (blocker) return;
  t.timeout(60_000);
  world = await SandboxWorld.create({ prefix: 'kdh' });
  world.cleanup.add(async () => {
    for (const s of servers) s.kill('SIGKILL');
    await Promise.all(servers.map((s) => s.catch(() => undefined)));
  });
});

test.after.always(async () => {
  await world?.destroy();
});

serialTest(
  'promiscuous-bridge: a pod reaches itself through a DNATed VIP; dedup rules for the bridge MAC and pod CIDR; no DUP! between pods',
  async (t) => {
    await startAgent(CIDR_A, 'promiscuous-bridge', 1000);
    const a = await addPod(t, 'a');
    const b = await addPod(t, 'b');
    t.regex(await w().inNode('ip', ['-o', 'link', 'show', 'dev', BRIDGE]), /PROMISC/, 'the bridge is promiscuous');
    const mac = await bridgeMac();
    t.deepEqual(
      await dedupChain(),
      expectedRules(mac, CIDR_A),
      'KUBE-DEDUP: the gateway accepted, the rest of the pod CIDR dropped, from the bridge MAC to pod veths',
    );
    t.is(await outputJumps(), 1, 'one jump from OUTPUT');

    const vethA = (await w().inNode('ip', ['-o', 'link', 'show', 'master', BRIDGE]))
      .split('\n')
      .map((l) => l.split(':')[1]?.trim().split('@')[0] ?? '')
      .filter(Boolean);
    for (const v of vethA) t.regex(await w().inNode('ip', ['-d', '-o', 'link', 'show', 'dev', v]), /hairpin on/, `hairpin on ${v} too`);

    await serve(a);
    await service(a);
    t.is(await hairpin(a), 'hairpin-ok from a', 'pod a reaches itself through the VIP');
    // Why the veths get hairpin in this mode too (logged, kernel-dependent): without it, the bridged DNAT is dropped.
    const ports = (await w().inNode('bridge', ['-o', 'link', 'show', 'master', BRIDGE]))
      .split('\n')
      .map((l) => l.split(':')[1]?.trim().split('@')[0] ?? '')
      .filter(Boolean);
    for (const v of ports) await w().inNode('ip', ['link', 'set', 'dev', v, 'type', 'bridge_slave', 'hairpin', 'off']);
    t.log(`promiscuous bridge, veth hairpin off: the VIP gives ${await hairpin(a)}`);
    for (const v of ports) await w().inNode('ip', ['link', 'set', 'dev', v, 'type', 'bridge_slave', 'hairpin', 'on']);
    t.is(await hairpin(b), 'hairpin-ok from a', 'pod b reaches the service too');

    const withRules = await pingDups(a, b);
    t.is(withRules.exitCode, 0, withRules.out);
    t.is(withRules.dups, 0, `no duplicate replies: ${withRules.out}`);

    // Without the rules (flushed by hand), the host's copies reach the pods too.
    await w().sb.exec('ebtables', ['-t', 'filter', '-F', 'KUBE-DEDUP']);
    const without = await pingDups(a, b);
    t.log(`ping a -> b with the dedup rules: ${withRules.dups} DUP!; with KUBE-DEDUP flushed: ${without.dups} DUP! (${without.out})`);
    // The periodic check (every 1 s here) puts them back; an ADD no longer looks at them.
    const flushed = performance.now();
    const want = expectedRules(await bridgeMac(), CIDR_A);
    while (JSON.stringify(await dedupChain()) !== JSON.stringify(want) && performance.now() - flushed < 5000)
      await new Promise((r) => setTimeout(r, 50));
    t.deepEqual(await dedupChain(), want, 'the periodic check restored the rules');
    t.log(`KUBE-DEDUP restored ${Math.round(performance.now() - flushed)} ms after the flush (check period 1 s)`);
    const c = await addPod(t, 'c');
    const again = await pingDups(c, b);
    t.is(again.dups, 0, `no duplicate replies once restored: ${again.out}`);
    t.is(await hairpin(a), 'hairpin-ok from a', 'hairpin still works');
  },
);

serialTest('promiscuous-bridge: the rules follow a new pod CIDR (both families), idempotently', async (t) => {
  // The pods of the old CIDR go first (their gateway leaves the bridge with it).
  for (const p of w().pods.filter((x) => ['a', 'b', 'c'].includes(x.name))) {
    t.is((await w().call('del', p)).exitCode, 0);
  }
  await startAgent(CIDR_B, 'promiscuous-bridge');
  t.deepEqual(await dedupChain(), expectedRules(await bridgeMac(), CIDR_B), 'only the new CIDR');
  t.is(await outputJumps(), 1);
  const d = await addPod(t, 'd');
  t.truthy(d.ip);
  t.deepEqual(await dedupChain(), expectedRules(await bridgeMac(), CIDR_B), 'unchanged by an ADD');
  t.is(await outputJumps(), 1, 'still one jump');
  t.is((await w().call('del', d)).exitCode, 0);
  // The bridge deleted and made anew by the next ADD has another MAC: that ADD syncs the rules
  // (the periodic check is 60 s away here).
  const oldMac = await bridgeMac();
  await w().inNode('ip', ['link', 'del', BRIDGE]);
  const d2 = await addPod(t, 'd2');
  const newMac = await bridgeMac();
  t.not(newMac, oldMac, 'a new bridge, a new MAC');
  t.deepEqual(await dedupChain(), expectedRules(newMac, CIDR_B), 'the rules name the new MAC right after the ADD that made the bridge');
  t.is((await w().call('del', d2)).exitCode, 0);
});

serialTest('hairpin-veth: no dedup rules, the bridge not promiscuous; the same hairpin test passes and ping shows no DUP!', async (t) => {
  await startAgent(CIDR_C, 'hairpin-veth');
  t.is(await dedupChain(), undefined, 'KUBE-DEDUP removed with the mode change');
  t.is(await outputJumps(), 0, 'and its jump');
  t.notRegex(await w().inNode('ip', ['-o', 'link', 'show', 'dev', BRIDGE]), /PROMISC/, 'promiscuous mode off');
  const e = await addPod(t, 'e');
  const f = await addPod(t, 'f');
  t.is(await dedupChain(), undefined, 'no rules after an ADD either');
  await w().sb.exec('iptables', ['-w', '5', '-t', 'nat', '-F', 'PREROUTING']);
  await serve(e);
  await service(e);
  t.is(await hairpin(e), 'hairpin-ok from e', 'pod e reaches itself through the VIP (hairpin on its veth)');
  const ping = await pingDups(e, f);
  t.is(ping.exitCode, 0, ping.out);
  t.is(ping.dups, 0, `no duplicate replies: ${ping.out}`);
  t.log(`hairpin-veth: hairpin ok, ping e -> f ${ping.dups} DUP!`);
});
