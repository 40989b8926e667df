/**
 * The account `kubenet uninstall` gives of a node: each thing it removed (or, in a dry run, would
 * remove), each it kept and why, each whose removal failed and how. The owners of the node's
 * objects (the installer, the shaper, the bridge, the routes...) each remove their own through one
 * `Removal`, in the order the command calls them; none knows the others.
 */
import { existsSync, readdirSync, readFileSync, rmdirSync, rmSync, statSync } from 'node:fs';
import { dirname } from 'node:path';

export type Outcome = 'removed' | 'kept' | 'failed';

export interface RemovalStep {
  /** What, as an operator would look for it: "link cbr0", "file /etc/cni/net.d/10-kubenet.conflist". */
  what: string;
  outcome: Outcome;
  /** Why it was kept, or the error. */
  why?: string;
}

export class Removal {
  readonly steps: RemovalStep[] = [];

  /** `dryRun`: nothing is changed; `remove` records what would be removed. */
  constructor(readonly dryRun: boolean) {}

  /** Removes `what` by `act` (not called in a dry run); a failure is recorded, not thrown. */
  async remove(what: string, act: () => unknown): Promise<boolean> {
    if (this.dryRun) {
      this.steps.push({ what, outcome: 'removed' });
      return true;
    }
    try {
      await act();
      this.steps.push({ what, outcome: 'removed' });
      return true;
    } catch (err) {
      this.steps.push({ what, outcome: 'failed', why: err instanceof Error ? err.message : String(err) });
      return false;
    }
  }

  keep(what: string, why: string): void {
    this.steps.push({ what, outcome: 'kept', why });
  }

  /** Whether the node holds nothing of what was looked at: no step kept or failed. */
  clean(): boolean {
    return this.steps.every((s) => s.outcome === 'removed');
  }

  /** The report, a line per step ("removed ...", "kept ...: why", "FAILED ...: error"), or that there was nothing to do. */
  lines(): string[] {
    if (this.steps.length === 0) return ['nothing to do: no kubenet-ts object on this node'];
    const verb: Record<Outcome, string> = { removed: this.dryRun ? 'would remove' : 'removed', kept: 'kept', failed: 'FAILED to remove' };
    return this.steps.map((s) => `${verb[s.outcome]} ${s.what}${s.why !== undefined ? `: ${s.why}` : ''}`);
  }
}

/** Removes a file or a directory with everything in it, when it is there. */
export async function removePath(r: Removal, what: string, path: string): Promise<void> {
  if (!existsSync(path)) return;
  await r.remove(`${what} ${path}`, () => rmSync(path, { recursive: true, force: true }));
}

/**
 * Removes a directory when it is empty; with `leftWhy`, one that is not is reported kept (naming
 * what is in it), else left silently (a directory other programs share). An empty mount point (a
 * hostPath, a tmpfs) cannot go itself: it is left, as it was there before.
 */
export async function removeEmptyDir(r: Removal, what: string, path: string, leftWhy?: string): Promise<void> {
  let names: string[];
  try {
    names = readdirSync(path);
  } catch {
    return; // not there (or not a directory): nothing of ours
  }
  if (names.length > 0) {
    if (leftWhy !== undefined) r.keep(`${what} ${path}`, `${leftWhy}: ${names.sort().join(', ')}`);
    return;
  }
  if (isMountPoint(path)) return;
  await r.remove(`${what} ${path}`, () => rmdirSync(path));
}

/** Whether a directory is a mount point: another device than its parent's, or /proc/self/mountinfo names it. */
function isMountPoint(path: string): boolean {
  try {
    if (statSync(path).dev !== statSync(dirname(path)).dev) return true;
    return readFileSync('/proc/self/mountinfo', 'utf8')
      .split('\n')
      .some((l) => l.split(' ')[4] === path);
  } catch {
    return false;
  }
}
