/**
 * tc classes with the kernel's counters: one class by its handle (`classGet`, one RTM_GETTCLASS
 * request, the same cost whatever the device holds), and every class of a device (`classList`, one
 * dump of a device's classes, growing with them), sharing one conversion. Both synchronous on the
 * shared host socket, for their synchronous callers (the traffic counters, and the counters a reused
 * ifb class had: both can wait on the RTNL lock, docs/netlink.md). Measured: docs/netlink.md.
 */
import { ConfigError, NetlinkError } from '../errors.js';
import { E, NLE } from './errno.js';
import { nl, NLM_F_ECHO, NLMSG_ALIGNTO, RTM_GETTCLASS, RTNL_TC, tc, type Out, type Ptr } from './libnl.js';
import { linkIndex } from './link.js';
import { checkIfname, checkUint } from './parse.js';
import { check, dumpCache, hostSocket } from './socket.js';

/** One tc class with the kernel's counters (`tc -s class show dev NAME`). */
export interface TcClassStats {
  /** major << 16 | minor, e.g. 0x20001 for 2:1. */
  handle: number;
  parent: number;
  /** 'htb', ... */
  kind: string;
  /** Bytes and packets the class has sent (dequeued), L2 frames as the device carries them. */
  bytes: number;
  packets: number;
  /** Packets dropped (htb: by the class's leaf queue). */
  drops: number;
  /** Times the class was over its rate / ceil (htb: had to wait or borrow). */
  overlimits: number;
  /** Bytes and packets queued now (htb: in the leaf queue; 0 for an inner class). */
  backlog: number;
  qlen: number;
  /** htb only: the class's rate and ceil in bits/s. */
  rate?: number;
  ceil?: number;
  /** htb only, from the bulk reader (stats-dump.ts): what the class may still send at its ceil, in psched ticks; negative: over its ceil now, waiting. */
  ctokens?: number;
}

const rateOut: [number | bigint] = [0];

/** A u64 from koffi: a number, or a BigInt beyond 2^53 (counters are exact far below that). */
function u64(v: unknown): number {
  return typeof v === 'bigint' ? Number(v) : (v as number);
}

/** One class object of libnl (borrowed) as TcClassStats. */
export function toClassStats(c: Ptr): TcClassStats {
  const stat = (id: number) => u64(tc.rtnl_tc_get_stat(c, id));
  const kind = (tc.rtnl_tc_get_kind(c) as string | null) ?? '';
  const cls: TcClassStats = {
    handle: tc.rtnl_tc_get_handle(c) as number,
    parent: tc.rtnl_tc_get_parent(c) as number,
    kind,
    bytes: stat(RTNL_TC.BYTES),
    packets: stat(RTNL_TC.PACKETS),
    drops: stat(RTNL_TC.DROPS),
    overlimits: stat(RTNL_TC.OVERLIMITS),
    backlog: stat(RTNL_TC.BACKLOG),
    qlen: stat(RTNL_TC.QLEN),
  };
  if (kind === 'htb') {
    if ((tc.rtnl_htb_get_rate64(c, rateOut) as number) === 0) cls.rate = u64(rateOut[0]) * 8;
    if ((tc.rtnl_htb_get_ceil64(c, rateOut) as number) === 0) cls.ceil = u64(rateOut[0]) * 8;
  }
  return cls;
}

/**
 * `tc -s class show dev NAME` (NAME, or an ifindex): every class of the device with the kernel's
 * counters, from ONE RTM_GETTCLASS dump (the kernel dumps classes per device). No exec, no text:
 * the counters are the kernel's TCA_STATS2 as libnl parses them. A device without classes gives [];
 * a missing device throws NetlinkError ENODEV.
 */
export function classList(dev: string | number): TcClassStats[] {
  const op = `classList ${dev}`;
  const sk = hostSocket(op);
  let ifindex: number;
  if (typeof dev === 'number') {
    checkUint(op, 'ifindex', dev, 0x7fffffff);
    if (dev === 0) throw new ConfigError(`${op}: ifindex must be positive`);
    ifindex = dev;
  } else {
    checkIfname(op, dev);
    ifindex = linkIndex(sk, op, dev);
  }
  const cache = dumpCache(sk, op, (out) => tc.rtnl_class_alloc_cache(sk, ifindex, out) as number);
  try {
    const result: TcClassStats[] = [];
    for (let c = nl.class_cache_first(cache) as Ptr; c; c = nl.class_cache_next(c) as Ptr) result.push(toClassStats(c));
    return result;
  } finally {
    nl.nl_cache_free(cache);
  }
}

/**
 * `tc -s class show dev IFINDEX classid HANDLE`, without the dump: one RTM_GETTCLASS for the class
 * (NLM_F_ECHO: the kernel answers a class GET only as a notification, echoed to the asker), parsed
 * into a one-object cache. undefined when the device has no such class (or no qdisc of its major);
 * a missing device throws NetlinkError ENODEV.
 */
export function classGet(ifindex: number, handle: number): TcClassStats | undefined {
  const op = `classGet ${ifindex} ${handle.toString(16)}`;
  if (!Number.isInteger(ifindex) || ifindex <= 0 || ifindex > 0x7fffffff) throw new NetlinkError(op, E.EINVAL, 'invalid ifindex');
  const sk = hostSocket(op);
  const msg = nl.nlmsg_alloc_simple(RTM_GETTCLASS, NLM_F_ECHO) as Ptr;
  if (!msg) throw new NetlinkError(op, E.ENOMEM, 'nlmsg_alloc_simple failed');
  try {
    // struct tcmsg: family (u8), 3 bytes pad, ifindex (s32), handle (u32), parent (u32), info (u32).
    const tcmsg = Buffer.alloc(20);
    tcmsg.writeInt32LE(ifindex, 4);
    tcmsg.writeUInt32LE(handle >>> 0, 8);
    check(sk, op, nl.nlmsg_append(msg, tcmsg, tcmsg.length, NLMSG_ALIGNTO) as number);
    check(sk, op, nl.nl_send_auto(sk, msg) as number);
  } finally {
    nl.nlmsg_free(msg);
  }
  const out: Out = [null];
  check(sk, op, nl.nl_cache_alloc_name('route/class', out) as number);
  const cache = out[0];
  try {
    // The reply, then the ACK libnl asked for; an error (no such class, no such device) comes
    // instead of both and ends the exchange.
    const rc = nl.nl_cache_pickup(sk, cache) as number;
    if (rc < 0) {
      if (Math.abs(rc) === NLE.OBJ_NOTFOUND) return undefined;
      check(sk, op, rc, E.ENODEV);
    }
    check(sk, op, nl.nl_wait_for_ack(sk) as number);
    const c = nl.class_cache_first(cache) as Ptr;
    return c ? toClassStats(c) : undefined;
  } finally {
    nl.nl_cache_free(cache);
  }
}
