// kpng as a library: embed the core, add a source, a sink or a backend.
export * from './api/index.js';
export { Store, KINDS, type Kind, type StoreTx, type StoreChange, type StoredService, type StoredSlice } from './store/store.js';
export { ServiceViews } from './localstate/views.js';
export { computeServiceView, serviceIsProxied, type ServiceView, type EndpointView } from './localstate/service-view.js';
export { categorize, topologyMode, type NodeContext } from './localstate/topology.js';
export * from './diff/index.js';
export { convertObject, flattenObjects, objectRef, InvalidObject, type Converted } from './sources/objects.js';
export { applyObject, deleteObject, modelKey } from './sources/apply.js';
export { FileSource } from './sources/file/index.js';
export { registerSource, type SourceDefinition, type SourceContext } from './sources/registry.js';
export { registerSink, type SinkDefinition, type SinkContext } from './sinks/registry.js';
export { registerBackend, type BackendDefinition, type BackendContext, type BackendInstance } from './backends/registry.js';
export { startBackend } from './backends/run.js';
export { parseConfig, loadConfigFile, defaultConfig, type KubeProxyConfiguration } from './backends/shared/config.js';
export { createLogger, log, type Logger } from './runtime/log.js';
export { ConfigError } from './runtime/errors.js';
