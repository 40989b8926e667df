/**
 * The shared ifb under perf (bench/shaping.ts (5c), issue 32): how long its qdisc lock is waited for
 * and held per packet, and how much of a CPU its tasklet takes, from kernel tracepoints recorded
 * system-wide for a second while the ifb carries traffic (`perf record -a`; root, linux-perf).
 *
 * The kernel here has no kprobes and no function_graph tracer, so the lock's hold time is read off
 * the tracepoints around it, per CPU, in time order:
 * - enqueue: `net:net_dev_queue` for the ifb (before the root lock is taken) to `qdisc:qdisc_enqueue`
 *   (the packet in htb, lock held), less the lock waits in between (`lock:contention_begin/end`);
 * - dequeue: from the moment the lock is held again (`qdisc:qdisc_enqueue`, or `net:net_dev_xmit`
 *   after the previous packet went to the device, whose return re-takes the lock) to
 *   `qdisc:qdisc_dequeue`, less the waits in between; empty dequeues count too (the lock is held);
 * - the tracepoints' own cost: `net:net_dev_start_xmit` to `net:net_dev_xmit` around ifb_xmit (a
 *   queue append), the median, subtracted once from each section's median.
 * Lock waits are those that fall inside these sections (the root lock and htb's busylock);
 * their sum over the window and all CPUs is the share of CPU spent waiting on the ifb's lock.
 * The ifb's tasklet (`irq:tasklet_entry/exit`, function ifb_ri_tasklet) hands each packet back to
 * the stack (bridge, routing, the receiver's queue): its busy time and the CPUs it ran on. Every
 * ifb's tasklet runs that one function, so with egress shards the busy time is all shards'; its
 * time per packet is then divided by `shards` × this ifb's packets (the pods spread evenly).
 * Tracing costs time itself: the run under perf is slower, and its figures are upper bounds.
 */
import { execa } from 'execa';
import { mkdtemp, rm } from 'node:fs/promises';
import { availableParallelism, tmpdir } from 'node:os';
import { join } from 'node:path';
import { percentile } from '../test/kit/bench-kit.js';

export interface QdiscPerf {
  seconds: number;
  /** The egress shards the tasklet figures cover. */
  shards: number;
  skbPerSec: number;
  bytesPerSkb: number;
  /** Waits on the ifb's qdisc locks, as a share of all CPU time of the window. */
  lockWaitShare: number;
  waitsPerSec: number;
  /** Medians, µs, the tracepoint cost subtracted. */
  enqueueHoldUs: number;
  dequeueHoldUs: number;
  /** Lock held per packet: (every enqueue and dequeue section, tracepoint cost subtracted from each) / packets, µs. */
  holdPerSkbUs: number;
  tracepointUs: number;
  /** The tasklets' busy time (every shard's) as a share of one CPU, µs per packet (over `shards` × this ifb's), and busy time per CPU. */
  taskletShare: number;
  taskletUsPerSkb: number;
  taskletCpus: string;
}

export interface QdiscPerfOptions {
  ifb: string;
  /** Runs a command in the ifb's network namespace (its ifindex). */
  netnsExec: (cmd: string, args: string[]) => Promise<{ stdout: string }>;
  seconds: number;
  /** How many egress shards (ifbs) carry the pods' traffic, `ifb` among them; 1 unless told. */
  shards?: number;
}

/** Records the tracepoints for `seconds` and reads the figures off them. */
export async function qdiscPerf(o: QdiscPerfOptions): Promise<QdiscPerf> {
  const ifindex = Number((await o.netnsExec('cat', [`/sys/class/net/${o.ifb}/ifindex`])).stdout.trim());
  const kallsyms = await execa('grep', [' ifb_ri_tasklet', '/proc/kallsyms'], { reject: false });
  const tasklet = kallsyms.stdout.split(' ')[0];
  const dir = await mkdtemp(join(tmpdir(), 'kba-perf-'));
  try {
    const data = join(dir, 'perf.data');
    const name = `name == "${o.ifb}"`;
    const qdisc = `ifindex == ${ifindex} && handle == 0x10000`;
    const events: Array<[string, string | undefined]> = [
      ['net:net_dev_queue', name],
      ['net:net_dev_start_xmit', name],
      ['net:net_dev_xmit', name],
      ['qdisc:qdisc_enqueue', qdisc],
      ['qdisc:qdisc_dequeue', qdisc],
      ['irq:tasklet_entry', tasklet ? `func == 0x${tasklet}` : undefined],
      ['irq:tasklet_exit', tasklet ? `func == 0x${tasklet}` : undefined],
      ['lock:contention_begin', undefined],
      ['lock:contention_end', undefined],
    ];
    const args = [
      'record',
      '-a',
      '-q',
      '-o',
      data,
      ...events.flatMap(([e, f]) => ['-e', e, ...(f ? ['--filter', f] : [])]),
      '--',
      'sleep',
      String(o.seconds),
    ];
    const rec = await execa('perf', args, { reject: false });
    if (rec.exitCode !== 0) throw new Error(`perf record failed: ${rec.stderr.slice(-400)}`);
    const script = await execa('perf', ['script', '-i', data, '-F', 'cpu,time,event,trace'], {
      reject: false,
      maxBuffer: 1024 * 1024 * 1024,
    });
    return analyse(script.stdout, o.seconds, o.shards ?? 1);
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
}

/** Per-CPU state while walking the events in time order. */
interface CpuState {
  /** A packet is on its way in: net_dev_queue seen at this time. */
  enqueueFrom?: number;
  /** The lock is (about to be) held for a dequeue since this time. */
  dequeueFrom?: number;
  waitFrom?: number;
  /** Waits inside the current section. */
  waited: number;
  startXmit?: number;
  taskletFrom?: number;
}

/** Reads the figures off `perf script -F cpu,time,event,trace` output (exported for the test). */
export function analyse(text: string, seconds: number, shards = 1): QdiscPerf {
  const cpus = new Map<number, CpuState>();
  const enq: number[] = [];
  const deq: number[] = [];
  const floor: number[] = [];
  let waitTotal = 0;
  let waits = 0;
  let skbs = 0;
  let bytes = 0;
  const taskletBusy = new Map<number, number>();
  let first = Infinity;
  let last = -Infinity;
  const re = /^\s*\[(\d+)\]\s+([\d.]+):\s+(\S+):\s*(.*)$/;
  for (const line of text.split('\n')) {
    const m = re.exec(line);
    if (!m) continue;
    const cpu = Number(m[1]);
    const t = Number(m[2]) * 1e6; // µs
    const ev = m[3] ?? '';
    const rest = m[4] ?? '';
    first = Math.min(first, t);
    last = Math.max(last, t);
    let s = cpus.get(cpu);
    if (!s) cpus.set(cpu, (s = { waited: 0 }));
    switch (ev) {
      case 'net:net_dev_queue':
        s.enqueueFrom = t;
        s.waited = 0;
        bytes += Number(/len=(\d+)/.exec(rest)?.[1] ?? 0);
        break;
      case 'qdisc:qdisc_enqueue':
        skbs++;
        if (s.enqueueFrom !== undefined) enq.push(t - s.enqueueFrom - s.waited);
        s.enqueueFrom = undefined;
        s.dequeueFrom = t;
        s.waited = 0;
        break;
      case 'qdisc:qdisc_dequeue':
        if (s.dequeueFrom !== undefined) deq.push(t - s.dequeueFrom - s.waited);
        s.dequeueFrom = undefined;
        s.waited = 0;
        break;
      case 'net:net_dev_start_xmit':
        s.startXmit = t;
        break;
      case 'net:net_dev_xmit':
        if (s.startXmit !== undefined) floor.push(t - s.startXmit);
        s.startXmit = undefined;
        s.dequeueFrom = t;
        s.waited = 0;
        break;
      case 'lock:contention_begin':
        s.waitFrom = t;
        break;
      case 'lock:contention_end':
        if (s.waitFrom !== undefined && (s.enqueueFrom !== undefined || s.dequeueFrom !== undefined)) {
          const w = t - s.waitFrom;
          s.waited += w;
          waitTotal += w;
          waits++;
        }
        s.waitFrom = undefined;
        break;
      case 'irq:tasklet_entry':
        s.taskletFrom = t;
        break;
      case 'irq:tasklet_exit':
        if (s.taskletFrom !== undefined) taskletBusy.set(cpu, (taskletBusy.get(cpu) ?? 0) + t - s.taskletFrom);
        s.taskletFrom = undefined;
        break;
    }
  }
  const window = Number.isFinite(last - first) && last > first ? (last - first) / 1e6 : seconds;
  const tp = percentile(floor, 50);
  const sum = (xs: number[]) => xs.reduce((a, b) => a + b, 0);
  const held = sum(enq.map((x) => Math.max(0, x - tp))) + sum(deq.map((x) => Math.max(0, x - tp)));
  const busy = sum([...taskletBusy.values()]);
  return {
    seconds: window,
    shards,
    skbPerSec: skbs / window,
    bytesPerSkb: skbs ? bytes / skbs : NaN,
    lockWaitShare: waitTotal / 1e6 / (window * availableParallelism()),
    waitsPerSec: waits / window,
    enqueueHoldUs: Math.max(0, percentile(enq, 50) - tp),
    dequeueHoldUs: Math.max(0, percentile(deq, 50) - tp),
    holdPerSkbUs: skbs ? held / skbs : NaN,
    tracepointUs: tp,
    taskletShare: busy / 1e6 / window,
    taskletUsPerSkb: skbs ? busy / (skbs * shards) : NaN,
    taskletCpus: [...taskletBusy]
      .sort((a, b) => a[0] - b[0])
      .map(([c, us]) => `cpu${c} ${((us / 1e6 / window) * 100).toFixed(0)}%`)
      .join(' '),
  };
}
