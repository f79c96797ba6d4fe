export * from './ops.js';
export * from './local-diff.js';
export * from './fullstate.js';
export * from './decoder.js';
export * from './filter-reset.js';
