/**
 * One read shared by everyone who asks within `maxAgeMs` of it: a caller gets the last result
 * while it is that young, joins the read in flight if there is one, and starts a new one otherwise.
 * A failed read is not kept (the next caller reads again).
 */
export class Coalesced<T> {
  private last: { at: number; value: T } | undefined;
  private inFlight: Promise<T> | undefined;

  constructor(
    private readonly read: () => Promise<T>,
    private readonly maxAgeMs: number,
    private readonly now: () => number = () => performance.now(),
  ) {}

  get(): Promise<T> {
    const last = this.last;
    if (last && this.now() - last.at <= this.maxAgeMs) return Promise.resolve(last.value);
    if (this.inFlight) return this.inFlight;
    const at = this.now();
    const p = this.read().then(
      (value) => {
        this.last = { at, value };
        this.inFlight = undefined;
        return value;
      },
      (err: unknown) => {
        this.inFlight = undefined;
        throw err;
      },
    );
    this.inFlight = p;
    return p;
  }
}
