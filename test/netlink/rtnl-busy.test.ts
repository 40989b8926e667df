/**
 * The netlink layer and the agent while the kernel's RTNL lock is busy (issue 32): many veth pairs
 * of a namespace of the test's own, each with qdiscs as a shaped pod's, deleted by one request (the
 * kernel unregisters them all under the lock: tens of milliseconds), while this process makes
 * requests.
 *
 * What is asserted is what a blocking call could never show, not how long anything took (that is
 * bench/cni's): the event loop ran while a request was waiting on the kernel, every answer is right
 * (no socket served two requests at once), and in the agent /healthz answered while its own kernel
 * requests were outstanding. Root only; every link is in the test's own namespaces, removed even on
 * failure.
 */
import test, { type ExecutionContext } from 'ava';
import { AgentHarness, agentTestBlocker } from '../kit/agent-harness.js';
import { Cleanup, kernelTestBlocker, vethStorm } from '../kit/kernel.js';
import type { TestPod } from '../kit/test-pod.js';
import { linkByIndex, linkByName, linkList, netlinkCallsInFlight, type LinkInfo } from '../../src/netlink/index.js';

const blocker = kernelTestBlocker();
const kTest = blocker ? test.serial.skip : test.serial;
const agentBlocker = blocker ?? agentTestBlocker();
const agentTest = agentBlocker ? test.serial.skip : test.serial;
if (agentBlocker) console.warn(`SKIPPING RTNL-busy tests: ${agentBlocker}`);

/** Veth pairs deleted in one storm, by one request for their group. */
const PAIRS = 128;
/** How many ADD/DEL cycles the /healthz case runs at most for one answer to overlap the agent's kernel requests. */
const MAX_CYCLES = 3;

/**
 * Counts turns of the event loop while `busy()` says a kernel request is outstanding, from now until
 * `stop()`. A blocking call lets no turn run while it waits: this count would stay 0.
 */
function loopTicker(busy: () => boolean): { stop(): { turns: number; turnsWhileBusy: number } } {
  let turns = 0;
  let turnsWhileBusy = 0;
  let stopped = false;
  const tick = () => {
    if (stopped) return;
    turns++;
    if (busy()) turnsWhileBusy++;
    setImmediate(tick);
  };
  setImmediate(tick);
  return {
    stop: () => {
      stopped = true;
      return { turns, turnsWhileBusy };
    },
  };
}

async function withCleanup(t: ExecutionContext): Promise<Cleanup> {
  const cleanup = new Cleanup();
  t.teardown(() => cleanup.run());
  return cleanup;
}

kTest('requests wait on the kernel off the event loop: the loop turns meanwhile, every answer is right', async (t) => {
  const cleanup = await withCleanup(t);
  const storm = await vethStorm(cleanup, PAIRS);
  const lo = await linkByName('lo');
  let pending = 0;
  const ticker = loopTicker(() => pending > 0);
  let stormDone = false;
  const deleting = storm.run().finally(() => (stormDone = true));
  const answers: LinkInfo[] = [];
  let rounds = 0;
  // Requests one after another and many at once, for as long as the storm lasts.
  while (!stormDone) {
    pending++;
    try {
      const batch = await Promise.all([linkByName('lo'), linkByIndex(lo.index), ...Array.from({ length: 8 }, () => linkByName('lo'))]);
      answers.push(...batch);
      const all = await linkList();
      t.true(
        all.some((l) => l.index === lo.index && l.name === 'lo'),
        'lo in the dump',
      );
    } finally {
      pending--;
    }
    rounds++;
  }
  await deleting;
  const { turns, turnsWhileBusy } = ticker.stop();
  t.log(`${rounds} rounds of requests during the storm; the loop turned ${turns} times, ${turnsWhileBusy} of them while a request waited`);
  t.true(rounds > 0);
  for (const a of answers)
    t.deepEqual({ name: a.name, index: a.index, loopback: a.loopback }, { name: 'lo', index: lo.index, loopback: true });
  t.true(turnsWhileBusy > 0, 'the event loop turned while requests waited on the kernel');
  t.is(netlinkCallsInFlight(), 0, 'nothing left outstanding');
});

agentTest("the agent answers /healthz while its own kernel requests wait, during pods' ADDs and DELs under an RTNL storm", async (t) => {
  const cleanup = await withCleanup(t);
  const h = await new AgentHarness().setup('10.93.32.0/24');
  cleanup.add(() => h.cleanup.run());
  await h.startAgent();
  const pods: TestPod[] = [];
  for (let i = 0; i < 8; i++) pods.push(await h.addPod(`b${i}`));

  let health = 0;
  let healthWhileBusy = 0;
  const failures: string[] = [];
  let polling = true;
  const poller = (async () => {
    while (polling) {
      const r = await h.get('/healthz');
      health++;
      if (r.status !== 200) failures.push(`${r.status} ${r.body}`);
      else if (netlinkCallsInFlight() > 0) healthWhileBusy++;
    }
  })();
  const ticker = loopTicker(() => netlinkCallsInFlight() > 0);
  // On 2 cores the storm and the pods' requests do not always overlap with a /healthz answer: the
  // cycle (ADDs, then DELs, each beside a storm) runs again until one did, up to MAX_CYCLES times.
  // Every answer of every cycle must still be 200.
  let cycles = 0;
  try {
    while (cycles < MAX_CYCLES && (cycles === 0 || healthWhileBusy === 0)) {
      cycles++;
      const storms = { add: await vethStorm(cleanup, PAIRS), del: await vethStorm(cleanup, PAIRS) };
      for (const cmd of ['add', 'del'] as const) {
        const [, ...results] = await Promise.all([storms[cmd].run(), ...pods.map((p) => h.libcni(cmd, p))]);
        for (const [i, r] of results.entries()) t.is(r.exitCode, 0, `${cmd} ${pods[i]?.name}: ${r.stderr}`);
      }
    }
  } finally {
    polling = false;
    await poller;
  }
  const { turnsWhileBusy } = ticker.stop();
  t.log(
    `${health} /healthz answers over ${cycles} cycle(s), ${healthWhileBusy} while the agent's kernel requests were outstanding; ${turnsWhileBusy} loop turns meanwhile`,
  );
  t.deepEqual(failures, [], 'every /healthz answered 200');
  t.true(healthWhileBusy > 0, "/healthz answered while the agent's kernel requests were outstanding");
  t.true(turnsWhileBusy > 0);
  t.deepEqual((await h.get('/v1/status')).status, 200);
});
