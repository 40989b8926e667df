/**
 * runtimeConfig as the runtimes send it: portMappings in camelCase (CRI-O, the CNI convention) and
 * in PascalCase (containerd 1.6.20, seen over CRI in test/e2e/containerd.test.ts).
 */
import test from 'ava';
import { portMappingsOf as portMappingsFromRuntimeConfig } from '../../../src/daemon/cni/request.js';
import { ConfigError } from '../../../src/errors.js';

test('portMappings: camelCase and containerd 1.6 PascalCase give the same mappings', (t) => {
  const want = [{ hostPort: 31000, containerPort: 8080, protocol: 'tcp' }];
  t.deepEqual(portMappingsFromRuntimeConfig({ portMappings: [{ hostPort: 31000, containerPort: 8080, protocol: 'tcp' }] }), want);
  t.deepEqual(
    portMappingsFromRuntimeConfig({ portMappings: [{ HostPort: 31000, ContainerPort: 8080, Protocol: 'tcp', HostIP: '' }] }),
    want,
  );
  t.deepEqual(
    portMappingsFromRuntimeConfig({ portMappings: [{ HostPort: 53, ContainerPort: 5353, Protocol: 'UDP', HostIP: '198.18.0.1' }] }),
    [{ hostPort: 53, containerPort: 5353, protocol: 'udp', hostIP: '198.18.0.1' }],
  );
});

test('portMappings: a bad port is refused whatever the key case, naming the field', (t) => {
  const err = t.throws(() => portMappingsFromRuntimeConfig({ portMappings: [{ HostPort: 0, ContainerPort: 8080 }] }), {
    instanceOf: ConfigError,
  });
  t.regex(err?.message ?? '', /portMappings\[0\]\.hostPort must be a port 1\.\.65535, got 0/);
});
