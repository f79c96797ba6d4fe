// Bad and extreme input found by the reliability probe (issue 19): IP forms
// that crashed or were misread, names that broke dataplane comments.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { convertObject } from '../../src/sources/objects.js';
import { canonicalIP, parseCIDR } from '../../src/api/ip.js';
import { safeComment, NFT_COMMENT_MAX } from '../../src/backends/shared/comment.js';
import { service, slice, node, invalidField } from '../helpers/k8s.js';
import { label } from '../helpers/extreme.js';

const invalid = invalidField;

test('an IPv6 form with too many words is not an address (it crashed the file source)', () => {
  assert.equal(canonicalIP('::%0:0:0:0:0:0:0:0:0:0:0'), undefined);
  assert.equal(parseCIDR('::%0:0:0:0:0:0:0:0:0:0:0/64'), undefined);
  assert.equal(invalid(service('ns', 's', { clusterIP: '::%0:0:0:0:0:0:0:0:0:0:0' })), 'spec.clusterIPs[0]');
});

test('addresses with a zone are refused, not misread', () => {
  // were 10.244.1.0 and fd00::1
  assert.equal(canonicalIP('::ffff:10.244.1.77%eth0'), undefined);
  assert.equal(canonicalIP('fd00::1%eth0'), undefined);
  assert.equal(canonicalIP('fe80::1%25eth0'), undefined);
  assert.equal(invalid(slice('ns', 's-1', 's', [{ ip: '::ffff:10.244.1.77%eth0' }], undefined, { addressType: 'IPv4' })), 'endpoints[0].addresses[0]');
  assert.equal(invalid(slice('ns', 's-1', 's', [{ ip: 'fd00::1%eth0' }])), 'endpoints[0].addresses[0]');
  assert.equal(invalid(service('ns', 's', { clusterIP: 'fd00::1%eth0' })), 'spec.clusterIPs[0]');
  assert.equal(invalid(node('n', undefined, ['fe80::1%eth0'])), 'status.addresses[0].address');
  // the forms without a zone still read as before
  assert.equal(canonicalIP('::ffff:10.244.1.77'), '10.244.1.77');
  assert.equal(canonicalIP('FD00:0:0:0:0:0:0:1'), 'fd00::1');
});

test('names the API server would refuse are refused with their field', () => {
  assert.equal(invalid(service('ns', 'we"b')), 'metadata.name');
  assert.equal(invalid(service('ns"x', 'web')), 'metadata.namespace');
  assert.equal(invalid(service('ns', label('s', 64))), 'metadata.name');
  assert.equal(invalid(service('ns', 'web', { ports: [{ name: 'a"b', port: 80 }] })), 'spec.ports[0].name');
  assert.equal(invalid(slice('ns', 'web-1', 'we"b', [{ ip: '10.0.0.1' }])), 'metadata.labels[kubernetes.io/service-name]');
  assert.equal(invalid(slice('ns', 'web-1', 'web', [{ ip: '10.0.0.1' }], [{ name: 'h\ttp', port: 80 }])), 'ports[0].name');
  assert.equal(invalid(node('Node_1')), 'metadata.name');
  // the longest legal names are fine
  assert.equal(convertObject(service(label('ns'), label('svc'), { ports: [{ name: label('port'), port: 80 }] })).kind, 'Service');
  assert.equal(convertObject(node('a'.repeat(63) + '.' + 'b'.repeat(63) + '.example.com')).kind, 'Node');
});

test('dataplane comments are bounded and need no quoting; long ones stay distinct', () => {
  assert.equal(safeComment('ns/web:http', NFT_COMMENT_MAX), 'ns/web:http');
  const long = `${label('ns')}/${label('svc')}:${label('port')}`;
  const a = safeComment(long, NFT_COMMENT_MAX);
  const b = safeComment(long.replace(/9$/, '8'), NFT_COMMENT_MAX);
  assert.equal(a.length, NFT_COMMENT_MAX);
  assert.notEqual(a, b);
  assert.equal(safeComment(long, NFT_COMMENT_MAX), a); // stable
  assert.equal(safeComment('a"b\\c\nd\'e', 255), 'a_b_c_d_e');
});
