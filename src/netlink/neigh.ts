/**
 * Permanent neighbours and VXLAN FDB entries, named after iproute2: `ip neigh replace IP lladdr MAC
 * dev IFINDEX nud permanent proto P`, `ip neigh del IP dev IFINDEX`, `bridge fdb replace MAC dev
 * IFINDEX dst IP [port P] [vni V] self permanent`, `bridge fdb del MAC dev IFINDEX [dst IP ...] self`,
 * in the process's namespace or (given `netns`) the one mounted there. The messages are built here
 * (struct ndmsg and NDA_* attributes: libnl's neighbour object knows no NDA_PORT, NDA_VNI or
 * NDA_PROTOCOL) and each change runs off the event loop on a socket of its own (./socket.ts); a list
 * of changes shares one socket and stops at the first refusal, as `ip -batch` does. Deleting what is
 * absent succeeds.
 */
import { NetlinkError } from '../errors.js';
import { familyOf } from '../net/ip.js';
import { CLEAN_NLE, E, NLE, nlError } from './errno.js';
import {
  AF_BRIDGE,
  AF_INET,
  AF_INET6,
  nl,
  NLM_F_CREATE,
  NLM_F_REPLACE,
  NLMSG_ALIGNTO,
  RTM_DELNEIGH,
  RTM_NEWNEIGH,
  type Ptr,
} from './libnl.js';
import { withHostSocket, withNetnsSocket, type Lease } from './socket.js';

/** linux/neighbour.h */
const NDA_DST = 1;
const NDA_LLADDR = 2;
const NDA_PORT = 6;
const NDA_VNI = 7;
const NDA_PROTOCOL = 12;
const NUD_NOARP = 0x40;
const NUD_PERMANENT = 0x80;
const NTF_SELF = 0x02;

/** One change: a permanent neighbour (IP -> MAC) or an FDB entry of a VXLAN device (MAC -> remote), set or deleted. */
export type NeighChange =
  | { kind: 'neigh'; op: 'replace' | 'del'; ifindex: number; ip: string; mac?: string; protocol?: number }
  | { kind: 'fdb'; op: 'replace' | 'del'; ifindex: number; mac: string; dst?: string; port?: number; vni?: number };

function describe(c: NeighChange): string {
  return c.kind === 'neigh'
    ? `neigh ${c.op} ${c.ip}${c.mac ? ` lladdr ${c.mac}` : ''} dev ${c.ifindex}`
    : `fdb ${c.op} ${c.mac} dev ${c.ifindex}${c.dst ? ` dst ${c.dst}` : ''}${c.port !== undefined ? ` port ${c.port}` : ''}${c.vni !== undefined ? ` vni ${c.vni}` : ''}`;
}

function ipBytes(op: string, ip: string): Buffer {
  const f = familyOf(ip);
  if (f === 4) return Buffer.from(ip.split('.').map(Number));
  if (f !== 6) throw new NetlinkError(op, E.EINVAL, `not an IP address: ${JSON.stringify(ip)}`);
  const [head = '', tail = ''] = ip.includes('::') ? ip.split('::') : [ip, ''];
  // A dotted IPv4 tail (::ffff:192.0.2.1) is its two last words.
  const words = (t: string) =>
    t === ''
      ? []
      : t.split(':').flatMap((w) => {
          if (!w.includes('.')) return [Number.parseInt(w, 16)];
          const [a = 0, b = 0, c = 0, d = 0] = w.split('.').map(Number);
          return [a * 256 + b, c * 256 + d];
        });
  const h = words(head);
  const tl = words(tail);
  const all = [...h, ...new Array<number>(8 - h.length - tl.length).fill(0), ...tl];
  const b = Buffer.alloc(16);
  for (const [i, w] of all.entries()) b.writeUInt16BE(w, i * 2);
  return b;
}

function macBytes(op: string, mac: string): Buffer {
  if (!/^[0-9a-f]{2}(:[0-9a-f]{2}){5}$/i.test(mac)) throw new NetlinkError(op, E.EINVAL, `not a MAC address: ${JSON.stringify(mac)}`);
  return Buffer.from(mac.split(':').map((x) => Number.parseInt(x, 16)));
}

/** The request for one change; the caller sends it (nl_send_sync frees it) or frees it. */
function build(op: string, c: NeighChange): Ptr {
  if (!Number.isInteger(c.ifindex) || c.ifindex <= 0) throw new NetlinkError(op, E.EINVAL, 'invalid ifindex');
  const fdb = c.kind === 'fdb';
  const ip = fdb ? c.dst : c.ip;
  const family = fdb ? AF_BRIDGE : familyOf(c.ip) === 6 ? AF_INET6 : AF_INET;
  // Validate everything before allocating: nothing to free on bad input.
  const attrs: Array<[number, Buffer]> = [];
  if (ip !== undefined) attrs.push([NDA_DST, ipBytes(op, ip)]);
  if (c.mac !== undefined) attrs.push([NDA_LLADDR, macBytes(op, c.mac)]);
  if (fdb && c.port !== undefined) {
    if (!Number.isInteger(c.port) || c.port < 1 || c.port > 65535) throw new NetlinkError(op, E.EINVAL, 'invalid port');
    const b = Buffer.alloc(2);
    b.writeUInt16BE(c.port); // __be16
    attrs.push([NDA_PORT, b]);
  }
  if (fdb && c.vni !== undefined) {
    if (!Number.isInteger(c.vni) || c.vni < 0 || c.vni > 0xffffff) throw new NetlinkError(op, E.EINVAL, 'invalid vni');
    const b = Buffer.alloc(4);
    b.writeUInt32LE(c.vni); // host order (x86_64, arm64)
    attrs.push([NDA_VNI, b]);
  }
  if (!fdb && c.protocol !== undefined && c.op === 'replace') attrs.push([NDA_PROTOCOL, Buffer.from([c.protocol])]);
  if (c.op === 'replace' && (c.mac === undefined || (fdb && ip === undefined)))
    throw new NetlinkError(op, E.EINVAL, fdb ? 'an FDB entry needs a MAC and a destination' : 'a neighbour needs a MAC');
  const msg = nl.nlmsg_alloc_simple(
    c.op === 'replace' ? RTM_NEWNEIGH : RTM_DELNEIGH,
    c.op === 'replace' ? NLM_F_CREATE | NLM_F_REPLACE : 0,
  ) as Ptr;
  if (!msg) throw new NetlinkError(op, E.ENOMEM, 'nlmsg_alloc_simple failed');
  try {
    // struct ndmsg: family u8, pad u8, pad u16, ifindex s32, state u16, flags u8, type u8.
    const ndm = Buffer.alloc(12);
    ndm.writeUInt8(family, 0);
    ndm.writeInt32LE(c.ifindex, 4);
    ndm.writeUInt16LE(c.op === 'replace' ? (fdb ? NUD_NOARP | NUD_PERMANENT : NUD_PERMANENT) : 0, 8);
    ndm.writeUInt8(fdb ? NTF_SELF : 0, 10);
    let rc = nl.nlmsg_append(msg, ndm, ndm.length, NLMSG_ALIGNTO) as number;
    for (const [type, data] of attrs) if (rc >= 0) rc = nl.nla_put(msg, type, data.length, data) as number;
    if (rc < 0) throw new NetlinkError(op, E.ENOMEM, 'building the request failed');
    return msg;
  } catch (err) {
    nl.nlmsg_free(msg);
    throw err;
  }
}

/**
 * Applies the changes in order on one socket. Every request is built first, so bad input (a MAC,
 * an address, a port) changes nothing; then the first change the kernel refuses throws, naming it
 * (the ones before it are done, as with `ip -batch`).
 */
export async function neighApply(changes: readonly NeighChange[], netns?: string): Promise<void> {
  if (changes.length === 0) return;
  const msgs: Array<{ op: string; c: NeighChange; msg: Ptr | undefined }> = [];
  try {
    for (const c of changes) {
      const op = describe(c);
      msgs.push({ op, c, msg: build(op, c) });
    }
    const run = async (l: Lease) => {
      for (const m of msgs) {
        const msg = m.msg;
        m.msg = undefined; // nl_send_sync frees it, whatever it returns
        const rc = await l.call(nl.nl_send_sync, l.sk, msg);
        // An entry already gone: success (ENOENT from the kernel is libnl's OBJ_NOTFOUND).
        if (rc < 0 && m.c.op === 'del' && Math.abs(rc) === NLE.OBJ_NOTFOUND) continue;
        if (rc < 0) {
          if (!CLEAN_NLE.has(Math.abs(rc))) l.retired = true;
          throw nlError(m.op, rc, E.ENOENT);
        }
      }
    };
    const op = `neighApply (${changes.length} changes)`;
    await (netns === undefined ? withHostSocket(op, run) : withNetnsSocket(op, netns, run));
  } finally {
    for (const m of msgs) if (m.msg) nl.nlmsg_free(m.msg);
  }
}
