/**
 * The shaper's per-pod counters (Shaper.counters(), read over netlink) against the kernel as
 * `tc -s` shows it: each shaped direction is the pod's class (bytes, packets, overlimits, limit)
 * plus its leaves (drops, backlog); unshaped directions and gone devices are left out. Traffic: a
 * few pings and one short UDP burst between the test's own namespaces (no rate is measured).
 */
import test from 'ava';
import { execa } from 'execa';
import { CounterReader, directionCounters } from '../../src/shaper/counters.js';
import type { TcClassStats } from '../../src/netlink/index.js';
import { isRoot } from '../kit/kernel.js';
import type { TopoPod } from '../kit/topo.js';
import { podOf, shaperEnv } from '../kit/shaper-env.js';

const skip = isRoot ? undefined : 'needs root (tc, ifb, network namespaces)';
const kTest = skip ? test.skip : test;

interface TextClass {
  bytes: number;
  packets: number;
  drops: number;
  overlimits: number;
  backlog: number;
}

/** `tc -s class show dev X`, htb classes by id ("2:1"). */
async function tcClasses(dev: string): Promise<Map<string, TextClass>> {
  const out = new Map<string, TextClass>();
  const text = (await execa('tc', ['-s', 'class', 'show', 'dev', dev], { reject: false })).stdout;
  for (const block of text.split(/\n(?=class )/)) {
    const id = /^class htb (\S+)/.exec(block)?.[1];
    const sent = /Sent (\d+) bytes (\d+) pkt \(dropped (\d+), overlimits (\d+)/.exec(block);
    const backlog = /backlog (\d+)b/.exec(block);
    if (id && sent && backlog)
      out.set(id, { bytes: +sent[1]!, packets: +sent[2]!, drops: +sent[3]!, overlimits: +sent[4]!, backlog: +backlog[1]! });
  }
  return out;
}

test('directionCounters: bytes, packets, overlimits and limit of the pod class; drops and backlog summed over its leaves', (t) => {
  const cls = (o: Partial<TcClassStats>): TcClassStats => ({
    handle: 0,
    parent: 0,
    kind: 'htb',
    bytes: 0,
    packets: 0,
    drops: 0,
    overlimits: 0,
    backlog: 0,
    qlen: 0,
    ...o,
  });
  const pod = cls({ bytes: 1000, packets: 10, overlimits: 7, rate: 8e6, ceil: 8e6 });
  t.deepEqual(
    directionCounters(pod, [cls({ drops: 2, backlog: 300, bytes: 100 }), cls({ drops: 5, backlog: 1500, bytes: 900 }), undefined]),
    {
      limit: 8e6,
      bytes: 1000,
      packets: 10,
      drops: 7,
      overlimits: 7,
      backlog: 1800,
    },
  );
  t.is(directionCounters(undefined, [cls({})]), undefined);
});

kTest('counters of each shaped pod and direction equal tc -s of its classes; unshaped directions and other pods apart', async (t) => {
  const env = await shaperEnv(t, 3);
  const [a, b, c] = env.topo.pods as [TopoPod, TopoPod, TopoPod];
  await env.shaper.ensure(podOf(a, { ingress: 40e6, egress: 20e6 }));
  await env.shaper.ensure(podOf(b, { egress: 8e6 }));
  // a <-> c and b -> c: a's both directions, b's egress.
  await execa('ip', ['netns', 'exec', a.netns, 'ping', '-q', '-c', '5', '-i', '0.02', '-s', '1000', '-W', '2', c.ip4]);
  await execa('ip', ['netns', 'exec', b.netns, 'ping', '-q', '-c', '3', '-i', '0.02', '-W', '2', c.ip4]);
  // One netlink read between two tc reads that agree: a stray packet (neighbour discovery) between
  // the reads would make them differ by one; then read again (at most 10 times).
  const snapshot = async () => ({ veth: await tcClasses(a.hostVeth), ifb: await tcClasses(env.ifb) });
  let counters = (await env.shaper.counters()).pods;
  let { veth, ifb } = await snapshot();
  for (let i = 0; i < 10; i++) {
    const before = await snapshot();
    counters = (await env.shaper.counters()).pods;
    ({ veth, ifb } = await snapshot());
    if (JSON.stringify([...before.veth, ...before.ifb]) === JSON.stringify([...veth, ...ifb])) break;
    t.log(`tc counters moved during read ${i + 1}; reading again`);
    await new Promise((r) => setTimeout(r, 100));
  }
  t.deepEqual(counters.map((x) => x.id).sort(), [a.id, b.id].sort(), 'shaped pods only');
  const ca = counters.find((x) => x.id === a.id);
  const cb = counters.find((x) => x.id === b.id);
  t.is(cb?.ingress, undefined, 'b: ingress not shaped');
  const expect = (m: Map<string, TextClass>, pod: string, leaves: string[], limit: number) => ({
    limit,
    bytes: m.get(pod)?.bytes,
    packets: m.get(pod)?.packets,
    overlimits: m.get(pod)?.overlimits,
    drops: [pod, ...leaves].reduce((s, id) => s + (m.get(id)?.drops ?? 0), 0),
    backlog: [pod, ...leaves].reduce((s, id) => s + (m.get(id)?.backlog ?? 0), 0),
  });
  const ida = env.shaper.classIdOf(a.id) ?? 0;
  const idb = env.shaper.classIdOf(b.id) ?? 0;
  const leaves = (id: number) => [id + 0x800, id + 0x1000].map((x) => `1:${x.toString(16)}`);
  t.deepEqual(ca?.ingress, expect(veth, '2:1', ['2:2', '2:3'], 40e6));
  t.deepEqual(ca?.egress, expect(ifb, `1:${ida.toString(16)}`, leaves(ida), 20e6));
  t.deepEqual(cb?.egress, expect(ifb, `1:${idb.toString(16)}`, leaves(idb), 8e6));
  t.true(
    (ca?.egress?.packets ?? 0) >= 5 && (ca?.egress?.bytes ?? 0) >= 5 * 1000,
    `a's requests passed its egress: ${JSON.stringify(ca?.egress)}`,
  );
  t.true(
    (ca?.ingress?.packets ?? 0) >= 5 && (ca?.ingress?.bytes ?? 0) >= 5 * 1000,
    `a's replies passed its ingress: ${JSON.stringify(ca?.ingress)}`,
  );
  t.true((cb?.egress?.packets ?? 0) >= 3 && (cb?.egress?.packets ?? 0) < 5 + 3, "b's counters are its own");

  // A re-shape keeps the classes (and their counters); the new limit is what the kernel reports.
  await env.shaper.ensure(podOf(a, { ingress: 10e6, egress: 20e6 }));
  const after = (await env.shaper.counters()).pods.find((x) => x.id === a.id);
  t.is(after?.ingress?.limit, 10e6);
  t.true((after?.ingress?.bytes ?? 0) >= (ca?.ingress?.bytes ?? Infinity), 'counters survive the re-shape');
  // A direction removed leaves the counters; the pod without limits leaves them entirely.
  await env.shaper.ensure(podOf(a, { egress: 20e6 }));
  t.is((await env.shaper.counters()).pods.find((x) => x.id === a.id)?.ingress, undefined);
  await env.shaper.ensure(podOf(a, {}));
  t.deepEqual(
    (await env.shaper.counters()).pods.map((x) => x.id),
    [b.id],
  );
});

kTest('drops and overlimits count when a burst overruns a small limit; a gone veth leaves the direction out', async (t) => {
  const env = await shaperEnv(t, 2);
  const [a, b] = env.topo.pods as [TopoPod, TopoPod];
  await env.shaper.ensure(podOf(a, { ingress: 1e6, egress: 1e6 }));
  await execa('ip', ['netns', 'exec', a.netns, 'ping', '-c', '1', '-W', '2', b.ip4]);
  // 300 datagrams of 1400 bytes at once: far more than 1 Mbit/s queues (25 ms) in either direction.
  const burst = (from: TopoPod, to: TopoPod) =>
    execa('ip', [
      'netns',
      'exec',
      from.netns,
      process.execPath,
      '-e',
      `const s=require('dgram').createSocket('udp4');let n=0;const go=()=>s.send(Buffer.alloc(1400),9,'${to.ip4}',()=>{if(++n<300)go();else s.close();});go();`,
    ]);
  await burst(a, b);
  await burst(b, a);
  const c = (await env.shaper.counters()).pods.find((x) => x.id === a.id);
  for (const dir of ['ingress', 'egress'] as const) {
    t.true((c?.[dir]?.drops ?? 0) > 0, `${dir}: drops ${c?.[dir]?.drops}`);
    t.true((c?.[dir]?.overlimits ?? 0) > 0, `${dir}: overlimits ${c?.[dir]?.overlimits}`);
    t.is(c?.[dir]?.limit, 1e6);
  }
  await execa('ip', ['link', 'del', a.hostVeth]);
  const gone = (await env.shaper.counters()).pods.find((x) => x.id === a.id);
  t.is(gone?.ingress, undefined, 'the veth is gone: no ingress counters');
  t.truthy(gone?.egress, 'the ifb class is still there until the pod is removed');
});

kTest("a pod taking over idle ifb classes counts from zero, not the earlier pod's traffic; the kernel's own counters go on", async (t) => {
  const env = await shaperEnv(t, 3);
  const [a, b, c] = env.topo.pods as [TopoPod, TopoPod, TopoPod];
  await env.shaper.ensure(podOf(a, { egress: 20e6 }));
  const id = env.shaper.classIdOf(a.id);
  await execa('ip', ['netns', 'exec', a.netns, 'ping', '-q', '-c', '10', '-i', '0.02', '-s', '1000', '-W', '2', c.ip4]);
  const aEgress = (await env.shaper.counters()).pods.find((x) => x.id === a.id)?.egress;
  t.true((aEgress?.packets ?? 0) >= 10, `a sent through its class: ${JSON.stringify(aEgress)}`);
  await env.shaper.remove(a.id);
  t.is(env.shaper.idleClasses(), 1);
  await env.shaper.ensure(podOf(b, { egress: 10e6 }));
  t.is(env.shaper.classIdOf(b.id), id, "b took a's idle classes");
  t.is(env.shaper.idleClasses(), 0);
  const kernel = (await tcClasses(env.ifb)).get(`1:${(id ?? 0).toString(16)}`);
  t.true((kernel?.packets ?? 0) >= (aEgress?.packets ?? 1), `the kernel's class still counts a's packets: ${JSON.stringify(kernel)}`);
  t.like(
    (await env.shaper.counters()).pods.find((x) => x.id === b.id)?.egress,
    { limit: 10e6, bytes: 0, packets: 0, drops: 0 },
    'b starts from zero',
  );
  await execa('ip', ['netns', 'exec', b.netns, 'ping', '-q', '-c', '3', '-i', '0.02', '-s', '500', '-W', '2', c.ip4]);
  const bEgress = (await env.shaper.counters()).pods.find((x) => x.id === b.id)?.egress;
  const after = (await tcClasses(env.ifb)).get(`1:${(id ?? 0).toString(16)}`);
  t.is(bEgress?.packets, (after?.packets ?? 0) - (kernel?.packets ?? 0), "b's packets: the kernel's since b took the class");
  t.true(
    (bEgress?.packets ?? 0) >= 3 && (bEgress?.packets ?? 0) <= 6,
    `b's own pings (and at most a neighbour probe or two): ${JSON.stringify(bEgress)}`,
  );
  // The base is part of the state the caller keeps: a restarted shaper counts from the same point.
  const again = new (await import('../../src/shaper/tc.js')).Shaper({ ifbName: env.ifb });
  t.teardown(() => again.close());
  env.shaper.close();
  await again.init(env.shaper.states());
  t.is((await again.counters()).pods.find((x) => x.id === b.id)?.egress?.packets, bEgress?.packets, 'after a restart too');
});

kTest(
  'a read asks the kernel again only for what can have changed: idle pods cost the link dump alone, traffic re-reads its veth and the ifb, a re-shape its classes',
  async (t) => {
    const env = await shaperEnv(t, 3);
    const [a, b, c] = env.topo.pods as [TopoPod, TopoPod, TopoPod];
    await env.shaper.ensure(podOf(a, { ingress: 40e6, egress: 20e6 }));
    await env.shaper.ensure(podOf(b, { ingress: 30e6, egress: 8e6 }));
    const reader = new CounterReader();
    t.teardown(() => reader.close());
    const read = async () => (await reader.read(env.shaper.states(), () => env.ifb)).pods;
    type Pods = Awaited<ReturnType<typeof read>>;
    /**
     * The incremental read against a read of everything. A packet may land between the two reads
     * (a late reply, an IPv6 neighbour probe): then both read again, up to 5 times. A reader that
     * kept a stale figure stays behind the fresh one on every try.
     */
    const sameAsFresh = async (mine: Pods, again: () => Promise<Pods>) => {
      const everything = async () => {
        const other = new CounterReader();
        try {
          return (await other.read(env.shaper.states(), () => env.ifb)).pods;
        } finally {
          other.close();
        }
      };
      let fresh = await everything();
      for (let i = 0; i < 5 && JSON.stringify(mine) !== JSON.stringify(fresh); i++) {
        mine = await again();
        fresh = await everything();
      }
      return { mine, fresh };
    };
    const first = await read();
    t.deepEqual(reader.lastWork(), { classGets: 6, ifbDumps: 1 }, "first read: both veths' classes by handle, the ifb dumped");
    // Nothing moves on these devices now, but for the kernel's own IPv6 chatter (router
    // solicitations, MLD reports) in the first seconds of a veth: a read during it re-reads what moved...
    const busy = () => reader.lastWork().ifbDumps > 0 || reader.lastWork().classGets > 0;
    let idle = await read();
    for (let i = 0; i < 20 && busy(); i++) {
      await new Promise((r) => setTimeout(r, 250));
      idle = await read();
    }
    t.deepEqual(reader.lastWork(), { classGets: 0, ifbDumps: 0 }, 'idle: nothing asked beyond the link dump');
    const same = await sameAsFresh(idle, read);
    t.deepEqual(same.mine, same.fresh, 'the same figures as a read of everything');
    t.is(idle.length, first.length);
    // ...a's traffic moves a's veth and the ifb (and b's veth, when ARP's broadcasts reach it).
    await execa('ip', ['netns', 'exec', a.netns, 'ping', '-q', '-c', '3', '-i', '0.02', '-W', '2', c.ip4]);
    const after = await read();
    const work = reader.lastWork();
    t.true(
      work.ifbDumps === 1 && work.classGets >= 3 && work.classGets <= 6,
      `a's veth classes again (b's if it saw a broadcast), the ifb dumped: ${JSON.stringify(work)}`,
    );
    const again = await sameAsFresh(after, read);
    t.deepEqual(again.mine, again.fresh, 'the same figures as a read of everything');
    t.true((again.mine.find((x) => x.id === a.id)?.ingress?.packets ?? 0) >= 3, "a's replies counted");
    // A re-shape changes the kernel's rate with no traffic: that pod's classes are asked again.
    await read();
    await env.shaper.ensure(podOf(b, { ingress: 10e6, egress: 4e6 }));
    const reshaped = (await read()).find((x) => x.id === b.id);
    t.true(reader.lastWork().classGets >= 3, `b's classes asked again: ${JSON.stringify(reader.lastWork())}`);
    t.is(reshaped?.ingress?.limit, 10e6);
    t.is(reshaped?.egress?.limit, 4e6);
  },
);
