/**
 * kubenet's promiscuous-bridge dedup, over ebtables (Debian's `ebtables`, the nf_tables backend).
 *
 * A promiscuous bridge hands the host a copy of every frame it bridges; with br_netfilter the host
 * routes such a copy of a pod-to-pod packet back out of the bridge, with the bridge's MAC as source,
 * and the destination pod gets the packet twice (ping shows "DUP!"). As kubelet's kubenet did, a
 * chain `KUBE-DEDUP`, jumped to from the filter table's OUTPUT, drops frames the host sends to pod
 * veths with the bridge's MAC and a source address in the pod CIDR other than the gateway's, per
 * family:
 *
 * ```
 * -A OUTPUT -j KUBE-DEDUP
 * -A KUBE-DEDUP -p IPv4 -s <bridge MAC> -o veth+ --ip-src <gateway> -j ACCEPT
 * -A KUBE-DEDUP -p IPv4 -s <bridge MAC> -o veth+ --ip-src <pod CIDR> -j DROP
 * (and -p IPv6 ... --ip6-src for an IPv6 pod CIDR)
 * ```
 *
 * `syncDedup` makes the node hold exactly these rules (the chain is rewritten only when it differs,
 * one jump from OUTPUT), or none of them (`undefined`: other hairpin modes, no bridge yet).
 */
import { execa } from 'execa';
import { readFileSync } from 'node:fs';
import { ToolError } from '../../errors.js';
import type { Logger } from '../../log.js';
import { firstHost, type Subnet } from '../../net/ip.js';
import type { Removal } from '../../util/removal.js';

export const DEDUP_CHAIN = 'KUBE-DEDUP';
const TABLE = ['-t', 'filter'];

export interface DedupTarget {
  /** The bridge's MAC address, lower case with two digits per byte. */
  bridgeMac: string;
  subnets: Subnet[];
}

/** The chain's rules for the target, as `ebtables -L --Lmac2` lists them (pure). */
export function dedupRules(t: DedupTarget): string[][] {
  return t.subnets.flatMap((sub) => {
    const common = ['-p', sub.family === 4 ? 'IPv4' : 'IPv6', '-s', t.bridgeMac, '-o', 'veth+'];
    const src = sub.family === 4 ? '--ip-src' : '--ip6-src';
    return [
      [...common, src, firstHost(sub), '-j', 'ACCEPT'],
      [...common, src, sub.cidr, '-j', 'DROP'],
    ];
  });
}

/** The bridge's MAC (from sysfs of this process's network namespace), or undefined when there is no bridge. */
export function bridgeMac(bridgeName: string): string | undefined {
  try {
    return readFileSync(`/sys/class/net/${bridgeName}/address`, 'utf8').trim().toLowerCase();
  } catch {
    return undefined;
  }
}

async function ebtables(args: string[], okCodes: number[] = [0]): Promise<{ exitCode: number; stdout: string }> {
  const r = await execa('ebtables', [...TABLE, ...args], { reject: false });
  if (r.exitCode === undefined || !okCodes.includes(r.exitCode)) {
    throw new ToolError(
      'ebtables',
      [...TABLE, ...args],
      r.exitCode,
      r.exitCode === undefined ? `cannot run ebtables: ${String(r.message)}` : r.stderr,
    );
  }
  return { exitCode: r.exitCode, stdout: r.stdout };
}

/** The rules of a chain, one line each; undefined when the chain does not exist (ebtables exits 1). */
async function listChain(chain: string): Promise<string[] | undefined> {
  const r = await ebtables(['-L', chain, '--Lmac2'], [0, 1]);
  if (r.exitCode !== 0) return undefined;
  return r.stdout
    .split('\n')
    .map((l) => l.trim().replace(/\s+/g, ' '))
    .filter((l) => l.startsWith('-'));
}

/**
 * Makes the node hold exactly the dedup rules for `target`, or none when it is undefined.
 * Idempotent; returns whether anything changed. Without the ebtables tool, removing is a no-op.
 */
export async function syncDedup(target: DedupTarget | undefined, log: Logger): Promise<boolean> {
  if (!target) {
    let chain: string[] | undefined;
    try {
      chain = await listChain(DEDUP_CHAIN);
    } catch (err) {
      if (err instanceof ToolError && err.exitCode === undefined) return false; // no ebtables: no rules either
      throw err;
    }
    if (chain === undefined) return false;
    await removeJumps(0);
    await ebtables(['-F', DEDUP_CHAIN]);
    await ebtables(['-X', DEDUP_CHAIN]);
    log.info({ chain: DEDUP_CHAIN }, 'removed the promiscuous-bridge dedup rules');
    return true;
  }
  let changed = false;
  const want = dedupRules(target);
  const have = await listChain(DEDUP_CHAIN);
  if (have === undefined) {
    await ebtables(['-N', DEDUP_CHAIN, '-P', 'RETURN']);
    changed = true;
  }
  if (have === undefined || have.join('\n') !== want.map((r) => r.join(' ')).join('\n')) {
    if (have !== undefined && have.length > 0) await ebtables(['-F', DEDUP_CHAIN]);
    for (const rule of want) await ebtables(['-A', DEDUP_CHAIN, ...rule]);
    changed = true;
  }
  if (await removeJumps(1)) changed = true;
  if (changed)
    log.info(
      { chain: DEDUP_CHAIN, bridgeMac: target.bridgeMac, podCIDR: target.subnets.map((s) => s.cidr).join(',') },
      'promiscuous-bridge dedup rules in place',
    );
  return changed;
}

/** Leaves exactly `keep` (0 or 1) jumps from OUTPUT to the chain; returns whether it changed any. */
async function removeJumps(keep: 0 | 1): Promise<boolean> {
  const output = (await listChain('OUTPUT')) ?? [];
  const jumps = output.filter((l) => l === `-j ${DEDUP_CHAIN}`).length;
  for (let i = jumps; i > keep; i--) await ebtables(['-D', 'OUTPUT', '-j', DEDUP_CHAIN]);
  if (jumps < keep) await ebtables(['-A', 'OUTPUT', '-j', DEDUP_CHAIN]);
  return jumps !== keep;
}

/** Removes the chain and its jump from OUTPUT when the node holds them (`kubenet uninstall`); no ebtables: nothing to remove. */
export async function removeDedupRules(r: Removal, log: Logger): Promise<void> {
  let chain: string[] | undefined;
  try {
    chain = await listChain(DEDUP_CHAIN);
  } catch (err) {
    if (err instanceof ToolError && err.exitCode === undefined) return;
    throw err;
  }
  if (chain !== undefined) await r.remove(`ebtables filter chain ${DEDUP_CHAIN} and its jump from OUTPUT`, () => syncDedup(undefined, log));
}
