/**
 * The uninstall's account (src/util/removal.ts): what was removed, kept and failed, a dry run that
 * changes nothing, and the directory helpers on a temporary directory. No root.
 */
import test from 'ava';
import { existsSync, mkdirSync, mkdtempSync, writeFileSync } from 'node:fs';
import { rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Removal, removeEmptyDir, removePath } from '../../src/util/removal.js';

test('a removal reports each step; clean only when nothing was kept or failed; nothing to do when empty', async (t) => {
  const r = new Removal(false);
  t.deepEqual(r.lines(), ['nothing to do: no kubenet-ts object on this node']);
  t.true(r.clean());
  t.true(await r.remove('link a', () => undefined));
  t.false(
    await r.remove('link b', () => {
      throw new Error('busy');
    }),
  );
  r.keep('file c', 'not ours');
  t.deepEqual(r.lines(), ['removed link a', 'FAILED to remove link b: busy', 'kept file c: not ours']);
  t.false(r.clean());
});

test('a dry run says what it would remove and runs nothing', async (t) => {
  const r = new Removal(true);
  let ran = false;
  await r.remove('link a', () => {
    ran = true;
  });
  t.false(ran);
  t.deepEqual(r.lines(), ['would remove link a']);
});

test('removePath removes a tree; removeEmptyDir only an empty directory, reporting a full one when asked', async (t) => {
  const dir = mkdtempSync(join(tmpdir(), 'kremoval-'));
  t.teardown(() => rm(dir, { recursive: true, force: true }));
  mkdirSync(join(dir, 'state/pods'), { recursive: true });
  writeFileSync(join(dir, 'state/pods/x.json'), '{}');
  writeFileSync(join(dir, 'state/other'), '');
  const r = new Removal(false);
  await removePath(r, 'records', join(dir, 'state/pods'));
  await removePath(r, 'records', join(dir, 'nothing-here'));
  await removeEmptyDir(r, 'state', join(dir, 'state'), 'holds files kubenet-ts did not make');
  t.false(existsSync(join(dir, 'state/pods')));
  t.true(existsSync(join(dir, 'state/other')));
  t.deepEqual(r.lines(), [
    `removed records ${join(dir, 'state/pods')}`,
    `kept state ${join(dir, 'state')}: holds files kubenet-ts did not make: other`,
  ]);
  await rm(join(dir, 'state/other'));
  const again = new Removal(false);
  await removeEmptyDir(again, 'state', join(dir, 'state'));
  t.false(existsSync(join(dir, 'state')));
  t.deepEqual(again.lines(), [`removed state ${join(dir, 'state')}`]);
});
