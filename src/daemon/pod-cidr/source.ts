/** Where the agent's pod CIDR comes from: a static value (no cluster needed), or the Node object (pod-cidr/node-watch.ts). */
export interface PodCidrSource {
  /** Begins delivering pod CIDRs ("v4" or "v4,v6") to `onCidr`; may return before the first one. */
  start(onCidr: (podCidr: string) => void | Promise<void>): Promise<void>;
  /** Ends delivery: no onCidr call starts after this resolves. */
  stop(): Promise<void>;
}

/** The embedded default: one pod CIDR given at startup. */
export class StaticCidr implements PodCidrSource {
  constructor(private readonly cidr: string) {}
  async start(onCidr: (podCidr: string) => void | Promise<void>): Promise<void> {
    await onCidr(this.cidr);
  }
  async stop(): Promise<void> {}
}
