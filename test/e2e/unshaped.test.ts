/**
 * Unshaped destinations follow the configuration (issue 24): the agent as a process in a node
 * sandbox (the node's iptables and tc are the sandbox netns's own), a pod set up through its CNI
 * binary by libcni with 10M both ways. With `--unshaped-cidrs 10.0.0.0/8,fd00:10::/32` the node
 * holds exactly the chain KUBENET-UNSHAPED (iptables and ip6tables, one jump from POSTROUTING for the
 * bridge) and the ifb's filters for those CIDRs; the pod talks with the node's gateway (in 10/8) at
 * line rate and with the LAN host (outside) at its limit, in the same run. Restarted with another
 * list: exactly the new rules. Restarted with an empty list: none of them, and the gateway's traffic
 * is shaped too. The pod's own tc objects are the same with any list (the cost is per node). Traffic
 * only between the sandbox's and the test's own namespaces, under the traffic lock.
 */
import anyTest, { type ExecutionContext, type TestFn } from 'ava';
import { execa } from 'execa';
import { CNI_BIN_DIRS } from '../kit/kernel.js';
import { SandboxWorld, sandboxTestBlocker } from '../kit/sandbox-libcni.js';
import type { TestPod } from '../kit/test-pod.js';
import { agentGet, DEFAULT_SOCKET_PATH } from '../../src/daemon/protocol.js';
import { iperf, retryLog, type IperfEndpoint, type IperfResult } from '../kit/topo.js';
import { logUnshaped } from '../kit/measure.js';
import { shardIfbs } from '../kit/shards.js';

const blocker = sandboxTestBlocker();
const test = anyTest as TestFn;
const serialTest = blocker ? test.serial.skip : test.serial;
if (blocker) console.warn(`unshaped e2e tests skipped: ${blocker}`);

const NET = 40 + Math.floor(Math.random() * 200);
const POD_CIDR = `10.249.${NET}.0/24`;
const GATEWAY = `10.249.${NET}.1`;
const LIMIT = 10e6;
const BANDWIDTH = { bandwidth: { ingressRate: LIMIT, ingressBurst: 1_000_000, egressRate: LIMIT, egressBurst: 1_000_000 } };
const SET_CLASS = '-j CLASSIFY --set-class 0002:0000';

let world: SandboxWorld | undefined;
let pod: TestPod | undefined;
function w(): SandboxWorld {
  if (!world) throw new Error('setup failed');
  return world;
}

async function startAgent(unshaped: string): Promise<void> {
  await w().startAgent([
    '--pod-cidr',
    POD_CIDR,
    '--unshaped-cidrs',
    unshaped,
    '--plugin-bin-dirs',
    CNI_BIN_DIRS.join(','),
    '--log-level',
    'info',
  ]);
}

/** The node's unshaped rules: the chain per family (undefined: no chain) and the POSTROUTING jumps. */
async function nodeRules(): Promise<{ v4?: string[]; v6?: string[]; jumps: string[] }> {
  const chain = async (tool: string) => {
    const r = await w().sb.exec(tool, ['-t', 'mangle', '-S', 'KUBENET-UNSHAPED'], { reject: false });
    return r.exitCode === 0 ? r.stdout.split('\n').filter((l) => l.startsWith('-A ')) : undefined;
  };
  const jumps = async (tool: string) =>
    (await w().inNode(tool, ['-t', 'mangle', '-S', 'POSTROUTING']))
      .split('\n')
      .filter((l) => l.includes('KUBENET-UNSHAPED'))
      .map((l) => `${tool} ${l}`);
  const v4 = await chain('iptables');
  const v6 = await chain('ip6tables');
  return { ...(v4 ? { v4 } : {}), ...(v6 ? { v6 } : {}), jumps: [...(await jumps('iptables')), ...(await jumps('ip6tables'))] };
}

/**
 * The egress shards' unshaped filters: per priority (4 IPv4, 5 IPv6), the matches of the filters
 * sending to the htb root (1:). Every shard must have the same; a shard that differs is named.
 */
async function ifbFilters(): Promise<string[]> {
  const perShard = new Map<string, string[]>();
  for (const dev of await shardIfbs((cmd, args) => w().inNode(cmd, args), 'egress')) {
    const out: string[] = [];
    for (const prio of ['4', '5']) {
      const lines = (await w().inNode('tc', ['filter', 'show', 'dev', dev, 'parent', '1:', 'prio', prio])).split('\n');
      lines.forEach((l, i) => {
        if (/\*?flowid 1: /.test(l)) out.push(`prio ${prio} ${(lines[i + 1] ?? '').trim()}`);
      });
    }
    perShard.set(dev, out);
  }
  const [first] = [...perShard.values()];
  if (first === undefined) return ['no egress shard on the node'];
  const odd = [...perShard].filter(([, f]) => JSON.stringify(f) !== JSON.stringify(first)).map(([dev, f]) => `${dev}: ${f.join(', ')}`);
  return odd.length === 0 ? first : [`shards differ from ${[...perShard.keys()][0]}: ${odd.join('; ')}`];
}

/** The pod's own tc objects on its host veth (what its ADD made). */
async function vethObjects(hostVeth: string): Promise<number> {
  const lines = await Promise.all(['qdisc', 'class', 'filter'].map((o) => w().inNode('tc', [o, 'show', 'dev', hostVeth])));
  return lines
    .join('\n')
    .split('\n')
    .filter((l) => l.trim() !== '').length;
}

test.before(async () => {
  if (blocker) return;
  world = await SandboxWorld.create({ prefix: 'kun' });
  await startAgent('10.0.0.0/8,fd00:10::/32');
  // The LAN host reaches the pods through the node, as a routed LAN host would.
  await execa('ip', ['-n', w().sb.lanNetns, 'route', 'replace', POD_CIDR, 'via', w().sb.uplink.nodeIp]);
});

test.after.always(async () => {
  await world?.destroy();
});

serialTest(
  'unshapedCIDRs: exactly its rules on the node; the gateway (in 10/8) at line rate, the LAN host at the limit, both ways',
  async (t) => {
    const rules = await nodeRules();
    t.deepEqual(rules.v4, [`-A KUBENET-UNSHAPED -s 10.0.0.0/8 ${SET_CLASS}`]);
    t.deepEqual(rules.v6, [`-A KUBENET-UNSHAPED -s fd00:10::/32 ${SET_CLASS}`]);
    t.is(rules.jumps.length, 2, `one jump per family: ${rules.jumps.join(' | ')}`);
    t.true(
      rules.jumps.every((j) => j.includes('-o cbr0')),
      'for packets leaving through the bridge',
    );
    t.deepEqual(
      await ifbFilters(),
      ['prio 4 match 0a000000/ff000000 at 16', 'prio 5 match fd000010/ffffffff at 24'],
      'the ifb: one filter per CIDR, destination matched, to the htb root',
    );

    pod = await w().newPod('shaped');
    pod.runtimeConfig = BANDWIDTH;
    const r = await w().call('add', pod);
    t.is(r.exitCode, 0, r.stderr);
    const p = pod;
    const podEp: IperfEndpoint = { netns: p.netns, ip4: p.ip ?? '' };
    const gateway: IperfEndpoint = { netns: w().sb.netns, ip4: GATEWAY };
    const lan: IperfEndpoint = { netns: w().sb.lanNetns, ip4: w().sb.uplink.lanIp };
    shapedMean(t, 'LAN host → pod (ingress 10M)', await iperf(podEp, lan, { onRetry: retryLog(t), seconds: 5 }));
    shapedMean(t, 'pod → LAN host (egress 10M, masqueraded)', await iperf(lan, podEp, { onRetry: retryLog(t), seconds: 5 }));
    const fromGw = await iperf(podEp, gateway, { onRetry: retryLog(t), seconds: 3 });
    logUnshaped(t, 'gateway → pod', fromGw.bps, fromGw.intervals, LIMIT);
    const toGw = await iperf(gateway, podEp, { onRetry: retryLog(t), seconds: 3 });
    logUnshaped(t, 'pod → gateway', toGw.bps, toGw.intervals, LIMIT);
  },
);

serialTest(
  "restarted with another list: exactly its rules (the other family's chain gone); the pod's own tc objects the same",
  async (t) => {
    const p = pod;
    if (!p?.ip) throw new Error('the first test set no pod up');
    const hostVeth = await podHostVeth(p);
    const before = await vethObjects(hostVeth);
    await startAgent('192.168.0.0/16');
    const rules = await nodeRules();
    t.deepEqual(rules.v4, [`-A KUBENET-UNSHAPED -s 192.168.0.0/16 ${SET_CLASS}`]);
    t.is(rules.v6, undefined, 'no IPv6 CIDR: no ip6tables chain');
    t.deepEqual(
      rules.jumps.map((j) => j.split(' ')[0]),
      ['iptables'],
      'one jump, IPv4 only',
    );
    t.deepEqual(await ifbFilters(), ['prio 4 match c0a80000/ffff0000 at 16']);
    t.is(await vethObjects(hostVeth), before, `the pod's veth holds the same ${before} tc objects with any list`);
  },
);

serialTest("restarted with an empty list: no unshaped rule anywhere, and the gateway's traffic is shaped like any other", async (t) => {
  const p = pod;
  if (!p?.ip) throw new Error('the first test set no pod up');
  await startAgent('');
  t.deepEqual(await nodeRules(), { jumps: [] }, 'no chain in either family, no jump');
  t.deepEqual(await ifbFilters(), []);
  const podEp: IperfEndpoint = { netns: p.netns, ip4: p.ip };
  const gateway: IperfEndpoint = { netns: w().sb.netns, ip4: GATEWAY };
  shapedMean(t, 'gateway → pod (ingress 10M, nothing unshaped)', await iperf(podEp, gateway, { onRetry: retryLog(t), seconds: 5 }));
  shapedMean(t, 'pod → gateway (egress 10M, nothing unshaped)', await iperf(gateway, podEp, { onRetry: retryLog(t), seconds: 5 }));
});

/**
 * Shaped, not at line rate: the mean within ±10 % of the limit. The shaper's per-second bound
 * (1.25×) is the traffic, agent, containerd and cluster suites' to check; here a second after a late
 * loss recovery or a receiver descheduled beside another suite (seen: 5.5 then 15.5, and 3.0 then
 * 17.4 Mbit/s, both seconds together at the limit) would fail a check this suite is not about.
 */
function shapedMean(t: ExecutionContext, what: string, r: IperfResult): void {
  t.log(
    `${what}: ${(r.bps / 1e6).toFixed(2)} Mbit/s of ${LIMIT / 1e6}, 1 s intervals ${r.intervals.map((i) => (i / 1e6).toFixed(2)).join(' ')}`,
  );
  t.true(Math.abs(r.bps / LIMIT - 1) <= 0.1, `${what}: ${r.bps} within ±10 % of ${LIMIT}`);
}

/** The pod's host veth, from the agent's status. */
async function podHostVeth(p: TestPod): Promise<string> {
  const status = JSON.parse((await agentGet(w().sb.hostPath(DEFAULT_SOCKET_PATH), '/v1/status')).body) as {
    pods: Array<{ name: string; hostVeth?: string }>;
  };
  const veth = status.pods.find((x) => x.name === p.name)?.hostVeth;
  if (!veth) throw new Error(`no host veth for ${p.name} in the agent's status`);
  return veth;
}
