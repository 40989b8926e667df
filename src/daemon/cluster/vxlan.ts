/**
 * The VXLAN side of `routes: auto` (src/daemon/cluster/routes.ts): one VXLAN device per underlay
 * family, its permanent neighbours (a tunnel peer's inner address -> its VTEP MAC) and FDB entries
 * (VTEP MAC -> the peer's InternalIP). Everything on the device is the agent's: it is made with
 * `nolearning` and no group or remote (no multicast, no flooding), so no entry appears that the agent
 * did not write, and its neighbours carry protocol 98 as its routes do.
 *
 * Neighbour and FDB changes, the ones every Node change makes, go over netlink (src/netlink/neigh.ts:
 * one request per entry on one socket, off the event loop), as the routes do (src/netlink/route.ts).
 * The device itself (made or remade when this node's endpoint changes) and the listing of its entries
 * at each full reconcile (every 30 s) go through iproute2 (`ip -batch`, `ip -d -j link show`, `ip -j
 * neigh show`, `bridge -j fdb show`), which the netlink layer has no verbs for yet.
 */
import { execa } from 'execa';
import { NetlinkError, ToolError } from '../../errors.js';
import { canonicalIp, type Family } from '../../net/ip.js';
import { E, linkIndexByName, neighApply, netnsLinkByName, type NeighChange } from '../../netlink/index.js';
import { batch } from '../../shaper/tc-exec.js';
import type { Logger } from '../../log.js';
import {
  diffEntries,
  tunnelEndpoint,
  VXLAN_OVERHEAD,
  type LocalAddress,
  type NodeRouteSource,
  type RoutePlan,
  type TunnelDevice,
  type TunnelEntry,
} from './route-plan.js';

/** The device of a family as this node wants it. */
export interface VxlanSpec {
  family: Family;
  vni: number;
  port: number;
  /** This node's InternalIP of the family: the outer source. */
  local: string;
  /** The ifindex of the link holding `local`. */
  uplink: number;
  /** This node's VTEP MAC (route-plan.ts vtepMac). */
  mac: string;
}

/** The kernel side of the tunnels, replaceable in tests. */
export interface TunnelKernel {
  /** Makes the family's device match `spec` (made, or remade when its VNI, port, local address or uplink differ; its MAC, MTU and state set). */
  ensure(spec: VxlanSpec): Promise<TunnelDevice>;
  /** Deletes the family's device (absent: success); its routes, neighbours and FDB entries go with it. */
  remove(family: Family): Promise<void>;
  /** The device's neighbours (key IP, value MAC) and FDB entries (key MAC, value destination). */
  entries(family: Family): Promise<{ neighbours: TunnelEntry[]; fdb: TunnelEntry[] }>;
  /** Replaces and removes entries on the device (removal of an absent one is success). */
  apply(
    family: Family,
    neighbours: { replace: TunnelEntry[]; remove: TunnelEntry[] },
    fdb: { replace: TunnelEntry[]; remove: TunnelEntry[] },
  ): Promise<void>;
}

export const DEFAULT_VXLAN_NAMES: Record<Family, string> = { 4: 'kubenet-vx4', 6: 'kubenet-vx6' };

interface IpLink {
  ifindex: number;
  ifname: string;
  mtu: number;
  address?: string;
  flags?: string[];
  linkinfo?: { info_kind?: string; info_data?: Record<string, unknown> };
}

/** The TunnelKernel over iproute2, in this process's namespace or the named one (`ip -n NAME`: tests). */
export function iprouteTunnelKernel(o: { names?: Record<Family, string>; netns?: string; protocol: number }): TunnelKernel {
  const names = o.names ?? DEFAULT_VXLAN_NAMES;
  const ns = o.netns !== undefined ? ['-n', o.netns] : [];
  const netnsPath = o.netns !== undefined ? `/var/run/netns/${o.netns}` : undefined;
  const json = async <T>(tool: 'ip' | 'bridge', args: string[]): Promise<T> => {
    const argv = [...ns, '-j', ...args];
    const r = await execa(tool, argv, { reject: false });
    if (r.exitCode !== 0) throw new ToolError(tool, argv, r.exitCode, String(r.stderr ?? ''));
    const text = String(r.stdout).trim();
    return (text === '' ? [] : JSON.parse(text)) as T;
  };
  const run = (tool: 'ip' | 'bridge', lines: string[], optional?: Set<number>) =>
    batch(tool, lines, { ...(o.netns !== undefined ? { netns: o.netns } : {}), ...(optional ? { optional } : {}) });
  return {
    async ensure(spec) {
      const name = names[spec.family];
      const links = await json<IpLink[]>('ip', ['-d', 'link', 'show']);
      const uplink = links.find((l) => l.ifindex === spec.uplink);
      if (!uplink) throw new ToolError('ip', ['link', 'show'], 0, `vxlan ${name}: uplink ifindex ${spec.uplink} is gone`);
      const mtu = uplink.mtu - VXLAN_OVERHEAD[spec.family];
      const have = links.find((l) => l.ifname === name);
      const data = have?.linkinfo?.info_data ?? {};
      const lines: string[] = [];
      const same =
        have?.linkinfo?.info_kind === 'vxlan' &&
        data.id === spec.vni &&
        data.port === spec.port &&
        data.learning === false &&
        data.link === uplink.ifname &&
        typeof (data.local ?? data.local6) === 'string' &&
        canonicalIp(String(data.local ?? data.local6)) === spec.local;
      if (have && !same) lines.push(`link del ${name}`);
      if (!have || !same) {
        lines.push(`link add ${name} type vxlan id ${spec.vni} dstport ${spec.port} local ${spec.local} nolearning dev ${uplink.ifname}`);
      }
      if (!same || have?.address !== spec.mac || have.mtu !== mtu || !have.flags?.includes('UP'))
        lines.push(`link set ${name} address ${spec.mac} mtu ${mtu} up`);
      await run('ip', lines);
      const [now] = await json<IpLink[]>('ip', ['link', 'show', 'dev', name]);
      if (!now) throw new ToolError('ip', ['link', 'show', 'dev', name], 0, `vxlan ${name}: not found after it was set up`);
      return { ifindex: now.ifindex, mtu: now.mtu, mac: now.address ?? spec.mac };
    },
    async remove(family) {
      await run('ip', [`link del ${names[family]}`], new Set([1]));
    },
    async entries(family) {
      const name = names[family];
      // No device (yet): nothing on it.
      if (!(await json<IpLink[]>('ip', ['link', 'show'])).some((l) => l.ifname === name)) return { neighbours: [], fdb: [] };
      const neigh = await json<Array<{ dst: string; lladdr?: string }>>('ip', ['neigh', 'show', 'dev', name]);
      // The kernel shows an entry's port and VNI only where they differ from the device's.
      const fdb = await json<Array<{ mac: string; dst?: string; port?: number; vni?: number }>>('bridge', ['fdb', 'show', 'dev', name]);
      return {
        neighbours: neigh.map((n) => ({ key: canonicalIp(n.dst), value: (n.lladdr ?? '').toLowerCase() })),
        fdb: fdb.map((e) => ({ key: e.mac.toLowerCase(), value: e.dst ? fdbValue({ ...e, dst: canonicalIp(e.dst) }) : '' })),
      };
    },
    async apply(family, neighbours, fdb) {
      const name = names[family];
      const ifindex = netnsPath === undefined ? linkIndexByName(name) : (await netnsLinkByName(netnsPath, name))?.index;
      if (ifindex === undefined) throw new NetlinkError(`vxlan ${name}`, E.ENODEV, 'the device is gone');
      const fdbChange = (op: 'replace' | 'del', e: TunnelEntry): NeighChange => ({
        kind: 'fdb',
        op,
        ifindex,
        mac: e.key,
        ...parseFdbValue(e.value),
      });
      // FDB entries first: a neighbour is only useful once its MAC has a destination. Deleting an absent entry is success.
      await neighApply(
        [
          ...fdb.replace.map((e) => fdbChange('replace', e)),
          ...fdb.remove.map((e) => fdbChange('del', e)),
          ...neighbours.replace.map(
            (e): NeighChange => ({ kind: 'neigh', op: 'replace', ifindex, ip: e.key, mac: e.value, protocol: o.protocol }),
          ),
          ...neighbours.remove.map((e): NeighChange => ({ kind: 'neigh', op: 'del', ifindex, ip: e.key })),
        ],
        netnsPath,
      );
    },
  };
}

/**
 * An FDB entry's destination as `bridge fdb` takes it after `dst` and the kernel lists it: the
 * peer's InternalIP, then its port and VNI where they are not the device's.
 */
export function fdbValue(e: { dst: string; port?: number; vni?: number }): string {
  return `${e.dst}${e.port !== undefined ? ` port ${e.port}` : ''}${e.vni !== undefined ? ` vni ${e.vni}` : ''}`;
}

/** fdbValue read back: the destination, and the port and VNI where given (an empty value: no destination). */
export function parseFdbValue(value: string): { dst?: string; port?: number; vni?: number } {
  const [dst, ...rest] = value.split(' ');
  const out: { dst?: string; port?: number; vni?: number } = dst ? { dst } : {};
  for (let i = 0; i + 1 < rest.length; i += 2) {
    if (rest[i] === 'port') out.port = Number(rest[i + 1]);
    if (rest[i] === 'vni') out.vni = Number(rest[i + 1]);
  }
  return out;
}

/** `routes: auto`: the VXLAN side, its kernel and the VNI and UDP port every node of the cluster uses. */
export interface TunnelOptions {
  kernel: TunnelKernel;
  vni: number;
  port: number;
}

/** What the tunnel side holds per family after the last reconcile. */
interface TunnelState {
  spec: string;
  device: TunnelDevice;
  neighbours: TunnelEntry[];
  fdb: TunnelEntry[];
}

/**
 * The VXLAN half of a reconcile of src/daemon/cluster/routes.ts (NodeRoutes, one at a time): first
 * `ensure` the devices (their state goes into the plan), then `apply` the plan's neighbours and FDB
 * entries, before the routes that use them. Owns what the kernel held after the last reconcile, so
 * between full reconciles a change is diffed without listing the entries again.
 */
export class VxlanTunnels {
  /** Per family, the device and entries as the last reconcile left them. */
  private readonly tunnels: Partial<Record<Family, TunnelState>> = {};

  constructor(
    private readonly o: TunnelOptions,
    private readonly log: Logger,
  ) {}

  /**
   * `routes: auto`: this node's VXLAN device per family, made or corrected (at each full reconcile,
   * and when its endpoint changed), or deleted where this node has no endpoint of that family.
   */
  async ensure(
    self: NodeRouteSource | undefined,
    local: LocalAddress[],
    full: boolean,
  ): Promise<{ devices: Partial<Record<Family, TunnelDevice>>; problems: Partial<Record<Family, string>>; failed: number }> {
    const t = this.o;
    const devices: Partial<Record<Family, TunnelDevice>> = {};
    const problems: Partial<Record<Family, string>> = {};
    let failed = 0;
    for (const family of [4, 6] as const) {
      const ep = tunnelEndpoint(self, local, family);
      const held = this.tunnels[family];
      try {
        if ('problem' in ep) {
          problems[family] = ep.problem;
          if (held || full) {
            await t.kernel.remove(family);
            if (held) this.log.info({ family }, 'VXLAN device removed: this node has no endpoint of this family');
          }
          delete this.tunnels[family];
          this.tunnelsRead.delete(family);
          continue;
        }
        const spec: VxlanSpec = { family, vni: t.vni, port: t.port, local: ep.local, uplink: ep.uplink, mac: ep.mac };
        const key = JSON.stringify(spec);
        if (held && held.spec === key && !full) {
          devices[family] = held.device;
          continue;
        }
        const device = await t.kernel.ensure(spec);
        if (held?.spec !== key) this.log.info({ ...spec, ifindex: device.ifindex, mtu: device.mtu }, 'VXLAN device set up');
        // A device made again has no entries: read them (undefined) rather than trust the last.
        this.tunnels[family] =
          held?.spec === key && held.device.ifindex === device.ifindex
            ? { ...held, device }
            : { spec: key, device, neighbours: [], fdb: [] };
        if (held?.spec !== key || held.device.ifindex !== device.ifindex) this.tunnelsRead.delete(family);
        devices[family] = device;
      } catch (err) {
        failed++;
        delete this.tunnels[family];
        problems[family] = `its VXLAN device could not be set up (${err instanceof Error ? err.message : String(err)})`;
        this.log.warn({ err, family }, 'setting up the VXLAN device failed; trying again');
      }
    }
    return { devices, problems, failed };
  }

  /** Families whose entries were read from the kernel since their device was last (re)made. */
  private readonly tunnelsRead = new Set<Family>();

  /** `routes: auto`: the neighbour and FDB entries of each device brought to the plan; the failures. */
  async apply(plan: RoutePlan, full: boolean): Promise<number> {
    const t = this.o;
    let failed = 0;
    for (const family of [4, 6] as const) {
      const state = this.tunnels[family];
      if (!state) continue;
      try {
        if (full || !this.tunnelsRead.has(family)) {
          const now = await t.kernel.entries(family);
          state.neighbours = now.neighbours;
          state.fdb = now.fdb;
          this.tunnelsRead.add(family);
        }
        // The plan's entries of this family, as the kernel lists them: diffed now, and held after.
        const wantNeighbours = plan.neighbours.filter((n) => n.family === family).map((n) => ({ key: n.ip, value: n.mac }));
        const wantFdb = plan.fdb.filter((e) => e.family === family).map((e) => ({ key: e.mac, value: fdbValue(e) }));
        const neighbours = diffEntries(state.neighbours, wantNeighbours);
        const fdb = diffEntries(state.fdb, wantFdb);
        const changes = neighbours.replace.length + neighbours.remove.length + fdb.replace.length + fdb.remove.length;
        if (changes === 0) continue;
        await t.kernel.apply(family, neighbours, fdb);
        state.neighbours = wantNeighbours;
        state.fdb = wantFdb;
        this.log.info(
          {
            family,
            neighbours: { set: neighbours.replace.length, removed: neighbours.remove.length },
            fdb: { set: fdb.replace.length, removed: fdb.remove.length },
          },
          'VXLAN entries updated',
        );
      } catch (err) {
        failed++;
        this.tunnelsRead.delete(family);
        this.log.warn({ err, family }, 'updating the VXLAN neighbour or FDB entries failed; trying again');
      }
    }
    return failed;
  }
}
