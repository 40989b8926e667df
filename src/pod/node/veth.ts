/**
 * The pod's veth, seen from the host: found only where it is provably the pod's (the recorded
 * ifindex still carrying the recorded name, or the peer of the pod's interface inside the recorded
 * netns while that netns is still the same one), and deleted without waiting for the kernel to
 * free it (nl.linkDelete).
 */
import type { Logger } from '../../log.js';
import * as nl from '../../netlink/index.js';
import { round } from '../attachment.js';
import { netnsIdIfAlive, sameNetns } from '../netns.js';
import type { PodRecord } from '../records/record.js';

/**
 * Deletes the pod's veth from the host side, returning once it is gone (nl.linkDelete: the kernel
 * frees it on a worker thread). Only a link that is provably the pod's: the recorded ifindex still
 * carries the recorded name, is a veth and a port of the bridge; without a recorded index (an
 * unfinished ADD, a 0.1.0 record), the peer of the pod's interface seen from inside the recorded
 * netns, when that netns is still the same one. Anything else is left alone.
 */
export async function deletePodVeth(record: PodRecord, bridgeName: string, records: PodRecord[], log: Logger): Promise<void> {
  const bridgeIndex = nl.linkIndexByName(bridgeName);
  if (bridgeIndex === undefined) return; // no bridge: no pod veth either
  const candidates: Array<() => Promise<nl.LinkInfo | undefined>> = [
    async () => {
      const link = record.hostVethIndex ? await nl.ifPresent(nl.linkByIndex(record.hostVethIndex)) : undefined;
      return link && link.name === record.hostVeth ? link : undefined;
    },
    async () => {
      if (!sameNetns(netnsIdIfAlive(record.netns), record.netnsId)) return undefined;
      const inPod = await nl.netnsLinkByName(record.netns, record.ifName);
      return inPod?.type === 'veth' && inPod.peerIndex > 0 ? nl.ifPresent(nl.linkByIndex(inPod.peerIndex)) : undefined;
    },
    async () => {
      // A 0.1.0 record whose netns is gone: the name alone, unless another record claims it.
      if (!record.hostVeth || record.hostVethIndex || record.netnsId) return undefined;
      if (records.some((r) => r !== record && r.containerId !== record.containerId && r.hostVeth === record.hostVeth)) return undefined;
      return nl.ifPresent(nl.linkByName(record.hostVeth));
    },
  ];
  for (const find of candidates) {
    const link = await find();
    if (!link) continue;
    if (link.type !== 'veth' || link.master !== bridgeIndex) {
      log.warn(
        { link: link.name, type: link.type, master: link.master },
        'a link named for the pod is not a veth on the bridge; leaving it alone',
      );
      continue;
    }
    const { goneMs, finished, together } = await nl.linkDelete(link.index, { veth: true });
    finished.catch((err: unknown) => log.error({ err, hostVeth: link.name }, 'the kernel failed to finish deleting the pod veth'));
    log.debug({ hostVeth: link.name, goneMs: round(goneMs), together }, 'pod veth deleted');
    return;
  }
  // An ADD cut short (the agent died while the bridge plugin ran) can leave the pod's interface in
  // its netns with the host end not yet on the bridge. The netns held no such interface when that
  // ADD began (it checked, under the netns's lock), so it is that ADD's own: delete it from inside.
  if (record.phase === 'adding' && sameNetns(netnsIdIfAlive(record.netns), record.netnsId)) {
    const inPod = await nl.netnsLinkByName(record.netns, record.ifName);
    if (inPod?.type === 'veth') {
      await nl.netnsLinkDelete(record.netns, record.ifName);
      log.info({ netns: record.netns, ifName: record.ifName }, "deleted the unfinished ADD's interface inside the pod's netns");
    }
  }
}

/**
 * The host end of the pod's interface once the bridge plugin has made it a port of the bridge, or
 * undefined while it has not (yet): the pod's interface in its netns is a veth whose peer is in
 * another namespace, that peer's index here is a veth on `bridgeIndex` whose own peer is in another
 * namespace with the pod interface's index, and no other pod's record claims it. For an ADD that
 * still runs the bridge plugin (its netns held no such interface when it began, under its lock).
 */
export async function hostEndOnBridge(
  netns: string,
  ifName: string,
  bridgeIndex: number,
  claimed: ReadonlySet<number>,
): Promise<nl.LinkInfo | undefined> {
  const inPod = await nl.netnsLinkByName(netns, ifName);
  if (inPod?.type !== 'veth' || !inPod.peerElsewhere || inPod.peerIndex <= 0 || claimed.has(inPod.peerIndex)) return undefined;
  const host = await nl.ifPresent(nl.linkByIndex(inPod.peerIndex));
  return host?.type === 'veth' && host.master === bridgeIndex && host.peerElsewhere && host.peerIndex === inPod.index ? host : undefined;
}

/** Whether the pod's host veth still exists (by recorded index, else by name). */
export async function podVethPresent(r: PodRecord): Promise<boolean> {
  const link = r.hostVethIndex
    ? await nl.ifPresent(nl.linkByIndex(r.hostVethIndex))
    : r.hostVeth
      ? await nl.ifPresent(nl.linkByName(r.hostVeth))
      : undefined;
  return link !== undefined && (r.hostVeth === undefined || link.name === r.hostVeth);
}
