/**
 * The node agent end to end: started on a static pod CIDR with temporary CNI dirs, driven through
 * the conflist it writes and the CNI binary it installs, by the reference runtime library (libcni)
 * exactly as containerd 1.6 drives it (CNI_ARGS, PascalCase runtimeConfig.bandwidth with the
 * uint32-max "no burst", DEL twice with the second CNI_NETNS empty), and by direct execs for what
 * libcni 1.1 cannot send (STATUS, GC, bad input). Traffic only between the test's own namespaces.
 */
import anyTest, { type TestFn } from 'ava';
import { execa } from 'execa';
import { mkdtemp, readFile, rm, stat, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { PodCidrSource } from '../../src/daemon/pod-cidr/source.js';
import { agentPost } from '../../src/daemon/protocol.js';
import { linkDeletionCounts } from '../../src/netlink/index.js';
import type { Logger } from '../../src/log.js';
import { pino } from 'pino';
import { NodeWatchPodCidrSource } from '../../src/daemon/pod-cidr/node-watch.js';
import { ClusterPodLookup } from '../../src/daemon/cluster/pod-lookup.js';
import { createLogger } from '../../src/log.js';
import { FakeApiServer, fakeKubeConfig, node, pod as podObject } from '../kit/fake-apiserver.js';
import { AgentHarness, agentTestBlocker, postCni } from '../kit/agent-harness.js';
import { cniArgs, type TestPod } from '../kit/test-pod.js';
import { CNI_BIN_DIRS, ipJson, kernelTestBlocker, linkExists } from '../kit/kernel.js';
import { iperf, retryLog, type TopoPod } from '../kit/topo.js';
import { podLeaves } from '../kit/node-leaks.js';

const blocker = kernelTestBlocker() ?? agentTestBlocker();
const test = anyTest as TestFn;
const serialTest = blocker ? test.serial.skip : test.serial;
if (blocker) console.warn(`agent e2e tests skipped: ${blocker}`);

const MBIT = 1e6;
const UINT32_MAX = 4294967295;

interface CniResultJson {
  cniVersion: string;
  ips: Array<{ address: string; gateway?: string }>;
  interfaces: Array<{ name: string; sandbox?: string }>;
}

interface StatusJson {
  podCIDR: string;
  bridge: string;
  ready: boolean;
  pods: Array<{
    namespace: string;
    name: string;
    id: string;
    ips: string[];
    limits: { ingress?: number; egress?: number };
    portMappings?: unknown[];
  }>;
}

async function status(h: AgentHarness): Promise<StatusJson> {
  const r = await h.get('/v1/status');
  return JSON.parse(r.body) as StatusJson;
}

function podIp(result: CniResultJson): string {
  return result.ips[0]?.address.split('/')[0] ?? '';
}

async function addOk(
  t: { is: (a: unknown, b: unknown, m?: string) => void },
  h: AgentHarness,
  pod: TestPod,
  runtimeConfig?: object,
): Promise<CniResultJson> {
  const r = await h.libcni('add', pod, runtimeConfig ? { runtimeConfig } : {});
  t.is(r.exitCode, 0, `libcni ADD ${pod.name}: ${r.stderr}`);
  return JSON.parse(r.stdout) as CniResultJson;
}

/** An agent harness on its own pod CIDR, cleaned up when the test ends (failed or not). */
async function harness(t: import('ava').ExecutionContext, podCidr: string): Promise<AgentHarness> {
  const h = await new AgentHarness().setup(podCidr);
  t.teardown(() => h.cleanup.run());
  return h;
}

/** `tc class show` of the agent's shared ifb ('' when it does not exist). */
/** The pods' leaf qdiscs on the ifb (node-leaks.ts podLeaves). */
async function ifbLeaves(h: AgentHarness): Promise<string[]> {
  return podLeaves((await execa('tc', ['qdisc', 'show', 'dev', h.ifb], { reject: false })).stdout.split('\n'));
}

async function ifbClasses(h: AgentHarness): Promise<string> {
  return (await execa('tc', ['class', 'show', 'dev', h.ifb], { reject: false })).stdout;
}

/** The bridge's ports; none when the bridge was never made. */
async function bridgePorts(h: AgentHarness): Promise<unknown[]> {
  return (await linkExists(h.bridge)) ? ipJson(['link', 'show', 'master', h.bridge]) : [];
}

/** Nothing of any pod left: no veth on the bridge, no address, no cache entry, no state. */
async function assertNothingLeft(t: import('ava').ExecutionContext, h: AgentHarness): Promise<void> {
  t.deepEqual(await bridgePorts(h), [], 'no veth on the bridge');
  t.deepEqual(await h.reservedIps(), [], 'no address reserved');
  t.deepEqual(await h.agentCacheEntries(), [], 'no agent CNI cache entry');
  t.deepEqual(await h.libcniCacheEntries(), [], 'no libcni cache entry');
  t.deepEqual(await h.podStateFiles(), [], 'no pod state file');
  t.deepEqual((await status(h)).pods, []);
}

serialTest('writes the conflist and installs the binary; libcni ADD, CHECK, DEL, DEL with empty CNI_NETNS leave nothing', async (t) => {
  const h = await harness(t, '10.93.1.0/24');
  const agent = await h.startAgent();

  // What a runtime finds: a 0600 socket, a 0755 binary named kubenet, the conflist.
  t.is((await stat(h.config.socket)).mode & 0o777, 0o600);
  t.is((await stat(join(h.config.cniBinDir, 'kubenet'))).mode & 0o777, 0o755);
  const conflist = JSON.parse(await readFile(join(h.config.cniConfDir, '10-kubenet.conflist'), 'utf8')) as {
    name: string;
    cniVersion: string;
    plugins: Array<{ type: string; socket: string; capabilities: Record<string, boolean> }>;
  };
  t.is(conflist.name, 'kubenet');
  t.is(conflist.cniVersion, '1.0.0');
  t.deepEqual(conflist.plugins, [{ type: 'kubenet', socket: h.config.socket, capabilities: { bandwidth: true, portMappings: true } }]);
  t.is((await h.get('/healthz')).status, 200);

  const a = await h.addPod('a');
  const b = await h.addPod('b');
  const ra = await addOk(t, h, a);
  const rb = await addOk(t, h, b);
  // libcni (1.3) runs the highest version of the conflist's cniVersions it supports.
  t.is(ra.cniVersion, '1.1.0');
  t.regex(ra.ips[0]?.address ?? '', /^10\.93\.1\.\d+\/24$/);
  t.is(ra.ips[0]?.gateway, '10.93.1.1');
  t.not(podIp(ra), podIp(rb));
  t.true(
    ra.interfaces.some((i) => i.name === 'eth0' && i.sandbox === a.netnsPath),
    'result names the pod interface and its netns',
  );
  const addrs = await ipJson<Array<{ addr_info: Array<{ local: string }> }>>(['-n', a.netns, 'addr', 'show', 'dev', 'eth0']);
  t.true(
    addrs[0]?.addr_info.some((x) => x.local === podIp(ra)),
    'the address is on eth0 in the pod',
  );
  const ping = await execa('ip', ['netns', 'exec', a.netns, 'ping', '-c', '1', '-W', '2', podIp(rb)], { reject: false });
  t.is(ping.exitCode, 0, `pod a reaches pod b: ${ping.stdout}`);

  t.is((await h.libcni('check', a)).exitCode, 0, 'CHECK passes');
  const st = await status(h);
  t.is(st.podCIDR, '10.93.1.0/24');
  t.is(st.bridge, h.bridge);
  t.deepEqual(
    st.pods.map((p) => [p.namespace, p.name, p.ips]).sort(),
    [
      ['default', 'a', [podIp(ra)]],
      ['default', 'b', [podIp(rb)]],
    ],
    'status shows the pods named by K8S_POD_NAMESPACE / K8S_POD_NAME',
  );
  const metrics = (await h.get('/metrics')).body;
  t.regex(metrics, /^kubenet_pods 2$/m);
  t.regex(metrics, /^kubenet_cni_add_seconds_count 2$/m);
  // The same on the agent's TCP port (metricsAddress; the harness's 127.0.0.1:0), and nothing else there.
  const url = agent.metricsUrl() ?? '';
  t.regex(url, /^http:\/\/127\.0\.0\.1:\d+$/);
  const tcp = await fetch(`${url}/metrics`);
  t.is(tcp.status, 200);
  const tcpText = await tcp.text();
  t.regex(tcpText, /^kubenet_pods 2$/m);
  t.regex(tcpText, /^kubenet_cni_add_seconds_count 2$/m);
  t.is((await fetch(`${url}/healthz`)).status, 200);
  for (const path of ['/v1/status', '/v1/cni']) t.is((await fetch(`${url}${path}`)).status, 404, `${path} is the socket's only`);
  t.is((await fetch(`${url}/v1/cni`, { method: 'POST', body: '{}' })).status, 404);

  // CHECK after the pod lost its address fails.
  await execa('ip', ['-n', a.netns, 'addr', 'flush', 'dev', 'eth0']);
  const badCheck = await h.libcni('check', a);
  t.not(badCheck.exitCode, 0, 'CHECK fails once the address is gone');
  t.regex(badCheck.stderr, new RegExp(podIp(ra).replace(/\./g, '\\.')));

  for (const p of [a, b]) {
    const del = await h.libcni('del', p);
    t.is(del.exitCode, 0, del.stderr);
    // containerd's second DEL comes with CNI_NETNS empty.
    const again = await h.libcni('del', p, { netns: '' });
    t.is(again.exitCode, 0, again.stderr);
  }
  t.false(await linkExists('eth0', a.netns));
  await assertNothingLeft(t, h);
  t.regex((await h.get('/metrics')).body, /^kubenet_cni_del_seconds_count 4$/m);
});

serialTest(
  "libcni in one runtime process, as containerd calls it (libcni-driver batch, the burst bench's runtime): concurrent ADDs and DELs, one failure kept to its pod",
  async (t) => {
    const h = await harness(t, '10.93.24.0/24');
    await h.startAgent();
    const pods = [];
    for (const name of ['p0', 'p1', 'p2', 'p3', 'p4']) pods.push(await h.addPod(name));
    // A pod whose netns path does not exist: its ADD fails, the others do not notice.
    const lost = { ...(await h.addPod('lost')), netnsPath: '/var/run/netns/kubenet-no-such-netns' };
    const added = await h.libcniBatch('add', [...pods, lost], 3);
    t.is(added.exitCode, 1, 'one request failed: exit 1');
    t.regex(added.stderr, /1 of 6 requests failed/);
    t.is(added.answers.length, 6, 'one answer per request');
    t.regex(added.answers[5]?.error ?? '', /kubenet-no-such-netns/);
    const ips = pods.map((_, i) => added.answers[i]?.result?.ips?.[0]?.address.split('/')[0] ?? '');
    for (const [i, ip] of ips.entries()) t.regex(ip, /^10\.93\.24\.\d+$/, `pod ${i}: ${added.answers[i]?.error ?? ''}`);
    t.is(new Set(ips).size, pods.length, 'distinct addresses');
    t.true(
      (added.wallMs ?? 0) > 0 && added.answers.every((a) => a.endMs >= a.startMs && a.endMs <= (added.wallMs ?? 0) + 0.001),
      'times within the batch',
    );
    // At most 3 in flight at once: at any call's start, fewer than 3 others had started and not ended.
    for (const a of added.answers) t.true(added.answers.filter((b) => b !== a && b.startMs <= a.startMs && b.endMs > a.startMs).length < 3);
    t.deepEqual((await status(h)).pods.map((p) => p.ips[0]).sort(), [...ips].sort());

    const before = linkDeletionCounts();
    const deleted = await h.libcniBatch('del', [...pods, lost], 3);
    t.is(deleted.exitCode, 0, deleted.stderr);
    t.true(deleted.answers.every((a) => !a.error));
    const after = linkDeletionCounts();
    // Whether DELs in flight together shared a request depends on their timing: shown, not asserted
    // (test/netlink/index.test.ts asserts the batching itself).
    t.log(`veths deleted: ${after.links - before.links} in ${after.requests - before.requests} kernel request(s)`);
    t.is(after.links - before.links, pods.length, 'one veth deletion per attached pod');
    await assertNothingLeft(t, h);
  },
);

serialTest("runtimeConfig bandwidth in containerd's PascalCase with a uint32-max burst is enforced both ways", async (t) => {
  const h = await harness(t, '10.93.2.0/24');
  await h.startAgent();
  const shaped = await h.addPod('shaped');
  const peer = await h.addPod('peer');
  const bandwidth = { IngressRate: 20 * MBIT, IngressBurst: UINT32_MAX, EgressRate: 10 * MBIT, EgressBurst: UINT32_MAX };
  const rs = await addOk(t, h, shaped, { bandwidth });
  const rp = await addOk(t, h, peer);

  const st = await status(h);
  t.deepEqual(
    st.pods.find((p) => p.name === 'shaped')?.limits,
    { ingress: 20 * MBIT, egress: 10 * MBIT },
    'the uint32-max burst counts as none given',
  );
  t.regex((await h.get('/metrics')).body, /^kubenet_shaped_pods 1$/m);
  // The bridge plugin makes veths with txqueuelen 0, from which htb would take a 2-packet direct queue.
  const hostVeth = (st.pods.find((p) => p.name === 'shaped') as { hostVeth?: string } | undefined)?.hostVeth ?? '';
  t.regex(
    (await execa('tc', ['qdisc', 'show', 'dev', hostVeth, 'root'])).stdout,
    /^qdisc htb 2: root .*direct_qlen 1000\b/m,
    `htb's direct queue on ${hostVeth}`,
  );

  const topo = (p: TestPod, r: CniResultJson, index: number): TopoPod => ({
    index,
    netns: p.netns,
    netnsPath: p.netnsPath,
    hostVeth: '',
    ip4: podIp(r),
    ip6: '',
    id: p.id,
  });
  const s = topo(shaped, rs, 0);
  const p = topo(peer, rp, 1);
  for (const [what, server, client, limit] of [
    ['egress 10M', p, s, 10 * MBIT],
    ['ingress 20M', s, p, 20 * MBIT],
  ] as const) {
    const r = await iperf(server, client, { seconds: 5, onRetry: retryLog(t) });
    t.log(`${what}: ${(r.bps / MBIT).toFixed(2)} Mbit/s, intervals ${r.intervals.map((i) => (i / MBIT).toFixed(2)).join(' ')}`);
    t.true(r.bps >= 0.9 * limit && r.bps <= 1.1 * limit, `${what}: ${r.bps} within ±10%`);
    t.true(Math.max(...r.intervals) <= 1.25 * limit, `${what}: no 1 s interval above 1.25x (no burst blow-through)`);
  }

  for (const pod of [shaped, peer]) t.is((await h.libcni('del', pod)).exitCode, 0);
  t.deepEqual(await ifbLeaves(h), [], 'no pod leaf left on the ifb (the classes stay idle for the next pods)');
  await assertNothingLeft(t, h);
});

serialTest('after an agent restart the pods are still known (IPs, limits) and DEL cleans everything', async (t) => {
  const h = await harness(t, '10.93.3.0/24');
  await h.startAgent();
  const pod = await h.addPod('survivor');
  const r = await addOk(t, h, pod, { bandwidth: { ingressRate: 5 * MBIT, egressRate: 3 * MBIT } });
  const before = await ifbClasses(h);
  t.regex(before, /class htb 1:\w+ .*rate 3Mbit/, 'egress class on the ifb');

  await h.stopAgent();
  // The agent is gone: the binary answers with a CNI error naming the socket, exit non-zero.
  const down = await h.libcni('check', pod);
  t.not(down.exitCode, 0);
  t.true(down.stderr.includes(h.config.socket), down.stderr);

  await h.startAgent();
  const st = await status(h);
  t.deepEqual(
    st.pods.map((p) => ({ name: p.name, ips: p.ips, limits: p.limits })),
    [{ name: 'survivor', ips: [podIp(r)], limits: { ingress: 5 * MBIT, egress: 3 * MBIT } }],
  );
  t.is(await ifbClasses(h), before, 'shaping untouched by the restart');
  t.is((await h.libcni('check', pod)).exitCode, 0, 'CHECK passes after the restart');
  t.is((await h.libcni('del', pod)).exitCode, 0);
  t.deepEqual(await ifbLeaves(h), []);
  await assertNothingLeft(t, h);
});

serialTest('no pod CIDR yet: not ready, nothing installed, ADD is "try again later"; the CIDR arrives and all is written', async (t) => {
  const h = await harness(t, '10.93.4.0/24');
  let deliver: ((cidr: string) => void | Promise<void>) | undefined;
  const source: PodCidrSource = {
    start: async (onCidr) => {
      deliver = onCidr;
    },
    stop: async () => {},
  };
  await h.startAgent(source);
  const health = await h.get('/healthz');
  t.is(health.status, 503);
  t.regex(health.body, /pod CIDR/);
  t.false(await linkExists(h.bridge));
  await t.throwsAsync(stat(join(h.config.cniConfDir, '10-kubenet.conflist')), { code: 'ENOENT' });

  const pod = await h.addPod('early');
  const early = await postCni(
    h.config.socket,
    { CNI_COMMAND: 'ADD', CNI_CONTAINERID: pod.id, CNI_NETNS: pod.netnsPath, CNI_IFNAME: 'eth0', CNI_ARGS: cniArgs(pod) },
    conf(h),
  );
  t.is(early.status, 500);
  t.is((JSON.parse(early.body) as { code: number }).code, 11, 'CNI code 11: try again later');
  t.deepEqual(await h.reservedIps(), []);

  await deliver?.('10.93.4.0/24');
  t.is((await h.get('/healthz')).status, 200);
  t.is((await addOk(t, h, pod)).ips.length, 1);
  t.is((await h.libcni('del', pod)).exitCode, 0);
  await assertNothingLeft(t, h);
});

serialTest('in a cluster: the pod CIDR from the Node watch, limits from the pod annotations (no runtimeConfig)', async (t) => {
  const api = await FakeApiServer.start();
  t.teardown(() => api.stop());
  const h = await harness(t, '10.93.8.0/24');
  const kube = {
    nodeName: 'test-node',
    logger: createLogger({ level: h.config.logLevel }),
    kubeConfig: fakeKubeConfig(api),
    retryMinMs: 20,
    retryMaxMs: 200,
  };
  api.setNode(node('test-node'));
  await h.startAgent(new NodeWatchPodCidrSource(kube), new ClusterPodLookup(kube));
  t.is((await h.get('/healthz')).status, 503, 'no pod CIDR on the Node yet');

  api.setNode(node('test-node', { podCIDRs: ['10.93.8.0/24'] }));
  const deadline = Date.now() + 10_000;
  while ((await h.get('/healthz')).status !== 200 && Date.now() < deadline) await new Promise((r) => setTimeout(r, 50));
  t.is((await h.get('/healthz')).status, 200, 'ready once the Node has a pod CIDR');
  t.is((await status(h)).podCIDR, '10.93.8.0/24');

  const web = await h.addPod('web');
  api.setPod(podObject('default', 'web', 'test-node', { 'kubernetes.io/ingress-bandwidth': '7M', 'kubernetes.io/egress-bandwidth': '3M' }));
  const r = await addOk(t, h, web);
  t.regex(r.ips[0]?.address ?? '', /^10\.93\.8\./);
  t.deepEqual(
    (await status(h)).pods.map((p) => p.limits),
    [{ ingress: 7 * MBIT, egress: 3 * MBIT }],
  );
  t.regex(await ifbClasses(h), /rate 3Mbit/, 'egress class from the annotation');

  // An invalid annotation refuses the pod (code 7) with a msg naming it, its value and the accepted form, and leaks nothing.
  const bad = await h.addPod('bad');
  api.setPod(podObject('default', 'bad', 'test-node', { 'kubernetes.io/egress-bandwidth': '10 Mbit' }));
  const refused = await h.libcni('add', bad);
  t.not(refused.exitCode, 0);
  t.regex(refused.stderr, /^libcni-driver: CNI error code 7$/m);
  const msg =
    'annotation kubernetes.io/egress-bandwidth: "10 Mbit" is not a bandwidth: want a number of bits/s with an optional suffix k, M, G, T (or Ki, Mi, Gi, Ti) and no space or unit, e.g. "10M" or "500k"';
  t.true(refused.stderr.includes(`failed (add): ${msg}\n`), refused.stderr);
  t.is((await h.reservedIps()).length, 1, 'the refused pod holds no address');

  t.is((await h.libcni('del', web)).exitCode, 0);
  t.is((await h.libcni('del', bad)).exitCode, 0);
  await assertNothingLeft(t, h);
});

serialTest(
  'in a cluster: no ADD waits on the API server for a pod already delivered on its watch (0 pod GETs); a pod not in the watch yet is fetched once',
  async (t) => {
    const api = await FakeApiServer.start();
    t.teardown(() => api.stop());
    const h = await harness(t, '10.93.12.0/24');
    const kube = {
      nodeName: 'test-node',
      logger: createLogger({ level: h.config.logLevel }),
      kubeConfig: fakeKubeConfig(api),
      retryMinMs: 20,
      retryMaxMs: 200,
    };
    api.setNode(node('test-node', { podCIDRs: ['10.93.12.0/24'] }));
    await h.startAgent(new NodeWatchPodCidrSource(kube), new ClusterPodLookup(kube));
    const deadline = Date.now() + 10_000;
    while ((await h.get('/healthz')).status !== 200 && Date.now() < deadline) await new Promise((r) => setTimeout(r, 50));
    t.is((await h.get('/healthz')).status, 200);

    const podGets = () => api.requests.filter((r) => /^\/api\/v1\/namespaces\/[^/]+\/pods\/[^/]+$/.test(r.path)).map((r) => r.path);
    const pods: TestPod[] = [];
    for (let i = 1; i <= 6; i++) {
      const p = await h.addPod(`w${i}`);
      api.setPod(podObject('default', p.name, 'test-node', { 'kubernetes.io/ingress-bandwidth': `${i}M` }));
      pods.push(p);
    }
    await api.waitDelivered(
      'pods',
      pods.map((p) => `default/${p.name}`),
    );
    // Sequential and concurrent ADDs, no runtimeConfig: every limit comes from the watch cache.
    for (const p of pods.slice(0, 3)) await addOk(t, h, p);
    await Promise.all(pods.slice(3).map((p) => addOk(t, h, p)));
    t.deepEqual(podGets(), [], 'no pod GET for pods the watch had delivered');
    const limits = new Map((await status(h)).pods.map((p) => [p.name, p.limits]));
    for (const [i, p] of pods.entries())
      t.deepEqual(limits.get(p.name), { ingress: (i + 1) * MBIT }, `${p.name}: limits from its annotation`);

    // Contrast: with the watch held back, a new pod is known only to a GET, and exactly one is made.
    api.failWith = (r) => (r.watch ? 503 : undefined);
    api.closeWatches();
    const late = await h.addPod('late');
    api.setPod(podObject('default', late.name, 'test-node', { 'kubernetes.io/egress-bandwidth': '2M' }));
    t.false(api.delivered('pods', 'default/late'));
    await addOk(t, h, late);
    t.deepEqual(podGets(), ['/api/v1/namespaces/default/pods/late']);
    t.deepEqual((await status(h)).pods.find((p) => p.name === 'late')?.limits, { egress: 2 * MBIT });
    api.failWith = undefined;

    for (const p of [...pods, late]) t.is((await h.libcni('del', p)).exitCode, 0);
    await assertNothingLeft(t, h);
  },
);

/** iptables -t nat, never failing (cleanup). */
const natIpt = (args: string[]) => execa('iptables', ['-w', '5', '-t', 'nat', ...args], { reject: false });

/**
 * portmap makes shared nat chains on first use and never removes them (they serve every pod with
 * host ports). A test that caused them removes them again, unless they were there before it.
 */
async function portmapChainsCleanup(t: import('ava').ExecutionContext): Promise<void> {
  if ((await natIpt(['-S', 'CNI-HOSTPORT-DNAT'])).exitCode === 0) return;
  t.teardown(async () => {
    await natIpt(['-D', 'PREROUTING', '-m', 'addrtype', '--dst-type', 'LOCAL', '-j', 'CNI-HOSTPORT-DNAT']);
    await natIpt(['-D', 'OUTPUT', '-m', 'addrtype', '--dst-type', 'LOCAL', '-j', 'CNI-HOSTPORT-DNAT']);
    await natIpt(['-D', 'POSTROUTING', '-m', 'comment', '--comment', 'CNI portfwd requiring masquerade', '-j', 'CNI-HOSTPORT-MASQ']);
    for (const chain of ['CNI-HOSTPORT-DNAT', 'CNI-HOSTPORT-MASQ', 'CNI-HOSTPORT-SETMARK']) {
      await natIpt(['-F', chain]);
      await natIpt(['-X', chain]);
    }
  });
}

serialTest(
  'host ports: runtimeConfig.portMappings through the reference portmap plugin, reachable from a pod, removed on DEL',
  async (t) => {
    // Registered first, so it runs after the harness has DEL'd the pods (teardowns run in reverse).
    await portmapChainsCleanup(t);
    const h = await harness(t, '10.93.9.0/24');
    await h.startAgent();
    const web = await h.addPod('web');
    const client = await h.addPod('client');
    const hostPort = 30000 + Math.floor(Math.random() * 2000);
    const rw = await addOk(t, h, web, { portMappings: [{ hostPort, containerPort: 8080, protocol: 'tcp' }] });
    await addOk(t, h, client);
    t.deepEqual((await status(h)).pods.find((p) => p.name === 'web')?.portMappings, [{ hostPort, containerPort: 8080, protocol: 'tcp' }]);
    const natRules = async () =>
      (await execa('iptables', ['-w', '5', '-t', 'nat', '-S'])).stdout.split('\n').filter((l) => l.includes(`--dport ${hostPort}`));
    t.true(
      (await natRules()).some((l) => l.includes(`--to-destination ${podIp(rw)}:8080`)),
      'a DNAT rule for the host port',
    );
    const check = await h.libcni('check', web);
    t.is(check.exitCode, 0, `CHECK passes with the portmap plugin chained: ${check.stderr}`);

    // A server in the pod on 8080; a client pod connects to the node (the bridge gateway) on hostPort.
    const server = execa('ip', [
      'netns',
      'exec',
      web.netns,
      process.execPath,
      '-e',
      "require('net').createServer((s) => s.end('hello from web')).listen(8080, () => console.log('up'))",
    ]);
    t.teardown(() => {
      server.kill('SIGKILL');
      return server.catch(() => undefined);
    });
    await new Promise<void>((resolve) => server.stdout?.once('data', () => resolve()));
    const gw = rw.ips[0]?.gateway ?? '';
    const got = await execa(
      'ip',
      [
        'netns',
        'exec',
        client.netns,
        process.execPath,
        '-e',
        `require('net').connect(${hostPort}, '${gw}').on('data', (d) => process.stdout.write(d))`,
      ],
      { timeout: 10_000, reject: false },
    );
    t.is(got.stdout, 'hello from web', `host port ${gw}:${hostPort} reaches the pod: ${got.stderr}`);

    // The pod's record is lost (and the agent restarts): the startup sweep finds its host-port rules
    // (they forward into this node's pod CIDR), its address and its veth, belonging to no attachment,
    // and removes them; the client pod, recorded, keeps everything. DEL of the lost pod then succeeds.
    const records = (await h.podStateFiles()).filter((f) => f.startsWith(web.id));
    t.is(records.length, 1, `one record for the pod: ${records.join(', ')}`);
    for (const f of records) await rm(join(h.config.stateDir, 'pods', f));
    await h.stopAgent();
    await h.startAgent();
    t.deepEqual(await natRules(), [], 'no rule for the host port after the sweep');
    t.is((await bridgePorts(h)).length, 1, "only the client's veth is left on the bridge");
    t.is((await h.reservedIps()).length, 1, "only the client's address is reserved");
    t.is((await h.libcni('del', web)).exitCode, 0);
    t.is((await h.libcni('del', client)).exitCode, 0);
    await assertNothingLeft(t, h);

    const bad = await h.execCni('ADD', web, conf(h, { runtimeConfig: { portMappings: [{ hostPort: 0, containerPort: 80 }] } }));
    t.is((JSON.parse(bad.stdout) as { code: number }).code, 7);
    t.regex(bad.stdout, /hostPort/);
  },
);

serialTest('bad input is a CNI error object with the right code, and leaks nothing; STATUS and GC (spec 1.1.0)', async (t) => {
  const h = await harness(t, '10.93.5.0/24');
  await h.startAgent();
  const pod = await h.addPod('p');
  const errOf = (stdout: string) => JSON.parse(stdout) as { cniVersion: string; code: number; msg: string };

  const badRate = await h.execCni('ADD', pod, conf(h, { runtimeConfig: { bandwidth: { ingressRate: 10 } } }));
  t.not(badRate.exitCode, 0);
  t.is(errOf(badRate.stdout).code, 7);
  t.regex(errOf(badRate.stdout).msg, /ingressRate/);
  const badIf = await h.execCni('ADD', pod, conf(h), { CNI_IFNAME: 'net1' });
  t.is(errOf(badIf.stdout).code, 4);
  const noNetns = await h.execCni('ADD', pod, conf(h), { CNI_NETNS: '' });
  t.is(errOf(noNetns.stdout).code, 4);
  t.regex(errOf(noNetns.stdout).msg, /CNI_NETNS/);
  const goneNetns = await h.execCni('ADD', pod, conf(h), { CNI_NETNS: '/var/run/netns/kag-does-not-exist' });
  t.not(goneNetns.exitCode, 0);
  const unknownCheck = await h.execCni('CHECK', pod, conf(h));
  t.is(errOf(unknownCheck.stdout).code, 3, 'CHECK of a container never added: unknown container');
  const badJson = await h.execCni('ADD', pod, '{not json');
  t.not(badJson.exitCode, 0);
  t.deepEqual(await h.reservedIps(), [], 'no refused ADD reserved an address');
  t.deepEqual(await bridgePorts(h), []);

  const version = await h.execCni('VERSION', undefined, conf(h));
  t.is(version.exitCode, 0);
  t.true((JSON.parse(version.stdout) as { supportedVersions: string[] }).supportedVersions.includes('1.1.0'));
  const statusOk = await h.execCni('STATUS', undefined, conf(h, { cniVersion: '1.1.0' }));
  t.is(statusOk.exitCode, 0, statusOk.stdout);

  // GC: keeps the valid attachment, tears down the other.
  const keep = pod;
  const drop = await h.addPod('stale');
  await addOk(t, h, keep);
  await addOk(t, h, drop);
  t.is((await h.reservedIps()).length, 2);
  const gc = await h.execCni(
    'GC',
    undefined,
    conf(h, { cniVersion: '1.1.0', 'cni.dev/valid-attachments': [{ containerID: keep.id, ifname: 'eth0' }] }),
  );
  t.is(gc.exitCode, 0, gc.stdout);
  t.deepEqual(
    (await status(h)).pods.map((p) => p.name),
    ['p'],
  );
  t.is((await h.reservedIps()).length, 1);
  t.is((await h.libcni('del', keep)).exitCode, 0);
  t.is((await h.libcni('del', drop)).exitCode, 0, 'DEL of an already collected container succeeds');
  await assertNothingLeft(t, h);
});

serialTest('stop() lets a CNI call in flight finish before the agent exits', async (t) => {
  const h = await harness(t, '10.93.6.0/24');
  const agent = await h.startAgent();
  const pod = await h.addPod('inflight');
  const add = postCni(
    h.config.socket,
    { CNI_COMMAND: 'ADD', CNI_CONTAINERID: pod.id, CNI_NETNS: pod.netnsPath, CNI_IFNAME: 'eth0', CNI_ARGS: cniArgs(pod) },
    conf(h),
  );
  const deadline = Date.now() + 5000;
  while (agent.callsInFlight() === 0 && Date.now() < deadline) await new Promise((r) => setImmediate(r));
  t.is(agent.callsInFlight(), 1, 'the ADD is in flight');
  await h.stopAgent();
  const r = await add;
  t.is(r.status, 200, r.body);
  t.regex((JSON.parse(r.body) as CniResultJson).ips[0]?.address ?? '', /^10\.93\.6\./);
  await t.throwsAsync(stat(h.config.socket), { code: 'ENOENT' }, 'socket removed');
  // The pod set up during shutdown is known to the next agent, and DEL cleans it.
  await h.startAgent();
  t.is((await status(h)).pods.length, 1);
  t.is((await h.libcni('del', pod)).exitCode, 0);
  await assertNothingLeft(t, h);
});

serialTest('many pods added, then deleted, all at once through libcni: distinct IPs, each shaped as asked, nothing left', async (t) => {
  const h = await harness(t, '10.93.10.0/24');
  await h.startAgent();
  const pods = await Promise.all(Array.from({ length: 10 }, (_, i) => h.addPod(`burst${i}`)));
  // Every other pod shaped, each at its own rate, so a mix-up between pods would show.
  const rateOf = (i: number) => (i % 2 === 0 ? (i + 1) * 1_000_000 : undefined);
  const results = await Promise.all(
    pods.map((p, i) => {
      const rate = rateOf(i);
      return addOk(t, h, p, rate ? { bandwidth: { ingressRate: rate, egressRate: rate } } : undefined);
    }),
  );
  const ips = results.map(podIp);
  t.is(new Set(ips).size, pods.length, `distinct IPs: ${ips.join(' ')}`);
  const st = await status(h);
  t.is(st.pods.length, pods.length);
  for (const [i, p] of pods.entries()) {
    const known = st.pods.find((s) => s.id === p.id);
    const rate = rateOf(i);
    t.deepEqual(known?.ips, [ips[i]], `${p.name}: status has its IP`);
    t.deepEqual(known?.limits, rate ? { ingress: rate, egress: rate } : {}, `${p.name}: its own limits`);
  }
  t.is((await bridgePorts(h)).length, pods.length);

  const dels = await Promise.all(pods.map((p) => h.libcni('del', p)));
  for (const [i, d] of dels.entries()) t.is(d.exitCode, 0, `DEL ${pods[i]?.name}: ${d.stderr}`);
  await assertNothingLeft(t, h);
  // DEL answered once each veth was gone; the kernel finishes freeing them in the background.
  await h.agent?.network.settled();
  t.regex((await h.get('/metrics')).body, /^kubenet_veth_deletions_in_flight 0$/m);
  for (const p of pods) t.false(await linkExists('eth0', p.netns), `${p.name}: no eth0 left in the pod`);
  t.deepEqual(await ifbLeaves(h), [], 'no pod leaf left on the ifb');
});

/** A network config as a runtime would pass the kubenet plugin (the socket key points the binary at this agent). */
function conf(h: AgentHarness, extra: Record<string, unknown> = {}): string {
  return JSON.stringify({ cniVersion: '1.0.0', name: 'kubenet', type: 'kubenet', socket: h.config.socket, ...extra });
}

/** The pod records on disk (the agent's only pod state). */
async function records(
  h: AgentHarness,
): Promise<Array<{ containerId: string; network: { type?: string; socket?: string; ipam?: { type: string } } }>> {
  return Promise.all(
    (await h.podStateFiles())
      .filter((f) => f.endsWith('.json'))
      .map(async (f) => JSON.parse(await readFile(join(h.config.stateDir, 'pods', f), 'utf8'))),
  );
}

/** A debug logger whose entries the test can read. */
function capturingLogger(): { logger: Logger; lines: Array<Record<string, unknown>> } {
  const lines: Array<Record<string, unknown>> = [];
  const logger = pino({ level: 'debug' }, { write: (s: string) => void lines.push(JSON.parse(s) as Record<string, unknown>) });
  return { logger, lines };
}

serialTest(
  "host-local's allocation runs in the agent beside the bridge plugin (the IPAM shim fetches its result): host-local's reservations, no host-local exec on ADD or DEL; a full range fails the ADD with host-local's error and leaves nothing",
  async (t) => {
    // A /30: host-local has exactly one address for pods (.2; .1 is the gateway).
    const h = await harness(t, '10.93.20.0/30');
    const { logger, lines } = capturingLogger();
    await h.startAgent(undefined, undefined, logger);
    t.is((await stat(`${h.config.socket}.ipam`)).mode & 0o777, 0o600, 'the IPAM socket is 0600');
    const a = await h.addPod('ipam-a');
    const ra = await addOk(t, h, a);
    t.is(podIp(ra), '10.93.20.2');
    t.deepEqual(await h.reservedIps(), ['10.93.20.2'], "host-local's reservation, where the bridge's own IPAM would make it");
    const [rec] = await records(h);
    t.is(rec?.network.ipam?.type, 'kubenet-ipam', "the bridge's IPAM is the shim");
    t.is(rec?.network.socket, `${h.config.socket}.ipam`);
    t.is(
      await readFile(join(h.config.ipamDataDir, 'kubenet', '10.93.20.2'), 'utf8'),
      `${a.id}\r\neth0`,
      "host-local's own file, byte for byte",
    );
    const ran = (plugin: string, id: string, command = 'ADD') =>
      lines.filter((l) => l.msg === 'CNI plugin ran' && l.plugin === plugin && l.command === command && l.containerId === id);
    t.is(ran('host-local', a.id).length, 0, 'no host-local exec: the agent allocated the address itself');
    t.is(ran('bridge', a.id).length, 1);

    // The range is full: host-local's own error is the ADD's, and nothing of the pod stays.
    const b = await h.addPod('ipam-b');
    const rb = await h.libcni('add', b);
    t.not(rb.exitCode, 0);
    t.regex(rb.stdout + rb.stderr, /no IP addresses available in range set: 10\.93\.20\.1-10\.93\.20\.2/);
    t.deepEqual(await h.reservedIps(), ['10.93.20.2']);
    t.is((await records(h)).length, 1, 'no record of the failed pod');
    t.is((await bridgePorts(h)).length, 1, 'no veth of the failed pod');
    t.is((await h.libcni('del', b)).exitCode, 0);
    t.is((await h.libcni('del', a)).exitCode, 0);
    t.deepEqual(await h.reservedIps(), [], 'released by the DEL');
    t.is(
      ran('host-local', a.id, 'DEL').length + ran('bridge', a.id, 'DEL').length,
      0,
      "in-process: neither bridge nor host-local exec'd for the DEL",
    );
    await assertNothingLeft(t, h);
  },
);

serialTest('an ADD whose bridge plugin fails before it asks for its address releases the address reserved beside the exec', async (t) => {
  // A bridge plugin that fails after a while without asking its IPAM: the agent's allocation,
  // started once the exec is on its way, has reserved the address by then.
  const fakes = await mkdtemp(join(tmpdir(), 'kag-fakebridge-'));
  t.teardown(() => rm(fakes, { recursive: true, force: true }));
  const fake = join(fakes, 'bridge');
  await writeFile(
    fake,
    '#!/bin/sh\ncat >/dev/null\nsleep 0.3\necho \'{"cniVersion":"1.0.0","code":11,"msg":"test: the bridge plugin fails before its IPAM call"}\'\nexit 1\n',
    { mode: 0o755 },
  );
  const h = await new AgentHarness().setup('10.93.21.0/24', { pluginBinDirs: [fakes, ...CNI_BIN_DIRS] });
  t.teardown(() => h.cleanup.run());
  const { logger, lines } = capturingLogger();
  await h.startAgent(undefined, undefined, logger);
  const a = await h.addPod('early-fail');
  // First the bridge replaced by a link of another kind: the ADD fails before the exec, before anything is allocated.
  await execa('ip', ['link', 'del', h.bridge]);
  await execa('ip', ['link', 'add', h.bridge, 'type', 'ifb']);
  const notBridge = await h.libcni('add', a);
  t.not(notBridge.exitCode, 0);
  t.regex(notBridge.stdout + notBridge.stderr, /is not a bridge/);
  await t.throwsAsync(
    readFile(join(h.config.ipamDataDir, 'kubenet', 'last_reserved_ip.0'), 'utf8'),
    { code: 'ENOENT' },
    'nothing allocated',
  );
  t.deepEqual(await h.podStateFiles(), []);
  await execa('ip', ['link', 'del', h.bridge]);
  // The next ADD makes the bridge again; its plugin fails after the allocation.
  const r = await h.libcni('add', a);
  t.not(r.exitCode, 0);
  t.regex(r.stdout + r.stderr, /fails before its IPAM call/);
  const hostLocal = lines.filter((l) => l.msg === 'CNI plugin ran' && l.plugin === 'host-local' && l.containerId === a.id);
  t.is(hostLocal.length, 0, 'no host-local exec');
  t.is(
    await readFile(join(h.config.ipamDataDir, 'kubenet', 'last_reserved_ip.0'), 'utf8'),
    '10.93.21.2',
    'the agent did reserve an address for it',
  );
  t.deepEqual(await h.reservedIps(), [], 'and the undo released it');
  t.deepEqual(await h.podStateFiles(), []);
  // The same pod with the real bridge plugin.
  await h.stopAgent();
  h.config = { ...h.config, pluginBinDirs: CNI_BIN_DIRS };
  await h.startAgent();
  await addOk(t, h, a);
  t.is((await h.libcni('del', a)).exitCode, 0);
  await assertNothingLeft(t, h);
});

serialTest('the IPAM socket answers only the IPAM ADD of an ADD the agent is running', async (t) => {
  const h = await harness(t, '10.93.22.0/24');
  await h.startAgent();
  const a = await h.addPod('stray');
  const env = { CNI_COMMAND: 'ADD', CNI_CONTAINERID: a.id, CNI_NETNS: a.netnsPath, CNI_IFNAME: 'eth0', CNI_ARGS: cniArgs(a) };
  const stdin = JSON.stringify({ cniVersion: '1.0.0', name: 'kubenet', type: 'bridge', ipam: { type: 'kubenet-ipam' } });
  const ipamSocket = `${h.config.socket}.ipam`;
  const stray = await agentPost(ipamSocket, '/v1/ipam', { env, stdin });
  t.is(stray.status, 500, stray.body);
  t.is((JSON.parse(stray.body) as { code: number }).code, 3);
  t.regex(stray.body, /no pod ADD of container/);
  const del = await agentPost(ipamSocket, '/v1/ipam', { env: { ...env, CNI_COMMAND: 'DEL' }, stdin });
  t.is((JSON.parse(del.body) as { code: number }).code, 4, 'only ADD reaches the agent');
  t.is((await agentPost(ipamSocket, '/v1/cni', { env, stdin })).status, 404, 'CNI calls go to the main socket');
  t.deepEqual(await h.reservedIps(), [], 'nothing allocated');
  await h.stopAgent();
  await t.throwsAsync(stat(ipamSocket), { code: 'ENOENT' }, 'the IPAM socket goes with the agent');
});

serialTest('pods set up with and without the host-local prefetch are deleted by an agent started the other way', async (t) => {
  const h = await harness(t, '10.93.23.0/24');
  const withEnv = async (v: string | undefined, fn: () => Promise<void>) => {
    const old = process.env.KUBENET_IPAM_PREFETCH;
    if (v === undefined) delete process.env.KUBENET_IPAM_PREFETCH;
    else process.env.KUBENET_IPAM_PREFETCH = v;
    try {
      await fn();
    } finally {
      if (old === undefined) delete process.env.KUBENET_IPAM_PREFETCH;
      else process.env.KUBENET_IPAM_PREFETCH = old;
    }
  };
  const off = await h.addPod('plain');
  const on = await h.addPod('shim');
  await withEnv('off', async () => {
    await h.startAgent();
    await addOk(t, h, off);
    t.deepEqual(
      (await records(h)).map((r) => r.network.ipam?.type),
      ['host-local'],
    );
    await h.stopAgent();
  });
  await withEnv(undefined, async () => {
    await h.startAgent();
    await addOk(t, h, on);
    t.deepEqual((await records(h)).map((r) => r.network.ipam?.type).sort(), ['host-local', 'kubenet-ipam']);
    t.is((await h.libcni('del', off)).exitCode, 0, 'a pod of the bridge + host-local config');
    await h.stopAgent();
  });
  await withEnv('off', async () => {
    await h.startAgent();
    t.is((await h.libcni('del', on)).exitCode, 0, 'a pod of the shim config');
  });
  await assertNothingLeft(t, h);
});

serialTest(
  'a configuration in which the agent would run its own forwarding binary as a plugin is refused at startup, naming it',
  async (t) => {
    const h = await harness(t, '10.93.11.0/24');
    // An operator's plugin dir whose "bridge" is kubenet's own forwarder (a copy, then a symlink).
    const dir = join(h.root, 'bad-plugins');
    await execa('mkdir', ['-p', dir]);
    await execa('cp', [join(process.cwd(), 'native/build/kubenet-cni'), join(dir, 'bridge')]);
    h.config.pluginBinDirs = [dir, ...h.config.pluginBinDirs];
    const err = await t.throwsAsync(h.startAgent());
    t.regex(
      err?.message ?? '',
      /plugin "bridge" found at .*bad-plugins\/bridge is kubenet's own CNI forwarding binary: the agent would call itself/,
    );
    t.false(await linkExists(h.bridge), 'nothing was set up');
    await rm(join(dir, 'bridge'));
    await execa('ln', ['-s', join(h.config.cniBinDir, 'kubenet'), join(dir, 'bridge')]);
    await execa('mkdir', ['-p', h.config.cniBinDir]);
    await execa('cp', [join(process.cwd(), 'native/build/kubenet-cni'), join(h.config.cniBinDir, 'kubenet')]);
    const err2 = await t.throwsAsync(h.startAgent());
    t.regex(err2?.message ?? '', /is kubenet's own CNI forwarding binary/);
    h.agent = undefined;
  },
);

serialTest(
  'a repeated ADD after a live re-shape is still the same ADD: it returns the recorded result, and the new limits stay',
  async (t) => {
    const h = await harness(t, '10.93.12.0/24');
    await h.startAgent();
    const pod = await h.addPod('reshaped');
    const rc = { bandwidth: { ingressRate: 8 * MBIT, egressRate: 4 * MBIT } };
    const first = await addOk(t, h, pod, rc);
    const shaped = await agentPost(h.config.socket, `/v1/pods/default/${pod.name}/limits`, { ingress: '20M', egress: '10M' });
    t.is(shaped.status, 200, shaped.body);
    const again = await addOk(t, h, pod, rc);
    t.deepEqual(again.ips, first.ips, 'the recorded result');
    t.deepEqual(
      (await status(h)).pods.find((p) => p.name === pod.name)?.limits,
      { ingress: 20 * MBIT, egress: 10 * MBIT },
      'the re-shaped limits stay in force',
    );
    const other = await h.libcni('add', pod, { runtimeConfig: { bandwidth: { ingressRate: 1 * MBIT } } });
    t.not(other.exitCode, 0, 'an ADD with other limits than the ADD asked for is still a conflict');
    t.is((await h.libcni('del', pod)).exitCode, 0);
    await assertNothingLeft(t, h);
  },
);
