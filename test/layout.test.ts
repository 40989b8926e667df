/**
 * The source layout's rules (issue 23), checked on the files themselves, without root:
 * - no import cycle under src/, type-only imports and re-exports included (a reader can start at
 *   any module and never loop back to it);
 * - no upward import: the folders of src/, and those of src/pod and src/daemon, are layers (LAYERS),
 *   and a module imports only from its own unit or a lower layer;
 * - no file under src/ over 400 lines, but the cohesive owners of state in LONGER, each within its
 *   own cap and with the reason (a file back under 400 leaves the list: the test says so).
 */
import test from 'ava';
import { readdirSync, readFileSync } from 'node:fs';
import { dirname, join, normalize, relative } from 'node:path';
import { fileURLToPath } from 'node:url';

const ROOT = fileURLToPath(new URL('../', import.meta.url));
const SRC = join(ROOT, 'src');
const MAX_LINES = 400;

function sources(dir: string): string[] {
  return readdirSync(dir, { withFileTypes: true }).flatMap((e) => {
    const p = join(dir, e.name);
    if (e.isDirectory()) return sources(p);
    return e.name.endsWith('.ts') ? [p] : [];
  });
}

/** The relative imports and re-exports of a module (static and type-only), as absolute .ts paths. */
export function importsOf(file: string, text: string): string[] {
  const out: string[] = [];
  const re = /^\s*(?:import|export)\s[^;]*?from\s+'(\.{1,2}\/[^']+)'/gms;
  for (let m = re.exec(text); m; m = re.exec(text)) out.push(normalize(join(dirname(file), (m[1] ?? '').replace(/\.js$/, '.ts'))));
  for (const m of text.matchAll(/import\(\s*'(\.{1,2}\/[^']+)'\s*\)/g))
    out.push(normalize(join(dirname(file), (m[1] ?? '').replace(/\.js$/, '.ts'))));
  return out;
}

/** Every cycle's members (strongly connected components of more than one module, or a self-import). */
export function cycles(graph: Map<string, string[]>): string[][] {
  let next = 0;
  const index = new Map<string, number>();
  const low = new Map<string, number>();
  const stack: string[] = [];
  const onStack = new Set<string>();
  const found: string[][] = [];
  const visit = (v: string): void => {
    index.set(v, next);
    low.set(v, next++);
    stack.push(v);
    onStack.add(v);
    for (const w of graph.get(v) ?? []) {
      if (!graph.has(w)) continue;
      if (!index.has(w)) {
        visit(w);
        low.set(v, Math.min(low.get(v) ?? 0, low.get(w) ?? 0));
      } else if (onStack.has(w)) {
        low.set(v, Math.min(low.get(v) ?? 0, index.get(w) ?? 0));
      }
    }
    if (low.get(v) === index.get(v)) {
      const comp: string[] = [];
      for (;;) {
        const w = stack.pop() ?? v;
        onStack.delete(w);
        comp.push(w);
        if (w === v) break;
      }
      if (comp.length > 1 || (graph.get(v) ?? []).includes(v)) found.push(comp.sort());
    }
  };
  for (const v of graph.keys()) if (!index.has(v)) visit(v);
  return found;
}

const files = sources(SRC);
const rel = (p: string) => relative(ROOT, p);

test('the import graph check finds a cycle when there is one (and only then)', (t) => {
  const g = new Map([
    ['a', ['b']],
    ['b', ['c']],
    ['c', ['a', 'd']],
    ['d', []],
    ['e', ['e']],
  ]);
  t.deepEqual(cycles(g), [['a', 'b', 'c'], ['e']]);
  t.deepEqual(
    cycles(
      new Map([
        ['a', ['b']],
        ['b', []],
      ]),
    ),
    [],
  );
  t.deepEqual(
    importsOf(
      '/r/src/pod/x.ts',
      "import type { A } from './a.js';\nimport {\n  B,\n} from '../b.js';\nexport { C } from './c/index.js';\nimport x from 'node:fs';\nconst d = await import('./d.js');",
    ),
    ['/r/src/pod/a.ts', '/r/src/b.ts', '/r/src/pod/c/index.ts', '/r/src/pod/d.ts'],
  );
});

test('no import cycle under src/, type-only imports included', (t) => {
  const graph = new Map(files.map((f) => [f, importsOf(f, readFileSync(f, 'utf8'))]));
  t.true(graph.size > 50, `found ${graph.size} modules`);
  const missing = [...graph].flatMap(([f, deps]) => deps.filter((d) => !graph.has(d)).map((d) => `${rel(f)} -> ${rel(d)}`));
  t.deepEqual(missing, [], 'every relative import names a module under src/');
  t.deepEqual(
    cycles(graph).map((c) => c.map(rel)),
    [],
  );
});

/**
 * The layers, lowest first, at each level that has folders of its own: a unit (a folder, or a file
 * at that level) imports only within itself or from a unit of a lower rank. Equal ranks are
 * siblings that do not know each other.
 */
const LAYERS: Record<string, Record<string, number>> = {
  src: {
    'errors.ts': 0,
    'log.ts': 0,
    util: 1,
    net: 1,
    netlink: 2,
    cni: 2,
    bandwidth: 2,
    shaper: 3,
    pod: 4,
    plugin: 5,
    daemon: 5,
    cli: 6,
    'index.ts': 7,
  },
  'src/pod': {
    'bridge-conf.ts': 0,
    'netns.ts': 0,
    records: 1,
    'requests.ts': 2,
    'attachment.ts': 3,
    node: 4,
    addresses: 5,
    lifecycle: 6,
    'network.ts': 7,
    'index.ts': 8,
  },
  'src/daemon': {
    'protocol.ts': 0,
    config: 1,
    kube: 2,
    host: 2,
    'loop-delay.ts': 2,
    'stop-steps.ts': 2,
    'pod-cidr': 3,
    cluster: 3,
    cni: 4,
    shaping: 5,
    http: 6,
    'agent.ts': 7,
  },
};

/** The imports that go up or sideways at some level of LAYERS, as "from -> to (level: a r1 -> b r2)". */
export function upwardImports(graph: Map<string, string[]>, layers: Record<string, Record<string, number>>, root: string): string[] {
  const out: string[] = [];
  const unitOf = (level: string, file: string): string | undefined => {
    const r = relative(join(root, level), file);
    if (r.startsWith('..')) return undefined;
    return r.split('/')[0];
  };
  for (const [from, deps] of graph) {
    for (const to of deps) {
      for (const [level, ranks] of Object.entries(layers)) {
        const a = unitOf(level, from);
        const b = unitOf(level, to);
        if (a === undefined || b === undefined || a === b) continue;
        const ra = ranks[a];
        const rb = ranks[b];
        if (ra === undefined || rb === undefined) {
          out.push(`${relative(root, from)} -> ${relative(root, to)} (${level}: ${ra === undefined ? a : b} has no layer)`);
        } else if (rb >= ra) {
          out.push(`${relative(root, from)} -> ${relative(root, to)} (${level}: ${a} ${ra} -> ${b} ${rb})`);
        }
      }
    }
  }
  return out;
}

test('the layer check finds an upward or sideways import, and a unit with no layer', (t) => {
  const r = '/r';
  const g = new Map([
    ['/r/src/pod/x.ts', ['/r/src/net/ip.ts', '/r/src/daemon/agent.ts']],
    ['/r/src/plugin/k.ts', ['/r/src/daemon/agent.ts']],
    ['/r/src/new/y.ts', ['/r/src/log.ts']],
  ]);
  t.deepEqual(upwardImports(g, { src: LAYERS.src ?? {} }, r), [
    'src/pod/x.ts -> src/daemon/agent.ts (src: pod 4 -> daemon 5)',
    'src/plugin/k.ts -> src/daemon/agent.ts (src: plugin 5 -> daemon 5)',
    'src/new/y.ts -> src/log.ts (src: new has no layer)',
  ]);
});

test('no upward import: each folder of src/, src/pod and src/daemon imports only its own or lower layers', (t) => {
  const graph = new Map(files.map((f) => [f, importsOf(f, readFileSync(f, 'utf8'))]));
  t.deepEqual(upwardImports(graph, LAYERS, ROOT), []);
  // Every unit at each level is in its table (a new folder needs its place).
  for (const [level, ranks] of Object.entries(LAYERS)) {
    const units = readdirSync(join(ROOT, level)).filter((n) => !n.endsWith('.md'));
    t.deepEqual(
      units.filter((u) => ranks[u] === undefined),
      [],
      `${level}: every folder and file has a layer`,
    );
  }
});

/**
 * Cohesive owners of state allowed past MAX_LINES (DESIGN.md, house style: a line cap is a smell
 * detector, not a law), each with its own cap and the reason splitting it would scatter one owner.
 */
const LONGER: Record<string, { max: number; why: string }> = {
  'src/shaper/tc.ts': {
    max: 840,
    why: "the Shaper owns every pod's installed tc state (which best-effort pods are out of the trees included, found again on its veths after a restart: steering.ts decides, the Shaper changes a pod's veth under the pod's lock), the class-id pools of the egress shards and of the ingress tree, both directions' shards and their shares of the capacity (shares.ts computes the shares, the Shaper sets them, and a namespace's shares of its total (groups.ts) under the namespaces' lock; steer-ops.ts moves best-effort pods in and out on a context the Shaper hands it), the namespace class ids, the pods to spread over more shards after an upgrade (moved under their own locks at their next ensure), the tc session and the node's trees; init, ensure, remove and reconcile all read and write that state under one mutex, and a split would hand its private maps to other files (the pure parts already live in tc-layout.ts, tc-plan.ts, groups.ts, sizing.ts)",
  },
  'src/shaper/tc-layout.ts': {
    max: 500,
    why: "every kernel object the shaper makes, its handle and its tc line, flat and in the trees, in one reading: the module doc is the map the lines follow, and a reader checking one pod's objects needs all of it",
  },
  'src/daemon/config/keys.ts': {
    max: 520,
    why: "the config-key table: one entry per key (type, default, flag, meaning, check), from which the defaults, the flags, --help, docs/config.md and the chart's values schema all come; a table split across files is two tables",
  },
  'src/daemon/agent.ts': {
    max: 470,
    why: 'the Agent owns the lifecycle of every part it starts (core, sockets, metrics port, watches, DHCP daemon) in the order start and stop must keep; the parts themselves live in their own modules',
  },
  'src/daemon/shaping/live-shaping.ts': {
    max: 450,
    why: "LiveShaping owns the per-pod mutex every re-shape takes, the queue's one worker (work-queue.ts keeps the queue, job.ts what it holds) and its refused re-shapes' retries (retries.ts keeps the timers); the pod watch, the namespace watch and `kubenet shape` all go through its one resolve-and-apply path, and its module doc is the one description of when a running pod's limits change (what they should be is cluster/wanted.ts's pure function, over src/bandwidth's rules)",
  },
  'src/pod/network.ts': {
    max: 420,
    why: "PodNetwork is the one facade both front ends drive and the owner of the core's state (its phase, the pending ADDs, the locks, the store, the modes); each operation is a few lines over lifecycle/, node/, addresses/ and records/, and its module doc states the rules every operation keeps",
  },
};

test(`no file under src/ over ${MAX_LINES} lines, but the allowed owners within their own caps`, (t) => {
  const lines = new Map(files.map((f) => [rel(f), readFileSync(f, 'utf8').split('\n').length - 1]));
  const over = [...lines].filter(([f, n]) => n > (LONGER[f]?.max ?? MAX_LINES)).map(([f, n]) => `${f}: ${n} lines`);
  t.deepEqual(over, []);
  // An allowed file that fits the common cap again leaves the list.
  t.deepEqual(
    Object.keys(LONGER).filter((f) => (lines.get(f) ?? 0) <= MAX_LINES),
    [],
    'files back under the common cap leave LONGER',
  );
  const largest = [...lines].sort((x, y) => y[1] - x[1])[0];
  t.log(`largest: ${largest?.[0]} ${largest?.[1]} lines`);
});
