/**
 * Faults and hostile input (issue 9): a matrix of bad requests, sent as a buggy runtime, a careless
 * operator or an attacker with access to the agent's socket would send them. For each case: the CNI
 * error code and message; the agent still alive; every pod that was up before still has its address,
 * reaches its gateway, keeps its limits and its host port; the node's own interface and default
 * route untouched; nothing new on the node (veth, reservation, record, tc class, nat rule).
 *
 * The agent runs as a process in a NodeSandbox: a network namespace that plays the node, with its
 * own uplink renamed `eth0`, an address and a default route, so the cases that name the node's own
 * namespace aim at the sandbox's interfaces, never the machine's. Requests go through the installed
 * CNI binary exec'd inside the node (so /proc/self/ns/net is the node's namespace), through libcni,
 * or straight to the socket for what the binary would not send. Prints the matrix as a table.
 */
import anyTest, { type ExecutionContext, type TestFn } from 'ava';
import { execa } from 'execa';
import { existsSync } from 'node:fs';
import { mkdir, readdir, readFile } from 'node:fs/promises';
import { connect } from 'node:net';
import { join } from 'node:path';
import { agentGet } from '../../src/daemon/protocol.js';
import { AgentProcess } from '../kit/agent-process.js';
import { CNI_BIN_DIRS } from '../kit/kernel.js';
import { refPlugin } from '../kit/upstream.js';
import type { NodeSandbox } from '../kit/node-sandbox.js';
import { SandboxWorld, sandboxTestBlocker } from '../kit/sandbox-libcni.js';
import { cniArgs, type PodIdentity, type TestPod } from '../kit/test-pod.js';
import { tcOnShards } from '../kit/shards.js';

const blocker = sandboxTestBlocker();
const test = anyTest as TestFn;
const serialTest = blocker ? test.serial.skip : test.serial;
if (blocker) console.warn(`hostile-input tests skipped: ${blocker}`);

const POD_CIDR = '10.244.77.0/24';
const GATEWAY = '10.244.77.1';

/** The agent's directories, under the sandbox's tmpDir. */
function agentDirs(root: string) {
  return {
    cniBin: join(root, 'cni-bin'),
    cniConf: join(root, 'cni-conf'),
    socket: join(root, 'kubenet.sock'),
    state: join(root, 'state'),
    ipam: join(root, 'ipam'),
    cache: join(root, 'cni-cache'),
  };
}

/** What the cases share besides the world: the agent's directories, the pods that must survive every case, the node as every case must leave it. */
interface Hostile {
  dirs: ReturnType<typeof agentDirs>;
  /** One shaped, one with a host port. */
  pods: TestPod[];
  baseline: string;
}

let world: SandboxWorld | undefined;
let hostile: Hostile | undefined;
const rows: Array<[string, string, string]> = [];

function w(): SandboxWorld {
  if (!world) throw new Error('setup failed');
  return world;
}
function shared(): Hostile {
  if (!hostile) throw new Error('setup failed');
  return hostile;
}

/** The identity of a pod that has no netns of its own (CNI_ARGS of a request that must be refused). */
function podIdentity(name: string, id: string): PodIdentity {
  return { namespace: 'default', name, uid: `uid-${name}`, id };
}

function conf(extra: Record<string, unknown> = {}): string {
  return JSON.stringify({ cniVersion: '1.0.0', name: 'kubenet', type: 'kubenet', socket: shared().dirs.socket, ...extra });
}

/** The installed CNI binary exec'd inside the node, as a runtime on the node would. */
async function cni(
  command: string,
  env: Record<string, string>,
  stdin: string,
): Promise<{ exitCode: number; out: { code?: number; msg?: string } & Record<string, unknown> }> {
  const r = await w().sb.exec(join(shared().dirs.cniBin, 'kubenet'), [], {
    input: stdin,
    reject: false,
    timeout: 30_000,
    // KUBENET_SOCKET: the agent's socket even when stdin names none (empty or unparsable configs).
    env: { CNI_COMMAND: command, CNI_PATH: shared().dirs.cniBin, KUBENET_SOCKET: shared().dirs.socket, ...env },
  });
  let out = {};
  try {
    out = JSON.parse(r.stdout || '{}') as object;
  } catch {
    out = { msg: `unparsable output: ${r.stdout}` };
  }
  return { exitCode: r.exitCode ?? -1, out };
}

function podEnv(p: PodIdentity, netns: string, over: Record<string, string> = {}): Record<string, string> {
  return { CNI_CONTAINERID: p.id, CNI_NETNS: netns, CNI_IFNAME: 'eth0', CNI_ARGS: cniArgs(p), ...over };
}

/** What must not change across a refused request: the node's objects that pods and requests can make. */
async function nodeSnapshot(): Promise<string> {
  const d = shared().dirs;
  const ls = async (p: string) => (await readdir(p).catch(() => [] as string[])).filter((f) => !f.startsWith('.')).sort();
  const ports = (await w().inNode('ip', ['-o', 'link', 'show', 'master', 'cbr0']))
    .split('\n')
    .map((l) => l.split(':')[1]?.trim().split('@')[0] ?? '')
    .filter(Boolean)
    .sort();
  const nat = (await w().inNode('iptables', ['-w', '5', '-t', 'nat', '-S'])).split('\n').sort();
  const classes = (await tcOnShards((cmd, args) => w().inNode(cmd, args), 'egress', 'class')).split('\n').sort();
  const links = (await w().inNode('ip', ['-o', 'link', 'show']))
    .split('\n')
    .map((l) => l.split(':')[1]?.trim().split('@')[0] ?? '')
    .filter(Boolean)
    .sort();
  return JSON.stringify(
    { ports, links, reservations: await ls(join(d.ipam, 'kubenet')), records: await ls(join(d.state, 'pods')), nat, classes },
    null,
    1,
  );
}

/** The node's own uplink: eth0 with its address, the default route through it. */
async function assertNodeIntact(t: ExecutionContext, what: string): Promise<void> {
  const addr = await w().inNode('ip', ['-o', '-4', 'addr', 'show', 'dev', 'eth0']);
  t.true(addr.includes(`${w().sb.uplink.nodeIp}/`), `${what}: the node's eth0 keeps ${w().sb.uplink.nodeIp}`);
  t.regex(await w().inNode('ip', ['route', 'show', 'default']), /default via \S+ dev eth0/, `${what}: the node's default route stays`);
}

/** Every pod that was up: its address, its gateway reachable, its limits and its host port in place. */
async function assertPodsIntact(t: ExecutionContext, what: string): Promise<void> {
  const status = JSON.parse((await agentGet(shared().dirs.socket, '/v1/status')).body) as {
    pods: Array<{ id: string; ips: string[]; limits: Record<string, number> }>;
  };
  for (const p of shared().pods) {
    const addr = (await execa('ip', ['-n', p.netns, '-o', '-4', 'addr', 'show', 'dev', 'eth0'], { reject: false })).stdout;
    t.true(p.ip !== undefined && addr.includes(`${p.ip}/`), `${what}: pod ${p.name} keeps ${p.ip}`);
    const ping = await execa('ip', ['netns', 'exec', p.netns, 'ping', '-c', '1', '-W', '2', GATEWAY], { reject: false });
    t.is(ping.exitCode, 0, `${what}: pod ${p.name} reaches its gateway`);
    t.truthy(
      status.pods.find((s) => s.id === p.id && s.ips.includes(p.ip ?? '')),
      `${what}: the agent still lists pod ${p.name}`,
    );
  }
  const shaped = shared().pods[0];
  const limits = status.pods.find((s) => s.id === shaped?.id)?.limits;
  t.deepEqual(limits, { ingress: 10e6, egress: 5e6 }, `${what}: pod ${shaped?.name} keeps its limits`);
  t.regex(
    await tcOnShards((cmd, args) => w().inNode(cmd, args), 'egress', 'class'),
    /rate 5Mbit/,
    `${what}: its egress class is installed`,
  );
  const web = shared().pods[1];
  t.true(
    (await w().inNode('iptables', ['-w', '5', '-t', 'nat', '-S'])).includes(`--to-destination ${web?.ip}:8080`),
    `${what}: pod ${web?.name}'s host port rule stays`,
  );
}

async function agentAlive(t: ExecutionContext, what: string): Promise<void> {
  const h = await agentGet(shared().dirs.socket, '/healthz', 5000).catch((err: Error) => ({ status: 0, body: err.message }));
  t.is(h.status, 200, `${what}: the agent is alive and ready (${h.body})`);
}

/** One case: its answer must carry `code` and match `msg`; then nothing else may have changed. */
async function refused(
  t: ExecutionContext,
  name: string,
  code: number,
  msg: RegExp,
  send: () => Promise<{ code?: number; msg?: string }>,
): Promise<void> {
  const before = shared().baseline;
  const got = await send();
  rows.push([name, String(got.code ?? 'none'), (got.msg ?? '').slice(0, 110)]);
  t.is(got.code, code, `${name}: CNI code (${got.msg})`);
  t.regex(got.msg ?? '', msg, `${name}: the message names the field and the value`);
  await agentAlive(t, name);
  await assertNodeIntact(t, name);
  await assertPodsIntact(t, name);
  t.is(await nodeSnapshot(), before, `${name}: nothing new on the node`);
}

test.before(async (t) => {
  if (blocker) return;
  t.timeout(90_000);
  const libcni = (sb: NodeSandbox) => {
    const dirs = agentDirs(sb.tmpDir);
    return { confDir: dirs.cniConf, binDirs: [dirs.cniBin, ...CNI_BIN_DIRS], cacheDir: join(sb.tmpDir, 'libcni'), timeoutMs: 60_000 };
  };
  world = await SandboxWorld.create({ prefix: 'khx', libcni });
  const sb = world.sb;
  // The node's uplink is its eth0, with an address and the default route, like a real node's NIC.
  const u = sb.uplink;
  await sb.exec('sh', [
    '-c',
    `ip link set ${u.nodeIf} down && ip link set ${u.nodeIf} name eth0 && ip link set eth0 up && ip route replace default via ${u.lanIp} dev eth0`,
  ]);
  const dirs = agentDirs(sb.tmpDir);
  const args = [
    '--pod-cidr',
    POD_CIDR,
    '--socket',
    dirs.socket,
    '--cni-bin-dir',
    dirs.cniBin,
    '--cni-conf-dir',
    dirs.cniConf,
    '--plugin-bin-dirs',
    CNI_BIN_DIRS.join(','),
    '--ipam-data-dir',
    dirs.ipam,
    '--cni-cache-dir',
    dirs.cache,
    '--state-dir',
    dirs.state,
    '--non-masquerade-cidr',
    '10.0.0.0/8',
    '--log-level',
    'info',
  ];
  const agent = await world.startAgent(args, { socket: dirs.socket });
  hostile = { dirs, pods: [], baseline: '' };
  // The pods that must survive every case: one shaped, one with a host port.
  const shaped = await world.newPod('shaped');
  const web = await world.newPod('web');
  const hostPort = 31000 + Math.floor(Math.random() * 1000);
  for (const [p, rc] of [
    [shaped, { bandwidth: { IngressRate: 10e6, IngressBurst: 4294967295, EgressRate: 5e6, EgressBurst: 4294967295 } }],
    [web, { portMappings: [{ HostPort: hostPort, ContainerPort: 8080, Protocol: 'tcp', HostIP: '' }] }],
  ] as const) {
    const r = await world.call('add', p, { runtimeConfig: rc });
    if (r.exitCode !== 0) throw new Error(`ADD ${p.name}: ${r.stderr}`);
    hostile.pods.push(p);
  }
  hostile.baseline = await nodeSnapshot();
  t.log(
    `node netns ${sb.netns} (its uplink eth0 ${u.nodeIp}), agent pid ${agent.pid}, pods ${hostile.pods.map((p) => `${p.name}=${p.ip}`).join(' ')}`,
  );
});

test.after.always(async (t) => {
  if (rows.length > 0) {
    const w0 = Math.max(...rows.map((r) => r[0].length));
    t.log(`\n${'case'.padEnd(w0)} | code | message\n${rows.map((r) => `${r[0].padEnd(w0)} | ${r[1].padEnd(4)} | ${r[2]}`).join('\n')}`);
  }
  await world?.destroy();
});

serialTest("the node's own network namespace is never a pod's (ADD, DEL, CHECK; by identity, not path text)", async (t) => {
  const victim = podIdentity('intruder', 'f'.repeat(64));
  const agentNs = `/proc/${w().agent.pid ?? 0}/ns/net`;
  for (const [name, netns] of [
    ['ADD CNI_NETNS=/proc/self/ns/net', '/proc/self/ns/net'],
    ['ADD CNI_NETNS=/proc/<agent>/ns/net', agentNs],
    ['ADD CNI_NETNS=/run/netns/../../proc/<agent>/ns/net', `/run/netns/../..${agentNs}`],
  ] as const) {
    await refused(
      t,
      name,
      4,
      /network namespace ".*" is the node's own network namespace/,
      async () => (await cni('ADD', podEnv(victim, netns), conf())).out,
    );
  }
  await refused(
    t,
    'DEL CNI_NETNS=/proc/<agent>/ns/net',
    4,
    /is the node's own network namespace/,
    async () => (await cni('DEL', podEnv(victim, agentNs), conf())).out,
  );
  await refused(
    t,
    'DEL of a live pod with the node netns',
    4,
    /is the node's own network namespace/,
    async () => (await cni('DEL', podEnv(shared().pods[0] ?? victim, agentNs), conf())).out,
  );
  await refused(
    t,
    'CHECK CNI_NETNS=/proc/self/ns/net',
    4,
    /is the node's own network namespace/,
    async () => (await cni('CHECK', podEnv(shared().pods[0] ?? victim, '/proc/self/ns/net'), conf())).out,
  );
});

serialTest('a netns path that is not a network namespace is refused without opening anything but nsfs', async (t) => {
  const victim = podIdentity('odd', 'e'.repeat(64));
  const fifo = join(w().sb.tmpDir, 'a-fifo');
  await execa('mkfifo', [fifo]);
  for (const [name, netns, msg] of [
    ['ADD netns=/etc/hostname (a file)', '/etc/hostname', /is not a network namespace \(an ordinary file/],
    ['ADD netns=/tmp (a directory)', '/tmp', /is not a network namespace \(a directory\)/],
    ['ADD netns=/dev/null (a device)', '/dev/null', /is not a network namespace \(a device\)/],
    ['ADD netns=<a FIFO> (would block)', fifo, /is not a network namespace \(a FIFO\)/],
    ['ADD netns=/proc/self/ns/uts', '/proc/self/ns/uts', /another kind of namespace/],
    ['ADD netns that does not exist', '/var/run/netns/khx-none', /does not exist/],
    ['ADD netns relative path', 'netns/x', /is not an absolute path/],
  ] as const) {
    await refused(t, name, 4, msg, async () => (await cni('ADD', podEnv(victim, netns), conf())).out);
  }
});

serialTest("a retried ADD never harms the pod it names; an ADD into another pod's netns is refused", async (t) => {
  const [shaped, web] = shared().pods;
  if (!shaped || !web) return t.fail('no pods');
  // The same ADD again (runtimes retry): the recorded result, nothing changed.
  const again = await w().call('add', shaped, {
    runtimeConfig: { bandwidth: { IngressRate: 10e6, IngressBurst: 4294967295, EgressRate: 5e6, EgressBurst: 4294967295 } },
  });
  t.is(again.exitCode, 0, again.stderr);
  t.true(again.stdout.includes(`${shaped.ip}/24`), 'the same result again');
  rows.push(['ADD repeated, same parameters', '0', `the recorded result (${shaped.ip})`]);
  await assertPodsIntact(t, 'repeated ADD');
  t.is(await nodeSnapshot(), shared().baseline);
  await refused(
    t,
    'ADD repeated, other limits',
    100,
    /already attached with other bandwidth limits/,
    async () => (await cni('ADD', podEnv(shaped, shaped.netnsPath), conf({ runtimeConfig: { bandwidth: { ingressRate: 1e6 } } }))).out,
  );
  await refused(
    t,
    'ADD repeated, other netns',
    100,
    /already attached with other network namespace/,
    async () => (await cni('ADD', podEnv(shaped, web.netnsPath), conf())).out,
  );
  await refused(
    t,
    "ADD of a new ID into another pod's netns",
    4,
    /already holds pod default\/web/,
    async () => (await cni('ADD', podEnv(podIdentity('squatter', 'd'.repeat(64)), web.netnsPath), conf())).out,
  );
  // A netns whose eth0 kubenet did not make.
  const other = await w().newPod('foreign');
  await execa('ip', ['-n', other.netns, 'link', 'add', 'eth0', 'type', 'veth', 'peer', 'name', 'peer0']);
  await refused(
    t,
    'ADD into a netns with a foreign eth0',
    4,
    /already has an interface eth0 that kubenet did not make/,
    async () => (await cni('ADD', podEnv(other, other.netnsPath), conf())).out,
  );
  t.regex((await execa('ip', ['-n', other.netns, 'link', 'show', 'eth0'])).stdout, /eth0@peer0/, 'the foreign eth0 is untouched');
});

serialTest('GC: a malformed valid-attachments list is refused whole; a valid one keeps what it names', async (t) => {
  const [shaped, web] = shared().pods;
  if (!shaped || !web) return t.fail('no pods');
  const gc = (list: unknown) => cni('GC', {}, conf({ cniVersion: '1.1.0', 'cni.dev/valid-attachments': list }));
  for (const [name, list, msg] of [
    ['GC list of strings', [shaped.id, web.id], /\[0\] must be an object/],
    ['GC key containerid (wrong case)', [{ containerid: shaped.id, ifname: 'eth0' }], /unknown key "containerid"/],
    ['GC non-string containerID', [{ containerID: 42, ifname: 'eth0' }], /containerID must be a string, got 42/],
    ['GC [null]', [null], /\[0\] must be an object/],
    ['GC not a list', { containerID: shaped.id }, /must be a list/],
    ['GC without the list', undefined, /valid-attachments is required/],
  ] as const) {
    await refused(t, name, 7, msg, async () => (await gc(list)).out);
  }
  // A valid list naming both pods: both stay; a stray attachment not named goes.
  const stray = await w().newPod('stray');
  t.is((await w().call('add', stray)).exitCode, 0);
  const ok = await gc([
    { containerID: shaped.id, ifname: 'eth0' },
    { containerID: web.id, ifname: 'eth0' },
  ]);
  t.is(ok.exitCode, 0, JSON.stringify(ok.out));
  rows.push(['GC naming the two pods (a third up)', '0', 'the two kept, the third torn down']);
  await assertPodsIntact(t, 'valid GC');
  t.is(await nodeSnapshot(), shared().baseline, 'the stray attachment is gone, nothing else changed');
  t.is((await w().call('del', stray)).exitCode, 0, 'DEL after GC succeeds');
});

serialTest('container IDs, interface names, CNI_ARGS and commands are checked first', async (t) => {
  const pod = await w().newPod('checked');
  const long = 'x'.repeat(300);
  await refused(
    t,
    'ADD with a 300-character container ID',
    4,
    /CNI_CONTAINERID is 300 characters long: at most 76/,
    async () => (await cni('ADD', podEnv(podIdentity('long', long), pod.netnsPath), conf())).out,
  );
  await refused(
    t,
    'DEL with a 300-character container ID',
    4,
    /at most 76/,
    async () => (await cni('DEL', podEnv(podIdentity('long', long), ''), conf())).out,
  );
  await refused(
    t,
    'DEL of ID ../../victim',
    4,
    /CNI_CONTAINERID "\.\.\/\.\.\/victim" is not a valid container ID/,
    async () => (await cni('DEL', podEnv(podIdentity('x', '../../victim'), ''), conf())).out,
  );
  await refused(
    t,
    'ADD CNI_IFNAME=net1',
    4,
    /eth0 only/,
    async () => (await cni('ADD', podEnv(pod, pod.netnsPath, { CNI_IFNAME: 'net1' }), conf())).out,
  );
  await refused(
    t,
    'ADD CNI_IFNAME=../../x',
    4,
    /not a valid interface name/,
    async () => (await cni('ADD', podEnv(pod, pod.netnsPath, { CNI_IFNAME: '../../x' }), conf())).out,
  );
  await refused(
    t,
    'ADD K8S_POD_NAMESPACE=../kube-system',
    4,
    /K8S_POD_NAMESPACE "\.\.\/kube-system"/,
    async () => (await cni('ADD', podEnv(pod, pod.netnsPath, { CNI_ARGS: 'K8S_POD_NAMESPACE=../kube-system;K8S_POD_NAME=x' }), conf())).out,
  );
  await refused(
    t,
    'ADD CNI_ARGS without =',
    4,
    /is not KEY=VALUE/,
    async () => (await cni('ADD', podEnv(pod, pod.netnsPath, { CNI_ARGS: 'garbage' }), conf())).out,
  );
  await refused(
    t,
    'CNI_COMMAND=REBOOT',
    4,
    /CNI_COMMAND "REBOOT" is not one of/,
    async () => (await cni('REBOOT', podEnv(pod, pod.netnsPath), conf())).out,
  );
  await refused(
    t,
    'CHECK of a container never added',
    3,
    /is not attached to kubenet/,
    async () => (await cni('CHECK', podEnv(pod, pod.netnsPath), conf())).out,
  );
  // Nothing was ever made for these: DEL of them succeeds and leaks nothing.
  t.is((await cni('DEL', podEnv(pod, pod.netnsPath), conf())).exitCode, 0);
});

serialTest('the network config is checked completely before the pod is set up', async (t) => {
  const pod = await w().newPod('config');
  const add = (stdin: string) => async () => (await cni('ADD', podEnv(pod, pod.netnsPath), stdin)).out;
  await refused(t, 'ADD cniVersion 0.0.1', 1, /cniVersion "0\.0\.1" is not supported/, add(conf({ cniVersion: '0.0.1' })));
  await refused(t, 'ADD cniVersion 9.9.9', 1, /cniVersion "9\.9\.9" is not supported/, add(conf({ cniVersion: '9.9.9' })));
  await refused(t, 'ADD empty stdin', 6, /stdin is empty/, add(''));
  await refused(t, 'ADD another network name', 7, /network name "other" is not "kubenet"/, add(conf({ name: 'other' })));
  await refused(t, 'ADD another plugin type', 7, /plugin type "bridge" is not "kubenet"/, add(conf({ type: 'bridge' })));
  await refused(
    t,
    'ADD ingressRate 1e15',
    7,
    /ingressRate 1000000000000000 is outside 1000\.\.10000000000000/,
    add(conf({ runtimeConfig: { bandwidth: { ingressRate: 1e15 } } })),
  );
  await refused(
    t,
    'ADD egressRate -1',
    7,
    /egressRate must be a non-negative integer, got -1/,
    add(conf({ runtimeConfig: { bandwidth: { egressRate: -1 } } })),
  );
  await refused(
    t,
    'ADD hostPort 0',
    7,
    /hostPort must be a port 1\.\.65535, got 0/,
    add(conf({ runtimeConfig: { portMappings: [{ hostPort: 0, containerPort: 80 }] } })),
  );
  await refused(t, 'ADD stdin nested 100000 deep', 6, /nested 100000 levels deep/, add(`${'['.repeat(100000)}${']'.repeat(100000)}`));
});

/** The agent's resident set, kB. */
async function agentRssKb(): Promise<number> {
  const s = await readFile(`/proc/${w().agent.pid ?? 0}/status`, 'utf8');
  return Number(/VmRSS:\s+(\d+)/.exec(s)?.[1] ?? NaN);
}

/** The CNI error object in an HTTP body, whether sent with a length or chunked. */
function jsonIn(body: string): { code?: number; msg?: string } {
  const start = body.indexOf('{');
  const end = body.lastIndexOf('}');
  return start >= 0 && end > start ? (JSON.parse(body.slice(start, end + 1)) as { code?: number; msg?: string }) : {};
}

/** Sends a raw HTTP request on the agent socket; resolves with the status line's code and the body. */
function raw(head: string, body: (write: (b: Buffer | string) => boolean) => Promise<void>): Promise<{ status: number; body: string }> {
  return new Promise((resolve) => {
    const sock = connect(shared().dirs.socket);
    let data = '';
    sock.on('data', (d) => (data += d.toString()));
    // The agent may cut the connection while we still write (that is the point): read what it answered.
    sock.on('error', () => undefined);
    sock.on('close', () => {
      const status = Number(/^HTTP\/1\.1 (\d+)/.exec(data)?.[1] ?? 0);
      resolve({ status, body: data.slice(data.indexOf('\r\n\r\n') + 4) });
    });
    sock.on('connect', () => {
      sock.write(head);
      // A client that stops sending once the agent has answered (as the CNI binary would read it).
      body((b) => !sock.destroyed && data === '' && sock.write(b))
        .then(() => sock.end())
        .catch(() => sock.destroy());
    });
  });
}

serialTest('unbounded requests are refused early: huge bodies (declared or streamed) and deep JSON', async (t) => {
  const rss0 = await agentRssKb();
  const declared = await raw(
    'POST /v1/cni HTTP/1.1\r\nHost: kubenet\r\nContent-Type: application/json\r\nContent-Length: 268435456\r\n\r\n',
    async (write) => {
      // As much as the agent takes of the 256 MB it was promised, until it answers and hangs up.
      const chunk = Buffer.alloc(1 << 20, 0x20);
      for (let i = 0; i < 256; i++) {
        if (!write(chunk)) await new Promise((r) => setTimeout(r, 5));
        await new Promise((r) => setTimeout(r, 1));
      }
    },
  );
  const dcode = jsonIn(declared.body);
  rows.push(['POST 256 MB body (Content-Length)', String(dcode.code), `HTTP ${declared.status}: ${dcode.msg ?? ''}`]);
  t.is(declared.status, 413);
  t.is(dcode.code, 6);
  const streamed = await raw(
    'POST /v1/cni HTTP/1.1\r\nHost: kubenet\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n',
    async (write) => {
      const chunk = Buffer.alloc(1 << 16, 0x20);
      const framed = Buffer.concat([Buffer.from(`${chunk.length.toString(16)}\r\n`), chunk, Buffer.from('\r\n')]);
      write(Buffer.concat([...Array.from({ length: 64 }, () => framed), Buffer.from('0\r\n\r\n')]));
    },
  );
  const scode = jsonIn(streamed.body);
  rows.push(['POST 4 MB chunked body', String(scode.code), `HTTP ${streamed.status}: ${scode.msg ?? ''}`]);
  t.is(streamed.status, 413);
  const deep = `${'['.repeat(100000)}${']'.repeat(100000)}`;
  const deepAnswer = await raw(
    `POST /v1/cni HTTP/1.1\r\nHost: kubenet\r\nContent-Type: application/json\r\nContent-Length: ${deep.length}\r\nConnection: close\r\n\r\n`,
    async (write) => {
      write(deep);
    },
  );
  const deepErr = jsonIn(deepAnswer.body);
  rows.push(['POST body nested 100000 deep', String(deepErr.code), deepErr.msg ?? '']);
  t.is(deepErr.code, 6);
  t.regex(deepErr.msg ?? '', /nested 100000 levels deep: at most 64/);
  const rss1 = await agentRssKb();
  t.log(`agent RSS ${(rss0 / 1024).toFixed(1)} MiB before, ${(rss1 / 1024).toFixed(1)} MiB after the huge bodies`);
  t.true(rss1 - rss0 < 64 * 1024, `the agent did not read the bodies whole: RSS grew ${((rss1 - rss0) / 1024).toFixed(1)} MiB`);
  await agentAlive(t, 'after huge bodies');
  await assertPodsIntact(t, 'after huge bodies');
  t.is(await nodeSnapshot(), shared().baseline);
});

serialTest('a stalled client does not hold shutdown: SIGTERM ends the agent within seconds', async (t) => {
  // Headers and half a body, then silence, on several connections.
  const stalled = Array.from({ length: 5 }, () => {
    const s = connect(shared().dirs.socket);
    s.on('error', () => undefined);
    s.on('connect', () =>
      s.write(
        'POST /v1/cni HTTP/1.1\r\nHost: kubenet\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{"env":{"CNI_COMMAND":"ADD"',
      ),
    );
    return s;
  });
  t.teardown(() => {
    for (const s of stalled) s.destroy();
  });
  await new Promise((r) => setTimeout(r, 300));
  const started = Date.now();
  const code = await w().agent.stop(15_000);
  const ms = Date.now() - started;
  rows.push(['SIGTERM with 5 stalled clients', String(code ?? 'killed'), `exited after ${ms} ms`]);
  t.is(code, 0, 'the agent exits by itself, cleanly');
  t.true(ms < 5000, `exited after ${ms} ms`);
  // Pods stay up without the agent; the next agent knows them.
  await w().agent.start();
  await assertPodsIntact(t, 'after the restart');
  t.is(await nodeSnapshot(), shared().baseline, 'the restart changed nothing');
});

serialTest(
  'SIGKILL of the agent while portmap sets up a host port: nothing of it survives, its address goes to the next pod clean',
  async (t) => {
    // A portmap that announces itself, then takes 2 s before doing the real work.
    const slow = join(w().sb.tmpDir, 'slow-plugins');
    const marker = join(w().sb.tmpDir, 'portmap-started');
    await mkdir(slow, { recursive: true });
    await execa('sh', [
      '-c',
      `printf '#!/bin/sh\\ntouch ${marker}\\nsleep 2\\nexec ${refPlugin('portmap')}\\n' > ${slow}/portmap && chmod 755 ${slow}/portmap`,
    ]);
    const agent = w().agent;
    await agent.stop(5000);
    const slowAgent = new AgentProcess(
      w().sb,
      agent.args.map((a) => (a === CNI_BIN_DIRS.join(',') ? [slow, ...CNI_BIN_DIRS].join(',') : a)),
      {},
      join(w().sb.tmpDir, 'agent-slow.log'),
      shared().dirs.socket,
    );
    await slowAgent.start();
    const victim = await w().newPod('killed');
    const hostPort = 32500 + Math.floor(Math.random() * 200);
    const add = w().call('add', victim, {
      runtimeConfig: { portMappings: [{ HostPort: hostPort, ContainerPort: 80, Protocol: 'tcp', HostIP: '' }] },
    });
    const deadline = Date.now() + 20_000;
    while (!existsSync(marker) && Date.now() < deadline) await new Promise((r) => setTimeout(r, 20));
    t.true(existsSync(marker), 'portmap was running');
    await slowAgent.kill();
    const r = await add;
    t.not(r.exitCode, 0, 'the runtime saw the ADD fail');
    await new Promise((res) => setTimeout(res, 2500)); // past the moment the orphaned portmap would have acted
    const natNow = await w().inNode('iptables', ['-w', '5', '-t', 'nat', '-S']);
    t.false(natNow.includes(`--dport ${hostPort}`), 'no rule for the host port: portmap died with the agent');
    t.false((await execa('pgrep', ['-f', `${slow}/portmap`], { reject: false })).stdout.trim() !== '', 'no portmap left running');
    // The next agent undoes the unfinished ADD (its record said what it would make).
    await agent.start();
    t.is(await nodeSnapshot(), shared().baseline, 'the restart removed everything of the interrupted ADD');
    // The address is free again; a new pod gets it with no stale host port pointing at it.
    const next = await w().newPod('next');
    const r2 = await w().call('add', next);
    t.is(r2.exitCode, 0, r2.stderr);
    const ip = (JSON.parse(r2.stdout) as { ips: Array<{ address: string }> }).ips[0]?.address.split('/')[0] ?? '';
    t.false(
      (await w().inNode('iptables', ['-w', '5', '-t', 'nat', '-S'])).includes(`--to-destination ${ip}:`),
      `no host port forwards to the new pod ${ip}`,
    );
    rows.push(['SIGKILL during portmap, then restart', '-', `no rule for :${hostPort}; next pod ${ip} clean`]);
    t.is((await w().call('del', next)).exitCode, 0);
    t.is((await w().call('del', victim)).exitCode, 0, 'DEL of the interrupted pod succeeds');
    t.is(await nodeSnapshot(), shared().baseline);
  },
);

serialTest(
  "SIGKILL of the agent while the bridge plugin is between making the pod's veth and joining it to the bridge: the next agent removes the interface, and the retried ADD works",
  async (t) => {
    // A bridge plugin that makes the pod's veth (eth0 inside, the host end not on the bridge), announces
    // itself, then stalls: what the reference plugin leaves when it is killed between those steps.
    const slow = join(w().sb.tmpDir, 'stalled-bridge');
    const marker = join(w().sb.tmpDir, 'bridge-started');
    await mkdir(slow, { recursive: true });
    const hostEnd = `khv${w().tag}`;
    await execa('sh', [
      '-c',
      `printf '#!/bin/sh\\nip link add ${hostEnd} type veth peer name eth0 netns "$CNI_NETNS"\\ntouch ${marker}\\nsleep 30\\n' > ${slow}/bridge && chmod 755 ${slow}/bridge`,
    ]);
    const agent = w().agent;
    await agent.stop(5000);
    const stalled = new AgentProcess(
      w().sb,
      agent.args.map((a) => (a === CNI_BIN_DIRS.join(',') ? [slow, ...CNI_BIN_DIRS].join(',') : a)),
      {},
      join(w().sb.tmpDir, 'agent-stalled.log'),
      shared().dirs.socket,
    );
    await stalled.start();
    const pod = await w().newPod('cut');
    const add = w().call('add', pod);
    const deadline = Date.now() + 20_000;
    while (!existsSync(marker) && Date.now() < deadline) await new Promise((r) => setTimeout(r, 20));
    t.true(existsSync(marker), 'the stalled bridge plugin made the veth');
    t.regex((await execa('ip', ['-n', pod.netns, 'link', 'show', 'eth0'])).stdout, /eth0@/, 'eth0 is in the pod');
    await stalled.kill();
    t.not((await add).exitCode, 0, 'the runtime saw the ADD fail');
    await agent.start();
    t.is(
      (await execa('ip', ['-n', pod.netns, 'link', 'show', 'eth0'], { reject: false })).exitCode,
      1,
      'the next agent removed the interface the cut ADD made',
    );
    t.is((await execa('ip', ['link', 'show', hostEnd], { reject: false })).exitCode, 1, 'and its host end with it');
    // As containerd does after a failed ADD: DEL, then ADD again with the same container ID.
    t.is((await w().call('del', pod)).exitCode, 0);
    const retry = await w().call('add', pod);
    t.is(retry.exitCode, 0, `the retried ADD works: ${retry.stderr}`);
    rows.push(['SIGKILL between veth and bridge, then retry', '0', 'the interface removed at restart; the same-ID ADD succeeds']);
    t.is((await w().call('del', pod)).exitCode, 0);
    t.is(await nodeSnapshot(), shared().baseline);
  },
);
