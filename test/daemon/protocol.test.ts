import test from 'ava';
import { readFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { ConfigError } from '../../src/errors.js';
import {
  CNI_API_PATH,
  CNI_ENV_KEYS,
  CNI_VERSION_ANSWER,
  DEFAULT_SOCKET_PATH,
  IPAM_API_PATH,
  SOCKET_ENV,
  TIMEOUT_ENV,
  cniErrorBody,
  parseCniRequest,
} from '../../src/daemon/protocol.js';
import { IPAM_SHIM_TYPE } from '../../src/pod/index.js';

test('parseCniRequest accepts what the binary sends', (t) => {
  const body = { env: { CNI_COMMAND: 'ADD', CNI_CONTAINERID: 'x', CNI_ARGS: '' }, stdin: '{"cniVersion":"1.0.0"}' };
  t.deepEqual(parseCniRequest(JSON.parse(JSON.stringify(body))), body);
  t.deepEqual(parseCniRequest({ env: {}, stdin: '' }), { env: {}, stdin: '' });
});

test('parseCniRequest refuses anything else with a ConfigError', (t) => {
  for (const bad of [
    null,
    [],
    'x',
    { env: {} },
    { stdin: '' },
    { env: [], stdin: '' },
    { env: {}, stdin: 1 },
    { env: { CNI_COMMAND: 1 }, stdin: '' },
    { env: { PATH: '/bin' }, stdin: '' },
    { env: {}, stdin: '', extra: 1 },
  ]) {
    t.throws(() => parseCniRequest(bad), { instanceOf: ConfigError }, JSON.stringify(bad));
  }
});

test('cniErrorBody omits details when there are none', (t) => {
  t.deepEqual(cniErrorBody(11, 'later'), { cniVersion: '1.1.0', code: 11, msg: 'later' });
  t.deepEqual(cniErrorBody(7, 'bad', 'why', '0.4.0'), { cniVersion: '0.4.0', code: 7, msg: 'bad', details: 'why' });
});

test('the constants match the C source of the binary', (t) => {
  const c = readFileSync(fileURLToPath(new URL('../../native/kubenet-cni.c', import.meta.url)), 'utf8');
  t.true(c.includes(`"POST %s HTTP/1.1\\r\\n"`));
  t.true(c.includes(`ipam_mode ? "${IPAM_API_PATH}" : "${CNI_API_PATH}"`), "the CNI call, or the IPAM shim's");
  t.true(c.includes(`#define IPAM_NAME "${IPAM_SHIM_TYPE}"`));
  t.true(c.includes(`#define DEFAULT_SOCKET "${DEFAULT_SOCKET_PATH}"`));
  t.true(c.includes(`getenv("${SOCKET_ENV}")`));
  t.true(c.includes(`getenv("${TIMEOUT_ENV}")`));
  const keysInC = [...(/CNI_ENV_KEYS\[\] = \{([^}]*)\}/.exec(c)?.[1] ?? '').matchAll(/"([A-Z_]+)"/g)].map((m) => m[1]);
  t.deepEqual(keysInC, [...CNI_ENV_KEYS]);
  const versionInC = /VERSION_ANSWER\[\] =\s*((?:"(?:[^"\\]|\\.)*"\s*)+);/.exec(c)?.[1] ?? '';
  const joined = [...versionInC.matchAll(/"((?:[^"\\]|\\.)*)"/g)].map((m) => JSON.parse(`"${m[1]}"`) as string).join('');
  t.is(joined, JSON.stringify(CNI_VERSION_ANSWER));
});
