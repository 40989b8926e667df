/**
 * What a node's VXLAN endpoint is known by to the others (`routes: auto`, route-plan.ts): its VTEP
 * MAC, derived from its InternalIP so nothing needs publishing for it, and the UDP port and VNI its
 * agent publishes on its Node (the annotation {@link VXLAN_ANNOTATION}), so a peer configured
 * otherwise is still reached and named.
 */
import { createHash } from 'node:crypto';
import { canonicalIp, familyOf } from '../../net/ip.js';

/** A VXLAN endpoint's UDP port and VNI. */
export interface VxlanSettings {
  port: number;
  vni: number;
}

/** The Node annotation where an agent with tunnels publishes its VXLAN settings: `port=8475,vni=98`. */
export const VXLAN_ANNOTATION = 'kubenet.io/vxlan';

export function formatVxlanSettings(v: VxlanSettings): string {
  return `port=${v.port},vni=${v.vni}`;
}

/** The annotation's value parsed; undefined for anything else than `port=P,vni=V` (1-65535, 1-16777215: the config's ranges). */
export function parseVxlanSettings(text: string | undefined): VxlanSettings | undefined {
  const m = /^port=(\d{1,5}),vni=(\d{1,8})$/.exec(text ?? '');
  if (!m) return undefined;
  const port = Number(m[1]);
  const vni = Number(m[2]);
  return port >= 1 && port <= 65535 && vni >= 1 && vni <= 0xffffff ? { port, vni } : undefined;
}

/**
 * The VTEP MAC of a node, derived from its InternalIP so every node computes every other's: locally
 * administered unicast `0e:6b` + the four octets of an IPv4 address (unique per address), or `0e` +
 * the first five bytes of SHA-256 of an IPv6 address's canonical text (a collision is detected by
 * the plan: the later Node by name gets no tunnel route and a reason).
 */
export function vtepMac(ip: string): string {
  const family = familyOf(ip);
  let bytes: number[];
  if (family === 4) bytes = [0x0e, 0x6b, ...ip.split('.').map(Number)];
  else if (family === 6) bytes = [0x0e, ...createHash('sha256').update(canonicalIp(ip)).digest().subarray(0, 5)];
  else throw new TypeError(`vtepMac: not an IP address: ${JSON.stringify(ip)}`);
  return bytes.map((b) => b.toString(16).padStart(2, '0')).join(':');
}

/** vtepMac remembered per address: a plan derives every peer's MAC (~2 µs each) at each Node change. */
const macMemo = new Map<string, string>();
export function peerMac(ip: string): string {
  let mac = macMemo.get(ip);
  if (mac === undefined) {
    if (macMemo.size >= 65_536) macMemo.clear();
    mac = vtepMac(ip);
    macMemo.set(ip, mac);
  }
  return mac;
}
