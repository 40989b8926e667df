/**
 * Module loggers: a module's logger is a child of the root with the module's name, never a child of
 * another module's (pino writes every binding of every ancestor: a child of a child read
 * `"module":"pod-network","module":"shaper"`). Apart from log.ts so that code that only passes
 * loggers around (the kubectl plugin's API client) does not load pino.
 */
import type { Logger } from '../log.js';

/** The root each module logger (and each of its descendants) was made from. */
const roots = new WeakMap<Logger, Logger>();

/**
 * The logger of module `module` (the one key a reader filters on: `"module":"shaper"`), given the
 * logger its owner holds: made from that logger's root with the owner's other bindings, so every key
 * appears once on a line. `extra` adds bindings of the module's own (its ifb, its node).
 */
export function moduleLogger(parent: Logger, module: string, extra: Record<string, unknown> = {}): Logger {
  const root = roots.get(parent);
  const child = root ? root.child({ ...ownBindings(parent, root), module, ...extra }) : parent.child({ module, ...extra });
  const top = root ?? parent;
  roots.set(child, top);
  // Its descendants (per-pod and per-request children) know the root too, through pino's hook.
  const inherited = child.onChild;
  child.onChild = (c) => {
    roots.set(c, top);
    inherited(c);
  };
  return child;
}

/** The bindings `parent` adds to its root's (the root's own, its name, are on every line already), without its module. */
function ownBindings(parent: Logger, root: Logger): Record<string, unknown> {
  const inRoot = new Set([...Object.keys(root.bindings()), 'module']);
  return Object.fromEntries(Object.entries(parent.bindings()).filter(([k]) => !inRoot.has(k)));
}
