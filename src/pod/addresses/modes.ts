/**
 * The node's address modes (addresses/mode.ts): the one in force, and the one that undoes each
 * record's attachment, chosen by the record's own network.
 */
import type { NetConf, NetConfList } from '../../cni/types.js';
import type { AddressMode, ModeContext } from './mode.js';
import { dhcpIpamOf } from '../bridge-conf.js';
import { DhcpMode } from './dhcp-mode.js';
import { AgentHostLocalMode, HostLocalMode } from './host-local-mode.js';
import type { PodNetworkOptions } from '../requests.js';

/** The mode in force and, for records of another mode's network, the mode that undoes them. */
export class AddressModes {
  constructor(
    readonly current: AddressMode,
    private readonly hostLocal: AddressMode,
    private readonly dhcp: AddressMode,
  ) {}

  /** The mode whose addresses a network's attachments hold. */
  of(network: NetConf | NetConfList | undefined): AddressMode {
    return dhcpIpamOf(network) ? this.dhcp : this.hostLocal;
  }

  /** The host-local mode (records of 0.1.0 kept no config: theirs is host-local's of the pod CIDR). */
  get legacy(): AddressMode {
    return this.hostLocal;
  }
}

/** The node's address modes, from the core's options. */
export function addressModes(opts: PodNetworkOptions, ctx: ModeContext): AddressModes {
  const hostLocal = opts.ipamPrefetchSocket !== undefined ? new AgentHostLocalMode(ctx, opts.ipamPrefetchSocket) : new HostLocalMode(ctx);
  const ipam = opts.ipam ?? { mode: 'host-local' };
  switch (ipam.mode) {
    case 'dhcp': {
      const dhcp = new DhcpMode(ctx, ipam);
      return new AddressModes(dhcp, hostLocal, dhcp);
    }
    case 'host-local':
      return new AddressModes(hostLocal, hostLocal, new DhcpMode(ctx, undefined));
  }
}
