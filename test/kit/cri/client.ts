/**
 * A minimal Kubernetes CRI client (RuntimeService of `runtime.v1`) over a unix socket, for driving
 * a real container runtime the way kubelet does: RunPodSandbox, PodSandboxStatus (verbose, to find
 * the sandbox process and its network namespace), StopPodSandbox, RemovePodSandbox, plus Version,
 * Status and ListPodSandbox; and for a pod's containers CreateContainer, StartContainer,
 * StopContainer, RemoveContainer, ContainerStatus and ListContainers. The messages are those of ./runtime-v1.proto (field numbers from
 * k8s.io/cri-api); fields are camelCase here, as @grpc/proto-loader maps them.
 */
import * as grpc from '@grpc/grpc-js';
import * as protoLoader from '@grpc/proto-loader';
import { fileURLToPath } from 'node:url';

const PROTO = fileURLToPath(new URL('./runtime-v1.proto', import.meta.url));

export type Protocol = 'TCP' | 'UDP' | 'SCTP';
export type NamespaceMode = 'POD' | 'CONTAINER' | 'NODE' | 'TARGET';
export type PodSandboxState = 'SANDBOX_READY' | 'SANDBOX_NOTREADY';

export interface PortMapping {
  protocol?: Protocol;
  containerPort: number;
  hostPort?: number;
  hostIp?: string;
}

export interface PodSandboxMetadata {
  name: string;
  uid: string;
  namespace: string;
  attempt?: number;
}

export interface PodSandboxConfig {
  metadata: PodSandboxMetadata;
  hostname?: string;
  logDirectory?: string;
  dnsConfig?: { servers?: string[]; searches?: string[]; options?: string[] };
  portMappings?: PortMapping[];
  labels?: Record<string, string>;
  annotations?: Record<string, string>;
  linux?: {
    cgroupParent?: string;
    securityContext?: {
      namespaceOptions?: { network?: NamespaceMode; pid?: NamespaceMode; ipc?: NamespaceMode; targetId?: string };
      readonlyRootfs?: boolean;
      privileged?: boolean;
    };
    sysctls?: Record<string, string>;
  };
}

export interface PodSandboxStatus {
  id: string;
  metadata: PodSandboxMetadata;
  state: PodSandboxState;
  createdAt: number;
  network: { ip: string; additionalIps: Array<{ ip: string }> } | null;
  linux: unknown;
  labels: Record<string, string>;
  annotations: Record<string, string>;
  runtimeHandler: string;
}

export interface PodSandboxStatusResponse {
  status: PodSandboxStatus;
  info: Record<string, string>;
}

export interface PodSandbox {
  id: string;
  metadata: PodSandboxMetadata;
  state: PodSandboxState;
  createdAt: number;
  labels: Record<string, string>;
  annotations: Record<string, string>;
  runtimeHandler: string;
}

export interface VersionResponse {
  version: string;
  runtimeName: string;
  runtimeVersion: string;
  runtimeApiVersion: string;
}

export interface RuntimeCondition {
  type: string;
  status: boolean;
  reason: string;
  message: string;
}

export type MountPropagation = 'PROPAGATION_PRIVATE' | 'PROPAGATION_HOST_TO_CONTAINER' | 'PROPAGATION_BIDIRECTIONAL';
export type ContainerState = 'CONTAINER_CREATED' | 'CONTAINER_RUNNING' | 'CONTAINER_EXITED' | 'CONTAINER_UNKNOWN';

export interface ContainerMount {
  containerPath: string;
  hostPath: string;
  readonly?: boolean;
  propagation?: MountPropagation;
}

export interface ContainerConfig {
  metadata: { name: string; attempt?: number };
  image: { image: string };
  command?: string[];
  args?: string[];
  workingDir?: string;
  envs?: Array<{ key: string; value: string }>;
  mounts?: ContainerMount[];
  labels?: Record<string, string>;
  annotations?: Record<string, string>;
  /** Relative to the sandbox's logDirectory. */
  logPath?: string;
  linux?: {
    securityContext?: { privileged?: boolean; namespaceOptions?: { network?: NamespaceMode; pid?: NamespaceMode; ipc?: NamespaceMode } };
  };
}

export interface ContainerStatus {
  id: string;
  metadata: { name: string; attempt: number };
  state: ContainerState;
  createdAt: number;
  startedAt: number;
  finishedAt: number;
  exitCode: number;
  image: { image: string } | null;
  imageRef: string;
  reason: string;
  message: string;
  logPath: string;
}

export interface ContainerSummary {
  id: string;
  podSandboxId: string;
  metadata: { name: string; attempt: number };
  state: ContainerState;
  imageRef: string;
  labels: Record<string, string>;
}

/** A failed CRI call: the gRPC status code (grpc.status) and details, and which call it was. */
export class CriError extends Error {
  constructor(
    readonly method: string,
    readonly code: grpc.status,
    readonly details: string,
  ) {
    super(`CRI ${method} failed: ${grpc.status[code] ?? code}: ${details}`);
  }
}

type Unary = (req: unknown, meta: grpc.Metadata, opts: grpc.CallOptions, cb: (err: grpc.ServiceError | null, res: unknown) => void) => void;

let definition: grpc.GrpcObject | undefined;
function runtimeServiceCtor(): grpc.ServiceClientConstructor {
  definition ??= grpc.loadPackageDefinition(
    protoLoader.loadSync(PROTO, { keepCase: false, longs: Number, enums: String, defaults: true, arrays: true, objects: false }),
  );
  const v1 = (definition.runtime as grpc.GrpcObject).v1 as grpc.GrpcObject;
  return v1.RuntimeService as grpc.ServiceClientConstructor;
}

export class CriClient {
  private readonly client: grpc.Client;

  /** `socket`: the runtime's gRPC unix socket path. `callTimeoutMs`: deadline of each call. */
  constructor(
    readonly socket: string,
    private readonly callTimeoutMs = 120_000,
  ) {
    const Ctor = runtimeServiceCtor();
    this.client = new Ctor(`unix://${socket}`, grpc.credentials.createInsecure(), {
      // A runtime restart must not leave the channel backing off for long.
      'grpc.initial_reconnect_backoff_ms': 100,
      'grpc.max_reconnect_backoff_ms': 500,
    });
  }

  /**
   * Waits until the runtime answers Version (it may still be starting: connection refused or no
   * socket yet are retried until `timeoutMs`). Returns the version.
   */
  async waitReady(timeoutMs = 30_000): Promise<VersionResponse> {
    const deadline = Date.now() + timeoutMs;
    for (;;) {
      try {
        return await this.call<VersionResponse>('Version', { version: 'v1' }, 2_000);
      } catch (err) {
        const retriable = err instanceof CriError && (err.code === grpc.status.UNAVAILABLE || err.code === grpc.status.DEADLINE_EXCEEDED);
        if (!retriable || Date.now() > deadline) throw err;
        await new Promise((r) => setTimeout(r, 100));
      }
    }
  }

  version(): Promise<VersionResponse> {
    return this.call('Version', { version: 'v1' });
  }

  /** The runtime's conditions (RuntimeReady, NetworkReady). */
  async status(): Promise<RuntimeCondition[]> {
    const r = await this.call<{ status: { conditions: RuntimeCondition[] } | null }>('Status', { verbose: false });
    return r.status?.conditions ?? [];
  }

  /** Runs a pod sandbox (RunPodSandbox); returns its ID. */
  async runPodSandbox(config: PodSandboxConfig, runtimeHandler = ''): Promise<string> {
    const r = await this.call<{ podSandboxId: string }>('RunPodSandbox', { config, runtimeHandler });
    return r.podSandboxId;
  }

  podSandboxStatus(id: string, verbose = false): Promise<PodSandboxStatusResponse> {
    return this.call('PodSandboxStatus', { podSandboxId: id, verbose });
  }

  async stopPodSandbox(id: string): Promise<void> {
    await this.call('StopPodSandbox', { podSandboxId: id });
  }

  async removePodSandbox(id: string): Promise<void> {
    await this.call('RemovePodSandbox', { podSandboxId: id });
  }

  async listPodSandbox(filter?: { id?: string; state?: PodSandboxState; labelSelector?: Record<string, string> }): Promise<PodSandbox[]> {
    const f = filter
      ? { id: filter.id ?? '', labelSelector: filter.labelSelector ?? {}, ...(filter.state ? { state: { state: filter.state } } : {}) }
      : undefined;
    const r = await this.call<{ items: PodSandbox[] }>('ListPodSandbox', f ? { filter: f } : {});
    return r.items;
  }

  /** CreateContainer in a running sandbox (its config as given to RunPodSandbox); returns the container ID. */
  async createContainer(podSandboxId: string, config: ContainerConfig, sandboxConfig: PodSandboxConfig): Promise<string> {
    const r = await this.call<{ containerId: string }>('CreateContainer', { podSandboxId, config, sandboxConfig });
    return r.containerId;
  }

  async startContainer(id: string): Promise<void> {
    await this.call('StartContainer', { containerId: id });
  }

  /** StopContainer: SIGTERM (or the image's stop signal), SIGKILL after `timeoutS`. */
  async stopContainer(id: string, timeoutS: number): Promise<void> {
    await this.call('StopContainer', { containerId: id, timeout: timeoutS });
  }

  async removeContainer(id: string): Promise<void> {
    await this.call('RemoveContainer', { containerId: id });
  }

  async containerStatus(id: string): Promise<ContainerStatus> {
    const r = await this.call<{ status: ContainerStatus }>('ContainerStatus', { containerId: id, verbose: false });
    return r.status;
  }

  async listContainers(filter?: { podSandboxId?: string; state?: ContainerState }): Promise<ContainerSummary[]> {
    const f = filter ? { podSandboxId: filter.podSandboxId ?? '', ...(filter.state ? { state: { state: filter.state } } : {}) } : undefined;
    const r = await this.call<{ containers: ContainerSummary[] }>('ListContainers', f ? { filter: f } : {});
    return r.containers;
  }

  close(): void {
    this.client.close();
  }

  private call<T>(method: string, req: unknown, timeoutMs = this.callTimeoutMs): Promise<T> {
    const fn = (this.client as unknown as Record<string, Unary>)[method];
    if (!fn) return Promise.reject(new Error(`no CRI method ${method} in runtime-v1.proto`));
    return new Promise<T>((resolve, reject) => {
      fn.call(this.client, req, new grpc.Metadata(), { deadline: Date.now() + timeoutMs }, (err, res) => {
        if (err) reject(new CriError(method, err.code, err.details));
        else resolve(res as T);
      });
    });
  }
}

/** What containerd reports about a sandbox in PodSandboxStatus's verbose `info` (the fields used here). */
export interface ContainerdSandboxInfo {
  pid: number;
  /** The pod's network namespace path, as containerd passed it to CNI (CNI_NETNS). */
  netnsPath: string | undefined;
  /** The CNI result containerd keeps (its own parse of the plugin's answer). */
  cniResult: unknown;
  raw: Record<string, unknown>;
}

/** Parses containerd's verbose sandbox info (one JSON document under key "info"). */
export function containerdSandboxInfo(r: PodSandboxStatusResponse): ContainerdSandboxInfo {
  const text = r.info.info;
  if (!text) throw new Error(`PodSandboxStatus gave no verbose "info" (keys: ${Object.keys(r.info).join(', ') || 'none'})`);
  const raw = JSON.parse(text) as Record<string, unknown>;
  interface Ns {
    type?: string;
    path?: string;
  }
  const spec = raw.runtimeSpec as { linux?: { namespaces?: Ns[] } } | undefined;
  const netnsPath = spec?.linux?.namespaces?.find((n) => n.type === 'network')?.path;
  return { pid: Number(raw.pid ?? 0), netnsPath: netnsPath || undefined, cniResult: raw.cniResult, raw };
}
