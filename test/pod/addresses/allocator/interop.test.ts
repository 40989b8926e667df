/**
 * host-local in the agent (src/pod/addresses/allocator) against a temp directory and the real `host-local`
 * of the reference plugins (v1.10.0) in the same directory: the files byte for byte, the lock,
 * each side releasing the other's, a full range failing with host-local's words on both sides, an
 * 8-way concurrent mix of 2 000 ADDs and DELs, and a child process SIGKILLed mid-allocation (these
 * two load both cores for ~18 s each: they hold the traffic lock, so no rate is measured meanwhile).
 * No network namespaces: host-local never enters one.
 */
import test, { type ExecutionContext } from 'ava';
import { execa } from 'execa';
import { spawn } from 'node:child_process';
import { existsSync, mkdtempSync, readdirSync, readFileSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { performance } from 'node:perf_hooks';
import { AddressesExhaustedError, HostLocalAllocator, parseHostLocal } from '../../../../src/pod/addresses/allocator/allocator.js';
import { reservationScans } from '../../../../src/pod/addresses/allocator/store.js';
import { refPlugin, upstreamBlocker } from '../../../kit/upstream.js';
import { withTrafficLock } from '../../../kit/traffic-lock.js';

const HOST_LOCAL = refPlugin('host-local');
const blocker =
  upstreamBlocker('cni-plugins', ['host-local']) ?? (existsSync('/usr/bin/flock') ? undefined : 'needs flock(1) (util-linux)');
// Serial: the spawns of one test (synchronous in the event loop) would distort another's timings.
const maybe = blocker ? test.skip : test.serial;
if (blocker) test('host-local interop', (t) => t.log(`skipped: ${blocker}`));

function tempDir(t: ExecutionContext): string {
  const dir = mkdtempSync(join(tmpdir(), 'kia-hostlocal-'));
  t.teardown(() => rmSync(dir, { recursive: true, force: true }));
  return dir;
}

function conf(dataDir: string, ranges: unknown[]) {
  return {
    cniVersion: '1.0.0',
    name: 'kubenet',
    type: 'host-local',
    ipam: { type: 'host-local', ranges, routes: [{ dst: '0.0.0.0/0' }], dataDir },
  };
}

/** The real host-local: its result (ADD) or its CNI error. */
async function hostLocal(
  cmd: 'ADD' | 'DEL' | 'CHECK',
  c: object,
  containerId: string,
  ifName = 'eth0',
): Promise<{ ok: boolean; out: any }> {
  const r = await execa(HOST_LOCAL, [], {
    input: JSON.stringify(c),
    env: {
      CNI_COMMAND: cmd,
      CNI_CONTAINERID: containerId,
      CNI_NETNS: '/var/run/netns/kia-none',
      CNI_IFNAME: ifName,
      CNI_PATH: '/nonexistent',
    },
    extendEnv: false,
    reject: false,
  });
  return { ok: r.exitCode === 0, out: r.stdout ? JSON.parse(r.stdout) : undefined };
}

const addrs = (res: { ips: Array<{ address: string }> }): string[] => res.ips.map((i) => i.address.split('/')[0] ?? '');

/** The directory's files, with the lock and last_reserved_ip.N apart. */
function files(dir: string): { reservations: Map<string, string>; other: string[] } {
  const reservations = new Map<string, string>();
  const other: string[] = [];
  for (const n of readdirSync(dir)) {
    if (n === 'lock' || n.startsWith('last_reserved_ip.')) other.push(n);
    else reservations.set(n, readFileSync(join(dir, n), 'utf8'));
  }
  return { reservations, other: other.sort() };
}

maybe("the same files, modes and order as host-local; each side releases and checks the other's", async (t) => {
  const ranges = [[{ subnet: '10.9.0.0/28' }], [{ subnet: 'fd00:9::/124' }]];
  const [ours, theirs] = [tempDir(t), tempDir(t)];
  const alloc = new HostLocalAllocator();
  const net = parseHostLocal(conf(ours, ranges));
  // The same ADD/DEL sequence on both sides, each in its own directory: the same addresses, files and bytes.
  for (const [i, op] of ['a1', 'a2', 'd1', 'a3', 'a4', 'd3', 'a5'].entries()) {
    const id = `kia-c${op.slice(1)}`;
    if (op.startsWith('a')) {
      const mine = await alloc.add(net, id, 'eth0');
      const ref = await hostLocal('ADD', conf(theirs, ranges), id);
      t.deepEqual(addrs(mine), addrs(ref.out), `step ${i}`);
      t.deepEqual(mine.ips, ref.out.ips);
    } else {
      await alloc.del(net, id, 'eth0');
      await hostLocal('DEL', conf(theirs, ranges), id);
    }
  }
  const [a, b] = [join(ours, 'kubenet'), join(theirs, 'kubenet')];
  t.deepEqual(readdirSync(a).sort(), readdirSync(b).sort());
  for (const n of readdirSync(b)) {
    t.deepEqual(readFileSync(join(a, n)), readFileSync(join(b, n)), `${n}: same bytes`);
    t.is(statSync(join(a, n)).mode, statSync(join(b, n)).mode, `${n}: same mode`);
  }
  t.is(readFileSync(join(a, '10.9.0.3'), 'utf8'), 'kia-c2\r\neth0');
  t.is(statSync(a).mode & 0o777, 0o755);

  // Cross: host-local releases and checks the agent's; the agent releases host-local's.
  t.true((await hostLocal('CHECK', conf(ours, ranges), 'kia-c2')).ok, "host-local finds the agent's reservation");
  t.true((await hostLocal('DEL', conf(ours, ranges), 'kia-c2')).ok);
  t.false(existsSync(join(a, '10.9.0.3')), "host-local released the agent's address");
  t.false(existsSync(join(a, 'fd00:9::3')));
  const ref = await hostLocal('ADD', conf(ours, ranges), 'kia-hl');
  t.deepEqual(addrs(ref.out), ['10.9.0.7', 'fd00:9::7'], "host-local continues the agent's round-robin");
  t.deepEqual((await alloc.del(net, 'kia-hl', 'eth0')).sort(), ['10.9.0.7', 'fd00:9::7'], "the agent released host-local's");
  t.deepEqual(addrs(await alloc.add(net, 'kia-next', 'eth0')), ['10.9.0.8', 'fd00:9::8'], "and continues host-local's");
  // host-local's GC keeps what the agent holds for live attachments, and removes the rest.
  await alloc.add(net, 'kia-gone', 'eth0');
  const gc = await execa(HOST_LOCAL, [], {
    input: JSON.stringify({
      ...conf(ours, ranges),
      cniVersion: '1.1.0',
      'cni.dev/valid-attachments': [
        { containerID: 'kia-next', ifname: 'eth0' },
        { containerID: 'kia-c4', ifname: 'eth0' },
        { containerID: 'kia-c5', ifname: 'eth0' },
      ],
    }),
    env: { CNI_COMMAND: 'GC', CNI_PATH: '/nonexistent' },
    extendEnv: false,
  });
  t.is(gc.exitCode, 0);
  t.deepEqual(
    [...files(a).reservations.values()].filter((v) => v.startsWith('kia-gone')),
    [],
    "GC removed the agent's stale reservation",
  );
  t.deepEqual(files(a).other, ['last_reserved_ip.0', 'last_reserved_ip.1', 'lock']);
});

maybe("a full range: host-local's error from both sides, nothing reserved by the failed ADD", async (t) => {
  const dir = tempDir(t);
  const c = conf(dir, [[{ subnet: '10.9.0.0/29' }], [{ subnet: 'fd00:9::/125' }]]);
  const net = parseHostLocal(c);
  const alloc = new HostLocalAllocator();
  for (let i = 0; i < 5; i++) await (i % 2 ? alloc.add(net, `kia-f${i}`, 'eth0') : hostLocal('ADD', c, `kia-f${i}`));
  const ref = await hostLocal('ADD', c, 'kia-full');
  t.false(ref.ok);
  t.deepEqual(ref.out, { code: 999, msg: 'failed to allocate for range 0: no IP addresses available in range set: 10.9.0.1-10.9.0.6' });
  const err = await t.throwsAsync(alloc.add(net, 'kia-full', 'eth0'), { instanceOf: AddressesExhaustedError });
  t.is(err?.message, ref.out.msg, 'word for word');
  t.is(err?.rangeIndex, 0);
  t.is(files(join(dir, 'kubenet')).reservations.size, 10, 'five v4 + five v6, no more');
  t.false([...files(join(dir, 'kubenet')).reservations.values()].some((v) => v.startsWith('kia-full')));
});

maybe(
  "the reservations read once are kept while nobody else changes the directory, and read again after any change: host-local's, another store's of this process, by hand, the directory removed",
  async (t) => {
    const ranges = [[{ subnet: '10.9.2.0/28' }]];
    const dataDir = tempDir(t);
    const dir = join(dataDir, 'kubenet');
    const net = parseHostLocal(conf(dataDir, ranges));
    const [a, b] = [new HostLocalAllocator(), new HostLocalAllocator()];
    const got = async (alloc: HostLocalAllocator, id: string) => addrs(await alloc.add(net, id, 'eth0'))[0];
    const duplicate = (alloc: HostLocalAllocator, id: string, why: string) =>
      t.throwsAsync(alloc.add(net, id, 'eth0'), { message: /duplicate allocation is not allowed/ }, why);
    // Unchanged by others: one read of the directory for five ADDs and a DEL.
    const before = reservationScans();
    for (const id of ['kix-1', 'kix-2', 'kix-3', 'kix-4', 'kix-5']) await got(a, id);
    t.deepEqual(await a.del(net, 'kix-5', 'eth0'), ['10.9.2.6']);
    t.is(reservationScans() - before, 1, 'the directory was read once');
    // The real host-local reserves: the next ADD of the agent sees it.
    t.true((await hostLocal('ADD', conf(dataDir, ranges), 'kix-h')).ok);
    await duplicate(a, 'kix-h', "the agent sees host-local's reservation");
    // Another store of this process (a second allocator): each sees the other's changes.
    t.is(await got(b, 'kix-b'), '10.9.2.8');
    await duplicate(a, 'kix-b', "the first store sees the second's reservation");
    t.deepEqual(await b.del(net, 'kix-1', 'eth0'), ['10.9.2.2'], "the second store releases the first's");
    t.is(await got(a, 'kix-1'), '10.9.2.9', 'and the first sees the release (no duplicate)');
    // By hand: a file written, a file removed.
    writeFileSync(join(dir, '10.9.2.14'), 'kix-hand\r\neth0', { mode: 0o600 });
    t.deepEqual(await a.del(net, 'kix-hand', 'eth0'), ['10.9.2.14'], 'a file written by hand is released');
    rmSync(join(dir, '10.9.2.3'));
    t.is(await got(a, 'kix-2'), '10.9.2.10', 'a file removed by hand: its attachment may allocate again');
    // The directory removed (the watch goes with it) and made again by the next ADD.
    rmSync(dir, { recursive: true });
    t.is(await got(a, 'kix-4'), '10.9.2.2', 'nothing of before is held');
    t.deepEqual(await a.del(net, 'kix-3', 'eth0'), [], 'nothing of before is released');
    t.deepEqual([...files(dir).reservations.keys()], ['10.9.2.2']);
    t.true((await hostLocal('DEL', conf(dataDir, ranges), 'kix-4')).ok);
    t.deepEqual([...files(dir).reservations.keys()], [], 'host-local releases what the agent reserved after it all');
    t.deepEqual(await a.del(net, 'kix-4', 'eth0'), [], 'and the agent sees it gone');
  },
);

maybe("the agent waits for host-local's lock (flock on <dir>/lock) without blocking its event loop", async (t) => {
  const dir = tempDir(t);
  const c = conf(dir, [[{ subnet: '10.9.0.0/24' }]]);
  const net = parseHostLocal(c);
  const alloc = new HostLocalAllocator();
  await alloc.add(net, 'kia-first', 'eth0'); // makes the directory and the lock file
  const holder = spawn('flock', [join(dir, 'kubenet', 'lock'), 'sh', '-c', 'echo held; exec sleep 0.5'], {
    stdio: ['ignore', 'pipe', 'ignore'],
  });
  // Listened for at once: the holder exits (releasing the lock) before the waiting ADD returns.
  const exited = new Promise((r) => holder.on('exit', r));
  // Once it says so, host-local's lock is held (however slow the machine is to start it).
  await new Promise<void>((r) => holder.stdout?.once('data', () => r()));
  const started = performance.now();
  let ticks = 0;
  const ticker = setInterval(() => ticks++, 10);
  await alloc.add(net, 'kia-waiter', 'eth0');
  clearInterval(ticker);
  const waited = performance.now() - started;
  t.true(waited >= 300, `waited ${Math.round(waited)} ms for the lock`);
  t.true(ticks >= 20, `the event loop kept running meanwhile (${ticks} ticks of 10 ms)`);
  await exited;
});

maybe(
  "8-way concurrent ADD+DEL, agent and host-local mixed, 2 000 operations: no duplicate, nothing lost, each releases the other's",
  (t) =>
    withTrafficLock(async () => {
      t.timeout(300_000);
      const dir = tempDir(t);
      const c = conf(dir, [[{ subnet: '10.9.0.0/24' }], [{ subnet: 'fd00:9::/120' }]]);
      const net = parseHostLocal(c);
      const alloc = new HostLocalAllocator();
      const store = join(dir, 'kubenet');
      const held = new Map<string, string>(); // address -> container ID, per the ADDs that returned
      const problems: string[] = [];
      const counts = { ops: 0, agentAdd: 0, hlAdd: 0, agentDelOfHl: 0, hlDelOfAgent: 0, sameSideDel: 0 };
      const TOTAL = 2000;
      let next = 0;
      const started = performance.now();
      const lane = async (lane: number) => {
        const mine: Array<{ id: string; by: 'agent' | 'hl'; ips: string[] }> = [];
        // Each lane holds up to 3 attachments at a time, so reservations stay live across other lanes' work.
        while (next < TOTAL) {
          const doAdd = mine.length === 0 || (mine.length < 3 && Math.random() < 0.5);
          next++;
          if (doAdd) {
            const id = `kia-l${lane}-${next}`;
            const by = Math.random() < 0.5 ? 'agent' : 'hl';
            let ips: string[];
            if (by === 'agent') {
              ips = addrs(await alloc.add(net, id, 'eth0'));
              counts.agentAdd++;
            } else {
              const r = await hostLocal('ADD', c, id);
              if (!r.ok) {
                problems.push(`host-local ADD ${id}: ${JSON.stringify(r.out)}`);
                continue;
              }
              ips = addrs(r.out);
              counts.hlAdd++;
            }
            for (const ip of ips) {
              const other = held.get(ip);
              if (other) problems.push(`duplicate: ${ip} given to ${id} (${by}) while ${other} holds it`);
              held.set(ip, id);
              const content = readFileSync(join(store, ip), 'utf8');
              if (content !== `${id}\r\neth0`) problems.push(`${ip}: file holds ${JSON.stringify(content)}, not ${id}`);
            }
            mine.push({ id, by, ips });
          } else {
            const a = mine.splice(Math.floor(Math.random() * mine.length), 1)[0]!;
            for (const ip of a.ips) held.delete(ip); // before the release: the address may be given again at once
            const by = Math.random() < 0.5 ? 'agent' : 'hl';
            if (by === 'agent') await alloc.del(net, a.id, 'eth0');
            else if (!(await hostLocal('DEL', c, a.id)).ok) problems.push(`host-local DEL ${a.id} failed`);
            if (by !== a.by) counts[by === 'agent' ? 'agentDelOfHl' : 'hlDelOfAgent']++;
            else counts.sameSideDel++;
            for (const ip of a.ips)
              if (existsSync(join(store, ip)) && readFileSync(join(store, ip), 'utf8') === `${a.id}\r\neth0`)
                problems.push(`${ip} of ${a.id} not released`);
          }
          counts.ops++;
        }
        // Release what is left, crossing sides.
        for (const a of mine) {
          for (const ip of a.ips) held.delete(ip);
          if (a.by === 'agent') await hostLocal('DEL', c, a.id);
          else await alloc.del(net, a.id, 'eth0');
          counts.ops++;
        }
      };
      await Promise.all(Array.from({ length: 8 }, (_, i) => lane(i)));
      const ms = Math.round(performance.now() - started);
      t.log({ ...counts, ms, perOpMs: +(ms / counts.ops).toFixed(2) });
      t.deepEqual(problems, []);
      t.true(counts.ops >= TOTAL, `${counts.ops} operations`);
      t.true(counts.agentDelOfHl > 50 && counts.hlDelOfAgent > 50, "each side released many of the other's");
      const left = files(store);
      t.deepEqual([...left.reservations.keys()], [], 'no reservation left');
      t.deepEqual(left.other, ['last_reserved_ip.0', 'last_reserved_ip.1', 'lock']);
    }),
);

maybe(
  'a child allocating in a loop, SIGKILLed mid-allocation (25 times): no empty file, no stray file, all releasable by host-local',
  (t) =>
    withTrafficLock(async () => {
      t.timeout(300_000);
      const dir = tempDir(t);
      // Each child keeps at most 21 (its warm one and every third of its first 60): 25 rounds never fill
      // the 1022 addresses, however fast a child allocates before its kill.
      const c = conf(dir, [[{ subnet: '10.9.0.0/22' }], [{ subnet: 'fd00:9::/118' }]]);
      const store = join(dir, 'kubenet');
      const child = join(tempDir(t), 'child.mts');
      const src = new URL('../../../../src/pod/addresses/allocator/allocator.ts', import.meta.url).pathname;
      // Allocates and releases as fast as it can; prints "go" once it has started.
      (await import('node:fs')).writeFileSync(
        child,
        `import { HostLocalAllocator, parseHostLocal } from ${JSON.stringify(src)};
const net = parseHostLocal(${JSON.stringify(c)});
const a = new HostLocalAllocator();
const tag = process.argv[2];
let i = 0;
await a.add(net, tag + '-warm', 'eth0');
process.stdout.write('go\\n');
for (;;) {
  const id = tag + '-' + (i++);
  await a.add(net, id, 'eth0');
  if (i % 3 !== 0 || i > 60) await a.del(net, id, 'eth0');
}
`,
      );
      const ROUNDS = 25;
      for (let round = 0; round < ROUNDS; round++) {
        const p = spawn(process.execPath, ['--import=tsx', child, `kia-k${round}`], { stdio: ['ignore', 'pipe', 'inherit'] });
        await new Promise<void>((resolve, reject) => {
          p.stdout.once('data', () => resolve());
          p.once('exit', (code) => reject(new Error(`child exited ${code} before starting`)));
        });
        await new Promise((r) => setTimeout(r, 5 + Math.random() * 60));
        p.kill('SIGKILL');
        await new Promise((r) => p.once('exit', r));
        const { reservations, other } = files(store);
        for (const [name, content] of reservations) {
          t.regex(content, /^kia-k\d+-(warm|\d+)\r\neth0$/, `${name}: a whole reservation`);
        }
        t.deepEqual(other, ['last_reserved_ip.0', 'last_reserved_ip.1', 'lock'], 'no stray file');
        for (const n of other.filter((o) => o.startsWith('last_')))
          t.regex(readFileSync(join(store, n), 'utf8'), /^[0-9a-f.:]+$/, `${n} not empty`);
      }
      // Everything the killed children held is released by the real host-local, by the IDs the files name.
      const ids = new Set([...files(store).reservations.values()].map((v) => v.split('\r\n')[0]!));
      for (const id of ids) t.true((await hostLocal('DEL', c, id)).ok);
      t.deepEqual([...files(store).reservations.keys()], [], 'all released');
      t.log({ rounds: ROUNDS, idsReleasedAfter: ids.size });
    }),
);
