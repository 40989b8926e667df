import { readdir } from 'node:fs/promises';
import { isIP } from 'node:net';
import { join } from 'node:path';
import { KubenetPlugin } from '../../src/plugin/kubenet.js';
import type { Host, KubenetOptions } from '../../src/plugin/types.js';
import { CNI_BIN_DIRS, Cleanup, delIfbs, delLink, makeTmpDir, rmrf, uniq } from './kernel.js';
import { addTestPod, type TestPod } from './test-pod.js';

/** A fake kubelet host: pods and netns paths the test registers. A process/storage boundary, not the kernel. */
export class FakeHost implements Host {
  readonly pods = new Map<string, { annotations?: Record<string, string> }>();
  readonly netns = new Map<string, string>();
  getPodByName(namespace: string, name: string) {
    return this.pods.get(`${namespace}/${name}`);
  }
  getNetNS(containerId: string): string {
    const path = this.netns.get(containerId);
    if (!path) throw new Error(`no sandbox ${containerId}`);
    return path;
  }
}

/** One plugin on its own bridge, IPAM dir, state dir and (legacy) cache dir; `cleanup` removes all it made. */
export class PluginHarness {
  readonly cleanup = new Cleanup();
  readonly host = new FakeHost();
  readonly tag = uniq(6);
  readonly bridge = `kpl${this.tag}`;
  readonly ifb = `kif${this.tag}`;
  plugin!: KubenetPlugin;
  ipamDir!: string;
  /** Where 0.1.0 kept its CNI cache (read once at init to upgrade; nothing is written there now). */
  cacheDir!: string;
  stateDir!: string;
  shaperDir!: string;
  private readonly plugins: KubenetPlugin[] = [];

  async start(opts: Partial<KubenetOptions> = {}): Promise<KubenetPlugin> {
    this.ipamDir = await makeTmpDir('kpl-ipam');
    this.cacheDir = await makeTmpDir('kpl-cache');
    this.cleanup.add(() => rmrf(this.ipamDir));
    this.cleanup.add(() => rmrf(this.cacheDir));
    this.stateDir = await makeTmpDir('kpl-state');
    this.cleanup.add(() => rmrf(this.stateDir));
    this.shaperDir = await makeTmpDir('kpl-shaper');
    this.cleanup.add(() => rmrf(this.shaperDir));
    this.cleanup.add(() => delLink(this.bridge));
    this.cleanup.add(() => delIfbs(this.ifb));
    this.cleanup.add(async () => {
      for (const p of this.plugins) p.close();
    });
    this.plugin = this.newPlugin(opts);
    return this.plugin;
  }

  newPlugin(opts: Partial<KubenetOptions> = {}): KubenetPlugin {
    const plugin = new KubenetPlugin({
      bridgeName: this.bridge,
      cniBinDirs: CNI_BIN_DIRS,
      ipamDataDir: this.ipamDir,
      cniCacheDir: this.cacheDir,
      stateDir: this.stateDir,
      ifbName: this.ifb,
      shaperStateDir: this.shaperDir,
      ...opts,
    });
    this.plugins.push(plugin);
    return plugin;
  }

  /** A pod sandbox of the test's own (addTestPod: netns `kpl-<tag>-<name>`), registered with the fake host. */
  async addPod(name: string, annotations?: Record<string, string>): Promise<TestPod> {
    const pod = await addTestPod(this.cleanup, 'kpl', this.tag, name);
    this.host.netns.set(pod.id, pod.netnsPath);
    this.host.pods.set(`${pod.namespace}/${pod.name}`, annotations ? { annotations } : {});
    return pod;
  }

  /** Addresses host-local still holds (files named after IPs). */
  async reservedIps(): Promise<string[]> {
    const dir = join(this.ipamDir, 'kubenet');
    const files = await readdir(dir).catch(() => [] as string[]);
    return files.filter((f) => isIP(f) !== 0);
  }

  /** Files in the legacy CNI cache dir (kubenet-ts writes none there any more). */
  async cacheEntries(): Promise<string[]> {
    return readdir(join(this.cacheDir, 'results')).catch(() => [] as string[]);
  }

  /** Pod record files (one per attachment). */
  async recordFiles(): Promise<string[]> {
    return readdir(join(this.stateDir, 'pods')).catch(() => [] as string[]);
  }
}

export { CNI_BIN_DIRS };
