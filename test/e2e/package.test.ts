/**
 * The package as users get it: `npm pack` of this project, installed from the tarball into a fresh
 * temporary project (npm registry for its dependencies), then used there exactly as docs/library.md
 * shows: `import { KubenetPlugin, … } from 'kubenet-ts'` in TypeScript (typechecked with the
 * package's own declarations, then run), and the `kubenet` bin (its daemon installs the forwarder
 * the package built at install time; a pod goes through it via libcni). Everything on the node is
 * the test's own: a network namespace per pod, a uniquely named bridge and ifb, temporary dirs.
 */
import anyTest, { type ExecutionContext, type TestFn } from 'ava';
import { execa, type ResultPromise } from 'execa';
import { readFile, writeFile, mkdir } from 'node:fs/promises';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { LIBCNI_DRIVER } from '../kit/agent-harness.js';
import { withTrafficLock } from '../kit/traffic-lock.js';
import { addNetns, CNI_BIN_DIRS, Cleanup, delIfbs, delLink, delNetns, kernelTestBlocker, makeTmpDir, rmrf, uniq } from '../kit/kernel.js';

const ROOT = fileURLToPath(new URL('../../', import.meta.url));
const blocker = kernelTestBlocker();
const test = anyTest as TestFn;
const serialTest = blocker ? test.serial.skip : test.serial;
if (blocker) console.warn(`package e2e tests skipped: ${blocker}`);

/** What docs/library.md documents as the package's exports (runtime values; types are checked by tsc). */
const DOCUMENTED_EXPORTS = [
  'AggregateKubenetError',
  'CniPluginError',
  'ConfigError',
  'ConflictError',
  'KubenetError',
  'KubenetPlugin',
  'NetlinkError',
  'NotReadyError',
  'ToolError',
  'UnknownPodError',
];

const pkg = JSON.parse(await readFile(join(ROOT, 'package.json'), 'utf8')) as { version: string; devDependencies: Record<string, string> };

/** npm, retried on its own failures (registry hiccups), never hiding a failure of the package. */
async function npm(args: string[], cwd: string): Promise<string> {
  let last = '';
  for (let attempt = 1; attempt <= 3; attempt++) {
    const r = await execa('npm', [...args, '--no-audit', '--no-fund', '--loglevel=error'], { cwd, reject: false, timeout: 180_000 });
    if (r.exitCode === 0) return r.stdout;
    last = `${r.stderr}\n${r.stdout}`;
    if (!/ECONNRESET|ETIMEDOUT|EAI_AGAIN|ENOTFOUND|socket hang up|network/i.test(last)) break;
  }
  throw new Error(`npm ${args.join(' ')} failed:\n${last}`);
}

test('docs/library.md names every export the package has (its "exports exactly" paragraph)', async (t) => {
  const page = await readFile(join(ROOT, 'docs/library.md'), 'utf8');
  const paragraph = /^The package exports exactly:[\s\S]*?(?=\n\n)/m.exec(page)?.[0] ?? '';
  t.not(paragraph, '', 'docs/library.md keeps its "The package exports exactly:" paragraph');
  const named = new Set([...paragraph.matchAll(/`([A-Za-z]+)/g)].map((m) => m[1]));
  t.deepEqual(
    DOCUMENTED_EXPORTS.filter((e) => !named.has(e)),
    [],
    'every runtime export is named in docs/library.md',
  );
});

serialTest(
  'npm pack, installed in a fresh project: the documented exports, typed, used as docs/library.md shows, and the kubenet bin',
  async (t) => {
    t.timeout(600_000);
    // CPU-heavy (npm pack, npm install, tsc): never beside another suite's traffic measurement, whose
    // flows it starved of CPU in a full run (a 20M flow dipped to 8.8 Mbit/s while this installed).
    await withTrafficLock(() => packedPackage(t));
  },
);

async function packedPackage(t: ExecutionContext): Promise<void> {
  const started = Date.now();
  const step = (what: string) => t.log(`${((Date.now() - started) / 1000).toFixed(1)} s: ${what}`);
  const cleanup = new Cleanup();
  t.teardown(() => cleanup.run());
  const tmp = await makeTmpDir('kpkg');
  cleanup.add(() => rmrf(tmp));

  const packed = (await npm(['pack', '--pack-destination', tmp], ROOT)).trim().split('\n').pop() ?? '';
  t.is(packed, `kubenet-ts-${pkg.version}.tgz`);
  step('packed');
  const project = join(tmp, 'user-project');
  await mkdir(project);
  await writeFile(join(project, 'package.json'), JSON.stringify({ name: 'user-project', private: true, type: 'module' }));
  await npm(
    [
      'install',
      join(tmp, packed),
      `typescript@${pkg.devDependencies.typescript}`,
      `@types/node@${pkg.devDependencies['@types/node']}`,
      '--prefer-offline',
    ],
    project,
  );

  step('installed from the tarball');
  // The exports, at run time.
  const keys = await execa(
    'node',
    ['--input-type=module', '-e', "const m = await import('kubenet-ts'); console.log(JSON.stringify(Object.keys(m).sort()))"],
    { cwd: project },
  );
  t.deepEqual(JSON.parse(keys.stdout), DOCUMENTED_EXPORTS, 'the entry exports the documented API and nothing else');

  // docs/library.md's example, in strict TypeScript against the package's own declarations.
  const tag = uniq(6);
  const bridge = `kpk${tag}`;
  const ifb = `kpi${tag}`;
  cleanup.add(() => delLink(bridge));
  cleanup.add(() => delIfbs(ifb));
  const netns = `kpk-${tag}`;
  const { path: netnsPath } = await addNetns(netns);
  cleanup.add(() => delNetns(netns));
  const dirs = { ipam: join(tmp, 'ipam'), state: join(tmp, 'state'), shaper: join(tmp, 'shaper'), cache: join(tmp, 'cache') };
  const program = `
import { KubenetPlugin, ConfigError, KubenetError, NotReadyError, type Host } from 'kubenet-ts';

const sandboxId = ${JSON.stringify('c'.repeat(64))};
const host: Host = {
  getPodByName: () => ({ annotations: { 'kubernetes.io/ingress-bandwidth': '10M', 'kubernetes.io/egress-bandwidth': '5M' } }),
  getNetNS: () => ${JSON.stringify(netnsPath)},
};
const plugin = new KubenetPlugin({
  bridgeName: ${JSON.stringify(bridge)}, cniBinDirs: ${JSON.stringify(CNI_BIN_DIRS)}, ipamDataDir: ${JSON.stringify(dirs.ipam)},
  stateDir: ${JSON.stringify(dirs.state)}, cniCacheDir: ${JSON.stringify(dirs.cache)}, ifbName: ${JSON.stringify(ifb)}, shaperStateDir: ${JSON.stringify(dirs.shaper)},
});
try {
  plugin.status();
} catch (err) {
  if (!(err instanceof NotReadyError) || !(err instanceof KubenetError)) throw err;
}
try {
  new KubenetPlugin({ mtu: 5 });
  throw new Error('mtu 5 accepted');
} catch (err) {
  if (!(err instanceof ConfigError)) throw err;
}
await plugin.init(host, 'hairpin-veth', '0.0.0.0/0');
await plugin.event('pod-cidr-change', { 'pod-cidr': '10.231.7.0/24' });
await plugin.setUpPod('default', 'web-0', sandboxId);
const status: { ip: string; ips: string[] } = await plugin.getPodNetworkStatus('default', 'web-0', sandboxId);
await plugin.tearDownPod('default', 'web-0', sandboxId);
plugin.close();
console.log(JSON.stringify(status));
`;
  await writeFile(join(project, 'main.ts'), program);
  await writeFile(
    join(project, 'tsconfig.json'),
    JSON.stringify({
      compilerOptions: { target: 'ES2022', module: 'NodeNext', moduleResolution: 'NodeNext', strict: true, outDir: 'out', types: ['node'] },
      include: ['main.ts'],
    }),
  );
  const tsc = await execa('npx', ['tsc', '-p', '.'], { cwd: project, reject: false });
  step('typechecked');
  t.is(tsc.exitCode, 0, `the docs/library.md example typechecks against the package's declarations:\n${tsc.stdout}${tsc.stderr}`);
  const run = await execa('node', ['out/main.js'], { cwd: project, reject: false, timeout: 60_000 });
  t.is(run.exitCode, 0, run.stderr);
  step('ran the library example');
  const status = JSON.parse(run.stdout.trim().split('\n').pop() ?? '{}') as { ip: string; ips: string[] };
  t.regex(status.ip, /^10\.231\.7\.\d+$/, 'setUpPod gave the pod an address from the pod CIDR');
  t.deepEqual(status.ips, [status.ip]);

  // The bin, as installed: help, then the node agent, which installs the forwarder the package built.
  // The bin as npm linked it: what `kubenet` on a user's PATH runs.
  const bin = join(project, 'node_modules/.bin/kubenet');
  const help = await execa(bin, ['--help'], { cwd: project, reject: false });
  t.is(help.exitCode, 0);
  t.regex(help.stdout, /kubenet daemon/);
  // The kubectl plugin, as npm linked it: `kubectl kubenet` runs it once node_modules/.bin is on PATH.
  const plugin = await execa(join(project, 'node_modules/.bin/kubectl-kubenet'), ['--help'], { cwd: project, reject: false });
  t.is(plugin.exitCode, 0, plugin.stderr);
  t.regex(plugin.stdout, /kubectl kubenet top /);
  const cniBin = join(tmp, 'cni-bin');
  const cniConf = join(tmp, 'cni-conf');
  const socket = join(tmp, 'kubenet.sock');
  const daemonArgs = [
    'daemon',
    '--pod-cidr',
    '10.231.8.0/24',
    '--socket',
    socket,
    '--cni-bin-dir',
    cniBin,
    '--cni-conf-dir',
    cniConf,
    '--plugin-bin-dirs',
    CNI_BIN_DIRS.join(','),
    '--bridge-name',
    bridge,
    '--ifb-name',
    ifb,
    '--ipam-data-dir',
    dirs.ipam,
    '--cni-cache-dir',
    dirs.cache,
    '--state-dir',
    join(tmp, 'agent-state'),
    '--non-masquerade-cidr',
    '0.0.0.0/0',
    '--log-level',
    'warn',
    '--metrics-address',
    '127.0.0.1:0',
  ];
  const daemon: ResultPromise = execa(bin, daemonArgs, { cwd: project, reject: false });
  cleanup.add(async () => {
    daemon.kill('SIGKILL');
    await daemon;
  });
  let healthy = false;
  for (let i = 0; i < 100 && !healthy; i++) {
    healthy = (await execa(bin, ['health', '--socket', socket], { cwd: project, reject: false })).exitCode === 0;
    if (!healthy) await new Promise((r) => setTimeout(r, 200));
  }
  t.true(healthy, 'kubenet health answers once the agent is up');
  step('agent healthy');
  t.is(
    (await readFile(join(cniBin, 'kubenet'))).equals(await readFile(join(project, 'node_modules/kubenet-ts/native/build/kubenet-cni'))),
    true,
    'the agent installed the forwarder the package built',
  );

  const podNs = `kpk-${tag}-p`;
  const { path: podPath } = await addNetns(podNs);
  cleanup.add(() => delNetns(podNs));
  const libcni = (cmd: string) =>
    execa(
      LIBCNI_DRIVER,
      [
        cmd,
        '--conf-dir',
        cniConf,
        '--bin-dir',
        [cniBin, ...CNI_BIN_DIRS].join(':'),
        '--cache-dir',
        join(tmp, 'libcni-cache'),
        '--netns',
        podPath,
        '--container-id',
        'd'.repeat(64),
        '--args',
        'K8S_POD_NAMESPACE=default;K8S_POD_NAME=p',
      ],
      { reject: false },
    );
  const add = await libcni('add');
  t.is(add.exitCode, 0, add.stderr);
  t.regex(add.stdout, /10\.231\.8\.\d+\/24/);
  t.is((await libcni('del')).exitCode, 0);
  daemon.kill('SIGTERM');
  const exited = await daemon;
  t.is(exited.exitCode, 0, `the agent exits cleanly on SIGTERM: ${String(exited.stderr)}`);
  step('agent stopped');
}
