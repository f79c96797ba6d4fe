// Packages only some commands use, loaded on first use: a node agent fed by
// the file or kube source never speaks gRPC, and needs YAML only for a
// config file. Loaded at start-up, grpc-js and yaml would cost every kpng
// process their code and module objects.
// Both are CommonJS, so a synchronous require does it.
import { createRequire } from 'node:module';

const require = createRequire(import.meta.url);

function lazy<T>(id: string): () => T {
  let m: T | undefined;
  return () => (m ??= require(id) as T);
}

export const grpcJs = lazy<typeof import('@grpc/grpc-js')>('@grpc/grpc-js');
export const yaml = lazy<typeof import('yaml')>('yaml');
