/**
 * A DHCP server for tests: Debian's dnsmasq (dnsmasq-base) in a network namespace the test made,
 * listening only on the one interface it is given (`--interface` + `--bind-interfaces`), DHCP only
 * (`--port=0`: no DNS), on a range of the test's own subnet, with its lease file and its log in a
 * directory of the test. `events()` parses the log's DHCP lines (DISCOVER, OFFER, REQUEST, ACK,
 * RELEASE…) with the time each line was first seen by this process (the log has 1 s resolution).
 */
import { execa, type ResultPromise } from 'execa';
import { existsSync } from 'node:fs';
import { readFile } from 'node:fs/promises';
import { join } from 'node:path';

export interface DnsmasqOptions {
  /** The lan-side netns and the interface there to serve on. */
  netns: string;
  iface: string;
  /** First and last address handed out, the netmask, the router option. */
  rangeStart: string;
  rangeEnd: string;
  netmask: string;
  router: string;
  /** Lease time in seconds (dnsmasq's minimum is 120). */
  leaseSec: number;
  /** Renewal (T1) and rebinding (T2) times sent to clients (options 58, 59), in seconds. */
  t1Sec?: number;
  t2Sec?: number;
  /** Where the lease file and the log go. */
  dir: string;
}

export interface DhcpEvent {
  /** DHCPDISCOVER, DHCPOFFER, DHCPREQUEST, DHCPACK, DHCPNAK, DHCPRELEASE, DHCPDECLINE. */
  kind: string;
  ip: string | undefined;
  mac: string;
  /** When this process first saw the line (ms since epoch). */
  seenAt: number;
  line: string;
}

export interface Lease {
  expiry: number;
  mac: string;
  ip: string;
  clientId: string;
}

export class Dnsmasq {
  proc: ResultPromise | undefined;
  readonly leaseFile: string;
  readonly logFile: string;
  private readonly seen = new Map<string, number>();

  constructor(readonly o: DnsmasqOptions) {
    this.leaseFile = join(o.dir, 'dnsmasq.leases');
    this.logFile = join(o.dir, 'dnsmasq.log');
  }

  async start(): Promise<void> {
    const o = this.o;
    const args = [
      'netns',
      'exec',
      o.netns,
      'dnsmasq',
      '--keep-in-foreground',
      '--conf-file=/dev/null',
      '--port=0',
      '--user=root',
      '--pid-file',
      `--interface=${o.iface}`,
      '--bind-interfaces',
      '--except-interface=lo',
      `--dhcp-range=${o.rangeStart},${o.rangeEnd},${o.netmask},${o.leaseSec}`,
      `--dhcp-option=option:router,${o.router}`,
      ...(o.t1Sec ? [`--dhcp-option=option:T1,${o.t1Sec}`] : []),
      ...(o.t2Sec ? [`--dhcp-option=option:T2,${o.t2Sec}`] : []),
      '--dhcp-authoritative',
      `--dhcp-leasefile=${this.leaseFile}`,
      `--log-facility=${this.logFile}`,
      '--log-dhcp',
    ];
    this.proc = execa('ip', args, { reject: false, stdin: 'ignore' }) as unknown as ResultPromise;
    const deadline = Date.now() + 10_000;
    while (Date.now() < deadline) {
      if ((await this.log()).includes('DHCP, sockets bound exclusively to interface')) return;
      if (this.proc.exitCode !== null && this.proc.exitCode !== undefined) break;
      await new Promise((r) => setTimeout(r, 50));
    }
    const r = await Promise.race([this.proc, new Promise((r) => setTimeout(() => r(undefined), 100))]);
    throw new Error(`dnsmasq did not start: ${JSON.stringify(r)}\n${await this.log()}`);
  }

  async stop(): Promise<void> {
    const p = this.proc;
    this.proc = undefined;
    if (!p) return;
    p.kill('SIGTERM');
    await p;
  }

  async log(): Promise<string> {
    return existsSync(this.logFile) ? readFile(this.logFile, 'utf8') : '';
  }

  /** The DHCP transactions in the log so far. */
  async events(): Promise<DhcpEvent[]> {
    const out: DhcpEvent[] = [];
    const now = Date.now();
    for (const line of (await this.log()).split('\n')) {
      // "... dnsmasq-dhcp[123]: 1146537074 DHCPACK(lan0) 198.19.77.54 3e:d0:f3:98:00:00 name"
      const m = /dnsmasq-dhcp\[\d+\]: (?:\d+ )?(DHCP[A-Z]+)\([^)]*\) (?:(\d+\.\d+\.\d+\.\d+) )?([0-9a-f:]{17})/.exec(line);
      if (!m?.[1] || !m[3]) continue;
      if (!this.seen.has(line)) this.seen.set(line, now);
      out.push({ kind: m[1], ip: m[2], mac: m[3], seenAt: this.seen.get(line) ?? now, line });
    }
    return out;
  }

  /** Polls the log until `pred` holds for an event after the first `skip` ones; returns it. */
  async waitFor(pred: (e: DhcpEvent) => boolean, timeoutMs: number, skip = 0): Promise<DhcpEvent> {
    const deadline = Date.now() + timeoutMs;
    for (;;) {
      const hit = (await this.events()).slice(skip).find(pred);
      if (hit) return hit;
      if (Date.now() > deadline)
        throw new Error(
          `no such DHCP event within ${timeoutMs} ms; log:\n${(await this.log())
            .split('\n')
            .filter((l) => /DHCP[A-Z]+\(/.test(l))
            .slice(-20)
            .join('\n')}`,
        );
      await new Promise((r) => setTimeout(r, 100));
    }
  }

  async leases(): Promise<Lease[]> {
    const text = existsSync(this.leaseFile) ? await readFile(this.leaseFile, 'utf8') : '';
    return text
      .split('\n')
      .filter((l) => l.trim() !== '')
      .map((l) => {
        const [expiry = '0', mac = '', ip = '', , clientId = ''] = l.split(' ');
        return { expiry: Number(expiry), mac, ip, clientId };
      });
  }
}

/** The client ID the reference dhcp plugin sends, as dnsmasq's lease file shows it: type 0, then `<id>/<network>/<ifName>`. */
export function pluginClientId(containerId: string, network = 'kubenet', ifName = 'eth0'): string {
  return ['00', ...Buffer.from(`${containerId}/${network}/${ifName}`.slice(0, 254)).toString('hex').match(/../g)!].join(':');
}
