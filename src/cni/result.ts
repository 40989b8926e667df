/**
 * Results of every spec version (0.1.0–1.1.0) parsed into one `CniResult`, and converted back
 * into the wire format a given version expects (for `prevResult` of chained plugins and for the
 * result cache). Pure: no I/O.
 */
import { familyOf, parsePrefixed } from '../net/ip.js';
import { InvalidResultError, UnsupportedVersionError } from './errors.js';
import {
  CNI_VERSIONS,
  type CniInterface,
  type CniIpConfig,
  type CniResult,
  type CniVersion,
  type Dns,
  type Result020,
  type Result040,
  type Result100,
  type Route,
  type WireResult,
} from './types.js';

export function isSupportedVersion(v: unknown): v is CniVersion {
  return typeof v === 'string' && (CNI_VERSIONS as readonly string[]).includes(v);
}

/** Numeric comparison of dotted versions ("0.4.0" < "1.0.0"); missing parts count as 0. */
export function compareVersions(a: string, b: string): number {
  const pa = a.split('.');
  const pb = b.split('.');
  for (let i = 0; i < Math.max(pa.length, pb.length); i++) {
    const d = Number(pa[i] ?? 0) - Number(pb[i] ?? 0);
    if (d !== 0) return d < 0 ? -1 : 1;
  }
  return 0;
}

export function versionAtLeast(v: string, min: string): boolean {
  return compareVersions(v, min) >= 0;
}

type Obj = Record<string, unknown>;

function isObj(v: unknown): v is Obj {
  return typeof v === 'object' && v !== null && !Array.isArray(v);
}

function fail(msg: string): never {
  throw new InvalidResultError(`invalid CNI result: ${msg}`);
}

function optString(o: Obj, key: string, where: string): string | undefined {
  const v = o[key];
  if (v === undefined || v === null) return undefined;
  if (typeof v !== 'string') fail(`${where}.${key} must be a string`);
  return v;
}

function optInt(o: Obj, key: string, where: string): number | undefined {
  const v = o[key];
  if (v === undefined || v === null) return undefined;
  if (typeof v !== 'number' || !Number.isInteger(v)) fail(`${where}.${key} must be an integer`);
  return v;
}

function optStrings(o: Obj, key: string, where: string): string[] | undefined {
  const v = o[key];
  if (v === undefined || v === null) return undefined;
  if (!Array.isArray(v) || !v.every((s) => typeof s === 'string')) fail(`${where}.${key} must be an array of strings`);
  return v as string[];
}

function optArray(o: Obj, key: string, where: string): unknown[] {
  const v = o[key];
  if (v === undefined || v === null) return [];
  if (!Array.isArray(v)) fail(`${where}.${key} must be an array`);
  return v;
}

/** 4 or 6 for `a.b.c.d/n` / `x::y/n` with a valid prefix length; 0 otherwise. */
export function cidrFamily(cidr: string): 0 | 4 | 6 {
  return parsePrefixed(cidr)?.family ?? 0;
}

function cidr(o: Obj, key: string, where: string): string {
  const v = o[key];
  if (typeof v !== 'string' || cidrFamily(v) === 0) fail(`${where}.${key} must be an address in CIDR notation, got ${JSON.stringify(v)}`);
  return v;
}

function optIp(o: Obj, key: string, where: string): string | undefined {
  const v = optString(o, key, where);
  if (v !== undefined && familyOf(v) === 0) fail(`${where}.${key} must be an IP address, got ${JSON.stringify(v)}`);
  return v;
}

function set<T extends object, K extends keyof T>(target: T, key: K, value: T[K] | undefined): void {
  if (value !== undefined) target[key] = value;
}

function parseRoute(v: unknown, where: string): Route {
  if (!isObj(v)) fail(`${where} must be an object`);
  const r: Route = { dst: cidr(v, 'dst', where) };
  set(r, 'gw', optIp(v, 'gw', where));
  set(r, 'mtu', optInt(v, 'mtu', where));
  set(r, 'advmss', optInt(v, 'advmss', where));
  set(r, 'priority', optInt(v, 'priority', where));
  set(r, 'table', optInt(v, 'table', where));
  set(r, 'scope', optInt(v, 'scope', where));
  return r;
}

function parseDns(v: unknown): Dns {
  if (v === undefined || v === null) return {};
  if (!isObj(v)) fail('dns must be an object');
  const d: Dns = {};
  set(d, 'nameservers', optStrings(v, 'nameservers', 'dns'));
  set(d, 'domain', optString(v, 'domain', 'dns'));
  set(d, 'search', optStrings(v, 'search', 'dns'));
  set(d, 'options', optStrings(v, 'options', 'dns'));
  return d;
}

function parseInterface(v: unknown, where: string): CniInterface {
  if (!isObj(v)) fail(`${where} must be an object`);
  const name = v.name;
  if (typeof name !== 'string' || name === '') fail(`${where}.name must be a non-empty string`);
  const i: CniInterface = { name };
  set(i, 'mac', optString(v, 'mac', where));
  set(i, 'mtu', optInt(v, 'mtu', where));
  set(i, 'sandbox', optString(v, 'sandbox', where));
  set(i, 'socketPath', optString(v, 'socketPath', where));
  set(i, 'pciID', optString(v, 'pciID', where));
  return i;
}

function parseIp(v: unknown, where: string, nInterfaces: number): CniIpConfig {
  if (!isObj(v)) fail(`${where} must be an object`);
  const ip: CniIpConfig = { address: cidr(v, 'address', where) };
  set(ip, 'gateway', optIp(v, 'gateway', where));
  const idx = optInt(v, 'interface', where);
  if (idx !== undefined && (idx < 0 || idx >= nInterfaces))
    fail(`${where}.interface ${idx} is not an index into interfaces (${nInterfaces})`);
  set(ip, 'interface', idx);
  const version = v.version;
  if (version !== undefined && version !== null) {
    const fam = cidrFamily(ip.address);
    if (version !== '4' && version !== '6') fail(`${where}.version must be "4" or "6"`);
    if (String(fam) !== version) fail(`${where}.version ${version} does not match address ${ip.address}`);
  }
  return ip;
}

function parseIpBlock(v: unknown, where: string, ips: CniIpConfig[], routes: Route[]): void {
  if (v === undefined || v === null) return;
  if (!isObj(v)) fail(`${where} must be an object`);
  const ip: CniIpConfig = { address: cidr(v, 'ip', where) };
  set(ip, 'gateway', optIp(v, 'gateway', where));
  ips.push(ip);
  for (const [i, r] of optArray(v, 'routes', where).entries()) routes.push(parseRoute(r, `${where}.routes[${i}]`));
}

/**
 * Parses a plugin's answer (JSON text, bytes, or an already parsed object) of any spec version
 * into a `CniResult`. `fallbackVersion` (the config's cniVersion) is used when the result has
 * no `cniVersion`; without either, a result with `ip4`/`ip6` is read as 0.1.0.
 * @throws InvalidResultError
 */
export function parseResult(input: unknown, fallbackVersion?: string): CniResult {
  let v: unknown = input;
  if (typeof input === 'string' || input instanceof Uint8Array) {
    const text = typeof input === 'string' ? input : Buffer.from(input.buffer, input.byteOffset, input.byteLength).toString('utf8');
    try {
      v = JSON.parse(text);
    } catch (err) {
      throw new InvalidResultError(`invalid CNI result: not JSON: ${snippet(text)}`, { cause: err });
    }
  }
  if (!isObj(v)) fail('not a JSON object');
  let version: unknown = v.cniVersion;
  if (version === undefined || version === null || version === '') {
    version = fallbackVersion ?? ('ip4' in v || 'ip6' in v ? '0.1.0' : undefined);
    if (version === undefined) fail('no cniVersion');
  }
  if (!isSupportedVersion(version)) fail(`unsupported cniVersion ${JSON.stringify(version)} (supported: ${CNI_VERSIONS.join(', ')})`);

  const result: CniResult = { cniVersion: version, interfaces: [], ips: [], routes: [], dns: parseDns(v.dns) };
  if (version === '0.1.0' || version === '0.2.0') {
    parseIpBlock(v.ip4, 'ip4', result.ips, result.routes);
    parseIpBlock(v.ip6, 'ip6', result.ips, result.routes);
    return result;
  }
  result.interfaces = optArray(v, 'interfaces', 'result').map((x, i) => parseInterface(x, `interfaces[${i}]`));
  result.ips = optArray(v, 'ips', 'result').map((x, i) => parseIp(x, `ips[${i}]`, result.interfaces.length));
  result.routes = optArray(v, 'routes', 'result').map((x, i) => parseRoute(x, `routes[${i}]`));
  return result;
}

function snippet(text: string): string {
  const t = text.trim();
  return JSON.stringify(t.length > 200 ? `${t.slice(0, 200)}…` : t);
}

function basicRoute(r: Route): Route {
  return r.gw === undefined ? { dst: r.dst } : { dst: r.dst, gw: r.gw };
}

function basicInterface(i: CniInterface): CniInterface {
  const out: CniInterface = { name: i.name };
  set(out, 'mac', i.mac);
  set(out, 'sandbox', i.sandbox);
  return out;
}

function ipConfig(ip: CniIpConfig): CniIpConfig {
  const out: CniIpConfig = { address: ip.address };
  set(out, 'gateway', ip.gateway);
  set(out, 'interface', ip.interface);
  return out;
}

function copyDns(d: Dns): Dns {
  const out: Dns = {};
  if (d.nameservers) out.nameservers = [...d.nameservers];
  set(out, 'domain', d.domain);
  if (d.search) out.search = [...d.search];
  if (d.options) out.options = [...d.options];
  return out;
}

function to020(result: CniResult, toVersion: string): Result020 {
  const out: Result020 = { cniVersion: toVersion };
  for (const ip of result.ips) {
    // 0.2.0 and older carry one address per family: the first of each.
    const block = ip.gateway === undefined ? { ip: ip.address } : { ip: ip.address, gateway: ip.gateway };
    const fam = cidrFamily(ip.address);
    if (fam === 4 && !out.ip4) out.ip4 = block;
    else if (fam === 6 && !out.ip6) out.ip6 = block;
  }
  for (const r of result.routes) {
    const block = cidrFamily(r.dst) === 4 ? out.ip4 : out.ip6;
    if (block) (block.routes ??= []).push(basicRoute(r));
  }
  out.dns = copyDns(result.dns);
  return out;
}

/**
 * The result in the wire format of `toVersion`: `ip4`/`ip6` for 0.1.0/0.2.0, `ips` with a
 * `version` field for 0.3.0–0.4.0, without it for 1.0.0+; the 1.1.0-only interface and route
 * attributes are kept only for 1.1.0. Empty lists are omitted, as libcni does.
 * A result without addresses (loopback's) converts to 0.1.0/0.2.0 with neither ip4 nor ip6.
 * @throws UnsupportedVersionError
 */
export function convertResult(result: CniResult, toVersion: string): WireResult {
  if (!isSupportedVersion(toVersion)) {
    throw new UnsupportedVersionError(String(toVersion), `cannot convert CNI result to unsupported version ${JSON.stringify(toVersion)}`);
  }
  if (toVersion === '0.1.0' || toVersion === '0.2.0') return to020(result, toVersion);
  const full = toVersion === '1.1.0';
  const interfaces = result.interfaces.map((i) => (full ? { ...i } : basicInterface(i)));
  const routes = result.routes.map((r) => (full ? { ...r } : basicRoute(r)));
  const out: Result040 | Result100 = { cniVersion: toVersion };
  if (interfaces.length > 0) out.interfaces = interfaces;
  if (result.ips.length > 0) {
    if (versionAtLeast(toVersion, '1.0.0')) {
      out.ips = result.ips.map(ipConfig);
    } else {
      (out as Result040).ips = result.ips.map((ip) => ({
        version: cidrFamily(ip.address) === 6 ? ('6' as const) : ('4' as const),
        ...ipConfig(ip),
      }));
    }
  }
  if (routes.length > 0) out.routes = routes;
  out.dns = copyDns(result.dns);
  return out;
}
