/**
 * The CNI wire parser: every field of a forwarded call checked, each refusal with the CNI spec's
 * code and a message naming the field and the value. Pure: no kernel, no agent.
 */
import test from 'ava';
import {
  CniRequestError,
  jsonDepth,
  MAX_JSON_DEPTH,
  parseCniCall,
  parseJsonBounded,
  podIdentity,
  type AddCall,
  type GcCall,
} from '../../../src/daemon/cni/request.js';
import type { CniRequest } from '../../../src/daemon/protocol.js';

const ID = 'a'.repeat(64);
const conf = (extra: Record<string, unknown> = {}) => JSON.stringify({ cniVersion: '1.0.0', name: 'kubenet', type: 'kubenet', ...extra });
const env = (over: Record<string, string> = {}) => ({
  CNI_COMMAND: 'ADD',
  CNI_CONTAINERID: ID,
  CNI_NETNS: '/var/run/netns/pod',
  CNI_IFNAME: 'eth0',
  CNI_ARGS: `IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME=web-0;K8S_POD_INFRA_CONTAINER_ID=${ID};K8S_POD_UID=1234`,
  ...over,
});
const call = (e: Record<string, string>, stdin = conf()): CniRequest => ({ env: e, stdin });

function refused(t: import('ava').ExecutionContext, req: CniRequest, code: number, msg: RegExp, what: string): void {
  const err = t.throws(() => parseCniCall(req), { instanceOf: CniRequestError }, what);
  t.is(err?.code, code, `${what}: code`);
  t.regex(err?.message ?? '', msg, `${what}: message`);
}

test('a containerd-style ADD parses into the attachment, the pod and its runtimeConfig', (t) => {
  const c = parseCniCall(
    call(
      env(),
      conf({
        runtimeConfig: {
          bandwidth: { IngressRate: 20e6, IngressBurst: 4294967295, EgressRate: 10e6, EgressBurst: 80000 },
          portMappings: [{ hostPort: 8080, containerPort: 80, protocol: 'TCP' }],
        },
      }),
    ),
  ) as AddCall;
  t.deepEqual(c, {
    command: 'ADD',
    cniVersion: '1.0.0',
    containerId: ID,
    ifName: 'eth0',
    netns: '/var/run/netns/pod',
    namespace: 'default',
    name: 'web-0',
    limits: { ingress: 20e6, egress: 10e6, egressBurst: 80000 },
    portMappings: [{ hostPort: 8080, containerPort: 80, protocol: 'tcp' }],
  });
  t.is((parseCniCall(call(env())) as AddCall).limits, undefined, 'no runtimeConfig: limits left to the annotations');
  t.deepEqual(
    (parseCniCall(call(env(), conf({ runtimeConfig: { bandwidth: { ingressRate: 0, egressRate: 0 } } }))) as AddCall).limits,
    undefined,
    'rates of 0 limit nothing',
  );
});

test('DEL may come without a netns; GC and STATUS need spec 1.1.0', (t) => {
  t.like(parseCniCall(call(env({ CNI_COMMAND: 'DEL', CNI_NETNS: '' }))), { command: 'DEL', netns: '' });
  const gc = parseCniCall(
    call({ CNI_COMMAND: 'GC' }, conf({ cniVersion: '1.1.0', 'cni.dev/valid-attachments': [{ containerID: ID, ifname: 'eth0' }] })),
  ) as GcCall;
  t.deepEqual(gc.valid, [{ containerId: ID, ifName: 'eth0' }]);
  t.like(parseCniCall(call({ CNI_COMMAND: 'STATUS' }, conf({ cniVersion: '1.1.0' }))), { command: 'STATUS' });
  refused(t, call({ CNI_COMMAND: 'GC' }, conf({ 'cni.dev/valid-attachments': [] })), 1, /GC needs cniVersion 1\.1\.0/, 'GC at 1.0.0');
  refused(t, call({ CNI_COMMAND: 'STATUS' }, conf()), 1, /STATUS needs cniVersion 1\.1\.0/, 'STATUS at 1.0.0');
});

test('environment: command, container ID, interface, netns and CNI_ARGS are checked (code 4)', (t) => {
  const cases: Array<[Record<string, string>, RegExp]> = [
    [{ CNI_COMMAND: '' }, /CNI_COMMAND is required/],
    [{ CNI_COMMAND: 'FROB' }, /CNI_COMMAND "FROB" is not one of/],
    [{ CNI_CONTAINERID: '' }, /CNI_CONTAINERID is required/],
    [{ CNI_CONTAINERID: '../../victim' }, /CNI_CONTAINERID "\.\.\/\.\.\/victim" is not a valid container ID/],
    [{ CNI_CONTAINERID: 'x'.repeat(300) }, /CNI_CONTAINERID is 300 characters long: at most 76/],
    [{ CNI_CONTAINERID: 'a..b' }, /not a valid container ID/],
    [{ CNI_CONTAINERID: 'abc-' }, /not a valid container ID/],
    [{ CNI_CONTAINERID: 'a b' }, /not a valid container ID/],
    [{ CNI_IFNAME: '' }, /CNI_IFNAME is required/],
    [{ CNI_IFNAME: 'net1' }, /eth0 only/],
    [{ CNI_IFNAME: 'a/b' }, /not a valid interface name/],
    [{ CNI_IFNAME: 'x'.repeat(16) }, /not a valid interface name/],
    [{ CNI_NETNS: '' }, /CNI_NETNS is required/],
    [{ CNI_NETNS: 'relative/path' }, /CNI_NETNS "relative\/path" is not an absolute path/],
    [{ CNI_ARGS: 'K8S_POD_NAME' }, /CNI_ARGS entry "K8S_POD_NAME" is not KEY=VALUE/],
    [{ CNI_ARGS: '=x' }, /not KEY=VALUE/],
    [{ CNI_ARGS: 'K8S_POD_NAME=a;K8S_POD_NAME=b' }, /names K8S_POD_NAME twice/],
    [{ CNI_ARGS: 'K8S_POD_NAMESPACE=Bad_NS' }, /K8S_POD_NAMESPACE "Bad_NS" is not a Kubernetes namespace name/],
    [{ CNI_ARGS: 'K8S_POD_NAME=web;IgnoreUnknown=1\n' }, /control characters/],
    [{ CNI_ARGS: `K8S_POD_INFRA_CONTAINER_ID=${'b'.repeat(64)}` }, /K8S_POD_INFRA_CONTAINER_ID .* is not CNI_CONTAINERID/],
  ];
  for (const [over, msg] of cases) refused(t, call(env(over)), 4, msg, JSON.stringify(over).slice(0, 60));
});

test('network config: JSON object, supported version (code 1), this network and plugin type (code 7)', (t) => {
  refused(t, call(env(), ''), 6, /stdin is empty/, 'empty stdin');
  refused(t, call(env(), '{not json'), 6, /not JSON/, 'not JSON');
  refused(t, call(env(), '[1,2]'), 6, /must be a JSON object/, 'an array');
  refused(t, call(env(), `${'['.repeat(100000)}${']'.repeat(100000)}`), 6, /nested 100000 levels deep: at most 64/, 'deep nesting');
  refused(t, call(env(), conf({ cniVersion: '0.0.1' })), 1, /cniVersion "0\.0\.1" is not supported/, '0.0.1');
  refused(t, call(env(), conf({ cniVersion: '9.9.9' })), 1, /cniVersion "9\.9\.9" is not supported/, '9.9.9');
  refused(t, call(env(), JSON.stringify({ name: 'kubenet', type: 'kubenet' })), 7, /no "cniVersion"/, 'no version');
  refused(t, call(env(), conf({ name: 'other' })), 7, /network name "other" is not "kubenet"/, 'other network');
  refused(t, call(env(), conf({ type: 'bridge' })), 7, /plugin type "bridge" is not "kubenet"/, 'other type');
  refused(t, call(env(), conf({ runtimeConfig: [] })), 7, /runtimeConfig must be an object/, 'runtimeConfig list');
});

test('runtimeConfig.bandwidth and portMappings are bounded and named (code 7)', (t) => {
  const bw = (b: unknown) => call(env(), conf({ runtimeConfig: { bandwidth: b } }));
  refused(t, bw({ ingressRate: 10 }), 7, /runtimeConfig\.bandwidth\.ingressRate 10 is outside 1000\.\./, 'rate too low');
  refused(t, bw({ egressRate: 1e15 }), 7, /runtimeConfig\.bandwidth\.egressRate 1000000000000000 is outside .*10000000000000/, 'rate 1e15');
  refused(t, bw({ ingressRate: -1 }), 7, /ingressRate must be a non-negative integer/, 'negative');
  refused(t, bw({ ingressRate: '10M' }), 7, /ingressRate must be a non-negative integer, got "10M"/, 'string');
  refused(t, bw({ ingressRate: 1.5e6 + 0.5 }), 7, /non-negative integer/, 'fraction');
  refused(t, bw({ ingressRate: 1e6, IngressRate: 2e6 }), 7, /both ingressRate and IngressRate/, 'both cases');
  refused(t, bw({ ingress: 1e6 }), 7, /unknown key "ingress"/, 'unknown key');
  refused(t, bw({ ingressRate: 1e6, ingressBurst: 1e12 }), 7, /ingressBurst 1000000000000 is above/, 'burst too big');
  refused(t, bw('fast'), 7, /bandwidth must be an object/, 'not an object');
  const pm = (p: unknown) => call(env(), conf({ runtimeConfig: { portMappings: p } }));
  refused(t, pm({}), 7, /portMappings must be a list/, 'not a list');
  refused(t, pm([null]), 7, /portMappings\[0\] must be an object/, 'null entry');
  refused(t, pm([{ hostPort: 0, containerPort: 80 }]), 7, /portMappings\[0\]\.hostPort must be a port 1\.\.65535, got 0/, 'port 0');
  refused(t, pm([{ hostPort: 80, containerPort: 70000 }]), 7, /containerPort must be a port/, 'port 70000');
  refused(t, pm([{ hostPort: 80, containerPort: 80, protocol: 'icmp' }]), 7, /protocol must be one of tcp, udp, sctp, got "icmp"/, 'icmp');
  refused(t, pm([{ hostPort: 80, containerPort: 80, hostIP: 'nope' }]), 7, /hostIP must be an IP address/, 'hostIP');
  refused(
    t,
    pm([
      { hostPort: 80, containerPort: 80 },
      { hostPort: 80, containerPort: 81, protocol: 'tcp' },
    ]),
    7,
    /host port 80\/tcp is mapped twice/,
    'duplicate',
  );
  refused(
    t,
    pm(Array.from({ length: 257 }, (_, i) => ({ hostPort: i + 1, containerPort: 80 }))),
    7,
    /257 entries: at most 256/,
    'too many',
  );
});

test('GC: a malformed valid-attachments list is refused whole, before anything is collected (code 7)', (t) => {
  const gc = (v: unknown) => call({ CNI_COMMAND: 'GC' }, conf({ cniVersion: '1.1.0', 'cni.dev/valid-attachments': v }));
  refused(t, gc(undefined), 7, /valid-attachments is required/, 'missing');
  refused(t, gc({}), 7, /must be a list/, 'object');
  refused(t, gc([ID]), 7, /\[0\] must be an object/, 'list of strings');
  refused(t, gc([null]), 7, /\[0\] must be an object/, '[null]');
  refused(t, gc([{ containerid: ID, ifname: 'eth0' }]), 7, /\[0\] has an unknown key "containerid"/, 'wrong case');
  refused(t, gc([{ containerID: 5, ifname: 'eth0' }]), 7, /\[0\]\.containerID must be a string, got 5/, 'number');
  refused(
    t,
    gc([
      { containerID: ID, ifname: 'eth0' },
      { containerID: '../x', ifname: 'eth0' },
    ]),
    7,
    /\[1\]\.containerID "\.\.\/x" is not a valid container ID/,
    'bad ID',
  );
  refused(t, gc([{ containerID: ID }]), 7, /\[0\]\.ifname must be an interface name/, 'no ifname');
});

test('jsonDepth counts nesting outside strings only; parseJsonBounded refuses past the limit', (t) => {
  t.is(jsonDepth('{"a":[1,{"b":"[[[["}]}'), 3);
  t.is(jsonDepth('"\\"[["'), 0);
  t.is(jsonDepth('[]'), 1);
  t.deepEqual(
    parseJsonBounded(`${'['.repeat(MAX_JSON_DEPTH)}${']'.repeat(MAX_JSON_DEPTH)}`, 'x'),
    JSON.parse(`${'['.repeat(MAX_JSON_DEPTH)}${']'.repeat(MAX_JSON_DEPTH)}`),
  );
  t.throws(() => parseJsonBounded(`${'['.repeat(MAX_JSON_DEPTH + 1)}${']'.repeat(MAX_JSON_DEPTH + 1)}`, 'x'), {
    instanceOf: CniRequestError,
  });
});

test('podIdentity: no CNI_ARGS is a pod without a name; unknown keys are ignored', (t) => {
  t.deepEqual(podIdentity('', ID), { namespace: '', name: '' });
  t.deepEqual(podIdentity('FOO=bar;K8S_POD_NAME=a.b-c', ID), { namespace: '', name: 'a.b-c' });
});
