/**
 * host-local's allocator in the agent (src/pod/host-local): what one ADD and one DEL cost on the
 * event loop as the node's reservations grow, with the store's index of reservation files in use
 * (nobody else changed the directory) against the directory read on every call (what host-local
 * itself does, and what the store does after anyone else changed it: here a file written and
 * removed beside the store before each call, which is such a change). Interleaved call by call,
 * with a pause between calls as an agent has between pods (cold caches, as in the agent).
 *
 * Prints p50 / p90 in ms per reservation count; asserts nothing. Temp directories only.
 *
 * Usage: npx tsx bench/allocator.ts [--calls N] [--counts 0,100,250] [--pause-ms 5]
 */
import { mkdtempSync, rmSync, unlinkSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { performance } from 'node:perf_hooks';
import { setTimeout as sleep } from 'node:timers/promises';
import { HostLocalAllocator, parseHostLocal } from '../src/pod/addresses/allocator/allocator.js';
import { reservationScans } from '../src/pod/addresses/allocator/store.js';
import { BenchArgs } from '../test/kit/bench-kit.js';

const args = BenchArgs.parse('usage: npx tsx bench/allocator.ts [--calls N] [--counts 0,100,250] [--pause-ms 5]', [
  'calls',
  'counts',
  'pause-ms',
]);
const calls = args.num('calls', 60);
const counts = args.nums('counts', '0,100,250');
const pauseMs = args.num('pause-ms', 5);

const pct = (xs: number[], p: number) => [...xs].sort((a, b) => a - b)[Math.min(xs.length - 1, Math.floor(xs.length * p))] ?? NaN;
const fmt = (xs: number[]) => `${pct(xs, 0.5).toFixed(3)} / ${pct(xs, 0.9).toFixed(3)}`;

console.log(`host-local allocator in the agent: ${calls} ADD+DEL per row and way, interleaved, ${pauseMs} ms pause between calls`);
console.log('reservations | ADD indexed  | ADD read all | DEL indexed  | DEL read all   (ms p50 / p90)');
for (const count of counts) {
  const dataDir = mkdtempSync(join(tmpdir(), 'kbench-alloc-'));
  try {
    const net = parseHostLocal({
      cniVersion: '1.0.0',
      name: 'kubenet',
      ipam: { type: 'host-local', ranges: [[{ subnet: '10.77.0.0/20' }]], dataDir },
    });
    const alloc = new HostLocalAllocator();
    for (let i = 0; i < count; i++) await alloc.add(net, `kbench-held-${i}`, 'eth0');
    const t = { addIdx: [] as number[], addRead: [] as number[], delIdx: [] as number[], delRead: [] as number[] };
    const scansBefore = reservationScans();
    let readAll = 0;
    for (let i = 0; i < 2 * calls; i++) {
      const read = i % 2 === 1;
      const id = `kbench-new-${i}`;
      for (const op of ['add', 'del'] as const) {
        if (read) {
          // Someone else's change: the store reads the directory again.
          const other = join(dataDir, 'kubenet', 'kbench-other');
          writeFileSync(other, '');
          unlinkSync(other);
          readAll++;
        }
        await sleep(pauseMs);
        const s = performance.now();
        if (op === 'add') await alloc.add(net, id, 'eth0');
        else await alloc.del(net, id, 'eth0');
        const ms = performance.now() - s;
        (op === 'add' ? (read ? t.addRead : t.addIdx) : read ? t.delRead : t.delIdx).push(ms);
      }
    }
    const scans = reservationScans() - scansBefore;
    console.log(
      `${String(count).padStart(12)} | ${fmt(t.addIdx)} | ${fmt(t.addRead)} | ${fmt(t.delIdx)} | ${fmt(t.delRead)}   (directory read ${scans} times for ${readAll} changes by others)`,
    );
  } finally {
    rmSync(dataDir, { recursive: true, force: true });
  }
}
