/**
 * koffi declarations for libnl-3 / libnl-route-3 (3.7, /usr/include/libnl3) and the few libc calls
 * the netlink layer needs to enter a network namespace. Declarations only: no logic, no error mapping
 * (that lives in src/netlink). Every pointer type is opaque; ownership is documented per function.
 *
 * All functions are bound synchronously: each call blocks the calling thread (~µs for netlink, unless
 * the request waits on the kernel's RTNL lock). koffi also offers every binding as
 * `fn.async(...args, callback)` on a libuv pool thread; src/netlink makes every call that sends a
 * request that way (./pool.ts offLoop), the getters of the objects it gets back synchronously.
 */
import koffi from 'koffi';

/** libnl's struct types, opaque to us. Pointers to them arrive in JS as koffi external objects. */
export const types = {
  nl_sock: koffi.opaque('nl_sock'),
  nl_msg: koffi.opaque('nl_msg'),
  nl_cache: koffi.opaque('nl_cache'),
  nl_addr: koffi.opaque('nl_addr'),
  rtnl_link: koffi.opaque('rtnl_link'),
  rtnl_addr: koffi.opaque('rtnl_addr'),
  rtnl_class: koffi.opaque('rtnl_class'),
  rtnl_route: koffi.opaque('rtnl_route'),
  rtnl_nexthop: koffi.opaque('rtnl_nexthop'),
};

/** A pointer to one of the opaque types above, as koffi hands it out (never dereferenced in JS). */
export type Ptr = unknown;
/** An out-parameter holder for `T **`: pass `[null]`, read `[0]` after a successful call. */
export type Out = [Ptr];

const libnl = koffi.load('libnl-3.so.200');
const libroute = koffi.load('libnl-route-3.so.200');
const libc = koffi.load('libc.so.6');

/** netlink/netlink.h NETLINK_ROUTE (linux/netlink.h). */
export const NETLINK_ROUTE = 0;
/** sys/socket.h address families. */
export const AF_UNSPEC = 0;
export const AF_INET = 2;
export const AF_INET6 = 10;
/** Link-layer addresses (MACs) for nl_addr_parse. */
export const AF_LLC = 26;
/** sched.h */
export const CLONE_NEWNET = 0x40000000;
/** fcntl.h (Linux generic values, x86_64 and arm64 alike). */
export const O_RDONLY = 0;
export const O_CLOEXEC = 0o2000000;
/** linux/if.h net_device_flags. */
export const IFF_UP = 0x1;
export const IFF_LOOPBACK = 0x8;
export const IFF_POINTOPOINT = 0x10;
export const IFF_PROMISC = 0x100;

/** libnl-3 core (netlink/socket.h, netlink/netlink.h, netlink/errno.h, netlink/cache.h, netlink/addr.h). */
export const nl = {
  // netlink/socket.h — caller owns the socket: nl_socket_free (also closes it).
  nl_socket_alloc: libnl.func('nl_sock *nl_socket_alloc(void)'),
  nl_socket_free: libnl.func('void nl_socket_free(nl_sock *sk)'),
  // netlink/netlink.h — returns 0 or -NLE_*.
  nl_connect: libnl.func('int nl_connect(nl_sock *sk, int protocol)'),
  // netlink/errno.h — static string, never freed. Takes the (negative or positive) NLE code.
  nl_geterror: libnl.func('const char *nl_geterror(int error)'),
  // netlink/cache.h — objects returned by get_first/get_next are borrowed from the cache.
  nl_cache_free: libnl.func('void nl_cache_free(nl_cache *cache)'),
  // An empty cache of a kind ("route/class"), filled by nl_cache_pickup from what the socket
  // receives next (the reply to a request sent by hand); the caller owns it: nl_cache_free.
  nl_cache_alloc_name: libnl.func('int nl_cache_alloc_name(const char *kind, _Out_ nl_cache **result)'),
  nl_cache_pickup: libnl.func('int nl_cache_pickup(nl_sock *sk, nl_cache *cache)'),
  // netlink/msg.h — a request built by hand (header type + flags, then the family header appended);
  // the caller owns it: nlmsg_free. nl_send_auto completes it (seq, NLM_F_REQUEST, NLM_F_ACK unless the
  // socket disabled auto-ack) and sends it; nl_wait_for_ack then reads the kernel's ACK.
  nlmsg_alloc_simple: libnl.func('nl_msg *nlmsg_alloc_simple(int nlmsgtype, int flags)'),
  nlmsg_append: libnl.func('int nlmsg_append(nl_msg *msg, void *data, size_t len, int pad)'),
  nlmsg_free: libnl.func('void nlmsg_free(nl_msg *msg)'),
  nl_send_auto: libnl.func('int nl_send_auto(nl_sock *sk, nl_msg *msg)'),
  nl_wait_for_ack: libnl.func('int nl_wait_for_ack(nl_sock *sk)'),
  // nl_send_auto, then nlmsg_free (always), then nl_wait_for_ack: 0 or -NLE_*. src/netlink calls it
  // with `.async` where the kernel holds the answer long (a link's deletion).
  nl_send_sync: libnl.func('int nl_send_sync(nl_sock *sk, nl_msg *msg)'),
  // netlink/attr.h — appends a u32 attribute / `datalen` bytes of `data` (copied) to the message: 0 or -NLE_NOMEM.
  nla_put_u32: libnl.func('int nla_put_u32(nl_msg *msg, int attrtype, uint32_t value)'),
  nla_put: libnl.func('int nla_put(nl_msg *msg, int attrtype, int datalen, const void *data)'),
  // Typed walks of a link / address cache: same C functions, declared with the concrete object type.
  // Every libnl object starts with the nl_object header (NLHDR_COMMON), so the cast is the one libnl
  // itself does; koffi checks pointer types and would refuse an nl_object * where rtnl_link * is expected.
  link_cache_first: libnl.func('rtnl_link *nl_cache_get_first(nl_cache *cache)'),
  link_cache_next: libnl.func('rtnl_link *nl_cache_get_next(rtnl_link *obj)'),
  addr_cache_first: libnl.func('rtnl_addr *nl_cache_get_first(nl_cache *cache)'),
  addr_cache_next: libnl.func('rtnl_addr *nl_cache_get_next(rtnl_addr *obj)'),
  class_cache_first: libnl.func('rtnl_class *nl_cache_get_first(nl_cache *cache)'),
  class_cache_next: libnl.func('rtnl_class *nl_cache_get_next(rtnl_class *obj)'),
  route_cache_first: libnl.func('rtnl_route *nl_cache_get_first(nl_cache *cache)'),
  route_cache_next: libnl.func('rtnl_route *nl_cache_get_next(rtnl_route *obj)'),
  // netlink/addr.h — nl_addr_parse gives the caller a reference: nl_addr_put.
  nl_addr_parse: libnl.func('int nl_addr_parse(const char *addr, int hint, _Out_ nl_addr **result)'),
  nl_addr_put: libnl.func('void nl_addr_put(nl_addr *addr)'),
  // Writes into buf (a Buffer) and returns it as a string; appends "/len" when the prefix is not full.
  nl_addr2str: libnl.func('const char *nl_addr2str(const nl_addr *addr, char *buf, size_t size)'),
};

/** libnl-route-3 (netlink/route/link.h, netlink/route/addr.h). */
export const route = {
  // link.h — rtnl_link_alloc / rtnl_link_get_kernel give the caller a reference: rtnl_link_put.
  rtnl_link_alloc: libroute.func('rtnl_link *rtnl_link_alloc(void)'),
  rtnl_link_put: libroute.func('void rtnl_link_put(rtnl_link *link)'),
  rtnl_link_alloc_cache: libroute.func('int rtnl_link_alloc_cache(nl_sock *sk, int family, _Out_ nl_cache **result)'),
  rtnl_link_get_kernel: libroute.func('int rtnl_link_get_kernel(nl_sock *sk, int ifindex, const char *name, _Out_ rtnl_link **result)'),
  rtnl_link_change: libroute.func('int rtnl_link_change(nl_sock *sk, rtnl_link *orig, rtnl_link *changes, int flags)'),
  // Sends RTM_DELLINK for the link's ifindex (else name) and waits for the kernel's answer, which comes
  // only after the device is freed. Bound like the others; src/netlink calls it with `.async` (koffi
  // runs it on a libuv worker thread, so the socket and link passed must not be used meanwhile).
  rtnl_link_delete: libroute.func('int rtnl_link_delete(nl_sock *sk, const rtnl_link *link)'),
  rtnl_link_set_ifindex: libroute.func('void rtnl_link_set_ifindex(rtnl_link *link, int ifindex)'),
  // Strings returned by the getters are owned by the link object (copy before rtnl_link_put; koffi copies).
  rtnl_link_get_name: libroute.func('const char *rtnl_link_get_name(rtnl_link *link)'),
  rtnl_link_get_ifindex: libroute.func('int rtnl_link_get_ifindex(rtnl_link *link)'),
  rtnl_link_get_flags: libroute.func('unsigned int rtnl_link_get_flags(rtnl_link *link)'),
  rtnl_link_set_flags: libroute.func('void rtnl_link_set_flags(rtnl_link *link, unsigned int flags)'),
  rtnl_link_unset_flags: libroute.func('void rtnl_link_unset_flags(rtnl_link *link, unsigned int flags)'),
  rtnl_link_get_mtu: libroute.func('unsigned int rtnl_link_get_mtu(rtnl_link *link)'),
  rtnl_link_set_mtu: libroute.func('void rtnl_link_set_mtu(rtnl_link *link, unsigned int mtu)'),
  rtnl_link_get_txqlen: libroute.func('unsigned int rtnl_link_get_txqlen(rtnl_link *link)'),
  rtnl_link_set_txqlen: libroute.func('void rtnl_link_set_txqlen(rtnl_link *link, unsigned int txqlen)'),
  rtnl_link_get_master: libroute.func('int rtnl_link_get_master(rtnl_link *link)'),
  // IFLA_LINK: for a veth, the ifindex of its peer (in the peer's namespace); 0 when absent.
  rtnl_link_get_link: libroute.func('int rtnl_link_get_link(rtnl_link *link)'),
  // IFLA_LINK_NETNSID: the namespace (its id as this one knows it) the peer is in, when not this one; 0 or -NLE_AGAIN (absent).
  rtnl_link_get_link_netnsid: libroute.func('int rtnl_link_get_link_netnsid(rtnl_link *link, _Out_ int32_t *id)'),
  // NULL (-> null) when the link has no IFLA_INFO_KIND (physical NICs, loopback).
  rtnl_link_get_type: libroute.func('const char *rtnl_link_get_type(rtnl_link *link)'),
  // The link-layer address: borrowed from the link (never nl_addr_put it); set takes its own reference.
  rtnl_link_get_addr: libroute.func('nl_addr *rtnl_link_get_addr(rtnl_link *link)'),
  rtnl_link_set_addr: libroute.func('void rtnl_link_set_addr(rtnl_link *link, nl_addr *addr)'),
  // The link's counters (IFLA_STATS64), by rtnl_link_stat_id_t (RTNL_LINK_* below).
  rtnl_link_get_stat: libroute.func('uint64_t rtnl_link_get_stat(rtnl_link *link, int id)'),

  // addr.h — rtnl_addr_alloc gives the caller a reference: rtnl_addr_put.
  rtnl_addr_alloc: libroute.func('rtnl_addr *rtnl_addr_alloc(void)'),
  rtnl_addr_put: libroute.func('void rtnl_addr_put(rtnl_addr *addr)'),
  rtnl_addr_alloc_cache: libroute.func('int rtnl_addr_alloc_cache(nl_sock *sk, _Out_ nl_cache **result)'),
  rtnl_addr_delete: libroute.func('int rtnl_addr_delete(nl_sock *sk, rtnl_addr *addr, int flags)'),
  rtnl_addr_set_ifindex: libroute.func('void rtnl_addr_set_ifindex(rtnl_addr *addr, int ifindex)'),
  rtnl_addr_get_ifindex: libroute.func('int rtnl_addr_get_ifindex(rtnl_addr *addr)'),
  rtnl_addr_set_family: libroute.func('void rtnl_addr_set_family(rtnl_addr *addr, int family)'),
  rtnl_addr_get_family: libroute.func('int rtnl_addr_get_family(rtnl_addr *addr)'),
  rtnl_addr_set_prefixlen: libroute.func('void rtnl_addr_set_prefixlen(rtnl_addr *addr, int prefixlen)'),
  rtnl_addr_get_prefixlen: libroute.func('int rtnl_addr_get_prefixlen(rtnl_addr *addr)'),
  rtnl_addr_get_scope: libroute.func('int rtnl_addr_get_scope(rtnl_addr *addr)'),
  // set_local takes its own reference on the nl_addr; the caller still puts its own.
  rtnl_addr_set_local: libroute.func('int rtnl_addr_set_local(rtnl_addr *addr, nl_addr *local)'),
  // Borrowed from the rtnl_addr: never nl_addr_put it.
  rtnl_addr_get_local: libroute.func('nl_addr *rtnl_addr_get_local(rtnl_addr *addr)'),
};

/**
 * libnl-route-3 routes (netlink/route/route.h, nexthop.h). rtnl_route_alloc gives the caller a
 * reference (rtnl_route_put); rtnl_route_add_nexthop hands the nexthop to the route, which frees it.
 * Getters return objects borrowed from the route. rtnl_route_add sends RTM_NEWROUTE with
 * NLM_F_CREATE plus `flags` (NLM_F_REPLACE: replace a route with the same key).
 */
export const rt = {
  rtnl_route_alloc: libroute.func('rtnl_route *rtnl_route_alloc(void)'),
  rtnl_route_put: libroute.func('void rtnl_route_put(rtnl_route *route)'),
  rtnl_route_alloc_cache: libroute.func('int rtnl_route_alloc_cache(nl_sock *sk, int family, int flags, _Out_ nl_cache **result)'),
  rtnl_route_add: libroute.func('int rtnl_route_add(nl_sock *sk, rtnl_route *route, int flags)'),
  rtnl_route_delete: libroute.func('int rtnl_route_delete(nl_sock *sk, rtnl_route *route, int flags)'),
  rtnl_route_set_table: libroute.func('void rtnl_route_set_table(rtnl_route *route, uint32_t table)'),
  rtnl_route_get_table: libroute.func('uint32_t rtnl_route_get_table(rtnl_route *route)'),
  rtnl_route_set_family: libroute.func('int rtnl_route_set_family(rtnl_route *route, uint8_t family)'),
  rtnl_route_get_family: libroute.func('uint8_t rtnl_route_get_family(rtnl_route *route)'),
  rtnl_route_set_protocol: libroute.func('void rtnl_route_set_protocol(rtnl_route *route, uint8_t proto)'),
  rtnl_route_get_protocol: libroute.func('uint8_t rtnl_route_get_protocol(rtnl_route *route)'),
  // RT_SCOPE_NOWHERE (the default) makes libnl guess: link scope for a route without a gateway.
  rtnl_route_set_scope: libroute.func('void rtnl_route_set_scope(rtnl_route *route, uint8_t scope)'),
  rtnl_route_get_type: libroute.func('uint8_t rtnl_route_get_type(rtnl_route *route)'),
  // set_dst takes its own reference on the nl_addr; the caller still puts its own.
  rtnl_route_set_dst: libroute.func('int rtnl_route_set_dst(rtnl_route *route, nl_addr *addr)'),
  rtnl_route_get_dst: libroute.func('nl_addr *rtnl_route_get_dst(rtnl_route *route)'),
  rtnl_route_get_nnexthops: libroute.func('int rtnl_route_get_nnexthops(rtnl_route *route)'),
  rtnl_route_nexthop_n: libroute.func('rtnl_nexthop *rtnl_route_nexthop_n(rtnl_route *route, int n)'),
  rtnl_route_add_nexthop: libroute.func('void rtnl_route_add_nexthop(rtnl_route *route, rtnl_nexthop *nh)'),
  rtnl_route_nh_alloc: libroute.func('rtnl_nexthop *rtnl_route_nh_alloc(void)'),
  rtnl_route_nh_set_gateway: libroute.func('void rtnl_route_nh_set_gateway(rtnl_nexthop *nh, nl_addr *addr)'),
  rtnl_route_nh_get_gateway: libroute.func('nl_addr *rtnl_route_nh_get_gateway(rtnl_nexthop *nh)'),
  rtnl_route_nh_set_ifindex: libroute.func('void rtnl_route_nh_set_ifindex(rtnl_nexthop *nh, int ifindex)'),
  rtnl_route_nh_get_ifindex: libroute.func('int rtnl_route_nh_get_ifindex(rtnl_nexthop *nh)'),
  // RTNH_F_* flags of a nexthop (RTNH_F_ONLINK: the gateway is on the link whatever its addresses say).
  rtnl_route_nh_set_flags: libroute.func('void rtnl_route_nh_set_flags(rtnl_nexthop *nh, unsigned int flags)'),
  rtnl_route_nh_get_flags: libroute.func('unsigned int rtnl_route_nh_get_flags(rtnl_nexthop *nh)'),
  // RTA_METRICS by RTAX_* id (RTAX_MTU below): 0 or -NLE_*; get gives -NLE_OBJ_NOTFOUND when unset.
  rtnl_route_set_metric: libroute.func('int rtnl_route_set_metric(rtnl_route *route, int metric, unsigned int value)'),
  rtnl_route_get_metric: libroute.func('int rtnl_route_get_metric(rtnl_route *route, int metric, _Out_ uint32_t *value)'),
};

/** linux/rtnetlink.h */
export const RT_TABLE_MAIN = 254;
export const RTN_UNICAST = 1;
export const RT_SCOPE_UNIVERSE = 0;
/** linux/rtnetlink.h: RTAX_MTU (a route's path MTU metric), RTNH_F_ONLINK (a nexthop flag). */
export const RTAX_MTU = 2;
export const RTNH_F_ONLINK = 4;
export const NLM_F_REPLACE = 0x100;
/** linux/netlink.h: the kernel sends a request's resulting object back to the sender. */
export const NLM_F_ECHO = 0x8;
/** linux/rtnetlink.h */
export const RTM_GETTCLASS = 42;
export const RTM_DELLINK = 17;
export const RTM_SETLINK = 19;
/** linux/if_link.h: the link's group (u32; 0 is the default group, which the kernel never deletes by). */
export const IFLA_GROUP = 27;
/** sizeof(struct ifinfomsg) (linux/rtnetlink.h): family u8, pad u8, type u16, index s32, flags u32, change u32. */
export const IFINFOMSG_SIZE = 16;
/** linux/netlink.h NLMSG_ALIGNTO */
export const NLMSG_ALIGNTO = 4;
/** linux/netlink.h: create the object if absent (with NLM_F_REPLACE: replace it if present). */
export const NLM_F_CREATE = 0x400;
/** linux/rtnetlink.h neighbours (and bridge FDB entries: family AF_BRIDGE). */
export const RTM_NEWNEIGH = 28;
export const RTM_DELNEIGH = 29;
export const AF_BRIDGE = 7;

/**
 * libnl-route-3 traffic control (netlink/route/class.h, tc.h, qdisc/htb.h). A class cache holds the
 * classes of ONE device (RTM_GETTCLASS dumps are per ifindex in the kernel). The rtnl_tc_* getters
 * take `struct rtnl_tc *`, the header every class starts with (libnl's TC_CAST): declared here with
 * rtnl_class * for the same reason as the cache walks above.
 */
export const tc = {
  // The caller owns the cache: nl_cache_free. Classes walked from it are borrowed.
  rtnl_class_alloc_cache: libroute.func('int rtnl_class_alloc_cache(nl_sock *sk, int ifindex, _Out_ nl_cache **result)'),
  rtnl_tc_get_handle: libroute.func('uint32_t rtnl_tc_get_handle(rtnl_class *tc)'),
  rtnl_tc_get_parent: libroute.func('uint32_t rtnl_tc_get_parent(rtnl_class *tc)'),
  // Owned by the object (koffi copies the string).
  rtnl_tc_get_kind: libroute.func('const char *rtnl_tc_get_kind(rtnl_class *tc)'),
  // The kernel's counters of the object (TCA_STATS2), by enum rtnl_tc_stat (RTNL_TC_* below).
  rtnl_tc_get_stat: libroute.func('uint64_t rtnl_tc_get_stat(rtnl_class *tc, int id)'),
  // htb class rate in bytes/s (64-bit); 0 or -NLE_* (NOATTR without a rate, INVAL for a non-htb class).
  rtnl_htb_get_rate64: libroute.func('int rtnl_htb_get_rate64(rtnl_class *cls, _Out_ uint64_t *rate)'),
  rtnl_htb_get_ceil64: libroute.func('int rtnl_htb_get_ceil64(rtnl_class *cls, _Out_ uint64_t *ceil)'),
};

/** netlink/route/tc.h enum rtnl_tc_stat. */
export const RTNL_TC = {
  PACKETS: 0,
  BYTES: 1,
  RATE_BPS: 2,
  RATE_PPS: 3,
  QLEN: 4,
  BACKLOG: 5,
  DROPS: 6,
  REQUEUES: 7,
  OVERLIMITS: 8,
} as const;

/** netlink/route/link.h rtnl_link_stat_id_t (the first eight). */
export const RTNL_LINK = {
  RX_PACKETS: 0,
  TX_PACKETS: 1,
  RX_BYTES: 2,
  TX_BYTES: 3,
  RX_ERRORS: 4,
  TX_ERRORS: 5,
  RX_DROPPED: 6,
  TX_DROPPED: 7,
} as const;

/** libc: entering a network namespace without exec'ing anything. Return -1 and set errno (koffi.errno()). */
export const libcNs = {
  open: libc.func('int open(const char *path, int flags, ...)'),
  close: libc.func('int close(int fd)'),
  setns: libc.func('int setns(int fd, int nstype)'),
  // linux/nsfs.h NS_GET_NSTYPE on a namespace fd: its CLONE_NEW* type.
  ioctl: libc.func('int ioctl(int fd, unsigned long request, ...)'),
  // The same ioctl with a struct ifreq (net/if.h, 40 bytes) for the SIOC* interface requests.
  ioctlIfreq: libc.func('int ioctl(int fd, unsigned long request, _Inout_ uint8_t *ifr)'),
  socket: libc.func('int socket(int domain, int type, int protocol)'),
};

/**
 * libc socket calls on the fd of a libnl socket (`nl_socket_get_fd`), for reading counters in bulk
 * without libnl's objects (./stats-dump.ts). Buffers passed to them are koffi.alloc'd (stable
 * addresses): src/netlink calls `send` and `recvmmsg` with `.async`, on a libuv worker thread.
 * Return -1 and set errno (a synchronous call's koffi.errno(); an async call's errno is lost).
 */
export const libcSock = {
  // The libnl socket keeps the fd (nl_socket_free closes it).
  nl_socket_get_fd: libnl.func('int nl_socket_get_fd(const nl_sock *sk)'),
  send: libc.func('intptr_t send(int fd, void *buf, size_t len, int flags)'),
  // struct mmsghdr[vlen] (struct msghdr, 56 bytes, then unsigned msg_len, padded to 64); timeout NULL.
  recvmmsg: libc.func('int recvmmsg(int fd, void *msgvec, unsigned int vlen, int flags, void *timeout)'),
  setsockopt: libc.func('int setsockopt(int fd, int level, int name, const uint8_t *val, uint32_t len)'),
};
/** sys/socket.h: SOL_SOCKET options, recv flags; linux/netlink.h SOL_NETLINK. */
export const SOL_SOCKET = 1;
export const SO_RCVBUFFORCE = 33;
export const MSG_DONTWAIT = 0x40;
export const MSG_TRUNC = 0x20;
export const MSG_WAITFORONE = 0x10000;

/** linux/sockios.h: ifindex -> name (ENODEV when no link has that index); name -> ifindex, flags, MTU, txqueuelen. */
export const SIOCGIFNAME = 0x8910;
export const SIOCGIFINDEX = 0x8933;
export const SIOCGIFFLAGS = 0x8913;
export const SIOCGIFMTU = 0x8921;
export const SIOCGIFTXQLEN = 0x8942;
/** sizeof(struct ifreq) on Linux; ifr_ifindex is the int at offset IFNAMSIZ (16). */
export const IFREQ_SIZE = 40;
export const IFNAMSIZ = 16;
/** sys/socket.h */
export const SOCK_DGRAM = 2;
export const SOCK_CLOEXEC = 0o2000000;

/** linux/nsfs.h: _IO(0xb7, 0x3). */
export const NS_GET_NSTYPE = 0xb703;

/** errno of the last libc call on this thread. */
export function lastErrno(): number {
  return koffi.errno();
}
