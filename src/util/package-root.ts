/**
 * Files the package carries next to its code (the native binaries under native/build/), found
 * from wherever the code runs: src/ through tsx, or dist/src/ as built and shipped.
 */
import { readFileSync } from 'node:fs';
import { dirname, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';

/** The package root: the directory holding package.json, src/ and native/. */
export function packageRoot(): string {
  const here = dirname(fileURLToPath(import.meta.url)); // .../src/util or .../dist/src/util
  const up = resolve(here, '..', '..');
  return up.endsWith('/dist') ? resolve(up, '..') : up;
}

/** A path relative to the package root, e.g. "native/build/kubenet-cni". */
export function packagePath(relative: string): string {
  return resolve(packageRoot(), relative);
}

let version: string | undefined;
/** The package's version (package.json), read once; "unknown" when package.json cannot be read. */
export function packageVersion(): string {
  if (version === undefined) {
    try {
      const v = (JSON.parse(readFileSync(packagePath('package.json'), 'utf8')) as { version?: unknown }).version;
      version = typeof v === 'string' && v !== '' ? v : 'unknown';
    } catch {
      version = 'unknown';
    }
  }
  return version;
}
