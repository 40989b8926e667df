/**
 * `kubenet uninstall [--config FILE] [--dry-run] [--force]`: removes from the node everything the
 * agent made, once the agent is gone (the DaemonSet deleted) and no pod uses the node; docs/cluster.md,
 * "Removing kubenet-ts from a node". Each object is removed by the module that owns it, in this
 * order:
 *   1. the conflist, then the forwarding binary (and the loopback plugin the installer copied), so
 *      no runtime calls a binary whose agent is gone (daemon/cni/install.ts);
 *   2. with --force only, the pods' veths (pod/node/removal.ts);
 *   3. the ifbs with their trees, the unshaped destinations' mangle chain (shaper/removal.ts);
 *   4. the bridge once no port is left on it, the dhcp uplink taken off it first (pod/node/removal.ts);
 *   5. the dedup ebtables chain and the masquerade nat rule (pod/node);
 *   6. the routes of protocol 98 (daemon/cluster/routes.ts);
 *   7. host-local's directory of the kubenet network, the pod records and the rest of the agent's
 *      state dir (the directory too, once empty), its sockets (and their directory, once empty).
 * Only what carries the agent's names, comment, chain or protocol is touched, never another
 * program's. It refuses, removing nothing, while the agent answers on its socket, and while pods
 * still have veths on the bridge, records or addresses, unless --force (then their veths go too).
 * Prints a line per object removed, kept (and why) or failed; exits 0 when the node is clean
 * (a second run: "nothing to do"), 1 when something was kept or failed.
 */
import { dirname } from 'node:path';
import { legacyShaperStateDir } from '../daemon/agent.js';
import { agentGet, HEALTH_PATH, ipamSocketPath } from '../daemon/protocol.js';
import { dhcpSocketPath, type AgentConfig } from '../daemon/config/config.js';
import { uninstallCni } from '../daemon/cni/install.js';
import { removeNodeRoutes } from '../daemon/cluster/routes.js';
import { createLogger } from '../log.js';
import { podsInUse, removeAddresses, removeBridge, removeNodeRules, removePodVeths, removeRecords } from '../pod/node/removal.js';
import { removeShaping } from '../shaper/removal.js';
import { removeEmptyDir, removePath, Removal } from '../util/removal.js';

export interface UninstallOptions {
  dryRun: boolean;
  force: boolean;
}

/** Whether something answers on the agent's socket (a refused or missing socket: no agent). */
async function agentAnswers(socket: string): Promise<boolean> {
  try {
    await agentGet(socket, HEALTH_PATH, 3_000);
    return true;
  } catch (err) {
    const code = (err as { code?: string }).code;
    return code !== 'ENOENT' && code !== 'ECONNREFUSED';
  }
}

/** Every step, in the order of the module doc. */
async function removeAll(c: AgentConfig, r: Removal, podVeths: string[]): Promise<void> {
  const log = createLogger({ level: 'warn' });
  const plumbing = { bridgeName: c.bridgeName, stateDir: c.stateDir, ipamDataDir: c.ipamDataDir };
  await uninstallCni(c, r);
  await removePodVeths(podVeths, r);
  await removeShaping(c.ifbName, r);
  await removeBridge(plumbing, r, log);
  await removeNodeRules(r, log);
  await removeNodeRoutes(r);
  await removeAddresses(plumbing, r);
  await removeRecords(plumbing, r);
  await removePath(r, "kubenet-ts 0.1.0's shaper state", legacyShaperStateDir(c.stateDir));
  if (!r.dryRun) await removeEmptyDir(r, "the agent's state directory", c.stateDir, 'holds files kubenet-ts did not make');
  for (const socket of [c.socket, ipamSocketPath(c.socket), dhcpSocketPath(c)]) await removePath(r, 'socket', socket);
  if (!r.dryRun) await removeEmptyDir(r, "the agent's socket directory", dirname(c.socket));
}

/** Runs the command; `out` takes each line of the report. Returns the exit code. */
export async function uninstall(c: AgentConfig, o: UninstallOptions, out: (line: string) => void = console.log): Promise<number> {
  if (await agentAnswers(c.socket)) {
    out(`refused: the kubenet agent answers on ${c.socket}; delete its DaemonSet (or stop \`kubenet daemon\`) first, nothing was removed`);
    return 1;
  }
  const pods = await podsInUse(c);
  const inUse = [
    ...pods.veths.map((v) => `veth ${v} on ${c.bridgeName}`),
    ...pods.records.map((p) => `pod ${p}`),
    ...pods.reservations.map((a) => `address ${a} reserved`),
  ];
  if (inUse.length > 0 && !o.force) {
    // What would go, listed as kept: nothing is removed while a pod may still need it.
    const would = new Removal(true);
    await removeAll(c, would, []);
    out(`refused: pods still use this node (delete them first, or run with --force to remove them too):`);
    for (const p of inUse) out(`  ${p}`);
    for (const s of would.steps) out(`kept ${s.what}: pods still use the node`);
    return 1;
  }
  const r = new Removal(o.dryRun);
  if (o.force) for (const p of inUse) out(`${o.dryRun ? 'would force out' : 'forced out'} ${p}`);
  await removeAll(c, r, o.force ? pods.veths : []);
  for (const line of r.lines()) out(line);
  return r.clean() ? 0 : 1;
}
