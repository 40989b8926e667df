/**
 * The pod CIDR from this node's Node object: list + watch of /api/v1/nodes restricted to
 * metadata.name=<node>, reporting spec.podCIDRs ("v4,v6" when dual-stack) or spec.podCIDR. Every
 * state of the Node it sees also goes to `onNode` (the bandwidth capacity on its status,
 * node-capacity.ts), so one watch serves both.
 */
import type { V1Node } from '@kubernetes/client-node';
import { ConfigError } from '../../errors.js';
import type { Logger } from '../../log.js';
import { moduleLogger } from '../../util/module-logger.js';
import type { PodCidrSource } from './source.js';
import { KubeApi, ListWatchLoop, loadKubeConfig, type KubeClientOptions } from '../kube/watch.js';

export interface NodeWatchOptions extends KubeClientOptions {
  /** Hears of every state of the Node the watch sees (not of its deletion). */
  onNode?: (node: V1Node) => void;
}

/** spec.podCIDRs joined with ",", else spec.podCIDR; undefined while the Node has none. */
export function podCidrOf(node: V1Node): string | undefined {
  const cidrs = (node.spec?.podCIDRs ?? []).filter((c) => c !== '');
  if (cidrs.length > 0) return cidrs.join(',');
  return node.spec?.podCIDR || undefined;
}

export class NodeWatchPodCidrSource implements PodCidrSource {
  private readonly log: Logger;
  private readonly nodeName: string;
  private readonly loop: ListWatchLoop<V1Node>;
  private readonly onNode: ((node: V1Node) => void) | undefined;
  private onCidr: ((podCidr: string) => void | Promise<void>) | undefined;
  /** The value last given to onCidr: each distinct value is reported once. */
  private last: string | undefined;
  /** What was last logged about waiting, so that Node heartbeats (MODIFIED every few seconds) do not repeat it. */
  private waitLogged: 'no-node' | 'no-cidr' | undefined;

  constructor(opts: NodeWatchOptions) {
    if (!opts.nodeName) throw new ConfigError('the node name is needed to watch the Node object');
    this.nodeName = opts.nodeName;
    this.onNode = opts.onNode;
    this.log = moduleLogger(opts.logger, 'node-watch', { node: opts.nodeName });
    this.loop = new ListWatchLoop<V1Node>({
      api: new KubeApi(loadKubeConfig(opts)),
      log: this.log,
      path: '/api/v1/nodes',
      fieldSelector: `metadata.name=${opts.nodeName}`,
      retry: opts,
      onList: (nodes) => this.seen(nodes.find((n) => n.metadata?.name === this.nodeName)),
      onEvent: (type, node) => {
        if (node.metadata?.name !== this.nodeName) return; // the field selector should already ensure this
        if (type !== 'DELETED') return this.seen(node);
        this.log.warn({ podCIDR: this.last }, 'the Node object was deleted; keeping the pod CIDR');
      },
    });
  }

  /** Starts watching in the background; returns without waiting for the API server or the CIDR. */
  async start(onCidr: (podCidr: string) => void | Promise<void>): Promise<void> {
    this.onCidr = onCidr;
    this.loop.start();
    this.log.info('watching the Node for its pod CIDR');
  }

  /** Aborts the watch and any retry wait; no onCidr call starts after this resolves. */
  async stop(): Promise<void> {
    await this.loop.stop();
  }

  private async seen(node: V1Node | undefined): Promise<void> {
    if (node) {
      try {
        this.onNode?.(node);
      } catch (err) {
        this.log.error({ err }, 'the Node handler failed');
      }
    }
    const cidr = node && podCidrOf(node);
    if (cidr === undefined) {
      const why = node ? 'no-cidr' : 'no-node';
      if (this.waitLogged !== why) {
        this.waitLogged = why;
        if (this.last !== undefined)
          this.log.warn({ podCIDR: this.last }, `the Node ${node ? 'has no pod CIDR any more' : 'is gone'}; keeping the pod CIDR`);
        else this.log.info(node ? 'the Node has no pod CIDR yet; waiting for one' : 'the Node is not registered yet; waiting for it');
      }
      return;
    }
    this.waitLogged = undefined;
    if (cidr === this.last) return;
    this.log.info({ podCIDR: cidr, previous: this.last }, 'pod CIDR');
    this.last = cidr;
    try {
      await this.onCidr?.(cidr);
    } catch (err) {
      this.log.error({ err, podCIDR: cidr }, 'the pod CIDR handler failed');
    }
  }
}
