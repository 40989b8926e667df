/**
 * Runs one of the agent's real writes and prints how it ended, as one JSON line on stdout
 * (`{"ok":true}` or the error's class, code, errno and message). test/util/fs-error.test.ts runs
 * it in a child process where a fault is real: under `unshare -m` over a full or read-only tmpfs it
 * mounted itself (gone with the child's mount namespace), or as another user (setpriv) for EACCES.
 *
 *   fs-fault.ts write FILE          writeFileAtomic(FILE) as a pod record
 *   fs-fault.ts remove FILE         a pod record's removal (SpareFileWriter.remove) of FILE
 *   fs-fault.ts load DIR            the pod records of DIR read (PodStore.load, as at the agent's start)
 *   fs-fault.ts spare-full DIR      a PodStore in DIR/pods with spares ready, DIR's filesystem then
 *                                   filled by this script (DIR/fill), then one more record
 *   fs-fault.ts reserve-full DIR    host-local's store in DIR (lock made), the filesystem filled
 *                                   (DIR/fill), then a reservation
 */
import { closeSync, openSync, writeSync } from 'node:fs';
import { basename, dirname, join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { pino } from 'pino';
import { DiskStore } from '../../src/pod/addresses/allocator/store.js';
import { PodStore, RECORD_VERSION, type PodRecord } from '../../src/pod/records/record.js';
import { SpareFileWriter, writeFileAtomic } from '../../src/util/atomic-file.js';

function fill(file: string): void {
  const fd = openSync(file, 'w');
  const block = Buffer.alloc(4096, 1);
  try {
    for (;;) writeSync(fd, block);
  } catch (err) {
    if ((err as { code?: string }).code !== 'ENOSPC') throw err;
  } finally {
    closeSync(fd);
  }
}

function record(id: string): PodRecord {
  return {
    version: RECORD_VERSION,
    containerId: id,
    ifName: 'eth0',
    namespace: 'default',
    name: `pod-${id}`,
    netns: `/var/run/netns/${id}`,
    phase: 'adding',
    cniArgs: [],
    portMappings: [],
    limits: {},
    ips: [],
    addedAt: new Date().toISOString(),
  };
}

async function run(scenario: string, path: string): Promise<void> {
  switch (scenario) {
    case 'write':
      writeFileAtomic(path, JSON.stringify(record('a')), { mode: 0o600, what: 'the pod record' });
      return;
    case 'load':
      new PodStore(path, pino({ level: 'silent' })).load();
      return;
    case 'remove':
      new SpareFileWriter(dirname(path), join(dirname(dirname(path)), '.spare'), { mode: 0o600, what: 'the pod record' }).remove(
        basename(path),
      );
      return;
    case 'spare-full': {
      const store = new PodStore(join(path, 'pods'), pino({ level: 'silent' }));
      store.put(record('first'));
      const spares = (store as unknown as { files: SpareFileWriter }).files;
      for (let i = 0; i < 200 && spares.spareCount < 4; i++) await sleep(10);
      if (spares.spareCount === 0) throw new Error('no spare made');
      fill(join(path, 'fill'));
      try {
        store.put(record('second'));
      } finally {
        store.close();
      }
      return;
    }
    case 'reserve-full': {
      const store = new DiskStore(path, 'kubenet');
      await store.locked(() => undefined);
      fill(join(path, 'fill'));
      const ok = await store.locked((s) => s.reserve('abc', 'eth0', '10.1.0.2', 0));
      if (!ok) throw new Error('10.1.0.2 was taken');
      return;
    }
    default:
      throw new Error(`unknown scenario ${scenario}`);
  }
}

const [scenario = '', path = ''] = process.argv.slice(2);
try {
  await run(scenario, path);
  console.log(JSON.stringify({ ok: true }));
} catch (err) {
  const e = err as Error & { code?: string; errno?: number; path?: string };
  console.log(JSON.stringify({ ok: false, name: e.name, code: e.code, errno: e.errno, path: e.path, message: e.message }));
}
