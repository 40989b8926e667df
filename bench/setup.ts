/**
 * Pod setup/teardown latency: KubenetPlugin vs the reference CNI plugins exec'd directly
 * (loopback, then bridge with host-local), same run, interleaved pod by pod so both see the
 * same machine load. Prints p50/p99 per N and the ratio, and PASS/MISS for issue 22's goal (ADD
 * p50 ≤ 1.2× the raw execs). The plugin runs in kubelet's default hairpin mode, promiscuous-bridge
 * (its dedup rules are kept in the host's ebtables while it runs and removed after), unless
 * `--hairpin-mode hairpin-veth`. Root only; creates its own netns and bridges and removes them.
 * Usage: npx tsx bench/setup.ts [--sizes 1,50,200] [--hairpin-mode promiscuous-bridge|hairpin-veth]
 */
import { execa } from 'execa';
import { randomBytes } from 'node:crypto';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { performance } from 'node:perf_hooks';
import { KubenetPlugin } from '../src/plugin/kubenet.js';
import { syncDedup } from '../src/pod/node/dedup-rules.js';
import { silentLogger } from '../src/log.js';
import { CNI_BIN_DIRS, delIfbs } from '../test/kit/kernel.js';
import { BenchArgs, summary } from '../test/kit/bench-kit.js';

const CNI_DIR = CNI_BIN_DIRS;
const args = BenchArgs.parse('usage: npx tsx bench/setup.ts [--sizes 1,50,200] [--hairpin-mode promiscuous-bridge|hairpin-veth]', [
  'sizes',
  'hairpin-mode',
]);
const sizes = args.nums('sizes', '1,50,200');
const tag = randomBytes(3).toString('hex');
const HAIRPIN = args.oneOf('hairpin-mode', 'promiscuous-bridge', ['promiscuous-bridge', 'hairpin-veth'] as const);

const stats = summary;

async function findBin(name: string): Promise<string> {
  for (const d of CNI_DIR) {
    const p = join(d, name);
    if ((await execa('test', ['-x', p], { reject: false })).exitCode === 0) return p;
  }
  throw new Error(`CNI plugin ${name} not found in ${CNI_DIR.join(', ')}`);
}

/** The reference chain as a runtime runs it: one exec per plugin, config on stdin. */
async function rawExec(bin: string, command: string, id: string, netns: string, ifname: string, conf: object): Promise<void> {
  const r = await execa(bin, [], {
    input: JSON.stringify(conf),
    reject: false,
    env: {
      CNI_COMMAND: command,
      CNI_CONTAINERID: id,
      CNI_NETNS: netns,
      CNI_IFNAME: ifname,
      CNI_PATH: CNI_DIR.join(':'),
      CNI_ARGS: `IgnoreUnknown=1;K8S_POD_NAMESPACE=bench;K8S_POD_NAME=${id.slice(0, 8)}`,
    },
    extendEnv: false,
  });
  if (r.exitCode !== 0) throw new Error(`${bin} ${command} failed: ${r.stdout} ${r.stderr}`);
}

async function ipBatch(lines: string[]): Promise<void> {
  if (lines.length === 0) return;
  await execa('ip', ['-force', '-batch', '-'], { input: lines.join('\n') + '\n', reject: false });
}

async function runSize(n: number, bins: { loopback: string; bridge: string }) {
  const dir = await mkdtemp(join(tmpdir(), 'kbench-'));
  // The plugin's shaper makes its shared ifb at init: a name of this run's, removed at the end.
  const ours = { bridge: `kbs${tag}`, ifb: `kbj${tag}`, netns: (i: number) => `kbs-${tag}-${i}` };
  const ref = { bridge: `kbr${tag}`, netns: (i: number) => `kbr-${tag}-${i}` };
  const all = Array.from({ length: n }, (_, i) => i);
  await ipBatch(all.flatMap((i) => [`netns add ${ours.netns(i)}`, `netns add ${ref.netns(i)}`]));
  const plugin = new KubenetPlugin({
    bridgeName: ours.bridge,
    cniBinDirs: CNI_DIR,
    ipamDataDir: join(dir, 'ours-ipam'),
    cniCacheDir: join(dir, 'ours-cache'),
    ifbName: ours.ifb,
    shaperStateDir: join(dir, 'ours-shaper'),
    mtu: 1500,
  });
  const netnsPath = (name: string) => `/var/run/netns/${name}`;
  await plugin.init(
    {
      getPodByName: () => ({}),
      getNetNS: (id: string) => netnsPath(ours.netns(Number(id.split('-')[1]))),
    },
    HAIRPIN,
    '0.0.0.0/0',
  );
  await plugin.event('pod-cidr-change', { 'pod-cidr': '10.96.0.0/22' });
  const refConf = {
    cniVersion: '1.0.0',
    name: 'kbench-ref',
    type: 'bridge',
    bridge: ref.bridge,
    mtu: 1500,
    isGateway: true,
    ipMasq: false,
    hairpinMode: true,
    ipam: { type: 'host-local', ranges: [[{ subnet: '10.95.0.0/22' }]], routes: [{ dst: '0.0.0.0/0' }], dataDir: join(dir, 'ref-ipam') },
  };
  const loConf = { cniVersion: '1.0.0', name: 'cni-loopback', type: 'loopback' };
  const t = { oursAdd: [] as number[], refAdd: [] as number[], oursDel: [] as number[], refDel: [] as number[] };
  try {
    for (const i of all) {
      const id = `pod-${i}-${tag}`;
      let s = performance.now();
      await plugin.setUpPod('bench', `p${i}`, id);
      t.oursAdd.push(performance.now() - s);
      s = performance.now();
      await rawExec(bins.loopback, 'ADD', id, netnsPath(ref.netns(i)), 'lo', loConf);
      await rawExec(bins.bridge, 'ADD', id, netnsPath(ref.netns(i)), 'eth0', refConf);
      t.refAdd.push(performance.now() - s);
    }
    for (const i of all) {
      const id = `pod-${i}-${tag}`;
      let s = performance.now();
      await plugin.tearDownPod('bench', `p${i}`, id);
      t.oursDel.push(performance.now() - s);
      // Untimed: the kernel finishes freeing our veth in the background after teardown returns;
      // let it, so that work is not charged to the reference call that follows.
      await plugin.settled();
      s = performance.now();
      await rawExec(bins.bridge, 'DEL', id, netnsPath(ref.netns(i)), 'eth0', refConf);
      await rawExec(bins.loopback, 'DEL', id, netnsPath(ref.netns(i)), 'lo', loConf);
      t.refDel.push(performance.now() - s);
    }
  } finally {
    await plugin.settled();
    plugin.close();
    await ipBatch([
      ...all.flatMap((i) => [`netns del ${ours.netns(i)}`, `netns del ${ref.netns(i)}`]),
      `link del ${ours.bridge}`,
      `link del ${ref.bridge}`,
    ]);
    await delIfbs(ours.ifb);
    await rm(dir, { recursive: true, force: true });
  }
  return { n, add: { ours: stats(t.oursAdd), ref: stats(t.refAdd) }, del: { ours: stats(t.oursDel), ref: stats(t.refDel) } };
}

async function main(): Promise<void> {
  if (process.getuid?.() !== 0) throw new Error('bench/setup needs root');
  const bins = { loopback: await findBin('loopback'), bridge: await findBin('bridge') };
  const f = (x: number) => x.toFixed(2).padStart(8);
  console.log('pod setup/teardown latency, ms: kubenet-ts plugin vs reference loopback+bridge+host-local execs (same run)');
  await runSize(3, bins); // warm-up: first execs and page cache, not printed
  console.log(`the plugin in hairpin mode ${HAIRPIN}`);
  console.log('   N  op    ours p50  ours p99   ref p50   ref p99  p50 ratio  overhead p50');
  const addRatios: Array<[number, number]> = [];
  try {
    for (const n of sizes) {
      const r = await runSize(n, bins);
      addRatios.push([n, r.add.ours.p50 / r.add.ref.p50]);
      for (const [op, v] of [
        ['ADD', r.add],
        ['DEL', r.del],
      ] as const) {
        console.log(
          `${String(n).padStart(4)}  ${op}  ${f(v.ours.p50)}  ${f(v.ours.p99)}  ${f(v.ref.p50)}  ${f(v.ref.p99)}  ${(v.ours.p50 / v.ref.p50).toFixed(3).padStart(9)}  ${f(v.ours.p50 - v.ref.p50)}`,
        );
      }
    }
  } finally {
    // promiscuous-bridge mode kept kubenet's dedup rules in the host's ebtables: gone afterwards.
    if (HAIRPIN === 'promiscuous-bridge') await syncDedup(undefined, silentLogger());
  }
  for (const [n, ratio] of addRatios)
    console.log(`${ratio <= 1.2 ? 'PASS' : 'MISS'}  N=${n}: setUpPod p50 <= 1.2x the raw loopback + bridge execs: ${ratio.toFixed(3)}x`);
}

main().catch((err) => {
  console.error(err);
  process.exit(1);
});
