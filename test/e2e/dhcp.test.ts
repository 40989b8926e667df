/**
 * dhcp mode end to end (issue 13): the agent as a process in a NodeSandbox with `ipam: dhcp`, its
 * `uplink` the sandbox's uplink veth, whose other end, in the sandbox's lan netns, is served by a
 * real DHCP server: dnsmasq, listening only there, on a range of the sandbox's own test subnet.
 * Pods are set up through the installed CNI binary by the reference runtime library (libcni).
 *
 * What it checks: leases from dnsmasq's range with address, gateway and route from the lease; ping
 * to the LAN side; the bridge no gateway and no masquerade rule; shaping, a host port, status and
 * metrics as in host-local mode; a renewal seen by dnsmasq; the same address after the agent (with
 * its lease daemon) is SIGKILLed and restarted, and after the daemon alone is killed, renewals going
 * on after that; the release seen by dnsmasq on DEL; DEL succeeding when the lease or the daemon is
 * gone; with no server answering, an ADD failing within the configured timeout and leaving nothing.
 * It logs the times it saw (acquire, renew, re-acquire, release).
 *
 * dnsmasq's shortest lease is 2 minutes, but it sends the renewal time T1 (option 58) it is given,
 * and the reference dhcp client renews at T1: T1 = 6 s here, so a renewal comes within seconds.
 * Traffic only between the sandbox's namespaces and the test's pod namespaces.
 */
import anyTest, { type ExecutionContext, type TestFn } from 'ava';
import { execa } from 'execa';
import { existsSync, readFileSync } from 'node:fs';
import { mkdir, readdir, readFile } from 'node:fs/promises';
import { join } from 'node:path';
import { agentGet } from '../../src/daemon/protocol.js';
import { socketAnswers } from '../../src/pod/index.js';
import { CNI_BIN_DIRS } from '../kit/kernel.js';
import { refPlugin } from '../kit/upstream.js';
import { SandboxWorld, sandboxTestBlocker } from '../kit/sandbox-libcni.js';
import type { TestPod } from '../kit/test-pod.js';
import { Dnsmasq, pluginClientId } from '../kit/dnsmasq.js';
import { tcOnShards } from '../kit/shards.js';

const tools = ['/usr/sbin/dnsmasq', refPlugin('dhcp')].find((p) => !existsSync(p));
const blocker =
  sandboxTestBlocker() ?? (tools ? `needs ${tools} (hack/bootstrap.sh installs dnsmasq-base and builds the reference plugins)` : undefined);
const test = anyTest as TestFn;
const serialTest = blocker ? test.serial.skip : test.serial;
if (blocker) console.warn(`dhcp e2e tests skipped: ${blocker}`);

// An ADD here takes ~6 s: the bridge plugin asks for the lease while the pod's eth0 is still down,
// the daemon sets it up and its first send fails ("network is down", retried after 2±1 s), and
// dnsmasq pings an address before offering it (~3 s).
const DHCP_TIMEOUT_S = 12;
const T1_S = 6;
const BRIDGE = 'cbr0';

/** The LAN beside the node, and what the tests carry from one to the next. */
interface Dhcp {
  /** The DHCP server on the lan side of the uplink. */
  dnsmasq: Dnsmasq;
  /** The LAN's /24, its first three octets. */
  net: string;
  lanIp: string;
  /** The node's end of the uplink, a port of the bridge. */
  uplink: string;
  /** The pods that are up. */
  pods: TestPod[];
  times: Record<string, string>;
}

let world: SandboxWorld | undefined;
let dhcp: Dhcp | undefined;
function w(): SandboxWorld {
  if (!world) throw new Error('setup failed');
  return world;
}
function shared(): Dhcp {
  if (!dhcp) throw new Error('setup failed');
  return dhcp;
}

const SOCKET = '/run/kubenet/kubenet.sock';

async function status(): Promise<{ pods: Array<{ id: string; ips: string[]; limits: Record<string, number> }> }> {
  return JSON.parse((await agentGet(w().sb.hostPath(SOCKET), '/v1/status')).body) as {
    pods: Array<{ id: string; ips: string[]; limits: Record<string, number> }>;
  };
}

async function podAddr(p: TestPod): Promise<string> {
  return (await execa('ip', ['-n', p.netns, '-o', '-4', 'addr', 'show', 'dev', 'eth0'], { reject: false })).stdout;
}

/** The lease daemon's pid, from the pid file it writes beside its socket. */
async function daemonPid(): Promise<number> {
  return Number((await readFile(w().sb.hostPath('/run/kubenet/dhcp.pid'), 'utf8')).trim());
}

function alive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return !readFileSync(`/proc/${pid}/stat`, 'utf8').includes(') Z ');
  } catch {
    return false;
  }
}

/** Every pod's lease held by the same client ID with the address the pod has. */
async function assertLeases(t: ExecutionContext, pods: TestPod[], what: string): Promise<void> {
  const leases = await shared().dnsmasq.leases();
  for (const p of pods) {
    const l = leases.find((x) => x.clientId === pluginClientId(p.id));
    t.is(l?.ip, p.ip, `${what}: dnsmasq leases ${p.ip} to pod ${p.name}'s client ID`);
    t.true((await podAddr(p)).includes(`${p.ip}/24`), `${what}: pod ${p.name} still has ${p.ip}`);
  }
}

test.before(async (t) => {
  if (blocker) return;
  t.timeout(90_000);
  world = await SandboxWorld.create({ prefix: 'kdh' });
  const sb = world.sb;
  const u = sb.uplink;
  // The uplink becomes a bridge port: it gives up its address (the node keeps none on this LAN).
  await sb.exec('ip', ['addr', 'flush', 'dev', u.nodeIf]);
  const net = u.lanIp.replace(/\.2$/, '');
  const dir = join(sb.tmpDir, 'dnsmasq');
  await mkdir(dir, { recursive: true });
  const dnsmasq = new Dnsmasq({
    netns: sb.lanNetns,
    iface: u.lanIf,
    rangeStart: `${net}.50`,
    rangeEnd: `${net}.59`,
    netmask: '255.255.255.0',
    router: u.lanIp,
    leaseSec: 120,
    t1Sec: T1_S,
    t2Sec: 100,
    dir,
  });
  await dnsmasq.start();
  world.cleanup.add(() => dnsmasq.stop());
  const args = [
    '--ipam',
    'dhcp',
    '--uplink',
    u.nodeIf,
    '--dhcp-timeout',
    String(DHCP_TIMEOUT_S),
    '--pod-cidr',
    '10.244.13.0/24',
    '--plugin-bin-dirs',
    CNI_BIN_DIRS.join(','),
    '--log-level',
    'info',
  ];
  const agent = await world.startAgent(args, { socket: SOCKET });
  dhcp = { dnsmasq, net, lanIp: u.lanIp, uplink: u.nodeIf, pods: [], times: {} };
  t.log(`node netns ${sb.netns}, uplink ${u.nodeIf} to ${sb.lanNetns} (dnsmasq ${net}.50-59 on ${u.lanIf}), agent pid ${agent.pid}`);
});

test.after.always(async (t) => {
  if (dhcp) t.log(`times seen: ${JSON.stringify(dhcp.times)}`);
  await world?.destroy();
});

serialTest(
  'leases from dnsmasq: address, gateway and route from the lease, the LAN reachable; no gateway on the bridge, no masquerade; shaping, host port, status, metrics',
  async (t) => {
    const shaped = await w().newPod('shaped');
    const web = await w().newPod('web');
    const hostPort = 32000 + Math.floor(Math.random() * 700);
    const acquired: number[] = [];
    for (const [p, rc] of [
      [shaped, { bandwidth: { IngressRate: 10e6, IngressBurst: 4294967295, EgressRate: 5e6, EgressBurst: 4294967295 } }],
      [web, { portMappings: [{ HostPort: hostPort, ContainerPort: 8080, Protocol: 'tcp', HostIP: '' }] }],
    ] as const) {
      const r = await w().call('add', p, { runtimeConfig: rc });
      t.is(r.exitCode, 0, `ADD ${p.name}: ${r.stderr}`);
      if (r.exitCode !== 0) return;
      const res = JSON.parse(r.stdout) as { ips: Array<{ address: string; gateway?: string }> };
      shared().pods.push(p);
      acquired.push(Math.round(r.ms));
      t.regex(res.ips[0]?.address ?? '', new RegExp(`^${shared().net.replace(/\./g, '\\.')}\\.5\\d/24$`), "an address of dnsmasq's range");
      t.is(res.ips[0]?.gateway, shared().lanIp, 'the gateway from the lease (option 3)');
      const route = (await execa('ip', ['-n', p.netns, 'route', 'show', 'default'])).stdout;
      t.regex(route, new RegExp(`default via ${shared().lanIp.replace(/\./g, '\\.')} dev eth0`), 'the default route from the lease');
    }
    shared().times.acquireMs = acquired.join(',');
    t.log(`ADD (lease acquired through dnsmasq) took ${acquired.join(' ms, ')} ms`);
    await assertLeases(t, shared().pods, 'after ADD');

    for (const p of shared().pods) {
      const ping = await execa('ip', ['netns', 'exec', p.netns, 'ping', '-c', '1', '-W', '2', shared().lanIp], { reject: false });
      t.is(ping.exitCode, 0, `pod ${p.name} reaches the LAN side ${shared().lanIp}: ${ping.stdout}`);
    }
    const ping = await execa('ip', ['netns', 'exec', shaped.netns, 'ping', '-c', '1', '-W', '2', web.ip ?? ''], { reject: false });
    t.is(ping.exitCode, 0, 'pods reach each other');

    // The node: uplink a port of the bridge, no address on the bridge, no masquerade rule.
    t.regex(await w().inNode('ip', ['-o', 'link', 'show', 'dev', shared().uplink]), new RegExp(`master ${BRIDGE}`));
    t.is((await w().inNode('ip', ['-o', '-4', 'addr', 'show', 'dev', BRIDGE])).trim(), '', 'the bridge is no gateway');
    const nat = await w().inNode('iptables', ['-w', '5', '-t', 'nat', '-S']);
    t.false(nat.includes('kubenet-ts: SNAT'), 'no masquerade rule');
    t.true(nat.includes(`--to-destination ${web.ip}:8080`), 'the host port DNAT rule');
    t.regex(await tcOnShards((cmd, args) => w().inNode(cmd, args), 'egress', 'class'), /rate 5Mbit/, "the shaped pod's egress class");
    for (const p of shared().pods) {
      const check = await w().call('check', p);
      t.is(check.exitCode, 0, `CHECK ${p.name}: ${check.stderr}`);
    }

    const st = await status();
    t.deepEqual(
      st.pods.map((p) => [p.id, p.ips]).sort(),
      shared()
        .pods.map((p) => [p.id, [p.ip]])
        .sort(),
      'status lists the pods with their leased addresses',
    );
    t.deepEqual(st.pods.find((p) => p.id === shaped.id)?.limits, { ingress: 10e6, egress: 5e6 });
    const metrics = (await agentGet(w().sb.hostPath(SOCKET), '/metrics')).body;
    t.regex(metrics, /^kubenet_pods 2$/m);
    t.regex(metrics, /^kubenet_shaped_pods 1$/m);
    t.regex(metrics, /^kubenet_cni_add_seconds_count 2$/m);
    t.deepEqual(await readdir(w().sb.hostPath('/var/lib/cni/networks')).catch(() => []), [], 'no host-local reservations');
  },
);

serialTest('the lease daemon renews: dnsmasq sees a DHCPREQUEST for each pod every T1, and the lease is extended', async (t) => {
  const [p] = shared().pods;
  if (!p?.ip) return t.fail('no pod');
  const skip = (await shared().dnsmasq.events()).length;
  const isRenewal = (e: { kind: string; ip?: string | undefined }) => e.kind === 'DHCPREQUEST' && e.ip === p.ip;
  const r1 = await shared().dnsmasq.waitFor(isRenewal, (T1_S + 10) * 1000, skip);
  const n1 = (await shared().dnsmasq.events()).length;
  await shared().dnsmasq.waitFor((e) => e.kind === 'DHCPACK' && e.ip === p.ip, 5000, skip);
  await new Promise((r) => setTimeout(r, 300));
  const expiry1 = (await shared().dnsmasq.leases()).find((l) => l.ip === p.ip)?.expiry ?? 0;
  // The next renewal, not another line of the same exchange (a CHECK just before may also have made
  // the daemon ask; lines read in one poll share their seenAt): at least 1 s later.
  const r2 = await shared().dnsmasq.waitFor((e) => isRenewal(e) && e.seenAt >= r1.seenAt + 1000, (T1_S + 10) * 1000, n1);
  await shared().dnsmasq.waitFor((e) => e.kind === 'DHCPACK' && e.ip === p.ip, 5000, n1);
  await new Promise((r) => setTimeout(r, 300));
  const expiry2 = (await shared().dnsmasq.leases()).find((l) => l.ip === p.ip)?.expiry ?? 0;
  const interval = r2.seenAt - r1.seenAt;
  shared().times.renewIntervalMs = String(interval);
  t.log(`renewals of ${p.ip} ${interval} ms apart (T1 ${T1_S} s); lease expiry moved ${expiry2 - expiry1} s`);
  t.true(interval > (T1_S - 2) * 1000 && interval < (T1_S + 4) * 1000, `renewed every ~T1: ${interval} ms`);
  t.true(expiry2 > expiry1, 'the lease was extended');
  t.regex(await w().agent.logTail(400), /lease renewed/, "the daemon's output is in the agent's log");
});

serialTest(
  'the same addresses after the agent and its lease daemon are SIGKILLed and restarted, and after the daemon alone is killed; renewals go on',
  async (t) => {
    const pods = shared().pods;
    const oldDaemon = await daemonPid();
    await w().agent.kill();
    // The daemon dies with its agent (parent-death signal): nothing renews until the next agent.
    for (let i = 0; i < 50 && alive(oldDaemon); i++) await new Promise((r) => setTimeout(r, 100));
    t.false(alive(oldDaemon), 'the lease daemon died with the agent');

    let skip = (await shared().dnsmasq.events()).length;
    const started = Date.now();
    await w().agent.start();
    for (const p of pods) {
      const ack = await shared().dnsmasq.waitFor((e) => e.kind === 'DHCPACK' && e.ip === p.ip, 20_000, skip);
      shared().times[`readoptAfterAgentRestartMs_${p.name}`] = String(ack.seenAt - started);
    }
    t.log(`after the agent restart (${Date.now() - started} ms): leases acquired again for ${pods.map((p) => p.ip).join(', ')}`);
    await assertLeases(t, pods, 'after the agent restart');
    t.deepEqual((await status()).pods.map((p) => p.ips[0]).sort(), pods.map((p) => p.ip).sort());
    const newDaemon = await daemonPid();
    t.not(newDaemon, oldDaemon);

    // The daemon alone: the agent restarts it and has it take the leases again.
    skip = (await shared().dnsmasq.events()).length;
    const killedAt = Date.now();
    process.kill(newDaemon, 'SIGKILL');
    for (const p of pods) {
      const ack = await shared().dnsmasq.waitFor((e) => e.kind === 'DHCPACK' && e.ip === p.ip, 20_000, skip);
      shared().times[`readoptAfterDaemonKillMs_${p.name}`] = String(ack.seenAt - killedAt);
    }
    t.not(await daemonPid(), newDaemon, 'a new daemon runs');
    t.regex(await w().agent.logTail(400), /DHCP lease daemon exited; restarting it/);
    await assertLeases(t, pods, 'after the daemon restart');
    // And the new daemon renews them: a DHCPREQUEST without a DISCOVER before it.
    skip = (await shared().dnsmasq.events()).length;
    const renew = await shared().dnsmasq.waitFor((e) => e.kind === 'DHCPREQUEST' && e.ip === pods[0]?.ip, (T1_S + 10) * 1000, skip);
    const between = (await shared().dnsmasq.events()).slice(skip).filter((e) => e.seenAt <= renew.seenAt && e.kind === 'DHCPDISCOVER');
    t.deepEqual(between, [], 'a renewal, not a new acquisition');
    t.log(`renewal by the restarted daemon ${renew.seenAt - killedAt} ms after the kill`);
  },
);

serialTest('DEL releases the lease (dnsmasq sees DHCPRELEASE); DEL succeeds when the lease or the daemon is gone', async (t) => {
  const [shaped, web] = shared().pods;
  if (!shaped?.ip || !web?.ip) return t.fail('no pods');
  const skip = (await shared().dnsmasq.events()).length;
  const started = Date.now();
  const del = await w().call('del', shaped);
  t.is(del.exitCode, 0, del.stderr);
  const rel = await shared().dnsmasq.waitFor((e) => e.kind === 'DHCPRELEASE' && e.ip === shaped.ip, 5000, skip);
  shared().times.releaseMs = String(rel.seenAt - started);
  t.log(`DEL took ${Math.round(del.ms)} ms; dnsmasq saw the DHCPRELEASE of ${shaped.ip} ${rel.seenAt - started} ms after DEL began`);
  t.false(
    (await shared().dnsmasq.leases()).some((l) => l.ip === shaped.ip),
    'dnsmasq dropped the lease',
  );
  const again = await w().call('del', shaped);
  t.is(again.exitCode, 0, `a second DEL (no lease any more): ${again.stderr}`);
  shared().pods = shared().pods.filter((p) => p !== shaped);

  // The daemon gone: DEL right after it was killed, before the agent restarts it.
  const pid = await daemonPid();
  process.kill(pid, 'SIGKILL');
  for (let i = 0; i < 50 && alive(pid); i++) await new Promise((r) => setTimeout(r, 20));
  const del2 = await w().call('del', web);
  t.is(del2.exitCode, 0, `DEL with the daemon gone: ${del2.stderr}`);
  t.regex(await w().agent.logTail(400), /lease daemon does not answer: the lease is not released/);
  t.true(
    (await shared().dnsmasq.leases()).some((l) => l.ip === web.ip),
    'unreleased: the server keeps the lease until it expires',
  );
  shared().pods = [];
  t.false(nodeHasPodVeths(await w().inNode('ip', ['-o', 'link', 'show', 'master', BRIDGE])), 'no pod veth left');
  t.deepEqual(await readdir(w().sb.hostPath('/var/lib/kubenet/pods')), [], 'no record left');
  t.regex(await w().inNode('ip', ['-o', 'link', 'show', 'dev', shared().uplink]), new RegExp(`master ${BRIDGE}`), 'the uplink stays');
});

function nodeHasPodVeths(ports: string): boolean {
  return ports
    .split('\n')
    .map((l) => l.split(':')[1]?.trim().split('@')[0] ?? '')
    .some((n) => n !== '' && n !== shared().uplink);
}

serialTest('no DHCP server answering: ADD fails within the timeout with a clear error and leaves nothing', async (t) => {
  // Wait for the daemon the last test killed to be back, then take the server away.
  for (let i = 0; i < 150 && !(await socketAnswers(w().sb.hostPath('/run/kubenet/dhcp.sock'))); i++)
    await new Promise((r) => setTimeout(r, 100));
  await shared().dnsmasq.stop();
  const p = await w().newPod('lonely');
  const r = await w().call('add', p);
  shared().times.noServerAddMs = String(Math.round(r.ms));
  t.not(r.exitCode, 0);
  t.regex(
    r.stderr + r.stdout,
    new RegExp(`no DHCP lease within ${DHCP_TIMEOUT_S} s: no DHCP server answered through uplink ${shared().uplink}`),
  );
  t.true(r.ms < (DHCP_TIMEOUT_S + 5) * 1000, `failed after ${Math.round(r.ms)} ms (timeout ${DHCP_TIMEOUT_S} s)`);
  t.log(`ADD without a server failed after ${Math.round(r.ms)} ms: ${(r.stderr || r.stdout).trim().slice(0, 200)}`);
  t.false(nodeHasPodVeths(await w().inNode('ip', ['-o', 'link', 'show', 'master', BRIDGE])), 'no veth left');
  t.deepEqual(await readdir(w().sb.hostPath('/var/lib/kubenet/pods')), [], 'no record left');
  t.is((await execa('ip', ['-n', p.netns, 'link', 'show', 'eth0'], { reject: false })).exitCode, 1, 'no eth0 in the pod');
  t.deepEqual((await status()).pods, []);
  t.regex((await agentGet(w().sb.hostPath(SOCKET), '/metrics')).body, /^kubenet_cni_errors_total\{command="ADD",code="11"\} 1$/m);
});

serialTest('an uplink that carries an address is refused at startup, and no lease daemon stays behind', async (t) => {
  await w().agent.stop(5000);
  await w().sb.exec('ip', ['addr', 'add', `${shared().net}.1/24`, 'dev', shared().uplink]);
  const err = await t.throwsAsync(w().agent.start());
  t.regex(err?.message ?? '', new RegExp(`uplink ${shared().uplink} carries ${shared().net.replace(/\./g, '\\.')}\\.1/24`));
  await w().agent.kill();
  const left = w()
    .sb.processes()
    .map((pid) => readFileSync(`/proc/${pid}/cmdline`, 'utf8').split('\0').join(' '))
    .filter((c) => c.includes('dhcp daemon'));
  t.deepEqual(left, [], 'no lease daemon left');
  await w().sb.exec('ip', ['addr', 'flush', 'dev', shared().uplink]);
});
