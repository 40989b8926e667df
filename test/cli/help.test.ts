import test from 'ava';
import { execa } from 'execa';
import { fileURLToPath } from 'node:url';
import { commandHelp, usage, wrap } from '../../src/cli/help.js';
import { CONFIG_KEYS } from '../../src/daemon/config/config.js';

const MAIN = fileURLToPath(new URL('../../src/cli/main.ts', import.meta.url));
const kubenet = (args: string[]) =>
  execa(process.execPath, ['--import=tsx', MAIN, ...args], {
    reject: false,
    timeout: 60_000,
    env: { KUBERNETES_SERVICE_HOST: '', KUBERNETES_SERVICE_PORT: '' },
  });

test('daemon help names every config key with its flag, type and default, from CONFIG_KEYS', (t) => {
  const text = commandHelp('daemon') ?? '';
  for (const [key, spec] of Object.entries(CONFIG_KEYS)) {
    t.true(text.includes(`\n  ${key}  ${spec.flag}  `), `${key} ${spec.flag}`);
    if (spec.default !== undefined) t.true(text.includes(`default: ${spec.default}`), `${key}'s default ${spec.default}`);
  }
  t.regex(text, /\n {2}hairpinMode {2}--hairpin-mode {2}promiscuous-bridge \| hairpin-veth \| none {2}default: hairpin-veth\n/);
  t.true(
    text.split('\n').every((l) => l.length <= 100 || !l.includes(' ', 4)),
    'lines wrapped at 100 columns',
  );
});

test('every command has help; an unknown one has none', (t) => {
  for (const cmd of ['daemon', 'status', 'shape', 'top', 'health', 'uninstall'])
    t.regex(commandHelp(cmd) ?? '', new RegExp(`^usage: kubenet ${cmd} `), cmd);
  t.is(commandHelp('nope'), undefined);
  t.regex(commandHelp('top') ?? '', /\n {2}-d SECONDS {9}refresh interval/);
  t.regex(usage(), /^usage:\n {2}kubenet daemon /);
});

test('wrap keeps words whole and lines within the width', (t) => {
  t.deepEqual(wrap('aa bb cc dd', 8, '  '), ['  aa bb', '  cc dd']);
  t.deepEqual(wrap('averyveryverylongword x', 8, ''), ['averyveryverylongword', 'x']);
  t.deepEqual(wrap('', 8, ''), []);
});

test('kubenet daemon --help and kubenet help daemon print the keys and exit 0, without starting an agent', async (t) => {
  for (const args of [
    ['daemon', '--help'],
    ['help', 'daemon'],
    ['daemon', '-h'],
  ]) {
    const r = await kubenet(args);
    t.is(r.exitCode, 0, `${args.join(' ')}: ${r.stderr}`);
    t.regex(r.stdout, /--non-masquerade-cidr/, args.join(' '));
    t.is(r.stderr, '', args.join(' '));
  }
  const unknown = await kubenet(['help', 'nope']);
  t.is(unknown.exitCode, 2);
  t.regex(unknown.stderr, /unknown command "nope"/);
});
