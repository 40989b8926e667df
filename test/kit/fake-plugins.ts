/**
 * Fake CNI plugins for test/cni: small /bin/sh scripts in a temporary directory (a process
 * boundary), written from typed objects with JSON.stringify. A recording fake stores each
 * invocation's stdin and CNI_* environment, numbered in call order.
 */
import { chmod, mkdir, readdir, readFile, writeFile } from 'node:fs/promises';
import { join } from 'node:path';

/** A shell word that prints exactly `text` (single-quoted; quotes inside escaped). */
export function shQuote(text: string): string {
  return `'${text.replace(/'/g, `'\\''`)}'`;
}

export async function writeScript(dir: string, name: string, body: string): Promise<string> {
  const path = join(dir, name);
  await writeFile(path, `#!/bin/sh\n${body}\n`);
  await chmod(path, 0o755);
  return path;
}

/** A plugin that prints `out` (serialized if an object) and exits with `exitCode`; `stderr` goes to stderr. */
export function printing(out: unknown, exitCode = 0, stderr = ''): string {
  const text = typeof out === 'string' ? out : JSON.stringify(out);
  return [
    'cat >/dev/null',
    text === '' ? '' : `printf '%s\\n' ${shQuote(text)}`,
    stderr === '' ? '' : `printf '%s\\n' ${shQuote(stderr)} >&2`,
    `exit ${exitCode}`,
  ].join('\n');
}

/**
 * A plugin that records each call in `recDir` and answers ADD with `addResult`. It fails
 * (CNI error object, exit 1) for any command whose marker file `<recDir>/fail-<name>-<COMMAND>` exists.
 */
export function recording(recDir: string, name: string, addResult: unknown): string {
  const rec = shQuote(recDir);
  const err = JSON.stringify({ cniVersion: '1.0.0', code: 11, msg: `${name} told to fail` });
  return [
    `rec=${rec}`,
    'n=$(cat "$rec/seq" 2>/dev/null || echo 0); n=$((n+1)); echo "$n" > "$rec/seq"',
    `f="$rec/$(printf %03d "$n")-${name}-$CNI_COMMAND"`,
    'cat > "$f.stdin"',
    'env | grep -E "^(CNI_|PATH=|KCN_)" | sort > "$f.env"',
    `if [ -e "$rec/fail-${name}-$CNI_COMMAND" ]; then printf '%s\\n' ${shQuote(err)}; exit 1; fi`,
    `if [ "$CNI_COMMAND" = ADD ]; then printf '%s\\n' ${shQuote(JSON.stringify(addResult))}; fi`,
    'exit 0',
  ].join('\n');
}

export interface Call {
  seq: number;
  plugin: string;
  command: string;
  stdin: Record<string, unknown>;
  env: Record<string, string>;
}

/** The calls recorded so far, in order. */
export async function calls(recDir: string): Promise<Call[]> {
  await mkdir(recDir, { recursive: true });
  const files = (await readdir(recDir)).filter((f) => f.endsWith('.stdin')).sort();
  const out: Call[] = [];
  for (const f of files) {
    const m = /^(\d+)-(.+)-([A-Z]+)\.stdin$/.exec(f);
    if (!m) continue;
    const base = join(recDir, f.slice(0, -'.stdin'.length));
    const stdinText = await readFile(`${base}.stdin`, 'utf8');
    const envText = await readFile(`${base}.env`, 'utf8');
    const env: Record<string, string> = {};
    for (const line of envText.split('\n')) {
      const i = line.indexOf('=');
      if (i > 0) env[line.slice(0, i)] = line.slice(i + 1);
    }
    out.push({ seq: Number(m[1]), plugin: m[2] ?? '', command: m[3] ?? '', stdin: JSON.parse(stdinText) as Record<string, unknown>, env });
  }
  return out;
}
