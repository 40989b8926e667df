/**
 * Full, read-only and forbidden disks (issue 34): what a container runtime gets from the CNI
 * binary when the agent cannot write, and that the node recovers by itself once it can again.
 *
 * In a NodeSandbox (prefix kfe: its netns, links and pods' netns): the agent runs with the default
 * directories (state /var/lib/kubenet, host-local's store /var/lib/cni/networks, conf dir
 * /etc/cni/net.d, bin dir /opt/cni/bin) and libcni drives it as containerd does. Inside the
 * sandbox's own mount namespace, 64 KiB tmpfs mounts named kfe-state and kfe-ipam lie over the
 * state dir and host-local's store (they go with the sandbox, and are unmounted before it).
 * - ENOSPC: the state dir filled up: an ADD fails with CNI code 5 and libcni's error (the `msg`
 *   kubelet shows) names the pod record, the directory, its mount and its free space; nothing of the
 *   pod is left; a DEL of another pod still succeeds on the full disk; once space is freed the
 *   same ADD succeeds. The same with a spare record file ready (the agent's usual write).
 * - ENOSPC in host-local's store: the bridge plugin's IPAM (the agent's allocation) fails naming
 *   the reservation file; the ADD is undone whole.
 * - EROFS: the state dir remounted read-only: the ADD fails naming the directory and the read-only
 *   mount; remounted read-write, the ADD succeeds.
 * - EACCES: the agent run as root without CAP_DAC_OVERRIDE (setpriv: as a DaemonSet that drops
 *   capabilities runs it), the state dir owned by 65534: the ADD fails naming the uid, the missing
 *   capability, the directory's owner and mode; given back to root, the ADD succeeds.
 * Sends no traffic.
 */
import anyTest, { type TestFn } from 'ava';
import { randomInt } from 'node:crypto';
import { readdir } from 'node:fs/promises';
import { CNI_BIN_DIRS } from '../kit/kernel.js';
import { NO_LEFTOVERS, describeLeftovers, podLeftovers, type NodeLayout } from '../kit/node-leaks.js';
import { cniErrorCode, type LibcniCall, SandboxWorld, sandboxTestBlocker } from '../kit/sandbox-libcni.js';
import type { TestPod } from '../kit/test-pod.js';

const blocker = sandboxTestBlocker();
const test = anyTest as TestFn;
const serialTest = blocker ? test.serial.skip : test.serial;
if (blocker) console.warn(`fs-errors e2e skipped: ${blocker}`);

const STATE = '/var/lib/kubenet';
const IPAM = '/var/lib/cni/networks';
const CNI_IO = 5;

let world: SandboxWorld | undefined;
let layout: NodeLayout | undefined;
let agentArgs: string[] = [];
function w(): SandboxWorld {
  if (!world) throw new Error('no node: the setup (before hook) failed');
  return world;
}

const esc = (s: string) => s.replace(/[.*+?^${}()|[\]\\]/g, '\\$&');

/** A 64 KiB tmpfs over `dir` inside the node (in place of what was mounted there last by this test). */
async function tinyTmpfs(dir: string, name: string, extra = ''): Promise<void> {
  await w().sb.exec('mount', ['-t', 'tmpfs', '-o', `size=64k,mode=0755${extra}`, name, dir]);
  w().cleanup.add(() => w().sb.exec('umount', ['-l', dir], { reject: false }));
}

/** Fills the filesystem holding `dir` (a file `kfe-fill` there) until the kernel says ENOSPC. */
async function fill(dir: string): Promise<void> {
  await w().sb.exec('sh', ['-c', `dd if=/dev/zero of=${dir}/kfe-fill bs=4k 2>/dev/null; true`]);
  const df = await w().sb.exec('df', ['--output=avail', '-B1', dir]);
  if (Number(df.stdout.split('\n')[1]?.trim()) !== 0) throw new Error(`${dir} is not full: ${df.stdout}`);
}

async function free(dir: string): Promise<void> {
  await w().sb.exec('rm', ['-f', `${dir}/kfe-fill`]);
}

/**
 * The CNI error's msg as libcni reports it (`add network list "kubenet": plugin type="kubenet"
 * failed (add): <msg>`), which containerd wraps once more and kubelet shows in the pod's Events.
 */
function libcniError(r: LibcniCall): string {
  return (
    /^libcni-driver: add network list "kubenet": plugin type="kubenet" failed \(add\): (.*)$/m.exec(r.stderr)?.[1] ??
    `(no libcni error in: ${r.stderr})`
  );
}

function lay(): NodeLayout {
  if (!layout) throw new Error('no node: the setup (before hook) failed');
  return layout;
}

/** What pods left on the node, as describeLeftovers says it ('' when nothing). */
async function leftovers(): Promise<string> {
  return describeLeftovers(await podLeftovers(w().sb, lay()));
}

async function addOk(t: import('ava').ExecutionContext, pod: TestPod, what: string): Promise<void> {
  const r = await w().call('add', pod);
  t.is(r.exitCode, 0, `${what}: ${r.stderr}`);
}

/** An ADD of `pod` the agent must refuse with CNI code 5 (I/O failure); returns libcni's msg (logged). */
async function refusedMsg(t: import('ava').ExecutionContext, pod: TestPod): Promise<string> {
  const r = await w().call('add', pod);
  t.not(r.exitCode, 0);
  t.is(cniErrorCode(r), CNI_IO, r.stderr);
  const msg = libcniError(r);
  t.log(msg);
  return msg;
}

async function delOk(t: import('ava').ExecutionContext, pod: TestPod, what: string): Promise<void> {
  const r = await w().call('del', pod);
  t.is(r.exitCode, 0, `${what}: ${r.stderr}`);
}

test.before(async (t) => {
  if (blocker) return;
  t.timeout(90_000);
  world = await SandboxWorld.create({ prefix: 'kfe' });
  const sb = world.sb;
  await tinyTmpfs(STATE, 'kfe-state');
  await sb.exec('mkdir', ['-p', IPAM]);
  await tinyTmpfs(IPAM, 'kfe-ipam');
  const bridgeName = `kfe${sb.tag}b`;
  const ifbName = `kfe${sb.tag}i`;
  agentArgs = [
    '--pod-cidr',
    `10.${randomInt(100, 200)}.${randomInt(256)}.0/24`,
    '--plugin-bin-dirs',
    CNI_BIN_DIRS.join(','),
    '--bridge-name',
    bridgeName,
    '--ifb-name',
    ifbName,
    '--log-level',
    'info',
  ];
  await world.startAgent(agentArgs);
  layout = { bridgeName, ifbName, ipamDataDir: IPAM, stateDir: STATE, runtimeCacheDir: world.libcni.cacheDir };
});

test.afterEach.always(async (t) => {
  if (!t.passed && world) t.log(`agent log (tail):\n${await world.agent.logTail(40).catch(() => '')}`);
});

test.after.always(async () => {
  await world?.destroy();
});

serialTest(
  'ENOSPC on the state dir: the ADD fails with CNI code 5 naming the pod record, the directory, its mount and free space; nothing is left; DEL works on the full disk; freed, the ADD succeeds',
  async (t) => {
    t.timeout(120_000);
    const a = await w().newPod('a');
    const b = await w().newPod('b');
    await fill(STATE);
    const msg = await refusedMsg(t, a);
    const space = `free space or inodes on the filesystem holding ${STATE}/pods \\(tmpfs at ${STATE}: 0 B of 64 KiB free, \\d+ inodes free\\)`;
    t.regex(
      msg,
      new RegExp(`^cannot write the pod record ${STATE}/pods/${a.id}@eth0\\.json: no space left on device \\(ENOSPC\\): ${space}$`),
    );
    t.is(await leftovers(), '', 'nothing of the refused pod: no veth, reservation, record, cache entry');

    await free(STATE);
    await addOk(t, a, 'ADD once space is freed');
    // The agent's usual write goes through a spare file made after a record write: a full disk fails it the same way.
    const spares = w().sb.hostPath(`${STATE}/.pods-spare`);
    for (let i = 0; i < 100 && (await readdir(spares).catch(() => [])).length === 0; i++) await new Promise((r) => setTimeout(r, 20));
    t.true((await readdir(spares)).length > 0, 'spare record files are ready');
    await fill(STATE);
    t.regex(
      await refusedMsg(t, b),
      new RegExp(`^cannot write the pod record ${STATE}/pods/${b.id}@eth0\\.json: no space left on device \\(ENOSPC\\): ${space}$`),
    );
    t.deepEqual(await readdir(w().sb.hostPath(`${STATE}/pods`)), [`${a.id}@eth0.json`], 'only the attached pod has a record');

    await delOk(t, a, 'DEL on the full disk');
    t.is(await leftovers(), '', 'nothing left after the DEL on the full disk');
    await free(STATE);
    await addOk(t, b, 'ADD once space is freed again');
    await delOk(t, b, 'DEL');
    t.deepEqual(await podLeftovers(w().sb, lay()), NO_LEFTOVERS);
  },
);

serialTest(
  "ENOSPC in host-local's store: the IPAM (the bridge plugin's, answered by the agent) fails naming the reservation file; the ADD is undone whole; freed, the ADD succeeds",
  async (t) => {
    t.timeout(120_000);
    const c = await w().newPod('c');
    // The network's directory and lock exist as after any allocation: only a reservation needs space.
    await addOk(t, c, 'ADD before the store fills');
    await delOk(t, c, 'DEL');
    await fill(IPAM);
    const msg = await refusedMsg(t, c);
    t.regex(
      msg,
      new RegExp(
        `^CNI plugin bridge ADD failed \\(CNI code ${CNI_IO}\\): cannot write the address reservation ${IPAM}/kubenet/[\\d.]+: no space left on device \\(ENOSPC\\): free space or inodes on the filesystem holding ${IPAM}/kubenet \\(tmpfs at ${esc(IPAM)}: 0 B of 64 KiB free, \\d+ inodes free\\)$`,
      ),
    );
    t.is(await leftovers(), '', 'the failed ADD is undone: no veth, reservation, record');
    await free(IPAM);
    await addOk(t, c, 'ADD once space is freed');
    await delOk(t, c, 'DEL');
    t.is(await leftovers(), '');
  },
);

serialTest(
  'EROFS on the state dir: the ADD fails naming the directory and the read-only mount; remounted read-write, the ADD succeeds',
  async (t) => {
    t.timeout(120_000);
    const d = await w().newPod('d');
    await w().sb.exec('mount', ['-o', 'remount,ro', STATE]);
    const msg = await refusedMsg(t, d).finally(() =>
      w()
        .sb.exec('mount', ['-o', 'remount,rw', STATE])
        .catch(() => undefined),
    );
    t.is(
      msg,
      `cannot write the pod record ${STATE}/pods/${d.id}@eth0.json: read-only file system (EROFS): ${STATE}/pods must be writable, but the filesystem holding it (tmpfs at ${STATE}) is read-only: mount it read-write`,
    );
    t.is(await leftovers(), '', 'nothing of the refused pod');
    await addOk(t, d, 'ADD once remounted read-write');
    await delOk(t, d, 'DEL');
    t.is(await leftovers(), '');
  },
);

serialTest(
  'EACCES: the agent as root without CAP_DAC_OVERRIDE, the state dir owned by 65534: the ADD names the uid, the capability, the owner and mode; given back to root, the ADD succeeds',
  async (t) => {
    t.timeout(120_000);
    // A fresh state dir owned by 65534, and the agent as a DaemonSet dropping capabilities runs it.
    await w().agent.stop(10_000);
    await w().sb.exec('umount', [STATE]);
    await tinyTmpfs(STATE, 'kfe-state', ',uid=65534,gid=65534');
    const drop = '-dac_override,-dac_read_search';
    await w().startAgent(agentArgs, { wrapper: ['setpriv', `--inh-caps=${drop}`, `--bounding-set=${drop}`, '--'] });
    const pid = w().agent.pid ?? 0;
    const capEff = /^CapEff:\s*([0-9a-f]+)$/m.exec(await w().inNode('cat', [`/proc/${pid}/status`]))?.[1] ?? '';
    t.is(BigInt(`0x${capEff || '0'}`) & 2n, 0n, `the agent (pid ${pid}) runs without CAP_DAC_OVERRIDE: CapEff ${capEff}`);

    const e = await w().newPod('e');
    const msg = await refusedMsg(t, e);
    t.is(
      msg,
      `cannot write the pod record ${STATE}/pods/${e.id}@eth0.json: permission denied (EACCES): the agent (uid 0, without CAP_DAC_OVERRIDE) may not write in ${STATE} (owner 65534:65534, mode 0755): check the owner and mode of ${STATE} and of its files, and any security policy confining the agent (SELinux, AppArmor)`,
    );
    t.is(await leftovers(), '', 'nothing of the refused pod');
    await w().sb.exec('chown', ['0:0', STATE]);
    await addOk(t, e, "ADD once the directory is root's");
    await delOk(t, e, 'DEL');
    t.is(await leftovers(), '');
  },
);
