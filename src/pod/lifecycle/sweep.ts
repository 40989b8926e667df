/**
 * The core's cleanup of what it no longer knows (network.ts): the startup reconcile of the pod
 * records with the node, and the sweep of leftovers of attachments that no longer exist
 * (reservations, veths on the bridge, host-port rules, tc objects) that GC and the reconcile share.
 */
import type { RuntimeConf } from '../../cni/types.js';
import { AggregateKubenetError } from '../../errors.js';
import { cidrContains } from '../../net/ip.js';
import { PLACEHOLDER_PORT, podCniArgs, podName, shortId } from '../attachment.js';
import { NETWORK_NAME, POD_IFNAME, withPortmap } from '../bridge-conf.js';
import type { Core } from './deps.js';
import { shapingOf } from './add.js';
import { delNetwork, teardown } from './del.js';
import { recordKey } from '../records/record.js';
import { markedUplink } from '../node/uplink.js';

/**
 * The startup reconcile: an ADD that never finished is undone; a pod whose netns is gone and whose
 * veth is gone too is torn down (a netns path that merely vanished, with the veth still there, is
 * kept: the runtime's DEL will come); shaping of unknown pods is removed; once the pod CIDR is
 * known, leftovers are swept.
 */
export async function reconcile(core: Core): Promise<void> {
  const errors: unknown[] = [];
  for (const r of core.store.all()) {
    const log = core.log.child({ pod: podName(r), id: shortId(r.containerId), reconcile: true });
    const key = recordKey(r.containerId, r.ifName);
    if (core.pending.has(key)) continue;
    const gone = r.phase === 'ready' && !core.kernel.podNetnsAlive(r) && !(await core.kernel.podVethPresent(r));
    if (r.phase === 'ready' && !gone) continue;
    if (!r.network && !core.hasPodCidr()) continue; // needs the pod CIDR's config
    log.info(
      { phase: r.phase, netns: r.netns },
      r.phase === 'adding' ? 'undoing an ADD that never finished' : 'the pod is gone (netns and veth): removing it',
    );
    await core.locks.run(key, () => teardown(core, r, log)).catch((err: unknown) => errors.push(err));
  }
  // Shaping: gone for pods without a record, put back as recorded for every live shaped pod.
  const shaped = core.store.all().filter((r) => r.phase === 'ready' && r.hostVeth && core.shaper.wants(r.limits));
  const known = new Set(core.store.all().map((r) => r.containerId));
  const unknown = core.shaper.list().filter((s) => !known.has(s.id)).length;
  if (unknown > 0) core.log.info({ pods: unknown }, 'removing the shaping of pods with no record');
  await core.shaper.reconcile(shaped.map(shapingOf)).catch((err: unknown) => errors.push(err));
  const states = new Map(core.shaper.states().map((st) => [st.id, st]));
  for (const r of shaped) {
    const st = states.get(r.containerId);
    if (st && JSON.stringify(st) !== JSON.stringify(r.shaping)) core.store.put({ ...r, shaping: st });
  }
  // A pod this shaper does not shape (no limits and no capacity now) loses the state an earlier one recorded: handed
  // to a later start with a capacity, it would describe tc objects that are gone.
  const wanted = new Set(shaped.map((r) => r.containerId));
  for (const r of core.store.all())
    if (r.phase === 'ready' && r.shaping && !wanted.has(r.containerId) && !states.has(r.containerId)) {
      const { shaping: _gone, ...rest } = r;
      core.store.put(rest);
    }
  if (core.ready()) await sweep(core, new Set()).catch((err: unknown) => errors.push(err));
  for (const err of errors) core.log.error({ err }, 'reconcile step failed');
}

/**
 * Removes what attachments that no longer exist left behind: reservations, veths on the bridge,
 * portmap's host-port rules, tc objects. The node is listed FIRST and the records after: a record
 * is written before its plugins run, so anything a concurrent ADD makes has its record by the time
 * the records are read. Veths are skipped while an ADD runs (its veth is not named in its record
 * until the bridge plugin returns).
 */
export async function sweep(core: Core, keep: Set<string>): Promise<void> {
  const ready = core.ready();
  if (!ready) return;
  const { conf } = ready;
  // Host-port rules are ours when they forward into our pods' subnets (the pod CIDR, or the LAN's).
  const subnets = core.mode().podSubnets(ready.subnets, core.store.all());
  const { held: reservations, empty: emptyReservations } = await core.mode().reservations();
  // The uplink (and one an earlier start enslaved) is a port of the bridge too, and may be a veth.
  const uplinks = new Set([core.mode().uplink, markedUplink(core.opts.stateDir)]);
  const veths = (await core.kernel.bridgeVeths(core.bridgeName)).filter((v) => !uplinks.has(v.name));
  const portRules = await core.kernel.hostPortRules(NETWORK_NAME);
  const records = core.store.all();
  const liveKeys = new Set([...keep, ...core.pending.keys(), ...records.map((r) => recordKey(r.containerId, r.ifName))]);
  const liveIds = new Set([...liveKeys].map((k) => k.slice(0, k.indexOf('@'))));
  const errors: unknown[] = [];
  const removed = { reservations: 0, veths: 0, hostPorts: 0, shaping: 0 };

  const stale = new Map<string, { containerId: string; ifName: string; ports: boolean }>();
  for (const r of reservations) {
    const key = recordKey(r.containerId, r.ifName);
    if (!liveKeys.has(key)) stale.set(key, { containerId: r.containerId, ifName: r.ifName, ports: false });
  }
  for (const [id, ips] of portRules) {
    // Only rules that forward into this node's pod subnets are this agent's to remove.
    if (liveIds.has(id) || ips.length === 0 || !ips.every((ip) => subnets.some((sub) => cidrContains(sub, ip)))) continue;
    const key = recordKey(id, POD_IFNAME);
    stale.set(key, { containerId: id, ifName: POD_IFNAME, ports: true });
  }
  for (const [key, s] of stale) {
    await core.locks
      .run(key, async () => {
        if (core.store.get(s.containerId, s.ifName) || core.pending.has(key)) return;
        const rt: RuntimeConf = {
          containerId: s.containerId,
          ifName: s.ifName,
          netns: '',
          args: podCniArgs({ namespace: '', name: '', containerId: s.containerId }),
        };
        if (s.ports) rt.capabilityArgs = { portMappings: [PLACEHOLDER_PORT] };
        await delNetwork(core, s.ports ? withPortmap(conf) : conf, rt);
        if (s.ports) removed.hostPorts++;
        if (reservations.some((r) => r.containerId === s.containerId)) removed.reservations++;
      })
      .catch((err: unknown) => errors.push(err));
  }
  if (emptyReservations.length > 0) {
    // Files a host-local killed mid-ADD created but never wrote (reservations.ts).
    await core
      .mode()
      .removeEmptyReservations(emptyReservations)
      .then(
        (freed) => {
          removed.reservations += freed.length;
          if (freed.length > 0) core.log.info({ addresses: freed }, 'released addresses a killed host-local had reserved without an owner');
        },
        (err: unknown) => errors.push(err),
      );
  }
  if (core.pending.size === 0) {
    const known = new Set(core.store.all().flatMap((r) => (r.hostVeth ? [r.hostVeth] : [])));
    // Asked all at once: veths go together in one kernel request (nl.linkDelete).
    await Promise.all(
      veths
        .filter((v) => !known.has(v.name))
        .map((v) =>
          core.kernel.deleteVeth(v.index).then(
            () => removed.veths++,
            (err: unknown) => errors.push(err),
          ),
        ),
    );
  }
  const liveNow = new Set(core.store.all().map((r) => r.containerId));
  for (const s of core.shaper.list()) {
    if (liveNow.has(s.id) || liveIds.has(s.id)) continue;
    await core.shaper.remove(s.id).then(
      () => removed.shaping++,
      (err: unknown) => errors.push(err),
    );
  }
  if (removed.reservations + removed.veths + removed.hostPorts + removed.shaping > 0)
    core.log.info(removed, 'removed leftovers of attachments that no longer exist');
  if (errors.length > 0) throw new AggregateKubenetError('kubenet: sweep of leftovers', errors);
}
