/**
 * The pods' DHCP leases (ipam dhcp), through the reference dhcp IPAM plugin and its lease daemon
 * (`dhcp daemon`, which the node agent runs): whether the daemon answers on its socket, the error
 * of an ADD that got no lease, a pod's lease released at DEL, every known pod's lease acquired
 * again after the daemon restarted, and the LAN subnets the leases are in.
 *
 * The dhcp IPAM plugin is a thin client: each ADD asks the daemon (net/rpc over HTTP on a unix
 * socket) to acquire a lease from inside the pod's netns, on the pod's interface, with the client
 * ID `<container ID>/<network name>/<ifName>`; the daemon then renews it until a DEL asks it to
 * release it. The daemon keeps its leases in memory only: after it restarts, the core's
 * `readoptLeases` runs the plugin's ADD again for every known pod; the server recognises the
 * client ID and hands out the same address, and the new daemon renews it from then on.
 */
import { connect } from 'node:net';
import { performance } from 'node:perf_hooks';
import type { CniRuntime } from '../../cni/runtime.js';
import { KubenetError } from '../../errors.js';
import type { Logger } from '../../log.js';
import { parseCidr, parsePrefixed, type Subnet } from '../../net/ip.js';
import type { KeyedMutex } from '../../util/keyed-mutex.js';
import { podName, round, runtimeConf, shortId } from '../attachment.js';
import { dhcpIpamNetwork, dhcpIpamOf } from '../bridge-conf.js';
import { netnsIdIfAlive, sameNetns } from '../netns.js';
import { recordKey, type PodRecord, type PodStore } from '../records/record.js';

/** No lease within the configured time: no DHCP server answered (or the lease daemon is stuck). */
export class DhcpLeaseError extends KubenetError {}

/** Whether something accepts connections on the unix socket `path` within `timeoutMs`. */
export function socketAnswers(path: string, timeoutMs = 1000): Promise<boolean> {
  return new Promise((resolve) => {
    const sock = connect(path);
    const done = (ok: boolean) => {
      clearTimeout(timer);
      sock.destroy();
      resolve(ok);
    };
    const timer = setTimeout(() => done(false), timeoutMs);
    sock.once('connect', () => done(true));
    sock.once('error', () => done(false));
  });
}

/**
 * Releases the pod's DHCP lease: the dhcp plugin's DEL has the lease daemon stop renewing it and
 * send a DHCPRELEASE through the pod's interface (so: before the interface goes). A lease the
 * daemon does not hold is success (the plugin says so); a daemon that does not answer holds no
 * lease either: nothing renews it and the server lets it expire.
 */
export async function releaseLease(cni: CniRuntime, record: PodRecord, log: Logger): Promise<void> {
  const network = record.network;
  const ipam = dhcpIpamOf(network);
  if (!network || !ipam) return;
  if (!(await socketAnswers(ipam.daemonSocketPath))) {
    log.warn(
      { socket: ipam.daemonSocketPath, ips: record.ips },
      'the DHCP lease daemon does not answer: the lease is not released (nothing renews it; the server lets it expire)',
    );
    return;
  }
  const started = performance.now();
  // The netns path is only made absolute by the plugin (the daemon's release does not enter it).
  await cni.del(dhcpIpamNetwork(network), runtimeConf(record, record.netns));
  log.info({ ips: record.ips, ms: round(performance.now() - started) }, 'DHCP lease released');
}

/**
 * Has the lease daemon acquire again the lease of every ready dhcp pod of `store`, with the same
 * client ID (the dhcp plugin's ADD in the pod's netns, as at the pod's own ADD), each under its
 * pod's lock: the server recognises the client and hands out the same address, and the daemon
 * renews it from then on. For whenever the daemon (re)starts: it keeps leases in memory only. Pods
 * whose netns is gone are left to the reconcile and the runtime's DEL. Returns how many leases were
 * acquired again and which pods failed (to try again later).
 */
export async function readoptLeases(o: {
  cni: CniRuntime;
  store: PodStore;
  locks: KeyedMutex;
  log: Logger;
}): Promise<{ adopted: number; failed: string[] }> {
  const out = { adopted: 0, failed: [] as string[] };
  const records = o.store.all().filter((r) => r.phase === 'ready' && dhcpIpamOf(r.network));
  await Promise.all(
    records.map((r) =>
      o.locks.run(recordKey(r.containerId, r.ifName), async () => {
        const cur = o.store.get(r.containerId, r.ifName);
        if (!cur?.network || cur.phase !== 'ready' || !sameNetns(netnsIdIfAlive(cur.netns), cur.netnsId)) return;
        const log = o.log.child({ pod: podName(cur), id: shortId(cur.containerId) });
        const started = performance.now();
        try {
          const result = await o.cni.add(dhcpIpamNetwork(cur.network), runtimeConf(cur, cur.netns));
          const ips = result.ips.map((i) => i.address.split('/')[0] ?? '');
          const ms = round(performance.now() - started);
          if (ips.length > 0 && ips.every((ip) => cur.ips.includes(ip))) {
            out.adopted++;
            log.info({ ips, ms }, 'DHCP lease acquired again: same address');
          } else {
            out.failed.push(cur.containerId);
            log.error(
              { recorded: cur.ips, leased: ips, ms },
              'DHCP lease acquired again, but the server gave another address than the pod has',
            );
          }
        } catch (err) {
          out.failed.push(cur.containerId);
          log.warn({ err, ips: cur.ips, ms: round(performance.now() - started) }, 'could not acquire the DHCP lease again');
        }
      }),
    ),
  );
  if (records.length > 0) o.log.info({ pods: records.length, ...out }, 'DHCP leases of known pods acquired again');
  return out;
}

/** The subnets of the addresses in the records' results ("198.18.5.50/24" → 198.18.5.0/24). */
export function leaseSubnets(records: PodRecord[]): Subnet[] {
  const out = new Map<string, Subnet>();
  for (const r of records) {
    const ips = (r.result as { ips?: Array<{ address?: unknown }> } | undefined)?.ips ?? [];
    for (const i of ips) {
      const p = parsePrefixed(i.address);
      if (!p) continue;
      const sub = parseCidr(`${p.ip}/${p.prefixLen}`);
      out.set(sub.cidr, sub);
    }
  }
  return [...out.values()];
}
