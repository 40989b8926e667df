/**
 * Helpers for tests that touch the real kernel: unique names, network namespaces the test owns,
 * and cleanup that runs even when the test fails. Nothing here sends traffic anywhere.
 */
import { execa } from 'execa';
import { randomBytes } from 'node:crypto';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { ingressShardOf, shardOf } from '../../src/shaper/shard-names.js';
import { ifbLinkNames } from './shards.js';
import { REF_PLUGINS_DIR, upstreamBlocker } from './upstream.js';

export const isRoot = process.getuid?.() === 0;

/** Where tests and benches find the reference CNI plugins: the pinned release hack/build-upstream.sh built. */
export const CNI_BIN_DIRS = [REF_PLUGINS_DIR];

/** Why kernel tests cannot run here, or undefined when they can. */
export function kernelTestBlocker(): string | undefined {
  if (!isRoot) return 'needs root (network namespaces, bridges, veths)';
  return upstreamBlocker('cni-plugins', ['bridge', 'host-local', 'loopback']);
}

/** A short random suffix: interface names must stay within 15 characters. */
export function uniq(n = 6): string {
  return randomBytes(8).toString('hex').slice(0, n);
}

export async function sh(cmd: string, args: string[], opts: { reject?: boolean } = {}) {
  return execa(cmd, args, { reject: opts.reject ?? true });
}

/**
 * A namespace of the caller's own holding `pairs` veth pairs in group 77, up, one end of each with
 * an htb root and an ingress qdisc as a shaped pod's veth has (removed by `cleanup`, even on
 * failure); `run()` deletes them all with one request (the kernel unregisters them under its RTNL
 * lock: tens of milliseconds) and resolves with the ms until the kernel answered.
 */
export async function vethStorm(cleanup: Cleanup, pairs: number): Promise<{ run(): Promise<number> }> {
  const group = 77;
  const ns = `knb-${uniq(8)}`;
  cleanup.add(() => sh('ip', ['netns', 'del', ns], { reject: false }));
  await sh('ip', ['netns', 'add', ns]);
  const links = Array.from({ length: pairs }, (_, i) => [
    `link add a${i} group ${group} type veth peer name b${i}`,
    `link set a${i} up`,
    `link set b${i} up`,
  ]).flat();
  await execa('ip', ['-n', ns, '-batch', '-'], { input: links.join('\n') + '\n' });
  const qdiscs = Array.from({ length: pairs }, (_, i) => [`qdisc add dev a${i} root handle 1: htb`, `qdisc add dev a${i} ingress`]).flat();
  await execa('tc', ['-n', ns, '-batch', '-'], { input: qdiscs.join('\n') + '\n' });
  return {
    run: async () => {
      const t0 = performance.now();
      await execa('ip', ['-n', ns, 'link', 'del', 'group', String(group)]);
      return performance.now() - t0;
    },
  };
}

/** Creates a network namespace; returns its name and /var/run/netns path. */
export async function addNetns(name: string): Promise<{ name: string; path: string }> {
  await sh('ip', ['netns', 'add', name]);
  return { name, path: `/var/run/netns/${name}` };
}

export async function delNetns(name: string): Promise<void> {
  await sh('ip', ['netns', 'del', name], { reject: false });
}

export async function delLink(name: string): Promise<void> {
  await sh('ip', ['link', 'del', name], { reject: false });
}

/** Deletes an agent's or shaper's ifb and its egress shards (`<ifb>.1`, `<ifb>.2`, ...), whichever exist. */
export async function delIfbs(ifb: string): Promise<void> {
  for (const name of await ifbShardNames(ifb)) await delLink(name);
}

/**
 * The ifb `ifb`, its egress shards (`ifb.1`, ...) and its ingress shards (`ifb.in`, `ifb.i1`, ...)
 * that exist now (in this process's netns, or `netns`).
 */
export async function ifbShardNames(ifb: string, netns?: string): Promise<string[]> {
  const r = await sh('ip', [...(netns ? ['-n', netns] : []), '-o', 'link', 'show', 'type', 'ifb'], { reject: false });
  return ifbLinkNames(r.stdout).filter((n) => shardOf(ifb, n) !== undefined || ingressShardOf(ifb, n) !== undefined);
}

export async function linkExists(name: string, netns?: string): Promise<boolean> {
  const args = netns ? ['-n', netns, 'link', 'show', name] : ['link', 'show', name];
  return (await sh('ip', args, { reject: false })).exitCode === 0;
}

export async function makeTmpDir(prefix: string): Promise<string> {
  return mkdtemp(join(tmpdir(), `${prefix}-`));
}

export async function rmrf(path: string): Promise<void> {
  await rm(path, { recursive: true, force: true });
}

/** `ip -j` output parsed. */
export async function ipJson<T = unknown>(args: string[]): Promise<T> {
  const r = await sh('ip', ['-j', ...args]);
  return JSON.parse(r.stdout || '[]') as T;
}

/** Collects cleanup steps and runs them all in reverse order, reporting every failure. */
export class Cleanup {
  private readonly steps: Array<() => Promise<unknown>> = [];
  add(step: () => Promise<unknown>): void {
    this.steps.push(step);
  }
  async run(): Promise<void> {
    const errors: unknown[] = [];
    while (this.steps.length > 0) {
      const step = this.steps.pop();
      try {
        await step?.();
      } catch (err) {
        errors.push(err);
      }
    }
    if (errors.length > 0) throw new AggregateError(errors, 'cleanup failed');
  }
}
