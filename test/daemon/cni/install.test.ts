/**
 * The installer's removal (src/daemon/cni/install.ts uninstallCni) on temporary directories: what
 * installCni installed goes (conflist, forwarder, the loopback copy it noted), and files under
 * those names that are not kubenet's stay, each with the reason. Needs the built forwarder
 * (npm run build:native); no root.
 */
import test from 'ava';
import { existsSync, mkdirSync, mkdtempSync, writeFileSync } from 'node:fs';
import { rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { CONFLIST_NAME, forwarderBinaryPath, installCni, uninstallCni, type InstallConfig } from '../../../src/daemon/cni/install.js';
import { silentLogger } from '../../../src/log.js';
import { Removal } from '../../../src/util/removal.js';

const maybe = existsSync(forwarderBinaryPath()) ? test : test.skip;

function dirs(t: { teardown(fn: () => unknown): void }): InstallConfig & { stateDir: string } {
  const root = mkdtempSync(join(tmpdir(), 'kinstall-'));
  t.teardown(() => rm(root, { recursive: true, force: true }));
  const plugins = join(root, 'plugins');
  mkdirSync(plugins);
  writeFileSync(join(plugins, 'loopback'), '#!/bin/sh\n# a loopback plugin\n', { mode: 0o755 });
  return {
    cniBinDir: join(root, 'bin'),
    cniConfDir: join(root, 'conf'),
    pluginBinDirs: [plugins],
    socket: join(root, 'k.sock'),
    stateDir: join(root, 'state'),
  };
}

maybe('uninstallCni removes what installCni put there, the conflist first, and the loopback note', async (t) => {
  const c = dirs(t);
  installCni(c, silentLogger());
  t.true(existsSync(join(c.stateDir, 'installed-loopback')), 'the copy of loopback is noted');
  const r = new Removal(false);
  await uninstallCni(c, r);
  t.deepEqual(r.lines(), [
    `removed file ${join(c.cniConfDir, CONFLIST_NAME)} (the CNI config)`,
    `removed file ${join(c.cniBinDir, 'kubenet')} (the CNI forwarding binary)`,
    `removed file ${join(c.cniBinDir, 'loopback')} (the loopback plugin kubenet copied)`,
    `removed file ${join(c.stateDir, 'installed-loopback')}`,
  ]);
  for (const f of [join(c.cniConfDir, CONFLIST_NAME), join(c.cniBinDir, 'kubenet'), join(c.cniBinDir, 'loopback')])
    t.false(existsSync(f), f);
  const again = new Removal(false);
  await uninstallCni(c, again);
  t.deepEqual(again.steps, [], 'nothing left to do');
});

maybe("files under kubenet's names that are not its own stay, saying why; a loopback that was there before is not touched", async (t) => {
  const c = dirs(t);
  mkdirSync(c.cniBinDir);
  writeFileSync(join(c.cniBinDir, 'loopback'), 'the node had one\n', { mode: 0o755 });
  installCni(c, silentLogger());
  t.false(existsSync(join(c.stateDir, 'installed-loopback')), 'not copied, not noted');
  writeFileSync(join(c.cniConfDir, CONFLIST_NAME), JSON.stringify({ name: 'other', plugins: [{ type: 'bridge' }] }));
  writeFileSync(join(c.cniBinDir, 'kubenet'), 'another program\n');
  const dry = new Removal(true);
  await uninstallCni(c, dry);
  const r = new Removal(false);
  await uninstallCni(c, r);
  t.deepEqual(r.lines(), [
    `kept file ${join(c.cniConfDir, CONFLIST_NAME)}: not a conflist of network kubenet with plugin type kubenet`,
    `kept file ${join(c.cniBinDir, 'kubenet')}: not kubenet's CNI forwarding binary`,
  ]);
  t.deepEqual(dry.lines(), r.lines());
  t.false(r.clean());
  t.true(existsSync(join(c.cniBinDir, 'loopback')));
});

maybe('a noted loopback changed since is kept', async (t) => {
  const c = dirs(t);
  installCni(c, silentLogger());
  writeFileSync(join(c.cniBinDir, 'loopback'), 'replaced by another installer\n');
  const r = new Removal(false);
  await uninstallCni(c, r);
  t.true(
    r.lines().includes(`kept file ${join(c.cniBinDir, 'loopback')}: changed since kubenet copied it there (another installer owns it now)`),
  );
  t.true(existsSync(join(c.cniBinDir, 'loopback')));
});
