/**
 * The live re-shapes' queue (live-shaping.ts): watch events and retries only put a pod's key here,
 * with what triggered it; one worker takes the keys in the order they came and resolves each. A key
 * already waiting is not queued twice: the newer trigger is merged into the waiting one (which keeps
 * its place), so a pod changed ten times while the worker was busy is resolved once, from the newest.
 * The watches therefore never wait for the kernel, and the kernel sees one pod's change at a time.
 */
export class KeyedWorkQueue<T> {
  private readonly waiting = new Map<string, { item: T; done: Array<() => void> }>();
  private running = false;
  private stopped = false;
  /** Items worked on since the start (merged ones count once). */
  worked = 0;

  constructor(
    private readonly work: (key: string, item: T) => Promise<void>,
    /** The waiting item `a` and a newer `b` for the same key, as one. */
    private readonly merge: (a: T, b: T) => T,
    /** A work that threw (the worker goes on with the next key). */
    private readonly failed: (key: string, err: unknown) => void,
  ) {}

  /** Keys waiting for the worker. */
  get size(): number {
    return this.waiting.size;
  }

  /** Queues `item` for `key` (merged into one waiting there); resolves once it has been worked on, or dropped by stop(). */
  add(key: string, item: T): Promise<void> {
    if (this.stopped) return Promise.resolve();
    return new Promise<void>((resolve) => {
      const w = this.waiting.get(key);
      if (w) {
        w.item = this.merge(w.item, item);
        w.done.push(resolve);
      } else this.waiting.set(key, { item, done: [resolve] });
      void this.drain();
    });
  }

  private async drain(): Promise<void> {
    if (this.running) return;
    this.running = true;
    try {
      for (let next = this.waiting.entries().next(); !next.done && !this.stopped; next = this.waiting.entries().next()) {
        const [key, w] = next.value;
        this.waiting.delete(key);
        try {
          await this.work(key, w.item);
        } catch (err) {
          this.failed(key, err);
        }
        this.worked++;
        for (const d of w.done) d();
      }
    } finally {
      this.running = false;
    }
  }

  /** Drops the waiting keys (their add() promises resolve); nothing is queued afterwards. */
  stop(): void {
    this.stopped = true;
    for (const w of this.waiting.values()) for (const d of w.done) d();
    this.waiting.clear();
  }
}
