/**
 * DEL while a restarted agent waits for its pod CIDR (cluster mode, the Node watch has not delivered
 * it yet, e.g. the API server is slow or down): what the churn e2e ran into. A DEL needs the pod
 * CIDR only to build the bridge config that releases an address no record describes; everything
 * else (a recorded pod, host-port rules, nothing held at all) is done, and succeeds, without it.
 *
 * In a NodeSandbox: the agent by flags on private dirs with a static pod CIDR sets four host-port
 * pods up through libcni; it is SIGKILLed; the node is left as a crash can leave it; the agent
 * restarts on the same dirs in cluster mode against a fake API server whose Node has no pod CIDR
 * yet (it listens, /healthz 503). Then, as containerd would:
 * - pod A was fully deleted before the crash: its Remove (DEL, empty netns, its portMappings) succeeds;
 * - pod B has only its host-port rules left (no record, no address: a portmap that outlived the
 *   agent): its DEL succeeds and removes them;
 * - pod C has its record: its DEL succeeds and removes everything;
 * - pod D has an address reserved but no record: its DEL fails with 11 "try again later" and changes
 *   nothing, until the Node gets its pod CIDR; then it succeeds and releases the address.
 * Sends no traffic.
 */
import anyTest, { type TestFn } from 'ava';
import { execa } from 'execa';
import { randomInt } from 'node:crypto';
import { readdir, rm, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { agentGet, HEALTH_PATH } from '../../src/daemon/protocol.js';
import { flagsAgent, startFlagsAgent } from '../kit/agent-process.js';
import { FakeApiServer, fakeKubeConfig, node as nodeObject } from '../kit/fake-apiserver.js';
import { NO_LEFTOVERS, podLeftovers, podNatRules } from '../kit/node-leaks.js';
import { cniErrorCode, SandboxLibcni, SandboxWorld, sandboxTestBlocker } from '../kit/sandbox-libcni.js';
import type { TestPod } from '../kit/test-pod.js';

const blocker = sandboxTestBlocker();
const test = anyTest as TestFn;
const serialTest = blocker ? test.serial.skip : test.serial;
if (blocker) console.warn(`restart-DEL e2e skipped: ${blocker}`);

serialTest('DEL while the restarted agent has no pod CIDR yet: only an unrecorded address waits for it', async (t) => {
  t.timeout(90_000);
  await SandboxWorld.run(t, { prefix: 'kch' }, async (world) => {
    const { sb, cleanup } = world;
    const cidr = `10.${randomInt(100, 200)}.${randomInt(256)}.0/24`;
    const { agent: first, settings: s } = await startFlagsAgent(sb, { podCidr: cidr });
    world.agent = first;
    world.libcni = new SandboxLibcni(sb, { confDir: s.cniConfDir, binDirs: [s.cniBinDir], cacheDir: join(sb.tmpDir, 'libcni-cache') });
    const tag = world.tag;
    // Each pod's host port goes with every call, as containerd passes the portMappings on DEL too.
    const pods: TestPod[] = [];
    for (const [i, name] of ['a', 'b', 'c', 'd'].entries()) {
      const p = await world.newPod(name);
      p.runtimeConfig = { portMappings: [{ HostPort: 31000 + randomInt(1000) * 4 + i, ContainerPort: 8080, Protocol: 'tcp', HostIP: '' }] };
      const r = await world.call('add', p);
      if (r.exitCode !== 0) throw new Error(`ADD ${name}: ${r.stderr}`);
      pods.push(p);
    }
    const [a, b, c, d] = pods as [TestPod, TestPod, TestPod, TestPod];
    const nat = async () => podNatRules((await sb.exec('iptables-save', ['-t', 'nat'])).stdout.split('\n'));
    const natOf = async (p: TestPod) => (await nat()).filter((l) => l.includes(`${p.ip}:8080`) || l.includes(p.id));
    for (const p of pods) t.true((await natOf(p)).length > 0, `pod ${p.name} has its host-port rules`);

    // Pod A: Stop (DEL with its netns) before the crash; its Remove comes after the restart.
    t.is((await world.call('del', a)).exitCode, 0, 'DEL a');
    await first.kill();
    // What a crash can leave: B only its host-port rules; D an address and no record; C everything.
    const records = sb.hostPath(join(s.stateDir, 'pods'));
    const reservations = sb.hostPath(join(s.ipamDataDir, 'kubenet'));
    await rm(join(records, `${b.id}@eth0.json`));
    await rm(join(reservations, b.ip ?? 'none'));
    await rm(join(records, `${d.id}@eth0.json`));

    // The restart, in cluster mode: the Node has no pod CIDR yet.
    const api = await FakeApiServer.start();
    cleanup.add(() => api.stop());
    const nodeName = `kch-node-${tag}`;
    api.setNode(nodeObject(nodeName));
    await sb.exposeHostPort(api.port);
    const kubeconfig = join(sb.tmpDir, 'kubeconfig');
    await writeFile(kubeconfig, fakeKubeConfig(`http://127.0.0.1:${api.port}`).exportConfig());
    const agent = flagsAgent(sb, { kubeconfig, nodeName }).agent;
    world.agent = agent;
    await agent.start({ ready: false });
    const health = await agentGet(sb.hostPath(s.socket), HEALTH_PATH);
    t.is(health.status, 503, `the agent waits for its pod CIDR: ${health.body}`);

    const removeA = await world.call('del', a, { netns: '' });
    t.is(removeA.exitCode, 0, `A (nothing held): the Remove DEL succeeds without the pod CIDR: ${removeA.stderr}`);
    const delB = await world.call('del', b, { netns: '' });
    t.is(delB.exitCode, 0, `B (only host-port rules left): DEL succeeds without the pod CIDR: ${delB.stderr}`);
    t.deepEqual(await natOf(b), [], 'B: its host-port rules are gone');
    const delC = await world.call('del', c);
    t.is(delC.exitCode, 0, `C (recorded): DEL succeeds without the pod CIDR: ${delC.stderr}`);
    t.deepEqual(await natOf(c), [], 'C: its host-port rules are gone');
    const before = await natOf(d);
    const delD = await world.call('del', d);
    t.is(cniErrorCode(delD), 11, `D (an address, no record): DEL answers "try again later" until the pod CIDR is known: ${delD.stderr}`);
    t.regex(delD.stderr, /no pod CIDR yet/);
    t.true((await readdir(reservations)).includes(d.ip ?? 'none'), 'D: its address is still reserved');
    t.deepEqual(await natOf(d), before, 'D: its host-port rules are untouched by the refused DEL');

    // The Node gets its pod CIDR: the retried DEL of D goes through.
    api.setNode(nodeObject(nodeName, { podCIDR: cidr, podCIDRs: [cidr] }));
    const until = Date.now() + 20_000;
    while (Date.now() < until && (await agentGet(sb.hostPath(s.socket), HEALTH_PATH)).status !== 200)
      await new Promise((r) => setTimeout(r, 100));
    const retryD = await world.call('del', d);
    t.is(retryD.exitCode, 0, `D: the retried DEL succeeds once the pod CIDR is known: ${retryD.stderr}`);
    for (const p of [c, d]) {
      await execa('ip', ['netns', 'del', p.netns]);
      t.is((await world.call('del', p, { netns: '' })).exitCode, 0, `${p.name}: the Remove DEL`);
    }
    await execa('ip', ['netns', 'del', b.netns]);
    t.deepEqual(
      await podLeftovers(sb, {
        bridgeName: s.bridgeName,
        ifbName: s.ifbName,
        ipamDataDir: s.ipamDataDir,
        stateDir: s.stateDir,
        runtimeCacheDir: world.libcni.cacheDir,
      }),
      NO_LEFTOVERS,
      'nothing of any pod is left',
    );
  });
});
