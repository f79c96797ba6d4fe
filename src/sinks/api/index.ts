// to-api: serves the store to other processes over gRPC, wire-compatible
// with kpng: /localv1.Sets/Watch (node-local diff streams, for `kpng local`)
// and /globalv1.Sets/Watch (the global state, for `kpng api`).

export { ApiServer, DEFAULT_HEAP_GROWTH_PERCENT, tuneHeapForFanOut, type ApiServerOptions, type ApiServerStats } from './server.js';
