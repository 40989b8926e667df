/** Addresses: unused subnets, big enough for the pods of one round or of the burst. */
import { execa } from 'execa';

export function ipToInt(ip: string): number {
  return ip.split('.').reduce((a, o) => a * 256 + Number(o), 0);
}

/** Existing IPv4 routes as [first, last] address ranges (the default route excluded). */
export async function routedRanges(): Promise<Array<[number, number]>> {
  const r = await execa('ip', ['-j', '-4', 'route', 'show', 'table', 'all'], { reject: false });
  const routes = JSON.parse(r.stdout || '[]') as Array<{ dst?: string }>;
  const out: Array<[number, number]> = [];
  for (const { dst } of routes) {
    if (!dst || dst === 'default') continue;
    const [ip = '', len = '32'] = dst.split('/');
    if (!/^\d+\.\d+\.\d+\.\d+$/.test(ip)) continue;
    const size = 2 ** (32 - Number(len));
    const first = ipToInt(ip) - (ipToInt(ip) % size);
    out.push([first, first + size - 1]);
  }
  return out;
}

/** A free subnet 10.<second>.x.0/<prefix> with room for `pods` pods plus the gateway. */
export function pickSubnet(second: number, pods: number, taken: Array<[number, number]>): string {
  const hostBits = Math.max(8, Math.ceil(Math.log2(pods + 3)));
  const prefix = 32 - hostBits;
  const blocks = 2 ** (16 - hostBits);
  for (let attempt = 0; attempt < 200; attempt++) {
    const first = (((10 * 256 + second) << 16) >>> 0) + Math.floor(Math.random() * blocks) * 2 ** hostBits;
    const last = first + 2 ** hostBits - 1;
    if (taken.some(([a, b]) => a <= last && first <= b)) continue;
    taken.push([first, last]);
    return `${[first >>> 24, (first >>> 16) & 255, (first >>> 8) & 255, first & 255].join('.')}/${prefix}`;
  }
  throw new Error(`no free /${prefix} in 10.${second}.0.0/16`);
}
