/**
 * Pod churn through libcni against the node agent in a node sandbox, as a container runtime drives
 * it: many ADD/DEL cycles, several at a time, some pods shaped, some with host ports, DEL twice
 * (containerd's Stop then Remove, the second with an empty CNI_NETNS), and optionally SIGKILLs of
 * the agent at random moments and while an ADD is in flight, each followed by a restart with the
 * same config. Shared by test/e2e/churn.test.ts and bench/churn.ts.
 *
 * The runtime model (containerd 1.6 + kubelet):
 * - a failed ADD is followed by a DEL of the same attachment (containerd tears the sandbox's network
 *   down), then ADD again: with a new sandbox (new container ID, new netns; the old netns is removed),
 *   or with the same ID and netns (a runtime that retries the call itself);
 * - a failed DEL is retried until it succeeds;
 * - a pod is "up" from its ADD's success until its first DEL is sent: no address may be handed to
 *   a pod while another pod that is up holds it.
 * Failures the agent's death explains are expected around kills: CNI code 11 "try again later" (the
 * forwarder finds no agent, or the restarting agent does not know the pod CIDR yet) and a call cut
 * mid-way (the connection closed without an answer). Any other failure is counted as unexpected,
 * with its message.
 *
 * A kill "lands mid-ADD" when, once the agent is dead, the agent's pod records hold one in phase
 * `adding` (written before the plugins run, replaced once the ADD is complete). Kills alternate
 * between "aimed at an ADD" (watch the records directory for a record in phase adding, then
 * SIGKILL within 0-60 ms; at once for the last aimed kill while none has landed) and "any moment";
 * up to 3 extra aimed kills follow while none has landed and cycles remain.
 */
import { execa } from 'execa';
import { randomBytes, randomInt, randomUUID } from 'node:crypto';
import { readFileSync, readlinkSync, watch } from 'node:fs';
import { readdir, readFile, stat } from 'node:fs/promises';
import { basename, join } from 'node:path';
import { performance } from 'node:perf_hooks';
import type { AgentProcess } from './agent-process.js';
import { delNetns } from './kernel.js';
import { podLeftovers, type NodeLayout, type PodLeftovers } from './node-leaks.js';
import type { NodeSandbox } from './node-sandbox.js';
import {
  agentDiedMidCall,
  CNI_TRY_AGAIN_LATER,
  cniErrorCode,
  inCidr4,
  resultIp,
  type LibcniCall,
  type SandboxLibcni,
} from './sandbox-libcni.js';
import type { TestPod } from './test-pod.js';

export interface ChurnNode {
  sb: NodeSandbox;
  agent: AgentProcess;
  libcni: SandboxLibcni;
  podCidr: string;
  /** The agent's stateDir (pod records under pods/), as the sandbox sees it. */
  stateDir: string;
}

export interface ChurnOptions {
  cycles: number;
  /** Pods in flight at once. Default 8. */
  concurrency?: number;
  /** SIGKILLs of the agent, spread over the run. Default 0. */
  kills?: number;
  /** Prefix of the pods' netns names (keep it unique: `kch<random>`). */
  netnsPrefix: string;
  /** CHECK every n-th pod once it is up (0: never). Default 4. */
  checkEvery?: number;
  /** Verify each ADD's address on the pod's eth0 (one `ip` exec per ADD). Default true. */
  verifyEth0?: boolean;
  /** Called after every `every` finished cycles. */
  progress?: { every: number; fn: (done: number) => void | Promise<void> };
  log?: (msg: string) => void;
}

export interface KillReport {
  atMs: number;
  aimedAtAdd: boolean;
  /** Records in phase adding once the agent was dead. */
  addingRecords: number;
  /** Reference plugins the dead agent had started that were still running right after the kill. */
  pluginsAlive: number;
  /** Calls of the test that failed with the connection cut by this kill. */
  callsCut: { add: number; del: number; check: number };
  restartMs: number;
}

export interface ChurnReport {
  cycles: number;
  durationMs: number;
  kills: KillReport[];
  killsMidAdd: number;
  addCalls: number;
  delCalls: number;
  checkCalls: number;
  /** ADDs that failed and were retried (DEL, then ADD again), by new or same container ID. */
  addRetries: { newId: number; sameId: number };
  /** DEL calls repeated after a failure. */
  delRetries: number;
  checkRetries: number;
  /**
   * Failures explained by the agent's death: CNI code 11 "try again later" (the agent is down, or
   * restarting and not ready yet), or the connection cut mid-call.
   */
  failuresTryAgainLater: number;
  failuresCut: number;
  /** Any other failure (message, trimmed). Must be empty. */
  unexpected: string[];
  /**
   * Same-ID ADD retries that failed on an eth0 in the pod's netns right after this pod's ADD was cut
   * by a kill: a bridge plugin the killed agent started made it after the restart (the known
   * limitation of plugins exec'd as detached children of the agent). Printed, not failed.
   */
  outlivedPlugins: string[];
  /** An address handed to a pod while another pod that is up held it. Must be empty. */
  duplicates: string[];
  /** ADDs whose address was outside the pod CIDR or not on the pod's eth0. Must be empty. */
  badAddresses: string[];
  /** Latencies of successful calls, ms (libcni driver exec'd in the node: the runtime's view). */
  addMs: number[];
  delMs: number[];
  maxPodsUp: number;
}

const DEL_DEADLINE_MS = 90_000;
const MAX_ADD_ATTEMPTS = 8;
/**
 * A same-ID retry's ADD failing on an eth0 in the pod's netns (see `outlivedPlugins`): found by the
 * agent before its plugins ran, or made by the dead agent's bridge plugin while the retry's ran.
 */
const OUTLIVED_PLUGIN = /already has an interface eth0 that kubenet did not make|container veth name provided \(eth0\) already exists/;
const PLUGIN_NAMES = new Set(['bridge', 'host-local', 'portmap', 'loopback']);
/** containerd passes this burst when the pod sets none. */
const UNSET_BURST = 4294967295;

type Failure = 'later' | 'cut' | 'other';

function classify(r: LibcniCall): Failure {
  if (agentDiedMidCall(r)) return 'cut';
  if (cniErrorCode(r) === CNI_TRY_AGAIN_LATER) return 'later';
  return 'other';
}

function trimMsg(r: LibcniCall): string {
  return (r.stderr || r.stdout).replace(/\s+/g, ' ').trim().slice(0, 300);
}

const sleep = (ms: number) => new Promise<void>((r) => setTimeout(r, ms));

/** The pod's runtimeConfig as containerd 1.6 passes it (PascalCase), varied by cycle number. */
export function podRuntimeConfig(n: number): {
  shaped: boolean;
  hostPort: number | undefined;
  runtimeConfig: Record<string, unknown> | undefined;
} {
  const shaped = n % 3 === 0;
  const hostPort = n % 5 === 0 ? 20000 + (n % 20000) : undefined;
  const rc: Record<string, unknown> = {};
  if (shaped) {
    const rate = (1 + (n % 50)) * 1_000_000;
    // Half of the shaped pods with "no burst given" (4294967295), half with explicit bursts (bits).
    rc.bandwidth =
      n % 2 === 0
        ? { IngressRate: rate, IngressBurst: UNSET_BURST, EgressRate: rate / 2, EgressBurst: UNSET_BURST }
        : { IngressRate: rate, IngressBurst: 800_000, EgressRate: rate / 2, EgressBurst: 400_000 };
  }
  if (hostPort !== undefined) rc.portMappings = [{ HostPort: hostPort, ContainerPort: 8080, Protocol: 'tcp', HostIP: '' }];
  return { shaped, hostPort, runtimeConfig: Object.keys(rc).length > 0 ? rc : undefined };
}

export class Churn {
  private readonly report: ChurnReport = {
    cycles: 0,
    durationMs: 0,
    kills: [],
    killsMidAdd: 0,
    addCalls: 0,
    delCalls: 0,
    checkCalls: 0,
    addRetries: { newId: 0, sameId: 0 },
    delRetries: 0,
    checkRetries: 0,
    failuresTryAgainLater: 0,
    failuresCut: 0,
    unexpected: [],
    outlivedPlugins: [],
    duplicates: [],
    badAddresses: [],
    addMs: [],
    delMs: [],
    maxPodsUp: 0,
  };
  /** Address → container ID of the pod that is up with it. */
  private readonly up = new Map<string, string>();
  /** Every netns made and not yet removed (removed at the end whatever happened). */
  private readonly netnsLive = new Set<string>();
  private next = 0;
  private done = 0;
  private stopping = false;
  /** The current kill's cut-call counters (undefined between kills). */
  private cut: KillReport['callsCut'] | undefined;

  constructor(
    private readonly node: ChurnNode,
    private readonly opts: ChurnOptions,
  ) {}

  private log(msg: string): void {
    this.opts.log?.(msg);
  }

  async run(): Promise<ChurnReport> {
    const t0 = performance.now();
    const workers = Array.from({ length: this.opts.concurrency ?? 8 }, () => this.worker());
    const killer = this.killer(t0);
    try {
      const results = await Promise.allSettled([...workers, killer]);
      const failed = results.find((r): r is PromiseRejectedResult => r.status === 'rejected');
      if (failed) throw failed.reason;
    } finally {
      this.stopping = true;
      await Promise.allSettled([...workers, killer]);
      for (const ns of this.netnsLive) await delNetns(ns);
      this.netnsLive.clear();
    }
    this.report.cycles = this.done;
    this.report.durationMs = performance.now() - t0;
    return this.report;
  }

  private async worker(): Promise<void> {
    while (!this.stopping) {
      const n = this.next++;
      if (n >= this.opts.cycles) return;
      try {
        await this.cycle(n);
      } catch (err) {
        this.stopping = true;
        throw err;
      }
      this.done++;
      const p = this.opts.progress;
      if (p && this.done % p.every === 0) await p.fn(this.done);
    }
  }

  private async newPod(n: number, attempt: number): Promise<TestPod> {
    const netns = `${this.opts.netnsPrefix}-${n}-${attempt}`;
    await execa('ip', ['netns', 'add', netns]);
    this.netnsLive.add(netns);
    return {
      namespace: 'churn',
      name: `pod-${n}`,
      uid: randomUUID(),
      id: randomBytes(32).toString('hex'),
      netns,
      netnsPath: `/var/run/netns/${netns}`,
      ifName: 'eth0',
    };
  }

  private async removeNetns(pod: TestPod): Promise<void> {
    await execa('ip', ['netns', 'del', pod.netns]);
    this.netnsLive.delete(pod.netns);
  }

  private noteFailure(cmd: 'add' | 'del' | 'check', pod: TestPod, r: LibcniCall): Failure {
    const kind = classify(r);
    if (kind === 'later') this.report.failuresTryAgainLater++;
    else if (kind === 'cut') {
      this.report.failuresCut++;
      if (this.cut) this.cut[cmd]++;
    } else this.report.unexpected.push(`${cmd.toUpperCase()} ${pod.name} ${pod.id.slice(0, 12)}: ${trimMsg(r)}`);
    return kind;
  }

  /** DEL until it succeeds (the runtime's retry), with a short backoff. */
  private async delUntilDone(pod: TestPod, netns: string, runtimeConfig: object | undefined): Promise<void> {
    const deadline = Date.now() + DEL_DEADLINE_MS;
    for (let attempt = 0; ; attempt++) {
      if (attempt > 0) this.report.delRetries++;
      this.report.delCalls++;
      const r = await this.node.libcni.call('del', pod, { netns, ...(runtimeConfig ? { runtimeConfig } : {}) });
      if (r.exitCode === 0) {
        this.report.delMs.push(r.ms);
        return;
      }
      this.noteFailure('del', pod, r);
      if (Date.now() > deadline) throw new Error(`DEL ${pod.name} (${pod.id}) still failing after ${DEL_DEADLINE_MS} ms: ${trimMsg(r)}`);
      await sleep(Math.min(50 * 2 ** Math.min(attempt, 4), 500));
    }
  }

  private async cycle(n: number): Promise<void> {
    const { runtimeConfig } = podRuntimeConfig(n);
    const rcOpt = runtimeConfig ? { runtimeConfig } : {};
    let pod = await this.newPod(n, 0);
    let ip: string | undefined;
    let cut = false;
    for (let attempt = 0; ; attempt++) {
      this.report.addCalls++;
      const r = await this.node.libcni.call('add', pod, rcOpt);
      if (r.exitCode === 0) {
        ip = resultIp(r.stdout);
        this.report.addMs.push(r.ms);
        break;
      }
      if (cut && OUTLIVED_PLUGIN.test(r.stderr)) {
        // The known limitation: the killed agent's bridge plugin made eth0 after the next agent's
        // startup reconcile and the runtime's DEL (which never enters the netns), or meanwhile.
        this.report.outlivedPlugins.push(`${pod.name} ${pod.id.slice(0, 12)}: ${trimMsg(r)}`);
      } else {
        cut = this.noteFailure('add', pod, r) === 'cut';
      }
      if (attempt + 1 >= MAX_ADD_ATTEMPTS) throw new Error(`ADD ${pod.name} failed ${MAX_ADD_ATTEMPTS} times; last: ${trimMsg(r)}`);
      // containerd: the failed sandbox's network is torn down (DEL until it succeeds).
      await this.delUntilDone(pod, pod.netnsPath, runtimeConfig);
      if (OUTLIVED_PLUGIN.test(r.stderr)) {
        // Only a new sandbox gets past an interface in the netns; the old netns goes, and its eth0 with it.
        this.report.addRetries.newId++;
        await this.removeNetns(pod);
        pod = await this.newPod(n, attempt + 1);
      } else if (attempt % 2 === 1 || randomInt(3) === 0) {
        // A runtime retrying the call itself: the same container ID and netns.
        this.report.addRetries.sameId++;
      } else {
        // kubelet: a new sandbox (new ID, new netns); the old netns goes.
        this.report.addRetries.newId++;
        await this.removeNetns(pod);
        pod = await this.newPod(n, attempt + 1);
      }
      await sleep(randomInt(20, 200));
    }
    if (ip === undefined || !inCidr4(ip, this.node.podCidr))
      this.report.badAddresses.push(`${pod.name}: ADD returned ${ip ?? 'no IP'}, not in ${this.node.podCidr}`);
    if (ip !== undefined) {
      const holder = this.up.get(ip);
      if (holder !== undefined)
        this.report.duplicates.push(`${ip}: handed to ${pod.id.slice(0, 12)} (${pod.name}) while ${holder.slice(0, 12)} is up with it`);
      this.up.set(ip, pod.id);
      this.report.maxPodsUp = Math.max(this.report.maxPodsUp, this.up.size);
      if (this.opts.verifyEth0 ?? true) {
        const addr = (await execa('ip', ['-n', pod.netns, '-o', '-4', 'addr', 'show', 'dev', 'eth0'], { reject: false })).stdout;
        if (!addr.includes(` ${ip}/`))
          this.report.badAddresses.push(`${pod.name}: ${ip} not on eth0 in ${pod.netns}: ${addr.trim() || '(no eth0)'}`);
      }
    }

    const checkEvery = this.opts.checkEvery ?? 4;
    if (checkEvery > 0 && n % checkEvery === 1) {
      for (let attempt = 0; ; attempt++) {
        this.report.checkCalls++;
        const r = await this.node.libcni.call('check', pod, rcOpt);
        if (r.exitCode === 0) break;
        // A CHECK cut by a kill is asked again once the agent is back; any other failure is reported.
        if (this.noteFailure('check', pod, r) === 'other' || attempt >= 40) break;
        this.report.checkRetries++;
        await sleep(100);
      }
    }
    await sleep(randomInt(0, 20));

    // Stop: the pod is no longer up once its first DEL is sent; then its netns goes; then Remove.
    if (ip !== undefined && this.up.get(ip) === pod.id) this.up.delete(ip);
    await this.delUntilDone(pod, pod.netnsPath, runtimeConfig);
    await this.removeNetns(pod);
    await this.delUntilDone(pod, '', runtimeConfig);
  }

  /** Agent records in phase `adding` right now. */
  private async addingRecords(): Promise<number> {
    const dir = this.node.sb.hostPath(join(this.node.stateDir, 'pods'));
    let count = 0;
    for (const f of await readdir(dir).catch(() => [] as string[])) {
      if (!f.endsWith('.json')) continue;
      const text = await readFile(join(dir, f), 'utf8').catch(() => '');
      if (text.includes('"phase":"adding"')) count++;
    }
    return count;
  }

  /**
   * Resolves true as soon as the agent writes a record in phase `adding` (an ADD whose plugins are
   * about to run), false after `timeoutMs`. Watches the records directory (inotify): a poll that
   * reads every record takes a few ms under load, and an ADD's plugins only ~15 ms.
   */
  private addStarted(timeoutMs: number): Promise<boolean> {
    const dir = this.node.sb.hostPath(join(this.node.stateDir, 'pods'));
    return new Promise((resolve) => {
      let done = false;
      let watcher: ReturnType<typeof watch> | undefined;
      const finish = (v: boolean) => {
        if (done) return;
        done = true;
        clearTimeout(timer);
        watcher?.close();
        resolve(v);
      };
      const timer = setTimeout(() => finish(false), timeoutMs);
      try {
        watcher = watch(dir, (_event, name) => {
          if (done || !name?.endsWith('.json')) return;
          try {
            if (readFileSync(join(dir, name), 'utf8').includes('"phase":"adding"')) finish(true);
          } catch {
            // removed meanwhile
          }
        });
        watcher.on('error', () => finish(false));
      } catch {
        finish(false); // no records directory yet
      }
    });
  }

  /** Reference CNI plugins running in the node now (after a kill: started by the dead agent). */
  private runningPlugins(): number {
    return this.node.sb.processes().filter((pid) => {
      try {
        return PLUGIN_NAMES.has(basename(readlinkSync(`/proc/${pid}/exe`)));
      } catch {
        return false;
      }
    }).length;
  }

  private async killer(t0: number): Promise<void> {
    const kills = this.opts.kills ?? 0;
    // Up to 3 kills beyond the planned ones while none has landed mid-ADD yet: an ADD's plugins take
    // ~15 ms, so an aimed kill can still come just after the ADD it saw; the run must see one.
    const EXTRA = 3;
    for (let k = 0; k < kills || (kills > 0 && k < kills + EXTRA && this.report.killsMidAdd === 0); k++) {
      const extra = k >= kills;
      // Spread the kills over the run: kill k once cycle (k+1)/(kills+1) of the way has started.
      const at = extra ? 0 : Math.floor(((k + 1) * this.opts.cycles) / (kills + 1));
      while (!this.stopping && this.next < at) await sleep(20);
      if (this.stopping) return;
      const aimedAtAdd = extra || k % 2 === 0;
      if (aimedAtAdd) {
        // Wait for an ADD to write its record (plugins about to run), for up to 10 s; then 0-60 ms
        // more, so the kill lands at any stage: before, in or after the plugins.
        if (extra && this.next >= this.opts.cycles) return; // no ADD will come any more
        await this.addStarted(10_000);
        // The last aimed kill with none landed mid-ADD yet, and any extra one, kill at once.
        const lastAimed = k + 2 >= kills;
        if (!(lastAimed && this.report.killsMidAdd === 0)) await sleep(randomInt(0, 60));
      } else {
        await sleep(randomInt(0, 300));
      }
      if (this.stopping) return;
      const report: KillReport = {
        atMs: performance.now() - t0,
        aimedAtAdd,
        addingRecords: 0,
        pluginsAlive: 0,
        callsCut: { add: 0, del: 0, check: 0 },
        restartMs: 0,
      };
      this.cut = report.callsCut;
      await this.node.agent.kill();
      report.pluginsAlive = this.runningPlugins();
      report.addingRecords = await this.addingRecords();
      if (report.addingRecords > 0) this.report.killsMidAdd++;
      // Down for a moment: the runtime's calls fail as "unreachable" and are retried.
      await sleep(randomInt(50, 300));
      const restart = performance.now();
      await this.node.agent.start();
      report.restartMs = performance.now() - restart;
      // Calls cut by this kill have all returned by now (the connection broke at the kill).
      this.cut = undefined;
      this.report.kills.push(report);
      this.log(
        `kill ${k + 1}/${kills}${extra ? ' (extra: none had landed mid-ADD)' : ''} at ${(report.atMs / 1000).toFixed(1)} s (${aimedAtAdd ? 'aimed at an ADD in flight' : 'any moment'}): ` +
          `${report.addingRecords} ADD(s) in flight, ${report.pluginsAlive} plugin(s) still running, calls cut ${JSON.stringify(report.callsCut)}, restarted in ${report.restartMs.toFixed(0)} ms`,
      );
    }
  }
}

export { percentile } from './bench-kit.js';

/** The agent's resident set size, kB (from /proc/<pid>/status), or undefined. */
export async function rssKb(pid: number | undefined): Promise<number | undefined> {
  if (!pid) return undefined;
  const text = await readFile(`/proc/${pid}/status`, 'utf8').catch(() => '');
  const m = /^VmRSS:\s+(\d+) kB/m.exec(text);
  return m?.[1] ? Number(m[1]) : undefined;
}

/** Log lines (pino JSON) of `file` from byte `from` whose msg matches, parsed. */
export async function logEntries(file: string, from: number, msg: RegExp): Promise<Array<Record<string, unknown>>> {
  const text = (await readFile(file).catch(() => Buffer.alloc(0))).subarray(from).toString('utf8');
  const out: Array<Record<string, unknown>> = [];
  for (const line of text.split('\n')) {
    if (!line.startsWith('{')) continue;
    try {
      const e = JSON.parse(line) as Record<string, unknown>;
      if (typeof e.msg === 'string' && msg.test(e.msg)) out.push(e);
    } catch {
      // a line cut by a SIGKILL
    }
  }
  return out;
}

/** The size of a file (0 when missing): a log offset. */
export async function fileSize(file: string): Promise<number> {
  return (await stat(file).catch(() => ({ size: 0 }))).size;
}

export const SWEEP_MSG = /^removed leftovers of attachments that no longer exist$/;

export interface SweepCounts {
  reservations: number;
  veths: number;
  hostPorts: number;
  shaping: number;
}

/** The counts of the agent's sweep log entries, summed. */
export function sumSweeps(entries: Array<Record<string, unknown>>): SweepCounts {
  const s = { reservations: 0, veths: 0, hostPorts: 0, shaping: 0 };
  for (const e of entries) for (const k of Object.keys(s) as Array<keyof SweepCounts>) s[k] += Number(e[k] ?? 0);
  return s;
}

/**
 * What is left right after a churn, then what a final agent restart (SIGTERM, start with the same
 * config) swept at startup, and what is left after it.
 */
export async function leftoversAcrossRestart(
  sb: NodeSandbox,
  agent: AgentProcess,
  layout: NodeLayout,
): Promise<{ afterChurn: PodLeftovers; exitCode: number | undefined; finalSweep: SweepCounts; final: PodLeftovers }> {
  const afterChurn = await podLeftovers(sb, layout);
  const from = await fileSize(agent.logFile);
  const exitCode = await agent.stop(10_000);
  await agent.start();
  const finalSweep = sumSweeps(await logEntries(agent.logFile, from, SWEEP_MSG));
  return { afterChurn, exitCode, finalSweep, final: await podLeftovers(sb, layout) };
}
