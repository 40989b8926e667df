/**
 * Runs src/netlink/route.ts in the namespace this process was started in (test/netlink/route.test.ts
 * starts it with `ip netns exec`): reads one JSON list of operations from argv, prints one JSON
 * result per operation ({ok: value} or {err: {name, errno, message}}).
 */
import { routeDel, routeList, routeReplace } from '../../src/netlink/route.js';

type Op =
  | { op: 'list'; protocol: number }
  | { op: 'replace'; dst: string; gateway: string; ifindex: number; protocol: number }
  | { op: 'del'; dst: string; protocol: number };
const ops = JSON.parse(process.argv[2] ?? '[]') as Op[];
for (const o of ops) {
  try {
    const value = await (o.op === 'list' ? routeList(o.protocol) : o.op === 'replace' ? routeReplace(o) : routeDel(o.dst, o.protocol));
    console.log(JSON.stringify({ ok: value ?? null }));
  } catch (err) {
    const e = err as Error & { errno?: number };
    console.log(JSON.stringify({ err: { name: e.name, errno: e.errno, message: e.message } }));
  }
}
