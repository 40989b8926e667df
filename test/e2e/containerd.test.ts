/**
 * kubenet-ts under a real container runtime, as deployed: containerd 2.x + runc (the pinned versions hack/build-upstream.sh builds), driven
 * over the Kubernetes CRI gRPC API (runtime.v1) exactly as kubelet drives it (RunPodSandbox with the
 * pod's metadata, labels, bandwidth annotations and host ports; PodSandboxStatus; StopPodSandbox;
 * RemovePodSandbox), with containerd's default CNI dirs and cache dir, and the node agent started as
 * a process with exactly the YAML of manifests/kubenet.yaml's ConfigMap and no directory flag
 * (cluster mode: a fake API server serves the Node's pod CIDR and the pods).
 *
 * Everything runs in a NodeSandbox (test/kit/node-sandbox.ts): the node's netns with an uplink
 * to a "lan" netns, and tmpfs over /var/lib/cni, /var/lib/kubenet, /etc/cni/net.d, /opt/cni/bin,
 * /run/kubenet, /run/containerd, /var/lib/containerd; traffic only between the test's namespaces.
 * Rate measurements hold the machine-wide traffic lock (test/kit/traffic-lock.ts); run this
 * file as `flock /tmp/kubenet-traffic.lock npx ava test/e2e/containerd.test.ts`.
 */
import anyTest, { type ExecutionContext, type TestFn } from 'ava';
import { execa, type ResultPromise } from 'execa';
import { randomInt, randomUUID } from 'node:crypto';
import { existsSync } from 'node:fs';
import { readdir } from 'node:fs/promises';
import { join } from 'node:path';
import { cidrContains, parseCidr } from '../../src/net/ip.js';
import { agentGet } from '../../src/daemon/protocol.js';
import { FORWARDER } from '../kit/agent-harness.js';
import { type AgentProcess, startManifestAgent } from '../kit/agent-process.js';
import { Containerd, containerdTestBlocker } from '../kit/containerd.js';
import { logRate, logUnshaped } from '../kit/measure.js';
import { containerdSandboxInfo, CriClient, type PodSandboxConfig, type PortMapping } from '../kit/cri/client.js';
import { pod as podObject } from '../kit/fake-apiserver.js';
import { Cleanup, ifbShardNames, kernelTestBlocker, uniq } from '../kit/kernel.js';
import { CONTAINERD_TMPFS_DIRS, NODE_TMPFS_DIRS, NodeSandbox } from '../kit/node-sandbox.js';
import { withTrafficLock } from '../kit/traffic-lock.js';
import { iperf, retryLog, type IperfEndpoint } from '../kit/topo.js';
import { podLeaves } from '../kit/node-leaks.js';

const iperfMissing = (await execa('iperf3', ['--version'], { reject: false }).catch(() => ({ exitCode: 1 }))).exitCode !== 0;
const blocker =
  kernelTestBlocker() ??
  (existsSync(FORWARDER) ? undefined : `needs ${FORWARDER} (npm run build:native; npm test builds it)`) ??
  (iperfMissing ? 'needs iperf3 (run hack/bootstrap.sh)' : undefined) ??
  (await containerdTestBlocker());
const test = anyTest as TestFn;
const serialTest = blocker ? test.serial.skip : test.serial;
if (blocker) console.warn(`containerd e2e tests skipped: ${blocker}`);

const MBIT = 1e6;
const INGRESS = 20 * MBIT;
const EGRESS = 10 * MBIT;

interface AgentSettings {
  socket: string;
  bridgeName: string;
  ifbName: string;
  ipamDataDir: string;
  cniCacheDir: string;
  stateDir: string;
}

interface TestPodSpec {
  name: string;
  uid: string;
  annotations: Record<string, string>;
  portMappings: PortMapping[];
}

/**
 * RunPodSandbox's config as kubelet (kuberuntime) builds it for a pod on the pod network: metadata,
 * hostname, labels, the pod's annotations, port mappings of its hostPorts, cgroup parent, network
 * namespace POD. Left out: log_directory (kubelet's /var/log/pods/...; no container runs here, and
 * the host's /var/log stays untouched), DNS config, sysctls, seccomp.
 */
function sandboxConfig(p: TestPodSpec, cgroupParent: string): PodSandboxConfig {
  return {
    metadata: { name: p.name, uid: p.uid, namespace: 'default', attempt: 0 },
    hostname: p.name,
    logDirectory: '',
    portMappings: p.portMappings,
    labels: { 'io.kubernetes.pod.name': p.name, 'io.kubernetes.pod.namespace': 'default', 'io.kubernetes.pod.uid': p.uid },
    annotations: { 'kubernetes.io/config.source': 'api', 'kubernetes.io/config.seen': new Date().toISOString(), ...p.annotations },
    linux: { cgroupParent, securityContext: { namespaceOptions: { network: 'POD', pid: 'CONTAINER', ipc: 'POD' } } },
  };
}

/** What a pod can leave on the node; compared across restarts, and empty after Stop + Remove. */
interface NodeState {
  veths: string[];
  reservations: string[];
  cniResults: string[];
  podRecords: string[];
  qdiscs: string[];
  ifbLeaves: string[];
  ifbFilters: string[];
  natRules: string[];
}

async function listDir(path: string): Promise<string[]> {
  return (await readdir(path).catch(() => [] as string[])).sort();
}

async function nodeState(sb: NodeSandbox, agent: AgentSettings, uplink: string): Promise<NodeState> {
  const links = JSON.parse((await sb.exec('ip', ['-j', 'link', 'show', 'type', 'veth'])).stdout || '[]') as Array<{ ifname: string }>;
  const reservations: string[] = [];
  for (const net of await listDir(sb.hostPath(agent.ipamDataDir))) {
    for (const f of await listDir(sb.hostPath(join(agent.ipamDataDir, net)))) if (/^[\d.]+$|:/.test(f)) reservations.push(`${net}/${f}`);
  }
  const cacheDirs = [...new Set(['/var/lib/cni', agent.cniCacheDir])];
  const cniResults = (
    await Promise.all(cacheDirs.map(async (d) => (await listDir(sb.hostPath(join(d, 'results')))).map((f) => `${d}/results/${f}`)))
  ).flat();
  // Without -s, tc prints one counter: htb's direct_packets_stat (unclassified frames, e.g. ARP).
  const tc = async (args: string[]) =>
    (await sb.exec('tc', args, { reject: false })).stdout
      .split('\n')
      .filter((l) => l.trim() !== '')
      .map((l) => l.replace(/direct_packets_stat \d+/, 'direct_packets_stat _'));
  const nat = (await sb.exec('iptables', ['-w', '-t', 'nat', '-S'])).stdout.split('\n').filter((l) => l.trim() !== '');
  // Every egress shard's ifb (ifbName, ifbName.1, ...): their htb roots and idle classes stay.
  const ifbs = await ifbShardNames(agent.ifbName, sb.netns);
  const ifbLeaves: string[] = [];
  const ifbFilters: string[] = [];
  for (const ifb of ifbs) {
    ifbLeaves.push(...podLeaves(await tc(['qdisc', 'show', 'dev', ifb])).map((l) => `${ifb}: ${l}`));
    ifbFilters.push(
      ...(await tc(['filter', 'show', 'dev', ifb, 'parent', '1:'])).filter((l) => /flowid 1:[0-9a-f]+/.test(l)).map((l) => `${ifb}: ${l}`),
    );
  }
  return {
    veths: links
      .map((l) => l.ifname)
      .filter((n) => n !== uplink)
      .sort(),
    reservations: reservations.sort(),
    cniResults: cniResults.sort(),
    podRecords: await listDir(sb.hostPath(join(agent.stateDir, 'pods'))),
    qdiscs: (await tc(['qdisc', 'show'])).filter((l) => !ifbs.some((ifb) => l.includes(` dev ${ifb} `))).sort(),
    ifbLeaves,
    ifbFilters,
    natRules: nat.sort(),
  };
}

/** A TCP listener in a pod's netns that greets whoever connects (until the caller kills it). */
function listenInPod(netnsPath: string, port: number, greeting: string): ResultPromise {
  const script = `require('node:net').createServer((c) => c.end(${JSON.stringify(greeting + '\n')})).listen(${port}, '0.0.0.0', () => console.log('listening'))`;
  return execa('nsenter', [`--net=${netnsPath}`, '--', process.execPath, '-e', script], { reject: false });
}

async function waitListening(p: ResultPromise): Promise<void> {
  await new Promise<void>((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error('pod listener did not start')), 10_000);
    p.stdout?.on('data', (d: Buffer) => {
      if (d.toString().includes('listening')) {
        clearTimeout(timer);
        resolve();
      }
    });
  });
}

/** Connects from the lan netns to <ip>:<port> and returns what the other side said. */
async function fetchFromLan(sb: NodeSandbox, ip: string, port: number): Promise<string> {
  const r = await sb.execLan('timeout', ['5', 'bash', '-c', `exec 3<>/dev/tcp/${ip}/${port} && cat <&3`], { reject: false });
  return r.exitCode === 0 ? r.stdout.trim() : `(failed, exit ${r.exitCode}: ${r.stderr.trim()})`;
}

interface PodRun {
  id: string;
  ip: string;
  pid: number;
  /** The pod's netns as the host reaches it (through the sandbox process). */
  netnsPath: string;
}

/** Everything the tests below share: one node, one agent, one containerd, two pods. */
interface World {
  t0: number;
  cleanup: Cleanup;
  sb: NodeSandbox;
  cfg: AgentSettings;
  /** cfg with the cache dir the agent really uses (differs only with the TEMPORARY switch). */
  settings: AgentSettings;
  agent: AgentProcess;
  ctd: Containerd;
  podCidr: string;
  hostPort: number;
  shaped: TestPodSpec;
  web: TestPodSpec;
  baseline: NodeState;
  pods: Map<TestPodSpec, PodRun>;
  /** The node while the pods run, before the restarts. */
  running?: NodeState;
}

let world: World | undefined;
function w(): World {
  if (!world) throw new Error('no node: the setup (before hook) failed');
  return world;
}
const elapsed = () => `${((Date.now() - w().t0) / 1000).toFixed(1)} s`;

test.before(async (t) => {
  if (blocker) return;
  t.timeout(120_000);
  const t0 = Date.now();
  const cleanup = new Cleanup();
  try {
    // The cluster side: a Node with a pod CIDR (a /24 of 10/8 that only exists in the node netns), and the pods.
    const tag = uniq(6);
    const nodeName = `kcr-node-${tag}`;
    const podCidr = `10.${randomInt(100, 200)}.${randomInt(256)}.0/24`;
    const hostPort = randomInt(30000, 32768);
    const shaped: TestPodSpec = {
      name: `shaped-${tag}`,
      uid: randomUUID(),
      annotations: { 'kubernetes.io/ingress-bandwidth': '20M', 'kubernetes.io/egress-bandwidth': '10M' },
      portMappings: [],
    };
    const web: TestPodSpec = {
      name: `web-${tag}`,
      uid: randomUUID(),
      annotations: {},
      portMappings: [{ protocol: 'TCP', containerPort: 8080, hostPort, hostIp: '' }],
    };

    // The node, and the agent: the manifest's config, no directory flag; --kubeconfig reaches the fake API server.
    const sb = await NodeSandbox.create({ tmpfsDirs: [...NODE_TMPFS_DIRS, ...CONTAINERD_TMPFS_DIRS] });
    cleanup.add(() => sb.destroy());
    const { agent, api, configText, settings: cfg } = await startManifestAgent(sb, cleanup, { nodeName, podCidr });
    for (const p of [shaped, web]) api.setPod(podObject('default', p.name, nodeName, p.annotations));
    const settings: AgentSettings = cfg;
    t.log(
      `node netns ${sb.netns}, uplink ${sb.uplink.nodeIp}, pod CIDR ${podCidr}, host port ${hostPort}, manifest config:\n${configText.trimEnd()}`,
    );
    // containerd runs `loopback` itself from its bin_dir: the agent installs it there next to its own binary.
    const bins = await listDir(sb.hostPath('/opt/cni/bin'));
    if (bins.join() !== 'kubenet,loopback')
      throw new Error(`the agent installed ${bins.join(', ')} into /opt/cni/bin, expected kubenet and loopback`);

    const ctd = await Containerd.start(sb);
    cleanup.add(() => ctd.destroy());
    const version = await ctd.cri.version();
    t.log(`${version.runtimeName} ${version.runtimeVersion} (CRI ${version.runtimeApiVersion}), snapshotter ${ctd.snapshotter}`);
    if (version.runtimeApiVersion !== 'v1') throw new Error(`containerd speaks CRI ${version.runtimeApiVersion}, not v1`);
    await ctd.waitNetworkReady();
    const confs = await listDir(sb.hostPath('/etc/cni/net.d'));
    if (confs.join() !== '10-kubenet.conflist')
      throw new Error(`containerd's conf dir holds ${confs.join(', ')}, expected only the agent's 10-kubenet.conflist`);
    const baseline = await nodeState(sb, settings, sb.uplink.nodeIf);
    world = { t0, cleanup, sb, cfg, settings, agent, ctd, podCidr, hostPort, shaped, web, baseline, pods: new Map() };
    t.log(`node, agent and containerd ready after ${elapsed()}`);
  } catch (err) {
    await cleanup.run().catch((e: unknown) => t.log(`cleanup after the failed setup: ${String(e)}`));
    throw err;
  }
});

test.afterEach.always(async (t) => {
  if (t.passed || !world) return;
  t.log(`agent log (tail):\n${await world.agent.logTail(40)}`);
  t.log(`containerd log (tail):\n${world.ctd.logTail(30)}`);
});

test.after.always(async () => {
  await world?.cleanup.run();
});

serialTest(
  'RunPodSandbox as kubelet: pod IPs from the pod CIDR in PodSandboxStatus, distinct; the agent got the limits and the host port',
  async (t) => {
    const { ctd, sb, cfg, podCidr, shaped, web, hostPort, pods } = w();
    for (const p of [shaped, web]) {
      const id = await ctd.cri.runPodSandbox(sandboxConfig(p, ctd.podCgroupParent(p.uid)));
      pods.set(p, { id, ip: '', pid: 0, netnsPath: '' });
    }
    t.log(`pods running after ${elapsed()}`);
    const subnet = parseCidr(podCidr);
    for (const [p, run] of pods) {
      const st = await ctd.cri.podSandboxStatus(run.id, true);
      const info = containerdSandboxInfo(st);
      run.ip = st.status.network?.ip ?? '';
      run.pid = info.pid;
      run.netnsPath = `/proc/${info.pid}/ns/net`;
      t.is(st.status.state, 'SANDBOX_READY', `${p.name} ready`);
      t.true(cidrContains(subnet, run.ip), `${p.name}: IP ${run.ip} in the pod CIDR ${podCidr}`);
      t.deepEqual(
        st.status.annotations['kubernetes.io/egress-bandwidth'],
        p.annotations['kubernetes.io/egress-bandwidth'],
        'annotations kept',
      );
      t.true(info.pid > 0, `${p.name}: sandbox pid from the verbose status`);
      t.log(`${p.name}: sandbox ${run.id.slice(0, 12)}, IP ${run.ip}, pid ${info.pid}, CNI_NETNS ${info.netnsPath}`);
    }
    t.not(pods.get(shaped)?.ip, pods.get(web)?.ip, 'distinct pod IPs');

    // What containerd passed on (runtimeConfig.bandwidth and .portMappings) reached the agent.
    const status = JSON.parse((await agentGet(sb.hostPath(cfg.socket), '/v1/status')).body) as {
      pods: Array<{
        name: string;
        ips: string[];
        limits: { ingress?: number; egress?: number };
        portMappings?: Array<{ hostPort: number }>;
      }>;
    };
    t.deepEqual(
      status.pods.find((p) => p.name === shaped.name)?.limits,
      { ingress: INGRESS, egress: EGRESS },
      'agent status: the shaped pod limits',
    );
    t.deepEqual(
      status.pods.find((p) => p.name === web.name)?.portMappings?.map((m) => m.hostPort),
      [hostPort],
      'agent status: the web pod host port',
    );
  },
);

serialTest(
  "bandwidth annotations are enforced both ways with a host outside the cluster within ±10 %, no 1 s interval above 1.25 × the limit; the node (the bridge's gateway, in the node's pod CIDR) is not shaped",
  async (t) => {
    const { sb, cfg, podCidr, shaped, pods } = w();
    const pod = pods.get(shaped);
    if (!pod?.ip) throw new Error('the shaped pod is not running');
    // The manifest's config: routes direct, so the cluster's own ranges (every Node's pod CIDRs, here
    // this node's, and the ServiceCIDRs the fake API server lists: none) are unshaped. The limits hold
    // with the LAN host on the node's uplink (outside them), routed to the pod CIDR.
    const bridgeAddrs = JSON.parse((await sb.exec('ip', ['-j', '-4', 'addr', 'show', 'dev', cfg.bridgeName])).stdout) as Array<{
      addr_info: Array<{ local: string }>;
    }>;
    const gateway = bridgeAddrs[0]?.addr_info[0]?.local ?? '';
    t.true(cidrContains(parseCidr(podCidr), gateway), `bridge ${cfg.bridgeName} has the gateway ${gateway}`);
    const nodeEp: IperfEndpoint = { netns: sb.netns, ip4: gateway };
    const lanEp: IperfEndpoint = { netns: sb.lanNetns, ip4: sb.uplink.lanIp };
    const podEp: IperfEndpoint = { netns: '', netnsPath: pod.netnsPath, ip4: pod.ip };
    await execa('ip', ['-n', sb.lanNetns, 'route', 'replace', podCidr, 'via', sb.uplink.nodeIp]);
    await withTrafficLock(
      async () => {
        const ingress = await iperf(podEp, lanEp, { onRetry: retryLog(t), seconds: 5 });
        logRate(t, 'ingress 20M (LAN host → pod)', ingress.bps, ingress.intervals, INGRESS);
        const egress = await iperf(lanEp, podEp, { onRetry: retryLog(t), seconds: 5 });
        logRate(t, 'egress 10M (pod → LAN host, masqueraded)', egress.bps, egress.intervals, EGRESS);
        const fromNode = await iperf(podEp, nodeEp, { onRetry: retryLog(t), seconds: 3 });
        logUnshaped(t, 'node → pod (the gateway, in the pod CIDR)', fromNode.bps, fromNode.intervals, INGRESS);
        const toNode = await iperf(nodeEp, podEp, { onRetry: retryLog(t), seconds: 3 });
        logUnshaped(t, 'pod → node (the gateway, in the pod CIDR)', toNode.bps, toNode.intervals, EGRESS);
      },
      { onWait: () => t.log('waiting for the traffic lock') },
    );
    t.log(`measured after ${elapsed()}`);
  },
);

/** The web pod's host port from the lan netns (outside the node): connects to <uplink IP>:<hostPort>. */
async function checkHostPort(t: ExecutionContext): Promise<void> {
  const { sb, web, pods, hostPort } = w();
  const pod = pods.get(web);
  if (!pod?.ip) throw new Error('the web pod is not running');
  const listener = listenInPod(pod.netnsPath, 8080, `kcr-hello ${web.name}`);
  try {
    await waitListening(listener);
    const got = await fetchFromLan(sb, sb.uplink.nodeIp, hostPort);
    t.is(got, `kcr-hello ${web.name}`, `${sb.uplink.nodeIp}:${hostPort} from the lan reaches the web pod's :8080`);
  } finally {
    listener.kill('SIGKILL');
    await listener;
  }
}

serialTest('a hostPort mapping is reachable through the node from outside', async (t) => {
  await checkHostPort(t);
});

serialTest('an agent restart and a containerd restart between Run and Stop change nothing', async (t) => {
  const { sb, settings, agent, ctd, pods } = w();
  const running = await nodeState(sb, settings, sb.uplink.nodeIf);
  w().running = running;
  t.is(running.veths.length, 2, `a veth per pod: ${running.veths.join(' ')}`);
  t.is(running.reservations.length, 2, `an address per pod: ${running.reservations.join(' ')}`);
  t.is(running.podRecords.length, 2, `an agent record per pod: ${running.podRecords.join(' ')}`);
  t.is(await agent.stop(), 0, 'agent exits 0 on SIGTERM');
  await agent.start();
  t.deepEqual(await nodeState(sb, settings, sb.uplink.nodeIf), running, 'an agent restart changes nothing on the node');
  await ctd.restart();
  t.deepEqual(await nodeState(sb, settings, sb.uplink.nodeIf), running, 'a containerd restart changes nothing on the node');
  for (const [p, run] of pods) {
    const st = await ctd.cri.podSandboxStatus(run.id, false);
    t.is(st.status.state, 'SANDBOX_READY', `${p.name} still ready after the restarts`);
    t.is(st.status.network?.ip, run.ip, `${p.name} keeps its IP`);
  }
  await checkHostPort(t);
  t.log(`restarts done after ${elapsed()}`);
});

serialTest('StopPodSandbox and RemovePodSandbox succeed (containerd runs CNI DEL on both)', async (t) => {
  const { ctd, pods } = w();
  if (pods.size === 0) throw new Error('no pod was run');
  // The agent's DEL takes milliseconds; the 15 s deadline only bounds the test when DEL hangs.
  const kubelet = new CriClient(ctd.socket, 15_000);
  try {
    const failures: string[] = [];
    for (const [p, run] of pods) {
      for (const [call, fn] of [
        ['StopPodSandbox', () => kubelet.stopPodSandbox(run.id)],
        ['RemovePodSandbox', () => kubelet.removePodSandbox(run.id)],
      ] as const) {
        const started = Date.now();
        const err = await fn().then(
          () => undefined,
          (e: Error) => e.message,
        );
        t.log(`${call} ${p.name}: ${err ?? 'ok'} (${Date.now() - started} ms)`);
        if (err) failures.push(`${call} ${p.name}: ${err}`);
      }
    }
    t.deepEqual(failures, [], 'every Stop and Remove succeeded');
    t.deepEqual(
      (await ctd.cri.listPodSandbox()).map((s) => s.metadata.name),
      [],
      'no sandbox left in containerd',
    );
  } finally {
    kubelet.close();
  }
  t.log(`stopped and removed after ${elapsed()}`);
});

serialTest('Stop + Remove leave no veth, IP reservation, CNI cache entry, agent pod record, tc object or iptables rule', async (t) => {
  const { sb, settings, baseline, pods, hostPort } = w();
  if (pods.size === 0) throw new Error('no pod was run');
  const after = await nodeState(sb, settings, sb.uplink.nodeIf);
  const podIps = [...pods.values()].map((p) => p.ip).filter((ip) => ip !== '');
  const newRules = after.natRules.filter((r) => !baseline.natRules.includes(r));
  const left = {
    veths: after.veths,
    reservations: after.reservations,
    cniCacheEntries: after.cniResults,
    agentPodRecords: after.podRecords,
    ifbLeaves: after.ifbLeaves,
    ifbFilters: after.ifbFilters,
    shapingQdiscs: after.qdiscs.filter((l) => !/^qdisc noqueue /.test(l)),
    podNatRules: newRules.filter(
      (r) =>
        /CNI-DN-|CNI-SN-/.test(r) ||
        podIps.some((ip) => r.includes(ip)) ||
        r.includes(String(hostPort)) ||
        [...pods.values()].some((p) => r.includes(p.id)),
    ),
  };
  const nothing = {
    veths: [],
    reservations: [],
    cniCacheEntries: [],
    agentPodRecords: [],
    ifbLeaves: [],
    ifbFilters: [],
    shapingQdiscs: [],
    podNatRules: [],
  };
  t.deepEqual(left, nothing, 'nothing of any pod is left on the node');
  const shared = newRules.filter((r) => !left.podNatRules.includes(r));
  if (shared.length > 0)
    t.log(`nat rules added since before the pods, shared by all pods (portmap never removes these):\n${shared.join('\n')}`);
  t.log(`total ${elapsed()}`);
});
