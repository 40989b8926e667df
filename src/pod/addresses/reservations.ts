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
import { readdir, readFile } from 'node:fs/promises';
import { join } from 'node:path';
import { ToolError } from '../../errors.js';
import { isIpAddress } from '../../net/ip.js';
import { fsError } from '../../util/fs-error.js';

export interface Reservation {
  ip: string;
  containerId: string;
  ifName: string;
}

/** What a network's reservation directory holds: the reservations, and the addresses of empty files (see the module doc). */
export interface ReservationFiles {
  held: Reservation[];
  empty: string[];
}

/** Reads every reservation of the network; a missing directory holds none. */
export async function readReservations(dataDir: string, networkName: string): Promise<ReservationFiles> {
  const dir = join(dataDir, networkName);
  const out: ReservationFiles = { held: [], empty: [] };
  let names: string[];
  try {
    names = await readdir(dir);
  } catch (err) {
    if ((err as { code?: string }).code === 'ENOENT') return out;
    throw fsError(err, 'read', 'the address reservations in', dir);
  }
  for (const name of names) {
    // IPv6 reservations are named with the address as is; anything else (lock, last_reserved_ip.N) is not one.
    if (!isIpAddress(name)) continue;
    let text: string;
    try {
      text = await readFile(join(dir, name), 'utf8');
    } catch {
      continue; // released meanwhile
    }
    if (text === '') {
      out.empty.push(name);
      continue;
    }
    const [id = '', ifName = 'eth0'] = text.split(/\r?\n/).map((s) => s.trim());
    if (id) out.held.push({ ip: name, containerId: id, ifName: ifName || 'eth0' });
  }
  return out;
}

/** The network's reservations (files naming a container). */
export async function listReservations(dataDir: string, networkName: string): Promise<Reservation[]> {
  return (await readReservations(dataDir, networkName)).held;
}

/**
 * Deletes the empty reservation files `empty` (addresses, as readReservations found them; see the
 * module doc) under host-local's lock, re-checking under it that each is still empty. Returns the
 * addresses freed.
 */
export async function removeEmptyReservations(dataDir: string, networkName: string, empty: string[]): Promise<string[]> {
  if (empty.length === 0) return [];
  const dir = join(dataDir, networkName);
  // find -empty -delete: only what is still empty once the lock is ours.
  const files = empty.map((n) => join(dir, n));
  const r = await execa(
    'flock',
    ['-w', '10', join(dir, 'lock'), 'find', ...files, '-maxdepth', '0', '-type', 'f', '-empty', '-delete', '-print'],
    { reject: false },
  );
  if (r.exitCode !== 0 && r.stdout === '') {
    const why =
      (r as { code?: string }).code === 'ENOENT' ? 'flock(1) is not installed (package util-linux)' : `exit ${r.exitCode}: ${r.stderr}`;
    throw new ToolError(
      'flock',
      ['-w', '10', join(dir, 'lock'), 'find', '…'],
      r.exitCode,
      `cannot free ${empty.length} empty reservation file(s) in ${dir}: ${why}`,
    );
  }
  return r.stdout
    .split('\n')
    .filter((l) => l !== '')
    .map((l) => l.slice(dir.length + 1));
}
