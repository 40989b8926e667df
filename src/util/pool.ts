/** Runs jobs at most `concurrency` at a time, every one of them; returns the errors of those that failed. */
export async function runAll(jobs: Array<() => Promise<unknown>>, concurrency: number): Promise<unknown[]> {
  const errors: unknown[] = [];
  let next = 0;
  const worker = async () => {
    while (next < jobs.length) {
      const job = jobs[next++];
      try {
        await job?.();
      } catch (err) {
        errors.push(err);
      }
    }
  };
  await Promise.all(Array.from({ length: Math.max(1, concurrency) }, worker));
  return errors;
}
