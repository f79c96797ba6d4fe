// The hand-written Endpoint JSON writer gives what protobuf-es's toJson gives.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { toJson, create } from '@bufbuild/protobuf';
import { EndpointSchema } from '../../src/api/gen/api/localv1/api_pb.js';
import { endpointToJson } from '../../src/api/fast-json.js';
import { randomMessages } from '../helpers/random-messages.js';

test('endpointToJson equals toJson(EndpointSchema) on many endpoints: the same keys in the same order, defaults left out, enums by name', () => {
  const random = randomMessages(7);
  let protocols = 0;
  for (let i = 0; i < 3000; i++) {
    const e = random.endpoint();
    const want = toJson(EndpointSchema, e);
    const got = endpointToJson(e);
    // key order matters: the YAML and JSON written follow it
    assert.equal(JSON.stringify(got), JSON.stringify(want), JSON.stringify(want));
    if (e.PortOverrides.some((p) => p.Protocol > 3)) protocols++;
  }
  // a protocol number without a name is written as the number, as toJson does
  assert.ok(protocols > 0);
  // the empty endpoint
  assert.equal(JSON.stringify(endpointToJson(create(EndpointSchema))), JSON.stringify(toJson(EndpointSchema, create(EndpointSchema))));
});
