/**
 * TcSession: one long-lived `tc -batch -`, replaced by a fresh tc after `recycleLines` lines (tc
 * keeps memory for every line it ran). Real tc on a veth pair the test makes in the host namespace
 * under a unique name; no traffic.
 */
import test from 'ava';
import { execa } from 'execa';
import { TcSession } from '../../src/shaper/tc-exec.js';
import { isRoot, uniq } from '../../hack/support/kernel.js';

const kTest = isRoot ? test : test.skip;

const alive = (pid: number | undefined): boolean => {
  if (pid === undefined) return false;
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
};

kTest('a session is replaced between runs after recycleLines lines; line numbers and failures stay right across the switch', async (t) => {
  const dev = `kts${uniq(8)}`;
  await execa('ip', ['link', 'add', dev, 'type', 'veth', 'peer', 'name', `${dev}p`]);
  await execa('ip', ['link', 'set', dev, 'up']);
  await execa('ip', ['link', 'set', `${dev}p`, 'up']);
  const session = new TcSession(10_000, 10);
  t.teardown(async () => {
    session.close();
    await execa('ip', ['link', 'del', dev], { reject: false });
  });
  const bad = `class replace dev ${dev} parent 9: classid 9:1 htb rate 1mbit`; // no qdisc 9: fails
  const pids: Array<number | undefined> = [];
  for (let i = 1; i <= 6; i++) {
    const lines = [...(i === 1 ? [`qdisc add dev ${dev} root handle 1: htb default 1`] : []), `class replace dev ${dev} parent 1: classid 1:1 htb rate ${i}mbit`, bad];
    const r = await session.run(lines, { optional: new Set([lines.length]) });
    t.deepEqual(r.failed, [lines.length], `run ${i}: exactly its own failing line is reported: ${r.stderr}`);
    t.regex((await execa('tc', ['class', 'show', 'dev', dev])).stdout, new RegExp(`class htb 1:1 root .*rate ${i}Mbit`), `run ${i} applied`);
    pids.push(session.pid);
  }
  // Lines with the session's marker: 4, then 3 a run; after run 3 the first tc has run 10, so run 4
  // starts a new one, which runs 9 by the end.
  t.is(session.spawned, 2);
  t.is(pids[0], pids[2]);
  t.not(pids[2], pids[3], 'a fresh tc after the threshold');
  t.is(pids[3], pids[5]);
  await new Promise((r) => setTimeout(r, 100));
  t.false(alive(pids[0]), 'the replaced tc is gone');
  t.true(alive(pids[5]));
});
