/**
 * client-go's exec credential plugins (a kubeconfig user's `exec`: aws-iam-authenticator / `aws eks
 * get-token`, gke-gcloud-auth-plugin, kubelogin, ...), implemented here as kubectl runs them, instead
 * of through @kubernetes/client-node: its ExecAuth sets no KUBERNETES_EXEC_INFO (plugins that read
 * spec.interactive or spec.cluster from it misbehave), knows no interactiveMode, installHint or
 * provideClusterInfo, re-runs a plugin whose credential has no expiry on every request, and its
 * errors do not name the command; and client-node is 57 MB installed and takes 89 MB of RSS to load
 * (docs/observability.md, "Credentials").
 *
 * The protocol (client.authentication.k8s.io v1 and v1beta1, with kubectl's rules):
 * - the plugin runs as `command args...` (a command with a `/` is relative to its kubeconfig's
 *   directory, else looked up on PATH) with our environment plus `env`, and KUBERNETES_EXEC_INFO set
 *   to an ExecCredential request: `spec.interactive`, and with `provideClusterInfo` `spec.cluster`
 *   (server, tls-server-name, insecure-skip-tls-verify, certificate-authority-data, and `config`
 *   from the cluster's `client.authentication.k8s.io/exec` extension);
 * - interactiveMode (required for v1; v1beta1 defaults to IfAvailable): Never runs the plugin with
 *   no standard input; IfAvailable hands it ours when ours is a terminal, else none; Always refuses
 *   to run without a terminal (ExecPluginError);
 * - the plugin's stderr goes to ours as it comes (prompts, warnings); its stdout is an
 *   ExecCredential of the same apiVersion whose `status` has a `token` and/or a
 *   `clientCertificateData` + `clientKeyData` pair, and maybe an `expirationTimestamp`;
 * - the credential is kept until its expirationTimestamp (for the life of the process when it has
 *   none), shared by requests made at the same time (one run for all of them); a request answered
 *   401 drops it (if no other request has already replaced it) and is sent once more with the
 *   plugin's next answer (KubeApi).
 * A plugin that is missing, fails or answers nonsense throws ExecPluginError naming the command,
 * its exit code, the end of its stderr and the kubeconfig's installHint.
 */
import { spawn } from 'node:child_process';
import { isAbsolute, join } from 'node:path';
import { ConfigError, KubenetError } from '../../errors.js';

export const EXEC_INFO_ENV = 'KUBERNETES_EXEC_INFO';
const API_VERSIONS = ['client.authentication.k8s.io/v1', 'client.authentication.k8s.io/v1beta1'];
const MODES = ['Never', 'IfAvailable', 'Always'] as const;
export type InteractiveMode = (typeof MODES)[number];
/** How much of a failed plugin's stderr its error keeps (the end of it). */
const STDERR_KEPT = 2000;

/** A kubeconfig user's `exec`, checked. */
export interface ExecConfig {
  apiVersion: string;
  command: string;
  args: string[];
  env: Array<{ name: string; value: string }>;
  installHint: string | undefined;
  provideClusterInfo: boolean;
  interactiveMode: InteractiveMode;
}

/** `spec.cluster` of the request when provideClusterInfo is set (client-go's field names). */
export interface ExecClusterInfo {
  server: string;
  'tls-server-name'?: string;
  'insecure-skip-tls-verify'?: boolean;
  /** base64, as client-go encodes the bytes. */
  'certificate-authority-data'?: string;
  config?: unknown;
}

/** Where the plugin runs: injected by tests, else the process's own. */
export interface ExecOptions {
  /** Whether our standard input is a terminal (default: process.stdin.isTTY). */
  stdinIsTerminal?: boolean;
  /** Receives the plugin's stderr as it comes (default: our stderr). */
  stderr?: (text: string) => void;
  /** The environment the plugin's `env` is added to (default: process.env). */
  env?: NodeJS.ProcessEnv;
}

/** What a plugin answered. */
export interface ExecCredential {
  token: string | undefined;
  cert: Buffer | undefined;
  key: Buffer | undefined;
  /** ms since the epoch; undefined: kept until a 401. */
  expiresAt: number | undefined;
}

/** An exec credential plugin could not be run, failed, or answered something that is not a credential. */
export class ExecPluginError extends KubenetError {
  readonly command: string;
  /** undefined: it did not run, or was killed by a signal. */
  readonly exitCode: number | undefined;
  readonly stderr: string;
  constructor(init: { command: string; exitCode?: number | undefined; stderr?: string; message: string }, options?: { cause?: unknown }) {
    super(init.message, options);
    this.command = init.command;
    this.exitCode = init.exitCode;
    this.stderr = init.stderr ?? '';
  }
}

type Obj = Record<string, unknown>;
const isObj = (v: unknown): v is Obj => typeof v === 'object' && v !== null && !Array.isArray(v);

/**
 * A user's `exec` as kubectl accepts it. `where(field)` prefixes messages with the kubeconfig and
 * the user; `base` is the directory a command with a `/` is relative to. @throws ConfigError
 */
export function parseExecConfig(raw: unknown, where: (field: string) => string, base: string): ExecConfig {
  if (!isObj(raw)) throw new ConfigError(`${where('exec')}: must be a mapping`);
  const { apiVersion, command, args, env, installHint, provideClusterInfo, interactiveMode } = raw;
  if (typeof command !== 'string' || command === '') throw new ConfigError(`${where('exec.command')}: must be a non-empty string`);
  if (typeof apiVersion !== 'string' || !API_VERSIONS.includes(apiVersion))
    throw new ConfigError(
      `${where('exec.apiVersion')} (${command}): ${JSON.stringify(apiVersion)} is not supported; exec plugins speak ${API_VERSIONS.join(' or ')} (v1alpha1 was removed in Kubernetes 1.24)`,
    );
  if (args !== undefined && args !== null && (!Array.isArray(args) || !args.every((a) => typeof a === 'string')))
    throw new ConfigError(`${where('exec.args')} (${command}): must be a list of strings`);
  if (env !== undefined && env !== null && !Array.isArray(env)) throw new ConfigError(`${where('exec.env')} (${command}): must be a list`);
  const vars = ((env ?? []) as unknown[]).map((e) => {
    if (!isObj(e) || typeof e.name !== 'string' || e.name === '')
      throw new ConfigError(`${where('exec.env')} (${command}): each entry needs a name`);
    return { name: e.name, value: typeof e.value === 'string' ? e.value : '' };
  });
  let mode = interactiveMode ?? undefined;
  if (mode === undefined && apiVersion.endsWith('/v1beta1')) mode = 'IfAvailable';
  if (!MODES.includes(mode as InteractiveMode))
    throw new ConfigError(
      mode === undefined
        ? `${where('exec.interactiveMode')} (${command}): must be given with ${apiVersion} (Never, IfAvailable or Always), as kubectl requires`
        : `${where('exec.interactiveMode')} (${command}): ${JSON.stringify(mode)} is not Never, IfAvailable or Always`,
    );
  return {
    apiVersion,
    command: command.includes('/') && !isAbsolute(command) ? join(base, command) : command,
    args: (args ?? []) as string[],
    env: vars,
    installHint: typeof installHint === 'string' && installHint.trim() !== '' ? installHint.trim() : undefined,
    provideClusterInfo: provideClusterInfo === true,
    interactiveMode: mode as InteractiveMode,
  };
}

/** `spec.cluster` for provideClusterInfo: the cluster's connection and its `client.authentication.k8s.io/exec` extension as `config`. */
export function execClusterInfo(
  server: string,
  tlsServerName: string | undefined,
  insecure: boolean,
  ca: Buffer | undefined,
  extensions: unknown,
): ExecClusterInfo {
  const info: ExecClusterInfo = { server };
  if (tlsServerName) info['tls-server-name'] = tlsServerName;
  if (insecure) info['insecure-skip-tls-verify'] = true;
  if (ca) info['certificate-authority-data'] = ca.toString('base64');
  const ext = Array.isArray(extensions) ? extensions.find((e) => isObj(e) && e.name === 'client.authentication.k8s.io/exec') : undefined;
  if (isObj(ext) && ext.extension !== undefined) info.config = ext.extension;
  return info;
}

/** Why an `auth-provider` user is refused, and which exec plugin replaces it (kubectl 1.26+ says the same for gcp and azure). */
export function authProviderError(provider: unknown, where: (field: string) => string): ConfigError {
  const name = isObj(provider) && typeof provider.name === 'string' ? provider.name : '';
  const instead: Record<string, string> = {
    gcp: 'use the gke-gcloud-auth-plugin exec plugin (gcloud components install gke-gcloud-auth-plugin, then gcloud container clusters get-credentials)',
    azure: 'use the kubelogin exec plugin (https://github.com/Azure/kubelogin: kubelogin convert-kubeconfig)',
    oidc: 'use an OIDC exec plugin such as kubelogin (https://github.com/int128/kubelogin: kubectl oidc-login setup)',
  };
  return new ConfigError(
    `${where('auth-provider')}${name ? ` (${name})` : ''}: auth-provider plugins are not supported by kubenet; ${instead[name] ?? 'use an exec credential plugin (users[].user.exec) instead'}`,
  );
}

/** The exec plugin of one kubeconfig user: its credential, cached until it expires. */
export class ExecAuthenticator {
  private current: ExecCredential | undefined;
  private running: Promise<ExecCredential> | undefined;

  constructor(
    readonly config: ExecConfig,
    private readonly cluster: ExecClusterInfo | undefined,
    /** For messages: "kubeconfig PATH: user NAME". */
    private readonly source: string,
    private readonly opts: ExecOptions = {},
  ) {}

  /** The credential to send: the cached one until its expiry, else the plugin's next answer (one run for concurrent callers). */
  credential(): Promise<ExecCredential> {
    const c = this.current;
    if (c && (c.expiresAt === undefined || Date.now() < c.expiresAt)) return Promise.resolve(c);
    this.current = undefined;
    this.running ??= this.run().then(
      (cred) => {
        this.running = undefined;
        this.current = cred;
        return cred;
      },
      (err: unknown) => {
        this.running = undefined;
        throw err;
      },
    );
    return this.running;
  }

  /** A request sent with `used` was answered 401: the next credential() runs the plugin again, unless another request already had it do so. */
  unauthorized(used: ExecCredential): void {
    if (this.current === used) this.current = undefined;
  }

  private fail(message: string, init: { exitCode?: number | undefined; stderr?: string; hint?: boolean } = {}, cause?: unknown): never {
    const { command, installHint } = this.config;
    const stderr = init.stderr?.trim() ?? '';
    const text = [
      `${this.source}: exec plugin ${command} ${message}`,
      stderr ? `: ${stderr.length > STDERR_KEPT ? `...${stderr.slice(-STDERR_KEPT)}` : stderr}` : '',
      init.hint && installHint ? `\n${installHint}` : '',
    ].join('');
    throw new ExecPluginError({ command, exitCode: init.exitCode, stderr, message: text }, cause === undefined ? undefined : { cause });
  }

  private interactive(): boolean {
    const tty = this.opts.stdinIsTerminal ?? process.stdin.isTTY === true;
    switch (this.config.interactiveMode) {
      case 'Never':
        return false;
      case 'IfAvailable':
        return tty;
      case 'Always':
        if (!tty)
          this.fail(
            'has interactiveMode Always, and standard input is not a terminal: run it from a terminal (or have the plugin log in first there, so that it can answer from its own cache)',
          );
        return true;
    }
  }

  private async run(): Promise<ExecCredential> {
    const { apiVersion, command, args, env } = this.config;
    const interactive = this.interactive();
    const request = {
      kind: 'ExecCredential',
      apiVersion,
      spec: { interactive, ...(this.config.provideClusterInfo && this.cluster ? { cluster: this.cluster } : {}) },
    };
    const childEnv: NodeJS.ProcessEnv = { ...(this.opts.env ?? process.env) };
    for (const e of env) childEnv[e.name] = e.value;
    childEnv[EXEC_INFO_ENV] = JSON.stringify(request);
    const forward = this.opts.stderr ?? ((s: string) => void process.stderr.write(s));

    const { code, signal, stdout, stderr } = await new Promise<{
      code: number | null;
      signal: NodeJS.Signals | null;
      stdout: string;
      stderr: string;
    }>((resolve, reject) => {
      const child = spawn(command, args, { env: childEnv, stdio: [interactive ? 'inherit' : 'ignore', 'pipe', 'pipe'] });
      let out = '';
      let err = '';
      child.stdout.setEncoding('utf8').on('data', (s: string) => void (out += s));
      child.stderr.setEncoding('utf8').on('data', (s: string) => {
        err = (err + s).slice(-4 * STDERR_KEPT);
        forward(s);
      });
      child.on('error', reject);
      child.on('close', (c, sig) => resolve({ code: c, signal: sig, stdout: out, stderr: err }));
    }).catch((err: NodeJS.ErrnoException) => {
      if (err.code === 'ENOENT') this.fail('was not found (not on PATH, or no such file)', { hint: true }, err);
      if (err.code === 'EACCES') this.fail('is not executable', { hint: true }, err);
      return this.fail(`could not be run: ${err.message}`, { hint: true }, err);
    });
    if (code !== 0)
      this.fail(code === null ? `was killed by ${signal}` : `failed with exit code ${code}`, {
        exitCode: code ?? undefined,
        stderr,
        hint: true,
      });
    return this.parse(stdout, stderr);
  }

  /** The credential in the plugin's stdout. */
  private parse(stdout: string, stderr: string): ExecCredential {
    let doc: unknown;
    try {
      doc = JSON.parse(stdout);
    } catch (err) {
      this.fail(`printed no ExecCredential JSON (${JSON.stringify(stdout.trim().slice(0, 100))})`, { stderr }, err);
    }
    if (!isObj(doc) || doc.kind !== 'ExecCredential') this.fail('printed JSON that is not an ExecCredential', { stderr });
    if (doc.apiVersion !== this.config.apiVersion)
      this.fail(`answered with apiVersion ${JSON.stringify(doc.apiVersion)}, not the ${this.config.apiVersion} it was asked for`);
    const st = doc.status;
    if (!isObj(st)) this.fail('answered an ExecCredential without a status');
    const str = (v: unknown) => (typeof v === 'string' && v !== '' ? v : undefined);
    const token = str(st.token);
    const cert = str(st.clientCertificateData);
    const key = str(st.clientKeyData);
    if ((cert === undefined) !== (key === undefined))
      this.fail(`answered ${cert ? 'clientCertificateData without clientKeyData' : 'clientKeyData without clientCertificateData'}`);
    if (token === undefined && cert === undefined) this.fail('answered neither a token nor a client certificate and key');
    let expiresAt: number | undefined;
    if (st.expirationTimestamp !== undefined && st.expirationTimestamp !== null) {
      expiresAt = typeof st.expirationTimestamp === 'string' ? Date.parse(st.expirationTimestamp) : Number.NaN;
      if (Number.isNaN(expiresAt))
        this.fail(`answered an expirationTimestamp that is not an RFC 3339 time: ${JSON.stringify(st.expirationTimestamp)}`);
    }
    return {
      token,
      cert: cert === undefined ? undefined : Buffer.from(cert),
      key: key === undefined ? undefined : Buffer.from(key),
      expiresAt,
    };
  }
}
