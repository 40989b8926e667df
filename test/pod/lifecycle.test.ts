/**
 * The pod lifecycle's rules (src/pod/lifecycle/add.ts, del.ts, sweep.ts), without root: the core over fakes
 * of the kernel, the address modes and the shaper (test/kit/fake-pod-core.ts), the real pod store in
 * a temporary directory. What the e2e suites show on the real kernel, here step by step: the record
 * before the plugin, the undo of every failure, DEL's idempotence, the mode that undoes a record,
 * the startup reconcile and the sweep.
 */
import test from 'ava';
import { ConflictError, UnknownPodError } from '../../src/errors.js';
import { setUp } from '../../src/pod/lifecycle/add.js';
import { releaseUnknown, teardown } from '../../src/pod/lifecycle/del.js';
import { checkAttached } from '../../src/pod/lifecycle/inspect.js';
import { NetnsError } from '../../src/pod/netns.js';
import { PendingAdds } from '../../src/pod/lifecycle/pending-adds.js';
import { recordKey, type PodRecord } from '../../src/pod/records/record.js';
import { reconcile, sweep } from '../../src/pod/lifecycle/sweep.js';
import { attachRequest, DHCP_NET, fakePodCore, HOST_LOCAL_NET, InjectedError, netnsIdOf } from '../kit/fake-pod-core.js';

type World = ReturnType<typeof fakePodCore>;

async function withCore(o: Parameters<typeof fakePodCore>[0], fn: (w: World) => Promise<void>): Promise<void> {
  const w = fakePodCore(o);
  try {
    await fn(w);
  } finally {
    w.cleanup();
  }
}

const add = (w: World, name: string, o: Parameters<typeof attachRequest>[1] = {}) =>
  setUp(w.core, attachRequest(name, o), netnsIdOf(name), w.core.requireReady('').conf);
const log = (w: World) => w.core.log;

test('the record of the intent is written before the plugin runs, then completed with the result', async (t) => {
  let seen: PodRecord | undefined;
  let w: World | undefined;
  await withCore({ beforeAdd: (rt) => (seen = structuredClone(w?.core.store.get(rt.containerId, rt.ifName))) }, async (world) => {
    w = world;
    const { record, repeated } = await add(world, 'web', { limits: { egress: 10_000_000 } });
    t.is(seen?.phase, 'adding', 'the plugin ran with the record already saying adding');
    t.deepEqual(seen?.limits, { egress: 10_000_000 }, 'with the limits the ADD will install');
    t.false(repeated);
    t.is(record.phase, 'ready');
    t.deepEqual(world.core.store.get('web-id', 'eth0'), record, 'the store holds the finished record');
    t.regex(record.hostVeth ?? '', /^veth\d+$/);
    t.deepEqual(record.ips, ['10.0.0.5']);
    t.like(record.shaping, { id: 'web-id', hostVeth: record.hostVeth });
    t.deepEqual(
      world.only('hl.', 'kernel.ensureBridge', 'shaper.'),
      ['hl.precheck default/web', 'kernel.ensureBridge', 'hl.add web-id', `shaper.ensure web-id ${record.hostVeth}`],
      'precheck, bridge, plugin, shaping: in that order',
    );
    t.is(world.core.pending.size, 0, 'nothing pending after the ADD');
  });
});

test("allocated beside the exec: the egress side is shaped before the plugin's veth exists, the veth's side once the plugin asked its IPAM, before the exec ends; shaped once each", async (t) => {
  await withCore({ prefetch: true }, async (w) => {
    const { record } = await add(w, 'web', { limits: { egress: 10_000_000, ingress: 20_000_000 } });
    t.deepEqual(record.ips, ['10.0.0.5'], 'the address the mode allocated beside the exec');
    t.deepEqual(w.only('hl.add', 'shim.', 'shaper.'), [
      'hl.add web-id',
      'shaper.ensure web-id (ifb side)',
      'shim.ipamAsked web-id',
      `shaper.ensure web-id ${record.hostVeth}`,
    ]);
    t.like(record.shaping, { hostVeth: record.hostVeth });
    t.is(w.core.pending.size, 0);
  });
});

/** Each step of an ADD that can fail after its record is written, and the call that fails it. */
const FAILING_STEPS: Array<{ step: string; o?: Parameters<typeof fakePodCore>[0]; limits?: { egress?: number; ingress?: number } }> = [
  { step: 'kernel.ensureBridge' },
  { step: 'loopback.add', o: { manageLoopback: true } },
  { step: 'hl.add' },
  { step: 'shaper.ensure', limits: { ingress: 5_000_000 } },
  { step: 'shaper.ensure', limits: { egress: 5_000_000 }, o: { prefetch: true } },
];

for (const { step, o, limits } of FAILING_STEPS) {
  test(`an ADD failing at ${step}${o?.prefetch ? ' (allocated beside the exec)' : ''} is undone whole: every teardown step ran, the record went, nothing pending`, async (t) => {
    await withCore(o ?? {}, async (w) => {
      w.j.failAt.add(step);
      const err = await t.throwsAsync(add(w, 'web', limits ? { limits } : {}));
      t.true(err instanceof InjectedError && err.step === step, `the ADD's own failure is what the caller sees: ${String(err)}`);
      t.is(w.core.store.get('web-id', 'eth0'), undefined, 'the record went with the undo');
      t.is(w.core.pending.size, 0);
      t.deepEqual(
        w.only('hl.releaseBeforeVeth', 'hl.del', 'kernel.deletePodVeth', 'shaper.remove'),
        ['hl.releaseBeforeVeth web-id', 'shaper.remove', 'kernel.deletePodVeth web-id', 'hl.del web-id'].map((c) =>
          c === 'shaper.remove' ? 'shaper.remove web-id' : c,
        ),
        "the teardown ran every step, the plugins' DEL after the veth and the shaping",
      );
      t.is(w.kernel.veths.size, 0, 'no veth left');
      const i = w.j.calls.indexOf(`hl.del web-id`);
      t.true(i > w.j.calls.findIndex((c) => c.startsWith(step)), 'the undo came after the failure');
    });
  });
}

test("a failure before the record (the mode's precheck, an interface already in the netns) changes nothing and undoes nothing", async (t) => {
  await withCore({}, async (w) => {
    w.j.failAt.add('hl.precheck');
    await t.throwsAsync(add(w, 'web'), { instanceOf: InjectedError });
    w.j.failAt.clear();
    w.kernel.inPod.set('/run/netns/api/eth0', 7);
    await t.throwsAsync(add(w, 'api'), { instanceOf: NetnsError, message: /already has an interface eth0 that kubenet did not make/ });
    t.deepEqual(w.core.store.all(), []);
    t.deepEqual(w.only('hl.del', 'hl.add', 'kernel.deletePodVeth', 'shaper.'), [], 'no plugin, no teardown');
  });
});

test('an undo that fails keeps the record (adding) for the DEL, which finishes it', async (t) => {
  await withCore({}, async (w) => {
    w.j.failAt.add('hl.add');
    w.j.failAt.add('hl.del');
    const err = await t.throwsAsync(add(w, 'web'));
    t.true(err instanceof InjectedError && err.step === 'hl.add', "the caller sees the ADD's failure, not the undo's");
    t.is(w.core.store.get('web-id', 'eth0')?.phase, 'adding', "the record stays for the runtime's DEL");
    w.j.failAt.clear();
    const rec = w.core.store.get('web-id', 'eth0');
    if (!rec) return;
    await teardown(w.core, rec, log(w));
    t.is(w.core.store.get('web-id', 'eth0'), undefined);
  });
});

test('DEL: every step runs even after one fails, the record stays until all succeed; a repeated DEL finds nothing and runs no plugin', async (t) => {
  await withCore({}, async (w) => {
    const { record } = await add(w, 'web');
    w.j.failAt.add('kernel.deletePodVeth');
    w.j.calls.length = 0;
    await t.throwsAsync(teardown(w.core, record, log(w)), { message: /teardown of pod default\/web/ });
    t.deepEqual(
      w.only('hl.', 'kernel.deletePodVeth', 'shaper.remove'),
      ['hl.releaseBeforeVeth web-id', 'shaper.remove web-id', 'kernel.deletePodVeth web-id', 'hl.del web-id'],
      "the plugins' DEL ran despite the veth step",
    );
    t.is(w.core.store.get('web-id', 'eth0')?.phase, 'ready', 'the record stays for the retry');
    w.j.failAt.clear();
    await teardown(w.core, record, log(w));
    t.is(w.core.store.get('web-id', 'eth0'), undefined);
    w.j.calls.length = 0;
    // The runtime's second DEL (Stop, then Remove): no record, nothing held for the ID.
    await releaseUnknown(w.core, 'web-id', 'eth0', [], log(w));
    t.deepEqual(w.only('hl.', 'dhcp.', 'kernel.', 'shaper.'), [], 'no plugin runs for an attachment nothing holds');
  });
});

test('ADD is idempotent per attachment: the same parameters return the recorded result; other ones are refused without touching it', async (t) => {
  await withCore({}, async (w) => {
    const first = await add(w, 'web', { limits: { egress: 1_000_000 } });
    w.j.calls.length = 0;
    const again = await add(w, 'web', { limits: { egress: 1_000_000 } });
    t.true(again.repeated);
    t.deepEqual(again.result, first.result);
    await t.throwsAsync(add(w, 'web', { limits: { egress: 2_000_000 } }), { instanceOf: ConflictError, message: /bandwidth limits/ });
    t.deepEqual(w.j.calls, [], 'neither ran a plugin, touched the kernel or the shaper');
    t.deepEqual(w.core.store.get('web-id', 'eth0'), first.record);
  });
});

test('an earlier ADD of the attachment that never finished is undone before the new one runs', async (t) => {
  await withCore({}, async (w) => {
    w.j.failAt.add('hl.add');
    w.j.failAt.add('hl.del');
    await t.throwsAsync(add(w, 'web'));
    w.j.failAt.clear();
    w.j.calls.length = 0;
    const { record } = await add(w, 'web');
    t.is(record.phase, 'ready');
    const calls = w.only('hl.del', 'hl.add');
    t.deepEqual(calls, ['hl.del web-id', 'hl.add web-id'], "the old attempt's DEL first");
  });
});

test('a record is undone by the mode of its own network, whatever mode is in force by then, even when the node changes modes mid-ADD', async (t) => {
  let w: World | undefined;
  await withCore({ beforeAdd: () => w && (w.node.current = w.dhcp) }, async (world) => {
    w = world;
    // The ADD starts under host-local; while its plugin runs, the node turns to dhcp; the ADD fails after.
    world.j.failAt.add('shaper.ensure');
    await t.throwsAsync(add(world, 'web', { limits: { ingress: 1_000_000 } }), { instanceOf: InjectedError });
    t.deepEqual(world.only('hl.del', 'dhcp.del'), ['hl.del web-id'], "host-local's DEL for a host-local record");
  });
  await withCore({ current: 'dhcp' }, async (world) => {
    const { record } = await add(world, 'lan');
    t.deepEqual(record.network, DHCP_NET);
    world.node.current = world.hl; // the node went back to host-local
    world.j.calls.length = 0;
    await teardown(world.core, record, log(world));
    t.deepEqual(world.only('hl.', 'dhcp.'), ['dhcp.releaseBeforeVeth lan-id', 'dhcp.del lan-id'], 'the dhcp record released by dhcp');
    t.notDeepEqual(record.network, HOST_LOCAL_NET);
  });
});

test("the pending ADDs: the shim's request answers with the allocation and wakes the ADD, before or after it waits; an ADD per key; end forgets it", async (t) => {
  const pending = new PendingAdds();
  const a = pending.begin('c1@eth0');
  t.throws(() => pending.begin('c1@eth0'), { message: /already running/ });
  t.true(pending.has('c1@eth0'));
  t.deepEqual(pending.keys(), ['c1@eth0']);
  t.is(a.ipamAsked(), undefined, 'no allocation: the shim is refused by the caller');
  await a.whenIpamAsked(); // asked before the wait: resolves at once
  const b = pending.begin('c2@eth0');
  const alloc = Promise.resolve({ cniVersion: '1.0.0', interfaces: [], ips: [], routes: [], dns: {} });
  b.prefetch(alloc);
  let woke = false;
  const waiting = b.whenIpamAsked().then(() => (woke = true));
  t.is(pending.get('c2@eth0')?.ipamAsked(), alloc);
  t.false(woke, 'woken on a later turn, after the answer goes out');
  await waiting;
  t.true(woke);
  a.end();
  b.end();
  t.is(pending.size, 0);
  t.is(pending.get('c2@eth0'), undefined);
});

test('a running ADD is not undone by the reconcile or GC, and its veth is not swept', async (t) => {
  await withCore({}, async (w) => {
    // A veth on the bridge that no record names, while an ADD is pending: kept.
    w.kernel.veths.set('vethstray', { index: 55, peer: '/run/netns/x/eth0' });
    const running = w.core.pending.begin(recordKey('busy-id', 'eth0'));
    await sweep(w.core, new Set());
    t.true(w.kernel.veths.has('vethstray'), 'an ADD may be making this very veth');
    running.end();
    await sweep(w.core, new Set());
    t.false(w.kernel.veths.has('vethstray'), 'swept once no ADD runs');
    t.deepEqual(w.only('kernel.deleteVeth'), ['kernel.deleteVeth 55']);
  });
});

test('the startup reconcile: an unfinished ADD is undone, a pod whose netns and veth are gone is removed, one whose veth is still there is kept', async (t) => {
  await withCore({}, async (w) => {
    const kept = (await add(w, 'kept')).record;
    const gone = (await add(w, 'gone')).record;
    const half = (await add(w, 'half')).record;
    w.core.store.put({ ...half, phase: 'adding' });
    // Both the netns and the veth of `gone` went; only the netns path of `kept` vanished.
    w.kernel.goneNetns.add(gone.netns);
    w.kernel.goneNetns.add(kept.netns);
    for (const [name, v] of w.kernel.veths) if (v.peer.startsWith(gone.netns)) w.kernel.veths.delete(name);
    w.j.calls.length = 0;
    await reconcile(w.core);
    t.deepEqual(
      w.core.store.all().map((r) => r.name),
      ['kept'],
    );
    t.deepEqual(w.only('hl.del').sort(), ['hl.del gone-id', 'hl.del half-id']);
  });
});

test("the startup reconcile re-shapes every live shaped pod with its namespace (a namespace's total keeps its pods under its class)", async (t) => {
  await withCore({}, async (w) => {
    const { record } = await add(w, 'web', { limits: { egress: 10_000_000, egressTotal: 50_000_000 } });
    w.j.calls.length = 0;
    await reconcile(w.core);
    t.deepEqual(w.only('shaper.reconcile'), [`shaper.reconcile web-id@${record.namespace}`]);
  });
});

test('the startup reconcile drops the shaping state of a pod the shaper no longer shapes (a start without the capacity), so no later start adopts tc objects that are gone', async (t) => {
  await withCore({}, async (w) => {
    const { record } = await add(w, 'web', { limits: { egress: 10_000_000 } });
    t.truthy(record.shaping);
    // As an agent with a capacity left it for a pod that asked for nothing: a state, and limits this shaper does not want.
    w.core.store.put({ ...record, limits: {} });
    w.j.calls.length = 0;
    await reconcile(w.core);
    t.deepEqual(w.only('shaper.reconcile'), ['shaper.reconcile'], 'nothing to shape: its state removed from the shaper');
    const after = w.core.store.get(record.containerId, record.ifName);
    t.is(after?.phase, 'ready');
    t.is(after?.shaping, undefined, 'and from its record');
  });
});

test('CHECK: the mode of the record checks the attachment, host ports their rules, a shaped pod its shaping; unknown, other netns and lost shaping are errors', async (t) => {
  await withCore({}, async (w) => {
    const { record } = await add(w, 'web', {
      limits: { egress: 1_000_000 },
      portMappings: [{ hostPort: 8080, containerPort: 80, protocol: 'tcp' }],
    });
    w.j.calls.length = 0;
    await checkAttached(w.core, { containerId: 'web-id', ifName: 'eth0', netns: record.netns }, netnsIdOf('web'));
    t.deepEqual(w.only('hl.check', 'kernel.checkHostPorts'), ['hl.check', 'kernel.checkHostPorts 8080']);
    await t.throwsAsync(checkAttached(w.core, { containerId: 'nope', ifName: 'eth0', netns: record.netns }, netnsIdOf('web')), {
      instanceOf: UnknownPodError,
    });
    await t.throwsAsync(checkAttached(w.core, { containerId: 'web-id', ifName: 'eth0', netns: '/run/netns/other' }, netnsIdOf('other')), {
      instanceOf: NetnsError,
    });
    w.shaperStates.delete('web-id');
    await t.throwsAsync(checkAttached(w.core, { containerId: 'web-id', ifName: 'eth0', netns: record.netns }, netnsIdOf('web')), {
      message: /bandwidth limits are recorded but not installed/,
    });
  });
});
