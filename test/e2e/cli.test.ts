/**
 * The `kubenet` command as an operator runs it: `daemon` as a real process on a static pod CIDR
 * (the test's own bridge, ifb, socket and dirs), `status` and `health` against it, SIGTERM; and
 * the startup errors an operator sees for bad configuration.
 */
import anyTest, { type TestFn } from 'ava';
import { execa, type ResultPromise } from 'execa';
import { stat, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { agentTestBlocker } from '../kit/agent-harness.js';
import { Cleanup, CNI_BIN_DIRS, delIfbs, delLink, kernelTestBlocker, makeTmpDir, rmrf, uniq } from '../kit/kernel.js';

const ROOT = fileURLToPath(new URL('../../', import.meta.url));
const MAIN = join(ROOT, 'src/cli/main.ts');
const blocker = kernelTestBlocker() ?? agentTestBlocker();
const test = anyTest as TestFn;
const kernelTest = blocker ? test.serial.skip : test.serial;
if (blocker) console.warn(`cli e2e tests skipped: ${blocker}`);

function kubenet(args: string[]) {
  return execa(process.execPath, ['--import=tsx', MAIN, ...args], { cwd: ROOT, reject: false, timeout: 60_000 });
}

kernelTest('kubenet daemon --pod-cidr: health, status, SIGTERM exits 0 and removes the socket', async (t) => {
  const cleanup = new Cleanup();
  t.teardown(() => cleanup.run());
  const tag = uniq(6);
  const dir = await makeTmpDir('kcli');
  const bridge = `kcl${tag}`;
  cleanup.add(() => rmrf(dir));
  cleanup.add(() => delLink(bridge));
  cleanup.add(() => delIfbs(`kci${tag}`));
  const socket = join(dir, 'k.sock');
  const flags = ['--socket', socket, '--metrics-address', '127.0.0.1:0'];
  const daemon: ResultPromise = execa(
    process.execPath,
    [
      '--import=tsx',
      MAIN,
      'daemon',
      '--pod-cidr',
      '10.93.7.0/24',
      ...flags,
      '--cni-bin-dir',
      join(dir, 'bin'),
      '--cni-conf-dir',
      join(dir, 'conf'),
      '--plugin-bin-dirs',
      CNI_BIN_DIRS.join(','),
      '--bridge-name',
      bridge,
      '--ifb-name',
      `kci${tag}`,
      '--non-masquerade-cidr',
      '0.0.0.0/0',
      '--ipam-data-dir',
      join(dir, 'ipam'),
      '--cni-cache-dir',
      join(dir, 'cache'),
      '--state-dir',
      join(dir, 'state'),
    ],
    { cwd: ROOT, reject: false },
  );
  cleanup.add(async () => {
    daemon.kill('SIGKILL');
    await daemon;
  });

  const deadline = Date.now() + 30_000;
  let health = await kubenet(['health', ...flags]);
  while (health.exitCode !== 0 && Date.now() < deadline) {
    await new Promise((r) => setTimeout(r, 200));
    health = await kubenet(['health', ...flags]);
  }
  t.is(health.exitCode, 0, `health: ${health.stderr}`);

  const status = await kubenet(['status', ...flags]);
  t.is(status.exitCode, 0, status.stderr);
  t.regex(status.stdout, /pod CIDR: 10\.93\.7\.0\/24/);
  t.regex(status.stdout, new RegExp(`bridge: +${bridge}`));
  t.regex(status.stdout, /pods: +0/);
  t.regex(status.stdout, /unshaped: \(none: limits hold for all traffic\)/, 'a static pod CIDR (routes none): nothing unshaped by default');
  t.regex(
    status.stdout,
    /^guarantees: off: no capacity: guarantees come from the pods' requests of the Node's resources, in cluster mode$/m,
    'the static mode gives none, and says so',
  );
  const { bandwidth, ...json } = JSON.parse((await kubenet(['status', '--json', ...flags])).stdout) as {
    podCIDR: string;
    ready: boolean;
    pods: unknown[];
    bandwidth?: { capacity: object; committed: object };
  };
  t.deepEqual(json, { podCIDR: '10.93.7.0/24', bridge, ready: true, unshapedCIDRs: [], pods: [] });
  t.like(bandwidth, { capacity: {}, committed: { ingress: 0, egress: 0 } });
  t.is((await stat(join(dir, 'conf', '10-kubenet.conflist'))).isFile(), true);

  daemon.kill('SIGTERM');
  const exit = await daemon;
  t.is(exit.exitCode, 0, String(exit.stderr));
  t.regex(String(exit.stdout), /stopping: finishing CNI calls in flight/);
  await t.throwsAsync(stat(socket), { code: 'ENOENT' });

  const down = await kubenet(['status', ...flags]);
  t.is(down.exitCode, 1);
  t.true(down.stderr.includes(`unreachable at ${socket}`), down.stderr);
  t.is((await kubenet(['health', ...flags])).exitCode, 1);
});

test('bad configuration stops startup with an error naming the file, flag or key', async (t) => {
  const dir = await makeTmpDir('kcli-conf');
  t.teardown(() => rmrf(dir));
  const file = join(dir, 'config.yaml');
  await writeFile(file, 'bridgeNmae: cbr0\n');
  const unknownKey = await kubenet(['daemon', '--config', file]);
  t.is(unknownKey.exitCode, 1);
  t.true(unknownKey.stderr.includes(file), unknownKey.stderr);
  t.regex(unknownKey.stderr, /bridgeNmae/);
  t.regex(unknownKey.stderr, /bridgeName/, 'a hint for the near miss');

  await writeFile(file, 'mtu: "1500"\n');
  const wrongType = await kubenet(['daemon', '--config', file]);
  t.is(wrongType.exitCode, 1);
  t.regex(wrongType.stderr, /mtu/);

  const badFlag = await kubenet(['daemon', '--mtu', 'abc']);
  t.is(badFlag.exitCode, 1);
  t.regex(badFlag.stderr, /mtu/);
  const badCidr = await kubenet(['daemon', '--pod-cidr', '10.0.0.0/33']);
  t.is(badCidr.exitCode, 1);
  t.regex(badCidr.stderr, /10\.0\.0\.0\/33/);
  const unknownFlag = await kubenet(['daemon', '--no-such-flag']);
  t.is(unknownFlag.exitCode, 1);
  t.regex(unknownFlag.stderr, /no-such-flag/);
  const unknownCommand = await kubenet(['frobnicate']);
  t.is(unknownCommand.exitCode, 2);
  t.regex(unknownCommand.stderr, /usage:/);
});
