/**
 * A rolling upgrade from the previous release on a real cluster (issue 42): 3 nodes, the previous
 * release's own manifest and image (hack/build-previous-image.sh: the last commit with one htb tree
 * per direction under a capacity), then `kubectl apply -f manifests/kubenet.yaml`, unchanged, as an
 * operator upgrades. The DaemonSet rolls node by node while pods carry traffic: a TCP flow from a
 * LAN host into a shaped pod (its class in the ingress tree) and one between pods on two other
 * nodes, and a ping across nodes. No connection may be lost and no second of the shaped flow may
 * stall; after it, each node's new agent knows its pods, keeps their limits, has spread the pods of
 * the one tree over its shards, and sets up the next pod. Then the downgrade: the previous release's
 * manifest again, its agents find the pods and release everything when they go.
 * Traffic only between the cluster's namespaces and its LAN host. Measurements hold the traffic lock.
 */
import anyTest, { type ExecutionContext, type TestFn } from 'ava';
import { execa, execaSync } from 'execa';
import { existsSync } from 'node:fs';
import { readFile } from 'node:fs/promises';
import { fileURLToPath } from 'node:url';
import { withTrafficLock } from '../kit/traffic-lock.js';
import { iperf, type IperfEndpoint, type IperfResult } from '../kit/topo.js';
import { clusterBlocker, LAN_HOST, lanRoutes, LocalCluster, MANIFEST, pausePidOf, pausePod, type PodList } from '../kit/kcl.js';
import { checkPingLoss, pingThroughout } from '../kit/measure.js';
import { redirectTarget, shardIfbs } from '../kit/shards.js';

const test = anyTest as TestFn;
const BUILD = fileURLToPath(new URL('../../hack/build-previous-image.sh', import.meta.url));
const PREVIOUS = previousImage();
const blocker =
  clusterBlocker() ??
  (PREVIOUS.archive && existsSync(PREVIOUS.archive)
    ? undefined
    : `needs ${PREVIOUS.archive} (bash hack/build-previous-image.sh; npm test builds it)`);
const serialTest = blocker ? test.serial.skip : test.serial;
if (blocker) console.warn(`release-upgrade e2e tests skipped: ${blocker}`);

const node = (i: number) => `kcl-n${i}`;
const c = new LocalCluster();
let up = false;
/** The shaped pod's limits (50 Mbit/s each way) and its ingress guarantee (20, in Mbit/s as the Node counts). */
const LIMIT = 50e6;

/** The previous release's image: its name and archive (cached by hack/build-previous-image.sh). */
function previousImage(): { name: string; archive: string } {
  const run = (args: string[]) => {
    const r = execaSync('bash', [BUILD, ...args], { reject: false });
    return r.exitCode === 0 ? r.stdout.trim() : '';
  };
  return { name: run(['--print-name']), archive: run(['--print-path']) };
}

async function previousManifest(): Promise<string> {
  return (await execa('bash', [BUILD, '--print-manifest'])).stdout;
}

async function agentPod(i: number): Promise<{ name: string; image: string }> {
  const pods = await c.json<{
    items: Array<{ metadata: { name: string }; spec: { nodeName: string; containers: Array<{ image: string }> } }>;
  }>(['-n', 'kube-system', 'get', 'pods', '-l', 'app.kubernetes.io/name=kubenet']);
  const p = pods.items.find((x) => x.spec.nodeName === node(i));
  return { name: p?.metadata.name ?? '', image: p?.spec.containers[0]?.image ?? '' };
}

interface AgentStatus {
  pods: Array<{ namespace: string; name: string; hostVeth?: string; limits: { ingress?: number; egress?: number } }>;
}
async function agentStatus(i: number): Promise<AgentStatus> {
  return JSON.parse((await c.kubectl(['-n', 'kube-system', 'exec', (await agentPod(i)).name, '--', 'kubenet', 'status', '--json'])).stdout);
}

/** Rolls the DaemonSet to `manifest` (kubectl apply) and waits until every node runs it. */
async function rollTo(manifest: string): Promise<void> {
  await c.kubectl(['apply', '-f', '-'], { input: manifest });
  await c.kubectl(['-n', 'kube-system', 'rollout', 'status', 'daemonset/kubenet', '--timeout=240s']);
}

test.before(async (t) => {
  if (blocker) return;
  const t0 = Date.now();
  Object.assign(c.env, { KCL_EXTRA_IMAGES: PREVIOUS.archive });
  const r = await c.up(['--nodes', '3'], () => t.log("waiting for another suite's cluster to go down"));
  up = true;
  if (r.exitCode !== 0) throw new Error(`hack/cluster.sh up failed:\n${r.all ?? ''}`);
  await withTrafficLock(async () => {
    await rollTo(await previousManifest());
    await c.kubectl(['wait', '--for=condition=Ready', 'node', '--all', '--timeout=60s']);
  });
  t.log(`3 nodes up and Ready with ${PREVIOUS.name} in ${Date.now() - t0} ms`);
});

test.after.always(async () => {
  if (!up) return;
  const r = await c.down();
  if (r.exitCode !== 0) throw new Error(`hack/cluster.sh down failed: ${r.all ?? ''}`);
});

/** The pods of this suite: on n2 a shaped pod with a guarantee, a guaranteed one and a plain one; a plain one on n1 and on n3. */
function pods(): Array<Record<string, unknown>> {
  const withRequests = (p: Record<string, unknown>, ingress: string) => {
    const spec = p.spec as { containers: Array<Record<string, unknown>> };
    const resources = { requests: { 'kubenet.io/ingress-bandwidth': ingress }, limits: { 'kubenet.io/ingress-bandwidth': ingress } };
    spec.containers[0] = { ...spec.containers[0], resources };
    return p;
  };
  return [
    withRequests(
      pausePod('up-shaped', { 'kubernetes.io/ingress-bandwidth': '50M', 'kubernetes.io/egress-bandwidth': '50M' }, node(2)),
      '20',
    ),
    withRequests(pausePod('up-guaranteed', {}, node(2)), '10'),
    pausePod('up-plain', {}, node(2)),
    pausePod('up-n1', {}, node(1)),
    pausePod('up-n3', {}, node(3)),
  ];
}

const ep = (ip: string): IperfEndpoint => ({ netns: '', netnsPath: `/proc/${pausePidOf(ip) ?? 'none'}/ns/net`, ip4: ip });

/**
 * One iperf3 flow that must survive: iperf3's own end-of-run race (topo.ts) is retried there, but a
 * run that failed before its last second lost its connection, and that fails the test.
 */
async function survivingFlow(t: ExecutionContext, server: IperfEndpoint, client: IperfEndpoint, seconds: number): Promise<IperfResult> {
  let started = 0;
  const failures: string[] = [];
  const r = await iperf(server, client, {
    seconds,
    onStart: () => {
      started = Date.now();
    },
    onRetry: (err) => {
      const ranS = (Date.now() - started) / 1000;
      t.log(`iperf3 ${client.ip4} → ${server.ip4} failed after ${ranS.toFixed(1)} s of ${seconds}: ${err.message}`);
      if (ranS < seconds - 1) failures.push(`${err.message} after ${ranS.toFixed(1)} s`);
    },
  });
  t.deepEqual(failures, [], `the flow ${client.ip4} → ${server.ip4} kept its connection`);
  return r;
}

const mbit = (xs: number[]) => xs.map((x) => (x / 1e6).toFixed(1)).join(' ');

serialTest(
  'a rolling upgrade from the previous release (kubectl apply of the manifest, unchanged) under running flows: no connection lost, the shaped flow at its limit every second, at most 1 s of ping lost; each new agent knows its pods and their limits, spreads the one tree over its shards, and sets up the next pod',
  (t) =>
    withTrafficLock(async () => {
      t.timeout(420_000);
      await c.kubectl(['apply', '-f', '-'], { input: JSON.stringify({ apiVersion: 'v1', kind: 'List', items: pods() }) });
      const names = pods().map((p) => `pod/${(p.metadata as { name: string }).name}`);
      await c.kubectl(['wait', '--for=condition=Ready', ...names, '--timeout=90s']);
      const list = (await c.json<PodList>(['get', 'pods'])).items;
      const ip = (name: string) => list.find((p) => p.metadata.name === name)?.status.podIP ?? '';
      const before = await agentStatus(2);
      const limitsBefore = before.pods.find((p) => p.name === 'up-shaped')?.limits;
      t.like(
        limitsBefore,
        { ingress: LIMIT, egress: LIMIT, ingressGuarantee: 20e6 },
        "the previous release's agent shapes the pod, with its guarantee",
      );
      const onOldShards = await shardIfbs((cmd, args) => c.inNode(2, cmd, args).then((r) => r.stdout), 'ingress');
      t.log(`before: ${node(2)}'s ingress shards ${onOldShards.join(', ')}`);

      const unroute = await lanRoutes([
        { cidr: (await c.json<{ spec: { podCIDR: string } }>(['get', 'node', node(2)])).spec.podCIDR, node: 2 },
      ]);
      try {
        const SECONDS = 150;
        const pinger = pingThroughout(
          (cmd, args) => execa('nsenter', ['-t', pausePidOf(ip('up-n1')) ?? '', '-n', cmd, ...args], { reject: false }),
          ip('up-shaped'),
          SECONDS + 30,
        );
        const shaped = survivingFlow(t, ep(ip('up-shaped')), LAN_HOST, SECONDS);
        const across = survivingFlow(t, ep(ip('up-n3')), ep(ip('up-n1')), SECONDS);
        await new Promise((r) => setTimeout(r, 8000));
        const t0 = Date.now();
        await rollTo(await readManifest());
        const rolled = Date.now() - t0;
        t.log(`rolled out from ${PREVIOUS.name} to the manifest's image in ${rolled} ms`);
        t.true(rolled < (SECONDS - 20) * 1000, `the rollout (${rolled} ms) ended inside the flows`);
        const [rs, ra] = await Promise.all([shaped, across]);
        const ping = await pinger.stop();
        t.log(`LAN host → up-shaped (n2, ingress 50M): ${mbit(rs.intervals)} Mbit/s`);
        t.log(`up-n1 → up-n3 (n1 → n3, pod to pod): ${mbit(ra.intervals)} Mbit/s`);
        t.log(`up-n1 pings up-shaped every 50 ms: ${ping.sent} sent, ${ping.lost} lost`);
        checkPingLoss(t, ping);
        // Every full second of the shaped flow past its first at its limit (TCP goodput is ~95 % of the wire rate).
        const low = rs.intervals.slice(1, -1).filter((b) => b < 0.8 * 0.95 * LIMIT);
        t.deepEqual(
          low.map((b) => (b / 1e6).toFixed(1)),
          [],
          'no second of the shaped flow below 80 % of its limit',
        );
        t.true(
          rs.intervals.slice(1, -1).every((b) => b <= 1.25 * LIMIT),
          'and none above 1.25x its limit (the shaping held across the upgrade)',
        );
        t.true(
          ra.intervals.slice(0, -1).every((b) => b > 0),
          'no second of the pod-to-pod flow without a byte',
        );
      } finally {
        await unroute();
      }

      for (const i of [1, 2, 3]) t.is((await agentPod(i)).image, await manifestImage(), `${node(i)} runs the manifest's image`);
      const after = await agentStatus(2);
      t.deepEqual(
        after.pods
          .filter((p) => p.namespace === 'default')
          .map((p) => p.name)
          .sort(),
        ['up-guaranteed', 'up-plain', 'up-shaped'],
        "n2's new agent knows its pods",
      );
      t.deepEqual(after.pods.find((p) => p.name === 'up-shaped')?.limits, limitsBefore, 'and keeps their limits, guarantee and band');
      const run = (cmd: string, args: string[]) => c.inNode(2, cmd, args).then((r) => r.stdout);
      const shards = await shardIfbs(run, 'ingress');
      t.true(shards.length >= 2, `the new agent has shards: ${shards.join(', ')}`);
      const used = new Set<string>();
      for (const p of after.pods.filter((x) => x.namespace === 'default')) {
        const target = redirectTarget(await run('tc', ['filter', 'show', 'dev', p.hostVeth ?? '', 'parent', '2:'])) ?? 'none';
        if (p.name !== 'up-plain') t.true(shards.includes(target), `${p.name}'s veth redirects to an ingress shard (${target})`);
        if (shards.includes(target)) used.add(target);
      }
      t.log(`after: ${node(2)}'s ingress shards ${shards.join(', ')}; its shaped pods on ${[...used].join(', ')}`);
      t.true(used.size >= 2, "the one tree's pods are spread over the shards");
      await c.kubectl(['apply', '-f', '-'], {
        input: JSON.stringify(pausePod('up-next', { 'kubernetes.io/ingress-bandwidth': '30M' }, node(2))),
      });
      await c.kubectl(['wait', '--for=condition=Ready', 'pod/up-next', '--timeout=60s']);
      t.like(
        (await agentStatus(2)).pods.find((p) => p.name === 'up-next')?.limits,
        { ingress: 30e6, egress: undefined },
        'the new agent sets up the next pod',
      );
    }),
);

async function readManifest(): Promise<string> {
  return readFile(MANIFEST, 'utf8');
}

async function manifestImage(): Promise<string> {
  return /image: (kubenet-ts:\S+)/.exec(await readManifest())?.[1] ?? '';
}

/** An IPv4 address as tc's u32 prints it in a match (0af40002). */
const hexIp = (ip: string) =>
  ip
    .split('.')
    .map((o) => Number(o).toString(16).padStart(2, '0'))
    .join('');

serialTest(
  "a downgrade to the previous release (its manifest again): its agents know the pods and keep their limits (measured), drop the shards they do not have; deleting the pods then leaves no veth, reservation, record, filter or leaf of theirs, and no ifb beyond the previous release's one tree each way",
  (t) =>
    withTrafficLock(async () => {
      t.timeout(300_000);
      const t0 = Date.now();
      await rollTo(await previousManifest());
      t.log(`rolled back to ${PREVIOUS.name} in ${Date.now() - t0} ms`);
      for (const i of [1, 2, 3]) t.is((await agentPod(i)).image, PREVIOUS.name, `${node(i)} runs ${PREVIOUS.name}`);
      const status = await agentStatus(2);
      const ours = status.pods.filter((p) => p.namespace === 'default' && p.name.startsWith('up-'));
      t.deepEqual(ours.map((p) => p.name).sort(), ['up-guaranteed', 'up-next', 'up-plain', 'up-shaped'], "n2's agent knows its pods");
      t.like(ours.find((p) => p.name === 'up-shaped')?.limits, { ingress: LIMIT, egress: LIMIT, ingressGuarantee: 20e6 });
      const run = (cmd: string, args: string[]) => c.inNode(2, cmd, args).then((r) => r.stdout);
      const ifbs = async () => [...(await shardIfbs(run, 'egress')), ...(await shardIfbs(run, 'ingress'))].sort();
      t.deepEqual(await ifbs(), ['kubenet-ifb0', 'kubenet-ifb0.in'], 'one tree each way, as the previous release keeps them');

      const list = (await c.json<PodList>(['get', 'pods'])).items;
      const ip = (name: string) => list.find((p) => p.metadata.name === name)?.status.podIP ?? '';
      const unroute = await lanRoutes([
        { cidr: (await c.json<{ spec: { podCIDR: string } }>(['get', 'node', node(2)])).spec.podCIDR, node: 2 },
      ]);
      try {
        const r = await survivingFlow(t, ep(ip('up-shaped')), LAN_HOST, 6);
        t.log(`after the downgrade, LAN host → up-shaped (ingress 50M): ${mbit(r.intervals)} Mbit/s`);
        const steady = r.intervals.slice(1, -1);
        t.true(
          steady.every((b) => b >= 0.8 * 0.95 * LIMIT && b <= 1.25 * LIMIT),
          'the pod is shaped at its limit by the previous release',
        );
      } finally {
        await unroute();
      }

      const gone = ours.map((p) => ({ name: p.name, ip: ip(p.name), veth: p.hostVeth ?? '' }));
      await c.kubectl(['delete', 'pod', ...gone.map((p) => p.name), ...['up-n1', 'up-n3'], '--wait=true', '--timeout=90s']);
      const left = async () => {
        const veths = (await run('ip', ['-o', 'link', 'show']))
          .split('\n')
          .filter((l) => gone.some((p) => p.veth && l.includes(` ${p.veth}@`)));
        const reservations = (await c.inNode(2, 'ls', ['/var/lib/cni/networks/kubenet'], false)).stdout
          .split('\n')
          .filter((f) => gone.some((p) => p.ip === f));
        const known = (await agentStatus(2)).pods.filter((p) => p.name.startsWith('up-')).map((p) => p.name);
        const shaping: string[] = [];
        for (const dev of await ifbs())
          shaping.push(
            ...(await run('tc', ['filter', 'show', 'dev', dev, 'parent', '1:']))
              .split('\n')
              .filter((l) => gone.some((p) => l.includes(`match ${hexIp(p.ip)}/ffffffff`))),
          );
        return { veths, reservations, known, shaping, ifbs: (await ifbs()).filter((n) => n !== 'kubenet-ifb0' && n !== 'kubenet-ifb0.in') };
      };
      const deadline = Date.now() + 30_000;
      let l = await left();
      while (Object.values(l).some((v) => v.length > 0) && Date.now() < deadline) {
        await new Promise((r) => setTimeout(r, 1000));
        l = await left();
      }
      t.deepEqual(l, { veths: [], reservations: [], known: [], shaping: [], ifbs: [] }, 'nothing of the pods is left on n2');
    }),
);
