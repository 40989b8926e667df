/**
 * Pod startup on a real cluster (hack/cluster.sh, one node): kubenet-ts as installed by
 * manifests/kubenet.yaml against the same cluster whose node runs the reference conflist instead
 * (bridge + host-local + portmap + bandwidth, the pinned current plugins, the same pod CIDR, the
 * same annotations), same run. For each side `--pods` pods (default 60) are created `--concurrency`
 * at a time (default 10; the next batch when the last is Ready), each pod annotated ingress 10M /
 * egress 20M; a pod's startup is from just before its batch is sent to the moment the API server's
 * watch (kubectl get -w) shows it Ready. Also the agent's CPU time and RSS over its run. Prints
 * p50/p99, the ratios and PASS/MISS for issue 20's goals (p50 ≤ the reference's, p99 ≤ 1.1×).
 * In `--rounds` rounds (default 2) that alternate which side goes first; between sides the pods are
 * deleted and the other side's conflist, bridge (and DaemonSet) removed. Root only; takes the
 * cluster down at the end, also on failure.
 *
 * Usage: npx tsx bench/cluster.ts [--pods 60] [--concurrency 10] [--rounds 2]
 */
import { execa, type ResultPromise } from 'execa';
import { copyFile, readFile, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { BenchArgs, percentile, processUsage } from '../test/kit/bench-kit.js';
import { inKclNode, kclNodeHolder } from '../test/kit/kcl.js';
import { uniq } from '../test/kit/kernel.js';
import { CLUSTER_LOCK, holdLock, TRAFFIC_LOCK } from '../test/kit/traffic-lock.js';
import { REF_PLUGINS_DIR, refPluginsVersion, upstreamDir } from '../test/kit/upstream.js';

const ROOT = fileURLToPath(new URL('../', import.meta.url));
const args = BenchArgs.parse('usage: npx tsx bench/cluster.ts [--pods 60] [--concurrency 10] [--rounds 2]', [
  'pods',
  'concurrency',
  'rounds',
]);
const PODS = args.num('pods', 60);
const CONC = args.num('concurrency', 10);
const ROUNDS = args.num('rounds', 2);
const DIR = `/tmp/kcl-bench-${uniq(6)}`;
const ENV = { KCL_DIR: DIR, KCL_API_PORT: String(20000 + (process.pid % 10000)) };
const KUBECTL = join(upstreamDir('kubernetes'), 'kubectl');
const kubectl = (args: string[], input?: string) =>
  execa(KUBECTL, ['--kubeconfig', join(DIR, 'kubeconfig'), ...args], input !== undefined ? { input } : {});
const nodePath = async (p: string) => `/proc/${kclNodeHolder(DIR)}/root${p}`;

/**
 * How long containerd's RunPodSandbox took for each pod whose name starts with `prefix` (its log:
 * `RunPodSandbox for name:"<pod>" uid:...` to `... returns sandbox id`): the netns,
 * the CNI ADD and the pause container's start, the part of a pod's startup the network plugin is in.
 */
async function sandboxTimes(prefix: string): Promise<number[]> {
  const text = await readFile(join(DIR, 'n1/containerd.log'), 'utf8').catch(() => '');
  const started = new Map<string, number>();
  const took: number[] = [];
  for (const line of text.split('\n')) {
    const m = /^time="([^"]+)".*msg="RunPodSandbox for name:\\"([^\\"]+)\\"/.exec(line);
    if (!m?.[1] || !m[2]?.startsWith(`${prefix}-`)) continue;
    const at = Date.parse(m[1]);
    if (!line.includes('returns sandbox id')) started.set(m[2], at);
    else if (started.has(m[2])) took.push(at - (started.get(m[2]) ?? at));
  }
  return took;
}

/** Creates the pods in batches; returns each pod's startup in ms. */
async function startup(prefix: string, count: number): Promise<number[]> {
  const readyAt = new Map<string, number>();
  const watch: ResultPromise = execa(
    KUBECTL,
    [
      '--kubeconfig',
      join(DIR, 'kubeconfig'),
      'get',
      'pods',
      '-w',
      '-o',
      'jsonpath={.metadata.name} {.status.conditions[?(@.type=="Ready")].status}{"\\n"}',
    ],
    { reject: false, buffer: false },
  );
  watch.stdout?.on('data', (d: Buffer) => {
    for (const line of d.toString().split('\n')) {
      const [name, ready] = line.trim().split(' ');
      if (name && ready === 'True' && !readyAt.has(name)) readyAt.set(name, performance.now());
    }
  });
  await new Promise((r) => setTimeout(r, 1000));
  const times: number[] = [];
  try {
    for (let b = 0; b < count; b += CONC) {
      const names = Array.from({ length: Math.min(CONC, count - b) }, (_, k) => `${prefix}-${b + k}`);
      const items = names.map((name) => ({
        apiVersion: 'v1',
        kind: 'Pod',
        metadata: {
          name,
          namespace: 'default',
          annotations: { 'kubernetes.io/ingress-bandwidth': '10M', 'kubernetes.io/egress-bandwidth': '20M' },
        },
        spec: {
          containers: [{ name: 'pause', image: 'kubenet-ts.local/sandbox:1', imagePullPolicy: 'Never' }],
          terminationGracePeriodSeconds: 1,
        },
      }));
      const t0 = performance.now();
      await kubectl(['apply', '-f', '-'], JSON.stringify({ apiVersion: 'v1', kind: 'List', items }));
      const deadline = Date.now() + 120_000;
      while (names.some((n) => !readyAt.has(n))) {
        if (Date.now() > deadline) throw new Error(`pods not Ready after 120 s: ${names.filter((n) => !readyAt.has(n)).join(' ')}`);
        await new Promise((r) => setTimeout(r, 20));
      }
      for (const n of names) times.push((readyAt.get(n) ?? t0) - t0);
    }
  } finally {
    watch.kill();
  }
  await kubectl(['delete', 'pods', '--all', '--wait=true', '--timeout=180s']);
  return times;
}

/** The node runs the reference conflist: kubenet's DaemonSet, conflist and bridge gone first. */
async function useReference(): Promise<void> {
  if ((await kubectl(['-n', 'kube-system', 'get', 'daemonset', 'kubenet', '--ignore-not-found', '-o', 'name'])).stdout.trim()) {
    await kubectl(['delete', '-f', join(ROOT, 'manifests/kubenet.yaml'), '--wait=true', '--timeout=120s']);
    await kubectl(
      ['-n', 'kube-system', 'wait', '--for=delete', 'pod', '-l', 'app.kubernetes.io/name=kubenet', '--timeout=120s'],
      undefined,
    ).catch(() => undefined);
    await execa('rm', ['-f', await nodePath('/etc/cni/net.d/10-kubenet.conflist')]);
    await inKclNode(DIR, 1, 'ip', ['link', 'del', 'cbr0'], false);
  }
  // The controller-manager allocates the Node's pod CIDR a moment after the Node registers.
  let cidr = '';
  for (const end = Date.now() + 60_000; !cidr && Date.now() < end; await new Promise((r) => setTimeout(r, 200))) {
    cidr =
      (JSON.parse((await kubectl(['get', 'node', 'kcl-n1', '-o', 'json'])).stdout) as { spec: { podCIDR?: string } }).spec.podCIDR ?? '';
  }
  if (!cidr) throw new Error('the node got no pod CIDR within 60 s');
  for (const p of ['bridge', 'host-local', 'portmap', 'bandwidth', 'loopback'])
    await copyFile(join(REF_PLUGINS_DIR, p), await nodePath(`/opt/cni/bin/${p}`));
  const conf = {
    cniVersion: '1.0.0',
    name: 'ref',
    plugins: [
      {
        type: 'bridge',
        bridge: 'cni0',
        isGateway: true,
        ipMasq: false,
        ipam: { type: 'host-local', ranges: [[{ subnet: cidr }]], routes: [{ dst: '0.0.0.0/0' }] },
      },
      { type: 'portmap', capabilities: { portMappings: true } },
      { type: 'bandwidth', capabilities: { bandwidth: true } },
    ],
  };
  await writeFile(await nodePath('/etc/cni/net.d/10-ref.conflist'), JSON.stringify(conf));
  await kubectl(['wait', '--for=condition=Ready', 'node/kcl-n1', '--timeout=60s']);
}

/** The node runs kubenet-ts as the manifest installs it: the reference conflist and bridge gone first. */
async function useKubenet(): Promise<void> {
  await execa('rm', ['-f', await nodePath('/etc/cni/net.d/10-ref.conflist')]);
  await inKclNode(DIR, 1, 'ip', ['link', 'del', 'cni0'], false);
  await kubectl(['apply', '-f', join(ROOT, 'manifests/kubenet.yaml')]);
  await kubectl(['-n', 'kube-system', 'rollout', 'status', 'daemonset/kubenet', '--timeout=120s']);
  await kubectl(['wait', '--for=condition=Ready', 'node/kcl-n1', '--timeout=60s']);
  await new Promise((r) => setTimeout(r, 2000));
}

async function agentUsage(): Promise<{ cpuMs: number; rssMb: number; pid: string }> {
  const { stdout } = await execa('pgrep', ['-f', '/usr/local/bin/kubenet daemon']);
  const pid = stdout.split('\n')[0] ?? '';
  return { ...(await processUsage(pid)), pid };
}

const t0 = Date.now();
// One local cluster at a time on the machine (its namespaces are kcl-*), and no measurement beside this one.
const releaseCluster = await holdLock(CLUSTER_LOCK, {
  waitMs: 45 * 60_000,
  onWait: () => console.log('waiting for another local cluster to go down'),
});
const releaseTraffic = await holdLock(TRAFFIC_LOCK, { onWait: () => console.log('waiting for the traffic lock') });
try {
  const up = await execa('bash', [join(ROOT, 'hack/cluster.sh'), 'up'], { env: ENV, all: true, reject: false });
  if (up.exitCode !== 0) throw new Error(`cluster up failed:\n${up.all ?? ''}`);
  console.log(
    `kubenet-ts cluster bench: ${PODS} pods per side in ${ROUNDS} rounds, ${CONC} at a time; Kubernetes ${(await kubectl(['version', '-o', 'json'])).stdout.match(/"gitVersion": "([^"]+)"/)?.[1]}, reference plugins ${await refPluginsVersion()}`,
  );
  const ref: number[] = [];
  const ours: number[] = [];
  const sandbox = { ref: [] as number[], ours: [] as number[] };
  let cpuMs = 0;
  const rss = { first: NaN, last: NaN };
  // Rounds alternate the order (reference first, then kubenet first, ...): whatever drifts over the
  // run (the API server's caches, etcd's size, page cache) falls on both sides alike.
  const perRound = Math.ceil(PODS / ROUNDS);
  for (let r = 0; r < ROUNDS; r++) {
    const order = r % 2 === 0 ? (['ref', 'kn'] as const) : (['kn', 'ref'] as const);
    for (const side of order) {
      if (side === 'ref') {
        await useReference();
        ref.push(...(await startup(`ref${r}`, perRound)));
        sandbox.ref.push(...(await sandboxTimes(`ref${r}`)));
      } else {
        await useKubenet();
        const before = await agentUsage();
        ours.push(...(await startup(`kn${r}`, perRound)));
        const after = await agentUsage();
        sandbox.ours.push(...(await sandboxTimes(`kn${r}`)));
        cpuMs += after.cpuMs - before.cpuMs;
        if (Number.isNaN(rss.first)) rss.first = before.rssMb;
        rss.last = after.rssMb;
      }
    }
  }
  const row = (side: string, xs: number[]) =>
    console.log(
      `${side.padEnd(10)} ${String(xs.length).padStart(4)} ${percentile(xs, 50).toFixed(0).padStart(8)} ${percentile(xs, 99).toFixed(0).padStart(8)} ${Math.min(
        ...xs,
      )
        .toFixed(0)
        .padStart(8)} ${Math.max(...xs)
        .toFixed(0)
        .padStart(8)}`,
    );
  console.log("\npod startup, ms (create -> Ready, seen on the API server's watch)");
  console.log('side          n      p50      p99      min      max');
  row('reference', ref);
  row('kubenet', ours);
  const r50 = percentile(ours, 50) / percentile(ref, 50);
  const r99 = percentile(ours, 99) / percentile(ref, 99);
  console.log(`ratio k/r        ${r50.toFixed(3).padStart(8)} ${r99.toFixed(3).padStart(8)}`);
  console.log("\nof which the pod's sandbox, ms (containerd's RunPodSandbox: netns, CNI ADD, pause start)");
  console.log('side          n      p50      p99      min      max');
  row('reference', sandbox.ref);
  row('kubenet', sandbox.ours);
  console.log(
    `agent over its ${ours.length} pods: CPU ${cpuMs.toFixed(0)} ms (${(cpuMs / ours.length).toFixed(1)} ms per pod, ADD + DEL), RSS ${rss.first.toFixed(0)} -> ${rss.last.toFixed(0)} MB`,
  );
  console.log(`${r50 <= 1 ? 'PASS' : 'MISS'}  startup p50 <= the reference's: ${r50.toFixed(3)}x`);
  console.log(`${r99 <= 1.1 ? 'PASS' : 'MISS'}  startup p99 <= 1.1x the reference's: ${r99.toFixed(3)}x`);
} finally {
  const down = await execa('bash', [join(ROOT, 'hack/cluster.sh'), 'down'], { env: ENV, all: true, reject: false });
  await releaseTraffic();
  await releaseCluster();
  console.log(`cluster down: ${down.all?.trim() ?? ''} (total ${((Date.now() - t0) / 1000).toFixed(0)} s)`);
}
