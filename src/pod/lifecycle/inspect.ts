/**
 * What the core reports about its attachments (network.ts holds the locks): the CNI CHECK of one,
 * and every ready pod's traffic as the kernel counts it.
 */
import { parseResult } from '../../cni/result.js';
import { KubenetError, UnknownPodError } from '../../errors.js';
import { bridgeOnly, podName, runtimeConf } from '../attachment.js';
import { NETWORK_NAME } from '../bridge-conf.js';
import type { Core } from './deps.js';
import { recordedOrCurrent } from './del.js';
import { NetnsError, sameNetns, type NetnsId } from '../netns.js';
import type { CheckRequest, PodTraffic } from '../requests.js';

/**
 * CNI CHECK: the attachment is recorded and complete, in the same netns; the reference bridge
 * plugin checks the pod's interface, addresses and routes against the recorded result; host ports
 * have their DNAT rules; a shaped pod is installed in the shaper.
 */
export async function checkAttached(core: Core, req: CheckRequest, netnsId: NetnsId): Promise<void> {
  const record = core.store.get(req.containerId, req.ifName);
  if (record?.phase !== 'ready' || !record.result) {
    throw new UnknownPodError(`container ${req.containerId} ${req.ifName} is not attached to ${NETWORK_NAME}`);
  }
  if (!sameNetns(record.netnsId, netnsId)) {
    throw new NetnsError(req.netns, `is not the network namespace container ${req.containerId} was attached in (${record.netns})`);
  }
  const network = record.network ?? recordedOrCurrent(core, record);
  // portmap's own CHECK (plugins 1.1.1) fails for every IPv4-only pod, looking for ip6tables
  // chains it never made (containernetworking/plugins#819): bridge alone, and the DNAT rules here.
  await core.modes.of(network).check(bridgeOnly(network), runtimeConf(record, req.netns), parseResult(record.result));
  if (record.portMappings.length > 0) await core.kernel.checkHostPorts(record.ips, record.portMappings);
  if (core.shaper.wants(record.limits) && !core.shaper.list().some((s) => s.id === record.containerId)) {
    throw new KubenetError(`pod ${podName(record)}: bandwidth limits are recorded but not installed`);
  }
}

/**
 * Every ready pod with the kernel's counters of its traffic, read over netlink (nothing exec'd, off
 * the event loop): the tc counters of each shaped direction (the shaper's CounterReader, which
 * reads again only what can have changed), and with `links` the host veth's own counters too, from
 * the one dump of every link's counters that read starts with.
 */
export async function podTraffic(core: Core, opts: { links?: boolean }): Promise<PodTraffic[]> {
  const ready = core.store.all().filter((r) => r.phase === 'ready');
  const byId = new Map(ready.map((r) => [r.containerId, r]));
  const snapshot = await core.shaper.counters((id) => byId.get(id)?.hostVethIndex);
  const shaping = new Map(snapshot.pods.map((c) => [c.id, c]));
  return ready.map((record) => {
    const t: PodTraffic = { record };
    const s = shaping.get(record.containerId);
    if (s && (s.ingress || s.egress)) t.shaping = s;
    if (opts.links && record.hostVethIndex) {
      const link = snapshot.links.get(record.hostVethIndex);
      if (link) t.link = link;
    }
    return t;
  });
}
