/**
 * manifests/uninstall.yaml against the agent's manifest: its config is the agent's ConfigMap's
 * (the names and directories uninstall reads), it runs `kubenet uninstall` with it from the agent's
 * image, privileged on the host network of every node, and reaches every directory it removes
 * through a hostPath of an enclosing directory at the same path (so the directory itself can go),
 * and the CNI directories at their own paths. Static; no root.
 */
import test from 'ava';
import { readFile } from 'node:fs/promises';
import { dirname } from 'node:path';
import { fileURLToPath } from 'node:url';
import yaml from 'js-yaml';

interface Mount {
  name: string;
  mountPath: string;
  readOnly?: boolean;
}
interface Container {
  name: string;
  image?: string;
  command?: string[];
  securityContext?: { privileged?: boolean };
  volumeMounts?: Mount[];
}
interface Doc {
  kind?: string;
  metadata?: { name?: string; namespace?: string };
  data?: Record<string, string>;
  spec?: {
    template: {
      spec: {
        hostNetwork?: boolean;
        tolerations?: unknown[];
        initContainers?: Container[];
        containers: Container[];
        volumes?: Array<{ name: string; hostPath?: { path: string }; configMap?: { name: string } }>;
      };
    };
  };
}

const load = async (name: string) =>
  yaml.loadAll(await readFile(fileURLToPath(new URL(`../../manifests/${name}`, import.meta.url)), 'utf8')) as Doc[];

test('uninstall.yaml runs `kubenet uninstall` once per node with the agent config, image and host paths', async (t) => {
  const agentDocs = await load('kubenet.yaml');
  const docs = await load('uninstall.yaml');
  const agentCm = agentDocs.find((d) => d.kind === 'ConfigMap' && d.metadata?.name === 'kubenet-config');
  const cm = docs.find((d) => d.kind === 'ConfigMap');
  t.is(cm?.data?.['config.yaml'], agentCm?.data?.['config.yaml'], "the agent's config, word for word");
  const agentImage = agentDocs.find((d) => d.kind === 'DaemonSet')?.spec?.template.spec.containers[0]?.image;
  const ds = docs.find((d) => d.kind === 'DaemonSet');
  t.is(ds?.metadata?.namespace, 'kube-system');
  const pod = ds?.spec?.template.spec;
  t.true(pod?.hostNetwork);
  t.deepEqual(pod?.tolerations, [{ operator: 'Exists' }], 'on every node');
  const init = pod?.initContainers?.[0];
  t.deepEqual(init?.command, ['kubenet', 'uninstall', '--config', '/etc/kubenet/config.yaml']);
  t.is(init?.image, agentImage);
  t.true(init?.securityContext?.privileged);
  const volume = (m: Mount) => pod?.volumes?.find((v) => v.name === m.name);
  t.is(
    volume(init?.volumeMounts?.find((m) => m.mountPath === '/etc/kubenet') ?? { name: '', mountPath: '' })?.configMap?.name,
    cm?.metadata?.name,
  );
  const config = yaml.load(cm?.data?.['config.yaml'] ?? '') as Record<string, string>;
  const mountOf = (path: string) =>
    (init?.volumeMounts ?? [])
      .filter((m) => path === m.mountPath || path.startsWith(`${m.mountPath}/`))
      .sort((a, b) => b.mountPath.length - a.mountPath.length)[0];
  // Removed with their contents: reached through an enclosing directory.
  for (const dir of [config.stateDir, config.ipamDataDir, dirname(config.socket ?? '')]) {
    const m = mountOf(dir ?? '');
    t.truthy(m, `${dir} is mounted`);
    t.not(m?.mountPath, dir, `${dir} is reached through its parent, so it can be removed`);
    t.is(volume(m ?? { name: '', mountPath: '' })?.hostPath?.path, m?.mountPath, `${dir}: host and container paths match`);
    t.not(m?.readOnly, true);
  }
  // Kept (other plugins use them); only kubenet's files in them go.
  for (const dir of [config.cniBinDir, config.cniConfDir]) {
    const m = mountOf(dir ?? '');
    t.is(volume(m ?? { name: '', mountPath: '' })?.hostPath?.path, m?.mountPath, `${dir}: host and container paths match`);
    t.not(m?.readOnly, true);
  }
});
