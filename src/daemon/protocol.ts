/**
 * The protocol between the CNI forwarding binary (native/kubenet-cni.c, installed as
 * `<cniBinDir>/kubenet`) and the kubenet agent, which serves it on a unix socket.
 *
 * One CNI call is one HTTP/1.1 exchange on a fresh connection:
 *
 * ```
 * POST /v1/cni HTTP/1.1
 * Host: kubenet
 * Content-Type: application/json
 * Content-Length: <n>
 * Connection: close
 *
 * {"env":{"CNI_COMMAND":"ADD","CNI_CONTAINERID":"…","CNI_NETNS":"…","CNI_IFNAME":"eth0","CNI_ARGS":"…","CNI_PATH":"…"},
 *  "stdin":"<the network config exactly as the runtime wrote it>"}
 * ```
 *
 * - `env` holds only the {@link CNI_ENV_KEYS} that were set in the binary's environment (an empty
 *   value is forwarded as ""), in that order. `stdin` is the raw config as a JSON string; invalid
 *   UTF-8 bytes (never present in a valid config) arrive as U+FFFD.
 * - The agent answers **200** with the exact bytes the binary prints on stdout: the CNI result for
 *   ADD, nothing (empty body) for DEL/CHECK/GC, the status for STATUS. The binary exits 0.
 * - Any other status: the body is a {@link CniErrorBody} the binary prints on stdout; it exits 1.
 *   (A non-200 with an empty body makes the binary print its own error, code 999.)
 * - The agent may answer with Content-Length, chunked encoding, or by closing the connection.
 * - `VERSION` never reaches the agent: the binary answers {@link CNI_VERSION_ANSWER} itself.
 * - When the agent cannot be reached (no socket, refused, permission denied, timeout, connection
 *   closed early, unparsable HTTP) the binary prints a {@link CniErrorBody} with code
 *   {@link CNI_ERR_TRY_AGAIN_LATER}, msg `kubenet agent unreachable at <socket>` and details saying
 *   why (for a failed connect exactly strerror, e.g. "No such file or directory"); it exits 1.
 * - Socket: the top-level `"socket"` string of the network config (the agent writes it into the
 *   conflist it generates, see {@link CONF_SOCKET_KEY}), else env {@link SOCKET_ENV}, else
 *   {@link DEFAULT_SOCKET_PATH}. A `"socket"` member that is not a non-empty string is refused
 *   with code 7 (invalid network config). At most {@link MAX_SOCKET_PATH_BYTES} bytes.
 * - Timeout for the whole exchange: env {@link TIMEOUT_ENV} seconds, default
 *   {@link DEFAULT_TIMEOUT_SECONDS}; the agent's own work for one call must fit in it.
 *
 * Health: `GET /healthz` on the same socket answers 200 when the agent can serve CNI calls and 503
 * (with a short JSON reason) otherwise; the DaemonSet's readiness probe runs `kubenet health`,
 * which does that request and exits 0 only on 200.
 */
import { request } from 'node:http';
import { CNI_VERSIONS } from '../cni/types.js';
import { ConfigError } from '../errors.js';

/** A request body (the JSON envelope) larger than this is refused (413) before it is read whole. */
export const MAX_REQUEST_BYTES = 1024 * 1024;

/** Path and method of the CNI call endpoint. */
export const CNI_API_PATH = '/v1/cni';
export const CNI_API_METHOD = 'POST';
/**
 * The IPAM shim's endpoint (POST, same envelope as a CNI call: the bridge plugin's IPAM ADD), on the
 * agent's IPAM socket (http/socket-api.ts). The shim sends it to the top-level "socket" of the bridge
 * config, which the agent writes there: {@link ipamSocketPath}.
 */
export const IPAM_API_PATH = '/v1/ipam';
/** The agent's IPAM socket, beside its CNI socket. */
export const ipamSocketPath = (socket: string): string => `${socket}.ipam`;
/** Readiness endpoint on the same socket (GET). */
export const HEALTH_PATH = '/healthz';
/** The Host header the binary sends. */
export const CNI_API_HOST = 'kubenet';

export const DEFAULT_SOCKET_PATH = '/run/kubenet/kubenet.sock';
/** Env var the binary reads for the socket when the config names none. */
export const SOCKET_ENV = 'KUBENET_SOCKET';
/** Env var with the binary's timeout for the whole exchange, in whole seconds (1..86400). */
export const TIMEOUT_ENV = 'KUBENET_CNI_TIMEOUT_SECONDS';
export const DEFAULT_TIMEOUT_SECONDS = 120;
/** Top-level key of the network config (conflist) naming the agent socket. */
export const CONF_SOCKET_KEY = 'socket';
/** sockaddr_un.sun_path holds 108 bytes including the terminating NUL. */
export const MAX_SOCKET_PATH_BYTES = 107;

/** Name the agent installs the forwarding binary under, in `cniBinDir` (= CNI plugin type). */
export const CNI_BINARY_NAME = 'kubenet';
/** Where `npm run build:native` puts the binary, relative to the package root. */
export const CNI_BINARY_BUILD_PATH = 'native/build/kubenet-cni';
/** Where it puts the same binary as the IPAM shim (named as src/pod/bridge-conf.ts IPAM_SHIM_TYPE, alone in its directory). */
export const IPAM_SHIM_BUILD_DIR = 'native/build/ipam';

/** The CNI environment variables the binary forwards, in the order it writes them. */
export const CNI_ENV_KEYS = ['CNI_COMMAND', 'CNI_CONTAINERID', 'CNI_NETNS', 'CNI_IFNAME', 'CNI_ARGS', 'CNI_PATH'] as const;
export type CniEnvKey = (typeof CNI_ENV_KEYS)[number];

/** CNI commands a runtime may send (VERSION is answered by the binary and never forwarded): the spec's. */
export { CNI_COMMANDS, type CniCommand } from '../cni/types.js';

/** The spec versions the agent answers in: every one the CNI runtime side reads and writes. */
export const SUPPORTED_CNI_VERSIONS = CNI_VERSIONS;
/** What the binary prints for VERSION (followed by a newline), byte for byte `JSON.stringify` of this. */
export const CNI_VERSION_ANSWER = Object.freeze({
  cniVersion: '1.1.0',
  supportedVersions: SUPPORTED_CNI_VERSIONS,
});

/** CNI well-known error codes used on this protocol. */
export const CNI_ERR_INCOMPATIBLE_VERSION = 1;
export const CNI_ERR_UNSUPPORTED_FIELD = 2;
export const CNI_ERR_UNKNOWN_CONTAINER = 3;
export const CNI_ERR_INVALID_ENV = 4;
export const CNI_ERR_IO = 5;
export const CNI_ERR_DECODE = 6;
export const CNI_ERR_INVALID_CONFIG = 7;
export const CNI_ERR_TRY_AGAIN_LATER = 11;
/** CNI 1.1 STATUS: the plugin is not available (no pod CIDR yet, plugins missing). */
export const CNI_ERR_PLUGIN_NOT_AVAILABLE = 50;
/** kubenet-specific: the attachment exists with other parameters (a second ADD of it); nothing was changed. */
export const CNI_ERR_ATTACHMENT_CONFLICT = 100;
/** An unexpected failure inside the agent. */
export const CNI_ERR_INTERNAL = 999;
/** Used by the binary for a non-200 answer without a body. */
export const CNI_ERR_AGENT_EMPTY_ERROR = 999;

/** Body of `POST /v1/cni`. */
export interface CniRequest {
  env: Partial<Record<CniEnvKey, string>>;
  /** The network config the runtime wrote on the binary's stdin, unparsed. */
  stdin: string;
}

/** CNI error object: body of every non-200 answer, and what the binary prints on its own errors. */
export interface CniErrorBody {
  cniVersion: string;
  code: number;
  msg: string;
  details?: string;
}

/** Builds the body of a non-200 answer. */
export function cniErrorBody(code: number, msg: string, details?: string, cniVersion = '1.1.0'): CniErrorBody {
  return details === undefined ? { cniVersion, code, msg } : { cniVersion, code, msg, details };
}

/**
 * Validates a decoded `POST /v1/cni` body. Unknown env keys and fields are refused so a mismatch
 * between binary and agent versions shows up as an error instead of being silently ignored.
 * Throws ConfigError.
 */
export function parseCniRequest(body: unknown): CniRequest {
  if (typeof body !== 'object' || body === null || Array.isArray(body)) {
    throw new ConfigError(`CNI request: want a JSON object {"env":{...},"stdin":"..."}, got ${describe(body)}`);
  }
  const rec = body as Record<string, unknown>;
  for (const k of Object.keys(rec)) {
    if (k !== 'env' && k !== 'stdin') throw new ConfigError(`CNI request: unknown field ${JSON.stringify(k)}`);
  }
  const { env, stdin } = rec;
  if (typeof stdin !== 'string') throw new ConfigError(`CNI request: "stdin" must be a string, got ${describe(stdin)}`);
  if (typeof env !== 'object' || env === null || Array.isArray(env)) {
    throw new ConfigError(`CNI request: "env" must be an object, got ${describe(env)}`);
  }
  const out: Partial<Record<CniEnvKey, string>> = {};
  for (const [k, v] of Object.entries(env as Record<string, unknown>)) {
    if (!(CNI_ENV_KEYS as readonly string[]).includes(k)) {
      throw new ConfigError(`CNI request: unknown env key ${JSON.stringify(k)} (want one of ${CNI_ENV_KEYS.join(', ')})`);
    }
    if (typeof v !== 'string') throw new ConfigError(`CNI request: env ${k} must be a string, got ${describe(v)}`);
    out[k as CniEnvKey] = v;
  }
  return { env: out, stdin };
}

function describe(v: unknown): string {
  if (v === null) return 'null';
  if (Array.isArray(v)) return 'an array';
  return typeof v;
}

/** POST of a JSON body on the agent's socket (`kubenet shape`): status and body of any answer. */
export function agentPost(socket: string, path: string, body: unknown, timeoutMs = 30_000): Promise<{ status: number; body: string }> {
  const text = JSON.stringify(body);
  return new Promise((resolve, reject) => {
    const headers = { 'content-type': 'application/json', 'content-length': Buffer.byteLength(text) };
    const req = request({ socketPath: socket, path, method: 'POST', headers, timeout: timeoutMs }, (res) => {
      const chunks: Buffer[] = [];
      res.on('data', (c: Buffer) => chunks.push(c));
      res.on('end', () => resolve({ status: res.statusCode ?? 0, body: Buffer.concat(chunks).toString('utf8') }));
    });
    req.on('timeout', () => req.destroy(new Error('timed out')));
    req.on('error', reject);
    req.end(text);
  });
}

/**
 * GET on the agent's socket (/healthz, /metrics, /v1/status): status and body of any answer.
 * Rejects when the socket cannot be reached or nothing answers within `timeoutMs`.
 */
export function agentGet(socket: string, path: string, timeoutMs = 10_000): Promise<{ status: number; body: string }> {
  return new Promise((resolve, reject) => {
    const req = request({ socketPath: socket, path, method: 'GET', timeout: timeoutMs }, (res) => {
      const chunks: Buffer[] = [];
      res.on('data', (c: Buffer) => chunks.push(c));
      res.on('end', () => resolve({ status: res.statusCode ?? 0, body: Buffer.concat(chunks).toString('utf8') }));
    });
    req.on('timeout', () => req.destroy(new Error('timed out')));
    req.on('error', reject);
    req.end();
  });
}
