/**
 * Soak: thousands of pod ADD/DEL cycles through libcni against the node agent in a node sandbox,
 * with the mechanics of test/e2e/churn.test.ts (test/kit/churn.ts): 8 pods at a time, a third
 * shaped (half with containerd's burst 4294967295), a fifth with a host port, DEL twice (the second
 * with an empty CNI_NETNS), runtime-like retries, and optionally SIGKILLs of the agent (each followed
 * by a restart with the same config).
 *
 * Prints the agent's RSS at the start, every 500 cycles and at the end, cycles/s, p50/p99 ADD and
 * DEL latency (the libcni driver exec'd in the node: what a runtime waits for), and what is left on
 * the node at the end (must be nothing; with kills, also after a final restart's sweep). Exit code 1
 * when anything leaked, an address was handed out twice, or a call failed for another reason than
 * the agent's death.
 *
 * Root only. Everything runs in a NodeSandbox (prefix kch): its own node netns and tmpfs dirs; pod
 * netns `kch<random>-<n>-<attempt>`; all removed at the end, also on failure or Ctrl-C. No traffic.
 *
 * Usage: npx tsx bench/churn.ts [--cycles 2000] [--kills 0] [--concurrency 8] [--mode manifest|flags]
 *   --mode manifest (default): the manifest ConfigMap's config, cluster mode, libcni's default cache dir;
 *   --mode flags: a static pod CIDR and private dirs by flags, libcni's cache in a private dir.
 */
import { randomInt } from 'node:crypto';
import { join } from 'node:path';
import { BenchArgs } from '../test/kit/bench-kit.js';
import { startFlagsAgent, startManifestAgent, type AgentProcess, type ManifestSettings } from '../test/kit/agent-process.js';
import { Churn, leftoversAcrossRestart, percentile, rssKb } from '../test/kit/churn.js';
import { Cleanup, kernelTestBlocker, uniq } from '../test/kit/kernel.js';
import { countLeftovers, describeLeftovers, podLeftovers, type NodeLayout } from '../test/kit/node-leaks.js';
import { NodeSandbox } from '../test/kit/node-sandbox.js';
import { SandboxLibcni } from '../test/kit/sandbox-libcni.js';

const USAGE = 'usage: npx tsx bench/churn.ts [--cycles N] [--kills N] [--concurrency N] [--mode manifest|flags]';
const args = BenchArgs.parse(USAGE, ['cycles', 'kills', 'concurrency', 'mode']);
const cycles = Number(args.str('cycles') ?? '2000');
const kills = Number(args.str('kills') ?? '0');
const concurrency = Number(args.str('concurrency') ?? '8');
const mode = args.str('mode') ?? 'manifest';
if (
  !Number.isInteger(cycles) ||
  cycles < 1 ||
  !Number.isInteger(kills) ||
  kills < 0 ||
  !Number.isInteger(concurrency) ||
  concurrency < 1 ||
  (mode !== 'manifest' && mode !== 'flags')
) {
  console.error(USAGE);
  process.exit(64);
}
const blocker = kernelTestBlocker();
if (blocker) {
  console.error(`bench/churn: ${blocker}`);
  process.exit(1);
}

const mb = (kb: number | undefined) => (kb === undefined ? '?' : `${(kb / 1024).toFixed(1)} MB`);
const ms = (x: number) => `${x.toFixed(0)} ms`;

async function main(cleanup: Cleanup): Promise<boolean> {
  const sb = await NodeSandbox.create({ prefix: 'kch' });
  cleanup.add(() => sb.destroy());
  const podCidr = `10.${randomInt(100, 200)}.${randomInt(256)}.0/24`;
  let agent: AgentProcess;
  let settings: ManifestSettings;
  let libcni: SandboxLibcni;
  if (mode === 'manifest') {
    const node = await startManifestAgent(sb, cleanup, { nodeName: `kch-node-${sb.tag}`, podCidr });
    ({ agent, settings } = node);
    libcni = new SandboxLibcni(sb, { confDir: settings.cniConfDir, binDirs: [settings.cniBinDir] });
  } else {
    ({ agent, settings } = await startFlagsAgent(sb, { podCidr }));
    libcni = new SandboxLibcni(sb, {
      confDir: settings.cniConfDir,
      binDirs: [settings.cniBinDir],
      cacheDir: join(sb.tmpDir, 'libcni-cache'),
    });
  }
  const layout: NodeLayout = {
    bridgeName: settings.bridgeName,
    ifbName: settings.ifbName,
    ipamDataDir: settings.ipamDataDir,
    stateDir: settings.stateDir,
    runtimeCacheDir: libcni.cacheDir,
  };
  console.log(
    `bench/churn: ${cycles} cycles, ${concurrency} at a time, ${kills} kills, mode ${mode}; node netns ${sb.netns}, pod CIDR ${podCidr}, runtime cache ${libcni.cacheDir}`,
  );
  console.log(`agent RSS at start: ${mb(await rssKb(agent.pid))}`);

  let windowStart = performance.now();
  let windowDone = 0;
  const churn = new Churn(
    { sb, agent, libcni, podCidr, stateDir: settings.stateDir },
    {
      cycles,
      kills,
      concurrency,
      netnsPrefix: `kch${uniq(5)}`,
      log: (m) => console.log(m),
      progress: {
        every: 500,
        fn: async (done) => {
          const now = performance.now();
          console.log(
            `  ${done} cycles: agent RSS ${mb(await rssKb(agent.pid))}, ${((done - windowDone) / ((now - windowStart) / 1000)).toFixed(1)} cycles/s over the last ${done - windowDone}`,
          );
          windowStart = now;
          windowDone = done;
        },
      },
    },
  );
  const r = await churn.run();
  const rssEnd = await rssKb(agent.pid);
  const left = await podLeftovers(sb, layout);

  console.log(`agent RSS at the end: ${mb(rssEnd)}${kills > 0 ? ' (of the agent started after the last kill)' : ''}`);
  console.log(
    `${r.cycles} cycles in ${(r.durationMs / 1000).toFixed(1)} s: ${(r.cycles / (r.durationMs / 1000)).toFixed(1)} cycles/s, up to ${r.maxPodsUp} pods up at once`,
  );
  console.log(`ADD: ${r.addMs.length} ok of ${r.addCalls} calls, p50 ${ms(percentile(r.addMs, 50))}, p99 ${ms(percentile(r.addMs, 99))}`);
  console.log(`DEL: ${r.delMs.length} ok of ${r.delCalls} calls, p50 ${ms(percentile(r.delMs, 50))}, p99 ${ms(percentile(r.delMs, 99))}`);
  console.log(`CHECK: ${r.checkCalls} calls`);
  if (kills > 0) {
    console.log(
      `kills: ${r.kills.length}, landed mid-ADD: ${r.killsMidAdd}; retries: ADD ${r.addRetries.newId + r.addRetries.sameId}, DEL ${r.delRetries}, CHECK ${r.checkRetries}`,
    );
  }
  console.log(
    `failures: try again later (code 11) ${r.failuresTryAgainLater}, cut by a kill ${r.failuresCut}, other ${r.unexpected.length}; same-ID retries refused for an eth0 a plugin of a killed agent made: ${r.outlivedPlugins.length}`,
  );
  for (const u of r.unexpected.slice(0, 10)) console.log(`  ${u}`);
  console.log(`addresses handed out twice: ${r.duplicates.length}; bad addresses: ${r.badAddresses.length}`);
  for (const d of [...r.duplicates, ...r.badAddresses].slice(0, 10)) console.log(`  ${d}`);
  console.log(`leaks at the end: ${countLeftovers(left)}${countLeftovers(left) > 0 ? `\n${describeLeftovers(left)}` : ''}`);
  let leaks = countLeftovers(left);
  if (kills > 0) {
    const after = await leftoversAcrossRestart(sb, agent, layout);
    console.log(
      `after a final restart: its sweep removed ${JSON.stringify(after.finalSweep)}; leaks ${countLeftovers(after.final)}${countLeftovers(after.final) > 0 ? `\n${describeLeftovers(after.final)}` : ''}`,
    );
    leaks = countLeftovers(after.final);
  }
  await agent.stop(10_000);
  return leaks === 0 && r.duplicates.length === 0 && r.badAddresses.length === 0 && r.unexpected.length === 0;
}

const cleanup = new Cleanup();
let interrupted = false;
// One cleanup, whoever asks first: two runs at once split the work, and the first to finish exited.
let cleaning: Promise<void> | undefined;
const cleanupOnce = () => (cleaning ??= cleanup.run().catch((err: unknown) => console.error('cleanup failed:', err)));
const interrupt = () => {
  if (interrupted) return;
  interrupted = true;
  console.error('interrupted: cleaning up');
  void cleanupOnce().finally(() => process.exit(130));
};
process.on('SIGINT', interrupt);
// Its reader gone (`... | head`): cleaned up like on Ctrl-C (without a listener the EPIPE killed it first).
for (const stream of [process.stdout, process.stderr]) stream.on('error', interrupt);
let ok = false;
try {
  ok = await main(cleanup);
} catch (err) {
  console.error(err);
} finally {
  await cleanupOnce();
}
process.exit(interrupted ? 130 : ok ? 0 : 1);
