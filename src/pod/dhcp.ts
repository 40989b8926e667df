/**
 * What the core needs to know of the reference DHCP lease daemon (`dhcp daemon`, which the node
 * agent runs): whether it answers on its socket, and the error of an ADD that got no lease.
 *
 * The dhcp IPAM plugin is a thin client: each ADD asks the daemon (net/rpc over HTTP on a unix
 * socket) to acquire a lease from inside the pod's netns, on the pod's interface, with the client
 * ID `<container ID>/<network name>/<ifName>`; the daemon then renews it until a DEL asks it to
 * release it. The daemon keeps its leases in memory only: after it restarts, the core's
 * `readoptLeases` runs the plugin's ADD again for every known pod; the server recognises the
 * client ID and hands out the same address, and the new daemon renews it from then on.
 */
import { connect } from 'node:net';
import { KubenetError } from '../errors.js';

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
