import test from 'ava';
import { CniPluginError, ConfigError, KubenetError, NetlinkError } from '../src/errors.js';

test('error classes carry their fields and classify by type', (t) => {
  const n = new NetlinkError('linkByName cbr0', 19, 'Object not found');
  t.true(n instanceof KubenetError);
  t.is(n.errno, 19);
  t.is(n.name, 'NetlinkError');
  const c = new CniPluginError({ plugin: 'bridge', command: 'ADD', code: 11, msg: 'no IP addresses available', stderr: 'x' });
  t.is(c.code, 11);
  t.regex(c.message, /bridge ADD failed \(CNI code 11\)/);
  t.false(c instanceof ConfigError);
});
