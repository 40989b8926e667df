/**
 * The documentation's shape, checked on the files themselves, without root:
 * - README.md is the front door: at most 200 lines (everything else lives in docs/);
 * - every relative link in README.md and docs/*.md names a file that exists, and for `#anchor`
 *   links a heading of that page (GitHub's slugs: lower case, punctuation dropped, each space a
 *   hyphen, `-1`, `-2`, ... for repeats).
 */
import test from 'ava';
import { existsSync, readdirSync, readFileSync } from 'node:fs';
import { dirname, join, relative } from 'node:path';
import { fileURLToPath } from 'node:url';

const ROOT = fileURLToPath(new URL('../', import.meta.url));
const README_MAX_LINES = 200;

/** The text outside fenced code blocks, line by line (fenced lines blanked, so line numbers hold). */
function prose(text: string): string[] {
  let fence: string | undefined;
  return text.split('\n').map((line) => {
    const m = /^\s*(`{3,}|~{3,})/.exec(line);
    if (m?.[1] && (fence === undefined || m[1].startsWith(fence))) {
      fence = fence === undefined ? m[1] : undefined;
      return '';
    }
    return fence === undefined ? line : '';
  });
}

/** GitHub's anchor for a heading's text (github-slugger), repeats numbered. */
export function slugs(text: string): Set<string> {
  const seen = new Map<string, number>();
  const out = new Set<string>();
  for (const line of prose(text)) {
    const m = /^#{1,6}\s+(.*?)\s*#*\s*$/.exec(line);
    if (!m) continue;
    const plain = (m[1] ?? '').replace(/\[([^\]]*)\]\([^)]*\)/g, '$1').replace(/[`*]/g, '');
    const base = plain
      .toLowerCase()
      .replace(/[^\p{L}\p{M}\p{N}\p{Pc} -]/gu, '')
      .replace(/ /g, '-');
    const n = seen.get(base) ?? 0;
    seen.set(base, n + 1);
    out.add(n === 0 ? base : `${base}-${n}`);
  }
  return out;
}

/** The inline links of a markdown text, outside code (fenced blocks and `spans`). */
export function links(text: string): Array<{ line: number; target: string }> {
  const out: Array<{ line: number; target: string }> = [];
  prose(text).forEach((line, i) => {
    const bare = line.replace(/`[^`]*`/g, '');
    for (const m of bare.matchAll(/\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+"[^"]*")?\s*\)/g)) out.push({ line: i + 1, target: m[1] ?? '' });
  });
  return out;
}

const docs = readdirSync(join(ROOT, 'docs'))
  .filter((f) => f.endsWith('.md'))
  .map((f) => join(ROOT, 'docs', f));
const pages = [join(ROOT, 'README.md'), ...docs];

test('the slug and link helpers read markdown as GitHub does', (t) => {
  t.deepEqual(
    [
      ...slugs(
        "# Pods on many nodes: `routes: direct`\n## host-local's allocator\n```sh\n# not a heading\n```\n## The event loop (issue 32)\n## A\n## A\n",
      ),
    ],
    ['pods-on-many-nodes-routes-direct', 'host-locals-allocator', 'the-event-loop-issue-32', 'a', 'a-1'],
  );
  t.deepEqual(links('see [a](docs/a.md#x) and `[b](nope.md)`\n```\n[c](code.md)\n```\n[d](https://example.com) [e](#top)'), [
    { line: 1, target: 'docs/a.md#x' },
    { line: 5, target: 'https://example.com' },
    { line: 5, target: '#top' },
  ]);
});

test(`README.md is the front door: at most ${README_MAX_LINES} lines`, (t) => {
  const lines = readFileSync(join(ROOT, 'README.md'), 'utf8').split('\n').length - 1;
  t.true(lines <= README_MAX_LINES, `README.md has ${lines} lines: move detail into docs/ and link it`);
  t.log(`README.md: ${lines} lines`);
});

test('every relative link in README.md and docs/*.md names a file that exists, and a heading of it for #anchors', (t) => {
  const broken: string[] = [];
  let checked = 0;
  for (const page of pages) {
    for (const { line, target } of links(readFileSync(page, 'utf8'))) {
      if (/^[a-z][a-z0-9+.-]*:/i.test(target)) continue; // https:, mailto: ...
      checked++;
      const [path = '', anchor] = target.split('#', 2);
      const file = path === '' ? page : join(dirname(page), decodeURIComponent(path));
      const where = `${relative(ROOT, page)}:${line}: ${target}`;
      if (!existsSync(file)) {
        broken.push(`${where}: no such file`);
        continue;
      }
      if (anchor !== undefined && file.endsWith('.md') && !slugs(readFileSync(file, 'utf8')).has(decodeURIComponent(anchor))) {
        broken.push(`${where}: no heading with that anchor in ${relative(ROOT, file)}`);
      }
    }
  }
  t.deepEqual(broken, []);
  t.true(checked > 20, `checked ${checked} links`);
});

/** The repository paths a page names (`src/…`, `test/…`, `bench/…`, `hack/…`, `native/…`, `manifests/…`), outside fenced code. */
export function repoPaths(text: string): Array<{ line: number; path: string }> {
  const out: Array<{ line: number; path: string }> = [];
  prose(text).forEach((line, i) => {
    for (const m of line.matchAll(/(?<![\w./-])((?:src|test|bench|hack|native|manifests)\/[\w./-]*[\w/])/g)) {
      const path = m[1] ?? '';
      if (!path.includes('*')) out.push({ line: i + 1, path });
    }
  });
  return out;
}

test('every source path README.md and docs/*.md name exists (a moved file takes its mentions with it)', (t) => {
  t.deepEqual(repoPaths('see `src/pod/network.ts`, src/daemon/ and (test/kit/kcl.ts).\n```\nsrc/gone.ts\n```\nhttps://x/src/no'), [
    { line: 1, path: 'src/pod/network.ts' },
    { line: 1, path: 'src/daemon/' },
    { line: 1, path: 'test/kit/kcl.ts' },
  ]);
  const missing: string[] = [];
  let checked = 0;
  for (const page of pages) {
    for (const { line, path } of repoPaths(readFileSync(page, 'utf8'))) {
      checked++;
      if (!existsSync(join(ROOT, path))) missing.push(`${relative(ROOT, page)}:${line}: ${path}`);
    }
  }
  t.deepEqual(missing, []);
  t.true(checked > 50, `checked ${checked} paths`);
});
