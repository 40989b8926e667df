#!/usr/bin/env node
/**
 * The `kubectl-kubenet` bin: `kubectl kubenet top|status` once it is on PATH (kubectl-plugin.ts).
 */
import { run } from './kubectl-plugin.js';

run(process.argv.slice(2), { out: (s) => process.stdout.write(s), err: (s) => process.stderr.write(s) }).then(
  // exit, not exitCode: the API client's keep-alive connections would hold the process a while.
  (code) => process.exit(code),
  (err: unknown) => {
    process.stderr.write(`kubectl kubenet: ${err instanceof Error ? err.message : String(err)}\n`);
    process.exit(1);
  },
);
