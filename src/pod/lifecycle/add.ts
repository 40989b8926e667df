/**
 * The core's ADD (network.ts holds the locks around it): the checks against what the node holds,
 * the record of the intent before any plugin runs, the plugins (with the address mode's allocation
 * and the pod's egress shaping started beside the bridge exec), the veth looked up, the shaping,
 * the record of the result; a failure undoes what this ADD made (del.ts).
 */
import { performance } from 'node:perf_hooks';
import { setTimeout as sleep } from 'node:timers/promises';
import { convertResult, parseResult } from '../../cni/result.js';
import type { CniResult, NetConf, NetConfList, RuntimeConf } from '../../cni/types.js';
import type { Logger } from '../../log.js';
import { ConflictError, KubenetError } from '../../errors.js';
import type { PodShaping, ShapingState } from '../../shaper/tc.js';
import { differences, podCniArgs, podName, round, runtimeConf, shortId } from '../attachment.js';
import { CNI_VERSION, withPortmap } from '../bridge-conf.js';
import type { SetUpDeps } from './deps.js';
import { teardown } from './del.js';
import { NetnsError, type NetnsId } from '../netns.js';
import { RECORD_VERSION, recordKey, type PodRecord } from '../records/record.js';
import { LOOPBACK_NETWORK_NAME, type AttachRequest } from '../requests.js';
import { StepTimer } from './step-timer.js';
import type { LinkRef } from '../node/pod-kernel.js';
import type { PendingAdd } from './pending-adds.js';

const LOOPBACK_CONF: NetConf = { cniVersion: CNI_VERSION, name: LOOPBACK_NETWORK_NAME, type: 'loopback' };

/** The ADD of an attachment, under its lock and its netns's; `conf` is the network config in force. */
export async function setUp(
  core: SetUpDeps,
  req: AttachRequest,
  netnsId: NetnsId,
  conf: NetConf,
): Promise<{ record: PodRecord; result: CniResult; repeated: boolean }> {
  const started = performance.now();
  const steps = new StepTimer(started);
  const log = core.log.child({ pod: podName(req), id: shortId(req.containerId) });
  const repeated = await settleEarlierAdd(core, req, netnsId, log);
  if (repeated) return repeated;
  checkNetns(core, req, netnsId);
  steps.mark('lookup');
  await core.mode().precheck(conf, podName(req));
  steps.mark('precheck');
  // The intent, before any plugin runs.
  const record = intentRecord(req, netnsId, req.portMappings.length > 0 ? withPortmap(conf) : conf);
  core.store.put(record);
  steps.mark('record');
  const pending = core.pending.begin(recordKey(req.containerId, req.ifName));
  let beside: BesideExec | undefined;
  try {
    const network = record.network;
    const rt = runtimeConf(record, req.netns);
    // The bridge exists, pinned and tuned, before the bridge plugin adds the pod's veth to it.
    const bridge = await core.kernel.ensureBridge(core.settings(), log);
    await core.dedup.syncIfNewBridge(bridge.index);
    if (core.opts.manageLoopback) await core.cni.add(LOOPBACK_CONF, { ...rt, ifName: 'lo', capabilityArgs: {} });
    // portmap creates its top-level chains check-then-create: two at once, one fails (iptables-nft
    // "CHAIN_USER_ADD failed (File exists)", seen in the churn suite). One host-port ADD at a time.
    const run = () => core.mode().add(network, rt, podName(req));
    const exec = req.portMappings.length > 0 ? core.locks.run('portmap', run) : run();
    beside = new BesideExec(core, pending, req, { network, rt, bridgeIndex: bridge.index, exec, steps });
    const result = await exec;
    steps.mark('bridge');
    const ips = resultIps(result);
    if (ips.length === 0) throw new KubenetError(`pod ${podName(req)}: the bridge plugin returned no IP`);
    const hostVeth = result.interfaces.find((i) => !i.sandbox && i.name !== core.bridgeName)?.name;
    if (!hostVeth) throw new KubenetError(`pod ${podName(req)}: the bridge plugin returned no host veth`);
    record.ips = ips;
    record.hostVeth = hostVeth;
    await beside.egressSide;
    const shaped = await beside.vethSide?.catch((err: unknown) =>
      log.warn({ err }, 'shaping beside the bridge exec failed; shaping after it'),
    );
    const shapedHere = shaped?.hostVeth === hostVeth ? shaped : undefined;
    // The veth shaped beside the exec is the one reported: its index was found then.
    const hostVethIndex = shapedHere ? shapedHere.hostVethIndex : core.kernel.linkIndexByName(hostVeth);
    if (hostVethIndex === undefined)
      throw new KubenetError(`pod ${podName(req)}: the host veth ${hostVeth} the bridge plugin reported does not exist`);
    record.hostVethIndex = hostVethIndex;
    steps.mark('veth');
    if (shapedHere) {
      if (shapedHere.state) record.shaping = shapedHere.state;
    } else {
      if (shaped)
        log.error(
          { found: shaped.hostVeth, reported: hostVeth },
          'the veth shaped beside the exec is not the one the bridge plugin reported',
        );
      await applyShaping(core, record);
    }
    steps.mark('shape');
    record.phase = 'ready';
    record.result = convertResult(result, network.cniVersion);
    core.store.put(record);
    steps.mark('record2');
    log.info(
      {
        ips,
        hostVeth,
        limits: req.limits,
        hostPorts: req.portMappings.length,
        ms: round(performance.now() - started),
        ...steps.fields(log),
      },
      'pod set up',
    );
    return { record, result, repeated: false };
  } catch (err) {
    log.warn({ err }, 'pod setup failed; undoing what it made');
    // A host-local ADD still running would reserve an address after the undo's release of it.
    await beside?.settled();
    try {
      await teardown(core, record, log);
    } catch (undoErr) {
      // The record stays (phase adding): the runtime's DEL, or the next start, finishes the undo.
      log.error({ err: undoErr }, 'undoing the failed setup left something behind; the record is kept for DEL');
    }
    throw err;
  } finally {
    pending.end();
  }
}

/**
 * An earlier ADD of the attachment: finished with the same parameters, its recorded result (the ADD
 * repeated); finished with others, a ConflictError; unfinished, undone before this one runs.
 */
async function settleEarlierAdd(
  core: SetUpDeps,
  req: AttachRequest,
  netnsId: NetnsId,
  log: Logger,
): Promise<{ record: PodRecord; result: CniResult; repeated: true } | undefined> {
  const existing = core.store.get(req.containerId, req.ifName);
  if (existing?.phase === 'ready') {
    const diff = differences(existing, req, netnsId);
    if (diff.length === 0 && existing.result) {
      log.info('ADD repeated with the same parameters: returning the recorded result');
      return { record: existing, result: parseResult(existing.result), repeated: true };
    }
    throw new ConflictError(
      `container ${req.containerId} ${req.ifName} is already attached with other ${diff.join(', ')}; refusing a second ADD (DEL it first)`,
    );
  }
  if (existing) {
    log.warn({ since: existing.addedAt }, 'an earlier ADD of this attachment did not finish; undoing it before this one');
    await teardown(core, existing, log);
  }
  return undefined;
}

/** The pod's netns holds no other pod, and no interface of the name this ADD will make (its undo may then delete one found there). */
function checkNetns(core: SetUpDeps, req: AttachRequest, netnsId: NetnsId): void {
  const key = recordKey(req.containerId, req.ifName);
  const other = core.store.findByNetns(netnsId).find((r) => recordKey(r.containerId, r.ifName) !== key);
  if (other)
    throw new NetnsError(
      req.netns,
      `already holds pod ${podName(other)} (container ${other.containerId}); a second pod cannot be attached to it`,
    );
  // By ioctl in the pod's netns: no netlink request (nor the RTNL lock) on the ADD's way to its exec.
  if (core.kernel.podInterfaceIndex(req.netns, req.ifName) !== undefined) {
    throw new NetnsError(req.netns, `already has an interface ${req.ifName} that kubenet did not make`);
  }
}

/** The record of what the ADD will make, written before any plugin runs (phase `adding`). */
function intentRecord(
  req: AttachRequest,
  netnsId: NetnsId,
  network: NetConf | NetConfList,
): PodRecord & { network: NetConf | NetConfList } {
  return {
    version: RECORD_VERSION,
    containerId: req.containerId,
    ifName: req.ifName,
    namespace: req.namespace,
    name: req.name,
    netns: req.netns,
    netnsId,
    phase: 'adding',
    network,
    cniArgs: podCniArgs(req),
    portMappings: req.portMappings,
    limits: req.limits,
    ...(req.limitSources ? { limitSources: req.limitSources } : {}),
    ips: [],
    addedAt: new Date().toISOString(),
  };
}

/**
 * What an ADD does beside its bridge plugin's exec, started once the exec is on its way (the spawner
 * has the request), so that none of it delays the plugin's start:
 * - `allocation`: the mode's addresses, which the plugin fetches when it asks its IPAM (the shim;
 *   it asks only once it has started and made the veth, milliseconds later, on a later turn of the
 *   event loop than the one that set it in the pending ADD);
 * - `egressSide`: the pod's egress side on the shared ifb, which needs only the addresses;
 * - `vethSide`: the veth's side, as soon as the plugin has made the veth a port of the bridge (it
 *   then still configures the pod's netns): nothing of the shaping is left after it.
 * Each is undefined where the mode allocates through the plugin's own IPAM or the pod has no limits.
 */
class BesideExec {
  readonly allocation: Promise<CniResult> | undefined;
  readonly egressSide: Promise<unknown> | undefined;
  readonly vethSide: Promise<EarlyShaping | undefined> | undefined;

  constructor(
    core: SetUpDeps,
    pending: PendingAdd,
    req: AttachRequest,
    o: { network: NetConf | NetConfList; rt: RuntimeConf; bridgeIndex: number; exec: Promise<unknown>; steps: StepTimer },
  ) {
    const since = (what: string) => () => o.steps.note(what, performance.now() - o.steps.started);
    const allocation = core.mode().startAllocation(o.network, o.rt);
    this.allocation = allocation;
    if (!allocation) return;
    allocation.catch(() => undefined); // its failure reaches the bridge plugin through the shim
    pending.prefetch(allocation);
    void allocation.then(since('hostLocal'), () => undefined);
    const limits = req.limits;
    if (core.shaper.shapesEgress(limits)) {
      this.egressSide = allocation.then((r) =>
        core.shaper.ensure({ id: req.containerId, hostVeth: '', ips: resultIps(r), limits, group: req.namespace }),
      );
      this.egressSide.then(since('egressIfb'), () => undefined);
    }
    if (core.shaper.wants(limits)) {
      this.vethSide = shapeWhileExec(core, pending, req, o.bridgeIndex, allocation, this.egressSide, o.exec);
      this.vethSide.then(
        (e) => e && since('vethEarly')(),
        () => undefined,
      );
    }
  }

  /** Resolves once none of them runs any more (their failures are read where they are awaited). */
  async settled(): Promise<void> {
    await this.allocation?.catch(() => undefined);
    await this.egressSide?.catch(() => undefined);
    await this.vethSide?.catch(() => undefined);
  }
}

/** Shapes the pod as its limits say (without limits, any old shaping goes); the record keeps what was installed. */
export async function applyShaping(core: Pick<SetUpDeps, 'shaper'>, record: PodRecord): Promise<void> {
  if (!core.shaper.wants(record.limits)) {
    await core.shaper.remove(record.containerId);
    delete record.shaping;
    return;
  }
  if (!record.hostVeth) throw new KubenetError(`pod ${podName(record)}: no host veth to shape`);
  const state = await core.shaper.ensure(shapingOf(record));
  if (state) record.shaping = state;
}

/** What the shaper is asked for a recorded pod: its veth, addresses, limits and namespace (a namespace's total puts it under its class). */
export function shapingOf(record: PodRecord): PodShaping {
  return { id: record.containerId, hostVeth: record.hostVeth ?? '', ips: record.ips, limits: record.limits, group: record.namespace };
}

/** A CNI result's addresses without their prefix length. */
function resultIps(result: CniResult): string[] {
  return result.ips.map((i) => i.address.split('/')[0] ?? '').filter((ip) => ip !== '');
}

/** How often an ADD looks for its veth on the bridge when it was not there yet at the IPAM call. */
const VETH_POLL_MS = 1;

interface EarlyShaping {
  hostVeth: string;
  hostVethIndex: number;
  state: ShapingState | undefined;
}

/**
 * The pod's shaping made while the bridge plugin still runs. The plugin makes the veth a port of
 * the bridge before it asks its IPAM for the addresses (the shim: `PendingAdd.whenIpamAsked`), then spends
 * the rest of its run in the pod's netns. From that call the host veth is found (veth.ts
 * hostEndOnBridge; looked for again every VETH_POLL_MS should it not be there yet) and shaped with
 * the addresses the agent allocated, after the ifb side `egressFirst` made. Undefined when the
 * exec ended first: the ADD then shapes after it, as without this.
 */
async function shapeWhileExec(
  core: SetUpDeps,
  pending: PendingAdd,
  req: AttachRequest,
  bridgeIndex: number,
  prefetch: Promise<CniResult>,
  egressFirst: Promise<unknown> | undefined,
  exec: Promise<unknown>,
): Promise<EarlyShaping | undefined> {
  let done = false;
  const ended = exec.then(
    () => (done = true),
    () => (done = true),
  );
  await Promise.race([pending.whenIpamAsked(), ended]);
  const claimed = new Set(core.store.all().flatMap((r) => (r.hostVethIndex ? [r.hostVethIndex] : [])));
  let veth: LinkRef | undefined;
  while (!done && veth === undefined) {
    veth = await core.kernel.hostEndOnBridge(req.netns, req.ifName, bridgeIndex, claimed);
    if (veth === undefined) await sleep(VETH_POLL_MS);
  }
  if (veth === undefined) return undefined;
  const ips = resultIps(await prefetch);
  await egressFirst;
  const state = await core.shaper.ensure({ id: req.containerId, hostVeth: veth.name, ips, limits: req.limits, group: req.namespace });
  return { hostVeth: veth.name, hostVethIndex: veth.index, state };
}
