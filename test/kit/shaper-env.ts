/**
 * A Shaper on its own uniquely named ifb over a topology of pods (test/kit/topo.ts), removed
 * with everything the test made when the test ends: the setup of the shaper's kernel tests.
 */
import type { ExecutionContext } from 'ava';
import { Shaper, type PodShaping } from '../../src/shaper/tc.js';
import { delIfbs, uniq } from './kernel.js';
import { makeTopology, type TopoPod, type Topology } from './topo.js';

export interface ShaperEnv {
  topo: Topology;
  shaper: Shaper;
  ifb: string;
}

export async function shaperEnv(
  t: ExecutionContext,
  pods = 3,
  shards = 1,
  capacity?: { egress?: number; ingress?: number },
): Promise<ShaperEnv> {
  const ifb = `kif${uniq(8)}`;
  const topo = await makeTopology(pods);
  const shaper = new Shaper({ ifbName: ifb, shards, ...(capacity ? { capacity } : {}) });
  t.teardown(async () => {
    await shaper.reset().catch(() => undefined);
    shaper.close();
    // Every shard a test may have made (ifb, ifb.1, ...), whatever count it ended with.
    await delIfbs(ifb);
    await topo.destroy();
  });
  await shaper.init();
  return { topo, shaper, ifb };
}

/** The shaper's view of a topology pod with these limits: both its addresses, or only IPv4. */
export function podOf(p: TopoPod, limits: PodShaping['limits'], dual = true): PodShaping {
  return { id: p.id, hostVeth: p.hostVeth, ips: dual ? [p.ip4, p.ip6] : [p.ip4], limits };
}
