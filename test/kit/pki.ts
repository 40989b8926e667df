/**
 * A throwaway PKI for TLS tests, made with the openssl command line (Node cannot issue X.509
 * certificates): a CA, a server certificate for 127.0.0.1 / localhost, and a client certificate
 * (CN system:node:<node>, O system:nodes, as a kubelet-style node credential has). EC P-256, valid
 * one day, all in `dir`.
 */
import { execa } from 'execa';
import { readFile, writeFile } from 'node:fs/promises';
import { join } from 'node:path';

export interface Pki {
  dir: string;
  caCert: string;
  serverCert: string;
  serverKey: string;
  clientCert: string;
  clientKey: string;
  /** A second CA that signed nothing here: trusting it must fail verification. */
  otherCaCert: string;
}

async function openssl(args: string[]): Promise<void> {
  await execa('openssl', args, { stdio: ['ignore', 'ignore', 'pipe'] });
}

const EC = ['-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:prime256v1', '-nodes'];

async function ca(dir: string, name: string): Promise<{ cert: string; key: string }> {
  const cert = join(dir, `${name}.crt`);
  const key = join(dir, `${name}.key`);
  await openssl(['req', '-x509', ...EC, '-keyout', key, '-out', cert, '-days', '1', '-subj', `/CN=${name}`]);
  return { cert, key };
}

async function issue(
  dir: string,
  name: string,
  subj: string,
  ext: string,
  signer: { cert: string; key: string },
): Promise<{ cert: string; key: string }> {
  const key = join(dir, `${name}.key`);
  const csr = join(dir, `${name}.csr`);
  const cert = join(dir, `${name}.crt`);
  const extFile = join(dir, `${name}.ext`);
  await writeFile(extFile, `${ext}\n`);
  await openssl(['req', ...EC, '-keyout', key, '-out', csr, '-subj', subj]);
  await openssl([
    'x509',
    '-req',
    '-in',
    csr,
    '-CA',
    signer.cert,
    '-CAkey',
    signer.key,
    '-CAcreateserial',
    '-out',
    cert,
    '-days',
    '1',
    '-extfile',
    extFile,
  ]);
  return { cert, key };
}

export async function makePki(dir: string, node = 'node-a'): Promise<Pki> {
  const root = await ca(dir, 'kfx-test-ca');
  const other = await ca(dir, 'kfx-other-ca');
  const server = await issue(
    dir,
    'server',
    '/CN=kfx-apiserver',
    'subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth',
    root,
  );
  const client = await issue(dir, 'client', `/O=system:nodes/CN=system:node:${node}`, 'extendedKeyUsage=clientAuth', root);
  return {
    dir,
    caCert: root.cert,
    serverCert: server.cert,
    serverKey: server.key,
    clientCert: client.cert,
    clientKey: client.key,
    otherCaCert: other.cert,
  };
}

export async function base64Of(path: string): Promise<string> {
  return (await readFile(path)).toString('base64');
}
