/**
 * Error classes of kubenet-ts. Classify failures by class or errno, never by message text.
 */
export class KubenetError extends Error {
  constructor(message: string, options?: { cause?: unknown }) {
    super(message, options);
    this.name = new.target.name;
  }
}

/** Bad input: a malformed CIDR, an unknown option, an invalid annotation. */
export class ConfigError extends KubenetError {}

/** The plugin is not ready for the operation (no pod CIDR yet, CNI binaries missing). */
export class NotReadyError extends KubenetError {}

/** The request conflicts with an existing attachment (e.g. a second ADD of it with other parameters); nothing was changed. */
export class ConflictError extends KubenetError {}

/** The operation names a pod (container) this plugin has not set up. */
export class UnknownPodError extends KubenetError {}

/** A netlink call failed; `errno` is the positive Linux errno (e.g. 17 for EEXIST). */
export class NetlinkError extends KubenetError {
  readonly errno: number;
  readonly op: string;
  constructor(op: string, errno: number, message: string, options?: { cause?: unknown }) {
    super(`${op}: ${message} (errno ${errno})`, options);
    this.errno = errno;
    this.op = op;
  }
}

/** A CNI plugin binary failed, returned a CNI error object, or could not be run. */
export class CniPluginError extends KubenetError {
  readonly plugin: string;
  readonly command: string;
  /** CNI error code (spec: 1-99 well-known, 100+ plugin-specific); undefined when the plugin gave none. */
  readonly code: number | undefined;
  readonly details: string | undefined;
  readonly stderr: string;
  constructor(
    init: { plugin: string; command: string; code?: number | undefined; msg: string; details?: string | undefined; stderr?: string },
    options?: { cause?: unknown },
  ) {
    const codePart = init.code === undefined ? '' : ` (CNI code ${init.code})`;
    const detailPart = init.details ? `: ${init.details}` : '';
    super(`CNI plugin ${init.plugin} ${init.command} failed${codePart}: ${init.msg}${detailPart}`, options);
    this.plugin = init.plugin;
    this.command = init.command;
    this.code = init.code;
    this.details = init.details;
    this.stderr = init.stderr ?? '';
  }
}

/** A system tool (iptables, modprobe, ip) exited with an error; classify by `tool` and `exitCode`. */
export class ToolError extends KubenetError {
  readonly tool: string;
  readonly args: readonly string[];
  readonly exitCode: number | undefined;
  readonly stderr: string;
  constructor(tool: string, args: readonly string[], exitCode: number | undefined, stderr: string) {
    super(`${tool} ${args.join(' ')} failed (exit ${exitCode ?? 'signal'}): ${stderr.trim() || 'no message'}`);
    this.tool = tool;
    this.args = args;
    this.exitCode = exitCode;
    this.stderr = stderr;
  }
}

/**
 * A filesystem call failed. The message says what was being done (`op` on `path`), the errno in
 * words and what an operator can do about it (src/util/fs-error.ts builds it); `code` is the errno's
 * name as Node gives it ('ENOSPC', 'ENOENT', ...), so code that checks `err.code` keeps working, and
 * `errno` its (positive) number.
 */
export class FsError extends KubenetError {
  readonly code: string;
  readonly errno: number;
  /** The failing system call ('open', 'write', 'rename', 'mkdir', ...) when known. */
  readonly syscall: string | undefined;
  /** The file or directory the operation was about (not a temporary file of it). */
  readonly path: string;
  /** What was being done: 'write', 'remove', 'create', 'read', ... */
  readonly op: string;
  constructor(
    init: { code: string; errno: number; syscall?: string | undefined; path: string; op: string },
    message: string,
    options?: { cause?: unknown },
  ) {
    super(message, options);
    this.code = init.code;
    this.errno = init.errno;
    this.syscall = init.syscall;
    this.path = init.path;
    this.op = init.op;
  }
}

/** Several independent steps failed (teardown runs every step and reports all failures). */
export class AggregateKubenetError extends KubenetError {
  readonly errors: unknown[];
  constructor(message: string, errors: unknown[]) {
    super(`${message}: ${errors.map((e) => (e instanceof Error ? e.message : String(e))).join('; ')}`, { cause: errors[0] });
    this.errors = errors;
  }
}
