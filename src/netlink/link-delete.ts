/**
 * Deleting a link without waiting for the kernel to free it (`linkDelete`), veths in flight together
 * deleted in one kernel request, and the tracking of the requests still outstanding. Each request
 * runs on a libuv pool thread (./pool.ts offLoop) with a socket of its own, within the deletions'
 * own slots (an answer comes only once the device is freed: these hold their thread longest).
 */
import { randomInt } from 'node:crypto';
import { IFINFOMSG_SIZE, IFLA_GROUP, nl, NLMSG_ALIGNTO, RTM_DELLINK, RTM_SETLINK, type Ptr } from './libnl.js';
import { ConfigError, NetlinkError } from '../errors.js';
import { E, NLE, nlError } from './errno.js';
import { linkIndexExists } from './ioctl.js';
import { checkUint } from './parse.js';
import { DELETE_SLOTS, offLoop, Slots } from './pool.js';
import { connectSocket } from './socket.js';

/** Veths deleted by one request at most. */
const MAX_BATCH = 64;
/** Per link: settles when the kernel has answered the request that deleted it. */
const deletions = new Set<Promise<void>>();
/** Pool threads held by kernel requests (deletions and group changes) outstanding. */
const slots = new Slots(DELETE_SLOTS);
const counts = { links: 0, requests: 0 };

/** Deletions started by linkDelete whose kernel request has not returned yet (the device not yet freed). */
export function linkDeletionsInFlight(): number {
  return deletions.size;
}

/** Resolves once every deletion started so far has been answered by the kernel (errors go to each caller's `finished`). */
export async function linkDeletionsSettled(): Promise<void> {
  while (deletions.size > 0) await Promise.all([...deletions]);
}

/** Links linkDelete was asked to delete, and the RTM_DELLINK requests it sent for them, since the process started. */
export function linkDeletionCounts(): { links: number; requests: number } {
  return { ...counts };
}

export interface LinkDeletion {
  /** Milliseconds until the link no longer resolved by index (what the caller waited for). */
  goneMs: number;
  /** Settles when the kernel answers the request: the device is freed, or the error. */
  finished: Promise<void>;
  /** Links the request that deleted this one deleted in all (1 unless a veth went in a batch; 0 when the link was already gone). */
  together: number;
}

export interface LinkDeleteOptions {
  /**
   * The caller has checked that the link is a veth: it may be deleted in one request with the
   * other veths whose deletion is asked meanwhile (see linkDelete).
   */
  veth?: boolean;
}

/**
 * `ip link del` of the link with `ifindex`, returning as soon as the link is gone from the namespace
 * rather than when the kernel has finished freeing it. The kernel unlists a link at the start of the
 * delete (its name, addresses and routes disappear, a veth's peer with it), but answers RTM_DELLINK
 * only after the device's last references are dropped and an RCU barrier has passed: tens of
 * milliseconds, many times what unlisting takes (measured: docs/netlink.md). So the request runs on
 * a libuv worker thread (koffi `.async`) with a socket of its own, and this polls the link by index
 * until it is gone, or until the request fails first (rejecting with its NetlinkError; ENODEV
 * counts as gone). A missing link is gone at once. Only for links in this process's own network
 * namespace. At most DELETE_SLOTS requests are outstanding at once (./pool.ts): beyond that a
 * request first waits for one to finish.
 *
 * With `veth: true` (the caller vouches for the kind), deletions asked while another veth batch is
 * still being unlisted wait for it and then go together: their links get a group of their own
 * (RTM_SETLINK IFLA_GROUP, a number drawn at random per process, then counted up, one per batch)
 * and one RTM_DELLINK deletes that group, so the kernel closes and unregisters them in one pass
 * with one set of RCU grace periods under the RTNL lock, not one per link (docs/netlink.md has the
 * figures). A veth asked alone is deleted by index as any other link. Every member of a batch
 * shares its request's outcome.
 */
export async function linkDelete(ifindex: number, opts: LinkDeleteOptions = {}): Promise<LinkDeletion> {
  const op = `linkDelete ${ifindex}`;
  checkUint(op, 'ifindex', ifindex, 0x7fffffff);
  if (ifindex === 0) throw new ConfigError(`${op}: ifindex must be positive`);
  counts.links++;
  const m = member(ifindex);
  if (opts.veth) {
    queued.push(m);
    pumpVeths();
  } else {
    void deleteTogether([m]);
  }
  return { goneMs: await m.gone, finished: m.finished, together: m.together };
}

interface Member {
  ifindex: number;
  /** Resolves with the ms until the link was gone; rejects with the request's error. */
  gone: Promise<number>;
  isGone: boolean;
  together: number;
  markGone(err?: NetlinkError): void;
  finished: Promise<void>;
  finish(err?: NetlinkError): void;
}

function member(ifindex: number): Member {
  const started = performance.now();
  let goneSettle!: [(ms: number) => void, (err: NetlinkError) => void];
  let finishSettle!: [() => void, (err: NetlinkError) => void];
  const gone = new Promise<number>((resolve, reject) => (goneSettle = [resolve, reject]));
  const finished = new Promise<void>((resolve, reject) => (finishSettle = [resolve, reject]));
  // The caller awaits `gone` and takes `finished`: neither may go unhandled meanwhile.
  gone.catch(() => undefined);
  const tracked = finished.catch(() => undefined);
  deletions.add(tracked);
  void tracked.then(() => deletions.delete(tracked));
  const m: Member = {
    ifindex,
    gone,
    isGone: false,
    together: 0,
    markGone(err) {
      if (m.isGone) return;
      m.isGone = true;
      if (err) goneSettle[1](err);
      else goneSettle[0](performance.now() - started);
    },
    finished,
    finish(err) {
      if (err) finishSettle[1](err);
      else finishSettle[0]();
    },
  };
  return m;
}

/** Veth deletions waiting for the batch being unlisted. */
const queued: Member[] = [];
let vethBatchRunning = false;

function pumpVeths(): void {
  if (vethBatchRunning || queued.length === 0) return;
  vethBatchRunning = true;
  void deleteTogether(queued.splice(0, MAX_BATCH)).finally(() => {
    vethBatchRunning = false;
    pumpVeths();
  });
}

/** The process's group numbers for batches: never 0 (the default group). */
let nextGroup = randomInt(0x10000, 0x7fff0000);
function groupForBatch(): number {
  const g = nextGroup;
  nextGroup = nextGroup >= 0x7ffffffe ? 0x10000 : nextGroup + 1;
  return g;
}

/** An RTM_DELLINK (or RTM_SETLINK) for `ifindex` (0: none), with IFLA_GROUP when `group` is given. */
function linkMessage(op: string, type: number, ifindex: number, group?: number): Ptr {
  const msg = nl.nlmsg_alloc_simple(type, 0) as Ptr;
  if (!msg) throw new NetlinkError(op, E.ENOMEM, 'nlmsg_alloc_simple failed');
  const ifi = Buffer.alloc(IFINFOMSG_SIZE);
  ifi.writeInt32LE(ifindex, 4);
  let rc = nl.nlmsg_append(msg, ifi, ifi.length, NLMSG_ALIGNTO) as number;
  if (rc >= 0 && group !== undefined) rc = nl.nla_put_u32(msg, IFLA_GROUP, group) as number;
  if (rc < 0) {
    nl.nlmsg_free(msg);
    throw nlError(op, rc);
  }
  return msg;
}

/** One request sent and its ACK awaited on a pool thread, in a slot; resolves with libnl's code (0 or -NLE_*), or koffi's own failure. */
function send(op: string, sk: Ptr, msg: Ptr): Promise<{ rc: number; callErr?: unknown }> {
  return slots
    .run(() => offLoop(op, nl.nl_send_sync, sk, msg))
    .then(
      (rc) => ({ rc }),
      (callErr: unknown) => ({ rc: -1, callErr }),
    );
}

/** ENODEV and "object not found" mean the link is already gone: success for a delete. */
function absent(rc: number): boolean {
  return Math.abs(rc) === NLE.NODEV || Math.abs(rc) === NLE.OBJ_NOTFOUND;
}

/** The error of an answered request, undefined for success or an absent link. */
function failure(op: string, answer: { rc: number; callErr?: unknown }): NetlinkError | undefined {
  if (answer.callErr)
    return answer.callErr instanceof NetlinkError
      ? answer.callErr
      : new NetlinkError(op, E.EIO, `koffi async call failed: ${String(answer.callErr)}`);
  return answer.rc < 0 && !absent(answer.rc) ? nlError(op, answer.rc) : undefined;
}

/**
 * Deletes `batch` (one link by index; several veths by a group of their own), settling each
 * member's `gone` when its link is unlisted and `finished` when the kernel answers.
 */
async function deleteTogether(batch: Member[]): Promise<void> {
  const op = batch.length === 1 ? `linkDelete ${batch[0]?.ifindex}` : `linkDelete ${batch.map((m) => m.ifindex).join(',')}`;
  let sk: Ptr | undefined;
  let members: Member[] = batch;
  try {
    sk = connectSocket(op);
    let msg: Ptr;
    if (batch.length === 1) {
      msg = linkMessage(op, RTM_DELLINK, batch[0]?.ifindex ?? 0);
    } else {
      const group = groupForBatch();
      members = [];
      for (const m of batch) {
        const answer = await send(op, sk, linkMessage(op, RTM_SETLINK, m.ifindex, group));
        const err = failure(`linkDelete ${m.ifindex}: set group ${group}`, answer);
        if (answer.rc >= 0 && !err) {
          members.push(m);
        } else {
          // Absent: already gone, a success for a delete.
          m.markGone(err);
          m.finish(err);
        }
      }
      if (members.length === 0) return;
      msg = linkMessage(op, RTM_DELLINK, 0, group);
    }
    counts.requests++;
    for (const m of members) m.together = members.length;
    let outcome: { err?: NetlinkError } | undefined;
    const socket = sk;
    sk = undefined; // freed once the request is answered
    void send(op, socket, msg).then((answer) => {
      nl.nl_socket_free(socket);
      const err = failure(op, answer);
      outcome = err ? { err } : {};
      for (const m of members) {
        m.markGone(err);
        m.finish(err);
      }
    });
    for (let polls = 0; !outcome && members.some((m) => !m.isGone); polls++) {
      // One ioctl per link and poll (~µs), not a netlink round trip with a whole link to parse.
      for (const m of members) if (!m.isGone && !linkIndexExists(m.ifindex)) m.markGone();
      if (members.every((m) => m.isGone)) break;
      // The first polls only yield to the event loop (unlisting takes well under a millisecond of
      // kernel time); after that, back off to timers so a slow delete does not spin a core.
      await new Promise<void>((r) => (polls < 50 ? setImmediate(r) : setTimeout(r, 1)));
    }
  } catch (err) {
    const e = err instanceof NetlinkError ? err : new NetlinkError(op, E.EIO, String(err));
    for (const m of batch) {
      m.markGone(e);
      m.finish(e);
    }
  } finally {
    if (sk) nl.nl_socket_free(sk);
  }
}
