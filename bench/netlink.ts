/**
 * What the netlink layer's requests wait on, and what each way of keeping them off the event loop
 * costs (issue 32; the figures and the choice: docs/netlink.md). Sections, each alone with
 * `--only NAME[,NAME]`:
 *
 * - kernel:   each kind of request the agent makes, timed one after another on this thread, with
 *             the kernel idle and during an RTNL storm: `--pairs` veth pairs of a namespace of this
 *             bench's own, up, each with an htb root and an ingress qdisc (as a shaped pod's), all
 *             deleted by one request (`ip link del group`: the kernel unregisters them under the RTNL
 *             lock in one go, as it does a DEL burst's batch). A kind whose max grows with the storm
 *             waits on the lock; the SIOCGIFINDEX ioctl is there for contrast.
 * - overhead: one link lookup (RTM_GETLINK by name) with the kernel idle, made three ways: on the
 *             event loop (synchronous koffi call), on a libuv pool thread (koffi `.async`, the API's
 *             way), and posted to a worker_thread that makes it synchronously there.
 * - loop:     the same three ways during a storm, lookups back to back (8 in flight for the two
 *             asynchronous ways): the event loop's delay (monitorEventLoopDelay, 1 ms resolution)
 *             and the lookups' own times.
 * - pool:     why kernel requests hold at most some of libuv's pool: in a child process with
 *             UV_THREADPOOL_SIZE=4, an fs.promises.stat timed while 0, 2 or 4 pool threads are held
 *             by calls that take 50 ms (koffi `.async` of usleep, standing for requests blocked on
 *             the RTNL lock).
 *
 * Prints numbers; asserts nothing. Root only. Makes only its own namespaces and one bridge
 * (`knbd…`), removed even on failure.
 * Usage: flock /tmp/kubenet-traffic.lock npx tsx bench/netlink.ts [--only kernel,overhead,loop,pool] [--pairs 256] [--calls 2000]
 */
import { execa } from 'execa';
import { createRequire } from 'node:module';
import { monitorEventLoopDelay, performance } from 'node:perf_hooks';
import { Worker } from 'node:worker_threads';
import { BenchArgs, summary } from '../test/kit/bench-kit.js';
import { Cleanup, isRoot, sh, uniq, vethStorm } from '../test/kit/kernel.js';
import { AF_INET, AF_UNSPEC, nl, route, rt, type Out, type Ptr } from '../src/netlink/libnl.js';
import { classList, linkByName, linkIndexByName } from '../src/netlink/index.js';
import { getLink, toLinkInfo } from '../src/netlink/link.js';
import { hostSocket, socketInNetns } from '../src/netlink/socket.js';

const SECTIONS = ['kernel', 'overhead', 'loop', 'pool'] as const;
type Section = (typeof SECTIONS)[number];
const args = BenchArgs.parse('usage: npx tsx bench/netlink.ts [--only kernel,overhead,loop,pool] [--pairs 256] [--calls 2000]', [
  'only',
  'pairs',
  'calls',
]);
const only = args.list('only', SECTIONS.join(',')) as Section[];
for (const s of only) if (!SECTIONS.includes(s)) throw new Error(`--only: want sections among ${SECTIONS.join(', ')}, got ${s}`);
const PAIRS = args.num('pairs', 256);
const CALLS = args.num('calls', 2000);
const require = createRequire(import.meta.url);

const f = (x: number) => x.toFixed(3).padStart(9);
const stats = (xs: number[]) => summary(xs);

/** Times `fn` (synchronous) once per turn of the event loop until `until()`, at least once. */
async function timeWhile(fn: () => void, until: () => boolean): Promise<number[]> {
  const out: number[] = [];
  do {
    const t0 = performance.now();
    fn();
    out.push(performance.now() - t0);
    await new Promise((r) => setImmediate(r));
  } while (!until());
  return out;
}

async function kernelSection(cleanup: Cleanup): Promise<void> {
  const tag = uniq(6);
  const dev = `knbd${tag}`;
  const podNs = `knb-${tag}-pod`;
  cleanup.add(() => sh('ip', ['link', 'del', dev], { reject: false }));
  cleanup.add(() => sh('ip', ['netns', 'del', podNs], { reject: false }));
  await sh('ip', ['link', 'add', dev, 'type', 'bridge']);
  await sh('ip', ['link', 'set', dev, 'up']);
  await sh('tc', ['qdisc', 'add', 'dev', dev, 'root', 'handle', '1:', 'htb']);
  await sh('tc', ['class', 'add', 'dev', dev, 'parent', '1:', 'classid', '1:1', 'htb', 'rate', '10mbit']);
  await sh('ip', ['netns', 'add', podNs]);
  const sk = hostSocket('bench');
  const index = linkIndexByName(dev) ?? 0;
  const dump = (fill: (out: Out) => number) => {
    const out: Out = [null];
    if (fill(out) < 0 || !out[0]) throw new Error('dump failed');
    nl.nl_cache_free(out[0]);
  };
  const kinds: Array<[string, () => void]> = [
    ['RTM_GETLINK by name', () => route.rtnl_link_put(getLink(sk, 'bench', dev))],
    ['RTM_GETLINK by index', () => route.rtnl_link_put(getLink(sk, 'bench', index))],
    [
      'RTM_GETLINK in a netns (socket made there)',
      () => {
        const s = socketInNetns('bench', `/var/run/netns/${podNs}`);
        try {
          route.rtnl_link_put(getLink(s, 'bench', 'lo'));
        } finally {
          nl.nl_socket_free(s);
        }
      },
    ],
    ['RTM_GETLINK dump', () => dump((out) => route.rtnl_link_alloc_cache(sk, AF_UNSPEC, out) as number)],
    ['RTM_GETADDR dump', () => dump((out) => route.rtnl_addr_alloc_cache(sk, out) as number)],
    ['RTM_GETROUTE dump (IPv4)', () => dump((out) => rt.rtnl_route_alloc_cache(sk, AF_INET, 0, out) as number)],
    ['RTM_GETTCLASS dump (1 class)', () => void classList(index)],
    [
      'RTM_NEWLINK (mtu unchanged)',
      () => {
        const orig = getLink(sk, 'bench', dev);
        const change = route.rtnl_link_alloc() as Ptr;
        route.rtnl_link_set_mtu(change, toLinkInfo(orig).mtu);
        const rc = route.rtnl_link_change(sk, orig, change, 0) as number;
        route.rtnl_link_put(change);
        route.rtnl_link_put(orig);
        if (rc < 0) throw new Error(`rtnl_link_change: ${rc}`);
      },
    ],
    ['SIOCGIFINDEX ioctl (no netlink)', () => void linkIndexByName(dev)],
  ];
  console.log(
    `\nkernel: each request on this thread, ms; idle: ${CALLS} calls; storm: back to back while ${PAIRS} veth pairs (htb, ingress) are deleted by one request`,
  );
  console.log('request                                        idle p50   idle max |  storm n  storm p50  storm p99  storm max | storm ms');
  for (const [name, fn] of kinds) {
    const idle = stats(
      Array.from({ length: CALLS }, () => {
        const t0 = performance.now();
        fn();
        return performance.now() - t0;
      }),
    );
    const s = await vethStorm(cleanup, PAIRS);
    let done = false;
    const running = s.run().then((ms) => {
      done = true;
      return ms;
    });
    // Let the ip processes start (their deletions begin a few ms after the spawn).
    await new Promise((r) => setTimeout(r, 20));
    const during = stats(await timeWhile(fn, () => done));
    const stormMs = await running;
    console.log(
      `${name.padEnd(44)} ${f(idle.p50)}  ${f(idle.max)} | ${String(during.n).padStart(7)}  ${f(during.p50)}  ${f(during.p99)}  ${f(during.max)} | ${stormMs.toFixed(0).padStart(8)}`,
    );
  }
}

/** A worker_thread that makes RTM_GETLINK by name synchronously for each message it gets. */
function lookupWorker(): { lookup(name: string): Promise<number>; close(): Promise<number> } {
  const code = `
    const { parentPort } = require('node:worker_threads');
    const koffi = require(${JSON.stringify(require.resolve('koffi'))});
    koffi.opaque('nl_sock'); koffi.opaque('rtnl_link');
    const libnl = koffi.load('libnl-3.so.200');
    const libroute = koffi.load('libnl-route-3.so.200');
    const alloc = libnl.func('nl_sock *nl_socket_alloc(void)');
    const connect = libnl.func('int nl_connect(nl_sock *sk, int protocol)');
    const get = libroute.func('int rtnl_link_get_kernel(nl_sock *sk, int ifindex, const char *name, _Out_ rtnl_link **result)');
    const index = libroute.func('int rtnl_link_get_ifindex(rtnl_link *link)');
    const put = libroute.func('void rtnl_link_put(rtnl_link *link)');
    const sk = alloc(); connect(sk, 0);
    parentPort.on('message', ({ id, name }) => {
      const out = [null];
      const rc = get(sk, 0, name, out);
      const ifindex = rc === 0 && out[0] ? index(out[0]) : rc;
      if (out[0]) put(out[0]);
      parentPort.postMessage({ id, ifindex });
    });`;
  const w = new Worker(code, { eval: true });
  const waiting = new Map<number, (i: number) => void>();
  let next = 0;
  w.on('message', ({ id, ifindex }: { id: number; ifindex: number }) => {
    waiting.get(id)?.(ifindex);
    waiting.delete(id);
  });
  return {
    lookup: (name) =>
      new Promise((resolve) => {
        const id = next++;
        waiting.set(id, resolve);
        w.postMessage({ id, name });
      }),
    close: () => w.terminate(),
  };
}

type Way = 'sync' | 'pool' | 'worker';

async function overheadSection(): Promise<void> {
  const worker = lookupWorker();
  await worker.lookup('lo');
  const sk = hostSocket('bench');
  const ways: Record<Way, () => Promise<unknown>> = {
    sync: async () => route.rtnl_link_put(getLink(sk, 'bench', 'lo')),
    pool: () => linkByName('lo'),
    worker: () => worker.lookup('lo'),
  };
  const t: Record<Way, number[]> = { sync: [], pool: [], worker: [] };
  for (let i = 0; i < 100; i++) for (const w of Object.keys(ways) as Way[]) await ways[w]();
  for (let i = 0; i < CALLS; i++) {
    for (const w of (['sync', 'pool', 'worker'] as const).map((_, j, a) => a[(i + j) % 3] as Way)) {
      const t0 = performance.now();
      await ways[w]();
      t[w].push(performance.now() - t0);
    }
  }
  await worker.close();
  console.log(
    `\noverhead: one RTM_GETLINK by name (lo), kernel idle, ${CALLS} calls each way, interleaved; ms from the call to its answer on the event loop`,
  );
  console.log('way                                      p50       p99       max');
  const label: Record<Way, string> = {
    sync: 'on the event loop (sync)',
    pool: 'libuv pool (koffi .async, the API)',
    worker: 'worker_thread (postMessage)',
  };
  for (const w of ['sync', 'pool', 'worker'] as const) {
    const s = stats(t[w]);
    console.log(`${label[w].padEnd(36)} ${f(s.p50)} ${f(s.p99)} ${f(s.max)}`);
  }
}

async function loopSection(cleanup: Cleanup): Promise<void> {
  console.log(
    `\nloop: lookups back to back during a storm (${PAIRS} pairs deleted by one request); event-loop delay from monitorEventLoopDelay (1 ms resolution); ms`,
  );
  console.log('way                                   lookups  lookup p50  lookup max |  loop p50  loop p99  loop max | storm ms');
  const sk = hostSocket('bench');
  const worker = lookupWorker();
  await worker.lookup('lo');
  for (const way of ['sync', 'pool', 'worker'] as const) {
    const s = await vethStorm(cleanup, PAIRS);
    const h = monitorEventLoopDelay({ resolution: 1 });
    const times: number[] = [];
    let done = false;
    h.enable();
    const running = s.run().then((ms) => {
      done = true;
      return ms;
    });
    await new Promise((r) => setTimeout(r, 20));
    if (way === 'sync') {
      // One lookup per turn of the loop, so that the loop's own timers still get their turn between them.
      while (!done) {
        const t0 = performance.now();
        route.rtnl_link_put(getLink(sk, 'bench', 'lo'));
        times.push(performance.now() - t0);
        await new Promise((r) => setImmediate(r));
      }
    } else {
      const one = way === 'pool' ? () => linkByName('lo') : () => worker.lookup('lo');
      await Promise.all(
        Array.from({ length: 8 }, async () => {
          while (!done) {
            const t0 = performance.now();
            await one();
            times.push(performance.now() - t0);
          }
        }),
      );
    }
    const stormMs = await running;
    h.disable();
    const l = stats(times);
    const ms = (ns: number) => ns / 1e6;
    const label =
      way === 'sync' ? 'on the event loop (sync)' : way === 'pool' ? 'libuv pool (koffi .async, the API)' : 'worker_thread (postMessage)';
    console.log(
      `${label.padEnd(36)} ${String(l.n).padStart(8)}  ${f(l.p50)}  ${f(l.max)} | ${f(ms(h.percentile(50)))} ${f(ms(h.percentile(99)))} ${f(ms(h.max))} | ${stormMs.toFixed(0).padStart(8)}`,
    );
  }
  await worker.close();
}

async function poolSection(): Promise<void> {
  const code = `
    const koffi = require(${JSON.stringify(require.resolve('koffi'))});
    const fs = require('node:fs/promises');
    const usleep = koffi.load('libc.so.6').func('int usleep(unsigned int usec)');
    (async () => {
      await fs.stat('/');
      const out = {};
      for (const held of [0, 2, 4]) {
        const times = [];
        for (let i = 0; i < 20; i++) {
          const holds = Array.from({ length: held }, () => new Promise((r) => usleep.async(50000, () => r())));
          await new Promise((r) => setTimeout(r, 2));
          const t0 = performance.now();
          await fs.stat('/');
          times.push(performance.now() - t0);
          await Promise.all(holds);
        }
        times.sort((a, b) => a - b);
        out[held] = { p50: times[10], max: times[19] };
      }
      console.log(JSON.stringify(out));
    })();`;
  const r = await execa(process.execPath, ['-e', code], { env: { ...process.env, UV_THREADPOOL_SIZE: '4' } });
  const out = JSON.parse(r.stdout) as Record<string, { p50: number; max: number }>;
  console.log('\npool: fs.promises.stat with UV_THREADPOOL_SIZE=4 while N pool threads are held by 50 ms calls (20 stats each); ms');
  console.log('held      p50       max');
  for (const [held, s] of Object.entries(out)) console.log(`${held.padStart(4)} ${f(s.p50)} ${f(s.max)}`);
}

async function main(): Promise<void> {
  if (!isRoot) {
    console.error('bench/netlink: needs root (network namespaces, veths, a bridge, tc)');
    process.exit(2);
  }
  const cleanup = new Cleanup();
  const stop = () => void cleanup.run().finally(() => process.exit(130));
  process.on('SIGINT', stop);
  process.on('SIGTERM', stop);
  const { release } = await import('node:os');
  console.log(
    `netlink requests and the event loop (issue 32): kernel ${release()}, node ${process.version}, UV_THREADPOOL_SIZE ${process.env.UV_THREADPOOL_SIZE ?? '(default 4)'}`,
  );
  try {
    if (only.includes('kernel')) await kernelSection(cleanup);
    if (only.includes('overhead')) await overheadSection();
    if (only.includes('loop')) await loopSection(cleanup);
    if (only.includes('pool')) await poolSection();
  } finally {
    await cleanup.run();
  }
}

void main().then(
  () => process.exit(0),
  (err: unknown) => {
    console.error(err);
    process.exit(1);
  },
);
