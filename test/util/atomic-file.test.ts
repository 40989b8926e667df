/**
 * SpareFileWriter: the pod records' write-then-rename through spare files. No root needed;
 * everything in a temporary directory.
 */
import test from 'ava';
import { mkdtemp, readdir, readFile, rm, stat, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { SpareFileWriter } from '../../src/util/atomic-file.js';
import { until } from '../kit/until.js';

async function tmp(t: import('ava').ExecutionContext): Promise<string> {
  const d = await mkdtemp(join(tmpdir(), 'katom-'));
  t.teardown(() => rm(d, { recursive: true, force: true }));
  return d;
}

const ls = async (d: string) => (await readdir(d).catch(() => [] as string[])).sort();
const inodes = async (d: string) => Promise.all((await ls(d)).map(async (f) => stat(join(d, f))));

test('writes, replaces and removes files; the target directory holds only the targets; spares recycle the replaced and removed files', async (t) => {
  const root = await tmp(t);
  const dir = join(root, 'pods');
  const spareDir = join(root, '.pods-spare');
  const w = new SpareFileWriter(dir, spareDir, { mode: 0o600, keep: 4, delayMs: 0 });

  // The first write has no spare yet: the plain write-then-rename, creating the directory; spares follow.
  w.write('a.json', '{"v":1}');
  t.is(await readFile(join(dir, 'a.json'), 'utf8'), '{"v":1}');
  t.is((await stat(join(dir, 'a.json'))).mode & 0o777, 0o600);
  await until('4 spares', () => w.spareCount === 4, 5000, 5);
  t.is((await ls(spareDir)).length, 4);

  // A write through a spare: the spare's inode becomes the target; the replaced file becomes a spare, with no other link.
  const spareInos = new Set((await inodes(spareDir)).map((s) => s.ino));
  const replaced = (await stat(join(dir, 'a.json'))).ino;
  w.write('a.json', '{"v":2}');
  t.is(await readFile(join(dir, 'a.json'), 'utf8'), '{"v":2}');
  t.true(spareInos.has((await stat(join(dir, 'a.json'))).ino), 'the target is a former spare');
  t.true(
    (await inodes(spareDir)).some((s) => s.ino === replaced && s.nlink === 1),
    'the replaced file is a spare, linked nowhere else',
  );
  t.is(w.spareCount, 4);

  // Content shorter than the spare's: padded with spaces, never a leftover byte of the longer one.
  w.write('b.json', JSON.stringify({ long: 'x'.repeat(5000) }));
  w.write('b.json', JSON.stringify({ long: 'y'.repeat(6000) }));
  w.write('b.json', '{"short":1}');
  w.write('b.json', '{"short":2}');
  const b = await readFile(join(dir, 'b.json'), 'utf8');
  t.deepEqual(JSON.parse(b), { short: 2 });
  t.regex(b, /^\{"short":2\} *$/);
  t.deepEqual(await ls(dir), ['a.json', 'b.json']);

  // A removal recycles the file as a spare; removing what is missing succeeds.
  const ino = (await stat(join(dir, 'a.json'))).ino;
  w.remove('a.json');
  t.deepEqual(await ls(dir), ['b.json']);
  t.true((await inodes(spareDir)).some((s) => s.ino === ino));
  t.notThrows(() => w.remove('a.json'));
  t.notThrows(() => w.remove('never.json'));
});

test('sweepSpares removes what a previous process left; writes still work when spares or directories vanish', async (t) => {
  const root = await tmp(t);
  const dir = join(root, 'pods');
  const spareDir = join(root, '.pods-spare');
  const first = new SpareFileWriter(dir, spareDir, { mode: 0o600, keep: 2, delayMs: 0 });
  first.write('a.json', '1');
  await until('spares', () => first.spareCount === 2, 5000, 5);

  const second = new SpareFileWriter(dir, spareDir, { mode: 0o600, keep: 2, delayMs: 0 });
  await writeFile(join(spareDir, 'leftover'), 'x');
  second.sweepSpares();
  t.deepEqual(await ls(spareDir), []);
  // first still believes in its spares: its write falls back to a fresh temporary file, nothing is lost.
  first.write('a.json', '2');
  t.is(await readFile(join(dir, 'a.json'), 'utf8'), '2');

  // Both directories removed under the writer: the next write makes the target directory again.
  t.true(first.spareCount >= 1);
  await rm(dir, { recursive: true });
  await rm(spareDir, { recursive: true });
  first.write('c.json', '3');
  t.is(await readFile(join(dir, 'c.json'), 'utf8'), '3');
  first.remove('c.json');
  t.deepEqual(await ls(dir), []);
});

test('close stops making spares: nothing is created afterwards, so the directories can be removed', async (t) => {
  const root = await tmp(t);
  const dir = join(root, 'pods');
  const spareDir = join(root, '.pods-spare');
  const w = new SpareFileWriter(dir, spareDir, { mode: 0o600, keep: 8, delayMs: 20 });
  w.write('a.json', '{"v":1}'); // no spare yet: asks for 8 after the pause
  w.close();
  await sleep(100);
  t.is(w.spareCount, 0);
  t.deepEqual(await ls(spareDir), [], 'no spare made after close');
  await rm(root, { recursive: true }); // what a test's or an operator's cleanup does next
  t.deepEqual(await ls(root), []);
  // Writes still work after close, the plain way.
  w.write('b.json', '{"v":2}');
  t.is(await readFile(join(dir, 'b.json'), 'utf8'), '{"v":2}');
});
