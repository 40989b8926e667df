/**
 * Imported first by the `kubenet` command, before anything can queue work on libuv's thread pool:
 * the pool's size is read once, at its first use. The agent keeps a pod veth's deletion on a pool
 * thread until the kernel has freed the device (netlink linkDelete, tens of milliseconds each:
 * docs/netlink.md), so with the default of 4 a burst of pod deletions would leave little room for
 * fs work. An operator's own UV_THREADPOOL_SIZE wins.
 */
process.env.UV_THREADPOOL_SIZE ??= '16';
