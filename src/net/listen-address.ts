/**
 * A TCP listen address as config keys give it: `HOST:PORT` with an IP literal (`127.0.0.1:10266`,
 * `[::1]:10266`), or `:PORT` for every address of the node.
 */
import { isIP } from 'node:net';
import { ConfigError } from '../errors.js';

export interface ListenAddress {
  /** An IP literal (IPv6 without brackets); undefined: every address (IPv4 and IPv6). */
  host: string | undefined;
  /** 0: a free port the kernel picks. */
  port: number;
}

export function parseListenAddress(text: string): ListenAddress {
  const m = /^(?:\[([^\]]+)\]|([^:[\]]*)):(\d{1,5})$/.exec(text);
  if (!m) throw new ConfigError(`${JSON.stringify(text)} is not HOST:PORT or :PORT (an IPv6 host in brackets: [::1]:10266)`);
  const port = Number(m[3]);
  if (port > 65535) throw new ConfigError(`port ${port} is above 65535`);
  const v6 = m[1];
  const host = v6 ?? (m[2] === '' ? undefined : m[2]);
  if (host !== undefined && isIP(host) !== (v6 !== undefined ? 6 : 4)) {
    throw new ConfigError(
      `${JSON.stringify(host)} is not ${v6 !== undefined ? 'an IPv6' : 'an IPv4'} address${v6 === undefined && isIP(host) === 6 ? ' (put an IPv6 host in brackets: [::1]:10266)' : ''}`,
    );
  }
  return { host, port };
}

/** The address as a URL's authority shows it (`[::1]:10266`). */
export function formatListenAddress(a: { host: string; port: number }): string {
  return isIP(a.host) === 6 ? `[${a.host}]:${a.port}` : `${a.host}:${a.port}`;
}
