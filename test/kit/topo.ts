/**
 * A throwaway pod topology for shaper tests and the shaping bench: one bridge `ksh<tag>`, and per
 * pod a netns `ksh-<tag>-<i>` holding `eth0` (10.98.<net>.<10+i>/24 and fd00:98:<net>::<10+i>/64,
 * nodad) whose host side `kv<tag><i>` is a bridge port. The bridge has no address: traffic only
 * flows between the namespaces made here. iperf3 helpers run servers/clients inside them only.
 */
import { execa, type ResultPromise } from 'execa';
import { randomBytes, randomInt } from 'node:crypto';
import { readFileSync } from 'node:fs';
import { performance } from 'node:perf_hooks';
import { withTrafficLock } from './traffic-lock.js';

export interface TopoPod {
  index: number;
  netns: string;
  netnsPath: string;
  hostVeth: string;
  ip4: string;
  ip6: string;
  id: string;
}

export interface Topology {
  tag: string;
  bridge: string;
  pods: TopoPod[];
  destroy(): Promise<void>;
}

export async function ipBatch(lines: string[], force = false): Promise<void> {
  if (lines.length === 0) return;
  const r = await execa('ip', [...(force ? ['-force'] : []), '-batch', '-'], { input: lines.join('\n') + '\n', reject: false });
  if (r.exitCode !== 0 && !force) throw new Error(`ip -batch failed: ${r.stderr}`);
}

/**
 * Creates `n` pods. `withNetns: false` leaves the pod end in the root namespace and
 * `addresses: false` skips addressing (cheap, for setup-cost benchmarks that never send traffic).
 */
export async function makeTopology(n: number, opts: { withNetns?: boolean; addresses?: boolean } = {}): Promise<Topology> {
  const withNetns = opts.withNetns ?? true;
  const addresses = withNetns && (opts.addresses ?? true);
  const tag = randomBytes(3).toString('hex');
  const net = randomInt(1, 250);
  const bridge = `ksh${tag}`;
  const pods: TopoPod[] = Array.from({ length: n }, (_, i) => {
    const host = 10 + i;
    // Beyond 245 pods, spill into the next /24 (bench sizes up to 500+).
    const ip4 = `10.98.${(net + Math.floor(host / 250)) % 256}.${host % 250 || 250}`;
    return {
      index: i,
      netns: `ksh-${tag}-${i}`,
      netnsPath: `/var/run/netns/ksh-${tag}-${i}`,
      hostVeth: `kv${tag}${i}`,
      ip4,
      ip6: `fd00:98:${net.toString(16)}::${host.toString(16)}`,
      id: `pod-${tag}-${i}`,
    };
  });
  const topo: Topology = {
    tag,
    bridge,
    pods,
    destroy: async () => {
      await ipBatch([...pods.map((p) => (withNetns ? `netns del ${p.netns}` : `link del ${p.hostVeth}`)), `link del ${bridge}`], true);
    },
  };
  try {
    await ipBatch([`link add name ${bridge} type bridge`, `link set dev ${bridge} up`]);
    const lines: string[] = [];
    for (const p of pods) {
      if (withNetns) {
        lines.push(`netns add ${p.netns}`);
        lines.push(`link add name ${p.hostVeth} type veth peer name eth0 netns ${p.netns}`);
      } else {
        lines.push(`link add name ${p.hostVeth} type veth peer name kp${tag}${p.index}`);
      }
      lines.push(`link set dev ${p.hostVeth} master ${bridge} up`);
    }
    await ipBatch(lines);
    if (addresses) {
      await Promise.all(
        pods.map((p) =>
          execa('ip', ['netns', 'exec', p.netns, 'ip', '-batch', '-'], {
            input:
              [`addr add ${p.ip4}/16 dev eth0`, `addr add ${p.ip6}/64 dev eth0 nodad`, `link set dev eth0 up`, `link set dev lo up`].join(
                '\n',
              ) + '\n',
          }),
        ),
      );
    }
  } catch (err) {
    await topo.destroy();
    throw err;
  }
  return topo;
}

export interface IperfResult {
  /** receiver-side goodput, bits/s */
  bps: number;
  /** per-interval receiver-side bits/s (1 s intervals; a last partial interval may be included) */
  intervals: number[];
  retransmits: number | undefined;
  /** data segments the sender put on the wire: received bytes / MSS + retransmits */
  segments: number | undefined;
  /** TCP payload bytes the receiver got over the whole run (iperf3's sum_received.bytes) */
  bytes: number | undefined;
  /** the connection's MSS (iperf3's tcp_mss_default) */
  mss: number | undefined;
  /** % of the run's wall time some task waited for a CPU (/proc/pressure/cpu), to explain a dip */
  cpuWaitPct: number | undefined;
}

/** /proc/pressure/cpu's "some" total in µs, or undefined where the kernel has no PSI. */
function cpuPressureUs(): number | undefined {
  try {
    const m = /^some .*total=(\d+)/m.exec(readFileSync('/proc/pressure/cpu', 'utf8'));
    return m ? Number(m[1]) : undefined;
  } catch {
    return undefined;
  }
}

let portSeq = 0;

const UNIT: Record<string, number> = { '': 1, K: 1e3, M: 1e6, G: 1e9 };

/** Receiver intervals (≥ 0.5 s long) from the text report of an iperf3 server. */
export function serverIntervals(text: string): number[] {
  const out: number[] = [];
  for (const line of text.split('\n')) {
    const m = /^\[\s*\d+\]\s+([\d.]+)-([\d.]+)\s+sec\s+[\d.]+ \w?Bytes\s+([\d.]+) ([KMG]?)bits\/sec\s*$/.exec(line);
    if (!m) continue;
    const dur = Number(m[2]) - Number(m[1]);
    if (dur >= 0.5 && dur <= 1.5) out.push(Number(m[3]) * (UNIT[m[4] ?? ''] ?? 1));
  }
  return out;
}

export interface IperfOptions {
  seconds?: number;
  reverse?: boolean;
  v6?: boolean;
  omit?: number;
  onStart?: () => void;
  /** TCP congestion control of the flow (iperf3 -C, e.g. cubic); default: the host's. */
  congestion?: string;
  /** Told about each failed iperf3 run that is retried (the tool failing, never a rate miss). */
  onRetry?: (err: Error, attempt: number) => void;
}

/**
 * Where iperf3 runs: a named netns (`ip netns exec`), or when `netns` is empty the netns at
 * `netnsPath` (`nsenter --net`, e.g. /proc/<pid>/ns/net of a container runtime's pod sandbox).
 * A TopoPod is one.
 */
export interface IperfEndpoint {
  netns: string;
  netnsPath?: string;
  ip4: string;
  ip6?: string;
}

/**
 * The command line that runs `cmd` in the endpoint's netns, at nice -15: the test files that run
 * beside a measurement (ava runs two at once on this 2-core machine) must not starve the flow's
 * two ends. With four busy loops beside it a 20M TCP flow through htb lost an interval to 14.7
 * Mbit/s (1 253 retransmits) at nice 0 and none in runs at -15; a CI run failed on 17.35 of 20.
 */
function inNetns(ep: IperfEndpoint, cmd: string[]): [string, string[]] {
  if (ep.netns) return ['nice', ['-n', '-15', 'ip', 'netns', 'exec', ep.netns, ...cmd]];
  if (!ep.netnsPath) throw new Error('an iperf endpoint needs netns or netnsPath');
  return ['nice', ['-n', '-15', 'nsenter', `--net=${ep.netnsPath}`, '--', ...cmd]];
}

/** iperf3 itself failed (connection reset at the end of a run, no intervals...): not a measurement. */
export class IperfToolError extends Error {}

/**
 * iperf3 from `client` to `server` (both our namespaces), or server → client with `reverse`.
 * Returns the receiver's view. iperf3 3.12 sometimes ends a run with "Connection reset by peer"
 * (a race between its control and data connections at test end, esnet/iperf#499); such a run is
 * repeated, at most twice. A measured rate is never retried.
 */
export async function iperf(server: IperfEndpoint, client: IperfEndpoint, opts: IperfOptions = {}): Promise<IperfResult> {
  for (let attempt = 1; ; attempt++) {
    try {
      // Never beside another measurement (test/kit/traffic-lock.ts).
      return await withTrafficLock(() => iperfOnce(server, client, opts));
    } catch (err) {
      if (!(err instanceof IperfToolError) || attempt >= 3) throw err;
      opts.onRetry?.(err, attempt);
    }
  }
}

/** An onRetry that logs each repeated run in the test's output. */
export function retryLog(t: { log: (...a: unknown[]) => void }): (err: Error, attempt: number) => void {
  return (err, attempt) => t.log(`iperf3 run ${attempt} failed (${err.message}); running it again`);
}

/** One iperf3 run. The server is a one-shot (-1) and is killed afterwards regardless. */
async function iperfOnce(server: IperfEndpoint, client: IperfEndpoint, opts: IperfOptions): Promise<IperfResult> {
  const port = 20000 + ((process.pid * 7 + portSeq++) % 20000);
  const srv: ResultPromise = execa(...inNetns(server, ['iperf3', '-s', '-1', '--forceflush', '-p', String(port)]), { reject: false });
  try {
    // Wait until the server listens (iperf3 prints "Server listening").
    await new Promise<void>((resolve) => {
      const timer = setTimeout(resolve, 1500);
      srv.stdout?.on('data', (d: Buffer) => {
        if (d.toString().includes('listening')) {
          clearTimeout(timer);
          resolve();
        }
      });
    });
    const target = opts.v6 ? server.ip6 : server.ip4;
    if (!target) throw new Error(`iperf server has no ${opts.v6 ? 'IPv6' : 'IPv4'} address`);
    const args = ['iperf3', '-c', target, '-p', String(port), '-t', String(opts.seconds ?? 5), '-J'];
    if (opts.omit) args.push('-O', String(opts.omit));
    if (opts.congestion) args.push('-C', opts.congestion);
    // Intervals from the receiver: the sender's view counts bytes written into its socket buffer,
    // which makes the first second look like a burst through the shaper.
    if (opts.reverse) args.push('-R');
    else args.push('--get-server-output');
    opts.onStart?.();
    const [psi0, t0] = [cpuPressureUs(), performance.now()];
    const r = await execa(...inNetns(client, args), { reject: false, timeout: ((opts.seconds ?? 5) + 20) * 1000 });
    const psi1 = cpuPressureUs();
    const cpuWaitPct = psi0 !== undefined && psi1 !== undefined ? ((psi1 - psi0) / 1000 / (performance.now() - t0)) * 100 : undefined;
    type Intervals = Array<{ sum: { bits_per_second: number; omitted?: boolean } }>;
    interface Report {
      error?: string;
      start?: { tcp_mss_default?: number };
      end?: { sum_received?: { bits_per_second: number; bytes?: number }; sum_sent?: { retransmits?: number } };
      intervals?: Intervals;
      server_output_text?: string;
    }
    let j: Report;
    try {
      j = JSON.parse(r.stdout || '{}') as Report;
    } catch {
      throw new IperfToolError(`iperf3 printed no JSON report (exit ${r.exitCode}): ${r.stderr || r.stdout.slice(0, 200)}`);
    }
    if (j.error || !j.end?.sum_received) throw new IperfToolError(`iperf3 failed: ${j.error ?? r.stderr}`);
    const intervals = opts.reverse
      ? (j.intervals ?? []).filter((i) => !i.sum.omitted).map((i) => i.sum.bits_per_second)
      : serverIntervals(j.server_output_text ?? '');
    if (intervals.length === 0) throw new IperfToolError('iperf3 gave no receiver-side intervals');
    const mss = j.start?.tcp_mss_default;
    const received = j.end.sum_received.bytes;
    const retransmits = j.end.sum_sent?.retransmits;
    return {
      bps: j.end.sum_received.bits_per_second,
      intervals,
      retransmits,
      segments: mss && received !== undefined ? Math.ceil(received / mss) + (retransmits ?? 0) : undefined,
      bytes: received,
      mss,
      cpuWaitPct,
    };
  } finally {
    srv.kill('SIGKILL');
    await srv.catch(() => undefined);
  }
}

/**
 * ping from a pod to another pod (ours) every `intervalS` (default 0.2 s; below 0.2 needs root);
 * average and max RTT in ms, loss in % (a reply later than 2 s counts as lost).
 */
export async function pingRtt(
  from: TopoPod,
  to: TopoPod,
  count: number,
  intervalS = 0.2,
): Promise<{ avg: number; max: number; loss: number; sent: number; received: number }> {
  const r = await execa(
    'ip',
    ['netns', 'exec', from.netns, 'ping', '-q', '-i', String(intervalS), '-c', String(count), '-W', '2', to.ip4],
    { reject: false },
  );
  const m = /= [\d.]+\/([\d.]+)\/([\d.]+)\//.exec(r.stdout);
  const loss = /(\d+(?:\.\d+)?)% packet loss/.exec(r.stdout);
  const counts = /(\d+) packets transmitted, (\d+) received/.exec(r.stdout);
  return {
    avg: m?.[1] ? Number(m[1]) : NaN,
    max: m?.[2] ? Number(m[2]) : NaN,
    loss: loss?.[1] ? Number(loss[1]) : NaN,
    sent: counts?.[1] ? Number(counts[1]) : NaN,
    received: counts?.[2] ? Number(counts[2]) : NaN,
  };
}
