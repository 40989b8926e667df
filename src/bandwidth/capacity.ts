/**
 * The node's bandwidth capacity per direction: what the htb tree's node class runs at, what the
 * agent publishes on its Node as the extended resources of guarantees.ts, and what guarantees are
 * promised out of. Given by config (`egressCapacity`, `ingressCapacity`), else read from the
 * uplink's link speed (/sys/class/net/<dev>/speed, Mbit/s) where the kernel reports one; a device
 * that reports none (-1, or no file: most virtual devices) leaves guarantees off, and the agent says
 * so. The uplink is the device of the host's IPv4 default route unless config names one.
 */
import { readFile } from 'node:fs/promises';
import { formatBandwidth } from './limits.js';

export interface NodeCapacity {
  /** bits/s; undefined: no capacity that way (guarantees off). */
  egress?: number;
  ingress?: number;
  /** Where each figure came from, as `kubenet status` says it. */
  source: { egress: CapacitySource; ingress: CapacitySource };
  /** The device whose link speed was read, when one was. */
  device?: string;
}

export type CapacitySource = 'config' | 'link-speed' | 'unknown';

/** The link speed of a device in bits/s, or undefined when the kernel reports none (virtual devices, link down). */
export async function linkSpeed(device: string, sysfs = '/sys/class/net'): Promise<number | undefined> {
  let text: string;
  try {
    text = await readFile(`${sysfs}/${device}/speed`, 'utf8');
  } catch {
    return undefined; // no such device, or reading fails (EINVAL while the link is down)
  }
  const mbit = Number(text.trim());
  return Number.isSafeInteger(mbit) && mbit > 0 ? mbit * 1_000_000 : undefined;
}

/** The device of the first IPv4 default route in /proc/net/route, or undefined. */
export async function defaultRouteDevice(procRoute = '/proc/net/route'): Promise<string | undefined> {
  let text: string;
  try {
    text = await readFile(procRoute, 'utf8');
  } catch {
    return undefined;
  }
  for (const line of text.split('\n').slice(1)) {
    const [dev, dest, , , , , , mask] = line.trim().split(/\s+/);
    if (dev && dest === '00000000' && mask === '00000000') return dev;
  }
  return undefined;
}

/**
 * The capacity from config, each direction unset in config taken from the uplink's link speed (a
 * link's speed is the same both ways).
 */
export async function resolveCapacity(
  config: { egress?: number; ingress?: number; uplink?: string },
  io: { linkSpeed?: typeof linkSpeed; defaultRouteDevice?: typeof defaultRouteDevice } = {},
): Promise<NodeCapacity> {
  const out: NodeCapacity = { source: { egress: 'unknown', ingress: 'unknown' } };
  if (config.egress !== undefined) {
    out.egress = config.egress;
    out.source.egress = 'config';
  }
  if (config.ingress !== undefined) {
    out.ingress = config.ingress;
    out.source.ingress = 'config';
  }
  if (out.egress !== undefined && out.ingress !== undefined) return out;
  const device = config.uplink ?? (await (io.defaultRouteDevice ?? defaultRouteDevice)());
  if (device === undefined) return out;
  out.device = device;
  const speed = await (io.linkSpeed ?? linkSpeed)(device);
  if (speed === undefined) return out;
  for (const d of ['egress', 'ingress'] as const) {
    if (out[d] === undefined) {
      out[d] = speed;
      out.source[d] = 'link-speed';
    }
  }
  return out;
}

/** As `kubenet status` says it: "egress 10G (link speed of eth0), ingress 1G (config)". */
export function describeCapacity(c: NodeCapacity): string {
  return (['egress', 'ingress'] as const)
    .map((d) => {
      const v = c[d];
      if (v === undefined) return `${d} unknown (guarantees off: set ${d}Capacity)`;
      return `${d} ${formatBandwidth(v)} (${c.source[d] === 'config' ? 'config' : `link speed of ${c.device ?? '?'}`})`;
    })
    .join(', ');
}
