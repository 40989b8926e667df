/**
 * Helpers that must not outlive the agent. A child the agent spawns keeps running when the agent is
 * killed (SIGKILL, OOM): a `tc -batch` fed through a pipe still runs the lines it was given, and if
 * it was held up (rtnl_lock under load) it runs them after the next agent has started and swept
 * the node, leaving objects no record names. `setpriv --pdeathsig KILL` sets the child's
 * parent-death signal and then execs the helper (the signal survives exec), so the kernel kills it
 * the moment the agent's thread that spawned it exits; a line it is running completes, no later one.
 */
import { existsSync } from 'node:fs';

export const SETPRIV = '/usr/bin/setpriv';

/** `[file, args]` that run `file args` with SIGKILL as its parent-death signal (as is where setpriv is missing). */
export function dyingWithParent(file: string, args: readonly string[]): [string, string[]] {
  return existsSync(SETPRIV) ? [SETPRIV, ['--pdeathsig', 'KILL', '--', file, ...args]] : [file, [...args]];
}
