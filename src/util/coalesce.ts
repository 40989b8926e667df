/**
 * One read shared by everyone who asks within `maxAgeMs` of it: a caller gets the last result
 * while it is that young, joins the read in flight if there is one, and starts a new one otherwise.
 * A failed read is not kept (the next caller reads again). When `key` is given, a result (or a read
 * in flight) serves only callers with the same key: what the read depends on has changed otherwise.
 */
export class Coalesced<T> {
  private last: { at: number; key: unknown; value: T } | undefined;
  private inFlight: { key: unknown; promise: Promise<T> } | undefined;

  constructor(
    private readonly read: () => Promise<T>,
    private readonly maxAgeMs: number,
    private readonly now: () => number = () => performance.now(),
  ) {}

  get(key?: unknown): Promise<T> {
    const last = this.last;
    if (last && last.key === key && this.now() - last.at <= this.maxAgeMs) return Promise.resolve(last.value);
    if (this.inFlight && this.inFlight.key === key) return this.inFlight.promise;
    const at = this.now();
    const flight = {
      key,
      promise: this.read().then(
        (value) => {
          // A later read (of a newer key) may have finished first: keep the newest.
          if (!this.last || this.last.at <= at) this.last = { at, key, value };
          if (this.inFlight === flight) this.inFlight = undefined;
          return value;
        },
        (err: unknown) => {
          if (this.inFlight === flight) this.inFlight = undefined;
          throw err;
        },
      ),
    };
    this.inFlight = flight;
    return flight.promise;
  }
}
