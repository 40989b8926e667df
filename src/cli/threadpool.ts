/**
 * Imported first by the `kubenet` command, before anything can queue work on libuv's thread pool:
 * the pool's size is read once, at its first use. Every netlink request that can wait on the
 * kernel's RTNL lock runs on a pool thread (src/netlink/pool.ts), and a pod veth's deletion holds
 * one until the kernel has freed the device (tens of milliseconds: docs/netlink.md); with the
 * default of 4 a burst of pods would leave one thread each to lookups and deletions. The netlink
 * layer keeps two threads for fs (the pod records) whatever the size. An operator's own
 * UV_THREADPOOL_SIZE wins.
 */
process.env.UV_THREADPOOL_SIZE ??= '16';
