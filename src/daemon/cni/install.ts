/**
 * What the agent installs for container runtimes: its CNI forwarding binary as `<cniBinDir>/kubenet`,
 * the reference `loopback` plugin there when the directory has none (containerd runs it itself for
 * every pod, from its own bin dir; `<stateDir>/installed-loopback` then holds the copy's sha256, so
 * an uninstall removes it only when it is still that copy), and `<cniConfDir>/10-kubenet.conflist`.
 * All atomically; `uninstallCni` removes them again, conflist first.
 *
 * And the startup check that keeps the agent from ever running its own binary as a plugin: no
 * plugin type it runs may resolve, in the plugin dirs, to the forwarding binary.
 */
import { createHash } from 'node:crypto';
import { existsSync, mkdirSync, readFileSync, realpathSync, rmSync, statSync } from 'node:fs';
import { join } from 'node:path';
import { findPlugin } from '../../cni/exec.js';
import { ConfigError } from '../../errors.js';
import type { Logger } from '../../log.js';
import { NETWORK_NAME, PLUGIN_TYPES } from '../../pod/index.js';
import { copyFileAtomic, writeFileAtomic } from '../../util/atomic-file.js';
import { fsTry } from '../../util/fs-error.js';
import { packagePath } from '../../util/package-root.js';
import type { Removal } from '../../util/removal.js';
import { CNI_BINARY_BUILD_PATH, CNI_BINARY_NAME, CONF_SOCKET_KEY, IPAM_SHIM_BUILD_DIR } from '../protocol.js';

export const CONFLIST_NAME = '10-kubenet.conflist';
/** Under the state dir: the sha256 of the loopback plugin the installer copied into cniBinDir. */
const LOOPBACK_MARKER = 'installed-loopback';
/** Bytes every build of the forwarding binary holds (its "agent unreachable" message, protocol.ts): how an uninstall knows its own. */
const FORWARDER_MARK = Buffer.from('kubenet agent unreachable at ');

/** The conflist runtimes read: network kubenet, plugin type kubenet, capabilities bandwidth + portMappings. */
export function buildConflist(socket: string): object {
  return {
    // containerd 1.6 / CRI-O use libcni 1.1 (spec up to 1.0.0); libcni >= 1.2 picks the highest of
    // cniVersions it supports, which gives it STATUS and GC (1.1.0).
    cniVersion: '1.0.0',
    cniVersions: ['1.0.0', '1.1.0'],
    name: NETWORK_NAME,
    plugins: [{ type: CNI_BINARY_NAME, [CONF_SOCKET_KEY]: socket, capabilities: { bandwidth: true, portMappings: true } }],
  };
}

/** The built forwarder: native/build/kubenet-cni at the package root. */
export function forwarderBinaryPath(): string {
  return packagePath(CNI_BINARY_BUILD_PATH);
}

/** The directory holding only the IPAM shim (the forwarder as `kubenet-ipam`), as hack/build-native.sh builds it. */
export function ipamShimDir(): string {
  return packagePath(IPAM_SHIM_BUILD_DIR);
}

export interface InstallConfig {
  cniBinDir: string;
  cniConfDir: string;
  pluginBinDirs: string[];
  socket: string;
  /** Where the installer notes what it copied that was not its own (loopback); unset: nothing noted. */
  stateDir?: string;
}

/**
 * Refuses, before anything is installed, a configuration in which a plugin the agent runs would be
 * its own forwarding binary (installed or built), and a missing forwarder build.
 */
export function checkInstallConfig(c: InstallConfig): void {
  const src = forwarderBinaryPath();
  if (!existsSync(src))
    throw new ConfigError(
      `the CNI forwarder ${src} is missing: build it with "npm run build" (or reinstall the package with a C compiler present)`,
    );
  const forwarder = readFileSync(src);
  const installed = join(c.cniBinDir, CNI_BINARY_NAME);
  for (const type of PLUGIN_TYPES) {
    let path: string;
    try {
      path = findPlugin(type, c.pluginBinDirs);
    } catch {
      continue; // missing: status() says so, and an ADD that needs it fails naming it
    }
    const real = realpathSync(path);
    const same =
      real === realpathSync(src) ||
      (existsSync(installed) && real === realpathSync(installed)) ||
      (statSync(real).size === forwarder.length && readFileSync(real).equals(forwarder));
    if (same) {
      throw new ConfigError(
        `plugin ${JSON.stringify(type)} found at ${path} is kubenet's own CNI forwarding binary: the agent would call itself. ` +
          `Point pluginBinDirs (${c.pluginBinDirs.join(', ')}) at the reference CNI plugins`,
      );
    }
  }
}

/**
 * installCni for the agent, remembering whether an install has succeeded (runtimes have the binary
 * and the conflist: they stay when a later install fails) and why the last one failed, which STATUS
 * and /healthz say until an install succeeds (an FsError names the directory and what to do).
 */
export class CniInstaller {
  private installed = false;
  private failure: unknown;

  constructor(
    private readonly c: InstallConfig,
    private readonly log: Logger,
  ) {}

  install(): void {
    this.failure = undefined;
    try {
      installCni(this.c, this.log);
    } catch (err) {
      throw (this.failure = err);
    }
    this.installed = true;
  }

  /** Why runtimes do not have the CNI config yet, or undefined once they do. */
  notInstalled(): string | undefined {
    if (this.installed) return undefined;
    return this.failure instanceof Error ? `CNI config not written: ${this.failure.message}` : 'CNI config not written yet';
  }
}

/**
 * Installs the forwarder (and loopback when absent) into cniBinDir and writes the conflist.
 * @throws FsError naming the directory or file that could not be written, and why
 */
export function installCni(c: InstallConfig, log: Logger): { bin: string; conf: string; loopback: string | undefined } {
  const src = forwarderBinaryPath();
  const bin = join(c.cniBinDir, CNI_BINARY_NAME);
  fsTry('create', 'the CNI bin directory', c.cniBinDir, () => mkdirSync(c.cniBinDir, { recursive: true }));
  copyFileAtomic(src, bin, 0o755, `the CNI forwarder (from ${src}) as`);
  let loopback: string | undefined;
  const runtimeLoopback = join(c.cniBinDir, 'loopback');
  if (!existsSync(runtimeLoopback)) {
    try {
      const ours = findPlugin('loopback', c.pluginBinDirs);
      copyFileAtomic(ours, runtimeLoopback, 0o755, `the loopback plugin (from ${ours}) as`);
      loopback = runtimeLoopback;
      if (c.stateDir !== undefined) {
        fsTry('create', 'the state directory', c.stateDir, () => mkdirSync(c.stateDir ?? '', { recursive: true }));
        writeFileAtomic(join(c.stateDir, LOOPBACK_MARKER), `${sha256(runtimeLoopback)}\n`, { mode: 0o600, what: 'the loopback marker' });
      }
    } catch (err) {
      log.warn({ err, dir: c.cniBinDir }, 'no loopback plugin to install: the container runtime needs one in its CNI bin dir');
    }
  }
  fsTry('create', 'the CNI config directory', c.cniConfDir, () => mkdirSync(c.cniConfDir, { recursive: true }));
  const conf = join(c.cniConfDir, CONFLIST_NAME);
  writeFileAtomic(conf, JSON.stringify(buildConflist(c.socket), null, 2) + '\n', { what: 'the CNI config' });
  log.info({ bin, conf, ...(loopback ? { loopback } : {}) }, 'installed the CNI binary and conflist');
  return { bin, conf, loopback };
}

function sha256(path: string): string {
  return createHash('sha256').update(readFileSync(path)).digest('hex');
}

/**
 * Removes what installCni installed (`kubenet uninstall`), the conflist first, so that no runtime
 * calls the binary once its socket is gone: the conflist when it is kubenet's (network and plugin
 * type kubenet), the binary when it is a forwarder build, loopback when the installer noted it and it
 * is still that copy. Anything else with those names is kept, saying why.
 */
export async function uninstallCni(c: InstallConfig, r: Removal): Promise<void> {
  const conf = join(c.cniConfDir, CONFLIST_NAME);
  if (existsSync(conf)) {
    let ours = false;
    try {
      const v = JSON.parse(readFileSync(conf, 'utf8')) as { name?: unknown; plugins?: Array<{ type?: unknown }> };
      ours = v.name === NETWORK_NAME && Array.isArray(v.plugins) && v.plugins.some((p) => p?.type === CNI_BINARY_NAME);
    } catch {
      // unreadable or not JSON: not one we wrote
    }
    if (ours) await r.remove(`file ${conf} (the CNI config)`, () => rmSync(conf, { force: true }));
    else r.keep(`file ${conf}`, `not a conflist of network ${NETWORK_NAME} with plugin type ${CNI_BINARY_NAME}`);
  }
  const bin = join(c.cniBinDir, CNI_BINARY_NAME);
  if (existsSync(bin)) {
    if (readFileSync(bin).includes(FORWARDER_MARK))
      await r.remove(`file ${bin} (the CNI forwarding binary)`, () => rmSync(bin, { force: true }));
    else r.keep(`file ${bin}`, "not kubenet's CNI forwarding binary");
  }
  const marker = c.stateDir !== undefined ? join(c.stateDir, LOOPBACK_MARKER) : undefined;
  const noted = marker !== undefined && existsSync(marker) ? readFileSync(marker, 'utf8').trim() : undefined;
  const loopback = join(c.cniBinDir, 'loopback');
  if (marker === undefined || noted === undefined) return;
  if (!existsSync(loopback)) return void (await r.remove(`file ${marker}`, () => rmSync(marker, { force: true })));
  if (sha256(loopback) === noted)
    await r.remove(`file ${loopback} (the loopback plugin kubenet copied)`, () => rmSync(loopback, { force: true }));
  else r.keep(`file ${loopback}`, 'changed since kubenet copied it there (another installer owns it now)');
  await r.remove(`file ${marker}`, () => rmSync(marker, { force: true }));
}
