/**
 * Rules of iptables / ip6tables as `-S` lists them, for removing exactly the ones a caller made:
 * each is deleted by its full specification (`-D CHAIN <the rule as listed>`), never by its
 * position, so a rule another program inserts meanwhile is never the one deleted.
 */
import { execa } from 'execa';
import { ToolError } from '../errors.js';

export type XtTool = 'iptables' | 'ip6tables';

/** The words of one `-S` line as the tool would take them back (double quotes and backslash escapes undone; pure). */
export function splitRule(line: string): string[] {
  const out: string[] = [];
  let cur: string | undefined;
  let quoted = false;
  for (let i = 0; i < line.length; i++) {
    const c = line[i] ?? '';
    if (c === '\\' && i + 1 < line.length) {
      cur = (cur ?? '') + (line[++i] ?? '');
    } else if (c === '"') {
      quoted = !quoted;
      cur ??= '';
    } else if (c === ' ' && !quoted) {
      if (cur !== undefined) out.push(cur);
      cur = undefined;
    } else {
      cur = (cur ?? '') + c;
    }
  }
  if (cur !== undefined) out.push(cur);
  return out;
}

/** A rule's words as `-S` shows them: a word with a space or a quote in double quotes (pure). */
export function ruleText(rule: string[]): string {
  return rule.map((w) => (/[\s"]/.test(w) || w === '' ? `"${w.replace(/(["\\])/g, '\\$1')}"` : w)).join(' ');
}

async function run(tool: XtTool, args: string[], ok: number[]): Promise<{ exitCode: number; stdout: string } | undefined> {
  const full = ['-w', '5', ...args];
  const r = await execa(tool, full, { reject: false });
  if (r.exitCode === undefined) return undefined; // no such tool: no rule of it either
  if (!ok.includes(r.exitCode)) throw new ToolError(tool, full, r.exitCode, r.stderr);
  return { exitCode: r.exitCode, stdout: r.stdout };
}

/**
 * The rules of `chain` in `table`, each as its words after `-A CHAIN`; undefined when the tool,
 * the table or the chain is not there.
 */
export async function chainRules(tool: XtTool, table: string, chain: string): Promise<string[][] | undefined> {
  const r = await run(tool, ['-t', table, '-S', chain], [0, 1, 2, 3]);
  if (r?.exitCode !== 0) return undefined;
  const prefix = `-A ${chain} `;
  return r.stdout
    .split('\n')
    .filter((l) => l.startsWith(prefix))
    .map((l) => splitRule(l.slice(prefix.length)));
}

/** Deletes one rule of `chain` by its specification; a rule already gone is success. */
export async function deleteRule(tool: XtTool, table: string, chain: string, rule: string[]): Promise<void> {
  await run(tool, ['-t', table, '-D', chain, ...rule], [0, 1, 2]);
}

/** Flushes and deletes a user chain (its jumps must be gone); a chain already gone is success. */
export async function deleteChain(tool: XtTool, table: string, chain: string): Promise<void> {
  await run(tool, ['-t', table, '-F', chain], [0, 1]);
  await run(tool, ['-t', table, '-X', chain], [0, 1]);
}
