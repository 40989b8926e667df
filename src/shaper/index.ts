export * from './quantity.js';
export * from './sizing.js';
export { Shaper, DEFAULT_IFB, DEFAULT_STATE_DIR, MAX_CLASS, type PodShaping, type ShaperOptions } from './tc.js';
export { TcBatchError } from './tc-exec.js';
