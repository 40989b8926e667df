/**
 * kubenet-ts on a real Kubernetes cluster (hack/cluster.sh: etcd, kube-apiserver with Node + RBAC
 * authorization, kube-controller-manager allocating Node pod CIDRs, kube-scheduler, kubelet,
 * kube-proxy, containerd 2.x, all built from their modules at pinned versions, in a node sandbox):
 * `kubectl apply -f manifests/kubenet.yaml`, nothing else edited (the image imported into the node's
 * containerd by hack/cluster.sh), rolls out on the real kubelet; the node goes Ready once the agent
 * wrote its conflist; a Deployment of 20 pods runs with addresses from the node's spec.podCIDR and
 * their bandwidth annotations applied (Events through the real API server, judged by the real RBAC
 * authorizer); pods reach each other and the node; deleting them leaves nothing; `down` removes the
 * cluster. A namespace's bandwidth policy (kubenet.io/default-* and max-* annotations, issue 24):
 * defaults, pod limits below and above its ceiling measured with iperf3, the BandwidthCapped
 * Warning, status/top sources, and a ceiling lowered under load. The unshaped destinations (issue
 * 33): exactly the cluster's pod CIDRs and ServiceCIDRs, a ServiceCIDR created or deleted followed
 * live. Bandwidth as a resource of the node (issue 33): the Node shows the extended resources from
 * the uplink's link speed, a pod asking a guarantee runs with it, one asking more than is left stays
 * Pending with the scheduler's own "Insufficient" reason; the pods' band from their QoS class
 * (BestEffort: 2) is in their limits. Traffic only between the cluster's own namespaces (pings,
 * iperf3 between its pods and with the cluster's LAN namespace, which is outside the cluster's
 * ranges that the manifest's config leaves unshaped). Bringing the cluster up and
 * every step that loads the CPU hold the traffic lock (test/kit/traffic-lock.ts): a control plane
 * starting beside another suite's iperf3 measurement would measure the machine.
 */
import anyTest, { type TestFn } from 'ava';
import { execa } from 'execa';
import { join } from 'node:path';
import { cidrContains, parseCidr } from '../../src/net/ip.js';
import { mergeCidrs } from '../../src/shaper/unshaped.js';
import { msUntil, until } from '../kit/until.js';
import { parseQuantity } from '../../src/bandwidth/quantity.js';
import { uniq } from '../kit/kernel.js';
import { upstreamDir } from '../kit/upstream.js';
import { withTrafficLock } from '../kit/traffic-lock.js';
import { iperf, retryLog } from '../kit/topo.js';
import { clusterBlocker, LAN_HOST, lanRoutes, LocalCluster, MANIFEST, pausePidOf, pausePod, type PodList } from '../kit/kcl.js';
import { checkPingLoss, logRate, logUnshaped, pingThroughout } from '../kit/measure.js';
import { podLeaves } from '../kit/node-leaks.js';
import { type NodeRun, shardIfbs, tcOnShards } from '../kit/shards.js';

const blocker = clusterBlocker();
const test = anyTest as TestFn;
const serialTest = blocker ? test.serial.skip : test.serial;
if (blocker) console.warn(`cluster e2e tests skipped: ${blocker}`);

const NODE = 'kcl-n1';
const c = new LocalCluster();
let up = false;

const kubectl = (args: string[], opts: { input?: string; reject?: boolean } = {}) => c.kubectl(args, opts);
const json = <T>(args: string[]): Promise<T> => c.json<T>(args);
/** A command in the node's namespaces (its netns and private mounts). */
const inNode = (cmd: string, args: string[], reject = true) => c.inNode(1, cmd, args, reject);
const nodeRun: NodeRun = async (cmd, args) => (await inNode(cmd, args, false)).stdout;

test.before(async (t) => {
  if (blocker) return;
  const t0 = Date.now();
  const r = await c.up([], () => t.log("waiting for another suite's cluster to go down"));
  up = true;
  if (r.exitCode !== 0) throw new Error(`hack/cluster.sh up failed:\n${r.all ?? ''}`);
  t.log(`cluster up in ${Date.now() - t0} ms: ${r.stdout.trim()}`);
});

test.after.always(async () => {
  if (!up) return;
  await kubectl(['delete', 'deployment', 'web', '--wait=true', '--timeout=60s', '--ignore-not-found'], { reject: false });
  const r = await c.down();
  if (r.exitCode !== 0) throw new Error(`hack/cluster.sh down failed: ${r.all ?? ''}`);
});

serialTest(
  'the manifest, unchanged, rolls out on a real kubelet: the node goes from NotReady to Ready once the agent writes its conflist',
  (t) =>
    withTrafficLock(async () => {
      const ready = async () =>
        (await json<{ status: { conditions: Array<{ type: string; status: string }> } }>(['get', 'node', NODE])).status.conditions.find(
          (c) => c.type === 'Ready',
        )?.status;
      t.is(await ready(), 'False', 'NotReady before a network plugin');
      const t0 = Date.now();
      await kubectl(['apply', '-f', MANIFEST]);
      await kubectl(['-n', 'kube-system', 'rollout', 'status', 'daemonset/kubenet', '--timeout=120s']);
      const rolled = Date.now();
      await kubectl(['wait', '--for=condition=Ready', `node/${NODE}`, '--timeout=60s']);
      t.log(`DaemonSet rolled out ${rolled - t0} ms after apply; node Ready ${Date.now() - t0} ms after apply`);
      t.is(await ready(), 'True');
      t.deepEqual((await inNode('ls', ['/etc/cni/net.d'])).stdout.split('\n'), ['10-kubenet.conflist']);
    }),
);

serialTest(
  "unshaped by default: exactly the cluster's pod CIDRs and ServiceCIDRs (merged), on the ifb and in KUBENET-UNSHAPED; a ServiceCIDR created or deleted is followed live",
  (t) =>
    withTrafficLock(async () => {
      const chain = async () =>
        (await inNode('iptables', ['-t', 'mangle', '-S', 'KUBENET-UNSHAPED'], false)).stdout
          .split('\n')
          .filter((l) => l.startsWith('-A '))
          .map((l) => l.split(' ')[3] ?? '');
      // Per egress shard (each has the unshaped filters): how many send to the htb root.
      const ifbFilters = async () => {
        const counts: number[] = [];
        for (const dev of await shardIfbs(nodeRun, 'egress')) {
          counts.push(
            (await nodeRun('tc', ['filter', 'show', 'dev', dev, 'parent', '1:', 'prio', '4']))
              .split('\n')
              .filter((l) => /flowid 1: /.test(l)).length,
          );
        }
        return counts;
      };
      const each = async (n: number) => (await ifbFilters()).map(() => n);
      const wanted = async () => {
        const nodes = (await json<{ items: Array<{ spec: { podCIDRs?: string[] } }> }>(['get', 'nodes'])).items.flatMap(
          (n) => n.spec.podCIDRs ?? [],
        );
        const services = (await json<{ items: Array<{ spec: { cidrs?: string[] } }> }>(['get', 'servicecidrs'])).items.flatMap(
          (s) => s.spec.cidrs ?? [],
        );
        return {
          nodes,
          services,
          merged: mergeCidrs([...nodes, ...services].map((c) => parseCidr(c)))
            .filter((s) => s.family === 4)
            .map((s) => s.cidr),
        };
      };
      const want = await wanted();
      t.true(want.services.length > 0, 'the API server serves ServiceCIDRs (1.33+): at least the default one');
      await until(
        "the cluster's ranges in the chain",
        async () => JSON.stringify((await chain()).sort()) === JSON.stringify([...want.merged].sort()),
        10_000,
      );
      t.deepEqual(await ifbFilters(), await each(want.merged.length), 'one ifb filter per CIDR on every egress shard');
      t.false((await chain()).includes('10.0.0.0/8'), 'not nonMasqueradeCIDR any more');
      t.log(`pod CIDRs ${want.nodes.join(' ')}; ServiceCIDRs ${want.services.join(' ')}; unshaped ${want.merged.join(' ')}`);
      const name = `kus-e2e-${uniq(6)}`;
      const extra = '10.97.0.0/24';
      const t0 = Date.now();
      await kubectl(['apply', '-f', '-'], {
        input: JSON.stringify({ apiVersion: 'networking.k8s.io/v1', kind: 'ServiceCIDR', metadata: { name }, spec: { cidrs: [extra] } }),
      });
      try {
        await until('a new ServiceCIDR unshaped', async () => (await chain()).includes(extra), 10_000);
        t.log(`ServiceCIDR ${extra} created: in the chain ${Date.now() - t0} ms after kubectl apply started`);
        t.deepEqual(await ifbFilters(), await each(want.merged.length + 1));
      } finally {
        await kubectl(['delete', 'servicecidr', name, '--wait=true', '--timeout=60s'], { reject: false });
      }
      const t1 = Date.now();
      await until('a deleted ServiceCIDR shaped again', async () => !(await chain()).includes(extra), 10_000);
      t.log(`deleted (its finalizer done): out of the chain ${Date.now() - t1} ms later`);
      t.deepEqual(await ifbFilters(), await each(want.merged.length));
    }),
);

serialTest(
  "a Deployment of 20 pods runs with addresses from the node's spec.podCIDR, limits applied (Events), pods reach each other and the node; the agent logs no authorization error",
  (t) =>
    withTrafficLock(async () => {
      const podCidr = (await json<{ spec: { podCIDR: string } }>(['get', 'node', NODE])).spec.podCIDR;
      const deployment = {
        apiVersion: 'apps/v1',
        kind: 'Deployment',
        metadata: { name: 'web', namespace: 'default' },
        spec: {
          replicas: 20,
          selector: { matchLabels: { app: 'web' } },
          template: {
            metadata: {
              labels: { app: 'web' },
              annotations: { 'kubernetes.io/ingress-bandwidth': '10M', 'kubernetes.io/egress-bandwidth': '20M' },
            },
            spec: {
              containers: [{ name: 'pause', image: 'kubenet-ts.local/sandbox:1', imagePullPolicy: 'Never' }],
              terminationGracePeriodSeconds: 1,
            },
          },
        },
      };
      const t0 = Date.now();
      await kubectl(['apply', '-f', '-'], { input: JSON.stringify(deployment) });
      await kubectl(['rollout', 'status', 'deployment/web', '--timeout=180s']);
      t.log(`20 pods Ready ${Date.now() - t0} ms after apply`);
      const pods = (await json<PodList>(['get', 'pods', '-l', 'app=web'])).items;
      t.is(pods.length, 20);
      const ips = pods.map((p) => p.status.podIP ?? '');
      t.is(new Set(ips).size, 20, 'distinct addresses');
      const subnet = parseCidr(podCidr);
      for (const ip of ips) t.true(cidrContains(subnet, ip), `${ip} in the node's spec.podCIDR ${podCidr}`);
      t.log(`pod CIDR ${podCidr}; addresses ${ips.sort().join(' ')}`);

      const events = (
        await json<{ items: Array<{ involvedObject: { name: string }; message: string }> }>([
          'get',
          'events',
          '--field-selector',
          'reason=BandwidthApplied',
        ])
      ).items;
      const applied = new Set(events.filter((e) => /ingress 10M, egress 20M/.test(e.message)).map((e) => e.involvedObject.name));
      t.deepEqual(
        pods.map((p) => p.metadata.name).filter((n) => !applied.has(n)),
        [],
        'a BandwidthApplied Event on every pod',
      );

      // The node reaches every pod; one pod reaches every other (from its own netns: its pause process's).
      const fromNode = await Promise.all(ips.map((ip) => inNode('ping', ['-c', '1', '-W', '2', ip], false)));
      t.deepEqual(
        ips.filter((_, i) => fromNode[i]?.exitCode !== 0),
        [],
        'the node pings every pod',
      );
      const first = ips[0] ?? '';
      const pausePid = pausePidOf(first);
      t.truthy(pausePid, `the pause process of the pod with ${first}`);
      const fromPod = await Promise.all(
        ips.slice(1).map((ip) => execa('nsenter', ['-t', pausePid ?? '', '-n', 'ping', '-c', '1', '-W', '2', ip], { reject: false })),
      );
      t.deepEqual(
        ips.slice(1).filter((_, i) => fromPod[i]?.exitCode !== 0),
        [],
        `${first} pings every other pod`,
      );
      t.is(
        (await execa('nsenter', ['-t', pausePid ?? '', '-n', 'ping', '-c', '1', '-W', '2', '198.18.252.11'], { reject: false })).exitCode,
        0,
        'a pod pings the node',
      );

      const log = (await kubectl(['-n', 'kube-system', 'logs', 'daemonset/kubenet'])).stdout;
      t.notRegex(log, /forbidden|Forbidden|"statusCode":403/, 'no authorization error from the real RBAC authorizer');
      t.notRegex(log, /"level":(50|60)/, 'no error in the agent log');
    }),
);

serialTest(
  "annotations as users set them (ingress 10M, egress 20M) are enforced with a host outside the cluster (the LAN's): iperf3 within ±10 %, no full second above 1.25×; between two pods of the cluster the same pod runs at line rate (unshapedCIDRs unset: the cluster's pod CIDRs and Service ranges with routes direct)",
  (t) =>
    withTrafficLock(async () => {
      const pod = (name: string, annotations: Record<string, string>) => ({
        apiVersion: 'v1',
        kind: 'Pod',
        metadata: { name, namespace: 'default', annotations },
        spec: {
          containers: [{ name: 'pause', image: 'kubenet-ts.local/sandbox:1', imagePullPolicy: 'Never' }],
          terminationGracePeriodSeconds: 1,
        },
      });
      await kubectl(['apply', '-f', '-'], {
        input: JSON.stringify({
          apiVersion: 'v1',
          kind: 'List',
          items: [pod('shaped', { 'kubernetes.io/ingress-bandwidth': '10M', 'kubernetes.io/egress-bandwidth': '20M' }), pod('free', {})],
        }),
      });
      await kubectl(['wait', '--for=condition=Ready', 'pod/shaped', 'pod/free', '--timeout=60s']);
      const ipOf = async (name: string) => (await json<{ status: { podIP: string } }>(['get', 'pod', name])).status.podIP;
      const [shapedIp, freeIp] = [await ipOf('shaped'), await ipOf('free')];
      const ep = (ip: string) => ({ netns: '', netnsPath: `/proc/${pausePidOf(ip) ?? 'none'}/ns/net`, ip4: ip });
      const podCidr = (await json<{ spec: { podCIDR: string } }>(['get', 'node', NODE])).spec.podCIDR;
      // The LAN host reaches the pods through the node, as a host of the LAN routed to the cluster would.
      const unroute = await lanRoutes([{ cidr: podCidr, node: 1 }]);
      // 10 s per direction: a second or two of another suite's CPU load (outside the traffic lock: an
      // agent starting, a test compiling) averages out instead of failing the mean; the 1.25x bound
      // still holds per second.
      try {
        const ingress = await iperf(ep(shapedIp), LAN_HOST, { onRetry: retryLog(t), seconds: 10 });
        logRate(t, 'ingress 10M (LAN host → shaped)', ingress.bps, ingress.intervals, 10e6);
        const egress = await iperf(LAN_HOST, ep(shapedIp), { onRetry: retryLog(t), seconds: 10 });
        logRate(t, 'egress 20M (shaped → LAN host, masqueraded)', egress.bps, egress.intervals, 20e6);
        const fromPod = await iperf(ep(shapedIp), ep(freeIp), { onRetry: retryLog(t), seconds: 5 });
        logUnshaped(t, 'free → shaped (a pod of the cluster)', fromPod.bps, fromPod.intervals, 10e6);
        const toPod = await iperf(ep(freeIp), ep(shapedIp), { onRetry: retryLog(t), seconds: 5 });
        logUnshaped(t, 'shaped → free (a pod of the cluster)', toPod.bps, toPod.intervals, 20e6);
      } finally {
        await unroute();
        // Also after a failed measurement: the later tests count the pods and check for leftovers.
        await kubectl(['delete', 'pod', 'shaped', 'free', '--wait=true', '--timeout=60s']);
      }
    }),
);

serialTest(
  "namespace policy: a default for pods that ask none, a ceiling for those that ask more (BandwidthCapped Warning), a pod's lower limit stands, each measured with iperf3 (±10 %); status and top say where each limit came from; the ceiling lowered under load re-shapes live",
  (t) =>
    withTrafficLock(async () => {
      const NS = 'bw-policy';
      const DEFAULT_IN = 8e6;
      const MAX_IN = 20e6;
      const BELOW_IN = 12e6;
      const LOWERED_IN = 15e6;
      const namespace = {
        apiVersion: 'v1',
        kind: 'Namespace',
        metadata: { name: NS, annotations: { 'kubenet.io/default-ingress-bandwidth': '8M', 'kubenet.io/max-ingress-bandwidth': '20M' } },
      };
      const inNs = (p: Record<string, unknown>, ns: string) => ({ ...p, metadata: { ...(p.metadata as object), namespace: ns } });
      const items = [
        inNs(pausePod('none'), NS),
        inNs(pausePod('below', { 'kubernetes.io/ingress-bandwidth': '12M' }), NS),
        inNs(pausePod('above', { 'kubernetes.io/ingress-bandwidth': '50M' }), NS),
      ];
      // The measuring client: the LAN host, outside the cluster range the manifest's config leaves
      // unshaped (a pod of the cluster would reach these pods at line rate), routed to the pod CIDR.
      const client = LAN_HOST;
      const unroute = await lanRoutes([{ cidr: (await json<{ spec: { podCIDR: string } }>(['get', 'node', NODE])).spec.podCIDR, node: 1 }]);
      await kubectl(['apply', '-f', '-'], { input: JSON.stringify(namespace) });
      try {
        await kubectl(['apply', '-f', '-'], { input: JSON.stringify({ apiVersion: 'v1', kind: 'List', items }) });
        await kubectl(['-n', NS, 'wait', '--for=condition=Ready', 'pod/none', 'pod/below', 'pod/above', '--timeout=60s']);
        const ipOf = async (ns: string, name: string) =>
          (await json<{ status: { podIP: string } }>(['-n', ns, 'get', 'pod', name])).status.podIP;
        const ep = (ip: string) => ({ netns: '', netnsPath: `/proc/${pausePidOf(ip) ?? 'none'}/ns/net`, ip4: ip });

        // What the agent applied, and says: status (JSON) and top.
        const status = JSON.parse(
          (await kubectl(['-n', 'kube-system', 'exec', 'daemonset/kubenet', '--', 'kubenet', 'status', '--json'])).stdout,
        ) as { pods: Array<{ namespace: string; name: string; limits: object; limitSources?: object }> };
        const mine = (name: string) => status.pods.find((p) => p.namespace === NS && p.name === name);
        // Each pod's band is its QoS class's: BestEffort (2), on a node with a capacity.
        t.deepEqual(
          [mine('none')?.limits, mine('none')?.limitSources],
          [{ ingress: DEFAULT_IN, priority: 2 }, { ingress: 'namespace-default' }],
          'no limit asked: the namespace default',
        );
        t.deepEqual(
          [mine('below')?.limits, mine('below')?.limitSources],
          [{ ingress: BELOW_IN, priority: 2 }, { ingress: 'pod' }],
          "under the ceiling: the pod's own",
        );
        t.deepEqual(
          [mine('above')?.limits, mine('above')?.limitSources],
          [{ ingress: MAX_IN, priority: 2 }, { ingress: 'namespace-ceiling' }],
          'above the ceiling: the ceiling',
        );
        const topText = (await kubectl(['-n', 'kube-system', 'exec', 'daemonset/kubenet', '--', 'kubenet', 'top', '-b', '-n', '1'])).stdout;
        t.regex(topText, new RegExp(`${NS}/above +\\S+ +20M ns-ceiling `), 'top: the ceiling');
        t.regex(topText, new RegExp(`${NS}/none +\\S+ +8M ns-default `), 'top: the default');
        t.regex(topText, new RegExp(`${NS}/below +\\S+ +12M +`), "top: the pod's own, untagged");

        // The Events: a Warning on the capped pod that says so; the applied limits say where they came from.
        const events = (
          await json<{ items: Array<{ involvedObject: { name: string }; reason: string; type: string; message: string }> }>([
            '-n',
            NS,
            'get',
            'events',
          ])
        ).items;
        const about = (name: string, reason: string) =>
          events.filter((e) => e.involvedObject.name === name && e.reason === reason).map((e) => `${e.type} ${e.message}`);
        t.deepEqual(about('above', 'BandwidthCapped'), [
          'Warning kubernetes.io/ingress-bandwidth 50M is above the ceiling kubenet.io/max-ingress-bandwidth 20M of namespace bw-policy: ingress limited to 20M',
        ]);
        t.deepEqual(about('above', 'BandwidthApplied'), ['Normal bandwidth limits applied: ingress 20M (namespace ceiling)']);
        t.deepEqual(about('none', 'BandwidthApplied'), ['Normal bandwidth limits applied: ingress 8M (namespace default)']);
        t.deepEqual(about('below', 'BandwidthApplied'), ['Normal bandwidth limits applied: ingress 12M']);
        t.deepEqual(
          [...about('none', 'BandwidthCapped'), ...about('below', 'BandwidthCapped')],
          [],
          'no Warning for pods within the policy',
        );

        // Measured: client → each pod (its ingress), 10 s each.
        for (const [name, limit] of [
          ['none', DEFAULT_IN],
          ['below', BELOW_IN],
          ['above', MAX_IN],
        ] as const) {
          const r = await iperf(ep(await ipOf(NS, name)), client, { onRetry: retryLog(t), seconds: 10 });
          logRate(t, `${NS}/${name} ingress ${limit / 1e6}M`, r.bps, r.intervals, limit);
        }

        // The ceiling lowered to 15M (still above the pod asking 12M) while a flow saturates the capped pod: its limit follows live.
        const above = ep(await ipOf(NS, 'above'));
        let started = 0;
        const flow = iperf(above, client, { onRetry: retryLog(t), seconds: 18, onStart: () => (started = Date.now()) });
        while (started === 0) await new Promise((r) => setTimeout(r, 50));
        await new Promise((r) => setTimeout(r, 6000 - (Date.now() - started)));
        const changedAt = Date.now() - started;
        await kubectl(['annotate', 'namespace', NS, 'kubenet.io/max-ingress-bandwidth=15M', '--overwrite']);
        const r = await flow;
        const mean = (xs: number[]) => xs.reduce((a, b) => a + b, 0) / Math.max(1, xs.length);
        const before = r.intervals.slice(1, 5);
        const after = r.intervals.slice(9, 18);
        t.log(
          `ceiling 20M -> 15M at ${changedAt} ms into the flow; 1 s intervals ${r.intervals.map((i) => (i / 1e6).toFixed(2)).join(' ')} Mbit/s`,
        );
        t.true(Math.abs(mean(before) / MAX_IN - 1) <= 0.1, `before the change: ${mean(before)} within ±10 % of ${MAX_IN}`);
        t.true(Math.abs(mean(after) / LOWERED_IN - 1) <= 0.1, `after the change: ${mean(after)} within ±10 % of ${LOWERED_IN}`);
        t.true(Math.max(...after) <= 1.25 * LOWERED_IN, `after the change no 1 s interval above 1.25 × ${LOWERED_IN}: ${after.join(' ')}`);
        const lowered = (
          await json<{ items: Array<{ involvedObject: { name: string }; reason: string; message: string }> }>(['-n', NS, 'get', 'events'])
        ).items
          .filter((e) => e.involvedObject.name === 'above')
          .map((e) => `${e.reason} ${e.message}`);
        t.true(
          lowered.includes(
            'BandwidthApplied bandwidth limits applied: ingress 15M (namespace ceiling) (were ingress 20M (namespace ceiling))',
          ),
          lowered.join(' | '),
        );
        t.true(
          lowered.includes(
            'BandwidthCapped kubernetes.io/ingress-bandwidth 50M is above the ceiling kubenet.io/max-ingress-bandwidth 15M of namespace bw-policy: ingress limited to 15M',
          ),
          lowered.join(' | '),
        );
        const after2 = JSON.parse(
          (await kubectl(['-n', 'kube-system', 'exec', 'daemonset/kubenet', '--', 'kubenet', 'status', '--json'])).stdout,
        ) as typeof status;
        t.deepEqual(
          after2.pods
            .filter((p) => p.namespace === NS)
            .map((p) => [p.name, p.limits])
            .sort(),
          [
            ['above', { ingress: LOWERED_IN, priority: 2 }],
            ['below', { ingress: BELOW_IN, priority: 2 }],
            ['none', { ingress: DEFAULT_IN, priority: 2 }],
          ],
          'only the pod above the new ceiling changed',
        );
      } finally {
        // Also after a failed measurement: the later tests count the pods and check for leftovers.
        await unroute();
        await kubectl(['delete', 'namespace', NS, '--wait=true', '--timeout=120s', '--ignore-not-found']);
      }
    }),
);

serialTest(
  "kubectl annotate --overwrite changes a running pod's limits live, with a BandwidthApplied Event that says what they were; an invalid value keeps them, with a BandwidthRejected Warning",
  (t) =>
    withTrafficLock(async () => {
      const pod = (await json<PodList>(['get', 'pods', '-l', 'app=web'])).items[0]?.metadata.name ?? '';
      await kubectl(['annotate', 'pod', pod, 'kubernetes.io/egress-bandwidth=5M', '--overwrite']);
      const deadline = Date.now() + 30_000;
      let messages: string[] = [];
      while (Date.now() < deadline) {
        const events = (
          await json<{ items: Array<{ involvedObject: { name: string }; message: string }> }>([
            'get',
            'events',
            '--field-selector',
            `reason=BandwidthApplied,involvedObject.name=${pod}`,
          ])
        ).items;
        messages = events.map((e) => e.message);
        if (messages.some((m) => /egress 5M/.test(m))) break;
        await new Promise((r) => setTimeout(r, 250));
      }
      t.true(
        messages.some((m) => /ingress 10M, egress 5M \(were ingress 10M, egress 20M\)/.test(m)),
        `the Event: ${messages.join(' | ')}`,
      );
      const status = JSON.parse(
        (await kubectl(['-n', 'kube-system', 'exec', 'daemonset/kubenet', '--', 'kubenet', 'status', '--json'])).stdout,
      ) as { pods: Array<{ name: string; limits: object }> };
      t.deepEqual(
        status.pods.find((p) => p.name === pod)?.limits,
        { ingress: 10e6, egress: 5e6, priority: 2 },
        'kubenet status in the agent pod shows the new limits',
      );
      // An invalid value keeps the limits and says why (Warning BandwidthRejected, in kubectl describe).
      await kubectl(['annotate', 'pod', pod, 'kubernetes.io/egress-bandwidth=5 Mbit', '--overwrite']);
      const rejectedBy = Date.now() + 30_000;
      let described = '';
      while (Date.now() < rejectedBy) {
        described = (await kubectl(['describe', 'pod', pod])).stdout;
        if (/Warning\s+BandwidthRejected/.test(described)) break;
        await new Promise((r) => setTimeout(r, 250));
      }
      t.regex(
        described,
        /Warning\s+BandwidthRejected\s.*5 Mbit/,
        'kubectl describe pod shows the Warning BandwidthRejected with the value',
      );
      t.regex(described, /Normal\s+BandwidthApplied\s/, 'and the earlier BandwidthApplied');
      const kept = JSON.parse(
        (await kubectl(['-n', 'kube-system', 'exec', 'daemonset/kubenet', '--', 'kubenet', 'status', '--json'])).stdout,
      ) as { pods: Array<{ name: string; limits: object }> };
      t.deepEqual(
        kept.pods.find((p) => p.name === pod)?.limits,
        { ingress: 10e6, egress: 5e6, priority: 2 },
        'the invalid value kept the limits',
      );
    }),
);

serialTest(
  "bandwidth as a resource of the node: the Node shows kubenet.io/{egress,ingress}-bandwidth at the uplink's link speed (manifest unchanged); a pod asking a guarantee runs with it and status counts it; one asking more than is left stays Pending with the scheduler's Insufficient reason",
  (t) =>
    withTrafficLock(async () => {
      // The capacity the agent read: the link speed of the node's default-route device (its uplink veth).
      const dev = /\bdev (\S+)/.exec((await inNode('ip', ['-4', 'route', 'show', 'default'])).stdout)?.[1] ?? '';
      const mbit = Number((await inNode('cat', [`/sys/class/net/${dev}/speed`])).stdout.trim());
      t.true(Number.isInteger(mbit) && mbit > 0, `${dev} reports a link speed (${mbit})`);
      type NodeStatus = { status: { capacity: Record<string, string>; allocatable: Record<string, string> } };
      const shown = async () => (await json<NodeStatus>(['get', 'node', NODE])).status;
      let st = await shown();
      for (
        const deadline = Date.now() + 30_000;
        st.allocatable['kubenet.io/egress-bandwidth'] === undefined && Date.now() < deadline;
        st = await shown()
      )
        await new Promise((r) => setTimeout(r, 500));
      for (const r of ['kubenet.io/egress-bandwidth', 'kubenet.io/ingress-bandwidth']) {
        t.is(parseQuantity(st.capacity[r] ?? ''), BigInt(mbit), `capacity ${r}: ${st.capacity[r]}`);
        t.is(parseQuantity(st.allocatable[r] ?? ''), BigInt(mbit), `allocatable ${r}: ${st.allocatable[r]}`);
      }
      const asking = (name: string, egress: number, ingress: number, annotations: Record<string, string> = {}) => {
        const p = pausePod(name, annotations) as { spec: { containers: Array<Record<string, unknown>> } };
        const resources = { 'kubenet.io/egress-bandwidth': String(egress), 'kubenet.io/ingress-bandwidth': String(ingress) };
        p.spec.containers[0] = { ...p.spec.containers[0], resources: { requests: resources, limits: resources } };
        return p;
      };
      await kubectl(['apply', '-f', '-'], {
        input: JSON.stringify({
          apiVersion: 'v1',
          kind: 'List',
          items: [asking('guaranteed', 100, 50, { 'kubernetes.io/egress-bandwidth': '200M' })],
        }),
      });
      try {
        await kubectl(['wait', '--for=condition=Ready', 'pod/guaranteed', '--timeout=60s']);
        const status = JSON.parse(
          (await kubectl(['-n', 'kube-system', 'exec', 'daemonset/kubenet', '--', 'kubenet', 'status', '--json'])).stdout,
        ) as {
          bandwidth: { capacity: { egress?: number }; committed: { egress: number; ingress: number } };
          pods: Array<{ name: string; limits: object }>;
        };
        t.deepEqual(
          status.pods.find((p) => p.name === 'guaranteed')?.limits,
          { egress: 200e6, egressGuarantee: 100e6, ingressGuarantee: 50e6, priority: 2 },
          'its guarantees, its ceiling, its band (BestEffort: extended resources are no cpu or memory)',
        );
        t.is(status.bandwidth.capacity.egress, mbit * 1e6);
        t.deepEqual(status.bandwidth.committed, { egress: 100e6, ingress: 50e6 });
        const text = (await kubectl(['-n', 'kube-system', 'exec', 'daemonset/kubenet', '--', 'kubenet', 'status'])).stdout;
        t.regex(text, new RegExp(`egress +100M guaranteed, ${(mbit - 100) / 1000}G free`), text);
        // The trees that enforce it: the egress shards' shares of the capacity, and where the pods that asked for nothing are.
        t.regex(
          text,
          /guaranteed, .* free of .*\n {10}(\d+ shards, shares [\d.]+[kMGT]?( \/ [\d.]+[kMGT]?)+|1 tree, at \S+); pods that asked for nothing (kept out|in the trees)/,
          text,
        );
        // More than is left: the scheduler keeps it Pending, with its own reason.
        await kubectl(['apply', '-f', '-'], { input: JSON.stringify(asking('toobig', mbit - 99, 1)) });
        let reasons: string[] = [];
        for (
          const deadline = Date.now() + 30_000;
          !reasons.some((m) => /Insufficient kubenet\.io\/egress-bandwidth/.test(m)) && Date.now() < deadline;
        ) {
          await new Promise((r) => setTimeout(r, 500));
          const events = (
            await json<{ items: Array<{ message: string }> }>([
              'get',
              'events',
              '--field-selector',
              'reason=FailedScheduling,involvedObject.name=toobig',
            ])
          ).items;
          reasons = events.map((e) => e.message);
        }
        t.true(
          reasons.some((m) => /Insufficient kubenet\.io\/egress-bandwidth/.test(m)),
          `FailedScheduling: ${reasons.join(' | ')}`,
        );
        t.log(`the scheduler: ${reasons[0]}`);
        t.is((await json<{ status: { phase: string } }>(['get', 'pod', 'toobig'])).status.phase, 'Pending');
      } finally {
        await kubectl(['delete', 'pod', 'guaranteed', 'toobig', '--wait=true', '--timeout=60s', '--ignore-not-found']);
      }
    }),
);

serialTest(
  "guarantees hold under contention, measured from a host on the LAN: in its own copy of the ConfigMap the node's capacity is 100M both ways (the Node shows 100); two pods guaranteed 60M and 20M to them, saturated at once, each get at least their guarantee and together no more than the capacity; the ConfigMap restored after",
  (t) =>
    withTrafficLock(async () => {
      const CAP = 100e6;
      const original =
        (await json<{ data: Record<string, string> }>(['-n', 'kube-system', 'get', 'configmap', 'kubenet-config'])).data['config.yaml'] ??
        '';
      const setConfig = async (text: string) => {
        await kubectl([
          '-n',
          'kube-system',
          'patch',
          'configmap',
          'kubenet-config',
          '--type',
          'merge',
          '-p',
          JSON.stringify({ data: { 'config.yaml': text } }),
        ]);
        await kubectl(['-n', 'kube-system', 'rollout', 'restart', 'daemonset/kubenet']);
        await kubectl(['-n', 'kube-system', 'rollout', 'status', 'daemonset/kubenet', '--timeout=120s']);
      };
      const allocatable = async () =>
        (await json<{ status: { allocatable: Record<string, string> } }>(['get', 'node', NODE])).status.allocatable[
          'kubenet.io/ingress-bandwidth'
        ];
      await setConfig(`${original.replace(/\n*$/, '\n')}egressCapacity: 100M\ningressCapacity: 100M\n`);
      let unroute: (() => Promise<void>) | undefined;
      try {
        for (const deadline = Date.now() + 30_000; (await allocatable()) !== '100' && Date.now() < deadline; )
          await new Promise((r) => setTimeout(r, 500));
        t.is(await allocatable(), '100', 'the Node shows the configured capacity');
        const asking = (name: string, ingress: number) => {
          const p = pausePod(name, {}) as { spec: { containers: Array<Record<string, unknown>> } };
          const resources = { 'kubenet.io/ingress-bandwidth': String(ingress) };
          p.spec.containers[0] = { ...p.spec.containers[0], resources: { requests: resources, limits: resources } };
          return p;
        };
        await kubectl(['apply', '-f', '-'], {
          input: JSON.stringify({ apiVersion: 'v1', kind: 'List', items: [asking('g60', 60), asking('g20', 20)] }),
        });
        await kubectl(['wait', '--for=condition=Ready', 'pod/g60', 'pod/g20', '--timeout=60s']);
        const ipOf = async (name: string) => (await json<{ status: { podIP: string } }>(['get', 'pod', name])).status.podIP;
        const ep = (ip: string) => ({ netns: '', netnsPath: `/proc/${pausePidOf(ip) ?? 'none'}/ns/net`, ip4: ip });
        const [a, b] = [ep(await ipOf('g60')), ep(await ipOf('g20'))];
        unroute = await lanRoutes([{ cidr: (await json<{ spec: { podCIDR: string } }>(['get', 'node', NODE])).spec.podCIDR, node: 1 }]);
        // Both at once from the LAN host, as fast as TCP goes: the ingress tree divides the node's 100M.
        const [ra, rb] = await Promise.all([
          iperf(a, LAN_HOST, { onRetry: retryLog(t), seconds: 10 }),
          iperf(b, LAN_HOST, { onRetry: retryLog(t), seconds: 10 }),
        ]);
        t.log(
          `guaranteed 60M: ${(ra.bps / 1e6).toFixed(1)} Mbit/s, guaranteed 20M: ${(rb.bps / 1e6).toFixed(1)} Mbit/s (TCP goodput; the tree counts frames: goodput is ~95 % of it)`,
        );
        t.true(ra.bps >= 0.95 * 0.98 * 60e6, `the 60M pod got ${(ra.bps / 1e6).toFixed(1)} Mbit/s`);
        t.true(rb.bps >= 0.95 * 0.98 * 20e6, `the 20M pod got ${(rb.bps / 1e6).toFixed(1)} Mbit/s`);
        t.true(ra.bps + rb.bps <= 1.02 * CAP, `together ${((ra.bps + rb.bps) / 1e6).toFixed(1)} Mbit/s`);
      } finally {
        await unroute?.();
        await kubectl(['delete', 'pod', 'g60', 'g20', '--wait=true', '--timeout=60s', '--ignore-not-found']);
        await setConfig(original);
      }
    }),
);

serialTest(
  'a rolling update of the DaemonSet to a new image tag: a running pod keeps its network (pinged every 50 ms, at most 1 s lost) and the new agent knows every pod',
  (t) =>
    withTrafficLock(async () => {
      const tag = `kubenet-ts:e2e-${uniq(4)}`;
      const current =
        (
          await json<{ spec: { template: { spec: { containers: Array<{ image: string }> } } } }>([
            '-n',
            'kube-system',
            'get',
            'daemonset',
            'kubenet',
          ])
        ).spec.template.spec.containers[0]?.image ?? '';
      await inNode(join(upstreamDir('containerd'), 'ctr'), [
        '--address',
        '/run/containerd/containerd.sock',
        '-n',
        'k8s.io',
        'images',
        'tag',
        `docker.io/library/${current}`,
        `docker.io/library/${tag}`,
      ]);
      const target = (await json<PodList>(['get', 'pods', '-l', 'app=web'])).items[1]?.status.podIP ?? '';
      const pinger = pingThroughout((cmd, args) => inNode(cmd, args, false), target, 120);
      await new Promise((r) => setTimeout(r, 500));
      const t0 = Date.now();
      await kubectl(['-n', 'kube-system', 'set', 'image', 'daemonset/kubenet', `kubenet=${tag}`]);
      await kubectl(['-n', 'kube-system', 'rollout', 'status', 'daemonset/kubenet', '--timeout=120s']);
      const rolled = Date.now() - t0;
      await new Promise((r) => setTimeout(r, 500));
      const ping = await pinger.stop();
      t.log(`rolled out to ${tag} in ${rolled} ms; ping every 50 ms: ${ping.sent} sent, ${ping.lost} lost`);
      checkPingLoss(t, ping);
      const status = JSON.parse(
        (await kubectl(['-n', 'kube-system', 'exec', 'daemonset/kubenet', '--', 'kubenet', 'status', '--json'])).stdout,
      ) as { pods: Array<{ namespace: string; name: string }> };
      const known = status.pods.map((p) => `${p.namespace}/${p.name}`);
      t.is(known.filter((k) => k.startsWith('default/web-')).length, 20, 'the new agent knows the 20 pods');
      // The node's other pod: CoreDNS (hack/cluster.sh deploys it as kube-dns; it runs once the agent does).
      t.deepEqual(
        known.filter((k) => !k.startsWith('default/web-')).map((k) => k.replace(/-[a-z0-9]+-[a-z0-9]+$/, '')),
        ['kube-system/coredns'],
        "and CoreDNS's, nothing else",
      );
    }),
);

serialTest(
  'a kubelet restart and a containerd restart: the node stays Ready, running pods keep their network and their address, and a new pod still gets one',
  (t) =>
    withTrafficLock(async () => {
      const before = new Map(
        (await json<PodList>(['get', 'pods', '-l', 'app=web'])).items.map((p) => [p.metadata.name, p.status.podIP ?? '']),
      );
      for (const service of ['kubelet', 'containerd']) {
        const t0 = Date.now();
        await c.restart(service);
        // The node's kubelet sees its runtime again, and reports Ready.
        await new Promise((r) => setTimeout(r, 2000));
        await kubectl(['wait', '--for=condition=Ready', `node/${NODE}`, '--timeout=60s']);
        const pods = (await json<PodList>(['get', 'pods', '-l', 'app=web'])).items;
        t.deepEqual(
          new Map(pods.map((p) => [p.metadata.name, p.status.podIP ?? ''])),
          before,
          `after the ${service} restart: the same pods, the same addresses`,
        );
        const pings = await Promise.all([...before.values()].map((ip) => inNode('ping', ['-c', '1', '-W', '2', ip], false)));
        t.deepEqual(
          [...before.values()].filter((_, i) => pings[i]?.exitCode !== 0),
          [],
          `after the ${service} restart the node pings every pod`,
        );
        t.log(`${service} restarted; node Ready and every pod answering ${Date.now() - t0} ms later`);
      }
      await kubectl(['scale', 'deployment/web', '--replicas=21']);
      await kubectl(['rollout', 'status', 'deployment/web', '--timeout=120s']);
      const after = (await json<PodList>(['get', 'pods', '-l', 'app=web'])).items.filter((p) => !before.has(p.metadata.name));
      t.is(after.length, 1, 'one new pod');
      t.truthy(after[0]?.status.podIP, 'the new pod has an address');
    }),
);

/** Events about pod `name` (reason, source component and message), oldest first. */
async function podEvents(name: string): Promise<Array<{ reason: string; type: string; component: string; message: string }>> {
  const items = (
    await json<{
      items: Array<{
        reason: string;
        type: string;
        source?: { component?: string };
        reportingComponent?: string;
        message: string;
        firstTimestamp?: string;
      }>;
    }>(['get', 'events', '--field-selector', `involvedObject.name=${name}`])
  ).items;
  return items.map((e) => ({
    reason: e.reason,
    type: e.type,
    component: e.source?.component ?? e.reportingComponent ?? '',
    message: e.message,
  }));
}

serialTest(
  "an invalid bandwidth annotation on a new pod: containerd refuses the sandbox before any CNI call (kubelet's FailedCreatePodSandBox names neither), and the agent's pod watch gives the pod one BandwidthRejected Warning naming the annotation, the value and the accepted form; fixed, the pod starts",
  (t) =>
    withTrafficLock(async () => {
      const name = `badbw-${uniq(4)}`;
      await kubectl(['create', '-f', '-'], {
        input: JSON.stringify(pausePod(name, { 'kubernetes.io/ingress-bandwidth': '10 Mbit' }, NODE)),
      });
      try {
        let events: Awaited<ReturnType<typeof podEvents>> = [];
        for (const end = Date.now() + 60_000; Date.now() < end; await new Promise((r) => setTimeout(r, 500))) {
          events = await podEvents(name);
          if (
            events.some((e) => e.reason === 'BandwidthRejected') &&
            events.filter((e) => e.reason === 'FailedCreatePodSandBox').length >= 2
          )
            break;
        }
        const kubelet = events.filter((e) => e.reason === 'FailedCreatePodSandBox');
        const ours = events.filter((e) => e.reason === 'BandwidthRejected');
        t.log(`kubelet: ${kubelet[0]?.message ?? '(none)'}`);
        t.log(`kubenet: ${ours[0]?.message ?? '(none)'}`);
        t.true(kubelet.length >= 2, 'kubelet tried the sandbox more than once');
        t.false(
          kubelet.some((e) => e.message.includes('kubernetes.io/ingress-bandwidth')),
          "containerd's refusal names no annotation (why the agent says it)",
        );
        t.is(ours.length, 1, 'one Warning from the agent, however often kubelet retries');
        t.like(ours[0], { type: 'Warning', component: 'kubenet' });
        t.true(
          ['kubernetes.io/ingress-bandwidth', '"10 Mbit"', 'e.g. "10M"'].every((w) => ours[0]?.message.includes(w)),
          ours[0]?.message,
        );
        await kubectl(['annotate', '--overwrite', 'pod', name, 'kubernetes.io/ingress-bandwidth=10M']);
        await kubectl(['wait', '--for=condition=Ready', `pod/${name}`, '--timeout=120s']);
        t.is((await podEvents(name)).filter((e) => e.reason === 'BandwidthRejected').length, 1, 'nothing more once fixed');
      } finally {
        await kubectl(['delete', 'pod', name, '--wait=true', '--timeout=60s'], { reject: false });
      }
    }),
);

serialTest(
  "a full state disk: kubelet's FailedCreatePodSandBox carries the CNI error naming the file, the errno and what to do; nothing is left of the refused pod, and it starts once space is freed",
  (t) =>
    withTrafficLock(async () => {
      const name = `fullbw-${uniq(4)}`;
      const ls = async (dir: string) =>
        (await inNode('ls', [dir], false)).stdout
          .split('\n')
          .filter((f) => f !== '' && !f.startsWith('.'))
          .sort();
      const state = async () => ({
        records: await ls('/var/lib/kubenet/pods'),
        reservations: (await ls('/var/lib/cni/networks/kubenet')).filter((f) => /^\d+\.\d+\.\d+\.\d+$/.test(f)),
      });
      const before = await state();
      // The node's /var/lib/kubenet (a tmpfs of its own, hostPath in the agent's pod) held to what it
      // uses plus 64 KiB and filled, its spare record files gone (a record is written into a spare's
      // blocks: while one is left, a full disk refuses nothing), as on a disk that filled up before the agent started.
      await inNode('find', ['/var/lib/kubenet/.pods-spare', '-type', 'f', '-delete'], false);
      const usedK = Number((await inNode('df', ['-k', '--output=used', '/var/lib/kubenet'])).stdout.split('\n')[1]?.trim());
      await inNode('mount', ['-o', `remount,size=${usedK + 64}k`, '/var/lib/kubenet']);
      try {
        await inNode('dd', ['if=/dev/zero', 'of=/var/lib/kubenet/kcl-fill', 'bs=4k'], false);
        await kubectl(['create', '-f', '-'], { input: JSON.stringify(pausePod(name, { 'kubernetes.io/egress-bandwidth': '10M' }, NODE)) });
        let failed: string | undefined;
        for (const end = Date.now() + 60_000; !failed && Date.now() < end; await new Promise((r) => setTimeout(r, 500))) {
          failed = (await podEvents(name)).find((e) => e.reason === 'FailedCreatePodSandBox')?.message;
        }
        t.log(`kubelet: ${failed ?? '(none)'}`);
        t.regex(
          failed ?? '',
          /cannot write the pod record \/var\/lib\/kubenet\/pods\/\S+: no space left on device \(ENOSPC\): free space or inodes on the filesystem holding \/var\/lib\/kubenet/,
        );
        t.deepEqual(await state(), before, 'no record or reservation of the refused pod');
      } finally {
        await inNode('rm', ['-f', '/var/lib/kubenet/kcl-fill'], false);
        await inNode('mount', ['-o', 'remount,size=50%', '/var/lib/kubenet'], false);
      }
      try {
        await kubectl(['wait', '--for=condition=Ready', `pod/${name}`, '--timeout=120s']);
      } finally {
        await kubectl(['delete', 'pod', name, '--wait=true', '--timeout=60s'], { reject: false });
      }
      let after = await state();
      for (const end = Date.now() + 30_000; JSON.stringify(after) !== JSON.stringify(before) && Date.now() < end; after = await state())
        await new Promise((r) => setTimeout(r, 500));
      t.deepEqual(after, before, 'deleted, the pod leaves no record or reservation');
    }),
);

serialTest(
  'kube-apiserver stopped 20 s: once it accepts writes, an annotation change is in the kernel within 10 s (the 3 s p99 goal: bench/api-outage.ts) and a new pod runs with its limits',
  (t) =>
    withTrafficLock(async () => {
      const pod = (await json<PodList>(['get', 'pods', '-l', 'app=web'])).items[1]?.metadata.name ?? '';
      await c.stop('kube-apiserver');
      await new Promise((r) => setTimeout(r, 20_000));
      await c.start('kube-apiserver');
      const t0 = await c.firstWrite(() =>
        kubectl(['--request-timeout=3s', 'annotate', '--overwrite', 'pod', pod, 'kubernetes.io/egress-bandwidth=23M']),
      );
      const ms = await msUntil(async () => (await tcOnShards(nodeRun, 'egress', 'class')).includes(' ceil 23Mbit '), t0, 30_000);
      t.log(`the annotation change in the kernel ${ms} ms after the first accepted write`);
      // A bound that tells recovery from the old backoff (37 s) in one run on a loaded machine; the goal is the bench's.
      t.true(ms <= 10_000, `within 10 s: ${ms} ms`);
      const name = `after-api-${uniq(4)}`;
      const records = async () =>
        (await inNode('ls', ['/var/lib/kubenet/pods'], false)).stdout
          .split('\n')
          .filter((f) => f !== '')
          .sort()
          .join();
      const before = await records();
      await kubectl(['create', '-f', '-'], { input: JSON.stringify(pausePod(name, { 'kubernetes.io/egress-bandwidth': '24M' }, NODE)) });
      try {
        await kubectl(['wait', '--for=condition=Ready', `pod/${name}`, '--timeout=120s']);
        t.true((await tcOnShards(nodeRun, 'egress', 'class')).includes(' ceil 24Mbit '), "the new pod's limit");
      } finally {
        await kubectl(['delete', 'pod', name, '--wait=true', '--timeout=120s'], { reject: false });
      }
      // kubelet's own watch is in client-go's backoff after the restart: its teardown may come late, but it comes.
      await until("the new pod's record gone", async () => (await records()) === before, 120_000);
      await kubectl(['annotate', '--overwrite', 'pod', pod, 'kubernetes.io/egress-bandwidth=20M']);
    }),
);

serialTest(
  'deleting the pods leaves nothing on the node: no reservation, veth, record, shaping leaf or filter, iptables rule or runtime cache entry; the pod that stays (CoreDNS) keeps its own',
  (t) =>
    withTrafficLock(async () => {
      const podIps = (await json<PodList>(['get', 'pods', '-l', 'app=web'])).items.map((p) => p.status.podIP ?? '').filter(Boolean);
      t.true(podIps.length >= 20);
      // CoreDNS (hack/cluster.sh's kube-dns) stays: what is its own is no leftover. (Deleting it too would
      // measure the controller-manager's recovery from the API server's restart above, up to a minute here.)
      const status = JSON.parse(
        (await kubectl(['-n', 'kube-system', 'exec', 'daemonset/kubenet', '--', 'kubenet', 'status', '--json'])).stdout,
      ) as { pods: Array<{ namespace: string; name: string; id: string; ips: string[]; hostVeth?: string }> };
      const dns = status.pods.find((p) => p.namespace === 'kube-system' && p.name.startsWith('coredns-'));
      t.truthy(dns?.hostVeth, 'CoreDNS runs on the node');
      // Its leaves on the ifb: the classes its address's filters lead to ("match 0af40002/ffffffff at 16" under a "flowid 1:801" line).
      const hex = (dns?.ips[0] ?? '')
        .split('/')[0]!
        .split('.')
        .map((o) => Number(o).toString(16).padStart(2, '0'))
        .join('');
      // Every shard of both directions' trees, its lines prefixed with its name (class ids are per shard).
      const shards = async () => [...(await shardIfbs(nodeRun, 'egress')), ...(await shardIfbs(nodeRun, 'ingress'))];
      const onShards = async (object: 'qdisc' | 'filter', extra: string[]) => {
        const out: string[] = [];
        for (const dev of await shards())
          out.push(...(await nodeRun('tc', [object, 'show', 'dev', dev, ...extra])).split('\n').map((l) => `${dev}: ${l}`));
        return out;
      };
      const dnsFlows = new Set<string>();
      let flow: string | undefined;
      for (const l of await onShards('filter', ['parent', '1:'])) {
        const dev = l.slice(0, l.indexOf(': '));
        const id = /flowid (1:[0-9a-f]+)/.exec(l)?.[1];
        flow = id ? `${dev}: ${id}` : l.startsWith(`${dev}:  `) ? flow : undefined;
        if (flow && l.includes(`match ${hex}/ffffffff at `)) dnsFlows.add(flow);
      }
      const notDns = (l: string) =>
        !(
          dns &&
          (l.includes(dns.id) ||
            (dns.hostVeth && l.includes(`${dns.hostVeth}@`)) ||
            dns.ips.some((ip) => ip.split('/')[0] === l) ||
            [...dnsFlows].some((f) => {
              const [dev, id] = f.split(': ');
              return l.startsWith(`${dev}: `) && (l.includes(`parent ${id} `) || l.includes(`flowid ${id} `));
            }))
        );
      await kubectl(['delete', 'deployment', 'web', '--wait=true', '--timeout=120s']);
      await kubectl(['wait', '--for=delete', 'pod', '-l', 'app=web', '--timeout=120s'], { reject: false });
      const settled = async () => {
        const reservations = (await inNode('ls', ['/var/lib/cni/networks/kubenet'], false)).stdout
          .split('\n')
          .filter((f) => /^\d+\.\d+\.\d+\.\d+$/.test(f))
          .filter(notDns);
        const veths = (await inNode('ip', ['-o', 'link', 'show', 'master', 'cbr0'], false)).stdout
          .split('\n')
          .filter((l) => l.trim() !== '')
          .filter(notDns);
        const records = (await inNode('ls', ['/var/lib/kubenet/pods'], false)).stdout
          .split('\n')
          .filter((f) => f !== '')
          .filter(notDns);
        // A pod's ifb classes stay idle for the next pods; its leaves and filters go.
        const shaping = (await onShards('qdisc', []))
          .filter((l) => podLeaves([l.slice(l.indexOf(': ') + 2)]).length > 0)
          .concat((await onShards('filter', ['parent', '1:'])).filter((l) => /flowid 1:[0-9a-f]+/.test(l)))
          .filter(notDns);
        const runtimeCache = (await inNode('ls', ['/var/lib/cni/results'], false)).stdout
          .split('\n')
          .filter((f) => f !== '')
          .filter(notDns);
        // No rule of any table names a pod that was (kube-proxy's, the runtime's or ours).
        const rules = (await inNode('iptables-save', [], false)).stdout.split('\n');
        const iptables = rules.filter((l) =>
          podIps.some((ip) => new RegExp(`[^0-9.]${ip.replace(/\./g, '\\.')}(/32)?[^0-9.]`).test(` ${l} `)),
        );
        return { reservations, veths, records, shaping, runtimeCache, iptables };
      };
      const deadline = Date.now() + 30_000;
      let left = await settled();
      while (Object.values(left).some((v) => v.length > 0) && Date.now() < deadline) {
        await new Promise((r) => setTimeout(r, 500));
        left = await settled();
      }
      t.deepEqual(left, { reservations: [], veths: [], records: [], shaping: [], runtimeCache: [], iptables: [] });
      const dnsState = [
        (await inNode('ls', ['/var/lib/cni/networks/kubenet'], false)).stdout,
        (await inNode('ls', ['/var/lib/kubenet/pods'], false)).stdout,
        (await inNode('ls', ['/var/lib/cni/results'], false)).stdout,
        (await inNode('ip', ['-o', 'link', 'show', 'master', 'cbr0'], false)).stdout,
      ];
      t.deepEqual(
        dnsState.map((x) => x.split('\n').filter((l) => l !== '' && !notDns(l)).length),
        [1, 1, 2, 1],
        'CoreDNS keeps its reservation, record, runtime cache entries (its kubenet and loopback networks) and veth',
      );
      t.log(`CoreDNS's own, left as they are: ${dns?.ips.join(',')}, ${dns?.hostVeth}, ifb classes ${[...dnsFlows].join(' ')}`);
    }),
);
