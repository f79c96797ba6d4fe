// The lab: real packets through what kpng programs, in network namespaces.
// Used by `kpng demo` and by the dataplane tests.
export { Lab, POD_GATEWAY, KPNG_BIN, type LabSpec, type LabInterface, type ConnectOptions, type LabConnection, type KpngProcess } from './lab.js';
export type { Outcome, LabProtocol } from './agent.js';
export { verdict, masqueraded, seenSource, describeOutcome, hostPort, splitHostPort, spread, sleep, poll } from './observe.js';
export { labUnsupported, kernelHasSCTP, listNamespaces, removeLeftovers } from './netns.js';
export { LabCgroup, labCgroupUnsupported } from './cgroup.js';
