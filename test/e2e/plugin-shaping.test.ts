/**
 * Shaping through KubenetPlugin from pod annotations, measured with iperf3 between the test's own
 * pod namespaces (never any other address). Limits are on L2 frames, so TCP goodput sits ~4.4%
 * below them; the ±10% bound allows for that.
 */
import anyTest, { type TestFn } from 'ava';
import { execa } from 'execa';
import { ConfigError } from '../../src/errors.js';
import { iperf, retryLog, type TopoPod } from '../kit/topo.js';
import { ipJson, kernelTestBlocker, linkExists } from '../kit/kernel.js';
import { PluginHarness } from '../kit/plugin-harness.js';
import type { TestPod } from '../kit/test-pod.js';
import { podLeaves } from '../kit/node-leaks.js';

const iperfMissing = (await execa('iperf3', ['--version'], { reject: false }).catch(() => ({ exitCode: 1 }))).exitCode !== 0;
const blocker = kernelTestBlocker() ?? (iperfMissing ? 'needs iperf3 (run hack/bootstrap.sh)' : undefined);
const test = anyTest as TestFn;
const serialTest = blocker ? test.serial.skip : test.serial;
if (blocker) console.warn(`plugin shaping e2e tests skipped: ${blocker}`);

const MBIT = 1e6;

async function topoPod(h: PluginHarness, p: TestPod, index: number): Promise<TopoPod> {
  const status = await h.plugin.getPodNetworkStatus(p.namespace, p.name, p.id);
  const rec = h.plugin.listPods().find((r) => r.containerId === p.id);
  return { index, netns: p.netns, netnsPath: p.netnsPath, hostVeth: rec?.hostVeth ?? '', ip4: status.ip, ip6: '', id: p.id };
}

function assertRate(
  t: { true: (v: boolean, m?: string) => void; log: (...a: unknown[]) => void },
  what: string,
  bps: number,
  intervals: number[],
  limit: number,
) {
  t.log(
    `${what}: ${(bps / MBIT).toFixed(2)} Mbit/s of ${limit / MBIT}, intervals ${intervals.map((i) => (i / MBIT).toFixed(2)).join(' ')}`,
  );
  t.true(bps >= 0.9 * limit && bps <= 1.1 * limit, `${what} ${bps} within ±10% of ${limit}`);
  t.true(Math.max(...intervals) <= 1.25 * limit, `${what}: no 1 s interval above 1.25x the limit`);
}

serialTest(
  'annotated pods are shaped both ways, an unshaped pod is not, an invalid annotation is refused, teardown leaves nothing',
  async (t) => {
    const h = new PluginHarness();
    t.teardown(() => h.cleanup.run());
    const plugin = await h.start();
    t.true(plugin.capabilities().has('shaping'));
    await plugin.init(h.host, 'hairpin-veth', '0.0.0.0/0');
    await plugin.event('pod-cidr-change', { 'pod-cidr': '10.94.7.0/24' });

    const shaped = await h.addPod('shaped', { 'kubernetes.io/ingress-bandwidth': '20M', 'kubernetes.io/egress-bandwidth': '10M' });
    const free = await h.addPod('free');
    const peer = await h.addPod('peer');
    const bad = await h.addPod('bad', { 'kubernetes.io/egress-bandwidth': '10 Mbit' });
    for (const p of [shaped, free, peer]) await plugin.setUpPod(p.namespace, p.name, p.id);

    const err = await t.throwsAsync(plugin.setUpPod(bad.namespace, bad.name, bad.id), { instanceOf: ConfigError });
    t.regex(err?.message ?? '', /kubernetes\.io\/egress-bandwidth/);
    t.regex(err?.message ?? '', /10 Mbit/);
    t.false(await linkExists('eth0', bad.netns), 'refused pod got no veth');
    t.is((await h.reservedIps()).length, 3, 'refused pod reserved no address');

    const [s, f, p] = await Promise.all([topoPod(h, shaped, 0), topoPod(h, free, 1), topoPod(h, peer, 2)]);
    // Egress (from the shaped pod): client in the shaped pod, server in the peer.
    const egress = await iperf(p, s, { onRetry: retryLog(t), seconds: 5 });
    assertRate(t, 'egress 10M', egress.bps, egress.intervals, 10 * MBIT);
    // Ingress (to the shaped pod): server in the shaped pod, client in the peer.
    const ingress = await iperf(s, p, { onRetry: retryLog(t), seconds: 5 });
    assertRate(t, 'ingress 20M', ingress.bps, ingress.intervals, 20 * MBIT);
    // The unshaped pod is far above both limits.
    const unshaped = await iperf(p, f, { onRetry: retryLog(t), seconds: 2 });
    t.log(`unshaped: ${(unshaped.bps / MBIT).toFixed(0)} Mbit/s`);
    t.true(unshaped.bps > 200 * MBIT, `unshaped pod runs free (${unshaped.bps})`);

    const hostVeth = s.hostVeth;
    t.true(hostVeth.length > 0);
    const classes = async () =>
      (await execa('tc', ['class', 'show', 'dev', h.ifb])).stdout.split('\n').filter((l) => /^class htb 1:/.test(l));
    t.is((await classes()).length, 3, 'the shaped pod has one egress class on the ifb, with an interactive and a bulk leaf');

    for (const pod of [shaped, free, peer]) await plugin.tearDownPod(pod.namespace, pod.name, pod.id);
    t.deepEqual(podLeaves((await execa('tc', ['qdisc', 'show', 'dev', h.ifb])).stdout.split('\n')), [], 'no pod leaf left on the ifb');
    t.is((await classes()).length, 3, "the pod's classes stay, idle, for the next shaped pod");
    const filters = (await execa('tc', ['filter', 'show', 'dev', h.ifb, 'parent', '1:'])).stdout;
    t.false(/flowid 1:[0-9a-f]+/.test(filters), `no pod filter left on the ifb: ${filters}`);
    t.false(await linkExists(hostVeth), 'host veth (and its qdiscs) gone');
    t.deepEqual(await ipJson(['link', 'show', 'master', h.bridge]), []);
    t.deepEqual(await h.reservedIps(), []);
  },
);
