/**
 * Counters read in bulk over a NETLINK_ROUTE socket of its own, asynchronously: every link's
 * counters of the namespace in ONE dump (RTM_GETSTATS, `ip -s link`'s figures without the rest of
 * each link), every tc class of a device in one dump (RTM_GETTCLASS), and any number of single
 * classes asked in one datagram (RTM_GETTCLASS requests with NLM_F_ECHO, batched: the kernel
 * answers each, and a class per device costs no dump of the device). The datagrams are read with
 * recvmmsg into koffi.alloc'd memory and parsed in JS (./stats-parse.ts), never through libnl's
 * objects and getters.
 *
 * Each kernel call (the send, the receive) runs on a libuv worker thread (koffi `.async`): the
 * kernel serves these requests under its RTNL lock, which a busy kernel can hold for hundreds of
 * milliseconds, and the event loop must not wait for it. The socket is used by one operation at a
 * time (they queue), and by no other code; each operation holds one of the call slots of the pool
 * threads kernel requests may use (./pool.ts).
 */
import koffi from 'koffi';
import { NetlinkError } from '../errors.js';
import { E } from './errno.js';
import { libcSock, MSG_TRUNC, MSG_WAITFORONE, nl, SO_RCVBUFFORCE, SOL_SOCKET, type Ptr } from './libnl.js';
import type { LinkStats } from './link.js';
import { connectSocket, socketInNetns, withCallSlot } from './socket.js';
import {
  erroredSeq,
  forEachMessage,
  IF_STATS_MSG_SIZE,
  IFLA_STATS_FILTER_LINK_64,
  messageErrno,
  NetlinkParseError,
  NLM_F,
  NLMSG,
  parseLinkStats,
  parseTcClass,
  RTM,
  TCMSG_SIZE,
  writeRequest,
  type NlMessage,
} from './stats-parse.js';
import type { TcClassStats } from './tc-class.js';

/** A dump's datagrams are at most ~32 KiB (the kernel's cap on a dump's skb): 64 of them per receive. */
const DUMP_SLOT = 32 * 1024;
const DUMP_SLOTS = 64;
/** A class answers in one small datagram (~250 bytes for htb): up to 1024 of them per receive (UIO_MAXIOV). */
const GET_SLOT = 2 * 1024;
const GET_SLOTS = 1024;
const ARENA = DUMP_SLOT * DUMP_SLOTS;
/** struct mmsghdr: msghdr (msg_iov at 16, msg_iovlen at 24, msg_flags at 48), msg_len at 56; 64 bytes. */
const MMSG = 64;
const IOVEC = 16;
/**
 * Requests per datagram. Each answer is a datagram the kernel allocates at ~4 KiB (NLMSG_GOODSIZE),
 * all of them queued before the first is read: 512 fit the receive buffer set below many times over.
 */
const GET_BATCH = 512;
const RCVBUF = 8 * 1024 * 1024;

/** A class to read: its device and handle (major << 16 | minor). */
export interface ClassRef {
  ifindex: number;
  handle: number;
}

/** What the kernel answered for a class: its counters, or the error (ENODEV: no such device; ENOENT: no such class or qdisc). */
export type ClassAnswer = TcClassStats | NetlinkError;

interface RecvLayout {
  vec: Ptr;
  view: Buffer;
  slots: number;
  slot: number;
}

function asyncCall(fn: (typeof libcSock)['send'], ...args: unknown[]): Promise<number> {
  return new Promise((resolve, reject) => {
    fn.async(...args, (err: unknown, rc: number) => (err ? reject(err instanceof Error ? err : new Error(String(err))) : resolve(rc)));
  });
}

let nextSeq = 1;

export class StatsSocket {
  private readonly fd: number;
  private readonly arena: Ptr;
  private readonly data: Buffer;
  private readonly dump: RecvLayout;
  private readonly get: RecvLayout;
  private readonly req: Ptr;
  private readonly reqView: Buffer;
  private readonly getBatch: number;
  private tail: Promise<unknown> = Promise.resolve();
  private closed = false;

  private constructor(
    private readonly sk: Ptr,
    private readonly label: string,
  ) {
    this.fd = libcSock.nl_socket_get_fd(sk) as number;
    const size = Buffer.alloc(4);
    size.writeInt32LE(RCVBUF);
    // Needs CAP_NET_ADMIN (the agent has it); without it the answers of a batch come in small groups.
    const forced = (libcSock.setsockopt(this.fd, SOL_SOCKET, SO_RCVBUFFORCE, size, 4) as number) === 0;
    this.getBatch = forced ? GET_BATCH : 8;
    this.arena = koffi.alloc('uint8_t', ARENA);
    this.data = Buffer.from(koffi.view(this.arena, ARENA));
    this.dump = this.layout(DUMP_SLOTS, DUMP_SLOT);
    this.get = this.layout(GET_SLOTS, GET_SLOT);
    this.req = koffi.alloc('uint8_t', GET_BATCH * (16 + TCMSG_SIZE));
    this.reqView = Buffer.from(koffi.view(this.req, GET_BATCH * (16 + TCMSG_SIZE)));
  }

  /** A socket in this process's namespace, or in the one at `netnsPath` (entered only to open it). */
  static open(netnsPath?: string): StatsSocket {
    const op = `stats socket${netnsPath ? ` in ${netnsPath}` : ''}`;
    return new StatsSocket(netnsPath ? socketInNetns(op, netnsPath) : connectSocket(op), op);
  }

  /** recvmmsg's vector over the arena: `slots` datagrams of `slot` bytes each. */
  private layout(slots: number, slot: number): RecvLayout {
    const vec = koffi.alloc('uint8_t', slots * (MMSG + IOVEC));
    const v = Buffer.from(koffi.view(vec, slots * (MMSG + IOVEC)));
    v.fill(0);
    const base = koffi.address(this.arena);
    const iovs = koffi.address(vec) + BigInt(slots * MMSG);
    for (let i = 0; i < slots; i++) {
      const iov = slots * MMSG + i * IOVEC;
      v.writeBigUInt64LE(base + BigInt(i * slot), iov);
      v.writeBigUInt64LE(BigInt(slot), iov + 8);
      v.writeBigUInt64LE(iovs + BigInt(i * IOVEC), i * MMSG + 16);
      v.writeBigUInt64LE(1n, i * MMSG + 24);
    }
    return { vec, view: v, slots, slot };
  }

  /** Runs `fn` when every earlier operation has finished: one at a time on the socket. */
  private exclusive<T>(fn: () => Promise<T>): Promise<T> {
    if (this.closed) return Promise.reject(new NetlinkError(this.label, E.EBADF, 'socket closed'));
    // Within the call slots (./pool.ts): its receives hold a pool thread while the kernel answers.
    const run = this.tail.then(() => withCallSlot(fn));
    this.tail = run.catch(() => undefined);
    return run;
  }

  private async send(op: string, len: number): Promise<void> {
    const rc = await asyncCall(libcSock.send, this.fd, this.req, len, 0);
    if (rc !== len) throw new NetlinkError(op, E.EIO, `send returned ${rc} of ${len} bytes`);
  }

  /**
   * Receives datagrams (blocking for the first, taking what else is queued) until `each` returns
   * true for a message. A receive that fails (the socket overran: answers were lost) throws.
   */
  private async receive(op: string, l: RecvLayout, each: (m: NlMessage) => boolean | undefined): Promise<void> {
    for (;;) {
      const n = await asyncCall(libcSock.recvmmsg, this.fd, l.vec, l.slots, MSG_WAITFORONE, null);
      if (n <= 0) throw new NetlinkError(op, E.EIO, 'recvmmsg failed (the receive buffer overran, answers were lost)');
      let done = false;
      for (let i = 0; i < n && !done; i++) {
        const len = l.view.readUInt32LE(i * MMSG + 56);
        if (l.view.readInt32LE(i * MMSG + 48) & MSG_TRUNC)
          throw new NetlinkError(op, E.EMSGSIZE, `a datagram of more than ${l.slot} bytes`);
        try {
          done = forEachMessage(this.data, i * l.slot, len, each);
        } catch (err) {
          if (err instanceof NetlinkParseError) throw new NetlinkError(op, E.EPROTO, err.message);
          throw err;
        }
      }
      if (done) return;
    }
  }

  /** Sends one dump request (`body` writes its family header) and hands each answer to `each` until NLMSG_DONE. */
  private async dumpAll(
    op: string,
    type: number,
    bodyLen: number,
    body: (b: Buffer, at: number) => void,
    each: (m: NlMessage) => void,
  ): Promise<void> {
    const seq = nextSeq++ >>> 0;
    const len = writeRequest(this.reqView, 0, type, NLM_F.DUMP, seq, bodyLen);
    body(this.reqView, 16);
    await this.send(op, len);
    await this.receive(op, this.dump, (m) => {
      if (m.seq !== seq) return false;
      if (m.type === NLMSG.DONE || m.type === NLMSG.ERROR) {
        const errno = messageErrno(this.data, m);
        if (errno > 0) throw new NetlinkError(op, errno, 'the kernel ended the dump with an error');
        return true;
      }
      each(m);
      return false;
    });
  }

  /**
   * `ip -s link` of every link in the namespace, by ifindex: ONE RTM_GETSTATS dump asking only
   * IFLA_STATS_LINK_64. A dump the kernel flags as interrupted (links came or went meanwhile) may
   * lack some links; nothing else is missing from it.
   */
  linkStats(): Promise<Map<number, LinkStats>> {
    const op = `${this.label}: link stats dump`;
    return this.exclusive(async () => {
      const out = new Map<number, LinkStats>();
      await this.dumpAll(
        op,
        RTM.GETSTATS,
        IF_STATS_MSG_SIZE,
        (b, at) => b.writeUInt32LE(IFLA_STATS_FILTER_LINK_64, at + 8),
        (m) => {
          if (m.type !== RTM.NEWSTATS) return;
          const s = parseLinkStats(this.data, m);
          if (s) out.set(s.ifindex, s.stats);
        },
      );
      return out;
    });
  }

  /** `tc -s class show dev IFINDEX`: every class of the device, one dump; [] for a device that does not exist. */
  classDump(ifindex: number): Promise<TcClassStats[]> {
    const op = `${this.label}: class dump of ${ifindex}`;
    return this.exclusive(async () => {
      const out: TcClassStats[] = [];
      await this.dumpAll(
        op,
        RTM.GETTCLASS,
        TCMSG_SIZE,
        (b, at) => b.writeInt32LE(ifindex, at + 4),
        (m) => {
          if (m.type === RTM.NEWTCLASS) out.push(parseTcClass(this.data, m));
        },
      );
      return out;
    });
  }

  /**
   * The given classes, each by its own RTM_GETTCLASS (NLM_F_ECHO: the kernel answers a class GET only
   * to a sender that asks for the echo), up to 512 per datagram: what reading a few classes of many
   * devices costs without dumping each device. Answers in the order asked.
   */
  classGet(refs: ClassRef[]): Promise<ClassAnswer[]> {
    const op = `${this.label}: class get`;
    return this.exclusive(async () => {
      const out: ClassAnswer[] = new Array<ClassAnswer>(refs.length);
      for (let from = 0; from < refs.length; from += this.getBatch) {
        const batch = refs.slice(from, from + this.getBatch);
        const seq0 = nextSeq;
        nextSeq = (nextSeq + batch.length) >>> 0;
        let len = 0;
        batch.forEach((r, i) => {
          const at = len;
          len += writeRequest(this.reqView, at, RTM.GETTCLASS, NLM_F.ECHO, seq0 + i, TCMSG_SIZE);
          this.reqView.writeInt32LE(r.ifindex, at + 16 + 4);
          this.reqView.writeUInt32LE(r.handle >>> 0, at + 16 + 8);
        });
        await this.send(op, len);
        let answered = 0;
        const index = (seq: number | undefined) => (seq === undefined ? -1 : (seq - seq0) >>> 0 < batch.length ? (seq - seq0) >>> 0 : -1);
        await this.receive(op, this.get, (m) => {
          if (m.type === RTM.NEWTCLASS) {
            const i = index(m.seq);
            if (i >= 0 && out[from + i] === undefined) {
              out[from + i] = parseTcClass(this.data, m);
              answered++;
            }
          } else if (m.type === NLMSG.ERROR) {
            const i = index(erroredSeq(this.data, m));
            const errno = messageErrno(this.data, m);
            if (i >= 0 && errno > 0 && out[from + i] === undefined) {
              const r = batch[i];
              out[from + i] = new NetlinkError(
                `${op} ${r?.ifindex} ${(r?.handle ?? 0).toString(16)}`,
                errno,
                errno === E.ENODEV ? 'no such device' : 'no such class',
              );
              answered++;
            }
          }
          return answered === batch.length;
        });
      }
      return out;
    });
  }

  /** Closes the socket once the operations queued so far are done; later ones fail with EBADF. */
  close(): void {
    if (this.closed) return;
    this.closed = true;
    void this.tail.then(() => {
      nl.nl_socket_free(this.sk);
      koffi.free(this.arena);
      koffi.free(this.dump.vec);
      koffi.free(this.get.vec);
      koffi.free(this.req);
    });
  }
}
