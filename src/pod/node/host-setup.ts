import { execa } from 'execa';
import { readFile, writeFile } from 'node:fs/promises';
import { KubenetError, ToolError } from '../../errors.js';
import { familyOf } from '../../net/ip.js';
import type { Logger } from '../../log.js';
import type { Removal } from '../../util/removal.js';
import { chainRules, deleteRule, ruleText } from '../../util/xtables-rules.js';

export const MASQUERADE_COMMENT = 'kubenet-ts: SNAT for outbound traffic from cluster';

/** The nat POSTROUTING rule kubenet keeps itself (the bridge config has ipMasq: false). */
export function masqueradeRule(nonMasqueradeCIDR: string): string[] {
  return [
    '-m',
    'comment',
    '--comment',
    MASQUERADE_COMMENT,
    '-m',
    'addrtype',
    '!',
    '--dst-type',
    'LOCAL',
    '!',
    '-d',
    nonMasqueradeCIDR,
    '-j',
    'MASQUERADE',
  ];
}

/**
 * Ensures the masquerade rule exists exactly once (check, then append). Skipped for 0.0.0.0/0,
 * where nothing leaves the non-masquerade range. Returns whether a rule was added.
 */
export async function ensureMasquerade(nonMasqueradeCIDR: string, log: Logger): Promise<boolean> {
  if (nonMasqueradeCIDR === '0.0.0.0/0') {
    log.info('nonMasqueradeCIDR is 0.0.0.0/0: no masquerade rule');
    return false;
  }
  const rule = masqueradeRule(nonMasqueradeCIDR);
  const checkArgs = ['-w', '5', '-t', 'nat', '-C', 'POSTROUTING', ...rule];
  const check = await execa('iptables', checkArgs, { reject: false });
  if (check.exitCode === 0) return false;
  // Exit 1 means "no such rule"; anything else (2: bad table/target, 4: resource problem) is a real failure.
  if (check.exitCode !== 1) {
    throw new ToolError('iptables', checkArgs, check.exitCode, check.stderr);
  }
  const addArgs = ['-w', '5', '-t', 'nat', '-A', 'POSTROUTING', ...rule];
  const add = await execa('iptables', addArgs, { reject: false });
  if (add.exitCode !== 0) {
    throw new ToolError('iptables', addArgs, add.exitCode, add.stderr);
  }
  log.info({ nonMasqueradeCIDR }, 'added masquerade rule to nat POSTROUTING');
  return true;
}

/** Deletes every copy of the masquerade rule for this CIDR (dhcp mode, tests). Missing = success. */
export async function removeMasquerade(nonMasqueradeCIDR: string): Promise<void> {
  const rule = masqueradeRule(nonMasqueradeCIDR);
  for (;;) {
    const del = await execa('iptables', ['-w', '5', '-t', 'nat', '-D', 'POSTROUTING', ...rule], { reject: false });
    if (del.exitCode !== 0) return;
  }
}

/**
 * Removes every nat POSTROUTING rule carrying the masquerade rule's comment, whatever
 * nonMasqueradeCIDR it was made with (`kubenet uninstall`); other rules are never touched.
 */
export async function removeMasqueradeRules(r: Removal): Promise<void> {
  const ours = ((await chainRules('iptables', 'nat', 'POSTROUTING')) ?? []).filter((rule) => rule.includes(MASQUERADE_COMMENT));
  for (const rule of ours)
    await r.remove(`iptables nat POSTROUTING rule ${ruleText(rule)}`, () => deleteRule('iptables', 'nat', 'POSTROUTING', rule));
}

/**
 * Makes bridged traffic visible to iptables (br_netfilter, net.bridge.bridge-nf-call-iptables=1),
 * best effort as kubenet did: a node without the module still networks pods, just without
 * iptables rules seeing bridged packets. Returns whether the sysctl is 1 afterwards.
 */
export async function ensureBridgeNetfilter(log: Logger): Promise<boolean> {
  const sysctl = '/proc/sys/net/bridge/bridge-nf-call-iptables';
  const read = () =>
    readFile(sysctl, 'utf8').then(
      (v) => v.trim(),
      () => undefined,
    );
  if ((await read()) === undefined) {
    const mod = await execa('modprobe', ['br_netfilter'], { reject: false });
    if (mod.exitCode !== 0) log.warn({ stderr: mod.stderr.trim() }, 'modprobe br_netfilter failed');
  }
  const current = await read();
  if (current === undefined) {
    log.warn('br_netfilter is not available: bridged traffic bypasses iptables');
    return false;
  }
  if (current !== '1') {
    try {
      await writeFile(sysctl, '1');
    } catch (err) {
      log.warn({ err }, 'could not set net.bridge.bridge-nf-call-iptables=1');
      return false;
    }
  }
  return true;
}

/**
 * Checks that the reference portmap plugin's DNAT rules for a pod are in place: for each mapping
 * and each pod address (iptables for IPv4, ip6tables for IPv6), a nat rule sending the host port
 * to the pod's address and container port. Throws KubenetError naming what is missing.
 */
export async function checkHostPorts(
  podIps: string[],
  mappings: Array<{ hostPort: number; containerPort: number; protocol: string }>,
): Promise<void> {
  const missing: string[] = [];
  for (const family of [4, 6] as const) {
    const ips = podIps.filter((ip) => familyOf(ip) === family);
    if (ips.length === 0) continue;
    const tool = family === 4 ? 'iptables' : 'ip6tables';
    const args = ['-w', '5', '-t', 'nat', '-S'];
    const r = await execa(tool, args, { reject: false });
    if (r.exitCode !== 0) throw new ToolError(tool, args, r.exitCode, r.stderr);
    const rules = r.stdout.split('\n');
    for (const ip of ips) {
      for (const m of mappings) {
        const to = family === 4 ? `${ip}:${m.containerPort}` : `[${ip}]:${m.containerPort}`;
        const found = rules.some(
          (l) => l.includes(`-p ${m.protocol}`) && l.includes(`--dport ${m.hostPort}`) && l.includes(`--to-destination ${to}`),
        );
        if (!found) missing.push(`${m.hostPort}/${m.protocol} -> ${to}`);
      }
    }
  }
  if (missing.length > 0) throw new KubenetError(`host port DNAT rule(s) missing: ${missing.join(', ')}`);
}

/**
 * The host-port rules the reference portmap plugin holds in `networkName`, per container ID, with
 * the pod addresses they forward to. portmap tags each entry of its shared nat chain
 * CNI-HOSTPORT-DNAT with the comment `dnat name: "<network>" id: "<container ID>"` and jumps to the
 * container's own chain, whose DNAT rules name the pod address (IPv4 and IPv6 tables). A table or
 * chain that does not exist holds none.
 */
export async function hostPortRules(networkName: string): Promise<Map<string, string[]>> {
  const out = new Map<string, string[]>();
  const entry = /^-A CNI-HOSTPORT-DNAT .*--comment "?dnat name: \\?"([^"\\]+)\\?" id: \\?"([^"\\]+)\\?""? .*-j (\S+)/;
  const dnat = /^-A (\S+) .*-j DNAT --to-destination \[?([0-9a-fA-F.:]+?)\]?:\d+$/;
  for (const tool of ['iptables', 'ip6tables']) {
    const r = await execa(tool, ['-w', '5', '-t', 'nat', '-S'], { reject: false });
    if (r.exitCode !== 0) continue; // no nat table for this family: no host ports there
    const lines = r.stdout.split('\n');
    const chainOwner = new Map<string, string>();
    for (const line of lines) {
      const m = entry.exec(line);
      if (m?.[1] === networkName && m[2] && m[3]) {
        chainOwner.set(m[3], m[2]);
        if (!out.has(m[2])) out.set(m[2], []);
      }
    }
    for (const line of lines) {
      const m = dnat.exec(line);
      const owner = m?.[1] ? chainOwner.get(m[1]) : undefined;
      if (owner && m?.[2]) out.get(owner)?.push(m[2]);
    }
  }
  return out;
}
