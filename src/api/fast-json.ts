// A hand-written toJson(EndpointSchema, e): to-file writes one per endpoint
// of the state, and protobuf-es's reflective writer would be a good part of
// a one-shot state's writing. The same JSON value, key
// for key and in the same order (test/core/fast-json.test.ts compares it
// with toJson on random endpoints): proto3 JSON with its defaults, fields
// at their default left out, enums by name (a number no name has as the
// number), field names as declared (their JSON names).
import { Protocol, type Endpoint, type IPSet, type PortName } from './gen/api/localv1/api_pb.js';

type Json = { [k: string]: unknown };

const protocolJson = (p: number): string | number => Protocol[p] ?? p;

function ipSetJson(s: IPSet): Json {
  const o: Json = {};
  if (s.V4.length) o.V4 = s.V4.slice();
  if (s.V6.length) o.V6 = s.V6.slice();
  return o;
}

function portNameJson(p: PortName): Json {
  const o: Json = {};
  if (p.Name !== '') o.Name = p.Name;
  if (p.Port !== 0) o.Port = p.Port;
  if (p.Protocol !== 0) o.Protocol = protocolJson(p.Protocol);
  return o;
}

export function endpointToJson(e: Endpoint): Json {
  const o: Json = {};
  if (e.Hostname !== '') o.Hostname = e.Hostname;
  if (e.IPs) o.IPs = ipSetJson(e.IPs);
  if (e.Local) o.Local = true;
  if (e.PortOverrides.length) o.PortOverrides = e.PortOverrides.map(portNameJson);
  if (e.Scopes) {
    const s: Json = {};
    if (e.Scopes.Internal) s.Internal = true;
    if (e.Scopes.External) s.External = true;
    if (e.Scopes.Cluster) s.Cluster = true;
    o.Scopes = s;
  }
  if (e.Terminating) o.Terminating = true;
  if (e.NodeName !== '') o.NodeName = e.NodeName;
  return o;
}
