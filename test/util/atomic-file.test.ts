/**
 * SpareFileWriter: the pod records' write-then-rename through pre-made spare files. No root needed;
 * everything in a temporary directory.
 */
import test from 'ava';
import { mkdtemp, readdir, readFile, rm, stat } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { SpareFileWriter } from '../../src/util/atomic-file.js';

async function tmp(t: import('ava').ExecutionContext): Promise<string> {
  const d = await mkdtemp(join(tmpdir(), 'katom-'));
  t.teardown(() => rm(d, { recursive: true, force: true }));
  return d;
}

async function until(what: string, probe: () => Promise<boolean>): Promise<void> {
  for (const deadline = Date.now() + 5000; !(await probe()); await sleep(5)) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
  }
}

const ls = async (d: string) => (await readdir(d).catch(() => [] as string[])).sort();

test('writes, replaces and removes files; the target directory holds only the targets; spares are reused, not created per write', async (t) => {
  const root = await tmp(t);
  const dir = join(root, 'pods');
  const spareDir = join(root, '.pods-spare');
  const w = new SpareFileWriter(dir, spareDir, { mode: 0o600, keep: 3 });

  // The first write has no spare yet: the plain write-then-rename, creating the directory.
  w.write('a.json', '{"v":1}');
  t.is(await readFile(join(dir, 'a.json'), 'utf8'), '{"v":1}');
  t.is((await stat(join(dir, 'a.json'))).mode & 0o777, 0o600);
  await until('3 spares', async () => (await ls(spareDir)).length === 3);

  // A write through a spare: same content rules, the spare's inode becomes the target.
  const spares = await ls(spareDir);
  const spareInodes = new Set(await Promise.all(spares.map(async (s) => (await stat(join(spareDir, s))).ino)));
  w.write('a.json', '{"v":2}');
  t.is(await readFile(join(dir, 'a.json'), 'utf8'), '{"v":2}');
  t.true(spareInodes.has((await stat(join(dir, 'a.json'))).ino), 'the target is a former spare');
  w.write('b.json', 'x'.repeat(5000));
  w.write('b.json', 'short');
  t.is(await readFile(join(dir, 'b.json'), 'utf8'), 'short', 'a shorter content leaves nothing of the longer one');
  t.deepEqual(await ls(dir), ['a.json', 'b.json']);

  // A removal recycles the file as a spare; removing what is missing succeeds.
  await until('spares again', async () => (await ls(spareDir)).length >= 3);
  const ino = (await stat(join(dir, 'a.json'))).ino;
  w.remove('a.json');
  t.deepEqual(await ls(dir), ['b.json']);
  const after = await Promise.all((await ls(spareDir)).map(async (s) => (await stat(join(spareDir, s))).ino));
  t.true(after.includes(ino), 'the removed file became a spare');
  t.notThrows(() => w.remove('a.json'));
  t.notThrows(() => w.remove('never.json'));
});

test('sweepSpares removes what a previous process left; writes still work when the spares or the directory vanish', async (t) => {
  const root = await tmp(t);
  const dir = join(root, 'pods');
  const spareDir = join(root, '.pods-spare');
  const first = new SpareFileWriter(dir, spareDir, { mode: 0o600, keep: 2 });
  first.write('a.json', '1');
  await until('spares', async () => (await ls(spareDir)).length === 2);

  const second = new SpareFileWriter(dir, spareDir, { mode: 0o600, keep: 2 });
  second.sweepSpares();
  t.deepEqual(await ls(spareDir), []);
  // first still believes in its spares: a write recreates the file it picks, nothing is lost.
  first.write('a.json', '2');
  t.is(await readFile(join(dir, 'a.json'), 'utf8'), '2');

  // Both directories removed under the writer: the next write makes the target directory again.
  await rm(dir, { recursive: true });
  await rm(spareDir, { recursive: true });
  first.write('c.json', '3');
  t.is(await readFile(join(dir, 'c.json'), 'utf8'), '3');
  first.remove('c.json');
  t.deepEqual(await ls(dir), []);
});
