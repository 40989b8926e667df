/**
 * `kubectl kubenet` as the e2e suites run it against a real cluster (LocalCluster's kubeconfig):
 * the bin from the sources (through tsx), or through kubectl itself when `kubectl` is given (then
 * the plugin must be found on PATH: a directory holding a `kubectl-kubenet` that runs it).
 */
import { execa } from 'execa';
import { chmod, mkdir, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import type { PodRow } from '../../src/cli/cluster-view.js';

export const KUBECTL_KUBENET = fileURLToPath(new URL('../../src/cli/kubectl-kubenet.ts', import.meta.url));
/** tsx's loader by its full address: the plugin runs from any working directory (kubectl's). */
const TSX = import.meta.resolve('tsx');

export interface PluginRun {
  exitCode: number;
  stdout: string;
  stderr: string;
}

/** Runs `kubectl-kubenet ARGS --kubeconfig KUBECONFIG` (the bin from the sources). */
export async function kubectlKubenet(kubeconfig: string, args: string[], timeoutMs = 60_000): Promise<PluginRun> {
  const r = await execa(process.execPath, [`--import=${TSX}`, KUBECTL_KUBENET, ...args, '--kubeconfig', kubeconfig], {
    reject: false,
    timeout: timeoutMs,
  });
  return { exitCode: r.exitCode ?? -1, stdout: String(r.stdout), stderr: String(r.stderr) };
}

/** What `kubectl kubenet top --json` prints. */
export interface TopJson {
  intervalS: number;
  nodes: Array<{ node: string; agent: string; version?: string; windowS: number | null }>;
  unreachable: Array<{ node: string; agent: string; error: string }>;
  pods: PodRow[];
}

/** `kubectl kubenet top --json` against the cluster; throws with its stderr unless it exits 0. */
export async function clusterTop(kubeconfig: string, args: string[] = []): Promise<TopJson & { stderr: string }> {
  const r = await kubectlKubenet(kubeconfig, ['top', '--json', ...args]);
  if (r.exitCode !== 0) throw new Error(`kubectl kubenet top exited ${r.exitCode}: ${r.stderr}`);
  return { ...(JSON.parse(r.stdout) as TopJson), stderr: r.stderr };
}

/**
 * A directory with a `kubectl-kubenet` script that runs the plugin from the sources: put it first
 * on PATH and `kubectl kubenet ...` runs it (kubectl finds plugins on PATH by name).
 */
export async function pluginPathDir(dir: string): Promise<string> {
  await mkdir(dir, { recursive: true });
  const script = join(dir, 'kubectl-kubenet');
  await writeFile(script, `#!/bin/sh\nexec ${JSON.stringify(process.execPath)} --import=${TSX} ${JSON.stringify(KUBECTL_KUBENET)} "$@"\n`);
  await chmod(script, 0o755);
  return dir;
}
