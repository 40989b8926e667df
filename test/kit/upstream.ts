/**
 * Where the upstream parts built by hack/build-upstream.sh are (versions pinned in
 * hack/upstream/<part>/go.mod): native/build/upstream/<part>, a symlink to the version-keyed cache.
 * Tests, benches and the demo take the reference CNI plugins, containerd and runc from here, never
 * from the host's own packages.
 */
import { execa } from 'execa';
import { existsSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';

const ROOT = fileURLToPath(new URL('../../', import.meta.url));

export type UpstreamPart = 'cni-plugins' | 'containerd' | 'runc' | 'etcd' | 'kubernetes' | 'helm' | 'coredns' | 'prometheus';

/** The bin directory of a built part. */
export function upstreamDir(part: UpstreamPart): string {
  return join(ROOT, 'native/build/upstream', part);
}

/**
 * The reference CNI plugins (loopback, bridge, host-local, dhcp, portmap, bandwidth) at the pinned
 * release; KUBENET_REF_PLUGINS=DIR puts another build in their place (e.g. an older release, to
 * compare the benches' reference lines across releases in one session).
 */
export const REF_PLUGINS_DIR = process.env.KUBENET_REF_PLUGINS || upstreamDir('cni-plugins');

/** The path of one reference plugin. */
export function refPlugin(name: string): string {
  return join(REF_PLUGINS_DIR, name);
}

/** Why a part is missing (and how to get it), or undefined when all of `bins` are built. */
export function upstreamBlocker(part: UpstreamPart, bins: string[]): string | undefined {
  const missing = bins.filter((b) => !existsSync(join(upstreamDir(part), b)));
  if (missing.length === 0) return undefined;
  return `needs ${missing.join(', ')} of ${part} in ${upstreamDir(part)} (bash hack/build-upstream.sh ${part}; npm test builds it)`;
}

/** What the reference bridge plugin says of its version ("CNI bridge plugin v1.10.0" → "v1.10.0"; Debian's 1.1.1 build says "unknown"). */
export async function refPluginsVersion(dir = REF_PLUGINS_DIR): Promise<string> {
  const r = await execa(join(dir, 'bridge'), [], { reject: false, env: {}, extendEnv: false });
  return /plugin (\S+)/.exec(r.stdout || r.stderr)?.[1] ?? 'unknown';
}

/** The libcni version the test driver is built against (test/libcni/go.mod). */
export function libcniVersion(): string {
  const mod = readFileSync(join(ROOT, 'test/libcni/go.mod'), 'utf8');
  return /github\.com\/containernetworking\/cni (v\S+)/.exec(mod)?.[1] ?? 'unknown';
}
