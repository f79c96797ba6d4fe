// kpng's API: the protobuf model (localv1, globalv1) and its helpers.
export * as localv1 from './gen/api/localv1/api_pb.js';
export * as globalv1 from './gen/api/globalv1/api_pb.js';
export * from './model.js';
export * from './ip.js';
