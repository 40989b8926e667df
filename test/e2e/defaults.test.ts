/**
 * The literal defaults (issue 8): the agent runs with exactly the YAML of manifests/kubenet.yaml's
 * ConfigMap (read from the manifest, not copied) and no directory flag, in cluster mode (a fake API
 * server serves its Node's pod CIDR; `--kubeconfig`, NODE_NAME), inside a NodeSandbox whose tmpfs
 * mounts cover /var/lib/cni, /var/lib/kubenet, /etc/cni/net.d, /opt/cni/bin and /run/kubenet, so
 * nothing of the host is touched; the reference plugins are where the DaemonSet image holds them
 * (/usr/lib/cni: the sandbox bind-mounts the pinned release hack/build-upstream.sh built there). The bridge is literally cbr0 and the ifb
 * kubenet-ifb0: they live in the sandbox's node netns, never the machine's.
 *
 * Pods (network namespaces made with `ip netns add`) go through libcni run inside the node as
 * containerd runs it: conf dir /etc/cni/net.d, bin dir /opt/cni/bin, and libcni's OWN default cache
 * dir (the driver's --default-cache-dir: NewCNIConfig, libcni.CacheDir = /var/lib/cni). A plain pod,
 * a shaped pod (containerd 1.6's PascalCase runtimeConfig.bandwidth, bursts 4294967295) and a
 * host-port pod: ADD, CHECK, an agent restart, CHECK, DEL, DEL again with an empty CNI_NETNS.
 * Sends no traffic.
 */
import anyTest, { type TestFn } from 'ava';
import { execa } from 'execa';
import { createHash, randomInt } from 'node:crypto';
import { existsSync } from 'node:fs';
import { readFile, stat } from 'node:fs/promises';
import { join } from 'node:path';
import { agentGet } from '../../src/daemon/protocol.js';
import { parseExposition, samplesOf } from '../../src/cli/prom-text.js';
import { FORWARDER } from '../kit/agent-harness.js';
import { startManifestAgent, type ManifestAgent } from '../kit/agent-process.js';
import { pod as podObject } from '../kit/fake-apiserver.js';
import { NO_LEFTOVERS, podLeftovers, type NodeLayout } from '../kit/node-leaks.js';
import { refPlugin } from '../kit/upstream.js';
import { inCidr4, LIBCNI_DEFAULT_CACHE_DIR, resultIp, SandboxWorld, sandboxTestBlocker } from '../kit/sandbox-libcni.js';
import type { TestPod } from '../kit/test-pod.js';
import { redirectTarget, shardIfbs } from '../kit/shards.js';

const blocker = sandboxTestBlocker();
const test = anyTest as TestFn;
const serialTest = blocker ? test.serial.skip : test.serial;
if (blocker) console.warn(`literal-defaults e2e skipped: ${blocker}`);

/** What the tests share besides the world. */
interface Defaults {
  node: ManifestAgent;
  podCidr: string;
  hostPort: number;
  layout: NodeLayout;
  plain: TestPod;
  shaped: TestPod;
  web: TestPod;
  /** sha256 and mtime of each pod's libcni cache entry right after its ADD. */
  cacheEntries: Map<TestPod, { sha: string; mtimeMs: number } | undefined>;
}

let world: SandboxWorld | undefined;
let defaults: Defaults | undefined;
function w(): SandboxWorld {
  if (!world) throw new Error('no node: the setup (before hook) failed');
  return world;
}
function shared(): Defaults {
  if (!defaults) throw new Error('no node: the setup (before hook) failed');
  return defaults;
}
const pods = () => [shared().plain, shared().shaped, shared().web];

/** Every file under the sandbox's `dir` (relative paths, sorted; directories end in /). */
async function tree(dir: string): Promise<string[]> {
  const r = await w().sb.exec('find', [dir, '-mindepth', '1', '-printf', '%P%y\\n']);
  return r.stdout
    .split('\n')
    .filter((l) => l !== '')
    .map((l) => (l.endsWith('d') ? `${l.slice(0, -1)}/` : l.slice(0, -1)))
    .sort();
}

function runtimeCacheFile(p: TestPod): string {
  return w().sb.hostPath(join(LIBCNI_DEFAULT_CACHE_DIR, 'results', `kubenet-${p.id}-eth0`));
}

async function cacheEntryStamp(p: TestPod): Promise<{ sha: string; mtimeMs: number } | undefined> {
  const file = runtimeCacheFile(p);
  try {
    const [text, st] = await Promise.all([readFile(file), stat(file)]);
    return { sha: createHash('sha256').update(text).digest('hex'), mtimeMs: st.mtimeMs };
  } catch {
    return undefined;
  }
}

test.before(async (t) => {
  if (blocker) return;
  t.timeout(90_000);
  const podCidr = `10.${randomInt(100, 200)}.${randomInt(256)}.0/24`;
  // As containerd runs libcni: its conf dir and bin dir, libcni's own default cache dir.
  world = await SandboxWorld.create({ prefix: 'kch', libcni: () => ({ confDir: '/etc/cni/net.d', binDirs: ['/opt/cni/bin'] }) });
  const sb = world.sb;
  const nodeName = `kch-node-${world.tag}`;
  const node = await startManifestAgent(sb, world.cleanup, { nodeName, podCidr });
  world.agent = node.agent;
  const s = node.settings;
  t.log(`node netns ${sb.netns}, pod CIDR ${podCidr}, agent pid ${node.agent.pid}, manifest config:\n${node.configText.trimEnd()}`);
  const hostPort = randomInt(30000, 32768);
  const plain = await world.newPod('plain');
  const shaped = await world.newPod('shaped');
  // containerd 1.6 passes the bandwidth annotations PascalCase, with burst 4294967295 for "none given".
  shaped.runtimeConfig = {
    bandwidth: { IngressRate: 20_000_000, IngressBurst: 4294967295, EgressRate: 10_000_000, EgressBurst: 4294967295 },
  };
  const web = await world.newPod('web');
  web.runtimeConfig = { portMappings: [{ HostPort: hostPort, ContainerPort: 8080, Protocol: 'tcp', HostIP: '' }] };
  for (const p of [plain, shaped, web]) {
    // As kubelet would have it: the pod exists in the API (the shaped one with its annotations).
    node.api.setPod(
      podObject(
        p.namespace,
        p.name,
        nodeName,
        p === shaped ? { 'kubernetes.io/ingress-bandwidth': '20M', 'kubernetes.io/egress-bandwidth': '10M' } : {},
      ),
    );
  }
  const layout: NodeLayout = {
    bridgeName: s.bridgeName,
    ifbName: s.ifbName,
    ipamDataDir: s.ipamDataDir,
    stateDir: s.stateDir,
    runtimeCacheDir: LIBCNI_DEFAULT_CACHE_DIR,
  };
  defaults = { node, podCidr, hostPort, layout, plain, shaped, web, cacheEntries: new Map() };
});

test.afterEach.always(async (t) => {
  if (!t.passed && defaults) t.log(`agent log (tail):\n${await defaults.node.agent.logTail(40)}`);
});

test.after.always(async () => {
  // A test that failed midway: DEL what may be left, so the node holds nothing when it goes.
  if (world && defaults) for (const p of pods()) await world.libcni.call('del', p, { netns: '' }).catch(() => undefined);
  await world?.destroy();
});

serialTest(
  'the manifest config, no directory flag: the agent installs kubenet + loopback in /opt/cni/bin and the conflist in /etc/cni/net.d; its own files are under /var/lib/kubenet and /run/kubenet only',
  async (t) => {
    const { node } = shared();
    const s = node.settings;
    t.deepEqual(
      {
        bridge: s.bridgeName,
        ifb: s.ifbName,
        cniBinDir: s.cniBinDir,
        cniConfDir: s.cniConfDir,
        pluginBinDirs: s.pluginBinDirs,
        stateDir: s.stateDir,
        ipam: s.ipamDataDir,
        cache: s.cniCacheDir,
        socket: s.socket,
      },
      {
        bridge: 'cbr0',
        ifb: 'kubenet-ifb0',
        cniBinDir: '/opt/cni/bin',
        cniConfDir: '/etc/cni/net.d',
        pluginBinDirs: ['/usr/lib/cni'],
        stateDir: '/var/lib/kubenet',
        ipam: '/var/lib/cni/networks',
        cache: '/var/lib/cni',
        socket: '/run/kubenet/kubenet.sock',
      },
      'the manifest config holds the literal defaults',
    );
    t.deepEqual(
      await tree('/opt/cni/bin'),
      ['kubenet', 'loopback'],
      '/opt/cni/bin: the forwarder as kubenet, and loopback for the runtime',
    );
    t.deepEqual(
      await readFile(w().sb.hostPath('/opt/cni/bin/kubenet')),
      await readFile(FORWARDER),
      '/opt/cni/bin/kubenet is the forwarding binary',
    );
    t.deepEqual(
      await readFile(w().sb.hostPath('/opt/cni/bin/loopback')),
      await readFile(refPlugin('loopback')),
      '/opt/cni/bin/loopback is the reference plugin',
    );
    t.deepEqual(await tree('/etc/cni/net.d'), ['10-kubenet.conflist']);
    const conflist = JSON.parse(await readFile(w().sb.hostPath('/etc/cni/net.d/10-kubenet.conflist'), 'utf8')) as {
      name: string;
      plugins: Array<{ type: string; socket: string; capabilities: object }>;
    };
    t.like(conflist, {
      name: 'kubenet',
      plugins: [{ type: 'kubenet', socket: '/run/kubenet/kubenet.sock', capabilities: { bandwidth: true, portMappings: true } }],
    });
    t.deepEqual(await tree('/run/kubenet'), ['kubenet.sock', 'kubenet.sock.ipam'], '/run/kubenet: the sockets (CNI API, IPAM shim)');
    t.deepEqual(await tree('/var/lib/cni'), [], 'nothing in /var/lib/cni before a pod');
    const state = await tree('/var/lib/kubenet');
    t.true(
      state.every((f) => /^(pods|shaper)(\/|$)|^installed-loopback$/.test(f)),
      `/var/lib/kubenet holds pods/, shaper/ and the note of the loopback copy only: ${state.join(' ')}`,
    );
    t.deepEqual(await podLeftovers(w().sb, shared().layout), NO_LEFTOVERS, 'no pod state yet');
  },
);

serialTest(
  'ADD through libcni with its default cache dir: IPs from the pod CIDR; libcni writes its own kubenet-<id>-eth0; limits and the host port applied; CHECK passes',
  async (t) => {
    const { sb, libcni } = w();
    const { podCidr, shaped, web, hostPort, node, cacheEntries } = shared();
    for (const p of pods()) {
      t.false(existsSync(runtimeCacheFile(p)), `${p.name}: no cache entry before ADD`);
      const r = await libcni.call('add', p);
      t.is(r.exitCode, 0, `ADD ${p.name}: ${r.stderr}`);
      p.ip = resultIp(r.stdout);
      t.true(inCidr4(p.ip, podCidr), `${p.name}: IP ${p.ip} in the pod CIDR ${podCidr}`);
      const addr = (await execa('ip', ['-n', p.netns, '-o', '-4', 'addr', 'show', 'dev', 'eth0'])).stdout;
      t.true(addr.includes(` ${p.ip}/24 `), `${p.name}: eth0 in its netns holds ${p.ip}`);
      // libcni's own entry, written by libcni after our ADD returned: its config is the conflist, its result ours.
      const entry = JSON.parse(await readFile(runtimeCacheFile(p), 'utf8')) as {
        kind: string;
        containerId: string;
        ifName: string;
        networkName: string;
        config: string;
        result: { ips: Array<{ address: string }> };
      };
      t.like(entry, { kind: 'cniCacheV1', containerId: p.id, ifName: 'eth0', networkName: 'kubenet' });
      t.like(
        JSON.parse(Buffer.from(entry.config, 'base64').toString('utf8')),
        { name: 'kubenet', plugins: [{ type: 'kubenet' }] },
        `${p.name}: the cached config is the conflist libcni ran`,
      );
      t.is(entry.result.ips[0]?.address.split('/')[0], p.ip, `${p.name}: the cached result is the one ADD returned`);
      cacheEntries.set(p, await cacheEntryStamp(p));
    }
    t.is(new Set(pods().map((p) => p.ip)).size, 3, 'three distinct IPs');

    // Everything the pods made, and where: the runtime's cache and host-local's reservations under
    // /var/lib/cni, the agent's records under /var/lib/kubenet.
    const cniTree = await tree('/var/lib/cni');
    const allowed = new Set([
      'networks/',
      'networks/kubenet/',
      'networks/kubenet/lock',
      'results/',
      ...pods().flatMap((p) => [`networks/kubenet/${p.ip}`, `results/kubenet-${p.id}-eth0`]),
    ]);
    t.deepEqual(
      cniTree.filter((f) => !allowed.has(f) && !/^networks\/kubenet\/last_reserved_ip\.\d$/.test(f)),
      [],
      `/var/lib/cni holds host-local's reservations and libcni's entries only: ${cniTree.join(' ')}`,
    );
    const records = (await tree('/var/lib/kubenet/pods')).sort();
    t.deepEqual(
      records,
      pods()
        .map((p) => `${p.id}@eth0.json`)
        .sort(),
      'one agent record per pod, under /var/lib/kubenet/pods',
    );
    t.deepEqual(await tree('/opt/cni/bin'), ['kubenet', 'loopback'], 'nothing else in /opt/cni/bin');
    t.deepEqual(await tree('/run/kubenet'), ['kubenet.sock', 'kubenet.sock.ipam'], 'nothing else in /run/kubenet');

    // The shaped pod, in the node's trees (the sandbox's uplink reports a link speed: the node has a
    // capacity): its veth's root redirects to the ingress tree's ifb, where its class has the ingress
    // ceiling; its class on the egress ifb has the egress ceiling.
    const status = JSON.parse((await agentGet(sb.hostPath(node.settings.socket), '/v1/status')).body) as {
      pods: Array<{ id: string; hostVeth: string; limits: object; portMappings?: Array<{ hostPort: number }> }>;
    };
    const shapedStatus = status.pods.find((p) => p.id === shaped.id);
    t.deepEqual(
      shapedStatus?.limits,
      { ingress: 20e6, egress: 10e6 },
      'the agent took the PascalCase rates (burst 4294967295: none given)',
    );
    const veth = shapedStatus?.hostVeth ?? 'none';
    t.regex((await sb.exec('tc', ['qdisc', 'show', 'dev', veth])).stdout, /qdisc htb 2: root/, 'a root qdisc on the pod veth');
    // Each direction's tree is split over shards (src/shaper/shard-names.ts): the pod's veth names its own.
    const run = async (cmd: string, args: string[]) => (await sb.exec(cmd, args)).stdout;
    const inShard = redirectTarget(await run('tc', ['filter', 'show', 'dev', veth, 'parent', '2:'])) ?? 'none';
    t.true((await shardIfbs(run, 'ingress')).includes(inShard), `traffic to the pod goes to an ingress shard: ${inShard}`);
    t.regex(
      await run('tc', ['class', 'show', 'dev', inShard]),
      /class htb 1:\S+ parent 1:fffe .*ceil 20Mbit/,
      `ingress ceiling 20Mbit on ${inShard}`,
    );
    const egShard = redirectTarget(await run('tc', ['filter', 'show', 'dev', veth, 'parent', 'ffff:'])) ?? 'none';
    t.true((await shardIfbs(run, 'egress')).includes(egShard), `the pod's egress goes to an egress shard: ${egShard}`);
    t.regex(
      await run('tc', ['class', 'show', 'dev', egShard]),
      /class htb 1:\S+ parent 1:fffe .*ceil 10Mbit/,
      `egress ceiling 10Mbit on ${egShard}`,
    );
    // /metrics: each shard's share of the capacity, adding up to it, one series per shard each way.
    const families = parseExposition((await agentGet(sb.hostPath(node.settings.socket), '/metrics')).body);
    for (const dir of ['egress', 'ingress'] as const) {
      const capacity = samplesOf(families, 'kubenet_node_bandwidth_capacity_bits_per_second', { direction: dir })[0]?.value ?? NaN;
      const shares = samplesOf(families, 'kubenet_node_bandwidth_share_bits_per_second', { direction: dir });
      t.deepEqual(shares.map((x) => x.labels.shard).sort(), (await shardIfbs(run, dir)).sort(), `${dir}: a share per shard`);
      const sum = shares.reduce((a, x) => a + x.value, 0);
      t.true(sum <= capacity && sum >= capacity * 0.999, `${dir}: the shares add up to the capacity: ${sum} of ${capacity}`);
    }
    t.deepEqual(
      status.pods.find((p) => p.id === web.id)?.portMappings?.map((m) => m.hostPort),
      [hostPort],
      'the agent took the host port',
    );
    t.true(
      (await sb.exec('iptables', ['-w', '5', '-t', 'nat', '-S'])).stdout.includes(`--to-destination ${web.ip}:8080`),
      `a DNAT rule for host port ${hostPort}`,
    );

    for (const p of pods()) {
      const r = await libcni.call('check', p);
      t.is(r.exitCode, 0, `CHECK ${p.name}: ${r.stderr}`);
    }
  },
);

serialTest("an agent restart (SIGTERM, start) leaves libcni's entries untouched; CHECK still passes", async (t) => {
  const { libcni } = w();
  const { node, cacheEntries } = shared();
  t.is(await node.agent.stop(), 0, 'the agent exits 0 on SIGTERM');
  // The agent reads cniCacheDir (/var/lib/cni) once at startup to upgrade 0.1.0 state: never a runtime's entry.
  await node.agent.start();
  for (const p of pods()) {
    t.deepEqual(await cacheEntryStamp(p), cacheEntries.get(p), `${p.name}: libcni's entry unchanged (content and mtime)`);
    const r = await libcni.call('check', p);
    t.is(r.exitCode, 0, `CHECK ${p.name} after the restart: ${r.stderr}`);
    t.deepEqual(await cacheEntryStamp(p), cacheEntries.get(p), `${p.name}: libcni's entry unchanged after CHECK`);
  }
});

serialTest('DEL, then DEL again with an empty CNI_NETNS (as containerd on Stop and Remove): nothing of any pod is left', async (t) => {
  const { libcni, sb } = w();
  const { layout, cacheEntries } = shared();
  for (const p of pods()) {
    t.deepEqual(await cacheEntryStamp(p), cacheEntries.get(p), `${p.name}: libcni's entry untouched until its DEL`);
    const first = await libcni.call('del', p);
    t.is(first.exitCode, 0, `DEL ${p.name}: ${first.stderr}`);
    t.false(existsSync(runtimeCacheFile(p)), `${p.name}: libcni removed its entry on DEL`);
    await execa('ip', ['netns', 'del', p.netns]);
    const second = await libcni.call('del', p, { netns: '' });
    t.is(second.exitCode, 0, `second DEL ${p.name} (empty CNI_NETNS): ${second.stderr}`);
  }
  const left = await podLeftovers(sb, layout);
  t.deepEqual(
    left,
    NO_LEFTOVERS,
    'no veth, reservation, libcni entry, agent record, shaper state, tc class/filter, veth qdisc or host-port rule',
  );
  t.deepEqual((await sb.exec('ip', ['-o', 'link', 'show', 'master', 'cbr0'])).stdout, '', 'no port on cbr0');
  t.deepEqual(await tree('/var/lib/kubenet/pods'), [], 'no record under /var/lib/kubenet/pods');
  t.deepEqual(
    (await tree('/var/lib/cni')).filter(
      (f) => !/^(networks\/|networks\/kubenet\/|networks\/kubenet\/lock|networks\/kubenet\/last_reserved_ip\.\d|results\/)$/.test(f),
    ),
    [],
    "only empty dirs and host-local's lock/last-reserved files in /var/lib/cni",
  );
  const status = JSON.parse((await agentGet(sb.hostPath(shared().node.settings.socket), '/v1/status')).body) as { pods: unknown[] };
  t.deepEqual(status.pods, [], 'the agent knows no pod');
});
