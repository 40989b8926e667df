/** One attachment as each spec version writes it, and what it parses into. */
import type { CniResult, Result020, Result040, Result100 } from '../../src/cni/types.js';

/** The same attachment as each version writes it (canonical: what convertResult produces). */
export const WIRE: Record<string, Result020 | Result040 | Result100> = {
  '0.1.0': {
    cniVersion: '0.1.0',
    ip4: { ip: '10.99.1.5/24', gateway: '10.99.1.1', routes: [{ dst: '0.0.0.0/0', gw: '10.99.1.1' }] },
    ip6: { ip: 'fd00:99::5/64', routes: [{ dst: '::/0' }] },
    dns: { nameservers: ['10.99.1.1'] },
  },
  '0.2.0': {
    cniVersion: '0.2.0',
    ip4: { ip: '10.99.1.5/24', gateway: '10.99.1.1', routes: [{ dst: '0.0.0.0/0', gw: '10.99.1.1' }] },
    dns: {},
  },
  '0.3.0': {
    cniVersion: '0.3.0',
    interfaces: [{ name: 'eth0', mac: '0a:58:0a:63:01:05', sandbox: '/var/run/netns/x' }],
    ips: [{ version: '4', address: '10.99.1.5/24', gateway: '10.99.1.1', interface: 0 }],
    routes: [{ dst: '0.0.0.0/0' }],
    dns: {},
  },
  '0.3.1': {
    cniVersion: '0.3.1',
    interfaces: [
      { name: 'cbr0', mac: '0a:58:0a:63:01:01' },
      { name: 'eth0', sandbox: '/var/run/netns/x' },
    ],
    ips: [
      { version: '4', address: '10.99.1.5/24', gateway: '10.99.1.1', interface: 1 },
      { version: '6', address: 'fd00:99::5/64', interface: 1 },
    ],
    routes: [{ dst: '0.0.0.0/0', gw: '10.99.1.1' }],
    dns: { nameservers: ['10.99.1.1'], domain: 'cluster.local', search: ['svc.cluster.local'], options: ['ndots:5'] },
  },
  '0.4.0': {
    cniVersion: '0.4.0',
    interfaces: [{ name: 'eth0', sandbox: '/var/run/netns/x' }],
    ips: [{ version: '4', address: '10.99.1.5/24', interface: 0 }],
    dns: {},
  },
  '1.0.0': {
    cniVersion: '1.0.0',
    interfaces: [
      { name: 'cbr0', mac: '0a:58:0a:63:01:01' },
      { name: 'eth0', mac: '0a:58:0a:63:01:05', sandbox: '/var/run/netns/x' },
    ],
    ips: [{ address: '10.99.1.5/24', gateway: '10.99.1.1', interface: 1 }],
    routes: [{ dst: '0.0.0.0/0' }],
    dns: {},
  },
  '1.1.0': {
    cniVersion: '1.1.0',
    interfaces: [
      { name: 'eth0', mac: '0a:58:0a:63:01:05', mtu: 1400, sandbox: '/var/run/netns/x', socketPath: '/run/x.sock', pciID: '0000:00:1f.0' },
    ],
    ips: [{ address: '10.99.1.5/24', gateway: '10.99.1.1', interface: 0 }],
    routes: [{ dst: '0.0.0.0/0', gw: '10.99.1.1', mtu: 1400, advmss: 1360, priority: 10, table: 100, scope: 0 }],
    dns: {},
  },
};

/** What each WIRE entry parses into. */
export const PARSED: Record<string, CniResult> = {
  '0.1.0': {
    cniVersion: '0.1.0',
    interfaces: [],
    ips: [{ address: '10.99.1.5/24', gateway: '10.99.1.1' }, { address: 'fd00:99::5/64' }],
    routes: [{ dst: '0.0.0.0/0', gw: '10.99.1.1' }, { dst: '::/0' }],
    dns: { nameservers: ['10.99.1.1'] },
  },
  '0.2.0': {
    cniVersion: '0.2.0',
    interfaces: [],
    ips: [{ address: '10.99.1.5/24', gateway: '10.99.1.1' }],
    routes: [{ dst: '0.0.0.0/0', gw: '10.99.1.1' }],
    dns: {},
  },
  '0.3.0': {
    cniVersion: '0.3.0',
    interfaces: [{ name: 'eth0', mac: '0a:58:0a:63:01:05', sandbox: '/var/run/netns/x' }],
    ips: [{ address: '10.99.1.5/24', gateway: '10.99.1.1', interface: 0 }],
    routes: [{ dst: '0.0.0.0/0' }],
    dns: {},
  },
  '0.3.1': {
    cniVersion: '0.3.1',
    interfaces: [
      { name: 'cbr0', mac: '0a:58:0a:63:01:01' },
      { name: 'eth0', sandbox: '/var/run/netns/x' },
    ],
    ips: [
      { address: '10.99.1.5/24', gateway: '10.99.1.1', interface: 1 },
      { address: 'fd00:99::5/64', interface: 1 },
    ],
    routes: [{ dst: '0.0.0.0/0', gw: '10.99.1.1' }],
    dns: { nameservers: ['10.99.1.1'], domain: 'cluster.local', search: ['svc.cluster.local'], options: ['ndots:5'] },
  },
  '0.4.0': {
    cniVersion: '0.4.0',
    interfaces: [{ name: 'eth0', sandbox: '/var/run/netns/x' }],
    ips: [{ address: '10.99.1.5/24', interface: 0 }],
    routes: [],
    dns: {},
  },
  '1.0.0': {
    cniVersion: '1.0.0',
    interfaces: [
      { name: 'cbr0', mac: '0a:58:0a:63:01:01' },
      { name: 'eth0', mac: '0a:58:0a:63:01:05', sandbox: '/var/run/netns/x' },
    ],
    ips: [{ address: '10.99.1.5/24', gateway: '10.99.1.1', interface: 1 }],
    routes: [{ dst: '0.0.0.0/0' }],
    dns: {},
  },
  '1.1.0': {
    cniVersion: '1.1.0',
    interfaces: [
      { name: 'eth0', mac: '0a:58:0a:63:01:05', mtu: 1400, sandbox: '/var/run/netns/x', socketPath: '/run/x.sock', pciID: '0000:00:1f.0' },
    ],
    ips: [{ address: '10.99.1.5/24', gateway: '10.99.1.1', interface: 0 }],
    routes: [{ dst: '0.0.0.0/0', gw: '10.99.1.1', mtu: 1400, advmss: 1360, priority: 10, table: 100, scope: 0 }],
    dns: {},
  },
};
