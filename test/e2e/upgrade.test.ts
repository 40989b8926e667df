/**
 * Upgrade in place (issue 8): a node where kubenet-ts 0.1.0 ran, then the fixed agent starts.
 *
 * The 0.1.0 state is made the way 0.1.0 made it: the reference plugins run with its bridge config
 * (network `kubenet`) through a CNI runtime whose result cache is the runtimes' directory (the
 * `cniCacheDir` of 0.1.0), its pod records under `<stateDir>/pods/<id>.json` in 0.1.0's shape, its
 * shaper state under `<stateDir>/shaper`. Then, for the pod a container runtime set up, the runtime
 * overwrote the entry with its own (its config is the `kubenet` conflist), as containerd does right
 * after ADD returns. Three pods: one alive with limits and a host port (its entry the runtime's), one
 * alive and unshaped (its entry still 0.1.0's own), one gone (netns deleted, its address still held).
 *
 * The fixed agent must keep the live pods' network, make their later DEL release everything, clean
 * what belongs to the gone pod, and never touch the runtime's entry.
 */
import anyTest, { type TestFn } from 'ava';
import { execa } from 'execa';
import { pino } from 'pino';
import { createHash } from 'node:crypto';
import { mkdir, readdir, readFile, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { CniRuntime } from '../../src/cni/runtime.js';
import { bridgeConf, withPortmap } from '../../src/pod/bridge-conf.js';
import { parseCidr } from '../../src/net/ip.js';
import { Shaper } from '../../src/shaper/tc.js';
import { AgentHarness, agentTestBlocker } from '../kit/agent-harness.js';
import type { TestPod } from '../kit/test-pod.js';
import { CNI_BIN_DIRS, delNetns, ipJson, kernelTestBlocker, linkExists } from '../kit/kernel.js';
import { podLeaves } from '../kit/node-leaks.js';

const blocker = kernelTestBlocker() ?? agentTestBlocker();
const test = anyTest as TestFn;
const serialTest = blocker ? test.serial.skip : test.serial;
if (blocker) console.warn(`upgrade e2e tests skipped: ${blocker}`);

const CIDR = '10.93.20.0/24';

interface Made {
  pod: TestPod;
  ip: string;
  hostVeth: string;
}

serialTest(
  "upgrade from 0.1.0: live pods keep their network and DEL releases everything; a gone pod is cleaned; the runtime's cache entry is never touched",
  async (t) => {
    const h = await new AgentHarness().setup(CIDR);
    t.teardown(() => h.cleanup.run());
    const legacyCache = h.config.cniCacheDir; // 0.1.0's cniCacheDir: where runtimes keep theirs too
    const hostPort = 31500 + Math.floor(Math.random() * 400);

    // --- What 0.1.0 left on the node. ---
    const conf = {
      ...bridgeConf({ bridgeName: h.bridge, mtu: 1500, hairpinMode: 'hairpin-veth', ipamDataDir: h.config.ipamDataDir }, [parseCidr(CIDR)]),
      addIf: 'eth0',
    };
    const old = new CniRuntime({ binDirs: CNI_BIN_DIRS, cacheDir: legacyCache });
    const shaper = new Shaper({ ifbName: h.ifb });
    // 0.1.0's shaper kept one file per pod, named by the sha256 of its ID.
    const shaperDir = join(h.config.stateDir, 'shaper');
    await mkdir(shaperDir, { recursive: true });
    const args = (p: TestPod): [string, string][] => [
      ['IgnoreUnknown', '1'],
      ['K8S_POD_NAMESPACE', p.namespace],
      ['K8S_POD_NAME', p.name],
      ['K8S_POD_INFRA_CONTAINER_ID', p.id],
    ];
    await mkdir(join(h.config.stateDir, 'pods'), { recursive: true });
    const make = async (name: string, opts: { ports?: boolean; limits?: { ingress: number; egress: number } }): Promise<Made> => {
      const pod = await h.addPod(name);
      const rt = { containerId: pod.id, netns: pod.netnsPath, ifName: 'eth0', args: args(pod) };
      const portMappings = opts.ports ? [{ hostPort, containerPort: 8080, protocol: 'tcp' as const }] : undefined;
      const result = portMappings
        ? await old.addNetworkList(withPortmap(conf), { ...rt, capabilityArgs: { portMappings } })
        : await old.addNetwork(conf, rt);
      const ip = result.ips[0]?.address.split('/')[0] ?? '';
      const hostVeth = result.interfaces.find((i) => !i.sandbox && i.name !== h.bridge)?.name ?? '';
      const limits = opts.limits ?? {};
      if (opts.limits) {
        const state = await shaper.ensure({ id: pod.id, hostVeth, ips: [ip], limits });
        await writeFile(join(shaperDir, `${createHash('sha256').update(pod.id).digest('hex').slice(0, 40)}.json`), JSON.stringify(state));
      }
      const record = {
        namespace: pod.namespace,
        name: pod.name,
        id: pod.id,
        netns: pod.netnsPath,
        ips: [ip],
        hostVeth,
        limits,
        ...(portMappings ? { portMappings } : {}),
      };
      await writeFile(join(h.config.stateDir, 'pods', `${pod.id}.json`), JSON.stringify(record));
      return { pod, ip, hostVeth };
    };
    const web = await make('web', { ports: true, limits: { ingress: 7e6, egress: 3e6 } });
    const plain = await make('plain', {});
    const gone = await make('gone', {});
    shaper.close();
    // containerd wrote its own entry for web after ADD returned, in the same file (network kubenet).
    const runtimeEntryPath = join(legacyCache, 'results', `kubenet-${web.pod.id}-eth0`);
    const runtimeEntry = JSON.stringify({
      kind: 'cniCacheV1',
      containerId: web.pod.id,
      config: Buffer.from(
        JSON.stringify({
          cniVersion: '1.0.0',
          name: 'kubenet',
          plugins: [{ type: 'kubenet', socket: h.config.socket, capabilities: { bandwidth: true, portMappings: true } }],
        }),
      ).toString('base64'),
      ifName: 'eth0',
      networkName: 'kubenet',
      netns: web.pod.netnsPath,
      cniArgs: args(web.pod),
      capabilityArgs: { portMappings: [{ hostPort, containerPort: 8080, protocol: 'tcp' }] },
      result: JSON.parse((await readFile(runtimeEntryPath, 'utf8')) || '{}').result,
    });
    await writeFile(runtimeEntryPath, runtimeEntry);
    // The gone pod: its sandbox was removed while the agent was down; its address is still reserved.
    await delNetns(gone.pod.netns);
    const entries0 = (await readdir(join(legacyCache, 'results'))).sort();
    t.is(entries0.length, 3, `0.1.0 left an entry per pod: ${entries0.join(' ')}`);
    t.is((await h.reservedIps()).length, 3);
    const classesBefore = (await execa('tc', ['class', 'show', 'dev', h.ifb])).stdout;
    t.regex(classesBefore, /rate 3Mbit/);

    // --- The fixed agent starts on that node. ---
    const logs: string[] = [];
    await h.startAgent(undefined, undefined, pino({ level: 'info' }, { write: (l: string) => void logs.push(l) }));
    const upgraded = logs.map((l) => JSON.parse(l) as { msg: string }).filter((l) => /0\.1\.0|leftovers|gone/.test(l.msg));
    for (const l of upgraded) t.log(JSON.stringify(l));
    t.true(
      upgraded.some((l) => l.msg === 'upgraded the state kubenet-ts 0.1.0 left'),
      'the agent says what it upgraded',
    );
    const status = JSON.parse((await h.get('/v1/status')).body) as {
      pods: Array<{ id: string; name: string; ips: string[]; limits: object; portMappings?: unknown[] }>;
    };
    t.deepEqual(
      status.pods.map((p) => [p.name, p.ips, p.limits]).sort(),
      [
        ['plain', [plain.ip], {}],
        ['web', [web.ip], { ingress: 7e6, egress: 3e6 }],
      ],
      'the live pods are known, with their IPs and limits; the gone pod is not',
    );
    t.deepEqual((await h.reservedIps()).sort(), [plain.ip, web.ip].sort(), "the gone pod's address was released");
    t.deepEqual(
      (await h.podStateFiles()).sort(),
      [`${plain.pod.id}@eth0.json`, `${web.pod.id}@eth0.json`].sort(),
      '0.1.0 records converted, the gone one removed',
    );
    t.deepEqual(
      (await readdir(join(legacyCache, 'results'))).sort(),
      [`kubenet-${web.pod.id}-eth0`],
      "0.1.0's own entries removed; the runtime's kept",
    );
    t.is(await readFile(runtimeEntryPath, 'utf8'), runtimeEntry, "the runtime's entry is byte for byte what the runtime wrote");
    t.is((await execa('tc', ['class', 'show', 'dev', h.ifb])).stdout, classesBefore, 'shaping untouched');
    t.deepEqual(
      (await readdir(h.config.stateDir)).sort(),
      ['.pods-spare', 'installed-loopback', 'pods'],
      "0.1.0's shaper files adopted into the records, then removed (.pods-spare: the record writer's spare files; installed-loopback: the installer's note of the loopback it copied)",
    );
    for (const m of [web, plain]) {
      t.true(await linkExists(m.hostVeth), `${m.pod.name}: veth kept`);
      const ping = await execa('ip', ['netns', 'exec', m.pod.netns, 'ping', '-c', '1', '-W', '2', '10.93.20.1'], { reject: false });
      t.is(ping.exitCode, 0, `${m.pod.name} still reaches its gateway`);
    }
    t.true(
      (await execa('iptables', ['-w', '5', '-t', 'nat', '-S'])).stdout.includes(`--to-destination ${web.ip}:8080`),
      "web's host port rule kept",
    );
    t.is((await h.libcni('check', plain.pod)).exitCode, 0, 'CHECK of a converted pod whose config and result 0.1.0 kept');

    // --- The runtime deletes the live pods (its cache holds the entry for web). ---
    for (const m of [web, plain]) {
      const r = await h.libcni('del', m.pod, { cacheDir: legacyCache });
      t.is(r.exitCode, 0, `${m.pod.name}: DEL ${r.stderr}`);
    }
    t.deepEqual(await h.reservedIps(), [], 'every address released');
    t.deepEqual(await h.podStateFiles(), []);
    t.deepEqual(await ipJson(['link', 'show', 'master', h.bridge]), [], 'no veth left');
    t.deepEqual(
      podLeaves((await execa('tc', ['qdisc', 'show', 'dev', h.ifb])).stdout.split('\n')),
      [],
      'no pod leaf left on the ifb (its classes stay idle)',
    );
    t.false((await execa('iptables', ['-w', '5', '-t', 'nat', '-S'])).stdout.includes(`--dport ${hostPort}`), 'no host-port rule left');
    t.deepEqual(await readdir(join(legacyCache, 'results')), [], "libcni removed the runtime's entry on DEL itself");
  },
);
