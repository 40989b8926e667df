/**
 * Static checks of manifests/: every YAML document parses, RBAC is exactly get/list/watch on nodes,
 * pods and namespaces, create on events, list/watch on servicecidrs and patch on nodes/status,
 * the ConfigMap's config passes loadConfig, and every host path the config uses is a hostPath
 * mount of the DaemonSet at the same path (the host's runtime and CNI binary use those paths).
 */
import test from 'ava';
import { mkdtemp, readdir, readFile, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { dirname, join, posix } from 'node:path';
import { fileURLToPath } from 'node:url';
import { execa } from 'execa';
import yaml from 'js-yaml';
import { loadConfig, type AgentConfig } from '../../src/daemon/config/config.js';

const MANIFESTS = fileURLToPath(new URL('../../manifests/', import.meta.url));

// Minimal shapes of the Kubernetes objects the checks read.
interface Meta {
  name?: string;
  namespace?: string;
  labels?: Record<string, string>;
}
interface Obj {
  apiVersion?: string;
  kind?: string;
  metadata?: Meta;
  [k: string]: unknown;
}
interface Rule {
  apiGroups?: string[];
  resources?: string[];
  verbs?: string[];
  resourceNames?: string[];
  nonResourceURLs?: string[];
}
interface VolumeMount {
  name: string;
  mountPath: string;
  readOnly?: boolean;
  mountPropagation?: string;
}
interface Volume {
  name: string;
  hostPath?: { path: string; type?: string };
  configMap?: { name: string; items?: Array<{ key: string; path: string }> };
}
interface Container {
  name: string;
  image?: string;
  command?: string[];
  args?: string[];
  env?: Array<{ name: string; value?: string; valueFrom?: { fieldRef?: { fieldPath: string } } }>;
  securityContext?: { privileged?: boolean };
  readinessProbe?: { exec?: { command?: string[] }; httpGet?: unknown };
  livenessProbe?: { httpGet?: { path?: string; port?: string | number; scheme?: string } };
  ports?: Array<{ name?: string; containerPort: number; protocol?: string }>;
  resources?: { requests?: Record<string, string>; limits?: Record<string, string> };
  volumeMounts?: VolumeMount[];
}
interface PodSpec {
  serviceAccountName?: string;
  hostNetwork?: boolean;
  priorityClassName?: string;
  tolerations?: Array<Record<string, unknown>>;
  containers: Container[];
  volumes?: Volume[];
}
interface DaemonSet extends Obj {
  spec: { selector: { matchLabels: Record<string, string> }; template: { metadata: Meta; spec: PodSpec } };
}

async function loadManifests(): Promise<Array<{ file: string; doc: Obj }>> {
  const files = (await readdir(MANIFESTS)).filter((f) => /\.ya?ml$/.test(f)).sort();
  const out: Array<{ file: string; doc: Obj }> = [];
  for (const f of files) {
    const text = await readFile(join(MANIFESTS, f), 'utf8');
    for (const doc of yaml.loadAll(text, undefined, { filename: f })) {
      if (doc !== null && doc !== undefined) out.push({ file: f, doc: doc as Obj });
    }
  }
  return out;
}

function only<T extends Obj>(docs: Obj[], kind: string, name?: string): T {
  const found = docs.filter((d) => d.kind === kind && (name === undefined || d.metadata?.name === name));
  if (found.length !== 1) throw new Error(`want exactly one ${kind}${name ? ` ${name}` : ''}, found ${found.length}`);
  return found[0] as T;
}

let docs: Obj[] = [];
let ds: DaemonSet;
let pod: PodSpec;
let agent: Container;
let config: AgentConfig;
let tmp = '';

test.before(async () => {
  docs = (await loadManifests()).map((d) => d.doc);
  ds = only<DaemonSet>(docs, 'DaemonSet', 'kubenet');
  pod = ds.spec.template.spec;
  const c = pod.containers.find((x) => x.name === 'kubenet');
  if (!c) throw new Error('DaemonSet has no container named kubenet');
  agent = c;
  const cm = only<Obj & { data?: Record<string, string> }>(docs, 'ConfigMap', 'kubenet-config');
  const text = cm.data?.['config.yaml'];
  if (text === undefined) throw new Error('ConfigMap kubenet-config has no config.yaml');
  tmp = await mkdtemp(join(tmpdir(), 'kmanifest-'));
  const file = join(tmp, 'config.yaml');
  await writeFile(file, text);
  config = await loadConfig({ file, flags: {}, env: { NODE_NAME: 'node-1' } });
});

test.after.always(async () => {
  if (tmp) await rm(tmp, { recursive: true, force: true });
});

test('every document parses and the expected kinds are present', (t) => {
  t.true(docs.length > 0);
  for (const d of docs) {
    t.truthy(d.apiVersion, JSON.stringify(d.metadata));
    t.truthy(d.kind);
    t.truthy(d.metadata?.name);
  }
  const kinds = new Set(docs.map((d) => d.kind));
  for (const k of ['ServiceAccount', 'ClusterRole', 'ClusterRoleBinding', 'ConfigMap', 'DaemonSet']) t.true(kinds.has(k), k);
  for (const d of docs) {
    // The one exception: the Role that reads the `kubernetes` EndpointSlice, which lives in `default`.
    const inDefault = d.metadata?.name === 'kubenet-api-endpoints' && ['Role', 'RoleBinding'].includes(d.kind ?? '');
    if (['ServiceAccount', 'ConfigMap', 'DaemonSet', 'Role', 'RoleBinding'].includes(d.kind ?? ''))
      t.is(d.metadata?.namespace, inDefault ? 'default' : 'kube-system', `${d.kind} ${d.metadata?.name}`);
  }
});

test('RBAC: exactly get/list/watch on nodes, pods and namespaces, create on events and patch on nodes/status (core group), list/watch on servicecidrs (networking.k8s.io), get/list/watch on the kubernetes EndpointSlice alone (in default), bound to the agent service account', (t) => {
  const roles = docs.filter((d) => d.kind === 'ClusterRole' || d.kind === 'Role');
  t.true(roles.length > 0);
  const granted = new Set<string>();
  for (const role of roles) {
    const rules = (role as Obj & { rules?: Rule[] }).rules ?? [];
    t.true(rules.length > 0);
    for (const r of rules) {
      t.true(r.apiGroups?.length === 1, 'one API group per rule');
      const group = r.apiGroups?.[0] === '' ? '' : `.${r.apiGroups?.[0]}`;
      t.is(r.nonResourceURLs, undefined);
      // Only the API server's EndpointSlice is named (its Role is namespaced to `default`).
      const named = r.resourceNames === undefined ? '' : `/${r.resourceNames.join(',')}`;
      if (named) t.is(role.kind, 'Role');
      t.false((r.verbs ?? []).includes('*') || (r.resources ?? []).includes('*'), 'no wildcards');
      for (const res of r.resources ?? []) for (const v of r.verbs ?? []) granted.add(`${v} ${res}${group}${named}`);
    }
  }
  // The agent reads nodes (pod CIDR), pods (annotations, live re-shaping) and namespaces (their
  // bandwidth policy, issue 24) and creates Events (BandwidthApplied / BandwidthRejected /
  // BandwidthCapped, ...), lists ServiceCIDRs (the Service ranges, unshaped with routes: direct)
  // and patches its Node's status (its bandwidth capacity as extended resources, issue 33), and
  // reads the `kubernetes` EndpointSlice (the API servers' own addresses, issue 34); it updates or
  // deletes nothing.
  const eps = ['get', 'list', 'watch'].map((v) => `${v} endpointslices.discovery.k8s.io/kubernetes`);
  const want = [
    'get nodes',
    'list nodes',
    'watch nodes',
    'get pods',
    'list pods',
    'watch pods',
    'get namespaces',
    'list namespaces',
    'watch namespaces',
    'create events',
    'list servicecidrs.networking.k8s.io',
    'watch servicecidrs.networking.k8s.io',
    'patch nodes/status',
    ...eps,
  ];
  t.deepEqual([...granted].sort(), [...want].sort());

  const sa = only(docs, 'ServiceAccount', 'kubenet');
  const binding = only<
    Obj & { roleRef: { kind: string; name: string }; subjects: Array<{ kind: string; name: string; namespace?: string }> }
  >(docs, 'ClusterRoleBinding');
  t.is(binding.roleRef.kind, 'ClusterRole');
  t.is(binding.roleRef.name, only(docs, 'ClusterRole').metadata?.name ?? '(unnamed)');
  t.deepEqual(binding.subjects, [{ kind: 'ServiceAccount', name: 'kubenet', namespace: 'kube-system' }]);
  const rb = only<Obj & { roleRef: { kind: string; name: string }; subjects: unknown[] }>(docs, 'RoleBinding');
  t.deepEqual([rb.roleRef.kind, rb.roleRef.name], ['Role', 'kubenet-api-endpoints']);
  t.deepEqual(rb.subjects, [{ kind: 'ServiceAccount', name: 'kubenet', namespace: 'kube-system' }]);
  t.is(pod.serviceAccountName, sa.metadata?.name);
});

test("the ConfigMap's config.yaml passes loadConfig and sets no podCIDR", (t) => {
  t.is(config.podCIDR, undefined, 'in a cluster the agent watches its Node');
  t.is(config.nodeName, 'node-1', 'nodeName comes from NODE_NAME');
});

test('the agent runs the plugins of its own image, never from the host dir it installs its binary into', (t) => {
  t.false(
    config.pluginBinDirs.includes(config.cniBinDir),
    `pluginBinDirs ${config.pluginBinDirs.join(',')} holds cniBinDir ${config.cniBinDir}`,
  );
  for (const dir of config.pluginBinDirs) {
    const m = mountFor(dir);
    t.true(m === undefined || m.volume.hostPath === undefined, `plugin dir ${dir} is the image's own, not a host path`);
  }
});

test('DaemonSet: host network, privileged, node-critical, runs on every node', (t) => {
  const selector = Object.entries(ds.spec.selector.matchLabels);
  t.true(selector.length > 0);
  for (const [k, v] of selector) t.is(ds.spec.template.metadata.labels?.[k], v, `the template carries selector label ${k}`);
  t.true(pod.hostNetwork);
  t.is(pod.priorityClassName, 'system-node-critical');
  t.true(
    (pod.tolerations ?? []).some((tol) => tol.operator === 'Exists' && tol.key === undefined && tol.effect === undefined),
    'a toleration of every taint',
  );
  t.true(agent.securityContext?.privileged);
  t.truthy(agent.image);
  t.deepEqual(agent.env?.find((e) => e.name === 'NODE_NAME')?.valueFrom?.fieldRef?.fieldPath, 'spec.nodeName');
  t.deepEqual([...(agent.command ?? []), ...(agent.args ?? [])], ['kubenet', 'daemon', '--config', '/etc/kubenet/config.yaml']);
  const probe = agent.readinessProbe?.exec?.command;
  t.deepEqual(probe, ['kubenet', 'health', '--config', '/etc/kubenet/config.yaml']);
});

test('the metrics port: declared as the config serves it, the liveness probe on its /healthz, a memory limit', (t) => {
  const port = /:(\d+)$/.exec(config.metricsAddress)?.[1];
  t.is(config.metricsAddress, ':10266', 'every node address, the documented port');
  t.is(config.metricsAuth, 'none');
  t.deepEqual(agent.ports, [{ name: 'metrics', containerPort: Number(port), protocol: 'TCP' }]);
  t.deepEqual(agent.livenessProbe?.httpGet, { path: '/healthz', port: 'metrics', scheme: 'HTTP' });
  t.truthy(agent.resources?.limits?.memory);
  t.is(agent.resources?.limits?.cpu, undefined, 'no CPU limit: throttling stalls pod ADDs');
});

test('the image is the one hack/build-image.sh builds: kubenet-ts:<package version>', async (t) => {
  const version = (JSON.parse(await readFile(new URL('../../package.json', import.meta.url), 'utf8')) as { version: string }).version;
  t.is(agent.image, `kubenet-ts:${version}`);
  const built = (await execa('bash', [fileURLToPath(new URL('../../hack/build-image.sh', import.meta.url)), '--print-name'])).stdout.trim();
  t.is(built, `docker.io/library/${agent.image}`, "the build names its output as containerd resolves the manifest's image");
});

function mountFor(path: string): { mount: VolumeMount; volume: Volume } | undefined {
  const mounts = (agent.volumeMounts ?? []).filter((m) => path === m.mountPath || path.startsWith(`${m.mountPath.replace(/\/$/, '')}/`));
  mounts.sort((a, b) => b.mountPath.length - a.mountPath.length); // the innermost mount holds the path
  const mount = mounts[0];
  const volume = mount && (pod.volumes ?? []).find((v) => v.name === mount.name);
  return mount && volume ? { mount, volume } : undefined;
}

test('the --config file is the ConfigMap mounted read-only', (t) => {
  const configPath = '/etc/kubenet/config.yaml';
  const m = mountFor(configPath);
  t.truthy(m);
  t.is(m?.volume.configMap?.name, 'kubenet-config');
  t.true(m?.mount.readOnly);
  t.is(posix.relative(m?.mount.mountPath ?? '', configPath), 'config.yaml', 'the ConfigMap key is the file name');
});

test('every host path the config uses is a writable hostPath mounted at the same path', (t) => {
  const paths: Record<string, string> = {
    'socket dir': dirname(config.socket),
    cniBinDir: config.cniBinDir,
    cniConfDir: config.cniConfDir,
    cniCacheDir: config.cniCacheDir,
    ipamDataDir: config.ipamDataDir,
    stateDir: config.stateDir,
  };
  for (const [what, path] of Object.entries(paths)) {
    const m = mountFor(path);
    if (!m) {
      t.fail(`${what} ${path} is not under any volume mount`);
      continue;
    }
    t.truthy(m.volume.hostPath, `${what} ${path}: volume ${m.volume.name} is not a hostPath`);
    t.is(m.volume.hostPath?.path, m.mount.mountPath, `${what} ${path}: host and container paths must match`);
    t.not(m.mount.readOnly, true, `${what} ${path} must be writable`);
  }
});

test('/run/netns follows the host (HostToContainer) and /lib/modules is read-only', (t) => {
  const netns = (agent.volumeMounts ?? []).find((m) => m.mountPath === '/run/netns');
  t.truthy(netns, '/run/netns is mounted');
  t.is(netns?.mountPropagation, 'HostToContainer');
  t.is((pod.volumes ?? []).find((v) => v.name === netns?.name)?.hostPath?.path, '/run/netns');
  const modules = (agent.volumeMounts ?? []).find((m) => m.mountPath === '/lib/modules');
  t.true(modules?.readOnly);
  t.is((pod.volumes ?? []).find((v) => v.name === modules?.name)?.hostPath?.path, '/lib/modules');
  // every volume a container mounts exists, and every volume is mounted
  const mounted = new Set((agent.volumeMounts ?? []).map((m) => m.name));
  t.deepEqual([...mounted].sort(), (pod.volumes ?? []).map((v) => v.name).sort());
});
