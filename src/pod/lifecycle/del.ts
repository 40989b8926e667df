/**
 * The core's DEL (network.ts holds the attachment's lock around it): an attachment undone step by
 * step, and what the plugins may still hold for a container ID no record names.
 */
import { performance } from 'node:perf_hooks';
import type { NetConf, NetConfList, RuntimeConf } from '../../cni/types.js';
import { AggregateKubenetError, NotReadyError } from '../../errors.js';
import type { Logger } from '../../log.js';
import { PLACEHOLDER_PORT, podCniArgs, podName, round, runtimeConf, safeParseResult } from '../attachment.js';
import { NETWORK_NAME, portmapOnly, withPortmap } from '../bridge-conf.js';
import type { CniResult } from '../../cni/types.js';
import type { Core, TeardownDeps } from './deps.js';
import type { PodRecord, PortMapping } from '../records/record.js';

/**
 * Undoes an attachment, every step even after failures, and removes its record only when all
 * succeeded (else a retried DEL runs them again; each is idempotent).
 */
export async function teardown(core: TeardownDeps, record: PodRecord, log: Logger): Promise<void> {
  const started = performance.now();
  const errors: unknown[] = [];
  const step = async (fn: () => Promise<unknown> | unknown) => {
    try {
      await fn();
    } catch (err) {
      errors.push(err);
    }
  };
  // What leaves through the pod's interface (a DHCP release): before its veth goes.
  await step(() => core.modes.of(record.network).releaseBeforeVeth(record, log));
  // The veth and the shaping together: the veth's qdiscs and its redirect to the ifb go with it,
  // the pod's classes and filters on the ifb (matched by its addresses) are removed meanwhile.
  // The address is released only after both, so no new pod gets it while they still match it.
  await Promise.all([
    step(() => core.shaper.remove(record.containerId, { vethDeleted: true })),
    step(() => core.kernel.deletePodVeth(record, core.bridgeName, core.store.all(), log)),
  ]);
  await step(async () => {
    const network = record.network ?? recordedOrCurrent(core, record);
    const rt = runtimeConf(record, '');
    const prev = record.result ? safeParseResult(record.result, log) : undefined;
    await delNetwork(core, network, rt, prev);
  });
  if (errors.length > 0) {
    for (const err of errors) log.error({ err }, 'teardown step failed');
    throw new AggregateKubenetError(`kubenet: teardown of pod ${podName(record)} (container ${record.containerId}) failed`, errors);
  }
  core.store.delete(record.containerId, record.ifName);
  log.info(
    { phase: record.phase, ms: round(performance.now() - started) },
    record.phase === 'ready' ? 'pod torn down' : 'unfinished setup undone',
  );
}

/**
 * The config for a record that kept none (converted from 0.1.0, which knew host-local only): the
 * bridge + host-local config of the current pod CIDR, with portmap for host ports.
 */
export function recordedOrCurrent(core: Pick<Core, 'requireReady' | 'modes' | 'settings'>, record: PodRecord): NetConf | NetConfList {
  const what = `tear down pod ${podName(record)} (its record keeps no network config)`;
  const ready = core.requireReady(what);
  if (ready.subnets.length === 0) throw new NotReadyError(`kubenet: cannot ${what}: no pod CIDR yet`);
  const conf = core.modes.legacy.conf(core.settings(), ready.subnets);
  return record.portMappings.length > 0 ? withPortmap(conf) : conf;
}

/** DEL of an attachment without a record: what the plugins may still hold for the container ID. */
export async function releaseUnknown(
  core: Pick<Core, 'mode' | 'modes' | 'kernel' | 'requireReady'>,
  containerId: string,
  ifName: string,
  portMappings: PortMapping[],
  log: Logger,
): Promise<void> {
  // A dhcp lease is only ever held for a recorded pod: no reservations.
  const held = (await core.mode().reservations()).held.some((r) => r.containerId === containerId && r.ifName === ifName);
  const hostPorts = portMappings.length > 0 || (await core.kernel.hostPortRules(NETWORK_NAME)).has(containerId);
  if (!held && !hostPorts) {
    log.debug('DEL of an unknown attachment: nothing held for it');
    return;
  }
  // Only an address needs the bridge config (host-local's ranges), so only it waits for the pod
  // CIDR; host ports alone go with portmap alone (a restarted agent may not know the CIDR yet).
  let network: NetConf | NetConfList = portmapOnly();
  if (held) {
    const conf = core.requireReady(`release the address container ${containerId} holds`).conf;
    network = hostPorts ? withPortmap(conf) : conf;
  }
  const rt: RuntimeConf = { containerId, ifName, netns: '', args: podCniArgs({ namespace: '', name: '', containerId }) };
  if (hostPorts) rt.capabilityArgs = { portMappings: portMappings.length > 0 ? portMappings : [PLACEHOLDER_PORT] };
  await delNetwork(core, network, rt);
  log.info({ address: held, hostPorts }, 'released what an unknown attachment still held');
}

/** The network's DEL, by the mode whose addresses its attachments hold (not the mode in force: a record made before the node changed modes keeps its network). */
export function delNetwork(core: Pick<Core, 'modes'>, network: NetConf | NetConfList, rt: RuntimeConf, prev?: CniResult): Promise<void> {
  return core.modes.of(network).del(network, rt, prev);
}
