/**
 * Churn with crashes (issue 9): pods set up and torn down through libcni, 8 at a time, a third of
 * them shaped (half of those with containerd's burst 4294967295, "none given"), a fifth with a host
 * port, DEL twice (Stop, then Remove with an empty CNI_NETNS), while the agent is SIGKILLed at
 * random moments and while an ADD is in flight, restarted each time with the same config; the
 * runtime retries as containerd does (test/kit/churn.ts). Checked: no address is ever handed to
 * a pod while another pod that is up holds it; every ADD's address is in the pod CIDR and on the
 * pod's eth0; no failure but those the agent's death explains; at the end nothing of any pod is
 * left: addresses, veths, tc classes/filters on the ifb, qdiscs on veths, host-port nat rules,
 * libcni cache entries, the agent's records and shaper state, pods the agent lists.
 *
 * Plugins die with the agent (the plugin spawner kills their process groups), so no plugin of a
 * killed agent acts after the next one started: nothing is left right after the churn, and a final
 * agent restart's startup sweep finds nothing to remove either. Both are asserted.
 *
 * Everything runs in a NodeSandbox (its own node netns: iptables, the bridge and the ifb are the
 * sandbox's); pod netns are made with `ip netns add` (prefix kch). Sends no traffic.
 */
import anyTest, { type ExecutionContext, type TestFn } from 'ava';
import { randomInt } from 'node:crypto';
import { readFile } from 'node:fs/promises';
import { join } from 'node:path';
import { agentGet } from '../../src/daemon/protocol.js';
import { startFlagsAgent, startManifestAgent, type AgentProcess, type ManifestSettings } from '../kit/agent-process.js';
import { Churn, leftoversAcrossRestart, logEntries, percentile, sumSweeps, SWEEP_MSG, type ChurnReport } from '../kit/churn.js';
import { uniq } from '../kit/kernel.js';
import { linesRepeatingKeys } from '../kit/log-lines.js';
import { withTrafficLock } from '../kit/traffic-lock.js';
import { countLeftovers, describeLeftovers, NO_LEFTOVERS, type NodeLayout } from '../kit/node-leaks.js';
import type { NodeSandbox } from '../kit/node-sandbox.js';
import { LIBCNI_DEFAULT_CACHE_DIR, SandboxLibcni, SandboxWorld, sandboxTestBlocker } from '../kit/sandbox-libcni.js';

const blocker = sandboxTestBlocker();
const test = anyTest as TestFn;
const serialTest = blocker ? test.serial.skip : test.serial;
if (blocker) console.warn(`churn e2e skipped: ${blocker}`);

const UNDO_MSG = /^undoing an ADD that never finished$/;
const RELEASED_UNKNOWN_MSG = /^released what an unknown attachment still held$/;

/**
 * A /27: 29 addresses for 8 pods in flight, so host-local hands every address out again every ~30
 * ADDs and an address still held by a pod that is up (or freed too early) would be handed out twice.
 */
function podCidr(): string {
  return `10.${randomInt(100, 200)}.${randomInt(256)}.${32 * randomInt(8)}/27`;
}

/**
 * The churn against a running agent, then the final checks: leftovers right after it (printed), a
 * final restart (what its sweep removed, printed), leftovers after it (none allowed), the figures.
 */
async function churnAndCheck(
  t: ExecutionContext,
  what: string,
  sb: NodeSandbox,
  agent: AgentProcess,
  settings: ManifestSettings,
  libcni: SandboxLibcni,
  cidr: string,
  opts: { cycles: number; kills: number },
): Promise<void> {
  const layout: NodeLayout = {
    bridgeName: settings.bridgeName,
    ifbName: settings.ifbName,
    ipamDataDir: settings.ipamDataDir,
    stateDir: settings.stateDir,
    runtimeCacheDir: libcni.cacheDir,
  };
  const churn = new Churn(
    { sb, agent, libcni, podCidr: cidr, stateDir: settings.stateDir },
    { cycles: opts.cycles, kills: opts.kills, concurrency: 8, netnsPrefix: `kch${uniq(5)}`, log: (m) => t.log(m) },
  );
  const r: ChurnReport = await churn.run();
  const { afterChurn, exitCode, finalSweep, final } = await leftoversAcrossRestart(sb, agent, layout);
  t.is(exitCode, 0, 'the agent exits 0 on SIGTERM before the final start');
  const status = JSON.parse((await agentGet(sb.hostPath(settings.socket), '/v1/status')).body) as { pods: unknown[] };

  const allSweeps = await logEntries(agent.logFile, 0, SWEEP_MSG);
  const undone = (await logEntries(agent.logFile, 0, UNDO_MSG)).length;
  // DELs of attachments without a record that ran the plugins: every second DEL of a host-port pod
  // (libcni passes its portMappings on DEL too), and any DEL that found an address still reserved
  // for a recordless container ID (a plugin that outlived a killed agent).
  const releasedUnknown = await logEntries(agent.logFile, 0, RELEASED_UNKNOWN_MSG);
  const releasedAddresses = releasedUnknown.filter((e) => e.address === true).length;
  const fmt = (xs: number[]) => `p50 ${percentile(xs, 50).toFixed(0)} ms, p99 ${percentile(xs, 99).toFixed(0)} ms`;
  t.log(
    [
      `${what}: ${r.cycles} cycles in ${(r.durationMs / 1000).toFixed(1)} s (${(r.cycles / (r.durationMs / 1000)).toFixed(1)} cycles/s), up to ${r.maxPodsUp} pods up at once`,
      `  calls: ${r.addCalls} ADD (${fmt(r.addMs)}), ${r.delCalls} DEL (${fmt(r.delMs)}), ${r.checkCalls} CHECK`,
      `  kills: ${r.kills.length}, landed mid-ADD: ${r.killsMidAdd} (ADDs in flight at the kills: ${r.kills.map((k) => k.addingRecords).join(' ')}; plugins still running after them: ${r.kills.map((k) => k.pluginsAlive).join(' ')}; calls cut: ${r.kills.map((k) => `${k.callsCut.add}/${k.callsCut.del}/${k.callsCut.check}`).join(' ')} ADD/DEL/CHECK; restarts ${r.kills.map((k) => (k.restartMs / 1000).toFixed(1)).join(' ')} s)`,
      `  retries: ADD ${r.addRetries.newId + r.addRetries.sameId} (new ID ${r.addRetries.newId}, same ID ${r.addRetries.sameId}), DEL ${r.delRetries}, CHECK ${r.checkRetries}; failures: try again later (code 11) ${r.failuresTryAgainLater}, cut by a kill ${r.failuresCut}, other ${r.unexpected.length}; same-ID retries refused for an eth0 a plugin of a killed agent made: ${r.outlivedPlugins.length}${r.outlivedPlugins.map((o) => `\n    ${o}`).join('')}`,
      `  unfinished ADDs undone by startup reconciles: ${undone}; recordless DELs that ran the plugins: ${releasedUnknown.length} (holding an address: ${releasedAddresses}); startup sweeps that removed something: ${allSweeps.length} (${JSON.stringify(sumSweeps(allSweeps))})`,
      `  left right after the churn: ${countLeftovers(afterChurn)}${countLeftovers(afterChurn) > 0 ? `\n${describeLeftovers(afterChurn)}` : ''}`,
      `  the final restart's sweep removed: ${JSON.stringify(finalSweep)}; leaks after it: ${countLeftovers(final)}`,
    ].join('\n'),
  );
  if (countLeftovers(afterChurn) > 0) {
    // What the agent said about shaping and every warning: where a leftover came from.
    const text = await readFile(agent.logFile, 'utf8').catch(() => '');
    const said = text.split('\n').filter((l) => /"level":(40|50|60)|shap|orphan/.test(l));
    t.log(`agent log, warnings and shaping (${said.length} lines, the last 60):\n${said.slice(-60).join('\n')}`);
  }
  t.is(r.cycles, opts.cycles, 'every cycle ran');
  t.true(r.kills.length >= opts.kills, `${r.kills.length} SIGKILLs`);
  if (opts.kills > 0) t.true(r.killsMidAdd >= 1, 'at least one SIGKILL landed while an ADD was in flight');
  t.deepEqual(r.duplicates, [], 'never one address on two pods that are up');
  t.deepEqual(r.badAddresses, [], "every address in the pod CIDR and on its pod's eth0");
  t.deepEqual(r.unexpected, [], "no failure but those the agent's death explains");
  t.deepEqual(
    r.kills.map((k) => k.pluginsAlive),
    r.kills.map(() => 0),
    'no plugin of a killed agent still running after the kill',
  );
  t.deepEqual(r.outlivedPlugins, [], 'no interface made by a plugin of a killed agent');
  t.deepEqual(afterChurn, NO_LEFTOVERS, 'nothing of any pod left right after the churn');
  t.deepEqual(final, NO_LEFTOVERS, 'nothing of any pod left after the final restart');
  t.deepEqual(status.pods, [], 'the agent lists no pod');
  const repeating = linesRepeatingKeys(await readFile(agent.logFile, 'utf8'));
  t.deepEqual(repeating.slice(0, 5), [], `no line of the agent's log names a key twice (${repeating.length} lines do)`);
}

serialTest('churn with SIGKILLs, the agent configured by flags with private dirs: 300 cycles, 8 at a time, 5 kills', async (t) => {
  // Takes 25-50 s on this 2-core machine (up to ~75 s while other suites load it), after waiting for
  // the traffic lock (a measurement of another suite may hold it for a minute).
  t.timeout(300_000);
  await SandboxWorld.run(t, { prefix: 'kch' }, async (world) => {
    const sb = world.sb;
    const cidr = podCidr();
    const { agent, settings: s } = await startFlagsAgent(sb, { podCidr: cidr });
    world.agent = agent;
    const libcni = new SandboxLibcni(sb, { confDir: s.cniConfDir, binDirs: [s.cniBinDir], cacheDir: join(sb.tmpDir, 'libcni-cache') });
    t.log(`node netns ${sb.netns}, pod CIDR ${cidr}, bridge ${s.bridgeName}, ifb ${s.ifbName}, dirs under ${sb.tmpDir}`);
    // CPU-heavy: never beside another suite's traffic measurement (test/kit/traffic-lock.ts).
    await withTrafficLock(() => churnAndCheck(t, 'flags, private dirs', sb, agent, s, libcni, cidr, { cycles: 300, kills: 5 }));
  });
});

serialTest("churn with SIGKILLs, the literal defaults (manifest config, libcni's default cache dir): 80 cycles, 5 kills", async (t) => {
  // Takes 25-50 s on this 2-core machine (up to ~75 s while other suites load it), after waiting for
  // the traffic lock (a measurement of another suite may hold it for a minute).
  t.timeout(300_000);
  await SandboxWorld.run(t, { prefix: 'kch' }, async (world) => {
    const sb = world.sb;
    const cidr = podCidr();
    const { agent, settings: s } = await startManifestAgent(sb, world.cleanup, { nodeName: `kch-node-${sb.tag}`, podCidr: cidr });
    world.agent = agent;
    // As containerd runs libcni: /etc/cni/net.d, /opt/cni/bin, libcni's own default cache dir.
    const libcni = new SandboxLibcni(sb, { confDir: s.cniConfDir, binDirs: [s.cniBinDir] });
    t.is(libcni.cacheDir, LIBCNI_DEFAULT_CACHE_DIR);
    t.log(`node netns ${sb.netns}, pod CIDR ${cidr}, bridge ${s.bridgeName}, ifb ${s.ifbName}, the manifest's directories`);
    // CPU-heavy: never beside another suite's traffic measurement (test/kit/traffic-lock.ts).
    await withTrafficLock(() => churnAndCheck(t, 'literal defaults', sb, agent, s, libcni, cidr, { cycles: 80, kills: 5 }));
  });
});
