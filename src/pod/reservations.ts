/**
 * The reservations of the reference host-local IPAM plugin, read (never written: host-local owns
 * them, under its own lock): one file per address under `<dataDir>/<network>/`, named after the
 * address and holding the container ID, then the interface name on a second line (host-local
 * 0.8.6+; older files hold only the ID).
 *
 * One exception: host-local creates a reservation file (O_EXCL) and then writes the ID into it. A
 * host-local killed between the two (its agent SIGKILLed mid-ADD: the spawner kills the plugins
 * with it) leaves an EMPTY file: an address no DEL can release, since no ID names it, and gone from
 * the pool for good (seen in the churn test: one address per ~300 cycles with 5 kills).
 * `removeEmptyReservations` deletes such files while holding host-local's own lock (flock on
 * `<dataDir>/<network>/lock`, through util-linux flock(1)), so none that a live host-local is
 * writing is touched.
 */
import { execa } from 'execa';
import { readdir, readFile, stat } from 'node:fs/promises';
import { join } from 'node:path';
import { ToolError } from '../errors.js';
import { isIpAddress } from '../net/ip.js';

export interface Reservation {
  ip: string;
  containerId: string;
  ifName: string;
}

export async function listReservations(dataDir: string, networkName: string): Promise<Reservation[]> {
  const dir = join(dataDir, networkName);
  let names: string[];
  try {
    names = await readdir(dir);
  } catch (err) {
    if ((err as { code?: string }).code === 'ENOENT') return [];
    throw err;
  }
  const out: Reservation[] = [];
  for (const name of names) {
    // IPv6 reservations are named with the address as is; anything else (lock, last_reserved_ip.N) is not one.
    if (!isIpAddress(name)) continue;
    let text: string;
    try {
      text = await readFile(join(dir, name), 'utf8');
    } catch {
      continue; // released meanwhile
    }
    const [id = '', ifName = 'eth0'] = text.split(/\r?\n/).map((s) => s.trim());
    if (id) out.push({ ip: name, containerId: id, ifName: ifName || 'eth0' });
  }
  return out;
}

/**
 * Deletes the empty reservation files of the network (see the module doc) under host-local's lock,
 * re-checking under it that each is still empty. Returns the addresses freed.
 */
export async function removeEmptyReservations(dataDir: string, networkName: string): Promise<string[]> {
  const dir = join(dataDir, networkName);
  const names = await readdir(dir).catch(() => [] as string[]);
  const empty: string[] = [];
  for (const name of names) {
    if (!isIpAddress(name)) continue;
    const st = await stat(join(dir, name)).catch(() => undefined);
    if (st?.isFile() && st.size === 0) empty.push(name);
  }
  if (empty.length === 0) return [];
  // find -empty -delete: only what is still empty once the lock is ours.
  const files = empty.map((n) => join(dir, n));
  const r = await execa('flock', ['-w', '10', join(dir, 'lock'), 'find', ...files, '-maxdepth', '0', '-type', 'f', '-empty', '-delete', '-print'], { reject: false });
  if (r.exitCode !== 0 && r.stdout === '') {
    const why = (r as { code?: string }).code === 'ENOENT' ? 'flock(1) is not installed (package util-linux)' : `exit ${r.exitCode}: ${r.stderr}`;
    throw new ToolError('flock', ['-w', '10', join(dir, 'lock'), 'find', '…'], r.exitCode, `cannot free ${empty.length} empty reservation file(s) in ${dir}: ${why}`);
  }
  return r.stdout
    .split('\n')
    .filter((l) => l !== '')
    .map((l) => l.slice(dir.length + 1));
}
