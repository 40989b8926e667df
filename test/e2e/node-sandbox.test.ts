/**
 * The node sandbox test helper (test/kit/node-sandbox.ts) keeps its promises: tmpfs over the
 * node's directories that the host never sees, /sys of the node netns, host netns added later
 * visible inside, mounts inside never visible outside, the uplink, the host-port relay, and a
 * destroy() that leaves nothing, also after a failed setup. Traffic: one ping between the
 * sandbox's own two namespaces, one HTTP request over the relay to the test's own server.
 */
import anyTest, { type TestFn } from 'ava';
import { execa } from 'execa';
import { existsSync, readFileSync } from 'node:fs';
import { readdir, stat } from 'node:fs/promises';
import { createServer } from 'node:http';
import type { AddressInfo } from 'node:net';
import { isRoot, uniq } from '../kit/kernel.js';
import { NODE_TMPFS_DIRS, NodeSandbox } from '../kit/node-sandbox.js';

const test = anyTest as TestFn;
const blocker = isRoot ? undefined : 'needs root (network and mount namespaces)';
const serialTest = blocker ? test.serial.skip : test.serial;
if (blocker) console.warn(`node sandbox tests skipped: ${blocker}`);

const hostMounts = () => readFileSync('/proc/self/mountinfo', 'utf8');
const netnsExists = async (name: string) => (await execa('ip', ['netns', 'list'])).stdout.split('\n').some((l) => l.split(' ')[0] === name);

serialTest('tmpfs dirs, node /sys, mount propagation one way, uplink, relay; destroy leaves nothing', async (t) => {
  const sb = await NodeSandbox.create();
  t.teardown(() => sb.destroy());

  // Every default dir is a fresh, empty tmpfs inside; what is written there stays inside.
  const fs = await sb.exec('sh', ['-c', 'for d in "$@"; do stat -f -c %T "$d"; ls -A "$d" | wc -l; done', 'x', ...NODE_TMPFS_DIRS]);
  t.deepEqual(
    fs.stdout.split('\n'),
    NODE_TMPFS_DIRS.flatMap(() => ['tmpfs', '0']),
  );
  await sb.exec('sh', ['-c', 'echo inside > /var/lib/kubenet/kcr-probe']);
  t.is(readFileSync(sb.hostPath('/var/lib/kubenet/kcr-probe'), 'utf8'), 'inside\n', 'hostPath reads the file inside');
  t.false(existsSync('/var/lib/kubenet/kcr-probe'), 'the host does not see it');

  // /sys shows the node netns, and the host's cgroup hierarchies are still there (runc needs them).
  const links = (await sb.exec('ls', ['/sys/class/net'])).stdout.split('\n').sort();
  t.deepEqual(links, [sb.uplink.nodeIf, 'lo'].sort());
  t.true((await sb.exec('ls', ['/sys/fs/cgroup'])).stdout.trim() !== '', '/sys/fs/cgroup kept');

  // A netns the host adds later is visible inside; a mount made inside is not visible outside.
  const later = `kcr-${uniq(6)}-later`;
  await execa('ip', ['netns', 'add', later]);
  try {
    t.true((await sb.exec('ls', ['/run/netns'])).stdout.split('\n').includes(later), 'host netns added later visible inside');
    t.is((await sb.exec('ip', ['netns', 'exec', later, 'ip', '-o', 'link', 'show', 'lo'])).exitCode, 0, 'and usable');
  } finally {
    await execa('ip', ['netns', 'del', later]);
  }
  await sb.exec('sh', ['-c', 'mkdir -p /run/kubenet/sub && mount -t tmpfs kcr-inner /run/kubenet/sub']);
  t.false(hostMounts().includes('kcr-inner'), 'a mount inside does not leak out');
  t.false(hostMounts().includes('kcr-node-sandbox'), 'nor do the tmpfs dirs');

  // The uplink: the lan netns reaches the node's address (both ours).
  const ping = await sb.execLan('ping', ['-c', '1', '-W', '2', sb.uplink.nodeIp], { reject: false });
  t.is(ping.exitCode, 0, ping.stdout);

  // The relay: 127.0.0.1:<port> inside reaches the test's server on the host's 127.0.0.1:<port>.
  const server = createServer((_req, res) => res.end('kcr-relay-ok'));
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', () => r()));
  t.teardown(() => new Promise<void>((r) => server.close(() => r())));
  const port = (server.address() as AddressInfo).port;
  await sb.exposeHostPort(port);
  const got = await sb.exec(process.execPath, ['-e', `fetch('http://127.0.0.1:${port}/').then(async (r) => console.log(await r.text()))`]);
  t.is(got.stdout.trim(), 'kcr-relay-ok');

  // Processes that ignore SIGTERM, with a grandchild: destroy kills them all.
  const stubborn = sb.spawn('sh', ['-c', 'trap "" TERM; sleep 1000 & sleep 1000; wait']);
  await new Promise((r) => setTimeout(r, 200));
  const inside = sb.processes();
  t.true(inside.length >= 3, `relay, sh and its sleeps inside: ${inside.join(' ')}`);
  const holder = sb.holderPid;
  const tmpDir = sb.tmpDir;

  await sb.destroy();
  await stubborn;
  for (const pid of [...inside, holder])
    t.false(existsSync(`/proc/${pid}`) && !readFileSync(`/proc/${pid}/stat`, 'utf8').includes(') Z '), `process ${pid} gone`);
  t.false(await netnsExists(sb.netns), 'node netns deleted');
  t.false(await netnsExists(sb.lanNetns), 'lan netns deleted');
  await t.throwsAsync(stat(tmpDir), { code: 'ENOENT' });
  t.false(hostMounts().includes('kcr-inner'));
  await sb.destroy(); // twice is fine
});

serialTest('a failed setup removes what it made', async (t) => {
  const before = (await execa('ip', ['netns', 'list'])).stdout;
  const tmpBefore = new Set(await readdir('/tmp'));
  // /proc/<pid> cannot hold a directory: the holder fails after both netns and the uplink exist.
  const err = await t.throwsAsync(NodeSandbox.create({ tmpfsDirs: ['/proc/1/kcr-cannot-exist'] }));
  t.regex(err?.message ?? '', /mount namespace holder failed/);
  const after = (await execa('ip', ['netns', 'list'])).stdout;
  t.deepEqual(
    after.split('\n').filter((l) => l.startsWith('kcr-') && !before.includes(l.split(' ')[0] ?? '')),
    [],
    'no kcr netns left',
  );
  t.deepEqual(
    (await readdir('/tmp')).filter((f) => f.startsWith('kcr-sandbox-') && !tmpBefore.has(f)),
    [],
    'no temp dir left',
  );
});
