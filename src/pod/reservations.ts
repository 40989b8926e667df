/**
 * The reservations of the reference host-local IPAM plugin, read (never written: host-local owns
 * them, under its own lock): one file per address under `<dataDir>/<network>/`, named after the
 * address and holding the container ID, then the interface name on a second line (host-local
 * 0.8.6+; older files hold only the ID).
 */
import { readdir, readFile } from 'node:fs/promises';
import { join } from 'node:path';
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
