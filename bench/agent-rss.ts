/**
 * Resident memory of the idle node agent as it ships (`node dist/src/cli/main.js daemon`, compiled
 * first), in cluster mode (watching its Node and the node's pods on a fake API server on 127.0.0.1,
 * test/kit/fake-apiserver.ts, through a kubeconfig file) and in static mode (--pod-cidr), each
 * started `--runs` times. RSS (VmRSS) is sampled once the agent is healthy (pod CIDR known, conflist
 * written) and has been idle for `--idle` seconds. Prints each sample and the medians.
 *
 * Root only: the agent sets up its own bridge (kfx<random>), removed at the end with its temp dir.
 * Usage: npx tsx bench/agent-rss.ts [--runs N] [--idle S]
 */
import { execa, type ResultPromise } from 'execa';
import { readFile, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { performance } from 'node:perf_hooks';
import { setTimeout as sleep } from 'node:timers/promises';
import { fileURLToPath } from 'node:url';
import { agentGet, HEALTH_PATH } from '../src/daemon/protocol.js';
import { FakeApiServer, fakeKubeConfig, node, pod } from '../test/kit/fake-apiserver.js';
import { BenchArgs, median } from '../test/kit/bench-kit.js';
import { CNI_BIN_DIRS, delLink, makeTmpDir, rmrf, uniq } from '../test/kit/kernel.js';

const ROOT = fileURLToPath(new URL('..', import.meta.url));
const DIST_MAIN = join(ROOT, 'dist/src/cli/main.js');

const args = BenchArgs.parse('usage: npx tsx bench/agent-rss.ts [--runs N] [--idle S]', ['runs', 'idle']);
const RUNS = args.num('runs', 3);
const IDLE_S = args.num('idle', 5);

async function rssMb(pid: number): Promise<number> {
  const status = await readFile(`/proc/${pid}/status`, 'utf8');
  return Number(/^VmRSS:\s+(\d+) kB/m.exec(status)?.[1] ?? NaN) / 1024;
}

async function runAgent(mode: 'cluster' | 'static', api: FakeApiServer, cidr: string): Promise<number> {
  const tag = uniq(6);
  const root = await makeTmpDir(`kfx-rss-${tag}`);
  const bridge = `kfx${tag}`;
  let proc: ResultPromise | undefined;
  try {
    const kubeconfig = join(root, 'kubeconfig');
    await writeFile(kubeconfig, fakeKubeConfig(api).exportConfig());
    const socket = join(root, 'kubenet.sock');
    const flags = [
      ...(mode === 'cluster' ? ['--kubeconfig', kubeconfig, '--node-name', 'kfx-node'] : ['--pod-cidr', cidr]),
      '--socket',
      socket,
      '--cni-bin-dir',
      join(root, 'cni-bin'),
      '--cni-conf-dir',
      join(root, 'cni-conf'),
      '--plugin-bin-dirs',
      CNI_BIN_DIRS.join(','),
      '--bridge-name',
      bridge,
      '--ifb-name',
      `kfi${tag}`,
      '--non-masquerade-cidr',
      '0.0.0.0/0',
      '--ipam-data-dir',
      join(root, 'ipam'),
      '--cni-cache-dir',
      join(root, 'cni-cache'),
      '--state-dir',
      join(root, 'state'),
      '--log-level',
      'warn',
      '--metrics-address',
      '127.0.0.1:0',
    ];
    const { NODE_OPTIONS: _drop, ...env } = process.env;
    proc = execa(process.execPath, [DIST_MAIN, 'daemon', ...flags], {
      env,
      extendEnv: false,
      stdio: ['ignore', 'inherit', 'inherit'],
      reject: false,
    });
    const deadline = performance.now() + 20_000;
    for (;;) {
      const r = await agentGet(socket, HEALTH_PATH).catch(() => ({ status: 0 }));
      if (r.status === 200) break;
      if (performance.now() > deadline) throw new Error(`${mode} agent not healthy within 20 s`);
      await sleep(50);
    }
    await sleep(IDLE_S * 1000);
    return await rssMb(proc.pid ?? 0);
  } finally {
    if (proc) {
      proc.kill('SIGTERM');
      await proc;
    }
    await delLink(bridge);
    await delLink(`kfi${tag}`);
    await rmrf(root);
  }
}

async function main(): Promise<void> {
  if (process.getuid?.() !== 0) throw new Error('needs root (the agent sets up its bridge)');
  const tsc = await execa(process.execPath, [join(ROOT, 'node_modules/typescript/bin/tsc'), '-p', join(ROOT, 'tsconfig.json')], {
    reject: false,
  });
  if (tsc.exitCode !== 0) throw new Error(`compiling the agent failed:\n${tsc.stdout}`);
  const cidr = `10.${96 + Math.floor(Math.random() * 8)}.${Math.floor(Math.random() * 256)}.0/24`;
  const api = await FakeApiServer.start();
  api.setNode(node('kfx-node', { podCIDR: cidr, podCIDRs: [cidr] }));
  for (let i = 0; i < 20; i++) api.setPod(pod('default', `p${i}`, 'kfx-node', { 'kubernetes.io/ingress-bandwidth': '10M' }));
  try {
    const out: Record<string, number[]> = { cluster: [], static: [] };
    for (let i = 0; i < RUNS; i++) {
      for (const mode of ['cluster', 'static'] as const) {
        const mb = await runAgent(mode, api, cidr);
        out[mode]?.push(mb);
        console.log(`run ${i + 1} ${mode.padEnd(7)} idle agent RSS ${mb.toFixed(1)} MB`);
      }
    }
    for (const mode of ['cluster', 'static'] as const) {
      const xs = out[mode] ?? [];
      console.log(
        `${mode.padEnd(7)} median ${median(xs, 'upper').toFixed(1)} MB (min ${Math.min(...xs).toFixed(1)}, max ${Math.max(...xs).toFixed(1)}, n ${xs.length})`,
      );
    }
  } finally {
    await api.stop();
  }
}

main().catch((err) => {
  console.error(err);
  process.exit(1);
});
