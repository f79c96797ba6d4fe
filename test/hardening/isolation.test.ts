// No single Service may stop the others (issue 19): when the dataplane
// refuses one Service, it is left out with one log line and the rest is
// applied, with the real iptables-restore in a namespace (a wrapper refuses
// any input naming one cluster IP, as a kernel or tool bug would). The same
// for nft runs against the in-memory nft in test/nft/fake.test.ts.
import { test, describe, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, writeFileSync, chmodSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { syncedStore, load, service, slice, node } from '../helpers/k8s.js';
import { LocalSet } from '../../src/api/model.js';
import { IptablesProxier } from '../../src/backends/iptables/proxier.js';
import { toolName, type IptablesMode } from '../../src/backends/iptables/iptables.js';
import type { SyncResult } from '../../src/backends/shared/runner.js';
import { createNetns, type TestNetns } from '../helpers/netns.js';
import { iptablesUnsupported, MODES } from '../helpers/iptables.js';
import { recordingLogger } from '../helpers/logs.js';
import { driveProxier, testConfig } from '../helpers/proxier-harness.js';
import { ConntrackNetlink } from '../../src/kernel/conntrack.js';

const BAD_IP = '172.30.0.99';

for (const mode of MODES) {
  describe(`a Service iptables-${mode} refuses`, { skip: iptablesUnsupported(mode) }, () => {
    let ns: TestNetns;
    let dir: string;
    before(() => {
      ns = createNetns();
      dir = mkdtempSync(join(tmpdir(), 'kpng-isolation-'));
    });
    after(() => {
      ns?.remove();
      rmSync(dir, { recursive: true, force: true });
    });

    test('is left out with one log line; the others are applied, at start-up and later', async () => {
      // iptables-restore in the namespace, refusing any input that names BAD_IP
      const tool = (t: string) => {
        if (!t.endsWith('-restore')) return ns.wrapper(t);
        const p = join(dir, t);
        writeFileSync(p, `#!/bin/sh\nin=$(cat)\ncase "$in" in *${BAD_IP}*) echo "iptables-restore: line 1 failed" >&2; exit 1 ;; esac\nprintf '%s\\n' "$in" | exec ip netns exec ${ns.name} ${t} "$@"\n`);
        chmodSync(p, 0o755);
        return p;
      };
      const { log, lines } = recordingLogger('info');
      const results: SyncResult[] = [];
      const store = syncedStore([
        node('n1', undefined, ['192.168.0.2']),
        service('ns', 'web', { clusterIP: '172.30.0.10' }),
        slice('ns', 'web-1', 'web', [{ ip: '10.1.0.1', node: 'n1' }]),
        service('ns', 'bad', { clusterIP: BAD_IP }),
        slice('ns', 'bad-1', 'bad', [{ ip: '10.1.0.9', node: 'n1' }]),
      ]);
      const proxier = new IptablesProxier({
        nodeName: 'n1',
        config: testConfig(),
        log,
        once: true,
        mode: mode as IptablesMode,
        tool,
        conntrack: new ConntrackNetlink(ns.name),
        healthChecks: false,
        families: [4],
        report: (r) => results.push(r),
      });
      const h = driveProxier(store, proxier, { sets: [LocalSet.NodesSet] });
      const sync = () => h.sync();
      const nat = () => ns.exec(toolName(4, mode, 'save'), ['-t', 'nat']);
      try {
        // the first sync (a full one) with the bad Service in it
        await sync();
        assert.deepEqual(results.at(-1)!.skipped, ['ns/bad']);
        assert.match(nat(), /-d 172\.30\.0\.10\/32 .*-j KUBE-SVC-/);
        assert.doesNotMatch(nat(), new RegExp(BAD_IP.replace(/\./g, '\\.')));
        assert.equal(lines.filter((l) => /skipping Service ns\/bad/.test(l)).length, 1);
        // a later change to another Service goes through, the bad one stays out
        load(store, [slice('ns', 'web-1', 'web', [{ ip: '10.1.0.2', node: 'n1' }])]);
        await sync();
        assert.equal(results.at(-1)!.ok, true);
        assert.match(nat(), /-j DNAT --to-destination 10\.1\.0\.2:8080/);
        assert.equal(lines.filter((l) => /skipping Service ns\/bad/.test(l)).length, 1);
        // a good version of it is applied
        load(store, [service('ns', 'bad', { clusterIP: '172.30.0.98' })]);
        await sync();
        assert.deepEqual(results.at(-1)!.skipped, []);
        assert.match(nat(), /-d 172\.30\.0\.98\/32 /);
      } finally {
        await h.close();
      }
    });
  });
}
