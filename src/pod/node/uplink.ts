/**
 * The uplink of dhcp mode: a host interface enslaved to the pod bridge, so pods share the LAN's L2
 * segment and take their addresses from its DHCP server. In that mode the agent makes the bridge
 * itself (the bridge plugin finds it), enslaves the uplink and sets both up.
 *
 * The uplink must carry no IP address: once it is a bridge port, addresses on it no longer receive
 * traffic, so an uplink holding the node's own address is refused rather than cut off.
 *
 * `<stateDir>/uplink` names the interface the agent enslaved: a later start with another uplink, or
 * in host-local mode, takes that one off the bridge again, and the sweep of leftover veths never
 * takes an uplink (a veth, in tests) for a pod's.
 */
import { execa } from 'execa';
import { readFileSync, unlinkSync } from 'node:fs';
import { join } from 'node:path';
import { ConfigError, ToolError } from '../../errors.js';
import type { Logger } from '../../log.js';
import * as nl from '../../netlink/index.js';
import { writeFileAtomic } from '../../util/atomic-file.js';
import { fsError } from '../../util/fs-error.js';

const MARKER = 'uplink';

async function ip(args: string[]): Promise<void> {
  const r = await execa('ip', args, { reject: false });
  if (r.exitCode !== 0) throw new ToolError('ip', args, r.exitCode, r.stderr);
}

/** The interface an earlier start enslaved, from the marker; undefined when none. */
export function markedUplink(stateDir: string): string | undefined {
  try {
    const name = readFileSync(join(stateDir, MARKER), 'utf8').trim();
    return name === '' ? undefined : name;
  } catch {
    return undefined;
  }
}

/**
 * Makes `uplink` a port of the bridge (created when missing), both up. Refuses an uplink that does
 * not exist or carries an IP address (ConfigError). Idempotent.
 */
export async function ensureUplink(o: { bridgeName: string; uplink: string; mtu: number; stateDir: string }, log: Logger): Promise<void> {
  const up = await nl.ifPresent(nl.linkByName(o.uplink));
  if (!up) throw new ConfigError(`uplink ${o.uplink} does not exist on this node`);
  if (up.type === 'bridge') throw new ConfigError(`uplink ${o.uplink} is a bridge; name the interface that connects to the LAN`);
  const addrs = (await nl.addrList(o.uplink)).filter((a) => a.scope === 0);
  if (addrs.length > 0) {
    throw new ConfigError(
      `uplink ${o.uplink} carries ${addrs.map((a) => a.cidr).join(', ')}: a bridge port's own addresses stop receiving traffic; give the pods an interface without addresses (or move the node's address to the bridge ${o.bridgeName})`,
    );
  }
  let bridge = await nl.ifPresent(nl.linkByName(o.bridgeName));
  if (!bridge) {
    try {
      await ip(['link', 'add', 'name', o.bridgeName, 'mtu', String(o.mtu), 'type', 'bridge']);
      log.info({ bridge: o.bridgeName, mtu: o.mtu }, 'created the pod bridge for the uplink');
    } catch (err) {
      if (!(await nl.ifPresent(nl.linkByName(o.bridgeName)))) throw err; // made meanwhile: fine
    }
    bridge = await nl.linkByName(o.bridgeName);
  }
  if (bridge.type !== 'bridge') throw new ConfigError(`${o.bridgeName} exists and is not a bridge (${bridge.type ?? 'no kind'})`);
  if (markedUplink(o.stateDir) !== o.uplink)
    writeFileAtomic(join(o.stateDir, MARKER), `${o.uplink}\n`, { mode: 0o600, what: 'the uplink marker' });
  if (up.master !== bridge.index) {
    await ip(['link', 'set', 'dev', o.uplink, 'master', o.bridgeName]);
    log.info({ uplink: o.uplink, bridge: o.bridgeName }, 'uplink enslaved to the pod bridge');
  }
  if (!up.up) await ip(['link', 'set', 'dev', o.uplink, 'up']);
  if (!bridge.up) await ip(['link', 'set', 'dev', o.bridgeName, 'up']);
}

/**
 * Takes the interface an earlier start enslaved off the bridge, unless it is `keep` (the uplink
 * in force); the marker goes with it. A vanished interface is success.
 */
export async function releaseOldUplink(o: { bridgeName: string; stateDir: string; keep: string | undefined }, log: Logger): Promise<void> {
  const old = markedUplink(o.stateDir);
  if (!old || old === o.keep) return;
  const link = await nl.ifPresent(nl.linkByName(old));
  const bridge = await nl.ifPresent(nl.linkByName(o.bridgeName));
  if (link && bridge && link.master === bridge.index) {
    await ip(['link', 'set', 'dev', old, 'nomaster']);
    log.info({ uplink: old, bridge: o.bridgeName }, 'earlier uplink taken off the pod bridge');
  }
  try {
    unlinkSync(join(o.stateDir, MARKER));
  } catch (err) {
    if ((err as { code?: string }).code !== 'ENOENT') throw fsError(err, 'remove', 'the uplink marker', join(o.stateDir, MARKER));
  }
}
