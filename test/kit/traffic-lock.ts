/**
 * The machine-wide traffic lock: several engineers (and CI jobs) share one machine, and rate
 * measurements are only meaningful when no other measurement runs at the same time. Every run
 * that sends measured traffic holds an flock(2) on TRAFFIC_LOCK:
 *
 *   flock /tmp/kubenet-cluster.lock flock /tmp/kubenet-traffic.lock npx ava test/e2e/containerd.test.ts
 *
 * and inside tests `withTrafficLock(fn)` takes it around each measurement section (`iperf()` of
 * topo.ts always does). When the lock is already held by an ancestor of this process (the `flock …
 * npx ava` form above), taking it again would wait on ourselves forever: the sections of that run's
 * test workers then serialize on INNER_LOCK instead, so two test files of one suite never measure
 * at the same time either way. Nested sections of one process run directly.
 *
 * Sections that load the CPU for long (the package e2e's npm install and tsc, the churn suites)
 * take it too: on this 2-core machine a 20M iperf3 flow of another suite dipped to 8.8 Mbit/s while
 * the package e2e ran beside it, and a starved flow measures the machine, not the shaper.
 *
 * A section also waits while another suite's local cluster is up (CLUSTER_LOCK), and keeps one from
 * coming up meanwhile: lock order is always CLUSTER_LOCK, then TRAFFIC_LOCK (so a run by hand takes
 * both, as above; one under TRAFFIC_LOCK alone does not wait for clusters: it could deadlock).
 *
 * The lock is held by an `flock(1)` child whose command waits on its stdin: releasing closes that
 * stdin, and if this process dies the pipe closes too, so a crashed test never keeps the lock.
 */
import { execa } from 'execa';
import { readFileSync, statSync } from 'node:fs';

export const TRAFFIC_LOCK = '/tmp/kubenet-traffic.lock';
/**
 * hack/cluster.sh names its network namespaces kcl-*, so one local cluster runs on the machine at a
 * time: the suites and benches that bring one up hold this lock from before `up` until after `down`.
 */
export const CLUSTER_LOCK = '/tmp/kubenet-cluster.lock';
/** Taken by the test workers of a run whose ancestor holds TRAFFIC_LOCK. */
export const INNER_LOCK = '/tmp/kubenet-traffic.inner.lock';

/** Sections this process is inside (nested ones run directly). */
let depth = 0;

/** PIDs of this process and its ancestors. */
function ancestry(): Set<number> {
  const out = new Set<number>();
  let pid = process.pid;
  while (pid > 1 && !out.has(pid)) {
    out.add(pid);
    try {
      const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
      pid = Number(stat.slice(stat.lastIndexOf(')') + 2).split(' ')[1]);
    } catch {
      break;
    }
  }
  return out;
}

/** The PIDs holding an flock on `file` now (from /proc/locks; waiters left out). */
function lockHolders(file: string): number[] {
  let ino: number;
  try {
    ino = statSync(file).ino;
  } catch {
    return [];
  }
  const out: number[] = [];
  // "1: FLOCK  ADVISORY  WRITE 1234 fe:00:56789 0 EOF" (a "->" marks waiters; skip those)
  for (const line of readFileSync('/proc/locks', 'utf8').split('\n')) {
    const f = line.trim().split(/\s+/);
    if (f[1] !== 'FLOCK') continue;
    if (Number(f[5]?.split(':')[2]) === ino) out.push(Number(f[4]));
  }
  return out;
}

/** The parent of `pid`, or 0. */
function parentOf(pid: number): number {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
    return Number(stat.slice(stat.lastIndexOf(')') + 2).split(' ')[1]);
  } catch {
    return 0;
  }
}

/** Whether this process or an ancestor holds an flock on `file` (from /proc/locks). */
export function heldByAncestor(file = TRAFFIC_LOCK): boolean {
  const mine = ancestry();
  return lockHolders(file).some((pid) => mine.has(pid));
}

/** Whether this process (through its holdLock child) or an ancestor holds `file`. */
function heldHere(file: string): boolean {
  const mine = ancestry();
  return lockHolders(file).some((pid) => mine.has(pid) || mine.has(parentOf(pid)));
}

/**
 * Runs `fn` while holding the traffic lock (waiting for it up to `waitMs`; `onWait` is told once
 * when another holder makes us wait).
 */
export async function withTrafficLock<T>(fn: () => Promise<T>, opts: { waitMs?: number; onWait?: () => void } = {}): Promise<T> {
  if (depth > 0) return fn();
  depth++;
  try {
    // Not beside another suite's local cluster either: an idle control plane and kubelet still take
    // a share of both cores in bursts (a 20M flow of the containerd suite dipped to 14.4 Mbit/s for
    // a second while the cluster suite's cluster was up between its sections). A suite that runs the
    // cluster itself measures on it, so it is not kept waiting for its own.
    // An ancestor that took TRAFFIC_LOCK without CLUSTER_LOCK (`flock traffic npx ava FILE`) made
    // taking CLUSTER_LOCK now an inversion of the lock order: a suite holding the cluster and
    // waiting for traffic would wait on us while we wait on it. Then only the traffic lock counts.
    const inverted = heldByAncestor(TRAFFIC_LOCK);
    const quiet =
      heldHere(CLUSTER_LOCK) || inverted
        ? undefined
        : await holdLock(CLUSTER_LOCK, { waitMs: 45 * 60_000, ...(opts.onWait ? { onWait: opts.onWait } : {}) });
    try {
      return await locked(heldByAncestor() ? INNER_LOCK : TRAFFIC_LOCK, fn, opts);
    } finally {
      await quiet?.();
    }
  } finally {
    depth--;
  }
}

async function locked<T>(file: string, fn: () => Promise<T>, opts: { waitMs?: number; onWait?: () => void }): Promise<T> {
  const release = await holdLock(file, opts);
  try {
    return await fn();
  } finally {
    await release();
  }
}

/**
 * Takes an exclusive flock on `file` (waiting up to `waitMs`, telling `onWait` once when someone
 * else holds it) and returns its release. The lock is held by an `flock(1)` child that waits on its
 * stdin, so it goes when this process dies.
 */
export async function holdLock(file: string, opts: { waitMs?: number; onWait?: () => void } = {}): Promise<() => Promise<void>> {
  const holder = execa(
    'flock',
    ['--exclusive', '--timeout', String(Math.ceil((opts.waitMs ?? 600_000) / 1000)), file, 'sh', '-c', 'echo locked; exec cat >/dev/null'],
    {
      reject: false,
      stdin: 'pipe',
    },
  );
  const release = async () => {
    holder.stdin?.end();
    const done = await Promise.race([holder.then(() => true), new Promise<boolean>((r) => setTimeout(() => r(false), 2000))]);
    if (!done) {
      holder.kill('SIGKILL');
      await holder;
    }
  };
  const locked = await new Promise<boolean>((resolve) => {
    const waitTimer = setTimeout(() => opts.onWait?.(), 500);
    holder.stdout?.on('data', (d: Buffer) => {
      if (d.toString().includes('locked')) {
        clearTimeout(waitTimer);
        resolve(true);
      }
    });
    void holder.then(() => {
      clearTimeout(waitTimer);
      resolve(false);
    });
  });
  if (!locked) {
    const r = await holder;
    throw new Error(`could not take the lock ${file} (flock exit ${r.exitCode}): ${String(r.stderr)}`);
  }
  return release;
}
