/**
 * The bytes of NETLINK_ROUTE answers parsed in JS (pure, no kernel access): the messages of a
 * datagram (nlmsghdr), a tc class (tcmsg, TCA_KIND, TCA_STATS2's basic and queue counters, htb's
 * rate and ceil from TCA_OPTIONS) and a link's counters (RTM_NEWSTATS, IFLA_STATS_LINK_64).
 * ./stats-dump.ts reads the datagrams; parsing them here instead of through libnl's objects and one
 * FFI getter per field is what makes reading thousands of classes cheap (docs/shaping.md, "What a
 * /metrics scrape costs"). Layouts: linux/netlink.h, rtnetlink.h, pkt_sched.h, gen_stats.h,
 * if_link.h.
 */
import type { LinkStats } from './link.js';
import type { TcClassStats } from './tc-class.js';

/** linux/netlink.h message types and flags. */
export const NLMSG = { NOOP: 1, ERROR: 2, DONE: 3, OVERRUN: 4 } as const;
export const NLM_F = { REQUEST: 0x1, MULTI: 0x2, ACK: 0x4, ECHO: 0x8, DUMP_INTR: 0x10, DUMP: 0x300 } as const;
export const NLMSG_HDRLEN = 16;
/** linux/rtnetlink.h */
export const RTM = { NEWTCLASS: 40, GETTCLASS: 42, NEWSTATS: 92, GETSTATS: 94 } as const;
export const TCMSG_SIZE = 20;
/** struct if_stats_msg: family u8, pad u8, pad u16, ifindex u32, filter_mask u32. */
export const IF_STATS_MSG_SIZE = 12;
/** if_link.h IFLA_STATS_LINK_64, and its bit in if_stats_msg.filter_mask. */
const IFLA_STATS_LINK_64 = 1;
export const IFLA_STATS_FILTER_LINK_64 = 1 << (IFLA_STATS_LINK_64 - 1);

const TCA_KIND = 1;
const TCA_OPTIONS = 2;
const TCA_STATS2 = 7;
const TCA_STATS_BASIC = 1;
const TCA_STATS_QUEUE = 3;
/** The qdisc's own statistics: htb's struct tc_htb_xstats (lends, borrows, giants, tokens, ctokens; 20 bytes). */
const TCA_STATS_APP = 4;
const TCA_STATS_PKT64 = 8;
const TCA_HTB_PARMS = 1;
const TCA_HTB_RATE64 = 6;
const TCA_HTB_CEIL64 = 7;
/** struct tc_htb_opt: rate (struct tc_ratespec, its u32 rate at 8), ceil (at 12, its rate at 20). */
const HTB_PARMS_RATE = 8;
const HTB_PARMS_CEIL = 20;
const NLA_TYPE_MASK = 0x3fff;

const align4 = (n: number) => (n + 3) & ~3;

/** A u64 as a number (exact below 2^53, which counters reach after ~28 years at 10 Gbit/s of bytes). */
function u64(b: Buffer, at: number): number {
  return b.readUInt32LE(at) + b.readUInt32LE(at + 4) * 0x1_0000_0000;
}

/** One message of a datagram: where it is, its type, flags and sequence number. */
export interface NlMessage {
  type: number;
  flags: number;
  seq: number;
  /** Offset of the message (its header) in the buffer, and its length (header included). */
  at: number;
  len: number;
}

/** Thrown for a datagram that is not a sequence of whole netlink messages. */
export class NetlinkParseError extends Error {}

/**
 * Calls `each` for every message of the datagram at `buf[at, at + len)`. Returns early with `true`
 * when `each` does (the caller has seen the end it waited for).
 */
export function forEachMessage(buf: Buffer, at: number, len: number, each: (m: NlMessage) => boolean | undefined): boolean {
  const end = at + len;
  let off = at;
  while (off + NLMSG_HDRLEN <= end) {
    const mlen = buf.readUInt32LE(off);
    if (mlen < NLMSG_HDRLEN || off + mlen > end)
      throw new NetlinkParseError(`netlink message of ${mlen} bytes at ${off - at} of a ${len}-byte datagram`);
    if (
      each({ type: buf.readUInt16LE(off + 4), flags: buf.readUInt16LE(off + 6), seq: buf.readUInt32LE(off + 8), at: off, len: mlen }) ===
      true
    )
      return true;
    off += align4(mlen);
  }
  return false;
}

/** The errno (positive; 0 for an ACK) of an NLMSG_ERROR, or of an NLMSG_DONE that carries one. */
export function messageErrno(buf: Buffer, m: NlMessage): number {
  if (m.len < NLMSG_HDRLEN + 4) return 0;
  return -buf.readInt32LE(m.at + NLMSG_HDRLEN);
}

/** The sequence number of the request an NLMSG_ERROR answers (the request's header follows the errno). */
export function erroredSeq(buf: Buffer, m: NlMessage): number | undefined {
  return m.len >= NLMSG_HDRLEN + 4 + NLMSG_HDRLEN ? buf.readUInt32LE(m.at + NLMSG_HDRLEN + 4 + 8) : undefined;
}

/** Calls `each(type, at, len)` for the attributes in `buf[at, end)` (payload offset and length). */
function forEachAttr(buf: Buffer, at: number, end: number, each: (type: number, at: number, len: number) => void): void {
  let off = at;
  while (off + 4 <= end) {
    const alen = buf.readUInt16LE(off);
    if (alen < 4 || off + alen > end) throw new NetlinkParseError(`netlink attribute of ${alen} bytes at ${off}`);
    each(buf.readUInt16LE(off + 2) & NLA_TYPE_MASK, off + 4, alen - 4);
    off += align4(alen);
  }
}

/** The ifindex a tc message (class or qdisc) is about. */
export function tcIfindex(buf: Buffer, m: NlMessage): number {
  return buf.readInt32LE(m.at + NLMSG_HDRLEN + 4);
}

/**
 * An RTM_NEWTCLASS message as TcClassStats (`tc -s class show`): handle and parent from the tcmsg,
 * the kind, the kernel's TCA_STATS2 counters (packets from TCA_STATS_PKT64 when the kernel adds it,
 * past 2^32), and for htb its ctokens (TCA_STATS_APP) and the rate and ceil in bits/s (the kernel keeps bytes/s; 64-bit attributes
 * past 2^32 bytes/s).
 */
export function parseTcClass(buf: Buffer, m: NlMessage): TcClassStats {
  const t = m.at + NLMSG_HDRLEN;
  if (m.len < NLMSG_HDRLEN + TCMSG_SIZE) throw new NetlinkParseError(`tc message of ${m.len} bytes`);
  const cls: TcClassStats = {
    handle: buf.readUInt32LE(t + 8),
    parent: buf.readUInt32LE(t + 12),
    kind: '',
    bytes: 0,
    packets: 0,
    drops: 0,
    overlimits: 0,
    backlog: 0,
    qlen: 0,
  };
  let options: [number, number] | undefined;
  let pkt64: number | undefined;
  let app: [number, number] | undefined;
  forEachAttr(buf, t + TCMSG_SIZE, m.at + m.len, (type, at, len) => {
    if (type === TCA_KIND) {
      const nul = buf.indexOf(0, at);
      cls.kind = buf.toString('latin1', at, nul >= at && nul < at + len ? nul : at + len);
    } else if (type === TCA_OPTIONS) {
      options = [at, len];
    } else if (type === TCA_STATS2) {
      forEachAttr(buf, at, at + len, (st, sat, slen) => {
        if (st === TCA_STATS_BASIC && slen >= 12) {
          cls.bytes = u64(buf, sat);
          cls.packets = buf.readUInt32LE(sat + 8);
        } else if (st === TCA_STATS_QUEUE && slen >= 20) {
          cls.qlen = buf.readUInt32LE(sat);
          cls.backlog = buf.readUInt32LE(sat + 4);
          cls.drops = buf.readUInt32LE(sat + 8);
          cls.overlimits = buf.readUInt32LE(sat + 16);
        } else if (st === TCA_STATS_PKT64 && slen >= 8) {
          pkt64 = u64(buf, sat);
        } else if (st === TCA_STATS_APP && slen >= 20) {
          app = [sat, slen];
        }
      });
    }
  });
  if (pkt64 !== undefined) cls.packets = pkt64;
  if (cls.kind === 'htb' && app) cls.ctokens = buf.readInt32LE(app[0] + 16);
  if (cls.kind === 'htb' && options) {
    const [oat, olen] = options;
    forEachAttr(buf, oat, oat + olen, (type, at, len) => {
      if (type === TCA_HTB_PARMS && len >= HTB_PARMS_CEIL + 4) {
        cls.rate ??= buf.readUInt32LE(at + HTB_PARMS_RATE) * 8;
        cls.ceil ??= buf.readUInt32LE(at + HTB_PARMS_CEIL) * 8;
      } else if (type === TCA_HTB_RATE64 && len >= 8) {
        cls.rate = u64(buf, at) * 8;
      } else if (type === TCA_HTB_CEIL64 && len >= 8) {
        cls.ceil = u64(buf, at) * 8;
      }
    });
  }
  return cls;
}

/** An RTM_NEWSTATS message (IFLA_STATS_LINK_64 asked): the link's ifindex and counters; undefined without them. */
export function parseLinkStats(buf: Buffer, m: NlMessage): { ifindex: number; stats: LinkStats } | undefined {
  const s = m.at + NLMSG_HDRLEN;
  if (m.len < NLMSG_HDRLEN + IF_STATS_MSG_SIZE) throw new NetlinkParseError(`stats message of ${m.len} bytes`);
  let stats: LinkStats | undefined;
  forEachAttr(buf, s + IF_STATS_MSG_SIZE, m.at + m.len, (type, at, len) => {
    // struct rtnl_link_stats64: rx_packets, tx_packets, rx_bytes, tx_bytes, rx_errors, tx_errors, rx_dropped, tx_dropped, ...
    if (type === IFLA_STATS_LINK_64 && len >= 64) {
      stats = {
        rxPackets: u64(buf, at),
        txPackets: u64(buf, at + 8),
        rxBytes: u64(buf, at + 16),
        txBytes: u64(buf, at + 24),
        rxDropped: u64(buf, at + 48),
        txDropped: u64(buf, at + 56),
      };
    }
  });
  return stats ? { ifindex: buf.readInt32LE(s + 4), stats } : undefined;
}

/** Writes a request header (and zeroes its family header) at `at`: NLM_F_REQUEST plus `flags`. */
export function writeRequest(buf: Buffer, at: number, type: number, flags: number, seq: number, bodyLen: number): number {
  const len = NLMSG_HDRLEN + bodyLen;
  buf.fill(0, at, at + len);
  buf.writeUInt32LE(len, at);
  buf.writeUInt16LE(type, at + 4);
  buf.writeUInt16LE(NLM_F.REQUEST | flags, at + 6);
  buf.writeUInt32LE(seq >>> 0, at + 8);
  return align4(len);
}
