/**
 * A local real cluster (hack/cluster.sh) as the e2e suites drive it: its own KCL_DIR and API port,
 * kubectl against it, commands in a node's namespaces, and the pause process (the netns) of a pod.
 */
import { execa } from 'execa';
import { randomInt } from 'node:crypto';
import { existsSync, readdirSync, readFileSync, statSync } from 'node:fs';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { kernelTestBlocker, uniq } from './kernel.js';
import { CLUSTER_LOCK, heldByAncestor, holdLock, withTrafficLock } from './traffic-lock.js';
import { upstreamBlocker, upstreamDir } from './upstream.js';
import { AGENT_IMAGE_TAR } from './containerd.js';

const ROOT = fileURLToPath(new URL('../../', import.meta.url));
export const CLUSTER_SH = join(ROOT, 'hack/cluster.sh');
export const MANIFEST = join(ROOT, 'manifests/kubenet.yaml');
const KUBECTL = join(upstreamDir('kubernetes'), 'kubectl');
const HELM = join(upstreamDir('helm'), 'helm');
export const CHART = join(ROOT, 'manifests/chart');

/** Why a cluster cannot come up here (a missing part), or undefined. */
export function clusterBlocker(): string | undefined {
  return (
    kernelTestBlocker() ??
    upstreamBlocker('kubernetes', ['kube-apiserver', 'kube-controller-manager', 'kube-scheduler', 'kubelet', 'kube-proxy', 'kubectl']) ??
    upstreamBlocker('etcd', ['etcd']) ??
    upstreamBlocker('containerd', ['containerd', 'ctr', 'containerd-shim-runc-v2']) ??
    // hack/cluster.sh up packs the add-ons' images (CoreDNS, Prometheus) from these.
    upstreamBlocker('coredns', ['coredns']) ??
    upstreamBlocker('prometheus', ['prometheus']) ??
    (existsSync(AGENT_IMAGE_TAR) ? undefined : `needs ${AGENT_IMAGE_TAR} (bash hack/build-image.sh; npm test builds it)`)
  );
}

/** An instant vector as Prometheus's query API answers it. */
export interface PromVector {
  resultType: string;
  result: Array<{ metric: Record<string, string>; value: [number, string] }>;
}

export interface PodList {
  items: Array<{
    metadata: { name: string; annotations?: Record<string, string> };
    spec?: { nodeName?: string };
    status: { podIP?: string; podIPs?: Array<{ ip: string }>; phase?: string };
  }>;
}

export class LocalCluster {
  readonly dir = `/tmp/kcl-e2e-${uniq(6)}`;
  readonly env = { KCL_DIR: this.dir, KCL_API_PORT: String(randomInt(20000, 30000)) };
  private release: (() => Promise<void>) | undefined;

  /**
   * Takes the cluster lock (waiting while another suite's cluster is up), then brings this one up
   * under the traffic lock (a control plane starting loads both cores). Never call it inside a
   * traffic-lock section: the suite holding the cluster lock needs the traffic lock to finish.
   */
  async up(args: string[] = [], onWait?: () => void) {
    // A run under `flock cluster.lock ...` (docs/testing.md, "The kernel, and the locks") already holds it: taking it again would wait on ourselves.
    this.release ??= heldByAncestor(CLUSTER_LOCK)
      ? () => Promise.resolve()
      : await holdLock(CLUSTER_LOCK, { waitMs: 45 * 60_000, ...(onWait ? { onWait } : {}) });
    return withTrafficLock(() => execa('bash', [CLUSTER_SH, 'up', ...args], { env: this.env, reject: false, all: true }));
  }

  /** Takes the cluster down and releases the cluster lock. */
  async down() {
    try {
      return await execa('bash', [CLUSTER_SH, 'down'], { env: this.env, reject: false, all: true });
    } finally {
      await this.release?.();
      this.release = undefined;
    }
  }

  restart(service: string, node = 1) {
    return execa('bash', [CLUSTER_SH, 'restart', service, String(node)], { env: this.env });
  }

  /** Stops a part of node `node` (the control plane's run on node 1) until start(). */
  stop(part: string, node = 1) {
    return execa('bash', [CLUSTER_SH, 'stop', part, String(node)], { env: this.env });
  }

  start(part: string, node = 1) {
    return execa('bash', [CLUSTER_SH, 'start', part, String(node)], { env: this.env });
  }

  /**
   * Tries `write` (a kubectl call that writes) every 100 ms until it succeeds, for at most `limitMs`:
   * when the API server accepts writes again. Returns when the successful attempt began.
   */
  async firstWrite(write: () => Promise<unknown>, limitMs = 120_000): Promise<number> {
    for (const end = Date.now() + limitMs; ; ) {
      const began = Date.now();
      try {
        await write();
        return began;
      } catch (err) {
        if (Date.now() > end) throw err;
        await new Promise((r) => setTimeout(r, 100));
      }
    }
  }

  kubectl(args: string[], opts: { input?: string; reject?: boolean } = {}) {
    return execa(KUBECTL, ['--kubeconfig', join(this.dir, 'kubeconfig'), ...args], {
      reject: opts.reject ?? true,
      ...(opts.input !== undefined ? { input: opts.input } : {}),
    });
  }

  /** The pinned Helm against this cluster (its cache and config under the cluster's dir). */
  helm(args: string[], opts: { reject?: boolean } = {}) {
    const env = {
      HELM_CACHE_HOME: join(this.dir, 'helm/cache'),
      HELM_CONFIG_HOME: join(this.dir, 'helm/config'),
      HELM_DATA_HOME: join(this.dir, 'helm/data'),
    };
    return execa(HELM, ['--kubeconfig', join(this.dir, 'kubeconfig'), ...args], { reject: opts.reject ?? true, env, all: true });
  }

  /** A PromQL query to the Prometheus of manifests/monitoring/prometheus.yaml, through the API server's service proxy. */
  async promQuery<T = PromVector>(query: string, time?: number): Promise<T> {
    const q = new URLSearchParams({ query, ...(time !== undefined ? { time: (time / 1000).toFixed(3) } : {}) });
    const r = JSON.parse(
      (await this.kubectl(['get', '--raw', `/api/v1/namespaces/kubenet-monitoring/services/prometheus:9090/proxy/api/v1/query?${q}`]))
        .stdout,
    ) as { status: string; data: T; error?: string };
    if (r.status !== 'success') throw new Error(`PromQL ${query}: ${r.error ?? r.status}`);
    return r.data;
  }

  async json<T>(args: string[]): Promise<T> {
    return JSON.parse((await this.kubectl([...args, '-o', 'json'])).stdout) as T;
  }

  /** A command in node `node`'s namespaces (its netns and private mounts). */
  inNode(node: number, cmd: string, args: string[], reject = true, opts: InNodeOptions = {}) {
    return inKclNode(this.dir, node, cmd, args, reject, opts);
  }
}

export interface InNodeOptions {
  env?: Record<string, string>;
  input?: string;
}

/** The pid that holds node `node`'s namespaces, of the cluster hack/cluster.sh keeps in `dir` (its KCL_DIR). */
export function kclNodeHolder(dir: string, node = 1): string {
  return readFileSync(join(dir, `n${node}/holder.pid`), 'utf8').trim();
}

/**
 * A command in node `node`'s namespaces (its netns and private mounts) of the cluster in `dir`
 * (its KCL_DIR): for a LocalCluster, and for the benches that bring up a cluster of their own.
 */
export function inKclNode(dir: string, node: number, cmd: string, args: string[], reject = true, opts: InNodeOptions = {}) {
  return execa('nsenter', ['-t', kclNodeHolder(dir, node), '-m', '-n', cmd, ...args], {
    reject,
    ...(opts.env ? { env: opts.env } : {}),
    ...(opts.input !== undefined ? { input: opts.input } : {}),
  });
}

/** A host on the cluster's LAN (netns kcl-lan, the nodes' gateway address), outside the cluster range: an iperf3 endpoint. */
export const LAN_HOST = { netns: 'kcl-lan', ip4: '198.18.252.1' } as const;

/** The address of node `node` on the LAN. */
export const nodeLanIp = (node: number) => `198.18.252.${10 + node}`;

/**
 * Routes `cidrs` (pod CIDRs) from the LAN host via the nodes that hold them, so the LAN host reaches
 * pods directly (traffic from outside the cluster); returns the undo.
 */
export async function lanRoutes(routes: Array<{ cidr: string; node: number }>): Promise<() => Promise<void>> {
  for (const r of routes) await execa('ip', ['-n', LAN_HOST.netns, 'route', 'replace', r.cidr, 'via', nodeLanIp(r.node)]);
  return async () => {
    for (const r of routes) await execa('ip', ['-n', LAN_HOST.netns, 'route', 'del', r.cidr], { reject: false });
  };
}

/** The pid of the pause process of the pod with IPv4 address `ip` (its netns is the pod's). */
export function pausePidOf(ip: string): string | undefined {
  return readdirSync('/proc').find((p) => {
    try {
      return (
        /^\d+$/.test(p) &&
        readFileSync(`/proc/${p}/cmdline`, 'utf8') === '/pause\0' &&
        readFileSync(`/proc/${p}/net/fib_trie`, 'utf8').includes(` ${ip}\n`)
      );
    } catch {
      return false;
    }
  });
}

/** A pod of the locally built pause image, with annotations, optionally pinned to a node. */
export function pausePod(name: string, annotations: Record<string, string> = {}, nodeName?: string): Record<string, unknown> {
  return {
    apiVersion: 'v1',
    kind: 'Pod',
    metadata: { name, namespace: 'default', annotations },
    spec: {
      ...(nodeName ? { nodeName } : {}),
      containers: [{ name: 'pause', image: 'kubenet-ts.local/sandbox:1', imagePullPolicy: 'Never' }],
      terminationGracePeriodSeconds: 1,
    },
  };
}

/** `ip route show proto 98` of node i's netns (kcl-n<i>), both families, as "dst via gw dev D", sorted. */
export async function kclRoutes(i: number): Promise<string[]> {
  const out: string[] = [];
  for (const f of ['-4', '-6']) {
    const { stdout } = await execa('ip', ['-n', `kcl-n${i}`, f, '-j', 'route', 'show', 'proto', '98']);
    for (const r of JSON.parse(stdout || '[]') as Array<{ dst: string; gateway?: string; dev: string }>)
      out.push(`${r.dst} via ${r.gateway ?? '-'} dev ${r.dev}`);
  }
  return out.sort();
}

/** The pid of the agent process on node i (kubenet daemon in its network namespace). */
export async function kclAgentPid(i: number): Promise<string> {
  const net = `net:[${statSync(`/var/run/netns/kcl-n${i}`).ino}]`;
  const { stdout } = await execa('pgrep', ['-f', '/usr/local/bin/kubenet daemon'], { reject: false });
  for (const pid of stdout.split('\n').filter(Boolean)) {
    if ((await execa('readlink', [`/proc/${pid}/ns/net`], { reject: false })).stdout === net) return pid;
  }
  throw new Error(`no agent process on kcl-n${i}`);
}

/** A UDP "who am I" server on port 7777, both families, for 120 s: it answers with the sender's address. */
export const WHOAMI_SERVER = `for(const type of ['udp4','udp6']){const s=require('dgram').createSocket(type==='udp6'?{type,ipv6Only:true}:{type});s.on('message',(m,r)=>s.send(r.address,r.port,r.address));s.bind(7777)}setTimeout(()=>process.exit(0),120000)`;

/** Asks a UDP "who am I" server (in the pod with `toIp`) from the pod with netns pid `fromPid`; the answer is the source address it saw. */
export async function whoami(fromPid: string, toIp: string, port = 7777): Promise<string> {
  const script = `const s=require('dgram').createSocket(${JSON.stringify(toIp.includes(':') ? 'udp6' : 'udp4')});s.on('message',(m)=>{console.log(String(m));process.exit(0)});const send=()=>s.send('?',${port},${JSON.stringify(toIp)});send();setInterval(send,200);setTimeout(()=>process.exit(1),3000)`;
  const r = await execa('nsenter', ['-t', fromPid, '-n', process.execPath, '-e', script], { reject: false });
  return r.exitCode === 0 ? r.stdout.trim() : `no answer (${r.exitCode})`;
}
