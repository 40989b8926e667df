/**
 * Shaper.setUnshaped on the real kernel, in a network namespace of the test's own (the mangle chain
 * KUBENET-UNSHAPED is per namespace: never the host's): a shaper on its own ifb started with one set,
 * then live changes of it. After each, the ifb's unshaped filters (`tc filter show`, prio 4 and 5) and
 * the chain (iptables / ip6tables -S) are exactly the new set; concurrent changes end with the last;
 * an empty set removes both. The shaper runs in a worker started with `ip netns exec`
 * (unshaped-live-worker.ts); deleting the namespace removes everything it made, failed or not.
 */
import test from 'ava';
import { execa } from 'execa';
import { fileURLToPath } from 'node:url';
import { isRoot, sh, uniq } from '../kit/kernel.js';
import { parseCidr } from '../../src/net/ip.js';
import { Address4, Address6 } from 'ip-address';

const WORKER = fileURLToPath(new URL('./unshaped-live-worker.ts', import.meta.url));
const blocker = isRoot ? undefined : `needs root (creates a network namespace and an ifb; running as uid ${process.getuid?.()})`;
const SET_CLASS = '-j CLASSIFY --set-class 0002:0000';

interface Seen {
  filters: string[];
  v4: string[] | null;
  v6: string[] | null;
  jumps: number;
}

/** What `tc filter show` prints for the u32 match of a destination CIDR: one line per 32-bit word the prefix covers. */
function u32Match(cidr: string): string {
  const s = parseCidr(cidr);
  const [bits, base, prio] = s.family === 4 ? [32, 16, 4] : [128, 24, 5];
  const value = (s.family === 4 ? new Address4(s.network) : new Address6(s.network)).bigInt();
  const words: string[] = [];
  for (let k = 0; k * 32 < s.prefixLen; k++) {
    const shift = BigInt(bits - 32 * (k + 1));
    const word = (value >> shift) & 0xffffffffn;
    const maskBits = Math.min(32, s.prefixLen - 32 * k);
    const mask = (0xffffffffn << BigInt(32 - maskBits)) & 0xffffffffn;
    words.push(`match ${word.toString(16).padStart(8, '0')}/${mask.toString(16).padStart(8, '0')} at ${base + 4 * k}`);
  }
  return `prio ${prio} ${words.join(' ')}`;
}

/** What the kernel should hold for a set. */
function expected(cidrs: string[]): Seen {
  const fam = (f: 4 | 6) =>
    cidrs.filter((c) => parseCidr(c).family === f).map((c) => `-A KUBENET-UNSHAPED -s ${parseCidr(c).cidr} ${SET_CLASS}`);
  const v4 = fam(4);
  const v6 = fam(6);
  return {
    filters: cidrs.map(u32Match).sort(),
    v4: v4.length ? v4 : null,
    v6: v6.length ? v6 : null,
    jumps: (v4.length ? 1 : 0) + (v6.length ? 1 : 0),
  };
}

test('a live change of the unshaped set rewrites every unshaped filter of the ifb and the mangle chain, exactly', async (t) => {
  if (blocker) return t.fail(blocker);
  const id = uniq(8);
  const ns = `kus-${id}`;
  t.teardown(() => sh('ip', ['netns', 'del', ns], { reject: false }));
  await sh('ip', ['netns', 'add', ns]);
  const first = ['10.0.0.0/8'];
  const cluster = ['10.244.0.0/23', '10.96.0.0/16', 'fd00:10:96::/112', 'fd00:10:244::/63'];
  const moved = ['10.244.0.0/22', '10.96.0.0/16'];
  // 128 Nodes whose /24s do not fold (every other one): the most a rewrite has to write here.
  const sparse = Array.from({ length: 128 }, (_, i) => `10.${200 + (i >> 7)}.${(i * 2) % 256}.0/24`);
  const steps = [first, cluster, moved, ['burst', '10.1.0.0/16', '10.2.0.0/16,fd00::/8'], sparse, moved, []];
  const { stdout } = await execa('ip', [
    'netns',
    'exec',
    ns,
    process.execPath,
    '--import',
    'tsx',
    WORKER,
    JSON.stringify({ ifb: `kus${id}`, bridge: `kusbr${id.slice(0, 6)}`, steps }),
  ]);
  const runs = stdout
    .trim()
    .split('\n')
    .map((l) => JSON.parse(l) as Seen & { ms: number });
  const seen = runs.map(({ ms: _ms, ...s }) => ({ ...s, filters: [...s.filters].sort() }));
  t.log(`ms per step (init, cluster, moved, burst of 2, 128 CIDRs, 2 CIDRs, none): ${runs.map((r) => r.ms).join(' ')}`);
  t.is(seen.length, steps.length);
  t.deepEqual(seen[0], expected(first), 'at init: the first set');
  t.deepEqual(seen[1], expected(cluster), "changed live: the cluster's ranges, both families, 10.0.0.0/8 gone");
  t.deepEqual(seen[2], expected(moved), "a Node's CIDR added, the IPv6 ranges gone: the chain of that family too");
  t.deepEqual(seen[3], expected(['10.2.0.0/16', 'fd00::/8']), 'two changes at once: the last one holds');
  t.deepEqual(seen[4], expected(sparse), '128 CIDRs');
  t.deepEqual(seen[5], expected(moved), 'and back to 2');
  t.deepEqual(seen[6], expected([]), 'an empty set: no filter, no chain, no jump');
  // Nothing left behind: the worker's reset removed the ifb.
  const links = (await execa('ip', ['-n', ns, '-o', 'link', 'show'])).stdout;
  t.notRegex(links, new RegExp(`kus${id}`));
});
