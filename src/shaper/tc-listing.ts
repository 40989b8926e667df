/**
 * What init reads back from an ifb: one `tc qdisc/class/filter show` listing parsed into the shared
 * structure's parts and the pod classes and filters found (pure; tc.ts decides what to rebuild or
 * sweep). Exact-output tests: test/shaper/tc-layout.test.ts.
 */
import type { FilterRef } from './tc-layout.js';

/** What init learned from its one listing of the ifb. */
export interface IfbListing {
  htbRoot: boolean;
  /** The htb root's default class minor (0: unclassified frames pass unshaped, the flat layout). */
  defaultClass: number;
  tables: Set<string>;
  links: Set<string>;
  classes: Set<number>;
  podFilters: Array<FilterRef & { flowid: number }>;
}

export function parseIfbListing(text: string): IfbListing {
  const out: IfbListing = { htbRoot: false, defaultClass: 0, tables: new Set(), links: new Set(), classes: new Set(), podFilters: [] };
  for (const line of text.split('\n')) {
    let m = /^qdisc htb 1: root .*default (?:0x)?([0-9a-f]+)/.exec(line);
    if (m?.[1]) {
      out.htbRoot = true;
      out.defaultClass = parseInt(m[1], 16);
    } else if (/^qdisc htb 1: root/.test(line)) out.htbRoot = true;
    m = /^class htb 1:([0-9a-f]+) /.exec(line);
    if (m?.[1]) out.classes.add(parseInt(m[1], 16));
    m = /^filter protocol (\S+) pref (\d+) u32 .*fh (1[0-3]): ht divisor 256/.exec(line);
    if (m?.[3]) out.tables.add(m[3]);
    m = /^filter protocol (\S+) pref (\d+) u32 .*fh [0-9a-f]+::[0-9a-f]+ .* link (1[0-3]):/.exec(line);
    if (m?.[3]) out.links.add(m[3]);
    m = /^filter protocol (\S+) pref (\d+) u32 .*fh (1[0-3]:[0-9a-f]+:[0-9a-f]+) .*flowid 1:([0-9a-f]+)/.exec(line);
    if (m?.[1] && m[2] && m[3] && m[4]) out.podFilters.push({ proto: m[1], prio: Number(m[2]), handle: m[3], flowid: parseInt(m[4], 16) });
  }
  return out;
}
