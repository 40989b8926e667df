/**
 * Locating and running CNI plugin binaries (libcni's invoke package): one exec per call, config
 * on stdin, parameters in CNI_* environment variables, JSON on stdout. This is the hot path of
 * every pod setup, so it does the minimum: no shell, a fixed seven-variable environment (no copy
 * of process.env), one JSON.parse of the output.
 */
import { accessSync, constants as fsConstants, statSync } from 'node:fs';
import { basename, join } from 'node:path';
import { execa } from 'execa';
import { CniPluginError, ConfigError } from '../errors.js';
import { PluginNotFoundError } from './errors.js';
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

/**
 * Runs a plugin binary and returns its stdout parsed as JSON, or undefined when it printed
 * nothing (DEL and CHECK usually do). The subprocess gets exactly CNI_COMMAND, CNI_CONTAINERID,
 * CNI_NETNS, CNI_IFNAME, CNI_ARGS, CNI_PATH and PATH.
 * It runs in its own process group so a timeout kills the plugin and any delegate it started.
 * @throws CniPluginError when the plugin cannot be started, exits non-zero or by a signal,
 *   prints a CNI error object, prints something that is not JSON, or runs past the timeout.
 */
export async function execPlugin(pluginPath: string, stdin: string | Uint8Array, req: ExecRequest, opts: ExecOptions = {}): Promise<unknown> {
  const plugin = opts.plugin ?? basename(pluginPath);
  const command = req.command;
  const timeoutMs = opts.timeoutMs ?? DEFAULT_TIMEOUT_MS;
  const subprocess = execa(pluginPath, [], {
    input: stdin,
    env: {
      CNI_COMMAND: command,
      CNI_CONTAINERID: req.containerId ?? '',
      CNI_NETNS: req.netns ?? '',
      CNI_IFNAME: req.ifName ?? '',
      CNI_ARGS: cniArgsString(req.args),
      CNI_PATH: req.path.join(':'),
      PATH: process.env.PATH ?? FALLBACK_PATH,
    },
    extendEnv: false,
    reject: false,
    detached: true,
  });
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
  let r;
  try {
    r = await subprocess;
  } finally {
    clearTimeout(timer);
  }
  const stdout = typeof r.stdout === 'string' ? r.stdout : '';
  const stderr = typeof r.stderr === 'string' ? r.stderr : '';

  if (timedOut) {
    throw new CniPluginError({ plugin, command, msg: `timed out after ${timeoutMs} ms; killed`, stderr });
  }
  if (r.exitCode === undefined) {
    const msg = r.signal ? `killed by ${r.signal}` : `could not run ${pluginPath}: ${r.code ?? r.shortMessage}`;
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
