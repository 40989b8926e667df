/**
 * The one pod of tests and benches: a pod sandbox the test owns (a network namespace made with
 * `ip netns add`) and the identity a container runtime passes with it on every CNI call. The
 * in-process plugin and agent harnesses, the node-sandbox world and the churn all hand out this
 * type; what a test needs beyond it (limits, a host port) it passes as `runtimeConfig` or keeps
 * beside the pod.
 */
import { addNetns, delNetns, type Cleanup } from './kernel.js';

export interface TestPod {
  namespace: string;
  name: string;
  uid: string;
  /** Sandbox (container) ID: CNI_CONTAINERID. */
  id: string;
  /** The pod's network namespace: its `ip netns` name, and the path the runtime passes as CNI_NETNS. */
  netns: string;
  netnsPath: string;
  /** CNI_IFNAME. */
  ifName: string;
  /** The runtime's capability args for this pod (portMappings, bandwidth), where a runtime sends them on every call. */
  runtimeConfig?: object;
  /** Its address once an ADD gave it one (the first IP of the result, no prefix length). */
  ip?: string;
}

/** What a runtime says about the pod in CNI_ARGS. */
export type PodIdentity = Pick<TestPod, 'namespace' | 'name' | 'uid' | 'id'>;

/** CNI_ARGS exactly as containerd 1.6 passes them. */
export function cniArgs(p: PodIdentity): string {
  return `IgnoreUnknown=1;K8S_POD_NAMESPACE=${p.namespace};K8S_POD_NAME=${p.name};K8S_POD_INFRA_CONTAINER_ID=${p.id};K8S_POD_UID=${p.uid}`;
}

/**
 * Pod `name` in namespace default, its netns `<prefix>-<tag>-<name>` made now and deleted by
 * `cleanup`; ID `<tag>-<name>-` padded with zeros to 64 characters (the trailing '-' keeps p1 and
 * p10 apart), UID `uid-<tag>-<name>`, interface eth0.
 */
export async function addTestPod(cleanup: Cleanup, prefix: string, tag: string, name: string): Promise<TestPod> {
  const netns = `${prefix}-${tag}-${name}`;
  const { path } = await addNetns(netns);
  cleanup.add(() => delNetns(netns));
  return {
    namespace: 'default',
    name,
    uid: `uid-${tag}-${name}`,
    id: `${tag}-${name}-`.padEnd(64, '0'),
    netns,
    netnsPath: path,
    ifName: 'eth0',
  };
}
