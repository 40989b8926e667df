/**
 * Measured rates of each pod over the last seconds (`kubenet status`, `kubenet top`): the agent
 * samples the kernel's counters of every pod (PodNetwork.traffic(): the tc counters of a shaped
 * direction, what got through its limit; the host veth's own counters of an unshaped one) and
 * divides differences by time.
 *
 * Sampling runs on demand only: a rates() call keeps it going once per `periodMs` for the next
 * `idleAfterMs`, and the agent costs nothing while nobody looks. The first call after a quiet time
 * waits for two samples `periodMs` apart (~1 s); later ones answer at once from the history.
 */
import type { Logger } from '../../log.js';
import type { PodTraffic } from '../../pod/index.js';

interface DirSample {
  /** Where the count comes from ('tc' or 'link'): differences are taken only within one source. */
  src: 'tc' | 'link';
  bytes: number;
  drops: number;
}

interface Sample {
  t: number;
  pods: Map<string, { ingress?: DirSample; egress?: DirSample }>;
}

/** One pod's rates, bits/s and drops/s over `seconds`; a direction without two comparable samples is absent. */
export interface PodRate {
  ingress?: number;
  egress?: number;
  ingressDrops?: number;
  egressDrops?: number;
  seconds: number;
}

export interface RateTrackerOptions {
  periodMs?: number;
  /** Sampling stops this long after the last rates() call. */
  idleAfterMs?: number;
  /** History kept, at least the longest window asked for. */
  keepMs?: number;
  now?: () => number;
}

export const rateKey = (containerId: string, ifName: string) => `${containerId}@${ifName}`;

export class RateTracker {
  private readonly samples: Sample[] = [];
  private timer: NodeJS.Timeout | undefined;
  private sampling: Promise<void> | undefined;
  private lastDemand = 0;
  private readonly periodMs: number;
  private readonly idleAfterMs: number;
  private readonly keepMs: number;
  private readonly now: () => number;

  constructor(
    private readonly read: () => Promise<PodTraffic[]>,
    private readonly log: Logger,
    opts: RateTrackerOptions = {},
  ) {
    this.periodMs = opts.periodMs ?? 1000;
    this.idleAfterMs = opts.idleAfterMs ?? 60_000;
    this.keepMs = opts.keepMs ?? 30_000;
    this.now = opts.now ?? (() => performance.now());
  }

  /** Takes one sample now (also the timer's job); samples taken meanwhile are this one. */
  sample(): Promise<void> {
    this.sampling ??= this.takeSample().finally(() => (this.sampling = undefined));
    return this.sampling;
  }

  private async takeSample(): Promise<void> {
    // The sample's time is when its read starts: the read's first request (the dump of every link)
    // goes to the kernel then, and the time the answer takes to come back is not the pods'.
    const t = this.now();
    let traffic: PodTraffic[];
    try {
      traffic = await this.read();
    } catch (err) {
      this.log.warn({ err }, "could not read the pods' counters");
      return;
    }
    const pods = new Map<string, { ingress?: DirSample; egress?: DirSample }>();
    for (const p of traffic) {
      const s: { ingress?: DirSample; egress?: DirSample } = {};
      const sh = p.shaping;
      if (sh?.ingress) s.ingress = { src: 'tc', bytes: sh.ingress.bytes, drops: sh.ingress.drops };
      else if (p.link) s.ingress = { src: 'link', bytes: p.link.txBytes, drops: p.link.txDropped };
      if (sh?.egress) s.egress = { src: 'tc', bytes: sh.egress.bytes, drops: sh.egress.drops };
      else if (p.link) s.egress = { src: 'link', bytes: p.link.rxBytes, drops: p.link.rxDropped };
      pods.set(rateKey(p.record.containerId, p.record.ifName), s);
    }
    this.samples.push({ t, pods });
    while (this.samples.length > 2 && (this.samples[0]?.t ?? t) < t - this.keepMs) this.samples.shift();
  }

  private keepSampling(): void {
    this.lastDemand = this.now();
    if (this.timer) return;
    this.timer = setInterval(() => {
      if (this.now() - this.lastDemand > this.idleAfterMs) {
        this.stop();
        return;
      }
      void this.sample();
    }, this.periodMs);
    this.timer.unref();
  }

  /** Rates over the last `windowS` seconds (at least one sampling period) for every pod sampled. */
  async rates(windowS = 5): Promise<Map<string, PodRate>> {
    this.keepSampling();
    const last = this.samples[this.samples.length - 1];
    if (!last || this.now() - last.t > this.periodMs / 4) await this.sample();
    if (!this.baseline(windowS)) {
      // Nothing recent to compare with (sampling was off): measure for one period.
      const t0 = this.samples[this.samples.length - 1]?.t ?? this.now();
      await new Promise((r) => setTimeout(r, Math.max(0, t0 + this.periodMs - this.now())));
      await this.sample();
    }
    return this.compute(windowS);
  }

  /** The earliest sample within the window before the last one (never the last itself, never older than the window). */
  private baseline(windowS: number): { last: Sample; base: Sample } | undefined {
    const last = this.samples[this.samples.length - 1];
    if (!last) return undefined;
    const from = last.t - Math.max(windowS * 1000, this.periodMs) - this.periodMs / 2;
    const base = this.samples.find((s) => s !== last && s.t >= from && s.t < last.t);
    return base ? { last, base } : undefined;
  }

  private compute(windowS: number): Map<string, PodRate> {
    const out = new Map<string, PodRate>();
    const b = this.baseline(windowS);
    if (!b) return out;
    const { last, base } = b;
    const seconds = (last.t - base.t) / 1000;
    for (const [key, now] of last.pods) {
      const then = base.pods.get(key);
      const r: PodRate = { seconds: +seconds.toFixed(2) };
      for (const dir of ['ingress', 'egress'] as const) {
        const a = then?.[dir];
        const b = now[dir];
        if (!a || !b || a.src !== b.src || b.bytes < a.bytes) continue; // re-made counters: no rate yet
        r[dir] = ((b.bytes - a.bytes) * 8) / seconds;
        r[dir === 'ingress' ? 'ingressDrops' : 'egressDrops'] = Math.max(0, b.drops - a.drops) / seconds;
      }
      out.set(key, r);
    }
    return out;
  }

  stop(): void {
    clearInterval(this.timer);
    this.timer = undefined;
  }
}
