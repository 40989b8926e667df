/**
 * The agent's image under a real runtime, as the DaemonSet runs it: hack/build-image.sh's OCI
 * archive imported into containerd 2.x (`ctr -n k8s.io images import`), and the agent run from it
 * through CRI exactly as kubelet runs manifests/kubenet.yaml's pod (test/helpers/daemonset-pod.ts:
 * the manifest's command, env, privileged securityContext, host network, every volume mount with
 * its propagation, the ConfigMap as files, a service account token; in-cluster config against a
 * fake API server over TLS). Then pods through the same containerd get addresses and limits; the
 * agent's pod is replaced by one from a new image tag (a DaemonSet rolling update) while a pod is
 * pinged; every pod and the agent are removed and nothing is left.
 *
 * Inside a NodeSandbox with tmpfs over the node's CNI, kubenet and containerd dirs and /run/netns
 * (containerd's default pod netns dir, which the manifest mounts HostToContainer). No iperf here:
 * the limits are checked in the kernel's classes (test/e2e/containerd.test.ts measures them).
 */
import anyTest, { type TestFn } from 'ava';
import { execa } from 'execa';
import { randomInt, randomUUID } from 'node:crypto';
import { existsSync, readFileSync } from 'node:fs';
import { mkdir, readdir, readFile } from 'node:fs/promises';
import { join } from 'node:path';
import { agentGet, HEALTH_PATH } from '../../src/daemon/protocol.js';
import { cidrContains, parseCidr } from '../../src/net/ip.js';
import { FORWARDER } from '../../hack/support/agent-harness.js';
import { FakeApiServer, node as nodeObject, pod as podObject } from '../../hack/support/fake-apiserver.js';
import { Cleanup, kernelTestBlocker, uniq } from '../../hack/support/kernel.js';
import { makePki } from '../../hack/support/pki.js';
import { refPlugin } from '../../hack/support/upstream.js';
import { until } from '../../hack/support/until.js';
import { AGENT_IMAGE_TAR, Containerd, containerdTestBlocker } from '../helpers/containerd.js';
import { containerdSandboxInfo, type PodSandboxConfig } from '../helpers/cri/client.js';
import { kubeletPod, manifestDaemonSet, type DaemonSetSpec } from '../helpers/daemonset-pod.js';
import { checkPingLoss, pingThroughout } from '../helpers/measure.js';
import { describeLeftovers, NO_LEFTOVERS, podLeftovers, type NodeLayout } from '../../hack/support/node-leaks.js';
import { CONTAINERD_TMPFS_DIRS, NODE_TMPFS_DIRS, NodeSandbox } from '../../hack/support/node-sandbox.js';

const blocker =
  kernelTestBlocker() ??
  (await containerdTestBlocker()) ??
  (existsSync(AGENT_IMAGE_TAR) ? undefined : `needs ${AGENT_IMAGE_TAR} (bash hack/build-image.sh; npm test builds it)`);
const test = anyTest as TestFn;
const serialTest = blocker ? test.serial.skip : test.serial;
if (blocker) console.warn(`image e2e tests skipped: ${blocker}`);

const SOCKET = '/run/kubenet/kubenet.sock';

interface AgentPod {
  sandboxId: string;
  containerId: string;
  logFile: string;
  image: string;
}

interface World {
  cleanup: Cleanup;
  sb: NodeSandbox;
  ctd: Containerd;
  api: FakeApiServer;
  ds: DaemonSetSpec;
  nodeName: string;
  podCidr: string;
  caCert: string;
  layout: NodeLayout;
  agent: AgentPod;
  /** Pods run through containerd: name → sandbox ID, IP. */
  pods: Map<string, { id: string; ip: string; uid: string }>;
}

let world: World | undefined;
const w = (): World => {
  if (!world) throw new Error('setup failed');
  return world;
};

/** The agent's container log (CRI format: "<time> <stream> <tag> <line>"), its lines only. */
async function agentLog(a: AgentPod, lines = 40): Promise<string> {
  const text = await readFile(a.logFile, 'utf8').catch(() => '');
  return text
    .split('\n')
    .filter((l) => l !== '')
    .slice(-lines)
    .map((l) => l.split(' ').slice(3).join(' '))
    .join('\n');
}

async function healthy(sb: NodeSandbox): Promise<boolean> {
  try {
    return (await agentGet(sb.hostPath(SOCKET), HEALTH_PATH, 2_000)).status === 200;
  } catch {
    return false;
  }
}

/** Runs the DaemonSet's pod (sandbox + container) from `image` and waits until the agent is healthy. */
async function runAgentPod(x: Omit<World, 'agent' | 'pods' | 'layout'>, image: string): Promise<AgentPod> {
  const uid = randomUUID();
  const podName = `${x.ds.name}-${uniq(5)}`;
  const podDir = join(x.sb.tmpDir, 'pods', uid);
  await mkdir(podDir, { recursive: true });
  const k = await kubeletPod(x.sb, x.ds, {
    nodeName: x.nodeName,
    uid,
    podName,
    cgroupParent: x.ctd.podCgroupParent(uid),
    podDir,
    apiServer: { host: '127.0.0.1', port: x.api.port, caCert: x.caCert, token: `kubenet-sa-token-${uniq(8)}` },
    image,
  });
  const sandboxId = await x.ctd.cri.runPodSandbox(k.sandbox);
  const containerId = await x.ctd.cri.createContainer(sandboxId, k.container, k.sandbox);
  await x.ctd.cri.startContainer(containerId);
  const a = { sandboxId, containerId, logFile: k.logFile, image };
  try {
    await until('the agent in its container to answer /healthz 200', () => healthy(x.sb), 60_000, 200);
  } catch (err) {
    const st = await x.ctd.cri.containerStatus(containerId).catch(() => undefined);
    throw new Error(`${String(err)}; container ${st?.state ?? '?'} (exit ${st?.exitCode ?? '?'} ${st?.reason ?? ''}); log:\n${await agentLog(a)}`);
  }
  return a;
}

/** As kubelet deletes a pod: StopContainer (grace period), StopPodSandbox, RemovePodSandbox. */
async function removeAgentPod(ctd: Containerd, a: AgentPod, graceS: number): Promise<void> {
  await ctd.cri.stopContainer(a.containerId, graceS);
  await ctd.cri.removeContainer(a.containerId);
  await ctd.cri.stopPodSandbox(a.sandboxId);
  await ctd.cri.removePodSandbox(a.sandboxId);
}

function podSandbox(name: string, uid: string, annotations: Record<string, string>, cgroupParent: string): PodSandboxConfig {
  return {
    metadata: { name, uid, namespace: 'default', attempt: 0 },
    hostname: name,
    labels: { 'io.kubernetes.pod.name': name, 'io.kubernetes.pod.namespace': 'default', 'io.kubernetes.pod.uid': uid },
    annotations: { 'kubernetes.io/config.source': 'api', ...annotations },
    linux: { cgroupParent, securityContext: { namespaceOptions: { network: 'POD', pid: 'CONTAINER', ipc: 'POD' } } },
  };
}

async function runPod(name: string, annotations: Record<string, string>): Promise<void> {
  const { ctd, api, nodeName, pods } = w();
  const uid = randomUUID();
  api.setPod(podObject('default', name, nodeName, annotations));
  const id = await ctd.cri.runPodSandbox(podSandbox(name, uid, annotations, ctd.podCgroupParent(uid)));
  const st = await ctd.cri.podSandboxStatus(id);
  pods.set(name, { id, ip: st.status.network?.ip ?? '', uid });
}

/** The rate of the htb class `classid` on `dev`, as tc prints it (e.g. "20Mbit"), or undefined. */
test.before(async (t) => {
  if (blocker) return;
  const cleanup = new Cleanup();
  try {
    const t0 = Date.now();
    const ds = await manifestDaemonSet();
    const nodeName = `kim-node-${uniq(6)}`;
    const podCidr = `10.${randomInt(100, 200)}.${randomInt(256)}.0/24`;
    const sb = await NodeSandbox.create({ prefix: 'kim', tmpfsDirs: [...NODE_TMPFS_DIRS, ...CONTAINERD_TMPFS_DIRS, '/run/netns'] });
    cleanup.add(() => sb.destroy());
    // The API server, over TLS as a real one (the agent's in-cluster config is https only).
    const pki = await makePki(join(sb.tmpDir));
    const api = await FakeApiServer.start({ key: await readFile(pki.serverKey), cert: await readFile(pki.serverCert) });
    cleanup.add(() => api.stop());
    api.setNode(nodeObject(nodeName, { podCIDR: podCidr, podCIDRs: [podCidr] }));
    await sb.exposeHostPort(api.port);

    const ctd = await Containerd.start(sb, { netnsUnderStateDir: false });
    cleanup.add(() => ctd.destroy());
    await ctd.importImage(AGENT_IMAGE_TAR);
    const cfg = (await import('js-yaml')).default.load(ds.configMaps.get('kubenet-config')?.['config.yaml'] ?? '') as { bridgeName: string; ifbName: string; ipamDataDir: string; stateDir: string };
    const base = { cleanup, sb, ctd, api, ds, nodeName, podCidr, caCert: pki.caCert };
    const agent = await runAgentPod(base, ds.container.image);
    world = {
      ...base,
      agent,
      pods: new Map(),
      layout: { bridgeName: cfg.bridgeName, ifbName: cfg.ifbName, ipamDataDir: cfg.ipamDataDir, stateDir: cfg.stateDir, runtimeCacheDir: '/var/lib/cni' },
    };
    await ctd.waitNetworkReady();
    t.log(`node netns ${sb.netns}, pod CIDR ${podCidr}; containerd ${(await ctd.cri.version()).runtimeVersion}; agent healthy in its container after ${Date.now() - t0} ms`);
  } catch (err) {
    await cleanup.run().catch((e: unknown) => t.log(`cleanup after the failed setup: ${String(e)}`));
    throw err;
  }
});

test.afterEach.always(async (t) => {
  if (t.passed || !world) return;
  t.log(`agent log (tail):\n${await agentLog(world.agent)}`);
  t.log(`containerd log (tail):\n${world.ctd.logTail(30)}`);
});

test.after.always(async () => {
  await world?.cleanup.run();
});

serialTest('the image the manifest names runs the agent as the DaemonSet says: it installs kubenet + loopback into the host dir and writes the conflist', async (t) => {
  const { ctd, sb, ds, agent } = w();
  const version = (JSON.parse(await readFile(new URL('../../package.json', import.meta.url), 'utf8')) as { version: string }).version;
  t.is(ds.container.image, `kubenet-ts:${version}`, 'the manifest names the image hack/build-image.sh builds');
  const images = (await ctd.ctr(['images', 'ls', '-q'])).stdout.split('\n');
  t.true(images.includes(`docker.io/library/kubenet-ts:${version}`), `the imported archive holds docker.io/library/kubenet-ts:${version}: ${images.join(' ')}`);
  const st = await ctd.cri.containerStatus(agent.containerId);
  t.is(st.state, 'CONTAINER_RUNNING');
  t.is(st.image?.image.replace(/^docker\.io\/library\//, ''), ds.container.image);
  t.deepEqual((await readdir(sb.hostPath('/opt/cni/bin'))).sort(), ['kubenet', 'loopback'], '/opt/cni/bin: the forwarder and loopback, from the image');
  t.deepEqual(await readFile(sb.hostPath('/opt/cni/bin/kubenet')), await readFile(FORWARDER), 'the installed kubenet is the image\'s forwarder');
  t.deepEqual(await readFile(sb.hostPath('/opt/cni/bin/loopback')), await readFile(refPlugin('loopback')), 'loopback is the pinned reference plugin');
  t.deepEqual(await readdir(sb.hostPath('/etc/cni/net.d')), ['10-kubenet.conflist']);
  const log = await agentLog(agent, 200);
  t.notRegex(log, /"level":(50|60)/, 'no error in the agent log');
  t.regex(log, /"backend":"nft".*"msg":"iptables backend of this node"/, 'the agent chose the node\'s iptables backend (a node with no rules yet: nft)');
  t.regex((await sb.exec('iptables', ['-t', 'nat', '-S'])).stdout, /--comment "kubenet-ts: SNAT for outbound traffic from cluster".* -j MASQUERADE/, 'its masquerade rule is in the tables the node\'s own iptables (nft) shows');
});

serialTest('pods through the same containerd get addresses from the pod CIDR and their limits in the kernel; they reach each other and the node', async (t) => {
  const { sb, podCidr, pods } = w();
  await runPod('shaped', { 'kubernetes.io/ingress-bandwidth': '20M', 'kubernetes.io/egress-bandwidth': '10M' });
  await runPod('plain', {});
  const subnet = parseCidr(podCidr);
  for (const [name, p] of pods) t.true(cidrContains(subnet, p.ip), `${name}: ${p.ip} in ${podCidr}`);
  t.not(pods.get('shaped')?.ip, pods.get('plain')?.ip);
  const status = JSON.parse((await agentGet(sb.hostPath(SOCKET), '/v1/status')).body) as { pods: Array<{ name: string; hostVeth?: string; limits: { ingress?: number; egress?: number } }> };
  const shaped = status.pods.find((p) => p.name === 'shaped');
  t.deepEqual(shaped?.limits, { ingress: 20e6, egress: 10e6 });
  t.deepEqual(status.pods.find((p) => p.name === 'plain')?.limits, {});
  // Ingress, in the node's trees (the manifest's agent reads the sandbox uplink's link speed): the
  // pod's veth redirects to the ingress tree's ifb, where its class's ceil is the limit.
  t.regex((await sb.exec('tc', ['filter', 'show', 'dev', shaped?.hostVeth ?? '', 'parent', '2:'])).stdout, /Redirect to device kubenet-ifb0\.in/, `${shaped?.hostVeth} redirects to the ingress tree`);
  const inClasses = (await sb.exec('tc', ['class', 'show', 'dev', 'kubenet-ifb0.in'])).stdout;
  t.regex(inClasses, /^class htb 1:\S+ parent 1:fffe .*\bceil 20Mbit/m, `a class with the ingress limit in the ingress tree: ${inClasses}`);
  const ping = (from: string, to: string) => execa('nsenter', [`--net=/proc/${from}/ns/net`, '--', 'ping', '-c', '2', '-W', '2', to], { reject: false });
  const plainInfo = containerdSandboxInfo(await w().ctd.cri.podSandboxStatus(pods.get('plain')?.id ?? '', true));
  t.is((await ping(String(plainInfo.pid), pods.get('shaped')?.ip ?? '')).exitCode, 0, 'plain pings shaped');
  t.is((await sb.exec('ping', ['-c', '2', '-W', '2', pods.get('plain')?.ip ?? ''], { reject: false })).exitCode, 0, 'the node pings plain');
});

serialTest('a rolling update to a new image tag: running pods keep their network (pinged throughout), the new agent knows them, and sets up the next pod', async (t) => {
  const x = w();
  const { ctd, sb, pods } = x;
  const newImage = `kubenet-ts:upgrade-${uniq(4)}`;
  await ctd.ctr(['images', 'tag', `docker.io/library/${x.ds.container.image}`, `docker.io/library/${newImage}`]);
  const target = pods.get('shaped')?.ip ?? '';
  const before = JSON.parse((await sb.exec('ip', ['-j', 'link', 'show', 'master', x.layout.bridgeName])).stdout) as Array<{ ifindex: number }>;
  const pinger = pingThroughout((cmd, args) => sb.exec(cmd, args, { reject: false }), target, 30);
  const started = Date.now();
  await new Promise((r) => setTimeout(r, 500));
  await removeAgentPod(ctd, x.agent, 30);
  const gone = Date.now();
  x.agent = await runAgentPod(x, newImage);
  const back = Date.now();
  await new Promise((r) => setTimeout(r, 500));
  const ping = await pinger.stop();
  t.log(`old agent pod removed after ${gone - started} ms, new agent healthy ${back - gone} ms later; ping every 50 ms: ${ping.sent} sent, ${ping.lost} lost`);
  checkPingLoss(t, ping);
  const after = JSON.parse((await sb.exec('ip', ['-j', 'link', 'show', 'master', x.layout.bridgeName])).stdout) as Array<{ ifindex: number }>;
  t.deepEqual(after.map((l) => l.ifindex).sort(), before.map((l) => l.ifindex).sort(), 'the pods\' veths are the same links');
  const status = JSON.parse((await agentGet(sb.hostPath(SOCKET), '/v1/status')).body) as { pods: Array<{ name: string; limits: object }> };
  t.deepEqual(status.pods.map((p) => p.name).sort(), ['plain', 'shaped'], 'the new agent knows both pods');
  t.deepEqual(status.pods.find((p) => p.name === 'shaped')?.limits, { ingress: 20e6, egress: 10e6 });
  t.is((await ctd.cri.containerStatus(x.agent.containerId)).state, 'CONTAINER_RUNNING', `the agent runs from ${newImage}`);
  await runPod('after', {});
  t.true(cidrContains(parseCidr(x.podCidr), pods.get('after')?.ip ?? ''), 'a pod set up by the new agent');
});

serialTest('removing every pod, then the agent, leaves nothing: no veth, reservation, cache entry, record, tc object, rule or container', async (t) => {
  const { ctd, sb, pods, layout } = w();
  for (const p of pods.values()) {
    await ctd.cri.stopPodSandbox(p.id);
    await ctd.cri.removePodSandbox(p.id);
  }
  pods.clear();
  t.is(describeLeftovers(await podLeftovers(sb, layout)), describeLeftovers(NO_LEFTOVERS));
  await removeAgentPod(ctd, w().agent, 30);
  t.deepEqual(await ctd.cri.listContainers(), [], 'no container left');
  t.deepEqual(await ctd.cri.listPodSandbox(), [], 'no pod sandbox left');
  t.false(await healthy(sb), 'the agent is gone');
  const agents = sb.processes().filter((pid) => {
    try {
      return readFileSync(`/proc/${pid}/cmdline`, 'utf8').includes('/usr/local/bin/kubenet');
    } catch {
      return false;
    }
  });
  t.deepEqual(agents, [], 'no agent process left');
});
