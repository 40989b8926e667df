/**
 * A self-signed TLS server certificate made in memory, as kubelet makes one for its own port when
 * given none: an ECDSA P-256 key, one year, the names and addresses it is reached at as subject
 * alternative names, `serverAuth` only. Written out in DER by hand (node:crypto signs and parses
 * certificates but cannot build one; the rest is a few ASN.1 types).
 */
import { generateKeyPairSync, randomBytes, sign } from 'node:crypto';
import { isIP } from 'node:net';

export interface SelfSigned {
  /** PEM certificate. */
  cert: string;
  /** PEM PKCS#8 private key. */
  key: string;
}

const der = (tag: number, body: Buffer): Buffer => Buffer.concat([Buffer.from([tag]), derLength(body.length), body]);
const seq = (...items: Buffer[]): Buffer => der(0x30, Buffer.concat(items));
const set = (...items: Buffer[]): Buffer => der(0x31, Buffer.concat(items));
const octets = (b: Buffer): Buffer => der(0x04, b);
const explicit = (n: number, body: Buffer): Buffer => der(0xa0 + n, body);

function derLength(n: number): Buffer {
  if (n < 0x80) return Buffer.from([n]);
  const bytes: number[] = [];
  for (let v = n; v > 0; v >>= 8) bytes.unshift(v & 0xff);
  return Buffer.from([0x80 | bytes.length, ...bytes]);
}

function oid(dotted: string): Buffer {
  const [a = 0, b = 0, ...rest] = dotted.split('.').map(Number);
  const out = [a * 40 + b];
  for (const v of rest) {
    const groups: number[] = [];
    for (let x = v; ; x = Math.floor(x / 128)) {
      groups.unshift((x % 128) | (groups.length ? 0x80 : 0));
      if (x < 128) break;
    }
    out.push(...groups);
  }
  return der(0x06, Buffer.from(out));
}

/** A positive INTEGER from big-endian bytes. */
function integer(bytes: Buffer): Buffer {
  let b = bytes;
  while (b.length > 1 && b[0] === 0 && (b[1] ?? 0) < 0x80) b = b.subarray(1);
  return der(0x02, (b[0] ?? 0) >= 0x80 ? Buffer.concat([Buffer.from([0]), b]) : b);
}

/** UTCTime through 2049, GeneralizedTime after (RFC 5280 4.1.2.5). */
function time(d: Date): Buffer {
  const iso = d.toISOString().replace(/[-:T]/g, '').slice(0, 14) + 'Z';
  return d.getUTCFullYear() < 2050 ? der(0x17, Buffer.from(iso.slice(2), 'ascii')) : der(0x18, Buffer.from(iso, 'ascii'));
}

function ipBytes(ip: string): Buffer {
  if (isIP(ip) === 4) return Buffer.from(ip.split('.').map(Number));
  const [head = '', tail] = ip.split('::');
  const part = (s: string | undefined) => (s ? s.split(':').map((h) => parseInt(h, 16)) : []);
  const h = part(head);
  const t = part(tail);
  const words = tail === undefined ? h : [...h, ...new Array<number>(8 - h.length - t.length).fill(0), ...t];
  const out = Buffer.alloc(16);
  for (const [i, w] of words.entries()) out.writeUInt16BE(w, i * 2);
  return out;
}

/**
 * A certificate for `commonName`, valid from an hour ago for a year, whose subject alternative
 * names are `dnsNames` and `ips` (IPv4 and IPv6 literals; IPv4-mapped IPv6 is not supported).
 */
export function selfSignedCertificate(commonName: string, dnsNames: string[], ips: string[], now = new Date()): SelfSigned {
  const { publicKey, privateKey } = generateKeyPairSync('ec', { namedCurve: 'prime256v1' });
  const ecdsaSha256 = seq(oid('1.2.840.10045.4.3.2'));
  const name = seq(set(seq(oid('2.5.4.3'), der(0x0c, Buffer.from(commonName, 'utf8')))));
  const alt = [
    ...dnsNames.map((n) => der(0x82, Buffer.from(n, 'ascii'))),
    ...ips.filter((ip) => isIP(ip) === 4 || (isIP(ip) === 6 && !ip.includes('.'))).map((ip) => der(0x87, ipBytes(ip))),
  ];
  const extensions = seq(
    seq(oid('2.5.29.19'), der(0x01, Buffer.from([0xff])), octets(seq())), // basicConstraints: critical, not a CA
    seq(oid('2.5.29.15'), der(0x01, Buffer.from([0xff])), octets(der(0x03, Buffer.from([0x07, 0x80])))), // keyUsage: critical, digitalSignature
    seq(oid('2.5.29.37'), octets(seq(oid('1.3.6.1.5.5.7.3.1')))), // extKeyUsage: serverAuth
    seq(oid('2.5.29.17'), octets(seq(...alt))), // subjectAltName
  );
  const tbs = seq(
    explicit(0, integer(Buffer.from([2]))),
    integer(Buffer.concat([Buffer.from([0x01]), randomBytes(15)])),
    ecdsaSha256,
    name,
    seq(time(new Date(now.getTime() - 3600_000)), time(new Date(now.getTime() + 365 * 24 * 3600_000))),
    name,
    publicKey.export({ type: 'spki', format: 'der' }),
    explicit(3, extensions),
  );
  const signature = sign('sha256', tbs, privateKey);
  const cert = seq(tbs, ecdsaSha256, der(0x03, Buffer.concat([Buffer.from([0]), signature])));
  const b64 = cert.toString('base64').replace(/.{64}/g, '$&\n').replace(/\n$/, '');
  return {
    cert: `-----BEGIN CERTIFICATE-----\n${b64}\n-----END CERTIFICATE-----\n`,
    key: privateKey.export({ type: 'pkcs8', format: 'pem' }).toString(),
  };
}
