import { performance } from 'node:perf_hooks';
import type { Logger } from '../../log.js';
import { round } from '../attachment.js';

/**
 * Per-step wall times of one operation, logged at debug level (`steps`, ms since the previous
 * mark), and work that ran beside the steps (`beside`, ms from the start to its end).
 */
export class StepTimer {
  private readonly marks: Array<[string, number]> = [];
  private readonly notes: Array<[string, number]> = [];
  private last: number;
  constructor(readonly started: number) {
    this.last = started;
  }
  mark(name: string): void {
    const now = performance.now();
    this.marks.push([name, round(now - this.last)]);
    this.last = now;
  }
  note(name: string, ms: number): void {
    this.notes.push([name, round(ms)]);
  }
  fields(log: Logger): { steps?: Record<string, number>; beside?: Record<string, number> } {
    if (!log.isLevelEnabled('debug')) return {};
    return { steps: Object.fromEntries(this.marks), ...(this.notes.length > 0 ? { beside: Object.fromEntries(this.notes) } : {}) };
  }
}
