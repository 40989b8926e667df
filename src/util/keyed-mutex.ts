/**
 * Serializes async work per key: work for one key runs in call order, different keys run in
 * parallel. Entries are dropped when their queue drains, so memory follows live keys only.
 */
export class KeyedMutex {
  private readonly tails = new Map<string, Promise<unknown>>();

  run<T>(key: string, fn: () => Promise<T>): Promise<T> {
    const prev = this.tails.get(key) ?? Promise.resolve();
    const next = prev.then(fn, fn);
    const tail = next.then(
      () => undefined,
      () => undefined,
    );
    this.tails.set(key, tail);
    void tail.then(() => {
      if (this.tails.get(key) === tail) this.tails.delete(key);
    });
    return next;
  }

  /** Number of keys with work queued or running. */
  get size(): number {
    return this.tails.size;
  }
}
