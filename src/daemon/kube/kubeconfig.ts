/**
 * Where the API server is and how to authenticate to it: a kubeconfig file or the in-cluster
 * service account. A small loader of our own instead of @kubernetes/client-node's KubeConfig:
 * importing client-node (even only its dist/config.js, which pulls in the whole generated API)
 * costs ~75 MB of RSS in the agent, and the agent needs only this (bench/agent-rss.ts).
 *
 * Supported, with kubectl's (client-go's) meaning:
 * - in cluster: KUBERNETES_SERVICE_HOST/PORT, the service account's ca.crt and token, the token
 *   re-read from its file at most once a minute (kubelet rotates projected tokens);
 * - kubeconfig files (YAML or JSON): current-context → cluster and user; cluster `server`,
 *   `certificate-authority` / `certificate-authority-data`, `insecure-skip-tls-verify`,
 *   `tls-server-name`; user `token`, `tokenFile` (re-read like the service account's),
 *   `client-certificate` / `client-key` (`-data`), `username` / `password`, and exec credential
 *   plugins (exec-credential.ts), used as client-go does only when the user has none of the others.
 *   Relative paths are relative to the kubeconfig's directory.
 * For `kubectl kubenet`, kubectl's search too (kubectlCredentials): --kubeconfig, $KUBECONFIG (a
 * list of files, merged), ~/.kube/config; --context instead of the current one.
 * Refused with a ConfigError naming the kubeconfig and the field: auth-provider (kubectl itself has
 * dropped the gcp and azure ones; the message names the exec plugin to use instead), impersonation,
 * proxy-url, a missing or non-http(s) server, and http:// without insecure-skip-tls-verify (as
 * client-node refused it).
 *
 * Only types come from client-node (`import type`: nothing at run time).
 */
import { existsSync, readFileSync } from 'node:fs';
import { Agent as HttpAgent } from 'node:http';
import { Agent as HttpsAgent, type RequestOptions } from 'node:https';
import { dirname, isAbsolute, join } from 'node:path';
import yaml from 'js-yaml';
import { ConfigError } from '../../errors.js';
import {
  authProviderError,
  ExecAuthenticator,
  execClusterInfo,
  parseExecConfig,
  type ExecCredential,
  type ExecOptions,
} from './exec-credential.js';

export const SERVICE_ACCOUNT_DIR = '/var/run/secrets/kubernetes.io/serviceaccount';
/** A token file is read again when the copy in memory is older than this (client-go: 1 min). */
export const TOKEN_REREAD_MS = 60_000;

/**
 * What the agent's API client needs from a configuration. A client-node KubeConfig has the same
 * two methods, so one can still be passed (tests do).
 */
export interface KubeClientConfig {
  getCurrentCluster(): { server: string } | null;
  /** Sets the connection agent (TLS settings) and the credentials on a request's options. */
  applyToHTTPSOptions(opts: RequestOptions): Promise<void>;
  /** A request to `server` could not connect or broke (api-endpoints.ts moves to the next address). */
  requestFailed?(server: string, err: unknown): void;
  /**
   * The request sent with `opts` (as applyToHTTPSOptions set them) was answered 401: true when the
   * credentials were renewed and the request should be sent once more (an exec plugin's).
   */
  unauthorized?(opts: RequestOptions): boolean;
}

type Auth =
  | { kind: 'none' }
  | { kind: 'token'; token: string }
  | { kind: 'tokenFile'; path: string }
  | { kind: 'basic'; username: string; password: string }
  | { kind: 'exec'; exec: ExecAuthenticator };

interface Tls {
  ca?: Buffer;
  cert?: Buffer;
  key?: Buffer;
  rejectUnauthorized: boolean;
  servername?: string;
}

export class KubeCredentials implements KubeClientConfig {
  private readonly agent: HttpAgent | HttpsAgent;
  private token: { value: string; readAt: number } | undefined;
  /** The exec credential each request was sent with (for unauthorized()). */
  private readonly sentWith = new WeakMap<RequestOptions, ExecCredential>();
  /** The connection agent of the exec plugin's client certificate, and which certificate and key it presents. */
  private certAgent: { id: string; agent: HttpsAgent } | undefined;

  constructor(
    readonly server: string,
    private readonly tls: Tls,
    private readonly auth: Auth,
    /** Where this came from, for messages: the kubeconfig path or "(in-cluster)". */
    readonly source: string,
    private readonly tokenRereadMs = TOKEN_REREAD_MS,
  ) {
    // Keep-alive: an Event POST or a pod GET reuses an open TLS connection instead of a handshake
    // each (CPU on both sides, here and in the API server, per request, on every pod ADD;
    // docs/agent.md).
    const keep = { keepAlive: true, keepAliveMsecs: 30_000, maxFreeSockets: 4 };
    this.agent = server.startsWith('https:') ? new HttpsAgent({ ...tls, ...keep }) : new HttpAgent(keep);
  }

  getCurrentCluster(): { server: string } {
    return { server: this.server };
  }

  async applyToHTTPSOptions(opts: RequestOptions): Promise<void> {
    opts.agent = this.agent;
    const headers = (opts.headers ??= {}) as Record<string, string | string[] | number | undefined>;
    switch (this.auth.kind) {
      case 'token':
        headers.Authorization = `Bearer ${this.auth.token}`;
        break;
      case 'tokenFile':
        headers.Authorization = `Bearer ${this.fileToken(this.auth.path)}`;
        break;
      case 'basic':
        headers.Authorization = `Basic ${Buffer.from(`${this.auth.username}:${this.auth.password}`).toString('base64')}`;
        break;
      case 'exec': {
        const cred = await this.auth.exec.credential();
        this.sentWith.set(opts, cred);
        if (cred.token !== undefined) headers.Authorization = `Bearer ${cred.token}`;
        if (cred.cert && this.agent instanceof HttpsAgent) opts.agent = this.agentFor(cred);
        break;
      }
      case 'none':
        break;
    }
  }

  unauthorized(opts: RequestOptions): boolean {
    const cred = this.sentWith.get(opts);
    if (this.auth.kind !== 'exec' || !cred) return false;
    this.auth.exec.unauthorized(cred);
    return true;
  }

  /** A keep-alive agent presenting the exec plugin's client certificate: the same one while the plugin answers the same pair. */
  private agentFor(cred: ExecCredential): HttpsAgent {
    const id = `${cred.cert}\n${cred.key}`;
    if (this.certAgent?.id !== id) {
      const keep = { keepAlive: true, keepAliveMsecs: 30_000, maxFreeSockets: 4 };
      this.certAgent = { id, agent: new HttpsAgent({ ...this.tls, cert: cred.cert, key: cred.key, ...keep }) };
    }
    return this.certAgent.agent;
  }

  /** The token in `path`, read again once the copy is older than tokenRereadMs; the old copy when a re-read fails. */
  private fileToken(path: string): string {
    const now = Date.now();
    if (this.token && now - this.token.readAt < this.tokenRereadMs) return this.token.value;
    try {
      this.token = { value: readToken(path, this.source), readAt: now };
    } catch (err) {
      if (!this.token) throw err;
      this.token.readAt = now; // keep using it; try again in a minute
    }
    return this.token.value;
  }
}

function readToken(path: string, source: string): string {
  let text: string;
  try {
    text = readFileSync(path, 'utf8');
  } catch (err) {
    throw new ConfigError(`${source}: cannot read token file ${path}: ${(err as Error).message}`, { cause: err });
  }
  const token = text.trim();
  if (token === '') throw new ConfigError(`${source}: token file ${path} is empty`);
  return token;
}

function readBytes(path: string, source: string, what: string): Buffer {
  try {
    return readFileSync(path);
  } catch (err) {
    throw new ConfigError(`${source}: cannot read ${what} ${path}: ${(err as Error).message}`, { cause: err });
  }
}

export interface CredentialOptions {
  /** How long a token read from a file is used before the file is read again; default TOKEN_REREAD_MS. */
  tokenRereadMs?: number;
  /** How an exec credential plugin runs (its stderr, whether stdin is a terminal); default: this process's. */
  exec?: ExecOptions;
}

export interface InClusterOptions extends CredentialOptions {
  env?: NodeJS.ProcessEnv;
  /** The service account mount; default SERVICE_ACCOUNT_DIR. */
  serviceAccountDir?: string;
}

/** The in-cluster config of a pod: the service account's token and CA, the API server's service address. */
export function inClusterCredentials(opts: InClusterOptions = {}): KubeCredentials {
  const env = opts.env ?? process.env;
  const dir = opts.serviceAccountDir ?? SERVICE_ACCOUNT_DIR;
  const host = env.KUBERNETES_SERVICE_HOST;
  const port = env.KUBERNETES_SERVICE_PORT;
  if (!host || !port)
    throw new ConfigError('not running in a pod (KUBERNETES_SERVICE_HOST/PORT unset): give a kubeconfig or a static pod CIDR');
  const source = '(in-cluster)';
  const tokenPath = join(dir, 'token');
  readToken(tokenPath, source); // fail now, not at the first request
  const server = `https://${host.includes(':') ? `[${host}]` : host}:${port}`;
  return new KubeCredentials(
    server,
    { ca: readBytes(join(dir, 'ca.crt'), source, 'CA file'), rejectUnauthorized: true },
    { kind: 'tokenFile', path: tokenPath },
    source,
    opts.tokenRereadMs,
  );
}

type Obj = Record<string, unknown>;

function isObj(v: unknown): v is Obj {
  return typeof v === 'object' && v !== null && !Array.isArray(v);
}

/** The entry named `name` of a kubeconfig list (clusters, users, contexts), unwrapped. */
function named(doc: Obj, list: string, field: string, name: string, path: string): Obj {
  const items = doc[list];
  if (items !== undefined && items !== null && !Array.isArray(items)) throw new ConfigError(`kubeconfig ${path}: ${list} must be a list`);
  const item = ((items ?? []) as unknown[]).find((i) => isObj(i) && i.name === name) as Obj | undefined;
  if (!item) throw new ConfigError(`kubeconfig ${path}: no ${field} named ${JSON.stringify(name)} in ${list}`);
  const inner = item[field];
  if (inner === undefined || inner === null) return {};
  if (!isObj(inner)) throw new ConfigError(`kubeconfig ${path}: ${list} ${JSON.stringify(name)}: ${field} must be a mapping`);
  return inner;
}

/** Reads and parses one kubeconfig file. @throws ConfigError */
function loadDoc(path: string): Obj {
  let doc: unknown;
  try {
    doc = yaml.load(readFileSync(path, 'utf8'));
  } catch (err) {
    throw new ConfigError(`cannot load kubeconfig ${path}: ${(err as Error).message}`, { cause: err });
  }
  if (!isObj(doc)) throw new ConfigError(`kubeconfig ${path}: not a mapping`);
  return doc;
}

/** A kubeconfig file's current context (or `opts.context`) as credentials. @throws ConfigError naming the file and the field */
export function kubeconfigCredentials(path: string, opts: CredentialOptions & { context?: string } = {}): KubeCredentials {
  return docCredentials(loadDoc(path), path, dirname(path), opts);
}

/** The fields of clusters and users that hold paths: resolved against their own file's directory when files are merged (kubectl's rule). */
const PATH_FIELDS: Record<'clusters' | 'users', { field: string; keys: string[] }> = {
  clusters: { field: 'cluster', keys: ['certificate-authority'] },
  users: { field: 'user', keys: ['client-certificate', 'client-key', 'tokenFile'] },
};

/** An exec command with a `/` in it, relative: against `dir` (kubectl's rule; a bare name is looked up on PATH). */
function resolveExec(user: Obj, dir: string): Obj {
  const exec = user.exec;
  if (!isObj(exec) || typeof exec.command !== 'string' || !exec.command.includes('/') || isAbsolute(exec.command)) return user;
  return { ...user, exec: { ...exec, command: join(dir, exec.command) } };
}

/**
 * Credentials as kubectl finds them: the file `kubeconfig` (it must exist), else the files of
 * `$KUBECONFIG` (a ':'-separated list, missing files skipped, merged: the first file that sets
 * current-context or names a cluster, user or context wins), else ~/.kube/config; the context
 * `context`, else the current one.
 */
export function kubectlCredentials(
  opts: { kubeconfig?: string; context?: string; env?: NodeJS.ProcessEnv; home?: string; exec?: ExecOptions } = {},
): KubeCredentials {
  const env = opts.env ?? process.env;
  const ctx = { ...(opts.context !== undefined ? { context: opts.context } : {}), ...(opts.exec ? { exec: opts.exec } : {}) };
  if (opts.kubeconfig) return kubeconfigCredentials(opts.kubeconfig, ctx);
  const list = (env.KUBECONFIG ?? '').split(':').filter((p) => p !== '');
  if (list.length === 0) {
    const home = opts.home ?? env.HOME ?? '';
    return kubeconfigCredentials(join(home, '.kube', 'config'), ctx);
  }
  const found = list.filter((p) => existsSync(p));
  if (found.length === 0) throw new ConfigError(`none of the kubeconfig files in $KUBECONFIG exists (${list.join(':')})`);
  if (found.length === 1) return kubeconfigCredentials(found[0] ?? '', ctx);
  const merged: Obj = {};
  const seen = { clusters: new Set<string>(), users: new Set<string>(), contexts: new Set<string>() };
  for (const path of found) {
    const doc = loadDoc(path);
    if (merged['current-context'] === undefined && typeof doc['current-context'] === 'string' && doc['current-context'] !== '')
      merged['current-context'] = doc['current-context'];
    for (const list of ['clusters', 'users', 'contexts'] as const) {
      const items = doc[list];
      if (items === undefined || items === null) continue;
      if (!Array.isArray(items)) throw new ConfigError(`kubeconfig ${path}: ${list} must be a list`);
      for (const item of items as unknown[]) {
        if (!isObj(item) || typeof item.name !== 'string' || seen[list].has(item.name)) continue;
        seen[list].add(item.name);
        const paths = list === 'contexts' ? undefined : PATH_FIELDS[list];
        const inner = paths ? item[paths.field] : undefined;
        let entry = item;
        if (paths && isObj(inner)) {
          const resolved = { ...inner };
          for (const k of paths.keys)
            if (typeof resolved[k] === 'string' && resolved[k] !== '' && !isAbsolute(resolved[k]))
              resolved[k] = join(dirname(path), resolved[k]);
          entry = { ...item, [paths.field]: list === 'users' ? resolveExec(resolved, dirname(path)) : resolved };
        }
        ((merged[list] ??= []) as unknown[]).push(entry);
      }
    }
  }
  return docCredentials(merged, found.join(':'), '/', ctx);
}

function docCredentials(doc: Obj, path: string, base: string, opts: CredentialOptions & { context?: string }): KubeCredentials {
  const file = (p: unknown, field: string): string => {
    if (typeof p !== 'string' || p === '') throw new ConfigError(`kubeconfig ${path}: ${field} must be a non-empty string`);
    return isAbsolute(p) ? p : join(base, p);
  };
  const data = (d: unknown, field: string): Buffer => {
    if (typeof d !== 'string' || d === '') throw new ConfigError(`kubeconfig ${path}: ${field} must be a non-empty base64 string`);
    return Buffer.from(d, 'base64');
  };
  const contextName = opts.context ?? doc['current-context'];
  if (typeof contextName !== 'string' || contextName === '')
    throw new ConfigError(`kubeconfig ${path} has no current cluster (no current-context)`);
  const context = named(doc, 'contexts', 'context', contextName, path);
  if (typeof context.cluster !== 'string')
    throw new ConfigError(`kubeconfig ${path} has no current cluster (context ${JSON.stringify(contextName)} names none)`);
  const cluster = named(doc, 'clusters', 'cluster', context.cluster, path);
  const userName = context.user;
  const user = typeof userName === 'string' && userName !== '' ? named(doc, 'users', 'user', userName, path) : {};
  const where = (field: string) => `kubeconfig ${path}: user ${JSON.stringify(userName)}: ${field}`;

  const server = cluster.server;
  if (typeof server !== 'string' || !/^https?:\/\/[^/]/.test(server)) {
    throw new ConfigError(
      `kubeconfig ${path}: cluster ${JSON.stringify(context.cluster)} has no http(s) server (got ${JSON.stringify(server)})`,
    );
  }
  if (cluster['proxy-url'] !== undefined)
    throw new ConfigError(`kubeconfig ${path}: cluster ${JSON.stringify(context.cluster)}: proxy-url is not supported by kubenet`);
  const insecure = cluster['insecure-skip-tls-verify'] === true;
  if (server.startsWith('http:') && !insecure) {
    throw new ConfigError(
      `kubeconfig ${path}: cluster ${JSON.stringify(context.cluster)}: an http:// server needs insecure-skip-tls-verify: true`,
    );
  }
  const tls: Tls = { rejectUnauthorized: !insecure };
  if (cluster['certificate-authority-data'] !== undefined)
    tls.ca = data(cluster['certificate-authority-data'], 'certificate-authority-data');
  else if (cluster['certificate-authority'] !== undefined)
    tls.ca = readBytes(file(cluster['certificate-authority'], 'certificate-authority'), `kubeconfig ${path}`, 'certificate-authority');
  if (typeof cluster['tls-server-name'] === 'string' && cluster['tls-server-name'] !== '') tls.servername = cluster['tls-server-name'];

  if (user['auth-provider'] !== undefined && user['auth-provider'] !== null) throw authProviderError(user['auth-provider'], where);
  for (const field of ['as', 'as-uid', 'as-groups', 'as-user-extra']) {
    if (user[field] !== undefined && user[field] !== null)
      throw new ConfigError(`${where(field)}: impersonation is not supported by kubenet`);
  }
  if (user['client-certificate-data'] !== undefined) tls.cert = data(user['client-certificate-data'], 'client-certificate-data');
  else if (user['client-certificate'] !== undefined)
    tls.cert = readBytes(file(user['client-certificate'], 'client-certificate'), `kubeconfig ${path}`, 'client-certificate');
  if (user['client-key-data'] !== undefined) tls.key = data(user['client-key-data'], 'client-key-data');
  else if (user['client-key'] !== undefined)
    tls.key = readBytes(file(user['client-key'], 'client-key'), `kubeconfig ${path}`, 'client-key');
  if ((tls.cert === undefined) !== (tls.key === undefined))
    throw new ConfigError(
      `${where(tls.cert ? 'client-key' : 'client-certificate')}: a client certificate needs both the certificate and its key`,
    );

  let auth: Auth = { kind: 'none' };
  if (typeof user.token === 'string' && user.token !== '') auth = { kind: 'token', token: user.token };
  else if (user.tokenFile !== undefined) {
    const tokenPath = file(user.tokenFile, 'tokenFile');
    readToken(tokenPath, `kubeconfig ${path}`); // fail now, not at the first request
    auth = { kind: 'tokenFile', path: tokenPath };
  } else if (typeof user.username === 'string' && user.username !== '') {
    auth = { kind: 'basic', username: user.username, password: typeof user.password === 'string' ? user.password : '' };
  } else if (user.exec !== undefined && user.exec !== null && tls.cert === undefined) {
    // client-go's rule: a token, basic auth or a client certificate in the kubeconfig wins over the plugin.
    const info = execClusterInfo(server, tls.servername, insecure, tls.ca, cluster.extensions);
    const config = parseExecConfig(user.exec, where, base);
    auth = { kind: 'exec', exec: new ExecAuthenticator(config, info, `kubeconfig ${path}: user ${JSON.stringify(userName)}`, opts.exec) };
  }
  return new KubeCredentials(server, tls, auth, `kubeconfig ${path}`, opts.tokenRereadMs);
}
