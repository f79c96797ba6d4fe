// The datapath against the real kernel (root; programs attached only to a
// child cgroup this test creates, pins in a bpffs mount of its own, both
// removed after): the object's BTF agrees with layout.ts, a full map is a
// MapFullError (E2BIG from the kernel), a restart reuses maps of the same
// size and makes again those whose size changed, cleanup leaves nothing.
import { describe, it, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { existsSync, readdirSync } from 'node:fs';
import { join } from 'node:path';
import { LabCgroup, labCgroupUnsupported } from '../../src/lab/index.js';
import { Datapath, cleanupPins } from '../../src/backends/ebpf/datapath.js';
import { MapFullError } from '../../src/backends/ebpf/maps.js';
import { libbpfUnavailable } from '../../src/backends/ebpf/libbpf.js';
import { skipOrFailInCI } from '../helpers/ci.js';

const skip = skipOrFailInCI(labCgroupUnsupported() ?? libbpfUnavailable());
const log = { info: () => {}, warn: () => {} };
const none = { setEndpoints: [], setServices: [], deleteServices: [], deleteEndpoints: [] };
const svc = (i: number) => ({ key: { ip: `10.96.0.${i}`, port: 80, proto: 'tcp' as const }, value: { id: i, count: 1, flags: 0, affinitySecs: 0 } });

describe('eBPF datapath (real kernel, a test cgroup)', { skip, concurrency: 1 }, () => {
  let cg: LabCgroup;
  let bpffs: string;
  before(() => {
    cg = LabCgroup.create('datapath');
    bpffs = join(cg.bpffs, 'kpng');
  });
  after(() => cg?.close());

  it('loads (the BTF check passes), attaches 8 programs, and a full map is a MapFullError', () => {
    const dp = Datapath.open({ bpffs, cgroupPath: cg.path, maxServicePorts: 4, maxEndpoints: 16, log });
    try {
      assert.equal(dp.report.attached.length, 8);
      dp.maps.write({ ...none, setServices: [1, 2, 3, 4].map(svc) });
      assert.throws(() => dp.maps.write({ ...none, setServices: [svc(5)] }), (e) => e instanceof MapFullError && /kpng_services is full \(4 entries\)/.test(e.message));
      // the batch path too (8 or more at once)
      assert.throws(() => dp.maps.write({ ...none, setEndpoints: Array.from({ length: 20 }, (_, i) => ({ id: 1, index: i, ep: { ip: '10.0.0.1', port: 80 } })) }), MapFullError);
      assert.equal(dp.maps.read().services.size, 4);
    } finally {
      dp.close();
    }
  });

  it('a restart reuses same-sized maps with their entries and makes again those whose size changed', () => {
    const same = Datapath.open({ bpffs, cgroupPath: cg.path, maxServicePorts: 4, maxEndpoints: 16, log });
    try {
      assert.equal(same.report.adoptedMaps.length, 6);
      assert.equal(same.report.adoptedLinks.length, 8);
      assert.equal(same.maps.read().services.size, 4);
    } finally {
      same.close();
    }
    const bigger = Datapath.open({ bpffs, cgroupPath: cg.path, maxServicePorts: 8, maxEndpoints: 16, log });
    try {
      assert.ok(!bigger.report.adoptedMaps.includes('kpng_services'));
      assert.ok(bigger.report.adoptedMaps.includes('kpng_endpoints'));
      assert.equal(bigger.maps.read().services.size, 0, 'made again: empty until the full sync refills it');
      bigger.maps.write({ ...none, setServices: [1, 2, 3, 4, 5, 6].map(svc) });
    } finally {
      bigger.close();
    }
  });

  it('cleanup detaches and unpins everything it made', () => {
    const r = cleanupPins(bpffs);
    assert.equal(r.failed.length, 0, r.failed.join('\n'));
    assert.equal(r.removed.length, 8 + 6);
    assert.ok(!existsSync(bpffs) || readdirSync(bpffs).length === 0);
  });
});
