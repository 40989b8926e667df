/**
 * What the shaper leaves on a node when the agent is gone, and its removal (`kubenet uninstall`):
 * the ifbs (the egress shards `<ifbName>`, `<ifbName>.<k>` of any count, the ingress tree's
 * `<ifbName>.in`, `<ifbName>.i1`, ...), their trees going with them, and the unshaped destinations' mangle chain
 * (unshaped.ts). The pods' own qdiscs live on their veths and go with them.
 */
import { execa } from 'execa';
import { ToolError } from '../errors.js';
import * as nl from '../netlink/index.js';
import type { Removal } from '../util/removal.js';
import { ingressShardOf, shardOf } from './tc-layout.js';
import { removeUnshapedRules } from './unshaped.js';

/** The ifbs of the shaper named `ifbName` on this node, by name. */
export async function shaperIfbs(ifbName: string): Promise<string[]> {
  return (await nl.linkList())
    .filter((l) => l.type === 'ifb' && (shardOf(ifbName, l.name) !== undefined || ingressShardOf(ifbName, l.name) !== undefined))
    .map((l) => l.name)
    .sort();
}

/** Deletes the shaper's ifbs, then its mangle chain and jumps. */
export async function removeShaping(ifbName: string, r: Removal): Promise<void> {
  for (const ifb of await shaperIfbs(ifbName)) {
    await r.remove(`link ${ifb} (ifb, with its qdiscs)`, async () => {
      const args = ['link', 'del', 'dev', ifb];
      const res = await execa('ip', args, { reject: false });
      if (res.exitCode !== 0 && nl.linkIndexByName(ifb) !== undefined) throw new ToolError('ip', args, res.exitCode, res.stderr);
    });
  }
  await removeUnshapedRules(r);
}
