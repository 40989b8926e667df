/**
 * Unshaped destinations: traffic between a shaped pod and the listed CIDRs (config `unshapedCIDRs`;
 * by default, with routes between nodes, the cluster's own pod CIDRs and Service ranges, followed
 * live: src/daemon/cluster/cluster-ranges.ts) runs at line rate, while
 * the pod's limits hold for everything else, in both directions. The cost is per node, not per pod
 * per CIDR: no pod gets an object for it.
 *
 * - FROM the pod: on the shared ifb, ahead of the pods' classification (prio 8..11), one u32
 *   filter per CIDR matching the destination (prio 4 IPv4, prio 5 IPv6) with `flowid 1:`, the htb
 *   root's own handle: htb sends such a packet straight out through its direct queue, unshaped.
 * - TO the pod: every shaped pod's veth root is htb 2: (tc-layout.ts VETH), and htb sends a packet
 *   whose skb priority is its own handle, 2:0, straight out the same way, before any filter. A
 *   mangle chain `KUBENET-UNSHAPED`, jumped to from POSTROUTING for packets leaving through the
 *   bridge (routed to it, or bridged through it: br_netfilter), sets that priority for each source
 *   CIDR (`CLASSIFY --set-class 2:0`; iptables for IPv4, ip6tables for IPv6). A pod cannot set it on
 *   its own traffic to escape its limits: the kernel resets a packet's priority when it crosses a
 *   veth pair.
 *
 * Both parts are replaced as a whole at the shaper's start and by each change of the set
 * (Shaper.setUnshaped), so a CIDR dropped from the list stops being unshaped then. The set is kept
 * in the fewest CIDRs that hold exactly its addresses (mergeCidrs): every packet from a shaped pod
 * passes one filter per CIDR.
 */
import { execa } from 'execa';
import { Address4, Address6 } from 'ip-address';
import { ToolError } from '../errors.js';
import type { Logger } from '../log.js';
import { parseCidr, type Subnet } from '../net/ip.js';
import { VETH } from './tc-layout.js';
import type { BatchOptions, BatchResult } from './tc-exec.js';
import type { Removal } from '../util/removal.js';
import { chainRules, deleteChain, deleteRule, ruleText } from '../util/xtables-rules.js';

/** The destinations, and the bridge the pods' veths are ports of. */
export interface Unshaped {
  subnets: Subnet[];
  /** Undefined: only the ifb's filters are made (traffic to the pods stays shaped; benches). */
  bridge?: string;
}

export const UNSHAPED_CHAIN = 'KUBENET-UNSHAPED';
/** The ifb filter priorities of the unshaped destinations, by family (ahead of the pods' 8..11). */
export const UNSHAPED_PRIO = { 4: 4, 6: 5 } as const;

/** The CIDRs, checked and normalized ("10.1.2.3/8" -> "10.0.0.0/8"), duplicates removed. */
export function parseUnshaped(cidrs: string[]): Subnet[] {
  const out = new Map<string, Subnet>();
  for (const c of cidrs) {
    const s = parseCidr(c);
    out.set(s.cidr, s);
  }
  return [...out.values()];
}

/**
 * The same addresses in the fewest CIDRs (pure): a CIDR inside another is dropped, two halves of
 * one CIDR become it ("10.244.0.0/24" + "10.244.1.0/24" -> "10.244.0.0/23"), repeatedly; never an
 * address more. IPv4 first, then IPv6, each ascending. A cluster's pod CIDRs, allocated from one
 * range, fold into a few.
 */
export function mergeCidrs(subnets: Subnet[]): Subnet[] {
  const out: Subnet[] = [];
  for (const family of [4, 6] as const) {
    const bits = family === 4 ? 32 : 128;
    const blocks = subnets
      .filter((s) => s.family === family)
      .map((s) => ({ start: (family === 4 ? new Address4(s.network) : new Address6(s.network)).bigInt(), len: s.prefixLen }))
      .sort((a, b) => (a.start < b.start ? -1 : a.start > b.start ? 1 : a.len - b.len));
    const size = (len: number) => 1n << BigInt(bits - len);
    const kept: Array<{ start: bigint; len: number }> = [];
    for (const b of blocks) {
      const last = kept[kept.length - 1];
      if (last && b.start < last.start + size(last.len)) continue; // inside the last one (sorted: never partly)
      kept.push(b);
      // Join the two last while they are the halves of one block.
      for (;;) {
        const [x, y] = [kept[kept.length - 2], kept[kept.length - 1]];
        if (!x || !y || x.len !== y.len || x.len === 0 || x.start % size(x.len - 1) !== 0n || y.start !== x.start + size(x.len)) break;
        kept.splice(-2, 2, { start: x.start, len: x.len - 1 });
      }
    }
    for (const k of kept) {
      const network = (family === 4 ? Address4.fromBigInt(k.start) : Address6.fromBigInt(k.start)).correctForm();
      out.push({ family, network, prefixLen: k.len, cidr: `${network}/${k.len}` });
    }
  }
  return out;
}

/**
 * The ifb's unshaped filters: both priorities removed (a missing one fails, harmlessly: run with
 * force) and made again from the list (pure).
 */
export function unshapedIfbLines(ifb: string, subnets: Subnet[]): string[] {
  const lines = [
    `filter del dev ${ifb} parent 1: prio ${UNSHAPED_PRIO[4]} protocol ip`,
    `filter del dev ${ifb} parent 1: prio ${UNSHAPED_PRIO[6]} protocol ipv6`,
  ];
  for (const s of subnets) {
    const [proto, match] = s.family === 4 ? ['ip', 'ip dst'] : ['ipv6', 'ip6 dst'];
    lines.push(`filter add dev ${ifb} parent 1: prio ${UNSHAPED_PRIO[s.family]} protocol ${proto} u32 match ${match} ${s.cidr} flowid 1:`);
  }
  return lines;
}

/** The chain's rules for one family, as `iptables -S CHAIN` lists them (pure). */
export function unshapedRules(subnets: Subnet[], family: 4 | 6): string[][] {
  const [major] = VETH.root.split(':');
  const cls = `${(major ?? '2').padStart(4, '0')}:0000`;
  return subnets.filter((s) => s.family === family).map((s) => ['-s', s.cidr, '-j', 'CLASSIFY', '--set-class', cls]);
}

/** The POSTROUTING rule that sends packets leaving through the bridge to the chain. */
export function unshapedJump(bridge: string): string[] {
  return ['-o', bridge, '-m', 'comment', '--comment', 'kubenet-ts: unshaped sources of shaped pods', '-j', UNSHAPED_CHAIN];
}

type Tool = 'iptables' | 'ip6tables';

async function xt(tool: Tool, args: string[], ok: number[] = [0]): Promise<{ exitCode: number; stdout: string }> {
  const full = ['-w', '5', '-t', 'mangle', ...args];
  const r = await execa(tool, full, { reject: false });
  if (r.exitCode === undefined || !ok.includes(r.exitCode)) {
    throw new ToolError(tool, full, r.exitCode, r.exitCode === undefined ? `cannot run ${tool}: ${String(r.message)}` : r.stderr);
  }
  return { exitCode: r.exitCode, stdout: r.stdout };
}

/** What `iptables-restore --noflush` takes to make the chain hold exactly `rules` (pure). */
export function unshapedRestoreText(rules: string[][]): string {
  return ['*mangle', `:${UNSHAPED_CHAIN} - [0:0]`, ...rules.map((r) => [`-A ${UNSHAPED_CHAIN}`, ...r].join(' ')), 'COMMIT', ''].join('\n');
}

async function xtRestore(tool: Tool, input: string): Promise<void> {
  const args = ['-w', '5', '--noflush'];
  const r = await execa(`${tool}-restore`, args, { input, reject: false });
  if (r.exitCode !== 0)
    throw new ToolError(
      `${tool}-restore`,
      args,
      r.exitCode,
      r.exitCode === undefined ? `cannot run ${tool}-restore: ${String(r.message)}` : r.stderr,
    );
}

/**
 * Makes the node's mangle table hold exactly the unshaped rules for the bridge and subnets, per
 * family: the chain rewritten only when it differs, one jump from POSTROUTING; none of them for a
 * family without subnets. Returns whether anything changed. A family that has no subnets and whose
 * rules cannot be listed (no tool, no mangle table) is left alone.
 */
export async function syncUnshapedRules(bridge: string, subnets: Subnet[], log: Logger): Promise<boolean> {
  let changed = false;
  for (const [family, tool] of [
    [4, 'iptables'],
    [6, 'ip6tables'],
  ] as const) {
    const want = unshapedRules(subnets, family);
    let have: string[] | undefined;
    try {
      const r = await xt(tool, ['-S', UNSHAPED_CHAIN], [0, 1]);
      have = r.exitCode === 0 ? r.stdout.split('\n').filter((l) => l.startsWith('-A ')) : undefined;
    } catch (err) {
      // Nothing wanted and nothing listable (no tool, no such table): nothing to remove either.
      if (want.length === 0) continue;
      throw err;
    }
    const jump = unshapedJump(bridge);
    if (want.length === 0) {
      if (have === undefined) continue;
      while ((await xt(tool, ['-D', 'POSTROUTING', ...jump], [0, 1, 2])).exitCode === 0);
      await xt(tool, ['-F', UNSHAPED_CHAIN]);
      await xt(tool, ['-X', UNSHAPED_CHAIN], [0, 1]);
      log.info({ family }, 'removed the unshaped-destination rules');
      changed = true;
      continue;
    }
    const wantText = want.map((r) => [`-A ${UNSHAPED_CHAIN}`, ...r].join(' '));
    if (have === undefined || have.join('\n') !== wantText.join('\n')) {
      // One restore: the chain made, or replaced whole (declaring a chain flushes it), never half written.
      await xtRestore(tool, unshapedRestoreText(want));
      changed = true;
    }
    if ((await xt(tool, ['-C', 'POSTROUTING', ...jump], [0, 1])).exitCode !== 0) {
      await xt(tool, ['-A', 'POSTROUTING', ...jump]);
      changed = true;
    }
    if (changed)
      log.info(
        { family, bridge, cidrs: subnets.filter((s) => s.family === family).map((s) => s.cidr) },
        'unshaped-destination rules in place',
      );
  }
  return changed;
}

/** Both parts made as configured, the ifb part on every egress shard (the shaper's init; `tc` runs lines through its session). */
export async function ensureUnshaped(
  tc: (lines: string[], o: BatchOptions) => Promise<BatchResult>,
  ifbs: readonly string[],
  u: Unshaped,
  log: Logger,
): Promise<void> {
  // Each ifb's two deletes (its first two lines) fail when there was nothing to delete; a failed add throws.
  const lines: string[] = [];
  const optional = new Set<number>();
  for (const ifb of ifbs) {
    optional.add(lines.length + 1).add(lines.length + 2);
    lines.push(...unshapedIfbLines(ifb, u.subnets));
  }
  await tc(lines, { optional });
  if (u.bridge !== undefined) await syncUnshapedRules(u.bridge, u.subnets, log);
}

/**
 * Removes the mangle chain and every jump to it from POSTROUTING (whatever bridge a jump names), per
 * family (`kubenet uninstall`); rules of other chains are never touched.
 */
export async function removeUnshapedRules(r: Removal): Promise<void> {
  for (const tool of ['iptables', 'ip6tables'] as const) {
    const jumps = ((await chainRules(tool, 'mangle', 'POSTROUTING')) ?? []).filter((rule) => jumpsTo(rule, UNSHAPED_CHAIN));
    for (const rule of jumps)
      await r.remove(`${tool} mangle POSTROUTING rule ${ruleText(rule)}`, () => deleteRule(tool, 'mangle', 'POSTROUTING', rule));
    if ((await chainRules(tool, 'mangle', UNSHAPED_CHAIN)) !== undefined)
      await r.remove(`${tool} mangle chain ${UNSHAPED_CHAIN}`, () => deleteChain(tool, 'mangle', UNSHAPED_CHAIN));
  }
}

/** Whether a rule's words end in `-j CHAIN` (pure). */
function jumpsTo(rule: string[], chain: string): boolean {
  const j = rule.lastIndexOf('-j');
  return j >= 0 && rule[j + 1] === chain;
}
