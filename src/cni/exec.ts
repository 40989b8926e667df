/**
 * Locating and running CNI plugin binaries (libcni's invoke package): one exec per call, config
 * on stdin, parameters in CNI_* environment variables, JSON on stdout. This is the hot path of
 * every pod setup, so it does the minimum: no shell, a fixed seven-variable environment (no copy
 * of process.env), one JSON.parse of the output.
 *
 * Plugins are started by the agent's plugin spawner (src/cni/spawner.ts, native/kubenet-spawner.c),
 * not by child_process: libuv forks the whole agent per child (a cost growing with the agent's RSS),
 * the spawner forks a tiny process (measured: docs/cni.md); and plugins it started die with the agent.
 * `KUBENET_PLUGIN_EXEC=execa` (or `ExecOptions.via: 'execa'`) selects the old execa path, for
 * comparison; it is also used, with a warning, when the spawner binary is not built.
 */
import { accessSync, constants as fsConstants, statSync } from 'node:fs';
import { basename, join } from 'node:path';
import { execa } from 'execa';
import { CniPluginError, ConfigError } from '../errors.js';
import { PluginNotFoundError, PluginTimeoutError } from './errors.js';
import { sharedSpawner } from './spawner.js';
import type { CniCommand } from './types.js';

export const DEFAULT_TIMEOUT_MS = 60_000;

/** PATH handed to plugins when the agent itself has none (bridge runs iptables, for one). */
const FALLBACK_PATH = '/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin';

/**
 * Path of the first directory in `dirs` holding an executable regular file named `type`.
 * Not cached: a lookup is two stat-class syscalls per directory (microseconds), and a cache
 * would go stale when a binary is installed into an earlier directory or removed.
 * @throws ConfigError for a type that is not a plain file name, PluginNotFoundError naming every directory searched
 */
export function findPlugin(type: string, dirs: readonly string[]): string {
  if (type === '' || type === '.' || type === '..' || type.includes('/') || type.includes('\0')) {
    throw new ConfigError(`invalid CNI plugin type ${JSON.stringify(type)}: must be a file name`);
  }
  for (const dir of dirs) {
    if (dir === '') continue;
    const path = join(dir, type);
    const st = statSync(path, { throwIfNoEntry: false });
    if (!st?.isFile()) continue;
    try {
      accessSync(path, fsConstants.X_OK);
      return path;
    } catch {
      // present but not executable for us: keep looking, as a shell would
    }
  }
  throw new PluginNotFoundError(type, dirs);
}

/** The CNI parameters of one invocation (libcni's invoke.Args). */
export interface ExecRequest {
  command: CniCommand;
  containerId?: string;
  netns?: string;
  ifName?: string;
  /** CNI_ARGS pairs, joined as `k=v;k=v`. */
  args?: readonly (readonly [string, string])[];
  /** Plugin directories, passed as CNI_PATH (joined with ':') so plugins find their delegates (IPAM). */
  path: readonly string[];
}

export interface ExecOptions {
  /** Kill the plugin (and everything it started) after this long. Default 60 s. */
  timeoutMs?: number;
  /** Plugin name for errors; default the binary's file name. */
  plugin?: string;
  /**
   * How to start the plugin: 'spawner' (default) or 'execa' (child_process: forks the agent).
   * Default from the environment variable KUBENET_PLUGIN_EXEC when it is set to one of them.
   */
  via?: ExecVia;
}

export type ExecVia = 'spawner' | 'execa';

/** The exec path used when the caller does not choose: KUBENET_PLUGIN_EXEC, else the spawner. */
export function defaultExecVia(): ExecVia {
  return process.env.KUBENET_PLUGIN_EXEC === 'execa' ? 'execa' : 'spawner';
}

export function cniArgsString(args: readonly (readonly [string, string])[] | undefined): string {
  if (!args || args.length === 0) return '';
  let s = '';
  for (const [k, v] of args) s += s === '' ? `${k}=${v}` : `;${k}=${v}`;
  return s;
}

function isCniErrorObject(v: unknown): v is { code: number; msg?: unknown; details?: unknown } {
  return typeof v === 'object' && v !== null && !Array.isArray(v) && typeof (v as { code?: unknown }).code === 'number' && 'msg' in v;
}

function str(v: unknown): string | undefined {
  return typeof v === 'string' && v !== '' ? v : undefined;
}

function snippet(text: string): string {
  return JSON.stringify(text.length > 300 ? `${text.slice(0, 300)}…` : text);
}

/** How a plugin run ended, whichever way it was started. */
interface RunOutcome {
  exitCode: number | undefined;
  signal: string | undefined;
  /** Why it could not be started (errno name or a message). */
  startError: string | undefined;
  /** It was started, then the spawner died under it (taking the plugin with it). */
  lost: string | undefined;
  cause: unknown;
  timedOut: boolean;
  stdout: string;
  stderr: string;
}

let warnedNoSpawner = false;

/**
 * Runs a plugin binary and returns its stdout parsed as JSON, or undefined when it printed
 * nothing (DEL and CHECK usually do). The subprocess gets exactly CNI_COMMAND, CNI_CONTAINERID,
 * CNI_NETNS, CNI_IFNAME, CNI_ARGS, CNI_PATH and PATH.
 * It runs in its own process group so a timeout kills the plugin and any delegate it started.
 * @throws CniPluginError when the plugin cannot be started, exits non-zero or by a signal,
 *   prints a CNI error object, prints something that is not JSON, or runs past the timeout.
 */
export async function execPlugin(
  pluginPath: string,
  stdin: string | Uint8Array,
  req: ExecRequest,
  opts: ExecOptions = {},
): Promise<unknown> {
  const plugin = opts.plugin ?? basename(pluginPath);
  const command = req.command;
  const timeoutMs = opts.timeoutMs ?? DEFAULT_TIMEOUT_MS;
  const env = {
    CNI_COMMAND: command,
    CNI_CONTAINERID: req.containerId ?? '',
    CNI_NETNS: req.netns ?? '',
    CNI_IFNAME: req.ifName ?? '',
    CNI_ARGS: cniArgsString(req.args),
    CNI_PATH: req.path.join(':'),
    PATH: process.env.PATH ?? FALLBACK_PATH,
  };
  let via = opts.via ?? defaultExecVia();
  const spawner = sharedSpawner();
  if (via === 'spawner' && !spawner.available()) {
    if (!warnedNoSpawner) {
      warnedNoSpawner = true;
      process.emitWarning(
        `plugin spawner ${spawner.binaryPath} is not built (npm run build:native): CNI plugins are exec'd through child_process, which forks the agent`,
      );
    }
    via = 'execa';
  }
  const r =
    via === 'spawner' ? await runSpawner(spawner, pluginPath, env, stdin, timeoutMs) : await runExeca(pluginPath, env, stdin, timeoutMs);
  const { stdout, stderr } = r;

  if (r.timedOut) {
    throw new PluginTimeoutError({ plugin, command, timeoutMs, stderr });
  }
  if (r.exitCode === undefined) {
    const msg = r.signal ? `killed by ${r.signal}` : (r.lost ?? `could not run ${pluginPath}: ${r.startError}`);
    throw new CniPluginError({ plugin, command, msg, stderr }, { cause: r.cause });
  }
  const text = stdout.trim();
  let parsed: unknown;
  let parseError: unknown;
  if (text !== '') {
    try {
      parsed = JSON.parse(text);
    } catch (err) {
      parseError = err;
    }
  }
  if (parsed !== undefined && isCniErrorObject(parsed)) {
    throw new CniPluginError({
      plugin,
      command,
      code: parsed.code,
      msg: str(parsed.msg) ?? (r.exitCode === 0 ? 'error object without a message' : `exit status ${r.exitCode}`),
      details: str(parsed.details),
      stderr,
    });
  }
  if (r.exitCode !== 0) {
    let msg: string;
    if (text === '') msg = stderr.trim() ? `exit status ${r.exitCode}: ${stderr.trim()}` : `exit status ${r.exitCode} and no error message`;
    else msg = `exit status ${r.exitCode}; output is not a CNI error object: ${snippet(text)}`;
    throw new CniPluginError({ plugin, command, msg, stderr });
  }
  if (parseError !== undefined) {
    throw new CniPluginError({ plugin, command, msg: `output is not JSON: ${snippet(text)}`, stderr }, { cause: parseError });
  }
  return parsed;
}

async function runSpawner(
  spawner: ReturnType<typeof sharedSpawner>,
  pluginPath: string,
  env: Record<string, string>,
  stdin: string | Uint8Array,
  timeoutMs: number,
): Promise<RunOutcome> {
  const o = await spawner.run(pluginPath, env, stdin, timeoutMs);
  return {
    exitCode: o.exitCode,
    signal: o.signal,
    startError: o.errno ?? o.failure?.message,
    lost: o.failure && o.pid !== undefined ? `${o.failure.message} while the plugin ran (pid ${o.pid}); it was killed` : undefined,
    cause: o.failure,
    timedOut: o.timedOut,
    stdout: o.stdout,
    stderr: o.stderr,
  };
}

/** The old path: child_process through execa (forks the agent). */
async function runExeca(
  pluginPath: string,
  env: Record<string, string>,
  stdin: string | Uint8Array,
  timeoutMs: number,
): Promise<RunOutcome> {
  const subprocess = execa(pluginPath, [], { input: stdin, env, extendEnv: false, reject: false, detached: true });
  let timedOut = false;
  const timer = setTimeout(() => {
    timedOut = true;
    const pid = subprocess.pid;
    try {
      if (pid !== undefined) process.kill(-pid, 'SIGKILL');
    } catch {
      // already gone
    }
    // A delegate that left the process group may still hold our pipes: stop waiting for them.
    subprocess.stdout?.destroy();
    subprocess.stderr?.destroy();
  }, timeoutMs);
  let r: Awaited<typeof subprocess>;
  try {
    r = await subprocess;
  } finally {
    clearTimeout(timer);
  }
  return {
    exitCode: r.exitCode,
    signal: r.signal,
    startError: r.code ?? r.shortMessage,
    lost: undefined,
    cause: r.cause,
    timedOut,
    stdout: typeof r.stdout === 'string' ? r.stdout : '',
    stderr: typeof r.stderr === 'string' ? r.stderr : '',
  };
}
