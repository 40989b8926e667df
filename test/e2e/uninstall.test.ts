/**
 * `kubenet uninstall` (src/cli/uninstall.ts) on a node sandbox (its own node netns, tmpfs over the
 * default directories): the agent runs as the DaemonSet runs it (the manifest's ConfigMap, cluster
 * mode against a fake API server with a peer Node, so routes of protocol 98, and a ServiceCIDR, so
 * the unshaped mangle chain), in promiscuous-bridge mode (so the ebtables dedup chain too); pods
 * are added and deleted through its CNI binary in /opt/cni/bin, exec'd as a runtime does, with
 * bandwidth limits (so ifbs and qdiscs). The node is snapshotted before the agent starts (links,
 * qdiscs, classes and ingress filters of every link, iptables-save / ip6tables-save / ebtables,
 * routes of every table, the files under the default directories) and compared after the uninstall.
 * Also: SIGTERM to the agent (what deleting the DaemonSet does) leaves running pods reaching each
 * other; uninstall refuses while the agent answers, and while a pod is there (naming it, removing
 * nothing) unless --force; a second run has nothing to do.
 * Needs root. Traffic (ping) only between the pods' namespaces the test made.
 */
import anyTest, { type ExecutionContext, type TestFn } from 'ava';
import { execa } from 'execa';
import { randomInt } from 'node:crypto';
import { existsSync } from 'node:fs';
import { readFile, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import yaml from 'js-yaml';
import { FORWARDER } from '../kit/agent-harness.js';
import { AGENT_MAIN, AgentProcess, manifestConfigYaml, type ManifestSettings } from '../kit/agent-process.js';
import { FakeApiServer, fakeKubeConfig, node as nodeObject, pod as podObject, serviceCidr } from '../kit/fake-apiserver.js';
import { Cleanup, kernelTestBlocker, uniq } from '../kit/kernel.js';
import { NODE_TMPFS_DIRS, NodeSandbox } from '../kit/node-sandbox.js';
import { addTestPod, cniArgs, type TestPod } from '../kit/test-pod.js';
import { until } from '../kit/until.js';

const ROOT = fileURLToPath(new URL('../../', import.meta.url));
const test = anyTest as TestFn;
const blocker = kernelTestBlocker() ?? (existsSync(FORWARDER) ? undefined : `needs ${FORWARDER} (npm run build:native)`);
const serialTest = blocker ? test.serial.skip : test.serial;
if (blocker) console.warn(`uninstall e2e skipped: ${blocker}`);

/** What the node holds, in a form two snapshots of the same node compare equal in. */
interface NodeSnapshot {
  links: string[];
  tc: string[];
  iptables: string[];
  ip6tables: string[];
  ebtables: string[];
  routes: string[];
  files: string[];
}

/**
 * The tables of an iptables-save output that hold something: a rule, a user chain or a policy
 * other than ACCEPT (counters and comments dropped). A table the kernel made on a first use and
 * that holds only its empty built-in chains is the same as no table.
 */
export function savedRules(text: string): string[] {
  const out: string[] = [];
  let table: string[] = [];
  let name = '';
  let holds = false;
  for (const raw of text.split('\n')) {
    const l = raw.trim().replace(/ \[\d+:\d+\]$/, '');
    if (l === '' || l.startsWith('#')) continue;
    if (l.startsWith('*')) {
      [name, table, holds] = [l, [], false];
    } else if (l === 'COMMIT') {
      if (holds) out.push(name, ...table);
    } else {
      table.push(l);
      if (l.startsWith('-A ') || (l.startsWith(':') && l.split(' ')[1] !== 'ACCEPT')) holds = true;
    }
  }
  return out;
}

/** ebtables' chains and rules of the filter and nat tables, empty built-in chains with policy ACCEPT left out. */
function ebRules(outputs: string[]): string[] {
  const out: string[] = [];
  for (const text of outputs) {
    for (const l of text.split('\n').map((x) => x.trim())) {
      const chain = /^Bridge chain: (\S+), entries: (\d+), policy: (\S+)/.exec(l);
      if (chain) {
        const builtin = ['INPUT', 'FORWARD', 'OUTPUT', 'PREROUTING', 'POSTROUTING', 'BROUTING'].includes(chain[1] ?? '');
        if (!builtin || chain[2] !== '0' || chain[3] !== 'ACCEPT') out.push(l);
      } else if (l.startsWith('-')) out.push(l);
    }
  }
  return out;
}

/**
 * A shard's node class (`1:fffe`, the root of its tree) without its rate: its share of the capacity,
 * which the running agent moves by demand every 100 ms (docs/shaping.md, "Shards under a capacity").
 */
const shareless = (tcLine: string) => tcLine.replace(/^(class htb 1:fffe root) rate .*$/, '$1 rate (its share)');

async function snapshot(sb: NodeSandbox): Promise<NodeSnapshot> {
  const run = async (cmd: string, args: string[]) => (await sb.exec(cmd, args, { reject: false })).stdout;
  const lines = (s: string) => s.split('\n').filter((l) => l.trim() !== '');
  const links = JSON.parse(await run('ip', ['-j', '-d', 'link', 'show'])) as Array<{
    ifname: string;
    mtu: number;
    flags: string[];
    master?: string;
    linkinfo?: { info_kind?: string };
  }>;
  const tc: string[] = [];
  for (const l of links) {
    for (const [what, args] of [
      ['qdisc', ['qdisc', 'show', 'dev', l.ifname]],
      ['class', ['class', 'show', 'dev', l.ifname]],
      ['ingress filter', ['filter', 'show', 'dev', l.ifname, 'ingress']],
    ] as const)
      for (const x of lines(await run('tc', [...args])))
        tc.push(`${l.ifname} ${what}: ${shareless(x.replace(/ direct_packets_stat \d+/, ''))}`);
  }
  return {
    links: links
      .map((l) => `${l.ifname} ${l.linkinfo?.info_kind ?? '-'} master=${l.master ?? '-'} mtu=${l.mtu} ${[...l.flags].sort().join(',')}`)
      .sort(),
    tc: tc.sort(),
    iptables: savedRules(await run('iptables-save', [])),
    ip6tables: savedRules(await run('ip6tables-save', [])),
    ebtables: ebRules([await run('ebtables', ['-t', 'filter', '-L']), await run('ebtables', ['-t', 'nat', '-L'])]),
    routes: [
      ...lines(await run('ip', ['-4', 'route', 'show', 'table', 'all'])),
      ...lines(await run('ip', ['-6', 'route', 'show', 'table', 'all'])),
    ]
      // IPv6 link-local and multicast routes come and go with their links (after DAD): the links say.
      .filter((r) => !/^(local fe80:|fe80::\/64 |multicast ff00::\/8 )/.test(r))
      .sort(),
    files: lines(await run('find', [...NODE_TMPFS_DIRS, '-printf', '%p %y %m\\n'])).sort(),
  };
}

/** A snapshot once the kernel has settled (carrier, DAD): two taken 300 ms apart agree (at most ~10 s). */
async function steady(sb: NodeSandbox): Promise<NodeSnapshot> {
  let last = await snapshot(sb);
  for (let i = 0; i < 30; i++) {
    await new Promise((r) => setTimeout(r, 300));
    const now = await snapshot(sb);
    if (JSON.stringify(now) === JSON.stringify(last)) return now;
    last = now;
  }
  return last;
}

/** A node sandbox with the agent as the DaemonSet runs it (not started), and what the test needs of it. */
interface Node {
  sb: NodeSandbox;
  cleanup: Cleanup;
  agent: AgentProcess;
  api: FakeApiServer;
  nodeName: string;
  configFile: string;
  settings: ManifestSettings;
  podCidr: string;
  peerCidr: string;
  tag: string;
}

async function makeNode(t: ExecutionContext): Promise<Node> {
  const cleanup = new Cleanup();
  t.teardown(() => cleanup.run());
  const sb = await NodeSandbox.create({ prefix: 'kui' });
  cleanup.add(() => sb.destroy());
  const api = await FakeApiServer.start();
  cleanup.add(() => api.stop());
  const nodeName = `kui-node-${sb.tag}`;
  const podCidr = `10.${randomInt(100, 200)}.${randomInt(256)}.0/24`;
  const peerCidr = `10.${randomInt(200, 250)}.${randomInt(256)}.0/24`;
  api.setNode(nodeObject(nodeName, { podCIDR: podCidr, podCIDRs: [podCidr] }));
  // A peer on the node's LAN: the agent routes its pod CIDR via its InternalIP (proto 98).
  const peerIp = sb.uplink.nodeIp.replace(/\.1$/, '.3');
  api.setNode({
    ...nodeObject(`kui-peer-${sb.tag}`, { podCIDR: peerCidr, podCIDRs: [peerCidr] }),
    status: { addresses: [{ type: 'InternalIP', address: peerIp }] },
  });
  // The Service range: unshaped (routes direct), through the mangle chain.
  api.setServiceCidr(serviceCidr('kubernetes', ['10.96.0.0/16']));
  await sb.exposeHostPort(api.port);
  const kubeconfig = join(sb.tmpDir, 'kubeconfig');
  await writeFile(kubeconfig, fakeKubeConfig(`http://127.0.0.1:${api.port}`).exportConfig());
  const configText = await manifestConfigYaml();
  const configFile = join(sb.tmpDir, 'config.yaml');
  await writeFile(configFile, configText);
  const settings = yaml.load(configText) as ManifestSettings;
  const agent = new AgentProcess(
    sb,
    ['--config', configFile, '--kubeconfig', kubeconfig, '--hairpin-mode', 'promiscuous-bridge'],
    { NODE_NAME: nodeName, KUBENET_DEDUP_RESYNC_MS: '500' },
    join(sb.tmpDir, 'agent.log'),
    settings.socket,
  );
  cleanup.add(() => agent.stop(5000));
  return { sb, cleanup, agent, api, nodeName, configFile, settings, podCidr, peerCidr, tag: uniq(4) };
}

const LIMITS = { ingressRate: 20_000_000, ingressBurst: 4_000_000, egressRate: 10_000_000, egressBurst: 4_000_000 };

/** A pod's netns (made by the test) known to the fake API server, with bandwidth annotations when shaped. */
async function newPod(n: Node, name: string, shaped: boolean): Promise<TestPod> {
  const p = await addTestPod(n.cleanup, 'kui', n.tag, name);
  if (shaped) p.runtimeConfig = { bandwidth: LIMITS };
  n.api.setPod(
    podObject(
      p.namespace,
      p.name,
      n.nodeName,
      shaped ? { 'kubernetes.io/ingress-bandwidth': '20M', 'kubernetes.io/egress-bandwidth': '10M' } : {},
    ),
  );
  return p;
}

/** One CNI call through /opt/cni/bin/kubenet with the conflist's plugin config, as libcni builds it. */
async function cni(n: Node, cmd: 'ADD' | 'DEL', p: TestPod): Promise<{ exitCode: number; stdout: string }> {
  const conflist = JSON.parse(await readFile(n.sb.hostPath('/etc/cni/net.d/10-kubenet.conflist'), 'utf8')) as {
    cniVersion: string;
    name: string;
    plugins: Array<Record<string, unknown>>;
  };
  const conf = {
    cniVersion: conflist.cniVersion,
    name: conflist.name,
    ...conflist.plugins[0],
    ...(p.runtimeConfig ? { runtimeConfig: p.runtimeConfig } : {}),
  };
  const r = await n.sb.exec('/opt/cni/bin/kubenet', [], {
    env: {
      CNI_COMMAND: cmd,
      CNI_CONTAINERID: p.id,
      CNI_NETNS: cmd === 'DEL' ? '' : p.netnsPath,
      CNI_IFNAME: p.ifName,
      CNI_ARGS: cniArgs(p),
      CNI_PATH: '/opt/cni/bin',
    },
    input: JSON.stringify(conf),
    reject: false,
    timeout: 60_000,
  });
  if (cmd === 'ADD' && r.exitCode === 0) p.ip = (JSON.parse(r.stdout) as { ips: Array<{ address: string }> }).ips[0]?.address.split('/')[0];
  return { exitCode: r.exitCode ?? -1, stdout: `${r.stdout}${r.stderr}` };
}

async function uninstall(n: Node, ...args: string[]): Promise<{ exitCode: number; out: string }> {
  const r = await n.sb.exec(process.execPath, ['--import', 'tsx', AGENT_MAIN, 'uninstall', '--config', n.configFile, ...args], {
    cwd: ROOT,
    reject: false,
    timeout: 120_000,
  });
  return { exitCode: r.exitCode ?? -1, out: `${r.stdout}${r.stderr}` };
}

/** Starts the agent and waits until the node holds every kind of object it makes. */
async function startAgent(n: Node): Promise<void> {
  await n.agent.start();
  await until(
    'the route to the peer (proto 98), the unshaped chain, the dedup chain',
    async () => {
      const s = await snapshot(n.sb);
      return (
        s.routes.some((r) => r.startsWith(`${n.peerCidr} `) && r.includes('proto 98')) &&
        s.iptables.some((l) => l.includes('KUBENET-UNSHAPED')) &&
        s.ebtables.some((l) => l.includes('KUBE-DEDUP'))
      );
    },
    30_000,
    200,
  );
}

async function ping(from: TestPod, to: TestPod): Promise<boolean> {
  const r = await execa('ip', ['netns', 'exec', from.netns, 'ping', '-c', '2', '-i', '0.2', '-W', '1', to.ip ?? ''], { reject: false });
  return r.exitCode === 0;
}

serialTest(
  'after its pods come and go and the agent stops, uninstall leaves the node as before the install; a second run has nothing to do',
  async (t) => {
    t.timeout(240_000);
    const n = await makeNode(t);
    const before = await steady(n.sb);
    await startAgent(n);
    const a = await newPod(n, 'a', true);
    const b = await newPod(n, 'b', false);
    for (const p of [a, b]) t.is((await cni(n, 'ADD', p)).exitCode, 0, `ADD ${p.name}`);
    const running = await steady(n.sb);
    t.true(
      running.links.some((l) => l.startsWith('kubenet-ifb0 ifb')),
      'the ifb is there',
    );
    t.true(
      running.links.some((l) => l.startsWith('cbr0 bridge')),
      'the bridge is there',
    );
    t.true(
      running.tc.some((l) => /^veth\S* qdisc: qdisc htb 2:/.test(l)),
      "the shaped pod's veth has its htb root",
    );
    t.true(
      running.iptables.some((l) => l.includes('kubenet-ts: SNAT')),
      'the masquerade rule is there',
    );
    for (const p of [a, b]) t.is((await cni(n, 'DEL', p)).exitCode, 0, `DEL ${p.name}`);
    const code = await n.agent.stop();
    if (code !== 0) t.log(await n.agent.logTail(40));
    t.is(code, 0, 'the agent stops on SIGTERM');

    const stopped = await steady(n.sb);
    t.notDeepEqual(stopped, before);
    const dry = await uninstall(n, '--dry-run');
    t.is(dry.exitCode, 0, dry.out);
    t.regex(dry.out, /would remove file \/etc\/cni\/net\.d\/10-kubenet\.conflist/);
    t.deepEqual(await steady(n.sb), stopped, 'a dry run changes nothing');

    const first = await uninstall(n);
    t.log(first.out);
    t.is(first.exitCode, 0, first.out);
    const lines = first.out.split('\n');
    const at = (re: RegExp) => lines.findIndex((l) => re.test(l));
    for (const re of [
      /^removed file \/etc\/cni\/net\.d\/10-kubenet\.conflist/,
      /^removed file \/opt\/cni\/bin\/kubenet /,
      /^removed link kubenet-ifb0 /,
      /^removed link cbr0 /,
      /^removed ebtables filter chain KUBE-DEDUP/,
      /^removed iptables nat POSTROUTING rule .*SNAT/,
      /^removed iptables mangle chain KUBENET-UNSHAPED/,
      /^removed route 10\.\S+ via \S+ proto 98/,
      /^removed pod records \/var\/lib\/kubenet\/pods/,
    ])
      t.true(at(re) >= 0, `${re}`);
    t.true(at(/conflist/) < at(/^removed file \/opt\/cni\/bin\/kubenet /), 'the conflist goes before the binary');
    t.true(at(/^removed file \/opt\/cni\/bin\/kubenet /) < at(/^removed link kubenet-ifb0 /), 'the binary before the ifbs');
    t.deepEqual(await steady(n.sb), before, 'links, qdiscs, rules, routes and files as before the install');

    const second = await uninstall(n);
    t.is(second.exitCode, 0, second.out);
    t.is(second.out.trim(), 'nothing to do: no kubenet-ts object on this node');
  },
);

serialTest(
  'SIGTERM leaves running pods working; uninstall refuses while the agent answers, and while pods are there (naming them, removing nothing); --force removes them too',
  async (t) => {
    t.timeout(240_000);
    const n = await makeNode(t);
    const before = await steady(n.sb);
    await startAgent(n);
    const a = await newPod(n, 'a', true);
    const b = await newPod(n, 'b', false);
    for (const p of [a, b]) t.is((await cni(n, 'ADD', p)).exitCode, 0, `ADD ${p.name}`);
    t.true(await ping(a, b), 'the pods reach each other with the agent running');

    const live = await uninstall(n);
    t.is(live.exitCode, 1);
    t.regex(live.out, /^refused: the kubenet agent answers on \/run\/kubenet\/kubenet\.sock/);

    const running = await steady(n.sb);
    t.is(await n.agent.stop(), 0, 'the agent stops on SIGTERM (what deleting the DaemonSet sends)');
    const stopped = await steady(n.sb);
    // The agent's sockets go with it; everything the pods use stays.
    t.deepEqual({ ...stopped, files: [] }, { ...running, files: [] }, 'links, qdiscs, rules and routes stay when the agent stops');
    t.deepEqual(
      running.files.filter((f) => !stopped.files.includes(f)),
      ['/run/kubenet/kubenet.sock s 600', '/run/kubenet/kubenet.sock.ipam s 600'],
      'only the sockets are gone',
    );
    t.true(await ping(a, b), 'the pods still reach each other with the agent gone');
    t.true(await ping(b, a));

    const refused = await uninstall(n);
    t.is(refused.exitCode, 1, refused.out);
    t.regex(refused.out, /^refused: pods still use this node/);
    for (const p of [a, b]) t.regex(refused.out, new RegExp(`pod default/${p.name} \\(${p.id.slice(0, 12)}, eth0\\)`));
    t.regex(refused.out, /veth veth\S+ on cbr0/);
    t.regex(refused.out, /kept link cbr0 \(bridge\): pods still use the node/);
    t.regex(refused.out, /kept file \/etc\/cni\/net\.d\/10-kubenet\.conflist \(the CNI config\): pods still use the node/);
    t.deepEqual(await steady(n.sb), stopped, 'a refused uninstall removes nothing');
    t.true(await ping(a, b), 'nor disturbs the pods');

    const forced = await uninstall(n, '--force');
    t.log(forced.out);
    t.is(forced.exitCode, 0, forced.out);
    t.regex(forced.out, /forced out pod default\/a /);
    t.regex(forced.out, /removed link veth\S+ \(a pod's veth\)/);
    t.deepEqual(await steady(n.sb), before, 'links, qdiscs, rules, routes and files as before the install');
    const again = await uninstall(n);
    t.is(again.out.trim(), 'nothing to do: no kubenet-ts object on this node');
    t.is(again.exitCode, 0);
  },
);
