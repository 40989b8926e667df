/**
 * Reading a node's shaping trees the way the agent spreads them: each direction over several ifbs
 * (src/shaper/shard-names.ts: egress `<ifb>`, `<ifb>.1`, ...; ingress `<ifb>.in`, `<ifb>.i1`, ...),
 * through whatever runs a command on the node (a sandbox's netns, a cluster node's container).
 */
import { ingressShardOf, shardOf } from '../../src/shaper/shard-names.js';

/** Runs a command on the node and gives its stdout. */
export type NodeRun = (cmd: string, args: string[]) => Promise<string>;

export type ShardDirection = 'egress' | 'ingress';

/** The names of the ifbs `ip -o link show type ifb` printed. */
export function ifbLinkNames(ipOutput: string): string[] {
  return [...ipOutput.matchAll(/^\d+: ([^:@\s]+)[:@]/gm)].map((m) => m[1] ?? '');
}

/** The ifbs of one direction's shards on the node, shard 0 first. */
export async function shardIfbs(run: NodeRun, dir: ShardDirection, ifb = 'kubenet-ifb0'): Promise<string[]> {
  const out = await run('ip', ['-o', 'link', 'show', 'type', 'ifb']);
  const of = dir === 'egress' ? shardOf : ingressShardOf;
  return ifbLinkNames(out)
    .map((name) => ({ name, k: of(ifb, name) }))
    .filter((s): s is { name: string; k: number } => s.k !== undefined)
    .sort((a, b) => a.k - b.k)
    .map((s) => s.name);
}

/**
 * `tc <object> show dev <shard> <extra...>` on every shard of a direction, each shard's lines as
 * tc prints them, the shards one after another.
 */
export async function tcOnShards(
  run: NodeRun,
  dir: ShardDirection,
  object: 'qdisc' | 'class' | 'filter',
  extra: string[] = [],
  ifb = 'kubenet-ifb0',
): Promise<string> {
  const outs: string[] = [];
  for (const dev of await shardIfbs(run, dir, ifb)) outs.push(await run('tc', [object, 'show', 'dev', dev, ...extra]));
  return outs.join('\n');
}

/** The device a `tc filter show` output redirects to (mirred), if any. */
export function redirectTarget(filterShow: string): string | undefined {
  return /Redirect to device ([^)\s]+)/.exec(filterShow)?.[1];
}
