/**
 * The main job, no cluster needed: starts the node agent (`kubenet daemon`) on the embedded
 * default pod CIDR with the demo's own bridge, ifb, socket and CNI dirs; creates three pods (network
 * namespaces of the demo's own) through the CNI binary the agent installed, as a container runtime
 * would (one unshaped, two with bandwidth limits passed as runtimeConfig.bandwidth); measures each
 * limit with iperf3 between the demo pods; prints asked vs measured; then changes one pod's limit
 * twice with `kubenet shape` while one iperf3 flow runs, printing the flow's rate every second and
 * `kubenet top` frames; removes everything it made. The measurements hold the traffic lock.
 */
import { execa, type ResultPromise } from 'execa';
import { randomBytes } from 'node:crypto';
import { mkdtemp, readFile, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { agentGet, HEALTH_PATH } from '../src/daemon/protocol.js';
import { iperf, serverIntervals, type TopoPod } from '../test/kit/topo.js';
import { withTrafficLock } from '../test/kit/traffic-lock.js';
import { CNI_BIN_DIRS, delIfbs } from '../test/kit/kernel.js';

export const DEMO_POD_CIDR = '10.244.0.0/24';
const ROOT = fileURLToPath(new URL('../', import.meta.url));
const M = 1e6;
/** Seconds of each measurement, after TCP's first second (iperf3 -O 1, as the tests measure). */
const SECONDS = 4;
const OMIT = 1;

interface DemoPod {
  name: string;
  id: string;
  netns: string;
  /** bits/s, as containerd passes the pod's annotations. */
  bandwidth?: { ingressRate?: number; egressRate?: number };
  ip?: string;
}

const tty = process.stdout.isTTY;
function progress(line: string): void {
  if (tty) process.stdout.write(`\r\x1b[2K${line}`);
}
function done(line: string): void {
  if (tty) process.stdout.write('\r\x1b[2K');
  console.log(line);
}

async function main(): Promise<void> {
  const tag = randomBytes(2).toString('hex');
  const dir = await mkdtemp(join(tmpdir(), 'kubenet-demo-'));
  const bridge = `kdemo${tag}`;
  const ifb = `kdifb${tag}`;
  const socket = join(dir, 'kubenet.sock');
  const cniBin = join(dir, 'cni-bin');
  const cniConf = join(dir, 'cni-conf');
  const pods: DemoPod[] = [
    { name: 'free', id: `demo-free-${tag}`, netns: `kdemo-${tag}-free` },
    { name: 'gold', id: `demo-gold-${tag}`, netns: `kdemo-${tag}-gold`, bandwidth: { ingressRate: 40 * M, egressRate: 20 * M } },
    { name: 'bronze', id: `demo-bronze-${tag}`, netns: `kdemo-${tag}-bronze`, bandwidth: { egressRate: 5 * M } },
  ];
  const agentArgs = [
    '--import=tsx',
    join(ROOT, 'src/cli/main.ts'),
    'daemon',
    '--pod-cidr',
    DEMO_POD_CIDR,
    '--socket',
    socket,
    '--cni-bin-dir',
    cniBin,
    '--cni-conf-dir',
    cniConf,
    '--plugin-bin-dirs',
    CNI_BIN_DIRS.join(','),
    '--bridge-name',
    bridge,
    '--ifb-name',
    ifb,
    '--non-masquerade-cidr',
    '0.0.0.0/0',
    // /metrics and /healthz on the loopback only: the demo's agent is not the node's.
    '--metrics-address',
    '127.0.0.1:0',
    '--ipam-data-dir',
    join(dir, 'ipam'),
    '--cni-cache-dir',
    join(dir, 'cni-cache'),
    '--state-dir',
    join(dir, 'state'),
    '--log-level',
    process.env.KUBENET_LOG_LEVEL ?? 'warn',
  ];
  let agent: ResultPromise | undefined;
  const added: DemoPod[] = [];
  const cni = (command: string, pod: DemoPod, runtimeConfig?: object) =>
    execa(join(cniBin, 'kubenet'), [], {
      reject: false,
      input: JSON.stringify({ cniVersion: '1.0.0', name: 'kubenet', type: 'kubenet', socket, ...(runtimeConfig ? { runtimeConfig } : {}) }),
      env: {
        CNI_COMMAND: command,
        CNI_CONTAINERID: pod.id,
        CNI_NETNS: `/var/run/netns/${pod.netns}`,
        CNI_IFNAME: 'eth0',
        CNI_PATH: [cniBin, ...CNI_BIN_DIRS].join(':'),
        CNI_ARGS: `IgnoreUnknown=1;K8S_POD_NAMESPACE=demo;K8S_POD_NAME=${pod.name};K8S_POD_INFRA_CONTAINER_ID=${pod.id}`,
      },
    });
  try {
    console.log(`kubenet-ts demo: agent on pod CIDR ${DEMO_POD_CIDR}, bridge ${bridge}, everything under ${dir}`);
    agent = execa(process.execPath, agentArgs, { cwd: ROOT, stdio: ['ignore', 'inherit', 'inherit'], reject: false });
    await waitHealthy(socket, agent);
    const conflist = JSON.parse(await readFile(join(cniConf, '10-kubenet.conflist'), 'utf8')) as object;
    console.log(
      `agent ready: installed ${join(cniBin, 'kubenet')} and ${join(cniConf, '10-kubenet.conflist')}:\n  ${JSON.stringify(conflist)}`,
    );

    for (const p of pods) {
      await execa('ip', ['netns', 'add', p.netns]);
      added.push(p);
      const started = performance.now();
      const r = await cni('ADD', p, p.bandwidth ? { bandwidth: p.bandwidth } : undefined);
      if (r.exitCode !== 0) throw new Error(`CNI ADD of pod ${p.name} failed: ${r.stdout || r.stderr}`);
      const result = JSON.parse(r.stdout) as { ips: Array<{ address: string }> };
      p.ip = result.ips[0]?.address.split('/')[0];
      console.log(
        `  CNI ADD ${p.name.padEnd(6)} -> ${String(p.ip).padEnd(12)} in ${(performance.now() - started).toFixed(1)} ms  limits: ${limitsText(p)}`,
      );
    }
    const kubenet = async (args: string[]) => {
      const r = await execa(process.execPath, ['--import=tsx', join(ROOT, 'src/cli/main.ts'), ...args, '--socket', socket], {
        cwd: ROOT,
        reject: false,
      });
      return `$ kubenet ${args.join(' ')}\n${r.stdout}${r.stderr}`;
    };
    console.log(`\n${await kubenet(['status'])}\n`);

    const [free, gold, bronze] = pods as [DemoPod, DemoPod, DemoPod];
    // Each limit measured pod to pod; the other end never limits that direction.
    const runs: Array<{ what: string; sender: DemoPod; receiver: DemoPod; asked: number | undefined }> = [
      { what: 'gold egress', sender: gold, receiver: free, asked: gold.bandwidth?.egressRate },
      { what: 'gold ingress', sender: free, receiver: gold, asked: gold.bandwidth?.ingressRate },
      { what: 'bronze egress', sender: bronze, receiver: free, asked: bronze.bandwidth?.egressRate },
      { what: 'free (unshaped)', sender: free, receiver: bronze, asked: undefined },
    ];
    const rows: string[][] = [];
    await withTrafficLock(
      async () => {
        for (const [i, run] of runs.entries()) {
          const label = `[${i + 1}/${runs.length}] ${run.what}: ${run.sender.name} -> ${run.receiver.name}`;
          const seconds = await measure(run.sender, run.receiver, (s) => progress(`measuring ${label} ... ${s}/${SECONDS + OMIT} s`));
          const measured = median(seconds);
          const ok = run.asked === undefined ? measured > 200 * M : Math.abs(measured / run.asked - 1) <= 0.1;
          done(`measured  ${label}: ${fmt(measured)} (1 s rates ${seconds.map(short).join(' ')})`);
          rows.push([
            run.what,
            `${run.sender.name} -> ${run.receiver.name}`,
            run.asked ? fmt(run.asked) : 'unlimited',
            fmt(measured),
            run.asked ? `${((measured / run.asked - 1) * 100).toFixed(1)}%` : '',
            ok ? 'ok' : 'OFF',
          ]);
          if (!ok) process.exitCode = 1;
        }
      },
      { onWait: () => console.log('(waiting for the machine-wide traffic lock: another measurement runs)') },
    );
    console.log('');
    printTable(['pod / direction', 'iperf3', 'asked', 'measured (median 1 s)', 'diff', ''], rows);
    console.log(
      `(TCP goodput at the receiver, ${SECONDS} s after TCP's first second; limits apply to whole frames, so goodput sits ~4% under them.\n` +
        ' The median second: a new flow that overruns the queue can lose a second or two to its loss recovery, which is TCP, not the limit)',
    );

    // Live: gold's egress limit changed twice while one TCP flow runs; its rate follows.
    console.log(
      `\nlive re-shape: one iperf3 flow gold -> free for ${LIVE_SECONDS} s; gold's egress limit changed with kubenet shape at ${LIVE_DOWN_AT} s and ${LIVE_UP_AT} s`,
    );
    const follow = await withTrafficLock(() => liveReshape(gold, free, kubenet));
    const phases = [
      { what: `egress ${fmt(gold.bandwidth?.egressRate ?? 0)}`, asked: gold.bandwidth?.egressRate ?? 0, from: 1, to: LIVE_DOWN_AT },
      { what: 'after kubenet shape --egress 10M', asked: 10 * M, from: LIVE_DOWN_AT + SETTLE, to: LIVE_UP_AT },
      { what: 'after kubenet shape --egress 40M', asked: 40 * M, from: LIVE_UP_AT + SETTLE, to: LIVE_SECONDS },
    ];
    const liveRows = phases.map((ph) => {
      const m = median(follow.slice(ph.from, ph.to));
      const ok = Math.abs(m / ph.asked - 1) <= 0.1;
      if (!ok) process.exitCode = 1;
      return [ph.what, `${ph.from}-${ph.to} s`, fmt(ph.asked), fmt(m), `${((m / ph.asked - 1) * 100).toFixed(1)}%`, ok ? 'ok' : 'OFF'];
    });
    console.log('');
    printTable(['gold egress, one TCP flow', 'seconds', 'limit', 'median of the 1 s rates', 'diff', ''], liveRows);
    console.log(
      `(the same TCP connection throughout; each limit compared from ${SETTLE} s after its change. Right after a lower limit TCP backs off:\n` +
        ' a second can dip under it and the next exceed it, as the receiver hands over at once what it held back)',
    );
  } finally {
    for (const p of added) {
      const r = await cni('DEL', p);
      if (r.exitCode !== 0) console.error(`CNI DEL of pod ${p.name} failed: ${r.stdout || r.stderr}`);
    }
    if (agent) {
      agent.kill('SIGTERM');
      await agent;
    }
    for (const p of added) await execa('ip', ['netns', 'del', p.netns], { reject: false });
    await execa('ip', ['link', 'del', bridge], { reject: false });
    await delIfbs(ifb); // and its egress shards (ifb.1, ...)
    await rm(dir, { recursive: true, force: true });
    const left = (await execa('ip', ['-o', 'link', 'show'])).stdout.split('\n').filter((l) => l.includes(bridge) || l.includes(ifb));
    console.log(left.length === 0 ? 'removed the demo pods, bridge, ifbs, agent state and CNI dirs' : `left behind: ${left.join('; ')}`);
  }
}

function median(xs: number[]): number {
  const s = [...xs].sort((a, b) => a - b);
  const mid = Math.floor(s.length / 2);
  return s.length === 0 ? 0 : s.length % 2 ? (s[mid] as number) : ((s[mid - 1] as number) + (s[mid] as number)) / 2;
}

const LIVE_SECONDS = 18;
const LIVE_DOWN_AT = 6;
const LIVE_UP_AT = 12;
/** Seconds a flow gets to settle after its limit changed before its rate is compared with it. */
const SETTLE = 3;

/**
 * One iperf3 flow sender -> receiver for LIVE_SECONDS, the receiver's rate printed each second as
 * it arrives; `kubenet shape` to 10M at LIVE_DOWN_AT and to 40M at LIVE_UP_AT, `kubenet top -b -n 1`
 * after each. Returns the receiver's per-second rates.
 */
async function liveReshape(sender: DemoPod, receiver: DemoPod, kubenet: (args: string[]) => Promise<string>): Promise<number[]> {
  const port = 5201 + Math.floor(Math.random() * 1000);
  const server = execa('ip', ['netns', 'exec', receiver.netns, 'iperf3', '-s', '-1', '--forceflush', '-p', String(port)], {
    reject: false,
  });
  let text = '';
  let printed = 0;
  try {
    await new Promise<void>((resolve) => {
      const timer = setTimeout(resolve, 1500);
      server.stdout?.on('data', (d: Buffer) => {
        text += d.toString();
        if (text.includes('listening')) {
          clearTimeout(timer);
          resolve();
        }
        for (const rate of serverIntervals(text).slice(printed))
          console.log(`  [flow] ${String(printed).padStart(2)}-${String(++printed).padEnd(2)} s  ${fmt(rate)}`);
      });
    });
    const t0 = Date.now();
    const client = execa(
      'ip',
      ['netns', 'exec', sender.netns, 'iperf3', '-c', String(receiver.ip), '-p', String(port), '-t', String(LIVE_SECONDS)],
      { reject: false },
    );
    const at = async (s: number, args: string[]) => {
      await new Promise((r) => setTimeout(r, Math.max(0, t0 + s * 1000 - Date.now())));
      console.log(await kubenet(args));
    };
    await at(LIVE_DOWN_AT, ['shape', `demo/${sender.name}`, '--egress', '10M']);
    await at(LIVE_DOWN_AT + 4, ['top', '-b', '-n', '1']);
    await at(LIVE_UP_AT, ['shape', `demo/${sender.name}`, '--egress', '40M']);
    await at(LIVE_UP_AT + 4, ['top', '-b', '-n', '1']);
    const c = await client;
    if (c.exitCode !== 0) throw new Error(`iperf3 client failed: ${c.stderr || c.stdout}`);
    await server;
    return serverIntervals(text);
  } finally {
    server.kill('SIGKILL');
    await server;
  }
}

function limitsText(p: DemoPod): string {
  const b = p.bandwidth;
  if (!b) return 'none';
  return [b.ingressRate ? `ingress ${fmt(b.ingressRate)}` : '', b.egressRate ? `egress ${fmt(b.egressRate)}` : '']
    .filter(Boolean)
    .join(', ');
}

/** A 1 s rate, short: Mbit/s (or Gbit/s) with one decimal. */
function short(bps: number): string {
  return bps >= 1e9 ? `${(bps / 1e9).toFixed(1)}G` : `${(bps / M).toFixed(1)}M`;
}

function fmt(bps: number): string {
  return bps >= 1e9 ? `${(bps / 1e9).toFixed(2)} Gbit/s` : `${(bps / M).toFixed(2)} Mbit/s`;
}

function printTable(head: string[], rows: string[][]): void {
  const widths = head.map((h, i) => Math.max(h.length, ...rows.map((r) => (r[i] ?? '').length)));
  const line = (cells: string[]) =>
    '  ' +
    cells
      .map((c, i) => c.padEnd(widths[i] ?? 0))
      .join('  ')
      .trimEnd();
  console.log(line(head));
  console.log(line(widths.map((w) => '-'.repeat(w))));
  for (const r of rows) console.log(line(r));
}

/** iperf3 from sender to receiver (both demo pods), as the tests measure; the receiver's 1 s rates in bits/s. */
async function measure(sender: DemoPod, receiver: DemoPod, tick: (s: number) => void): Promise<number[]> {
  const topo = (p: DemoPod, index: number): TopoPod => ({
    index,
    netns: p.netns,
    netnsPath: `/var/run/netns/${p.netns}`,
    hostVeth: '',
    ip4: String(p.ip),
    ip6: '',
    id: p.id,
  });
  let s = 0;
  let ticker: NodeJS.Timeout | undefined;
  const onStart = () => {
    clearInterval(ticker);
    s = 0;
    tick(0);
    ticker = setInterval(() => tick(Math.min(++s, SECONDS + OMIT)), 1000);
  };
  try {
    return (await iperf(topo(receiver, 1), topo(sender, 0), { seconds: SECONDS, omit: OMIT, onStart })).intervals;
  } finally {
    clearInterval(ticker);
  }
}

/** Polls the agent's /healthz until 200; fails if the agent exits first. */
async function waitHealthy(socket: string, agent: ResultPromise): Promise<void> {
  let exited = false;
  void agent.then(() => {
    exited = true;
  });
  const deadline = Date.now() + 30_000;
  for (;;) {
    if (exited) throw new Error('the agent exited during startup (see its log above)');
    const status = await agentGet(socket, HEALTH_PATH).then(
      (r) => r.status,
      () => 0,
    );
    if (status === 200) return;
    if (Date.now() > deadline) throw new Error(`the agent did not become ready within 30 s (socket ${socket})`);
    await new Promise((r) => setTimeout(r, 100));
  }
}

main().catch((err) => {
  console.error(err instanceof Error ? err.message : err);
  process.exitCode = 1;
});
