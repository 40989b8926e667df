/**
 * fsError (src/util/fs-error.ts): filesystem errors as messages an operator can act on, made from
 * real errors of real filesystems, no mocks:
 * - without root: ENOENT and ENOTDIR in a temporary directory, ENOSPC from /dev/full;
 * - as root, in a child process: the agent's own writes (writeFileAtomic, the pod records'
 *   SpareFileWriter, host-local's store) over a 64 KiB tmpfs the child mounts in a private mount
 *   namespace (`unshare -m`: the mount goes with the child), filled (ENOSPC), then remounted
 *   read-only (EROFS), and an immutable directory on it (EPERM); EACCES as uid 65534 in a root-owned
 *   directory, and as root without CAP_DAC_OVERRIDE (setpriv) in a directory root does not own.
 */
import test from 'ava';
import { execa } from 'execa';
import { chmodSync, chownSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { FsError, KubenetError } from '../../src/errors.js';
import { writeFileAtomic } from '../../src/util/atomic-file.js';
import { fsErrnoError, fsError, fsTry, mountOf } from '../../src/util/fs-error.js';

const ROOT = fileURLToPath(new URL('../../', import.meta.url));
const FAULT = join(ROOT, 'test/kit/fs-fault.ts');
const isRoot = process.getuid?.() === 0;
const rootTest = isRoot ? test : test.skip;
if (!isRoot) console.warn('fs-error: the ENOSPC/EROFS/EPERM/EACCES cases need root (mount, setpriv); skipped');

interface Outcome {
  ok: boolean;
  name?: string;
  code?: string;
  errno?: number;
  path?: string;
  message?: string;
}

function tmp(t: import('ava').ExecutionContext, prefix = 'kfe-fserr-'): string {
  const d = mkdtempSync(join(tmpdir(), prefix));
  t.teardown(() => rmSync(d, { recursive: true, force: true }));
  return d;
}

const esc = (s: string) => s.replace(/[.*+?^${}()|[\]\\]/g, '\\$&');

test('a system error becomes an FsError: what was done, on which file, the errno in words; code, errno and cause kept; never wrapped twice', (t) => {
  const d = tmp(t);
  const file = join(d, 'missing.json');
  const err = t.throws(() => fsTry('read', 'the pod record', file, () => readFileSync(file)), { instanceOf: FsError }) as FsError;
  t.true(err instanceof KubenetError);
  t.is(err.name, 'FsError');
  t.is(err.message, `cannot read the pod record ${file}: no such file or directory (ENOENT)`);
  t.is(err.code, 'ENOENT', 'callers that check err.code still work');
  t.is(err.errno, 2);
  t.is(err.syscall, 'open');
  t.is(err.path, file);
  t.is(err.op, 'read');
  t.is((err.cause as { code?: string }).code, 'ENOENT');
  t.is(fsError(err, 'write', 'something else', '/x'), err, 'an FsError is never wrapped again');
  const plain = new Error('not a system error');
  t.is(fsError(plain, 'write', 'the file', file), plain);
  t.is(fsError('text', 'write', 'the file', file), 'text');

  // A write under a file: the failing call's own path is named when it is not the target's temporary file.
  writeFileSync(join(d, 'plain'), '');
  const under = join(d, 'plain', 'sub', 'x.json');
  const notDir = t.throws(() => writeFileAtomic(under, '{}', { what: 'the pod record' }), { instanceOf: FsError }) as FsError;
  t.is(notDir.code, 'ENOTDIR');
  t.is(notDir.message, `cannot write the pod record ${under}: not a directory (ENOTDIR)`, 'the temporary file is not named');
  const copy = t.throws(
    () => fsTry('install', 'the CNI forwarder', join(d, 'kubenet'), () => writeFileSync(join(d, 'nowhere', 'kubenet'), '')),
    { instanceOf: FsError },
  );
  t.regex(
    copy?.message ?? '',
    new RegExp(
      `^cannot install the CNI forwarder ${esc(join(d, 'kubenet'))}: no such file or directory \\(ENOENT\\) \\(open ${esc(join(d, 'nowhere', 'kubenet'))}\\)$`,
    ),
  );
});

test('ENOSPC (from /dev/full) names the filesystem holding the directory, its mount, space and inodes free', (t) => {
  const err = t.throws(() => fsTry('write', 'the file', '/dev/full', () => writeFileSync('/dev/full', 'x')), {
    instanceOf: FsError,
  }) as FsError;
  t.is(err.code, 'ENOSPC');
  t.is(err.errno, 28);
  const m = mountOf('/dev');
  t.truthy(m);
  t.regex(
    err.message,
    new RegExp(
      `^cannot write the file /dev/full: no space left on device \\(ENOSPC\\): free space or inodes on the filesystem holding /dev \\(${esc(m?.fstype ?? '')} at ${esc(m?.point ?? '')}: [\\d.]+ (?:[KMGTP]i)?B of [\\d.]+ (?:[KMGTP]i)?B free, \\d+ inodes free\\)$`,
    ),
  );
});

test('a bare errno of a libc call (koffi) becomes the same FsError', (t) => {
  const d = tmp(t);
  const err = fsErrnoError(28, 'linkat', 'create', 'the address reservation', join(d, 'kubenet', '10.1.0.2'));
  t.is(err.code, 'ENOSPC');
  t.is(err.syscall, 'linkat');
  t.regex(
    err.message,
    new RegExp(
      `^cannot create the address reservation ${esc(d)}/kubenet/10\\.1\\.0\\.2: no space left on device \\(ENOSPC\\): free space or inodes on the filesystem holding ${esc(d)} \\(`,
    ),
  );
  t.is(fsErrnoError(4095, 'flock', 'lock', "host-local's lock file", '/x').code, 'errno 4095');
});

/** The JSON lines of fs-fault.ts runs, in order, from a shell script run as given. */
async function faults(cmd: string[], script: string): Promise<Outcome[]> {
  const r = await execa(cmd[0] ?? 'sh', [...cmd.slice(1), 'sh', '-ec', script, 'faults', process.execPath, FAULT], {
    cwd: ROOT,
    reject: false,
  });
  const lines = r.stdout.split('\n').filter((l) => l.startsWith('{'));
  if (r.exitCode !== 0 || lines.length === 0) throw new Error(`fault script failed (exit ${r.exitCode}): ${r.stderr}\n${r.stdout}`);
  return lines.map((l) => JSON.parse(l) as Outcome);
}

rootTest(
  "the agent's writes on a full, then read-only tmpfs (private mount namespace): ENOSPC and EROFS name the file, the directory and the mount; EPERM an immutable directory",
  async (t) => {
    const d = tmp(t);
    // $1 = node, $2 = fs-fault.ts, $3 = the mount point. The mount is the child's mount namespace's: it goes with it.
    const script = `
node="$1"; fault="$2"; d="$3"
run() { "$node" --import tsx "$fault" "$@"; }
mount -t tmpfs -o size=64k,mode=0755 kfe-fserr "$d"
mkdir -p "$d/imm" && chattr +i "$d/imm"
run write "$d/imm/pods/x.json"
run spare-full "$d/s"
run write "$d/r/pods/x.json"
run reserve-full "$d/ipam"
rm "$d/s/fill" "$d/ipam/fill"
run write "$d/r/pods/x.json"
mount -o remount,ro "$d"
run write "$d/r/pods/y.json"
run remove "$d/r/pods/x.json"
chattr -i "$d/imm" 2>/dev/null || true
`;
    const [imm, spare, atomic, reserve, freed, ro, roRemove] = await faults(
      ['unshare', '--mount', '--propagation', 'private', '--'],
      `${script}`.replace('d="$3"', `d=${JSON.stringify(d)}`),
    );
    t.log(spare?.message);
    t.log(ro?.message);
    t.log(imm?.message);
    const space = (dir: string) =>
      `free space or inodes on the filesystem holding ${esc(dir)} \\(tmpfs at ${esc(d)}: 0 B of 64 KiB free, \\d+ inodes free\\)`;

    t.is(spare?.name, 'FsError');
    t.is(spare?.code, 'ENOSPC');
    t.regex(
      spare?.message ?? '',
      new RegExp(
        `^cannot write the pod record ${esc(d)}/s/pods/second@eth0\\.json: no space left on device \\(ENOSPC\\): ${space(`${d}/s/pods`)}$`,
      ),
      'through a spare file',
    );
    t.regex(
      atomic?.message ?? '',
      new RegExp(`^cannot write the pod record ${esc(d)}/r/pods/x\\.json: no space left on device \\(ENOSPC\\): ${space(`${d}/r/pods`)}$`),
      'write-then-rename',
    );
    t.regex(
      reserve?.message ?? '',
      new RegExp(
        `^cannot write the address reservation ${esc(d)}/ipam/kubenet/10\\.1\\.0\\.2: no space left on device \\(ENOSPC\\): ${space(`${d}/ipam/kubenet`)}$`,
      ),
      "host-local's store",
    );
    t.deepEqual(freed, { ok: true }, 'with space again, the same write succeeds');

    t.is(ro?.code, 'EROFS');
    t.is(
      ro?.message,
      `cannot write the pod record ${d}/r/pods/y.json: read-only file system (EROFS): ${d}/r/pods must be writable, but the filesystem holding it (tmpfs at ${d}) is read-only: mount it read-write`,
    );
    t.is(roRemove?.code, 'EROFS');
    t.regex(
      roRemove?.message ?? '',
      new RegExp(`^cannot remove the pod record ${esc(d)}/r/pods/x\\.json: read-only file system \\(EROFS\\): `),
    );

    t.is(imm?.code, 'EPERM');
    t.is(
      imm?.message,
      `cannot write the pod record ${d}/imm/pods/x.json: operation not permitted (EPERM): the agent (uid 0, with CAP_DAC_OVERRIDE) may not write in ${d}/imm (owner 0:0, mode 0755): check the immutable and append-only attributes (lsattr; chattr -i -a), the owner and mode of ${d}/imm and of its files, and any security policy confining the agent (SELinux, AppArmor)`,
    );
  },
);

rootTest(
  'EACCES: as uid 65534 in a root-owned directory, and as root without CAP_DAC_OVERRIDE in a directory owned by 65534: the uid, the capability, the owner and mode; a directory it may not list',
  async (t) => {
    // Root with CAP_DAC_OVERRIDE is never refused by owner and mode: the refusal is produced as a
    // process without that power, as an agent run as non-root or with capabilities dropped is.
    const d = tmp(t);
    chmodSync(d, 0o755);
    const rootOwned = join(d, 'root-owned');
    const nobodyOwned = join(d, 'nobody-owned');
    mkdirSync(rootOwned, { mode: 0o755 });
    mkdirSync(nobodyOwned, { mode: 0o755 });
    chownSync(nobodyOwned, 65534, 65534);
    const script = 'node="$1"; fault="$2"; shift 2; "$node" --import tsx "$fault" "$@"';
    const run = async (cmd: string[], file: string) => (await faults(cmd, `${script} write ${JSON.stringify(file)}`))[0];

    const asNobody = await run(
      ['setpriv', '--reuid', '65534', '--regid', '65534', '--clear-groups', '--'],
      join(rootOwned, 'pods', 'x.json'),
    );
    t.log(asNobody?.message);
    t.is(asNobody?.code, 'EACCES');
    t.is(
      asNobody?.message,
      `cannot write the pod record ${rootOwned}/pods/x.json: permission denied (EACCES): the agent (uid 65534, without CAP_DAC_OVERRIDE) may not write in ${rootOwned} (owner 0:0, mode 0755): check the owner and mode of ${rootOwned} and of its files, and any security policy confining the agent (SELinux, AppArmor)`,
    );

    // Reading: the directory listed is the one named.
    const closed = join(rootOwned, 'pods');
    mkdirSync(closed, { mode: 0o700 });
    const unreadable = (
      await faults(['setpriv', '--reuid', '65534', '--regid', '65534', '--clear-groups', '--'], `${script} load ${JSON.stringify(closed)}`)
    )[0];
    t.is(unreadable?.code, 'EACCES');
    t.is(
      unreadable?.message,
      `cannot read the pod records in ${closed}: permission denied (EACCES): the agent (uid 65534, without CAP_DAC_OVERRIDE) may not read in ${closed} (owner 0:0, mode 0700): check the owner and mode of ${closed} and of its files, and any security policy confining the agent (SELinux, AppArmor)`,
    );

    const drop = '-dac_override,-dac_read_search';
    const rootNoDac = await run(['setpriv', `--inh-caps=${drop}`, `--bounding-set=${drop}`, '--'], join(nobodyOwned, 'pods', 'x.json'));
    t.log(rootNoDac?.message);
    t.is(rootNoDac?.code, 'EACCES');
    t.regex(
      rootNoDac?.message ?? '',
      new RegExp(
        `^cannot write the pod record ${esc(nobodyOwned)}/pods/x\\.json: permission denied \\(EACCES\\): the agent \\(uid 0, without CAP_DAC_OVERRIDE\\) may not write in ${esc(nobodyOwned)} \\(owner 65534:65534, mode 0755\\): `,
      ),
    );
  },
);
