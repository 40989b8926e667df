/**
 * The agent's image under a real runtime, as the DaemonSet runs it: hack/build-image.sh's OCI
 * archive imported into containerd 2.x (`ctr -n k8s.io images import`), and the agent run from it
 * through CRI exactly as kubelet runs manifests/kubenet.yaml's pod (test/kit/daemonset-pod.ts:
 * the manifest's command, env, privileged securityContext, host network, every volume mount with
 * its propagation, the ConfigMap as files, a service account token; in-cluster config against a
 * fake API server over TLS). Then pods through the same containerd get addresses and limits; the
 * agent's pod is replaced by one from a new image tag (a DaemonSet rolling update) while a pod is
 * pinged; every pod and the agent are removed and nothing is left.
 *
 * Inside a NodeSandbox with tmpfs over the node's CNI, kubenet and containerd dirs and /run/netns
 * (containerd's default pod netns dir, which the manifest mounts HostToContainer). No iperf here:
 * the limits are checked in the kernel's classes (test/e2e/containerd.test.ts measures them).
 *
 * The archive's SBOM (hack/support/sbom.ts) against the archive's own layer, unpacked: SPDX 2.3 in
 * shape, and the versions really inside (the image's node run with the image's loader, every
 * node_modules package.json, `go version -m` on the image, each Debian file's md5 in its package's
 * record). Needs only the archive and go.
 */
import anyTest, { type TestFn } from 'ava';
import { execa } from 'execa';
import { createHash, randomInt, randomUUID } from 'node:crypto';
import { existsSync, readFileSync } from 'node:fs';
import { mkdir, mkdtemp, readdir, readFile, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join, relative } from 'node:path';
import { agentGet, HEALTH_PATH } from '../../src/daemon/protocol.js';
import { cidrContains, parseCidr } from '../../src/net/ip.js';
import { FORWARDER } from '../kit/agent-harness.js';
import { FakeApiServer, node as nodeObject, pod as podObject } from '../kit/fake-apiserver.js';
import { Cleanup, kernelTestBlocker, uniq } from '../kit/kernel.js';
import { makePki } from '../kit/pki.js';
import { controlFields, sbomPath, type SpdxDocument, type SpdxPackage } from '../../hack/support/sbom.js';
import { refPlugin } from '../kit/upstream.js';
import { until } from '../kit/until.js';
import { AGENT_IMAGE_TAR, Containerd, containerdTestBlocker } from '../kit/containerd.js';
import { containerdSandboxInfo, type PodSandboxConfig } from '../kit/cri/client.js';
import { kubeletPod, manifestDaemonSet, type DaemonSetSpec } from '../kit/daemonset-pod.js';
import { checkPingLoss, pingThroughout } from '../kit/measure.js';
import { describeLeftovers, NO_LEFTOVERS, podLeftovers, type NodeLayout } from '../kit/node-leaks.js';
import { CONTAINERD_TMPFS_DIRS, NODE_TMPFS_DIRS, NodeSandbox } from '../kit/node-sandbox.js';
import { redirectTarget, shardIfbs } from '../kit/shards.js';

const blocker =
  kernelTestBlocker() ??
  (await containerdTestBlocker()) ??
  (existsSync(AGENT_IMAGE_TAR) ? undefined : `needs ${AGENT_IMAGE_TAR} (bash hack/build-image.sh; npm test builds it)`);
const test = anyTest as TestFn;
const serialTest = blocker ? test.serial.skip : test.serial;
if (blocker) console.warn(`image e2e tests skipped: ${blocker}`);
// The SBOM test needs only the archive and go.
const GO = ['/usr/local/go/bin/go', 'go'].find((g) => g === 'go' || existsSync(g)) ?? 'go';
const sbomBlocker = !existsSync(AGENT_IMAGE_TAR)
  ? `needs ${AGENT_IMAGE_TAR} (bash hack/build-image.sh; npm test builds it)`
  : (await execa(GO, ['version'], { reject: false })).exitCode === 0
    ? undefined
    : "needs go (go version -m reads the image's Go binaries)";
if (sbomBlocker) console.warn(`image SBOM test skipped: ${sbomBlocker}`);

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
    throw new Error(
      `${String(err)}; container ${st?.state ?? '?'} (exit ${st?.exitCode ?? '?'} ${st?.reason ?? ''}); log:\n${await agentLog(a)}`,
    );
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
    const cfg = (await import('js-yaml')).default.load(ds.configMaps.get('kubenet-config')?.['config.yaml'] ?? '') as {
      bridgeName: string;
      ifbName: string;
      ipamDataDir: string;
      stateDir: string;
    };
    const base = { cleanup, sb, ctd, api, ds, nodeName, podCidr, caCert: pki.caCert };
    const agent = await runAgentPod(base, ds.container.image);
    world = {
      ...base,
      agent,
      pods: new Map(),
      layout: {
        bridgeName: cfg.bridgeName,
        ifbName: cfg.ifbName,
        ipamDataDir: cfg.ipamDataDir,
        stateDir: cfg.stateDir,
        runtimeCacheDir: '/var/lib/cni',
      },
    };
    await ctd.waitNetworkReady();
    t.log(
      `node netns ${sb.netns}, pod CIDR ${podCidr}; containerd ${(await ctd.cri.version()).runtimeVersion}; agent healthy in its container after ${Date.now() - t0} ms`,
    );
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

serialTest(
  'the image the manifest names runs the agent as the DaemonSet says: it installs kubenet + loopback into the host dir and writes the conflist',
  async (t) => {
    const { ctd, sb, ds, agent } = w();
    const version = (JSON.parse(await readFile(new URL('../../package.json', import.meta.url), 'utf8')) as { version: string }).version;
    t.is(ds.container.image, `kubenet-ts:${version}`, 'the manifest names the image hack/build-image.sh builds');
    const images = (await ctd.ctr(['images', 'ls', '-q'])).stdout.split('\n');
    t.true(
      images.includes(`docker.io/library/kubenet-ts:${version}`),
      `the imported archive holds docker.io/library/kubenet-ts:${version}: ${images.join(' ')}`,
    );
    const st = await ctd.cri.containerStatus(agent.containerId);
    t.is(st.state, 'CONTAINER_RUNNING');
    t.is(st.image?.image.replace(/^docker\.io\/library\//, ''), ds.container.image);
    t.deepEqual(
      (await readdir(sb.hostPath('/opt/cni/bin'))).sort(),
      ['kubenet', 'loopback'],
      '/opt/cni/bin: the forwarder and loopback, from the image',
    );
    t.deepEqual(
      await readFile(sb.hostPath('/opt/cni/bin/kubenet')),
      await readFile(FORWARDER),
      "the installed kubenet is the image's forwarder",
    );
    t.deepEqual(
      await readFile(sb.hostPath('/opt/cni/bin/loopback')),
      await readFile(refPlugin('loopback')),
      'loopback is the pinned reference plugin',
    );
    t.deepEqual(await readdir(sb.hostPath('/etc/cni/net.d')), ['10-kubenet.conflist']);
    const log = await agentLog(agent, 200);
    t.notRegex(log, /"level":(50|60)/, 'no error in the agent log');
    t.regex(
      log,
      /"backend":"nft".*"msg":"iptables backend of this node"/,
      "the agent chose the node's iptables backend (a node with no rules yet: nft)",
    );
    t.regex(
      (await sb.exec('iptables', ['-t', 'nat', '-S'])).stdout,
      /--comment "kubenet-ts: SNAT for outbound traffic from cluster".* -j MASQUERADE/,
      "its masquerade rule is in the tables the node's own iptables (nft) shows",
    );
  },
);

serialTest(
  'pods through the same containerd get addresses from the pod CIDR and their limits in the kernel; they reach each other and the node',
  async (t) => {
    const { sb, podCidr, pods } = w();
    await runPod('shaped', { 'kubernetes.io/ingress-bandwidth': '20M', 'kubernetes.io/egress-bandwidth': '10M' });
    await runPod('plain', {});
    const subnet = parseCidr(podCidr);
    for (const [name, p] of pods) t.true(cidrContains(subnet, p.ip), `${name}: ${p.ip} in ${podCidr}`);
    t.not(pods.get('shaped')?.ip, pods.get('plain')?.ip);
    const status = JSON.parse((await agentGet(sb.hostPath(SOCKET), '/v1/status')).body) as {
      pods: Array<{ name: string; hostVeth?: string; limits: { ingress?: number; egress?: number } }>;
    };
    const shaped = status.pods.find((p) => p.name === 'shaped');
    t.deepEqual(shaped?.limits, { ingress: 20e6, egress: 10e6 });
    t.deepEqual(status.pods.find((p) => p.name === 'plain')?.limits, {});
    // Ingress, in the node's trees (the manifest's agent reads the sandbox uplink's link speed): the
    // pod's veth redirects to the ingress tree's ifb, where its class's ceil is the limit.
    const run = async (cmd: string, args: string[]) => (await sb.exec(cmd, args)).stdout;
    const inShard = redirectTarget(await run('tc', ['filter', 'show', 'dev', shaped?.hostVeth ?? '', 'parent', '2:'])) ?? 'none';
    t.true((await shardIfbs(run, 'ingress')).includes(inShard), `${shaped?.hostVeth} redirects to an ingress shard: ${inShard}`);
    const inClasses = await run('tc', ['class', 'show', 'dev', inShard]);
    t.regex(
      inClasses,
      /^class htb 1:\S+ parent 1:fffe .*\bceil 20Mbit/m,
      `a class with the ingress limit in the ingress tree: ${inClasses}`,
    );
    const ping = (from: string, to: string) =>
      execa('nsenter', [`--net=/proc/${from}/ns/net`, '--', 'ping', '-c', '2', '-W', '2', to], { reject: false });
    const plainInfo = containerdSandboxInfo(await w().ctd.cri.podSandboxStatus(pods.get('plain')?.id ?? '', true));
    t.is((await ping(String(plainInfo.pid), pods.get('shaped')?.ip ?? '')).exitCode, 0, 'plain pings shaped');
    t.is(
      (await sb.exec('ping', ['-c', '2', '-W', '2', pods.get('plain')?.ip ?? ''], { reject: false })).exitCode,
      0,
      'the node pings plain',
    );
  },
);

serialTest(
  'a rolling update to a new image tag: running pods keep their network (pinged throughout), the new agent knows them, and sets up the next pod',
  async (t) => {
    const x = w();
    const { ctd, sb, pods } = x;
    const newImage = `kubenet-ts:upgrade-${uniq(4)}`;
    await ctd.ctr(['images', 'tag', `docker.io/library/${x.ds.container.image}`, `docker.io/library/${newImage}`]);
    const target = pods.get('shaped')?.ip ?? '';
    const before = JSON.parse((await sb.exec('ip', ['-j', 'link', 'show', 'master', x.layout.bridgeName])).stdout) as Array<{
      ifindex: number;
    }>;
    const pinger = pingThroughout((cmd, args) => sb.exec(cmd, args, { reject: false }), target, 30);
    const started = Date.now();
    await new Promise((r) => setTimeout(r, 500));
    await removeAgentPod(ctd, x.agent, 30);
    const gone = Date.now();
    x.agent = await runAgentPod(x, newImage);
    const back = Date.now();
    await new Promise((r) => setTimeout(r, 500));
    const ping = await pinger.stop();
    t.log(
      `old agent pod removed after ${gone - started} ms, new agent healthy ${back - gone} ms later; ping every 50 ms: ${ping.sent} sent, ${ping.lost} lost`,
    );
    checkPingLoss(t, ping);
    const after = JSON.parse((await sb.exec('ip', ['-j', 'link', 'show', 'master', x.layout.bridgeName])).stdout) as Array<{
      ifindex: number;
    }>;
    t.deepEqual(after.map((l) => l.ifindex).sort(), before.map((l) => l.ifindex).sort(), "the pods' veths are the same links");
    const status = JSON.parse((await agentGet(sb.hostPath(SOCKET), '/v1/status')).body) as {
      pods: Array<{ name: string; limits: object }>;
    };
    t.deepEqual(status.pods.map((p) => p.name).sort(), ['plain', 'shaped'], 'the new agent knows both pods');
    t.deepEqual(status.pods.find((p) => p.name === 'shaped')?.limits, { ingress: 20e6, egress: 10e6 });
    t.is((await ctd.cri.containerStatus(x.agent.containerId)).state, 'CONTAINER_RUNNING', `the agent runs from ${newImage}`);
    await runPod('after', {});
    t.true(cidrContains(parseCidr(x.podCidr), pods.get('after')?.ip ?? ''), 'a pod set up by the new agent');
  },
);

serialTest(
  'removing every pod, then the agent, leaves nothing: no veth, reservation, cache entry, record, tc object, rule or container',
  async (t) => {
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
  },
);

// ---- The SBOM beside the archive ----
const SBOM = sbomPath(AGENT_IMAGE_TAR);

/** The archive's one layer, unpacked into a temp dir; its manifest digest. */
async function unpackImage(archive: string): Promise<{ rootfs: string; digest: string; dir: string }> {
  const dir = await mkdtemp(join(tmpdir(), 'kubenet-image-sbom-'));
  await mkdir(join(dir, 'rootfs'));
  await execa('tar', ['-xf', archive, '-C', dir, 'index.json', 'blobs']);
  const index = JSON.parse(await readFile(join(dir, 'index.json'), 'utf8')) as { manifests: Array<{ digest: string }> };
  const digest = index.manifests[0]?.digest ?? '';
  const blob = (d: string) => join(dir, 'blobs', ...d.split(':'));
  const manifest = JSON.parse(await readFile(blob(digest), 'utf8')) as { layers: Array<{ digest: string }> };
  if (manifest.layers.length !== 1) throw new Error(`${archive}: ${manifest.layers.length} layers, expected one`);
  await execa('tar', ['-xzf', blob(manifest.layers[0]?.digest ?? ''), '-C', join(dir, 'rootfs')]);
  return { rootfs: join(dir, 'rootfs'), digest, dir };
}

/** Every regular file under DIR, by its path in the image (/usr/bin/ip); symlinks are not followed. */
async function regularFiles(dir: string, sub = ''): Promise<string[]> {
  const out: string[] = [];
  for (const e of await readdir(join(dir, sub), { withFileTypes: true })) {
    if (e.isDirectory()) out.push(...(await regularFiles(dir, `${sub}/${e.name}`)));
    else if (e.isFile()) out.push(`${sub}/${e.name}`);
  }
  return out.sort();
}

/** purl → its type, namespace/name, version and subpath, decoded. */
function parsePurl(p: string): { type: string; name: string; version?: string; qualifiers: Record<string, string>; subpath?: string } {
  const m = /^pkg:([a-z]+)\/([^@?#]+)(?:@([^?#]+))?(?:\?([^#]*))?(?:#(.*))?$/.exec(p);
  if (!m) throw new Error(`not a purl: ${p}`);
  const dec = (s: string) => s.split('/').map(decodeURIComponent).join('/');
  const qualifiers = Object.fromEntries(
    (m[4] ?? '')
      .split('&')
      .filter(Boolean)
      .map((kv) => kv.split('=').map(decodeURIComponent) as [string, string]),
  );
  return {
    type: m[1] ?? '',
    name: dec(m[2] ?? ''),
    ...(m[3] ? { version: decodeURIComponent(m[3]) } : {}),
    qualifiers,
    ...(m[5] ? { subpath: dec(m[5]) } : {}),
  };
}
const purlOf = (p: SpdxPackage) => parsePurl(p.externalRefs.find((r) => r.referenceType === 'purl')?.referenceLocator ?? '');

/** `go version -m DIR`: each Go binary under DIR → its Go version and modules (a replacement in place of what it replaces). */
async function goVersionM(dir: string): Promise<Map<string, { go: string; modules: string[] }>> {
  const out = new Map<string, { go: string; modules: string[] }>();
  let cur: { go: string; modules: string[] } | undefined;
  for (const line of (await execa(GO, ['version', '-m', dir])).stdout.split('\n')) {
    const head = /^(\S.*): (go\S+)$/.exec(line);
    if (head) {
      cur = { go: head[2] ?? '', modules: [] };
      out.set(`/${relative(dir, head[1] ?? '')}`, cur);
      continue;
    }
    const [, kind, path, version] = line.split('\t');
    if (!cur) continue;
    if (kind === 'mod' || kind === 'dep') cur.modules.push(`${path}@${version}`);
    else if (kind === '=>' && version) cur.modules[cur.modules.length - 1] = `${path}@${version}`;
  }
  return out;
}

(sbomBlocker ? test.skip : test)(
  'the SBOM beside the archive is SPDX 2.3 and names the versions really inside the image: node, every node_modules package, every Go module of each Go binary, every Debian package',
  async (t) => {
    const raw = await readFile(SBOM, 'utf8').catch(() => undefined);
    if (raw === undefined) return t.fail(`no SBOM ${SBOM} beside ${AGENT_IMAGE_TAR} (bash hack/build-image.sh writes it)`);
    const doc = JSON.parse(raw) as SpdxDocument;
    const { rootfs, digest, dir } = await unpackImage(AGENT_IMAGE_TAR);
    t.teardown(() => rm(dir, { recursive: true, force: true }));

    // SPDX 2.3 in shape.
    t.is(doc.spdxVersion, 'SPDX-2.3');
    t.is(doc.dataLicense, 'CC0-1.0');
    t.is(doc.SPDXID, 'SPDXRef-DOCUMENT');
    t.regex(doc.name, /\S/);
    t.notThrows(() => new URL(doc.documentNamespace), 'documentNamespace is a URI');
    t.false(doc.documentNamespace.includes('#'), 'documentNamespace has no #');
    t.true(
      doc.documentNamespace.endsWith(digest.replace(':', '-')),
      `the namespace names this archive's manifest ${digest}: ${doc.documentNamespace}`,
    );
    t.regex(doc.creationInfo.created, /^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$/);
    t.true(
      doc.creationInfo.creators.length > 0 && doc.creationInfo.creators.every((c) => /^(Tool|Organization|Person): \S/.test(c)),
      `creators: ${doc.creationInfo.creators.join(', ')}`,
    );
    const ids = [doc.SPDXID, ...doc.packages.map((p) => p.SPDXID)];
    t.deepEqual(
      ids.filter((id, i) => ids.indexOf(id) !== i),
      [],
      'unique SPDXIDs',
    );
    t.deepEqual(
      ids.filter((id) => !/^SPDXRef-[A-Za-z0-9.-]+$/.test(id)),
      [],
      'SPDXIDs of the form SPDXRef-[A-Za-z0-9.-]+',
    );
    const known = new Set(ids);
    t.deepEqual(
      doc.relationships.filter((r) => !known.has(r.spdxElementId) || !known.has(r.relatedSpdxElement)),
      [],
      'every relationship names elements of the document',
    );
    for (const p of doc.packages) {
      const bad = [
        !p.name && 'name',
        !p.versionInfo && 'versionInfo',
        !/^(NOASSERTION|NONE|https?:\/\/\S+)$/.test(p.downloadLocation) && `downloadLocation ${p.downloadLocation}`,
        !/^(NOASSERTION|(Person|Organization): \S.*)$/.test(p.supplier) && `supplier ${p.supplier}`,
        p.externalRefs.filter((r) => r.referenceCategory === 'PACKAGE-MANAGER' && r.referenceType === 'purl').length !== 1 && 'one purl',
        (p.checksums ?? []).some(
          (c) => !/^[0-9a-f]+$/.test(c.checksumValue) || c.checksumValue.length !== { SHA1: 40, SHA256: 64, SHA512: 128 }[c.algorithm],
        ) && 'checksums',
      ].filter(Boolean);
      t.deepEqual(bad, [], `${p.SPDXID}: ${bad.join(', ')}`);
    }
    // The described package is kubenet-ts at the version the image's package.json says; everything else is in it.
    const app = JSON.parse(await readFile(join(rootfs, 'opt/kubenet/package.json'), 'utf8')) as { name: string; version: string };
    const described = doc.relationships.filter((r) => r.relationshipType === 'DESCRIBES');
    t.is(described.length, 1);
    const root = doc.packages.find((p) => p.SPDXID === described[0]?.relatedSpdxElement);
    t.deepEqual([root?.name, root?.versionInfo, root && purlOf(root).type], [app.name, app.version, 'npm']);
    const contained = new Map<string, string[]>();
    for (const r of doc.relationships.filter((x) => x.relationshipType === 'CONTAINS'))
      contained.set(r.spdxElementId, [...(contained.get(r.spdxElementId) ?? []), r.relatedSpdxElement]);
    const reach = new Set<string>([root?.SPDXID ?? '']);
    for (const id of reach) for (const c of contained.get(id) ?? []) reach.add(c);
    t.deepEqual(
      doc.packages.map((p) => p.SPDXID).filter((id) => !reach.has(id)),
      [],
      `every package is in ${app.name} (CONTAINS)`,
    );
    const ofType = (type: string) => doc.packages.filter((p) => p !== root && purlOf(p).type === type);
    for (const p of doc.packages) {
      const u = purlOf(p);
      // A Go binary is its main package: the main module's purl with the package's subpath.
      t.is(
        u.subpath ? `${u.name}/${u.subpath}` : u.name.split('/').pop(),
        u.subpath ? p.name : p.name.split('/').pop(),
        `${p.SPDXID}: the purl's name`,
      );
    }

    // Node.js: the image's node, run by the image's own loader against the image's libraries.
    const nodeV = (
      await execa(join(rootfs, 'usr/lib64/ld-linux-x86-64.so.2'), [
        '--library-path',
        join(rootfs, 'usr/lib/x86_64-linux-gnu'),
        join(rootfs, 'usr/local/bin/node'),
        '--version',
      ])
    ).stdout.trim();
    const node = ofType('generic').filter((p) => p.name === 'node');
    t.deepEqual(
      node.map((p) => `v${p.versionInfo}`),
      [nodeV],
      `node ${nodeV}`,
    );
    t.is(node[0] && purlOf(node[0]).version, nodeV.slice(1));

    // npm: every package.json directly under a node_modules (or node_modules/@scope) in the image.
    const appFiles = await regularFiles(join(rootfs, 'opt/kubenet'));
    const inImage = new Set<string>();
    for (const f of appFiles.filter((x) => /\/node_modules\/(@[^/]+\/)?[^/@][^/]*\/package\.json$/.test(x))) {
      const pj = JSON.parse(await readFile(join(rootfs, 'opt/kubenet', f), 'utf8')) as { name: string; version: string };
      inImage.add(`${pj.name}@${pj.version}`);
    }
    const npm = ofType('npm');
    t.deepEqual(
      npm.map((p) => `${p.name}@${p.versionInfo}`).sort(),
      [...inImage].sort(),
      "the SBOM's npm packages are the image's node_modules",
    );
    t.deepEqual(
      npm.filter((p) => `${purlOf(p).name}@${purlOf(p).version}` !== `${p.name}@${p.versionInfo}`).map((p) => p.SPDXID),
      [],
      'each npm purl names its package',
    );
    t.true(inImage.size > 10, `${inImage.size} npm packages`);

    // Go: `go version -m` on the whole image finds the Go binaries; each one's package CONTAINS exactly its modules and stdlib.
    const gov = await goVersionM(rootfs);
    const bins = ofType('golang').filter((p) => p.packageFileName);
    t.deepEqual(bins.map((p) => p.packageFileName).sort(), [...gov.keys()].sort(), 'one package per Go binary in the image');
    t.true(gov.size >= 5, `Go binaries: ${[...gov.keys()].join(' ')}`);
    const byId = new Map(doc.packages.map((p) => [p.SPDXID, p]));
    for (const b of bins) {
      const want = gov.get(b.packageFileName ?? '');
      const data = await readFile(join(rootfs, b.packageFileName ?? ''));
      t.is(
        b.checksums?.find((c) => c.algorithm === 'SHA256')?.checksumValue,
        createHash('sha256').update(data).digest('hex'),
        `${b.packageFileName}: its SHA256`,
      );
      const mods = (contained.get(b.SPDXID) ?? []).map((id) => byId.get(id)).filter((p): p is SpdxPackage => p !== undefined);
      t.true(
        mods.every((p) => purlOf(p).type === 'golang'),
        `${b.packageFileName}: golang packages only`,
      );
      t.deepEqual(
        mods.map((p) => `${p.name}@${p.versionInfo}`).sort(),
        [...(want?.modules ?? []), `stdlib@${want?.go}`].sort(),
        `${b.packageFileName}: the modules go version -m reports`,
      );
      t.is<string | undefined, string | undefined>(
        b.versionInfo,
        want?.modules[0]?.split('@')[1],
        `${b.packageFileName}: its main module's version`,
      );
    }

    // Debian: every file of the image that is not ours (app, node, the CNI plugins, passwd/group, the
    // records themselves) is, by its md5, a file of a package recorded in status.d; those packages are
    // the SBOM's, at the recorded versions.
    const statusDir = join(rootfs, 'var/lib/dpkg/status.d');
    const records = new Map<string, { version: string; arch: string; md5s: Set<string> }>();
    for (const name of (await readdir(statusDir)).filter((n) => !n.includes('.'))) {
      const f = controlFields(await readFile(join(statusDir, name), 'utf8'));
      const sums = await readFile(join(statusDir, `${name}.md5sums`), 'utf8').catch(() => '');
      const md5s = new Set(
        [...sums.split('\n'), ...(f.get('Conffiles') ?? '').split('\n')]
          .map((l) => /\b([0-9a-f]{32})\b/.exec(l)?.[1])
          .filter((x): x is string => x !== undefined),
      );
      records.set(f.get('Package') ?? name, { version: f.get('Version') ?? '', arch: f.get('Architecture') ?? '', md5s });
    }
    const ours = /^\/(opt\/kubenet\/|usr\/local\/bin\/|usr\/lib\/cni\/|var\/lib\/dpkg\/status\.d\/|etc\/(passwd|group)$)/;
    const debianFiles = (await regularFiles(rootfs)).filter((f) => !ours.test(f));
    const owners = new Set<string>();
    const orphans: string[] = [];
    for (const f of debianFiles) {
      const md5 = createHash('md5')
        .update(await readFile(join(rootfs, f)))
        .digest('hex');
      const own = [...records].filter(([, r]) => r.md5s.has(md5)).map(([n]) => n);
      if (own.length === 0) orphans.push(f);
      for (const n of own) owners.add(n ?? '');
    }
    t.deepEqual(orphans, [], 'every Debian file of the image is a file of a recorded package (by md5)');
    t.deepEqual([...owners].sort(), [...records.keys()].sort(), 'every recorded package has a file in the image');
    t.true(debianFiles.length > 50 && records.size > 10, `${debianFiles.length} Debian files of ${records.size} packages`);
    const deb = ofType('deb');
    t.deepEqual(
      deb.map((p) => `${p.name}=${p.versionInfo}`).sort(),
      [...records].map(([n, r]) => `${n}=${r.version}`).sort(),
      "the SBOM's Debian packages at the recorded versions",
    );
    t.deepEqual(
      deb
        .map((p) => purlOf(p))
        .map((u) => `${u.name}=${u.version}:${u.qualifiers.arch}`)
        .sort(),
      [...records].map(([n, r]) => `debian/${n}=${r.version}:${r.arch}`).sort(),
      'pkg:deb/debian/NAME@VERSION?arch=ARCH',
    );
    t.log(
      `SBOM: ${npm.length} npm, ${deb.length} deb, ${ofType('golang').length - bins.length} Go modules in ${bins.length} binaries, node ${nodeV}`,
    );
  },
);
