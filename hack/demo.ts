/**
 * Demo: wires three pods (network namespaces of the demo's own) onto a bridge through
 * KubenetPlugin on the embedded default pod CIDR, shows their addresses and that they reach each
 * other, then removes everything it made.
 */
import { execa } from 'execa';
import { randomBytes } from 'node:crypto';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { createLogger } from '../src/log.js';
import { KubenetPlugin } from '../src/plugin/kubenet.js';

export const DEMO_POD_CIDR = '10.244.0.0/24';

async function main(): Promise<void> {
  const tag = randomBytes(2).toString('hex');
  const bridge = `kdemo${tag}`;
  const dir = await mkdtemp(join(tmpdir(), 'kubenet-demo-'));
  const pods = ['alpha', 'beta', 'gamma'].map((name) => ({ name, id: `demo-${name}-${tag}`, netns: `kdemo-${tag}-${name}` }));
  const logger = createLogger({ level: process.env.KUBENET_LOG_LEVEL ?? 'warn' });
  const plugin = new KubenetPlugin({ bridgeName: bridge, ipamDataDir: join(dir, 'ipam'), cniCacheDir: join(dir, 'cache'), logger });
  const netnsOf = new Map(pods.map((p) => [p.id, `/var/run/netns/${p.netns}`]));
  try {
    for (const p of pods) await execa('ip', ['netns', 'add', p.netns]);
    await plugin.init({ getPodByName: () => ({}), getNetNS: (id) => netnsOf.get(id) ?? '' }, 'hairpin-veth', '0.0.0.0/0');
    await plugin.event('pod-cidr-change', { 'pod-cidr': DEMO_POD_CIDR });
    plugin.status();
    console.log(`bridge ${bridge}, pod CIDR ${DEMO_POD_CIDR}`);
    const ips = new Map<string, string>();
    for (const p of pods) {
      const started = performance.now();
      await plugin.setUpPod('demo', p.name, p.id);
      const { ip } = await plugin.getPodNetworkStatus('demo', p.name, p.id);
      ips.set(p.name, ip);
      console.log(`  pod ${p.name.padEnd(6)} ${ip.padEnd(15)} set up in ${(performance.now() - started).toFixed(1)} ms`);
    }
    for (const [i, p] of pods.entries()) {
      const peer = pods[(i + 1) % pods.length]!;
      const r = await execa('ip', ['netns', 'exec', p.netns, 'ping', '-c', '3', '-i', '0.2', '-W', '2', ips.get(peer.name)!], { reject: false });
      const rtt = /= [\d.]+\/([\d.]+)\//.exec(r.stdout)?.[1];
      console.log(`  ${p.name} -> ${peer.name}: ${r.exitCode === 0 ? `reachable, avg rtt ${rtt} ms` : 'UNREACHABLE'}`);
      if (r.exitCode !== 0) process.exitCode = 1;
    }
  } finally {
    for (const p of pods) await plugin.tearDownPod('demo', p.name, p.id).catch((err) => console.error(`teardown ${p.name}:`, err));
    for (const p of pods) await execa('ip', ['netns', 'del', p.netns], { reject: false });
    await execa('ip', ['link', 'del', bridge], { reject: false });
    await rm(dir, { recursive: true, force: true });
    console.log('removed demo pods, bridge and state');
  }
}

main().catch((err) => {
  console.error(err);
  process.exit(1);
});
