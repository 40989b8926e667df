import test from 'ava';
import { chmod, mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { hostname, tmpdir } from 'node:os';
import { join } from 'node:path';
import { ConfigError } from '../../../src/errors.js';
import {
  AgentConfigError,
  CONFIG_KEYS,
  DEFAULT_CONFIG,
  configFlags,
  configKeysMarkdown,
  dhcpSocketPath,
  loadConfig,
  unshapedCidrsOf,
  type AgentConfig,
} from '../../../src/daemon/config/config.js';

let dir = '';
let seq = 0;

test.before(async () => {
  dir = await mkdtemp(join(tmpdir(), 'kcfg-'));
});

test.after.always(async () => {
  if (dir) await rm(dir, { recursive: true, force: true });
});

async function yamlFile(text: string): Promise<string> {
  const file = join(dir, `config-${++seq}.yaml`);
  await writeFile(file, text);
  return file;
}

const ENV = { NODE_NAME: 'node-a' };

test('defaults: no file, no flags', async (t) => {
  const c = await loadConfig({ flags: {}, env: ENV });
  t.deepEqual(c, {
    nodeName: 'node-a',
    socket: '/run/kubenet/kubenet.sock',
    cniBinDir: '/opt/cni/bin',
    cniConfDir: '/etc/cni/net.d',
    pluginBinDirs: ['/opt/cni/bin', '/usr/lib/cni'],
    bridgeName: 'cbr0',
    ifbName: 'kubenet-ifb0',
    ifbShards: 0,
    hairpinMode: 'hairpin-veth',
    nonMasqueradeCIDR: '10.0.0.0/8',
    routes: 'none',
    ipam: 'host-local',
    dhcpTimeout: 30,
    ipamDataDir: '/var/lib/cni/networks',
    cniCacheDir: '/var/lib/cni',
    stateDir: '/var/lib/kubenet',
    vxlanPort: 8475,
    vxlanVNI: 98,
    metricsMaxAge: 2,
    metricsAddress: ':10266',
    metricsAuth: 'none',
    logLevel: 'info',
  });
  t.false('podCIDR' in c, 'optional keys are absent, not undefined');
  // the result is a copy: mutating it leaves the defaults alone
  c.pluginBinDirs.push('/x');
  t.deepEqual(DEFAULT_CONFIG.pluginBinDirs, ['/opt/cni/bin', '/usr/lib/cni']);
  t.true(Object.isFrozen(DEFAULT_CONFIG));
});

test('nodeName: flag, then file, then env NODE_NAME, then the host name', async (t) => {
  const file = await yamlFile('nodeName: from-file\n');
  t.is((await loadConfig({ file, flags: { nodeName: 'from-flag' }, env: ENV })).nodeName, 'from-flag');
  t.is((await loadConfig({ file, flags: {}, env: ENV })).nodeName, 'from-file');
  t.is((await loadConfig({ flags: {}, env: ENV })).nodeName, 'node-a');
  t.is((await loadConfig({ flags: {}, env: {} })).nodeName, hostname().toLowerCase());
  const bad = await t.throwsAsync(loadConfig({ flags: {}, env: { NODE_NAME: 'Not_A_Node' } }), { instanceOf: AgentConfigError });
  t.is(bad?.source, 'env NODE_NAME');
});

test('a full file is read; flags win over it', async (t) => {
  const file = await yamlFile(`
# every key
podCIDR: "10.244.1.7/24, fd00:10:244:1::/64"
nodeName: worker-1
kubeconfig: /etc/kubernetes/kubelet.conf
socket: /run/kubenet/k.sock
cniBinDir: /opt/cni/bin
cniConfDir: /etc/cni/net.d
pluginBinDirs: [/usr/lib/cni, /opt/cni/bin]
bridgeName: kbr0
ifbName: kifb9
mtu: 1450
hairpinMode: promiscuous-bridge
nonMasqueradeCIDR: 10.0.0.0/8
ipamDataDir: /var/lib/cni/networks
cniCacheDir: /var/lib/cni
stateDir: /var/lib/kubenet
logLevel: debug
`);
  const c = await loadConfig({ file, flags: { mtu: 9000, socket: '/tmp/flag.sock', podCIDR: undefined }, env: ENV });
  t.is(c.podCIDR, '10.244.1.0/24,fd00:10:244:1::/64', 'pod CIDRs are normalized (host bits cleared)');
  t.is(c.nodeName, 'worker-1');
  t.is(c.kubeconfig, '/etc/kubernetes/kubelet.conf');
  t.is(c.mtu, 9000, 'flag wins');
  t.is(c.socket, '/tmp/flag.sock', 'flag wins');
  t.deepEqual(c.pluginBinDirs, ['/usr/lib/cni', '/opt/cni/bin']);
  t.is(c.bridgeName, 'kbr0');
  t.is(c.ifbName, 'kifb9');
  t.is(c.hairpinMode, 'promiscuous-bridge');
  t.is(c.logLevel, 'debug');
});

test('an empty file or a comments-only file means all defaults', async (t) => {
  for (const text of ['', '# nothing\n', '---\n']) {
    const c = await loadConfig({ file: await yamlFile(text), flags: {}, env: ENV });
    t.is(c.bridgeName, 'cbr0');
  }
});

async function refuse(t: import('ava').ExecutionContext, text: string, key: string | undefined, expected: RegExp, file?: string) {
  const f = file ?? (await yamlFile(text));
  const err = await t.throwsAsync(loadConfig({ file: f, flags: {}, env: ENV }), { instanceOf: AgentConfigError });
  t.true(err instanceof ConfigError);
  t.is(err?.source, f);
  t.is(err?.key, key, text);
  t.true(err?.message.includes(f), 'the message names the file');
  if (key) t.true(err?.message.includes(`"${key}"`), 'the message names the key');
  t.regex(err?.expected ?? err?.message ?? '', expected, text);
  return err;
}

test('an unknown key is refused, with a hint for near misses', async (t) => {
  const err = await refuse(t, 'podCidr: 10.244.0.0/24\n', 'podCidr', /one of podCIDR, nodeName/);
  t.regex(err?.message ?? '', /did you mean "podCIDR"/);
  await refuse(t, 'bridge: cbr0\n', 'bridge', /one of /);
  await refuse(t, 'cni-bin-dir: /opt/cni/bin\n', 'cni-bin-dir', /one of /);
});

test('wrong types are refused', async (t) => {
  await refuse(t, 'mtu: "1500"\n', 'mtu', /integer from 68 to 65535/);
  await refuse(t, 'mtu: 1500.5\n', 'mtu', /integer/);
  await refuse(t, 'mtu: 40\n', 'mtu', /integer from 68 to 65535/);
  await refuse(t, 'mtu:\n', 'mtu', /integer/);
  await refuse(t, 'socket: 42\n', 'socket', /absolute path/);
  await refuse(t, 'socket: run/kubenet.sock\n', 'socket', /absolute path/);
  await refuse(t, `socket: /${'s'.repeat(120)}\n`, 'socket', /at most 107 bytes/);
  await refuse(t, 'pluginBinDirs: /opt/cni/bin\n', 'pluginBinDirs', /list of absolute paths/);
  await refuse(t, 'pluginBinDirs: []\n', 'pluginBinDirs', /non-empty list/);
  await refuse(t, 'pluginBinDirs: [/opt/cni/bin, 3]\n', 'pluginBinDirs', /list of absolute paths/);
  await refuse(t, 'cniConfDir: [/etc]\n', 'cniConfDir', /absolute path/);
  await refuse(t, 'stateDir: var/lib/kubenet\n', 'stateDir', /absolute path/);
  await refuse(t, 'bridgeName: this-name-is-too-long\n', 'bridgeName', /Linux interface name/);
  await refuse(t, 'bridgeName: "a b"\n', 'bridgeName', /Linux interface name/);
  await refuse(t, 'ifbName: ifb/0\n', 'ifbName', /Linux interface name/);
  await refuse(t, 'ifbShards: 65\n', 'ifbShards', /integer from 0 .* to 64/);
  await refuse(t, 'ifbShards: -1\n', 'ifbShards', /integer from 0/);
  await refuse(t, 'ifbShards: auto\n', 'ifbShards', /integer from 0/);
  // Every shard's ifb must be a valid name: 'kubenet-ifb012' + '.9' is 16 bytes.
  const long = await refuse(t, 'ifbName: kubenet-ifb012\nifbShards: 10\n', 'ifbName', /short enough for every egress shard/);
  t.regex(long?.message ?? '', /"kubenet-ifb012\.9", longer than 15 bytes/);
  await refuse(t, 'nodeName: true\n', 'nodeName', /node name/);
  await refuse(t, 'kubeconfig: {path: /x}\n', 'kubeconfig', /path to a kubeconfig/);
  await refuse(t, 'podCIDR: 10.244.1.0\n', 'podCIDR', /CIDR/);
  await refuse(t, 'podCIDR: 10.244.1.0/24,10.245.1.0/24\n', 'podCIDR', /CIDR/);
  await refuse(t, 'nonMasqueradeCIDR: 10.0.0.0/33\n', 'nonMasqueradeCIDR', /CIDR/);
});

test('bad enum values are refused, naming the allowed ones', async (t) => {
  const e1 = await refuse(t, 'hairpinMode: veth\n', 'hairpinMode', /"promiscuous-bridge", "hairpin-veth", "none"/);
  t.regex(e1?.message ?? '', /got "veth"/);
  await refuse(t, 'logLevel: verbose\n', 'logLevel', /"trace", "debug", "info", "warn", "error"/);
  await refuse(t, 'logLevel: INFO\n', 'logLevel', /"info"/);
});

test('invalid YAML, a non-mapping document and unreadable files are refused, naming the file', async (t) => {
  const e1 = await refuse(t, 'mtu: [1500\n', undefined, /valid YAML/);
  t.regex(e1?.message ?? '', /invalid YAML/);
  await refuse(t, 'mtu: 1500\nmtu: 1400\n', undefined, /valid YAML/); // duplicate key
  await refuse(t, '- a\n- b\n', undefined, /mapping of config keys/);
  await refuse(t, 'just a string\n', undefined, /mapping of config keys/);
  await refuse(t, '', undefined, /readable file/, join(dir, 'missing.yaml'));
  await refuse(t, '', undefined, /readable file/, dir); // a directory
  if (process.getuid?.() !== 0) {
    const f = await yamlFile('mtu: 1500\n');
    await chmod(f, 0o000);
    await refuse(t, '', undefined, /readable file/, f);
  }
  const missing = await t.throwsAsync(loadConfig({ file: join(dir, 'missing.yaml'), flags: {} }), { instanceOf: AgentConfigError });
  t.regex(missing?.message ?? '', /ENOENT/);
});

test('YAML 1.2 core schema: no surprise booleans or dates', async (t) => {
  // "yes"/"no" stay strings under the core schema, so this is a node name, not a boolean
  const c = await loadConfig({ file: await yamlFile('nodeName: yes\n'), flags: {}, env: ENV });
  t.is(c.nodeName, 'yes');
});

test('flags are validated too and name the flag', async (t) => {
  const err = await t.throwsAsync(loadConfig({ flags: { mtu: Number('abc') }, env: ENV }), { instanceOf: AgentConfigError });
  t.is(err?.source, 'flags');
  t.is(err?.key, 'mtu');
  t.regex(err?.message ?? '', /--mtu/);
  const unknown = await t.throwsAsync(loadConfig({ flags: { podCidr: 'x' } as unknown as Partial<AgentConfig>, env: ENV }), {
    instanceOf: AgentConfigError,
  });
  t.is(unknown?.key, 'podCidr');
  t.is((await loadConfig({ flags: { podCIDR: '10.244.3.0/24' }, env: ENV })).podCIDR, '10.244.3.0/24');
});

test('CONFIG_KEYS describes every key, with defaults matching DEFAULT_CONFIG', async (t) => {
  const c = await loadConfig({ flags: {}, env: ENV });
  const keys = Object.keys(CONFIG_KEYS).sort();
  t.deepEqual(
    keys,
    [
      ...Object.keys(c),
      'kubeconfig',
      'mtu',
      'podCIDR',
      'unshapedCIDRs',
      'uplink',
      'egressCapacity',
      'ingressCapacity',
      'capacityDevice',
      'metricsTLSCertFile',
      'metricsTLSKeyFile',
    ].sort(),
  );
  for (const [key, value] of Object.entries(DEFAULT_CONFIG)) {
    const spec = CONFIG_KEYS[key as keyof typeof CONFIG_KEYS];
    t.is(spec.default, Array.isArray(value) ? value.join(',') : String(value), key);
    t.regex(spec.flag, /^--[a-z]+(-[a-z]+)*$/);
    t.true(spec.description.length > 0);
  }
  for (const key of ['podCIDR', 'kubeconfig', 'mtu', 'uplink'] as const) t.is(CONFIG_KEYS[key].default, undefined);
  // the DESIGN.md flags of `kubenet daemon`
  t.is(CONFIG_KEYS.podCIDR.flag, '--pod-cidr');
  t.is(CONFIG_KEYS.socket.flag, '--socket');
  t.is(CONFIG_KEYS.cniBinDir.flag, '--cni-bin-dir');
  t.is(CONFIG_KEYS.cniConfDir.flag, '--cni-conf-dir');
  const md = configKeysMarkdown();
  for (const key of keys) t.true(md.includes(`| \`${key}\` |`), key);
  t.is(md.split('\n').length, keys.length + 2);
});

test('routes: direct in cluster mode with host-local; refused with a static pod CIDR or with dhcp, saying why', async (t) => {
  t.is((await loadConfig({ file: await yamlFile('routes: direct\n'), flags: {}, env: ENV })).routes, 'direct');
  t.is((await loadConfig({ flags: { routes: 'none', podCIDR: '10.244.1.0/24' }, env: ENV })).routes, 'none');
  const stat = await t.throwsAsync(loadConfig({ file: await yamlFile('routes: direct\npodCIDR: 10.244.1.0/24\n'), flags: {}, env: ENV }), {
    instanceOf: AgentConfigError,
  });
  t.is(stat?.key, 'routes');
  t.regex(stat?.message ?? '', /no Kubernetes API to watch/);
  const dhcp = await t.throwsAsync(loadConfig({ flags: { routes: 'direct', ipam: 'dhcp', uplink: 'eth1' }, env: ENV }), {
    instanceOf: AgentConfigError,
  });
  t.is(dhcp?.key, 'routes');
  t.regex(dhcp?.message ?? '', /take their addresses from the LAN/);
  const bad = await t.throwsAsync(loadConfig({ file: await yamlFile('routes: host-gw\n'), flags: {}, env: ENV }), {
    instanceOf: AgentConfigError,
  });
  t.regex(bad?.message ?? '', /one of "none", "direct"/);
});

test('ipam dhcp: uplink required there and refused elsewhere, validated as an interface name; dhcpTimeout bounds', async (t) => {
  const dhcp = await loadConfig({ file: await yamlFile('ipam: dhcp\nuplink: eth1\ndhcpTimeout: 5\n'), flags: {}, env: ENV });
  t.is(dhcp.ipam, 'dhcp');
  t.is(dhcp.uplink, 'eth1');
  t.is(dhcp.dhcpTimeout, 5);
  t.is(dhcpSocketPath(dhcp), '/run/kubenet/dhcp.sock');
  t.is((await loadConfig({ flags: { ipam: 'dhcp', uplink: 'eth2' }, env: ENV })).dhcpTimeout, 30, 'default timeout');

  const noUplink = await t.throwsAsync(loadConfig({ file: await yamlFile('ipam: dhcp\n'), flags: {}, env: ENV }), {
    instanceOf: AgentConfigError,
  });
  t.is(noUplink?.key, 'uplink');
  t.regex(noUplink?.message ?? '', /ipam "dhcp" needs an uplink/);
  const stray = await t.throwsAsync(loadConfig({ file: await yamlFile('uplink: eth1\n'), flags: {}, env: ENV }), {
    instanceOf: AgentConfigError,
  });
  t.is(stray?.key, 'uplink');
  t.regex(stray?.message ?? '', /applies only to ipam "dhcp"/);
  const strayTimeout = await t.throwsAsync(loadConfig({ flags: { dhcpTimeout: 10 }, env: ENV }), { instanceOf: AgentConfigError });
  t.is(strayTimeout?.key, 'dhcpTimeout');
  for (const bad of ['"eth/1"', '"a-name-longer-than-15"', '""', '3', '"."']) {
    const err = await t.throwsAsync(loadConfig({ file: await yamlFile(`ipam: dhcp\nuplink: ${bad}\n`), flags: {}, env: ENV }), {
      instanceOf: AgentConfigError,
    });
    t.is(err?.key, 'uplink', bad);
    t.regex(err?.message ?? '', /Linux interface name/, bad);
  }
  const same = await t.throwsAsync(loadConfig({ flags: { ipam: 'dhcp', uplink: 'cbr0' }, env: ENV }), { instanceOf: AgentConfigError });
  t.regex(same?.message ?? '', /the agent's own bridge/);
  const mode = await t.throwsAsync(loadConfig({ file: await yamlFile('ipam: static\n'), flags: {}, env: ENV }), {
    instanceOf: AgentConfigError,
  });
  t.is(mode?.key, 'ipam');
  for (const bad of [1, 601, 2.5]) {
    const err = await t.throwsAsync(loadConfig({ flags: { ipam: 'dhcp', uplink: 'eth1', dhcpTimeout: bad }, env: ENV }), {
      instanceOf: AgentConfigError,
    });
    t.is(err?.key, 'dhcpTimeout', String(bad));
  }
  // The agent's socket fits (102 bytes); dhcp.sock beside it would not (110).
  const tooLong = await t.throwsAsync(loadConfig({ flags: { ipam: 'dhcp', uplink: 'eth1', socket: `/${'s'.repeat(99)}/k` }, env: ENV }), {
    instanceOf: AgentConfigError,
  });
  t.regex(tooLong?.message ?? '', /lease daemon's socket/);
});

test('egressCapacity / ingressCapacity: bandwidth quantities kept in bits/s, refused outside 1k..10T naming the key; capacityDevice an interface name; all unset by default', async (t) => {
  const c = await loadConfig({
    file: await yamlFile('egressCapacity: 10G\ningressCapacity: 500M\ncapacityDevice: eth1\n'),
    flags: {},
    env: ENV,
  });
  t.is(c.egressCapacity, 10_000_000_000);
  t.is(c.ingressCapacity, 500_000_000);
  t.is(c.capacityDevice, 'eth1');
  const none = await loadConfig({ flags: {}, env: ENV });
  t.false('egressCapacity' in none || 'ingressCapacity' in none || 'capacityDevice' in none);
  t.is(
    (await loadConfig({ flags: { egressCapacity: 1_000_000_000 }, env: ENV })).egressCapacity,
    1e9,
    'a number is bits/s (a loaded config as flags)',
  );
  t.deepEqual(configFlags({ egressCapacity: 1e9 }), ['--egress-capacity', '1000000000']);
  for (const [bad, why] of [
    ['10 Gbit', /"10 Gbit" is not a bandwidth: want a number of bits\/s/],
    ['20T', /above the maximum/],
    ['100', /below the minimum/],
  ] as const) {
    const err = await t.throwsAsync(loadConfig({ file: await yamlFile(`ingressCapacity: ${bad}\n`), flags: {}, env: ENV }), {
      instanceOf: AgentConfigError,
    });
    t.is(err?.key, 'ingressCapacity');
    t.regex(err?.message ?? '', why);
  }
  const dev = await t.throwsAsync(loadConfig({ flags: { capacityDevice: 'a/b' }, env: ENV }), { instanceOf: AgentConfigError });
  t.is(dev?.key, 'capacityDevice');
});

test("docs/config.md documents every key: its table is configKeysMarkdown()'s, and README links to it", async (t) => {
  const page = await readFile(new URL('../../../docs/config.md', import.meta.url), 'utf8');
  t.true(page.includes(configKeysMarkdown()), 'regenerate the table in docs/config.md from configKeysMarkdown()');
  for (const key of Object.keys(CONFIG_KEYS)) t.true(page.includes(`| \`${key}\` |`), key);
  const readme = await readFile(new URL('../../../README.md', import.meta.url), 'utf8');
  t.true(readme.includes('](docs/config.md)'), 'README.md links to docs/config.md');
});

test('configFlags: every set key as its flag, lists joined; dhcp keys only with ipam dhcp', async (t) => {
  const c = await loadConfig({ flags: { podCIDR: '10.9.0.0/24', pluginBinDirs: ['/a', '/b'] }, env: ENV });
  const flags = configFlags(c);
  const at = (flag: string) => flags[flags.indexOf(flag) + 1];
  t.is(at('--pod-cidr'), '10.9.0.0/24');
  t.is(at('--plugin-bin-dirs'), '/a,/b');
  t.is(at('--node-name'), 'node-a');
  t.false(flags.includes('--mtu'), 'unset keys are left out');
  t.false(flags.includes('--dhcp-timeout'), 'dhcpTimeout (defaulted) left out with host-local: the agent would refuse it');
  const dhcp = configFlags({ ...c, ipam: 'dhcp', uplink: 'eth9', dhcpTimeout: 7 });
  t.is(dhcp[dhcp.indexOf('--uplink') + 1], 'eth9');
  t.is(dhcp[dhcp.indexOf('--dhcp-timeout') + 1], '7');
  t.is(flags.length % 2, 0);
});

test("unshapedCIDRs: a list of CIDRs, normalized; unset, the cluster's own ranges (live, not from config) with routes direct, else none", async (t) => {
  await refuse(t, 'unshapedCIDRs: 10.0.0.0/8\n', 'unshapedCIDRs', /list of CIDRs/);
  await refuse(t, 'unshapedCIDRs: [10.0.0.0/33]\n', 'unshapedCIDRs', /list of CIDRs/);
  await refuse(t, 'unshapedCIDRs: [10.0.0.0/8, 3]\n', 'unshapedCIDRs', /list of CIDRs/);
  const set = await loadConfig({ file: await yamlFile('unshapedCIDRs: [10.1.0.0/8, "fd00:10::/32"]\n'), flags: {}, env: ENV });
  t.deepEqual(set.unshapedCIDRs, ['10.0.0.0/8', 'fd00:10::/32']);
  t.deepEqual(unshapedCidrsOf(set), ['10.0.0.0/8', 'fd00:10::/32']);
  const none = await loadConfig({ file: await yamlFile('unshapedCIDRs: []\n'), flags: {}, env: ENV });
  t.deepEqual(unshapedCidrsOf({ ...none, routes: 'direct' }), [], 'an empty list shapes everything, routes or not');
  const unset = await loadConfig({ flags: { podCIDR: '10.244.1.0/24' }, env: ENV });
  t.is(unset.unshapedCIDRs, undefined);
  t.deepEqual(unshapedCidrsOf(unset), [], 'routes none: nothing is unshaped');
  t.is(
    unshapedCidrsOf({ ...unset, routes: 'direct', nonMasqueradeCIDR: '10.0.0.0/8' }),
    undefined,
    "not nonMasqueradeCIDR: the cluster's ranges, from the API (cluster-ranges.ts)",
  );
  t.deepEqual(configFlags({ unshapedCIDRs: ['10.0.0.0/8', 'fd00:10::/32'] }), ['--unshaped-cidrs', '10.0.0.0/8,fd00:10::/32']);
});

test('metricsAddress: HOST:PORT, [V6]:PORT, :PORT or off; the TLS files together; kubernetes auth needs the API', async (t) => {
  for (const ok of [':10266', '127.0.0.1:0', '[::1]:10266', '0.0.0.0:65535', 'off']) {
    t.is((await loadConfig({ flags: { metricsAddress: ok }, env: ENV })).metricsAddress, ok);
  }
  for (const [bad, why] of [
    ['10266', /HOST:PORT or :PORT/],
    ['::1:10266', /HOST:PORT or :PORT|brackets/],
    ['localhost:10266', /not an IPv4 address/],
    [':70000', /above 65535/],
    ['[10.0.0.1]:80', /not an IPv6 address/],
    ['', /HOST:PORT/],
  ] as const) {
    const err = await t.throwsAsync(loadConfig({ flags: { metricsAddress: bad }, env: ENV }));
    t.regex(err?.message ?? '', /metricsAddress/, bad);
    t.regex(err?.message ?? '', why, bad);
  }
  const half = await t.throwsAsync(loadConfig({ flags: { metricsTLSCertFile: '/etc/kubenet/tls.crt' }, env: ENV }));
  t.regex(half?.message ?? '', /metricsTLSKeyFile is missing/);
  const auth = await t.throwsAsync(loadConfig({ flags: { metricsAuth: 'kubernetes', podCIDR: '10.9.0.0/24' }, env: ENV }));
  t.regex(auth?.message ?? '', /metricsAuth.*static podCIDR/);
  const off = await t.throwsAsync(loadConfig({ flags: { metricsAuth: 'kubernetes', metricsAddress: 'off' }, env: ENV }));
  t.regex(off?.message ?? '', /not served/);
  t.is((await loadConfig({ flags: { metricsAuth: 'kubernetes' }, env: ENV })).metricsAuth, 'kubernetes');
});
