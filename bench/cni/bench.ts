/**
 * One mode's bench (bench/cni.ts): the agent under test (in its own process or in this one, on the
 * fake API server in cluster mode), the reference chain's conflist and the floor, the pods' netns,
 * one libcni call for either side, the agent's own time per call, and the cleanup.
 * The sections (rounds.ts, outside.ts, burst.ts, overhead.ts, soak.ts) drive it.
 */
import { execa, type ResultPromise } from 'execa';
import { existsSync, readFileSync } from 'node:fs';
import { mkdir, readFile, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { performance } from 'node:perf_hooks';
import { configFlags } from '../../src/daemon/config/config.js';
import { NodeWatchPodCidrSource } from '../../src/daemon/pod-cidr/node-watch.js';
import { ClusterPodLookup } from '../../src/daemon/cluster/pod-lookup.js';
import { createLogger } from '../../src/log.js';
import { AgentHarness, LIBCNI_DRIVER, libcniCallArgs, type BatchRequest, type LibcniDirs } from '../../test/kit/agent-harness.js';
import { FakeApiServer, fakeKubeConfig, node as nodeObject, pod as podObject } from '../../test/kit/fake-apiserver.js';
import { delIfbs, makeTmpDir, rmrf, uniq } from '../../test/kit/kernel.js';
import { cniArgs } from '../../test/kit/test-pod.js';
import {
  annotationsOf,
  bandwidthConfig,
  DIST_MAIN,
  Interrupted,
  linkNames,
  metricValue,
  NODE_NAME,
  POD_GET,
  RATE,
  REF_BIN_DIR,
  type AgentMode,
  type Call,
  type Mode,
  type Op,
  type Pod,
} from './common.js';
import { childPids } from './cpu.js';
import { startFloor, type BashFloor } from './floor.js';

export class CniBench {
  readonly tag = uniq(6);
  readonly refBridge = `kbr${this.tag}`;
  readonly floorBridge = `kbf${this.tag}`;
  /** The config generator's shaper makes its shared ifb at init: its own name, removed at cleanup. */
  readonly floorIfb = `kbg${this.tag}`;
  readonly h = new AgentHarness();
  refRoot = '';
  refConfDir = '';
  refCache = '';
  private harnessSetUp = false;
  /** Netns that exist now, by name. */
  readonly liveNetns = new Set<string>();
  /** Reference pods added and not yet deleted. */
  readonly liveRefPods = new Map<string, Pod>();
  /** Floor pods added and not yet deleted. */
  readonly liveFloorPods = new Map<string, Pod>();
  /** Every ifb the reference bandwidth plugin reported, so cleanup can remove what a failed DEL left. */
  readonly refIfbs = new Set<string>();
  linksBefore = new Set<string>();
  aborted = false;
  /** The agent's own process (agent mode 'process'). */
  agentProc: ResultPromise | undefined;
  /** The fake API server (cluster mode). */
  api: FakeApiServer | undefined;
  floor: BashFloor | undefined;
  private lastRefAddOut = '';
  /** The agent's histogram sums as last read, to split out each call's own time. */
  private lastSums: Record<Op, number> = { ADD: NaN, DEL: NaN };

  constructor(
    readonly mode: Mode,
    readonly pods: number,
    readonly calls: number,
    readonly agentMode: AgentMode,
  ) {}

  checkAbort(): void {
    if (this.aborted) throw new Interrupted('interrupted');
  }

  async setup(kubenetCidr: string, refCidr: string, floorCidr: string): Promise<void> {
    this.linksBefore = new Set(await linkNames());
    this.refRoot = await makeTmpDir('kbr');
    this.refConfDir = join(this.refRoot, 'conf');
    this.refCache = join(this.refRoot, 'libcni-cache');
    await mkdir(this.refConfDir, { recursive: true });
    const conflist = {
      cniVersion: '1.0.0',
      name: 'refnet',
      plugins: [
        {
          type: 'bridge',
          bridge: this.refBridge,
          isGateway: true,
          ipMasq: false,
          hairpinMode: true,
          ipam: {
            type: 'host-local',
            ranges: [[{ subnet: refCidr }]],
            routes: [{ dst: '0.0.0.0/0' }],
            dataDir: join(this.refRoot, 'ipam'),
          },
        },
        { type: 'bandwidth', capabilities: { bandwidth: true } },
      ],
    };
    await writeFile(join(this.refConfDir, '10-refnet.conflist'), JSON.stringify(conflist, null, 2) + '\n');

    this.harnessSetUp = true;
    await this.h.setup(kubenetCidr);
    if (this.mode === 'cluster') {
      this.api = await FakeApiServer.start();
      this.api.setNode(nodeObject(NODE_NAME, { podCIDR: kubenetCidr, podCIDRs: [kubenetCidr] }));
    }
    if (this.agentMode === 'in-process') await this.startAgentInProcess();
    else await this.startAgentProcess();
    this.floor = await startFloor(this.h.config, { bridge: this.floorBridge, ifb: this.floorIfb, root: this.refRoot }, floorCidr);
  }

  async startAgentInProcess(): Promise<void> {
    if (!this.api) {
      await this.h.startAgent();
      return;
    }
    const kube = { nodeName: NODE_NAME, logger: createLogger({ level: this.h.config.logLevel }), kubeConfig: fakeKubeConfig(this.api) };
    await this.h.startAgent(new NodeWatchPodCidrSource(kube), new ClusterPodLookup(kube));
    await this.waitHealthy(() => false);
  }

  /** `kubenet daemon` from dist/, every key of the harness's config as its flag; ready when /healthz is 200. */
  async startAgentProcess(): Promise<void> {
    const { podCIDR: _cidr, nodeName: _node, ...cluster } = this.h.config;
    const flags = configFlags(this.api ? cluster : this.h.config);
    if (this.api) {
      const kubeconfig = join(this.h.root, 'kubeconfig');
      await writeFile(kubeconfig, fakeKubeConfig(this.api).exportConfig());
      flags.push('--kubeconfig', kubeconfig, '--node-name', NODE_NAME);
    }
    const { NODE_OPTIONS: _drop, KBENCH_AGENT_NODE_FLAGS: nodeFlags, ...env } = process.env;
    const node = nodeFlags ? nodeFlags.split(' ').filter((f) => f !== '') : [];
    this.agentProc = execa(process.execPath, [...node, DIST_MAIN, 'daemon', ...flags], {
      env,
      extendEnv: false,
      stdio: ['ignore', 'inherit', 'inherit'],
      reject: false,
    });
    let exited = false;
    void this.agentProc.then(() => (exited = true));
    await this.waitHealthy(() => exited);
  }

  private async waitHealthy(exited: () => boolean): Promise<void> {
    for (const deadline = performance.now() + 15_000; ; ) {
      if (exited()) throw new Error(`the agent process exited during startup (exit ${(await this.agentProc)?.exitCode})`);
      const ok = await this.h.get('/healthz').then(
        (r) => r.status === 200,
        () => false,
      );
      if (ok) return;
      if (performance.now() > deadline) throw new Error('the agent was not healthy within 15 s');
      await new Promise((r) => setTimeout(r, 50));
    }
  }

  /** Resident set of the agent's process in MB. */
  async agentRssMb(): Promise<number> {
    if (this.agentMode === 'in-process') return process.memoryUsage().rss / 1e6;
    const status = await readFile(`/proc/${this.agentProc?.pid ?? 0}/status`, 'utf8').catch(() => '');
    return Number(/^VmRSS:\s+(\d+) kB/m.exec(status)?.[1] ?? NaN) / 1000;
  }

  /** RSS of the agent process's children together (the tc session, the plugin spawner), MB. */
  helpersRssMb(): number {
    const pid = this.agentProc?.pid;
    if (this.agentMode === 'in-process' || pid === undefined) return 0;
    let kb = 0;
    for (const d of childPids(pid)) {
      let status = '';
      try {
        status = readFileSync(`/proc/${d}/status`, 'utf8');
      } catch {
        continue; // gone meanwhile
      }
      kb += Number(/^VmRSS:\s+(\d+) kB/m.exec(status)?.[1] ?? 0);
    }
    return kb / 1000;
  }

  async stopAgentProcess(): Promise<void> {
    const proc = this.agentProc;
    if (!proc) return;
    this.agentProc = undefined;
    proc.kill('SIGTERM');
    const timer = setTimeout(() => proc.kill('SIGKILL'), 10_000);
    await proc;
    clearTimeout(timer);
  }

  pod(side: Pod['side'], round: number, i: number): Pod {
    const name = `${side === 'kubenet' ? 'k' : side === 'reference' ? 'r' : 'f'}${round}p${i}`;
    const netns = `kbench-${this.tag}-${name}`;
    // The trailing '-' keeps p1 and p10 apart once padded.
    const id = `${this.tag}-${name}-`.padEnd(64, '0');
    return {
      side,
      namespace: 'default',
      name,
      uid: `uid-${this.tag}-${name}`,
      id,
      netns,
      netnsPath: `/var/run/netns/${netns}`,
      ifName: 'eth0',
    };
  }

  async addNetns(pods: Pod[]): Promise<void> {
    if (pods.length === 0) return;
    for (const p of pods) this.liveNetns.add(p.netns);
    await execa('ip', ['-batch', '-'], { input: pods.map((p) => `netns add ${p.netns}`).join('\n') + '\n' });
  }

  /** Removes the netns of those of `pods` whose netns still exist. */
  async dropNetns(pods: Pod[]): Promise<void> {
    await this.delNetns(pods.map((p) => p.netns).filter((n) => this.liveNetns.has(n)));
  }

  /** Reference pods added (or, `live` false, deleted) outside add() and del(): cleanup DELs those left. */
  trackRefPods(pods: Pod[], live: boolean): void {
    for (const p of pods) {
      if (live) this.liveRefPods.set(p.id, p);
      else this.liveRefPods.delete(p.id);
    }
  }

  /** Stops the agent and starts it afresh, as after a node's boot or an agent upgrade. */
  async restartAgent(): Promise<void> {
    if (this.agentMode === 'process') {
      await this.stopAgentProcess();
      await this.startAgentProcess();
    } else {
      await this.h.stopAgent();
      await this.startAgentInProcess();
    }
  }

  async delNetns(names: string[]): Promise<void> {
    if (names.length === 0) return;
    await execa('ip', ['-force', '-batch', '-'], { input: names.map((n) => `netns del ${n}`).join('\n') + '\n', reject: false });
    for (const n of names) this.liveNetns.delete(n);
  }

  /** Cluster mode: the kubenet pods exist in the API server, annotated, and their state has gone out on the agent's watch. */
  async publishPods(pods: Pod[]): Promise<void> {
    const api = this.api;
    if (!api) return;
    const kpods = pods.filter((p) => p.side === 'kubenet');
    for (const p of kpods) api.setPod(podObject('default', p.name, NODE_NAME, annotationsOf(p.rate ?? RATE)));
    await api.waitDelivered(
      'pods',
      kpods.map((p) => `default/${p.name}`),
    );
  }

  unpublishPods(pods: Pod[]): void {
    for (const p of pods) if (p.side === 'kubenet') this.api?.deletePod('default', p.name);
  }

  /** GETs of single pods the API server has answered so far. */
  podGets(): number {
    return this.api ? this.api.requests.filter((r) => POD_GET.test(r.path)).length : 0;
  }

  /** One libcni call for either side in a driver process of its own: the call's own time (the driver's clock) and the process's wall. */
  async libcni(cmd: 'add' | 'del', p: Pod): Promise<Call> {
    if (p.side === 'floor') throw new Error('libcni: the floor side runs no libcni');
    const args = [...libcniCallArgs(this.libcniDirs(p.side), this.request(cmd, p)), '--report-time'];
    const started = performance.now();
    const r = await execa(LIBCNI_DRIVER, args, { reject: false });
    const elapsed = performance.now() - started;
    const call = /^libcni-driver: libcni call ([\d.]+) ms$/m.exec(r.stderr);
    if (!call) throw new Error(`libcni-driver ${cmd} printed no call time (exit ${r.exitCode}): ${r.stderr}`);
    const stderr = r.stderr.replace(call[0], '').trim();
    return { exitCode: r.exitCode ?? -1, stdout: r.stdout, stderr, ms: Number(call[1]), wallMs: elapsed };
  }

  /** A libcni call of `p`; the kubenet side in cluster mode gets its limits from the pod's annotations in the agent's watch, not runtimeConfig. */
  request(cmd: 'add' | 'del', p: Pod): BatchRequest {
    const withLimits = p.side !== 'kubenet' || this.mode === 'static';
    return {
      cmd,
      netns: p.netnsPath,
      containerId: p.id,
      ifName: 'eth0',
      args: cniArgs(p),
      ...(withLimits ? { runtimeConfig: bandwidthConfig(p.rate ?? RATE) } : {}),
    };
  }

  libcniDirs(side: 'kubenet' | 'reference'): LibcniDirs {
    return side === 'kubenet'
      ? {
          conf: this.h.config.cniConfDir,
          bin: [this.h.config.cniBinDir, ...this.h.config.pluginBinDirs].join(':'),
          cache: this.h.libcniCache,
        }
      : { conf: this.refConfDir, bin: REF_BIN_DIR, cache: this.refCache };
  }

  /** One ADD; ms: the libcni call's own time (the floor: its bridge exec), wallMs: the driver process's. */
  async add(p: Pod): Promise<{ ms: number; wallMs?: number }> {
    if (p.side === 'floor') {
      this.liveFloorPods.set(p.id, p);
      return { ms: await this.floor!.run('ADD', p) };
    }
    if (p.side === 'reference') this.liveRefPods.set(p.id, p);
    const r = await this.libcni('add', p);
    if (p.side === 'reference') {
      this.noteIfbs(r.stdout);
      this.lastRefAddOut = r.stdout;
    }
    if (r.exitCode !== 0) throw new Error(`${p.side} ADD ${p.name} failed (exit ${r.exitCode}): ${r.stderr || r.stdout}`);
    const result = JSON.parse(r.stdout) as { ips?: Array<{ address: string }> };
    if (!result.ips?.length) throw new Error(`${p.side} ADD ${p.name}: result has no IP: ${r.stdout}`);
    return { ms: r.ms, wallMs: r.wallMs };
  }

  /** One DEL, timed as add(). */
  async del(p: Pod): Promise<{ ms: number; wallMs?: number }> {
    if (p.side === 'floor') {
      const t = await this.floor!.run('DEL', p);
      this.liveFloorPods.delete(p.id);
      return { ms: t };
    }
    const r = await this.libcni('del', p);
    if (r.exitCode !== 0) throw new Error(`${p.side} DEL ${p.name} failed (exit ${r.exitCode}): ${r.stderr || r.stdout}`);
    if (p.side === 'reference') this.liveRefPods.delete(p.id);
    return { ms: r.ms, wallMs: r.wallMs };
  }

  /** The reference's last ADD result as libcni printed it. */
  get lastRefAdd(): string {
    return this.lastRefAddOut;
  }

  /** From now on agentCallMs() times each call against the agent's histogram sums as they are now. */
  async resetCallTimes(): Promise<void> {
    this.lastSums = await this.agentSums();
  }

  /** The agent's own time of the call just made (ms): the increase of its histogram's sum. Untimed. */
  async agentCallMs(op: Op): Promise<number> {
    const before = this.lastSums[op];
    const sums = await this.agentSums();
    this.lastSums = sums;
    return (sums[op] - before) * 1000;
  }

  async agentSums(): Promise<Record<Op, number>> {
    const text = (await this.h.get('/metrics')).body;
    return { ADD: metricValue(text, 'kubenet_cni_add_seconds_sum'), DEL: metricValue(text, 'kubenet_cni_del_seconds_sum') };
  }

  /**
   * Untimed, after kubenet DELs: the agent answers once the pod's veth is gone and the kernel
   * frees the device on a worker thread afterwards (15–40 ms, an RCU barrier). Waiting for its
   * metric to drop to 0 keeps that background work from landing on the next call, whichever side.
   */
  async settle(): Promise<void> {
    for (const deadline = performance.now() + 10_000; performance.now() < deadline; ) {
      const inFlight = metricValue((await this.h.get('/metrics')).body, 'kubenet_veth_deletions_in_flight');
      if (Number.isNaN(inFlight)) throw new Error('the agent exports no kubenet_veth_deletions_in_flight');
      if (inFlight === 0) return;
      await new Promise((r) => setTimeout(r, 2));
    }
    throw new Error('veth deletions still in flight after 10 s');
  }

  /** The bandwidth plugin lists the ifb it made (bwp…) among the result's interfaces. */
  noteIfbs(stdout: string): void {
    try {
      const res = JSON.parse(stdout) as { interfaces?: Array<{ name?: string }> };
      for (const i of res.interfaces ?? []) if (i.name?.startsWith('bwp')) this.refIfbs.add(i.name);
    } catch {
      // a failed ADD prints no result
    }
  }

  /** Removes everything, every step even after failures; returns what went wrong. */
  async cleanup(): Promise<string[]> {
    const problems: string[] = [];
    const step = async (what: string, fn: () => Promise<unknown>) => {
      try {
        await fn();
      } catch (err) {
        problems.push(`${what}: ${err instanceof Error ? err.message : String(err)}`);
      }
    };
    // Reference pods a failure left behind: DEL through libcni removes their ifb and address.
    for (const p of this.liveRefPods.values()) {
      await step(`reference DEL ${p.name}`, async () => {
        if (existsSync(p.netnsPath)) await this.libcni('del', p);
      });
    }
    for (const p of this.liveFloorPods.values()) {
      await step(`floor DEL ${p.name}`, async () => {
        if (existsSync(p.netnsPath)) await this.floor?.run('DEL', p);
      });
    }
    await step('bash floor', async () => this.floor?.close());
    await step('netns', () => this.delNetns([...this.liveNetns]));
    const links = new Set(await linkNames());
    const refLinks = [this.refBridge, this.floorBridge, ...this.refIfbs].filter((l) => links.has(l));
    await step('reference links', () =>
      refLinks.length
        ? execa('ip', ['-force', '-batch', '-'], { input: refLinks.map((l) => `link del ${l}`).join('\n') + '\n', reject: false })
        : Promise.resolve(),
    );
    // The floor's config generator made its shaper's ifb and egress shards.
    await step('floor ifbs', () => delIfbs(this.floorIfb));
    if (this.refRoot) await step('reference temp dir', () => rmrf(this.refRoot));
    await step('agent process', () => this.stopAgentProcess());
    if (this.harnessSetUp) await step('kubenet side (agent, bridge, ifb, temp dir)', () => this.h.cleanup.run());
    if (this.api) await step('fake API server', () => this.api!.stop());
    return problems;
  }

  /** Links and netns of this run still present, and any other link that appeared since the start. */
  async leftovers(): Promise<{ ours: string[]; others: string[] }> {
    const links = await linkNames();
    const mine = new Set([this.refBridge, this.floorBridge, this.floorIfb, ...this.refIfbs]);
    if (this.harnessSetUp) {
      mine.add(this.h.bridge);
      mine.add(this.h.ifb);
    }
    // An ifb's egress shards are `<ifb>.1`, `<ifb>.2`, ...
    const isMine = (l: string) => mine.has(l) || mine.has(l.replace(/\.\d+$/, ''));
    const ours = links.filter(isMine);
    const others = links.filter((l) => !isMine(l) && !this.linksBefore.has(l));
    const netns = (await execa('ip', ['netns', 'list'], { reject: false })).stdout
      .split('\n')
      .map((l) => l.split(' ')[0] ?? '')
      .filter((n) => n.startsWith(`kbench-${this.tag}-`));
    return { ours: [...ours.map((l) => `link ${l}`), ...netns.map((n) => `netns ${n}`)], others: others.map((l) => `link ${l}`) };
  }
}
