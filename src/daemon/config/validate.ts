/**
 * The checks config keys' values share (config/keys.ts): each normalizes one value or throws the
 * error `fail` makes (what was expected, and why not); the caller adds where the value came from.
 */
import { isAbsolute } from 'node:path';
import { isValidIfName } from '../../net/ifname.js';
import { parseCidr } from '../../net/ip.js';

/** Makes the error of a bad value: what was expected, and why it is not (the caller adds where). */
export type Fail = (expected: string, detail?: string) => Error;
/** Checks and normalizes one key's value, or throws fail(...). */
export type Validator = (value: unknown, fail: Fail) => unknown;

export function str(value: unknown, fail: Fail, expected: string): string {
  if (typeof value !== 'string' || value === '' || value.includes('\0')) throw fail(expected);
  return value;
}

export function ifName(value: unknown, fail: Fail): string {
  const expected = 'a Linux interface name (1-15 bytes, no "/", ":" or whitespace, not "." or "..")';
  const s = str(value, fail, expected);
  if (!isValidIfName(s)) throw fail(expected);
  return s;
}

/** The CIDR normalized (host bits cleared), or fail(expected, why). */
export function cidr(s: string, fail: Fail, expected: string): string {
  try {
    return parseCidr(s).cidr;
  } catch (err) {
    throw fail(expected, causeText(err));
  }
}

export function absPath(expected = 'an absolute path'): Validator {
  return (value, fail) => {
    const s = str(value, fail, expected);
    if (!isAbsolute(s)) throw fail(expected);
    return s;
  };
}

export function oneOf(values: readonly string[]): Validator {
  const expected = `one of ${values.map((v) => JSON.stringify(v)).join(', ')}`;
  return (value, fail) => {
    if (typeof value !== 'string' || !values.includes(value)) throw fail(expected);
    return value;
  };
}

export function causeText(err: unknown): string {
  return err instanceof Error ? err.message : String(err);
}

/** A value as an error message shows it. */
export function describe(v: unknown): string {
  if (v === null) return 'null';
  if (v === undefined) return 'nothing';
  if (Array.isArray(v)) return 'a list';
  if (typeof v === 'object') return 'a mapping';
  if (typeof v === 'string') return JSON.stringify(v);
  return `${String(v)} (${typeof v})`;
}
