/**
 * The iptables backend of the host, for the agent's image: iptables, ip6tables and ebtables exist in
 * two backends (legacy: the x_tables kernel API; nft: nf_tables through the same commands), and
 * rules written through one are invisible to the other. A node agent must write through the one the
 * node's other components (kubelet, kube-proxy, the runtime) use, or its masquerade and host-port
 * rules are never reached. The image holds both multi-call binaries; at start (env
 * KUBENET_XTABLES_LINKS names the directory of its `iptables`, `ip6tables`, `ebtables` links) the
 * agent looks at the node's rules and points the links at the backend in use, as Kubernetes'
 * iptables-wrappers do:
 *   1. the backend holding kubelet's KUBE-IPTABLES-HINT or KUBE-KUBELET-CANARY chain (mangle);
 *   2. else the one with more rules (iptables-save and ip6tables-save of each, `-A` lines);
 *   3. else (a node with no rules yet) nft, Debian's and most current distributions' default.
 * Outside the image (no env) nothing changes: the host's own commands are used as they are.
 */
import { execa } from 'execa';
import { readlink, rename, symlink, unlink } from 'node:fs/promises';
import { join } from 'node:path';
import type { Logger } from 'pino';
import { fsError } from '../../util/fs-error.js';

export type XtablesBackend = 'legacy' | 'nft';

/** What one backend shows of the node's rules. */
export interface BackendRules {
  /** `-A` lines of iptables-save and ip6tables-save. */
  rules: number;
  /** Whether kubelet's hint or canary chain is there. */
  kubeletHint: boolean;
}

const MULTI: Record<XtablesBackend, string> = { legacy: 'xtables-legacy-multi', nft: 'xtables-nft-multi' };
/** The links pointed at the chosen backend's multi-call binary; `legacyProgram` where legacy has a program of its own. */
const LINKS: Array<{ link: string; legacyProgram?: string }> = [
  ...['iptables', 'iptables-save', 'iptables-restore', 'ip6tables', 'ip6tables-save', 'ip6tables-restore'].map((link) => ({ link })),
  // ebtables (the agent runs `ebtables -L/-N/-A/-D/-F/-X` only): Debian's legacy ebtables is a
  // program of its own; nft's lives in the multi binary.
  { link: 'ebtables', legacyProgram: 'ebtables-legacy' },
];

const HINT = /^:(KUBE-IPTABLES-HINT|KUBE-KUBELET-CANARY) /m;

/** Counts what an iptables-save / ip6tables-save output says (pure). */
export function countRules(saveOutputs: string[]): BackendRules {
  let rules = 0;
  let kubeletHint = false;
  for (const out of saveOutputs) {
    for (const line of out.split('\n')) if (line.startsWith('-A ')) rules++;
    if (HINT.test(out)) kubeletHint = true;
  }
  return { rules, kubeletHint };
}

/** The backend the node uses (pure): kubelet's hint first, then the one with more rules, else nft. */
export function pickBackend(legacy: BackendRules, nft: BackendRules): { backend: XtablesBackend; why: string } {
  if (legacy.kubeletHint !== nft.kubeletHint) {
    const backend = legacy.kubeletHint ? 'legacy' : 'nft';
    return { backend, why: `kubelet's KUBE-IPTABLES-HINT/KUBE-KUBELET-CANARY chain is in the ${backend} tables` };
  }
  if (legacy.rules > nft.rules) return { backend: 'legacy', why: `${legacy.rules} legacy rules against ${nft.rules} nft rules` };
  if (nft.rules > 0) return { backend: 'nft', why: `${nft.rules} nft rules against ${legacy.rules} legacy rules` };
  return { backend: 'nft', why: 'no rules in either backend yet: nft, the default' };
}

/** iptables-save and ip6tables-save of one backend, through its multi-call binary in `dir`. */
async function saveOutputs(dir: string, backend: XtablesBackend): Promise<string[]> {
  const bin = join(dir, MULTI[backend]);
  const outs: string[] = [];
  for (const cmd of ['iptables-save', 'ip6tables-save']) {
    // A missing kernel module or table is no rule of that backend: its output is what there is.
    const r = await execa(bin, [cmd], { reject: false, timeout: 10_000 });
    outs.push(r.stdout ?? '');
  }
  return outs;
}

/**
 * Looks at the node's rules and points every link of `dir` at the backend in use (atomically, a
 * link at a time; links already right are left alone). Returns the choice and why.
 */
export async function selectXtablesBackend(dir: string, log: Logger): Promise<{ backend: XtablesBackend; why: string }> {
  const [legacy, nft] = await Promise.all([saveOutputs(dir, 'legacy'), saveOutputs(dir, 'nft')]);
  const choice = pickBackend(countRules(legacy), countRules(nft));
  let changed = 0;
  for (const l of LINKS) {
    const target = (choice.backend === 'legacy' && l.legacyProgram) || MULTI[choice.backend];
    const path = join(dir, l.link);
    if ((await readlink(path).catch(() => undefined)) === target) continue;
    const tmp = `${path}.kubenet-${process.pid}`;
    await unlink(tmp).catch(() => undefined);
    try {
      await symlink(target, tmp);
      await rename(tmp, path);
    } catch (err) {
      await unlink(tmp).catch(() => undefined);
      throw fsError(err, 'replace', 'the iptables link', path);
    }
    changed++;
  }
  log.info({ backend: choice.backend, why: choice.why, linksChanged: changed }, 'iptables backend of this node');
  return choice;
}
