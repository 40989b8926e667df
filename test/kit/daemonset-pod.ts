/**
 * The kubenet DaemonSet's pod as kubelet runs it on a node, for a runtime driven over CRI: reads
 * manifests/kubenet.yaml (never a copy) and turns the pod template into the RunPodSandbox and
 * CreateContainer configs kubelet's kuberuntime would send (host network, privileged, the
 * container's command, args and env, every volume mount with its propagation), after doing what
 * kubelet does on the node first: hostPath volumes of type DirectoryOrCreate / FileOrCreate are
 * created, the ConfigMap volume is written as files, and the service account volume holds `token`,
 * `ca.crt` and `namespace`. Env `valueFrom.fieldRef: spec.nodeName` is the node's name; kubelet's
 * `KUBERNETES_SERVICE_HOST/PORT` point at the (test's) API server.
 */
import yaml from 'js-yaml';
import { mkdir, open, readFile, writeFile } from 'node:fs/promises';
import { dirname, join } from 'node:path';
import { MANIFEST } from './agent-process.js';
import type { ContainerConfig, ContainerMount, PodSandboxConfig } from './cri/client.js';
import type { NodeSandbox } from './node-sandbox.js';

interface EnvVar {
  name: string;
  value?: string;
  valueFrom?: { fieldRef?: { fieldPath: string } };
}
interface VolumeMount {
  name: string;
  mountPath: string;
  readOnly?: boolean;
  mountPropagation?: 'None' | 'HostToContainer' | 'Bidirectional';
}
interface Volume {
  name: string;
  hostPath?: { path: string; type?: string };
  configMap?: { name: string };
}
interface ContainerSpec {
  name: string;
  image: string;
  command?: string[];
  args?: string[];
  env?: EnvVar[];
  securityContext?: { privileged?: boolean };
  volumeMounts?: VolumeMount[];
}
export interface DaemonSetSpec {
  name: string;
  namespace: string;
  hostNetwork: boolean;
  container: ContainerSpec;
  volumes: Volume[];
  /** data of every ConfigMap of the manifest, by name. */
  configMaps: Map<string, Record<string, string>>;
}

const SERVICE_ACCOUNT_DIR = '/var/run/secrets/kubernetes.io/serviceaccount';

/** The manifest's DaemonSet (its one container) and ConfigMaps. */
export async function manifestDaemonSet(): Promise<DaemonSetSpec> {
  interface Doc {
    kind?: string;
    metadata?: { name?: string; namespace?: string };
    data?: Record<string, string>;
    spec?: { template?: { spec?: { hostNetwork?: boolean; containers?: ContainerSpec[]; volumes?: Volume[] } } };
  }
  const docs = (yaml.loadAll(await readFile(MANIFEST, 'utf8')) as Array<Doc | null>).filter((d): d is Doc => d !== null);
  const ds = docs.find((d) => d.kind === 'DaemonSet');
  const pod = ds?.spec?.template?.spec;
  const container = pod?.containers?.[0];
  if (!ds?.metadata?.name || !pod || !container || pod.containers?.length !== 1)
    throw new Error(`${MANIFEST}: no DaemonSet with exactly one container`);
  const configMaps = new Map(docs.filter((d) => d.kind === 'ConfigMap').map((d) => [d.metadata?.name ?? '', d.data ?? {}]));
  return {
    name: ds.metadata.name,
    namespace: ds.metadata.namespace ?? 'default',
    hostNetwork: pod.hostNetwork === true,
    container,
    volumes: pod.volumes ?? [],
    configMaps,
  };
}

export interface KubeletPodOptions {
  nodeName: string;
  uid: string;
  /** The pod's name, e.g. kubenet-x7k2p. */
  podName: string;
  cgroupParent: string;
  /** Where kubelet's per-pod files go (ConfigMap and service account volumes, logs): a host dir the sandbox sees at the same path. */
  podDir: string;
  apiServer: { host: string; port: number; caCert: string; token: string };
  /** The image to run; default the manifest's. */
  image?: string;
}

export interface KubeletPod {
  sandbox: PodSandboxConfig;
  container: ContainerConfig;
  /** The container's log file (CRI log format), on the host. */
  logFile: string;
}

const PROPAGATION = {
  None: 'PROPAGATION_PRIVATE',
  HostToContainer: 'PROPAGATION_HOST_TO_CONTAINER',
  Bidirectional: 'PROPAGATION_BIDIRECTIONAL',
} as const;

/**
 * Prepares the node as kubelet would for `ds` (hostPath types, ConfigMap files, the service account
 * volume) inside `sb`, and returns the CRI configs of its pod.
 */
export async function kubeletPod(sb: NodeSandbox, ds: DaemonSetSpec, o: KubeletPodOptions): Promise<KubeletPod> {
  const c = ds.container;
  const mounts: ContainerMount[] = [];
  for (const m of c.volumeMounts ?? []) {
    const v = ds.volumes.find((x) => x.name === m.name);
    if (!v) throw new Error(`volumeMount ${m.name} names no volume`);
    let hostPath: string;
    if (v.hostPath) {
      hostPath = v.hostPath.path;
      const inside = sb.hostPath(hostPath);
      if (v.hostPath.type === 'DirectoryOrCreate') await mkdir(inside, { recursive: true, mode: 0o755 });
      else if (v.hostPath.type === 'FileOrCreate') {
        await mkdir(dirname(inside), { recursive: true });
        await (await open(inside, 'a', 0o644)).close();
      }
    } else if (v.configMap) {
      const data = ds.configMaps.get(v.configMap.name);
      if (!data) throw new Error(`volume ${v.name} names ConfigMap ${v.configMap.name}, which the manifest does not hold`);
      hostPath = join(o.podDir, 'volumes', v.name);
      await mkdir(hostPath, { recursive: true });
      for (const [k, text] of Object.entries(data)) await writeFile(join(hostPath, k), text);
    } else {
      throw new Error(`volume ${v.name}: only hostPath and configMap volumes are known here`);
    }
    mounts.push({
      containerPath: m.mountPath,
      hostPath,
      readonly: m.readOnly === true,
      propagation: PROPAGATION[m.mountPropagation ?? 'None'],
    });
  }
  // The projected service account token volume kubelet adds to every pod.
  const sa = join(o.podDir, 'volumes', 'kube-api-access');
  await mkdir(sa, { recursive: true });
  await writeFile(join(sa, 'token'), o.apiServer.token);
  await writeFile(join(sa, 'ca.crt'), await readFile(o.apiServer.caCert));
  await writeFile(join(sa, 'namespace'), ds.namespace);
  mounts.push({ containerPath: SERVICE_ACCOUNT_DIR, hostPath: sa, readonly: true, propagation: 'PROPAGATION_PRIVATE' });

  const envs = (c.env ?? []).map((e) => {
    if (e.value !== undefined) return { key: e.name, value: e.value };
    if (e.valueFrom?.fieldRef?.fieldPath === 'spec.nodeName') return { key: e.name, value: o.nodeName };
    throw new Error(`env ${e.name}: only value and fieldRef spec.nodeName are known here`);
  });
  envs.push(
    { key: 'KUBERNETES_SERVICE_HOST', value: o.apiServer.host },
    { key: 'KUBERNETES_SERVICE_PORT', value: String(o.apiServer.port) },
  );

  const logDirectory = join(o.podDir, 'logs');
  await mkdir(join(logDirectory, c.name), { recursive: true });
  const privileged = c.securityContext?.privileged === true;
  const namespaceOptions = {
    network: ds.hostNetwork ? ('NODE' as const) : ('POD' as const),
    pid: 'CONTAINER' as const,
    ipc: 'POD' as const,
  };
  const labels = { 'io.kubernetes.pod.name': o.podName, 'io.kubernetes.pod.namespace': ds.namespace, 'io.kubernetes.pod.uid': o.uid };
  const sandbox: PodSandboxConfig = {
    metadata: { name: o.podName, uid: o.uid, namespace: ds.namespace, attempt: 0 },
    // kubelet sets a hostname only for a pod with its own network (a host-network pod keeps the node's UTS namespace).
    ...(ds.hostNetwork ? {} : { hostname: o.podName }),
    logDirectory,
    labels,
    annotations: { 'kubernetes.io/config.source': 'api', 'kubernetes.io/config.seen': new Date().toISOString() },
    linux: { cgroupParent: o.cgroupParent, securityContext: { namespaceOptions, privileged } },
  };
  const container: ContainerConfig = {
    metadata: { name: c.name, attempt: 0 },
    image: { image: o.image ?? c.image },
    ...(c.command ? { command: c.command } : {}),
    ...(c.args ? { args: c.args } : {}),
    envs,
    mounts,
    labels: { ...labels, 'io.kubernetes.container.name': c.name },
    logPath: join(c.name, '0.log'),
    linux: { securityContext: { privileged, namespaceOptions } },
  };
  return { sandbox, container, logFile: join(logDirectory, c.name, '0.log') };
}
