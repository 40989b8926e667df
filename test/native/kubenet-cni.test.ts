/**
 * The CNI forwarding binary (native/kubenet-cni.c), built here with the same cc command as
 * `npm run build:native`, run as a real process against fake agents listening on unix sockets in
 * a temp dir (the fake sits at the process boundary). No network traffic leaves the machine.
 */
import test from 'ava';
import { execa } from 'execa';
import { spawn } from 'node:child_process';
import { accessSync, constants as fsConstants, readFileSync } from 'node:fs';
import { chmod, link, mkdir, mkdtemp, rm, writeFile } from 'node:fs/promises';
import { createServer as createHttpServer, type IncomingMessage, type ServerResponse } from 'node:http';
import { createServer as createNetServer, type Server, type Socket } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import {
  CNI_API_HOST,
  CNI_API_PATH,
  CNI_ENV_KEYS,
  CNI_ERR_INVALID_CONFIG,
  CNI_ERR_TRY_AGAIN_LATER,
  CNI_VERSION_ANSWER,
  DEFAULT_SOCKET_PATH,
  parseCniRequest,
  type CniErrorBody,
} from '../../src/daemon/protocol.js';

const ROOT = fileURLToPath(new URL('../../', import.meta.url));
const SOURCE = join(ROOT, 'native/kubenet-cni.c');
const CC_FLAGS = ['-O2', '-Wall', '-Wextra', '-Werror'];
/** Extra compiler flags for a checking run, e.g. "-fsanitize=address,undefined -g". */
const EXTRA_CFLAGS = (process.env.KUBENET_CNI_TEST_CFLAGS ?? '').split(/\s+/).filter(Boolean);
/** Passed to every run: sanitizer builds must not fail on the binary's deliberate exit-time leaks. */
const SANITIZER_ENV: Record<string, string> = EXTRA_CFLAGS.length
  ? { ASAN_OPTIONS: 'detect_leaks=0:abort_on_error=1', UBSAN_OPTIONS: 'halt_on_error=1' }
  : {};

/** Why the binary cannot be built here, or undefined when it can. */
function ccBlocker(): string | undefined {
  const onPath = (process.env.PATH ?? '').split(':').some((d) => {
    try {
      accessSync(join(d || '.', 'cc'), fsConstants.X_OK);
      return true;
    } catch {
      return false;
    }
  });
  return onPath ? undefined : 'needs a C compiler `cc` (gcc, libc6-dev: run hack/bootstrap.sh)';
}
const blocker = ccBlocker();
if (blocker) console.warn(`kubenet-cni tests skipped: ${blocker}`);
const ccTest = blocker ? test.skip : test;
const ccSerialTest = blocker ? test.skip : test.serial;

let dir = '';
let bin = '';
let ipamBin = '';
let sockSeq = 0;

test.before(async () => {
  if (blocker) return;
  dir = await mkdtemp(join(tmpdir(), 'kcni-'));
  bin = join(dir, 'kubenet-cni');
  await execa('cc', [...CC_FLAGS, ...EXTRA_CFLAGS, '-o', bin, SOURCE]);
  // The same program under the IPAM shim's name, as hack/build-native.sh links it.
  await mkdir(join(dir, 'ipam'));
  ipamBin = join(dir, 'ipam', 'kubenet-ipam');
  await link(bin, ipamBin);
});

test.after.always(async () => {
  if (dir) await rm(dir, { recursive: true, force: true });
});

function sockPath(): string {
  return join(dir, `agent-${++sockSeq}.sock`);
}

interface Seen {
  method: string;
  url: string;
  headers: IncomingMessage['headers'];
  rawBody: Buffer;
}

/** A fake agent: an HTTP server on a unix socket that records each request. */
async function fakeAgent(
  answer: (req: Seen, res: ServerResponse) => void,
): Promise<{ path: string; seen: Seen[]; close: () => Promise<void> }> {
  const path = sockPath();
  const seen: Seen[] = [];
  const server = createHttpServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on('data', (c: Buffer) => chunks.push(c));
    req.on('end', () => {
      const s: Seen = { method: req.method ?? '', url: req.url ?? '', headers: req.headers, rawBody: Buffer.concat(chunks) };
      seen.push(s);
      answer(s, res);
    });
  });
  await listen(server, path);
  return { path, seen, close: () => closeServer(server) };
}

/** A fake agent speaking raw bytes, for answers no HTTP server would send. */
async function rawAgent(onConn: (sock: Socket) => void): Promise<{ path: string; close: () => Promise<void> }> {
  const path = sockPath();
  const sockets = new Set<Socket>();
  const server = createNetServer((sock) => {
    sockets.add(sock);
    sock.on('close', () => sockets.delete(sock));
    sock.on('error', () => {});
    onConn(sock);
  });
  await listen(server, path);
  return {
    path,
    close: async () => {
      for (const s of sockets) s.destroy();
      await closeServer(server);
    },
  };
}

function listen(server: Server | ReturnType<typeof createHttpServer>, path: string): Promise<void> {
  return new Promise((resolve, reject) => {
    server.once('error', reject);
    server.listen(path, () => resolve());
  });
}

function closeServer(server: Server | ReturnType<typeof createHttpServer>): Promise<void> {
  if ('closeAllConnections' in server) server.closeAllConnections();
  return new Promise((resolve) => server.close(() => resolve()));
}

/** Reads a request head plus Content-Length body from a raw socket, then calls back. */
function afterRequest(sock: Socket, then: () => void): void {
  let buf = Buffer.alloc(0);
  const onData = (c: Buffer) => {
    buf = Buffer.concat([buf, c]);
    const headEnd = buf.indexOf('\r\n\r\n');
    if (headEnd < 0) return;
    const m = /content-length:\s*(\d+)/i.exec(buf.subarray(0, headEnd).toString());
    if (buf.length - headEnd - 4 >= Number(m?.[1] ?? 0)) {
      sock.off('data', onData);
      then();
    }
  };
  sock.on('data', onData);
}

interface Run {
  exitCode: number | undefined;
  stdout: string;
  stderr: string;
}

/** Runs the binary (or `path`, e.g. the IPAM shim) with exactly `env` (nothing inherited) and `stdin`. */
async function runCni(env: Record<string, string>, stdin: string | Buffer, path = bin): Promise<Run> {
  const r = await execa(path, [], {
    env: { ...env, ...SANITIZER_ENV },
    extendEnv: false,
    input: stdin,
    reject: false,
    stripFinalNewline: false,
    timeout: 60_000,
  });
  return { exitCode: r.exitCode, stdout: r.stdout, stderr: r.stderr };
}

function cniEnv(extra: Record<string, string> = {}): Record<string, string> {
  return {
    CNI_COMMAND: 'ADD',
    CNI_CONTAINERID: 'c0ffee',
    CNI_NETNS: '/var/run/netns/cni-1234',
    CNI_IFNAME: 'eth0',
    CNI_ARGS: 'K8S_POD_NAMESPACE=default;K8S_POD_NAME=web-0',
    CNI_PATH: '/opt/cni/bin:/usr/lib/cni',
    ...extra,
  };
}

function conf(extra: Record<string, unknown> = {}): string {
  return JSON.stringify({ cniVersion: '1.0.0', name: 'kubenet', plugins: [{ type: 'kubenet' }], ...extra });
}

function parseError(t: { fail: (m: string) => void }, stdout: string): CniErrorBody {
  try {
    return JSON.parse(stdout) as CniErrorBody;
  } catch {
    t.fail(`stdout is not a CNI error object: ${JSON.stringify(stdout)}`);
    throw new Error('unreachable');
  }
}

const ok = (result: unknown) => (_req: Seen, res: ServerResponse) => {
  res.writeHead(200, { 'content-type': 'application/json' }).end(JSON.stringify(result));
};

test('npm run build:native (hack/build-native.sh) uses the same compiler command', (t) => {
  const pkg = JSON.parse(readFileSync(join(ROOT, 'package.json'), 'utf8')) as { scripts: Record<string, string> };
  t.is(pkg.scripts['build:native'], 'bash hack/build-native.sh');
  t.regex(pkg.scripts.build ?? '', /tsc -p tsconfig\.build\.json && npm run build:native/);
  t.regex(pkg.scripts.test ?? '', /npm run build:native/, 'npm test builds the binary the agent installs');
  const script = readFileSync(join(ROOT, 'hack/build-native.sh'), 'utf8');
  t.true(script.includes(`cc ${CC_FLAGS.join(' ')} -o "$tmp" native/kubenet-cni.c`), script);
  t.true(
    script.includes(`cc -O2 -static ${CC_FLAGS.slice(1).join(' ')} -o "$tmp" native/kubenet-cni.c`),
    'statically linked when it can be',
  );
  t.true(script.includes('ipam=native/build/ipam/kubenet-ipam'), 'the IPAM shim is the same binary under its own name');
});

ccTest('forwards env and stdin exactly as POST /v1/cni and prints the 200 body', async (t) => {
  const result = { cniVersion: '1.0.0', ips: [{ address: '10.244.1.5/24' }] };
  const agent = await fakeAgent(ok(result));
  try {
    const stdin = conf({ socket: agent.path });
    const r = await runCni(cniEnv(), stdin);
    t.is(r.exitCode, 0, r.stdout + r.stderr);
    t.deepEqual(JSON.parse(r.stdout), result);
    t.is(agent.seen.length, 1);
    const req = agent.seen[0]!;
    t.is(req.method, 'POST');
    t.is(req.url, CNI_API_PATH);
    t.is(req.headers.host, CNI_API_HOST);
    t.is(req.headers['content-type'], 'application/json');
    t.is(req.headers.connection, 'close');
    t.is(Number(req.headers['content-length']), req.rawBody.length);
    const body = parseCniRequest(JSON.parse(req.rawBody.toString('utf8')));
    t.deepEqual(body, { env: cniEnv(), stdin });
    // keys in the documented order
    t.deepEqual(Object.keys(body.env), [...CNI_ENV_KEYS]);
  } finally {
    await agent.close();
  }
});

ccTest('forwards only the CNI variables that are set; empty ones as ""', async (t) => {
  const agent = await fakeAgent((_q, res) => res.writeHead(200).end());
  try {
    const env = { CNI_COMMAND: 'DEL', CNI_CONTAINERID: 'abc', CNI_ARGS: '', KUBENET_SOCKET: agent.path, HOME: '/root', CNI_OTHER: 'x' };
    const r = await runCni(env, conf());
    t.is(r.exitCode, 0, r.stdout);
    t.is(r.stdout, '', 'an empty 200 body prints nothing');
    const body = JSON.parse(agent.seen[0]!.rawBody.toString('utf8')) as { env: Record<string, string> };
    t.deepEqual(body.env, { CNI_COMMAND: 'DEL', CNI_CONTAINERID: 'abc', CNI_ARGS: '' });
  } finally {
    await agent.close();
  }
});

ccTest('a 200 KB config is forwarded byte for byte', async (t) => {
  const agent = await fakeAgent(ok({ cniVersion: '1.0.0' }));
  try {
    const filler = Array.from({ length: 2000 }, (_, i) => ({ name: `plugin-${i}`, note: 'x'.repeat(80), nested: { a: [i, '}', ']'] } }));
    const stdin = conf({ socket: agent.path, filler });
    t.true(stdin.length > 200_000, `config is ${stdin.length} bytes`);
    const r = await runCni(cniEnv(), stdin);
    t.is(r.exitCode, 0, r.stdout);
    t.is(parseCniRequest(JSON.parse(agent.seen[0]!.rawBody.toString('utf8'))).stdin, stdin);
  } finally {
    await agent.close();
  }
});

ccTest('quotes, backslashes, newlines, control characters and unicode survive the trip', async (t) => {
  const agent = await fakeAgent(ok({ cniVersion: '1.0.0' }));
  try {
    const tricky = 'a"b\\c\nd\r\te\u0001\u001f\u007f/é 漢字 😀 \u2028';
    // pretty-printed, with the tricky text in a key, a value, and the raw (non-JSON) tail
    const stdin = `${JSON.stringify({ cniVersion: '1.0.0', socket: agent.path, [tricky]: tricky }, null, 2)}\n`;
    const env = cniEnv({ CNI_ARGS: 'K8S_POD_NAME="q\\u0022";x=\ttab\nnl', CNI_NETNS: '/run/netns/ü😀' });
    const r = await runCni(env, stdin);
    t.is(r.exitCode, 0, r.stdout);
    const body = parseCniRequest(JSON.parse(agent.seen[0]!.rawBody.toString('utf8')));
    t.is(body.stdin, stdin);
    t.deepEqual(body.env, env);
  } finally {
    await agent.close();
  }
});

ccTest('invalid UTF-8 on stdin still yields a valid JSON request (bytes become U+FFFD)', async (t) => {
  const agent = await fakeAgent(ok({}));
  try {
    const stdin = Buffer.concat([Buffer.from('{"a":"'), Buffer.from([0xff, 0xc3, 0x28, 0xed, 0xa0, 0x80]), Buffer.from('"}')]);
    const r = await runCni(cniEnv({ KUBENET_SOCKET: agent.path }), stdin);
    t.is(r.exitCode, 0, r.stdout);
    const body = parseCniRequest(JSON.parse(agent.seen[0]!.rawBody.toString('utf8')));
    t.is(body.stdin, '{"a":"\ufffd\ufffd(\ufffd\ufffd\ufffd"}');
  } finally {
    await agent.close();
  }
});

ccTest('the socket comes from the config, then KUBENET_SOCKET', async (t) => {
  const fromConf = await fakeAgent(ok({ from: 'conf' }));
  const fromEnv = await fakeAgent(ok({ from: 'env' }));
  try {
    const viaConf = await runCni(cniEnv({ KUBENET_SOCKET: fromEnv.path }), conf({ socket: fromConf.path }));
    t.deepEqual(JSON.parse(viaConf.stdout), { from: 'conf' });
    const viaEnv = await runCni(cniEnv({ KUBENET_SOCKET: fromEnv.path }), conf());
    t.deepEqual(JSON.parse(viaEnv.stdout), { from: 'env' });
    // only a top-level "socket" string counts: not one nested in objects/arrays/strings
    const decoys = JSON.stringify({
      cniVersion: '1.0.0',
      a: { socket: fromConf.path },
      b: [{ socket: fromConf.path }, '"socket":"x"', '\\"}', '{['],
      c: 'socket',
      n: -1.5e3,
      t: true,
      z: null,
    });
    const viaEnv2 = await runCni(cniEnv({ KUBENET_SOCKET: fromEnv.path }), decoys);
    t.deepEqual(JSON.parse(viaEnv2.stdout), { from: 'env' });
    // an escaped key and an escaped path are decoded
    const escaped = `{"cniVersion":"1.0.0","\\u0073ocket":${JSON.stringify(fromConf.path).replace(/\//g, '\\/')}}`;
    t.deepEqual(JSON.parse((await runCni(cniEnv({ KUBENET_SOCKET: fromEnv.path }), escaped)).stdout), { from: 'conf' });
    // duplicate keys: the last one wins, as in JSON.parse
    const dup = `{"socket":"/nonexistent/a.sock","socket":${JSON.stringify(fromConf.path)}}`;
    t.deepEqual(JSON.parse((await runCni(cniEnv(), dup)).stdout), { from: 'conf' });
    // a config that is not a JSON object is forwarded as is (the agent reports it); env socket used
    const broken = `{"socket":${JSON.stringify(fromConf.path)}, oops`;
    const viaBroken = await runCni(cniEnv({ KUBENET_SOCKET: fromEnv.path }), broken);
    t.deepEqual(JSON.parse(viaBroken.stdout), { from: 'env' });
    t.is(parseCniRequest(JSON.parse(fromEnv.seen.at(-1)!.rawBody.toString('utf8'))).stdin, broken);
  } finally {
    await fromConf.close();
    await fromEnv.close();
  }
});

/** A deterministic pseudo-random generator (mulberry32), so failures reproduce. */
function rng(seed: number): () => number {
  let a = seed;
  return () => {
    a = (a + 0x6d2b79f5) | 0;
    let x = Math.imul(a ^ (a >>> 15), 1 | a);
    x = (x + Math.imul(x ^ (x >>> 7), 61 | x)) ^ x;
    return ((x ^ (x >>> 14)) >>> 0) / 4294967296;
  };
}

ccTest('the config scanner agrees with JSON.parse on random documents', async (t) => {
  const fromConf = await fakeAgent(ok({ from: 'conf' }));
  const fromEnv = await fakeAgent(ok({ from: 'env' }));
  try {
    const seed = Number(process.env.KUBENET_CNI_FUZZ_SEED ?? 20261123);
    const runs = Number(process.env.KUBENET_CNI_FUZZ_RUNS ?? 150);
    const rand = rng(seed);
    const pick = <T>(xs: readonly T[]): T => xs[Math.floor(rand() * xs.length)]!;
    const atoms = ['socket', '"', '\\', '}', ']', '{', '[', ',', ':', '\n', 'é', '😀', '\u0000', ' '];
    const str = () => Array.from({ length: Math.floor(rand() * 6) }, () => pick(atoms)).join('');
    const value = (depth: number): unknown => {
      const k = Math.floor(rand() * (depth > 3 ? 4 : 6));
      if (k === 0) return str();
      if (k === 1) return pick([0, -1.5e3, 42, true, false, null]);
      if (k === 2) return pick([fromConf.path, fromEnv.path, 'socket']);
      if (k === 3) return '';
      if (k === 4) return Array.from({ length: Math.floor(rand() * 4) }, () => value(depth + 1));
      return obj(depth + 1);
    };
    const obj = (depth: number): Record<string, unknown> => {
      const o: Record<string, unknown> = {};
      for (let i = Math.floor(rand() * 5); i > 0; i--) o[pick(['socket', str(), 'a', 'cniVersion'])] = value(depth);
      return o;
    };
    // escape some characters of a JSON text's strings the long way (\uXXXX, \/), keeping it equivalent
    const reescape = (json: string) =>
      json.replace(/"(?:[^"\\]|\\.)*"/g, (tok) =>
        tok.replace(/\\u[0-9a-f]{4}|\\.|[a-z/]/g, (c) => {
          if (c.length > 1 || rand() >= 0.1) return c;
          return c === '/' ? '\\/' : `\\u${c.charCodeAt(0).toString(16).padStart(4, '0')}`;
        }),
      );
    let viaConf = 0;
    for (let i = 0; i < runs; i++) {
      const doc = obj(0);
      // the top-level "socket" is either absent or the fake agent's path (other values are refused)
      if (rand() < 0.5) doc.socket = fromConf.path;
      else delete doc.socket;
      const text = reescape(JSON.stringify(doc, null, pick([0, 1, '\t'])));
      const want = (JSON.parse(text) as { socket?: string }).socket === fromConf.path ? 'conf' : 'env';
      if (want === 'conf') viaConf++;
      const r = await runCni(cniEnv({ KUBENET_SOCKET: fromEnv.path }), text);
      t.is(r.exitCode, 0, text);
      t.deepEqual(JSON.parse(r.stdout), { from: want }, text);
    }
    t.true(viaConf > runs / 5 && viaConf < (runs * 4) / 5, `seed ${seed}`);
  } finally {
    await fromConf.close();
    await fromEnv.close();
  }
});

ccTest('a "socket" that is not a non-empty string is refused as invalid config', async (t) => {
  for (const socket of [42, '', { path: '/x' }, null]) {
    const r = await runCni(cniEnv(), conf({ cniVersion: '0.4.0', socket }));
    t.is(r.exitCode, 1);
    const e = parseError(t, r.stdout);
    t.is(e.code, CNI_ERR_INVALID_CONFIG, JSON.stringify(socket));
    t.is(e.cniVersion, '0.4.0');
  }
});

ccTest('VERSION is answered without any socket', async (t) => {
  const r = await runCni({ CNI_COMMAND: 'VERSION', KUBENET_SOCKET: join(dir, 'absent.sock') }, '{"cniVersion":"0.4.0"}');
  t.is(r.exitCode, 0);
  t.is(r.stdout, `${JSON.stringify(CNI_VERSION_ANSWER)}\n`);
  t.deepEqual(JSON.parse(r.stdout), {
    cniVersion: '1.1.0',
    supportedVersions: ['0.1.0', '0.2.0', '0.3.0', '0.3.1', '0.4.0', '1.0.0', '1.1.0'],
  });
  // also with no stdin at all
  const r2 = await execa(bin, [], { env: { CNI_COMMAND: 'VERSION', ...SANITIZER_ENV }, extendEnv: false, stdin: 'ignore', reject: false });
  t.is(r2.exitCode, 0);
  t.deepEqual(JSON.parse(r2.stdout), CNI_VERSION_ANSWER);
});

ccTest('a non-200 answer: its body is printed and the exit code is 1', async (t) => {
  const errBody = { cniVersion: '1.0.0', code: 7, msg: 'bad config', details: 'no "ipam"' };
  const agent = await fakeAgent((_q, res) => res.writeHead(400, { 'content-type': 'application/json' }).end(JSON.stringify(errBody)));
  try {
    const r = await runCni(cniEnv({ KUBENET_SOCKET: agent.path }), conf());
    t.is(r.exitCode, 1);
    t.is(r.stdout, JSON.stringify(errBody));
  } finally {
    await agent.close();
  }
});

ccTest('a non-200 answer without a body still yields a CNI error', async (t) => {
  const agent = await fakeAgent((_q, res) => res.writeHead(500).end());
  try {
    const r = await runCni(cniEnv({ KUBENET_SOCKET: agent.path }), conf());
    t.is(r.exitCode, 1);
    const e = parseError(t, r.stdout);
    t.is(e.code, 999);
    t.regex(e.msg, /HTTP 500/);
  } finally {
    await agent.close();
  }
});

ccTest('chunked and close-delimited answers are read whole', async (t) => {
  const big = 'y'.repeat(300_000);
  const chunked = await fakeAgent((_q, res) => {
    res.writeHead(200, { 'content-type': 'application/json' });
    res.write('{"part":1,');
    setTimeout(() => res.end(`"big":"${big}"}`), 20);
  });
  const closeDelimited = await rawAgent((sock) =>
    afterRequest(sock, () => {
      sock.write('HTTP/1.0 200 OK\r\nContent-Type: application/json\r\n\r\n{"a":');
      setTimeout(() => sock.end('1}'), 20);
    }),
  );
  const trickle = await rawAgent((sock) =>
    afterRequest(sock, () => {
      const text = 'HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\ncontent-length: 9\r\n\r\n{"ok":1}\n';
      let i = 0;
      const tick = () => {
        if (i >= text.length) return; // no close: the binary must stop at Content-Length
        sock.write(text.slice(i, i + 7));
        i += 7;
        setTimeout(tick, 2);
      };
      tick();
    }),
  );
  try {
    const r1 = await runCni(cniEnv({ KUBENET_SOCKET: chunked.path }), conf());
    t.is(r1.exitCode, 0);
    t.deepEqual(JSON.parse(r1.stdout), { part: 1, big });
    const r2 = await runCni(cniEnv({ KUBENET_SOCKET: closeDelimited.path }), conf());
    t.is(r2.exitCode, 0);
    t.is(r2.stdout, '{"a":1}');
    const r3 = await runCni(cniEnv({ KUBENET_SOCKET: trickle.path }), conf());
    t.is(r3.exitCode, 0, r3.stdout);
    t.is(r3.stdout, '{"ok":1}\n');
  } finally {
    await chunked.close();
    await closeDelimited.close();
    await trickle.close();
  }
});

ccTest('an unreachable agent yields code 11 naming the socket', async (t) => {
  // no such file
  const absent = join(dir, 'absent.sock');
  const r1 = await runCni(cniEnv(), conf({ cniVersion: '0.3.1', socket: absent }));
  t.is(r1.exitCode, 1);
  const e1 = parseError(t, r1.stdout);
  t.deepEqual(e1, {
    cniVersion: '0.3.1',
    code: CNI_ERR_TRY_AGAIN_LATER,
    msg: `kubenet agent unreachable at ${absent}`,
    details: 'No such file or directory',
  });
  // a path that is not a listening socket: connection refused
  const notSock = join(dir, 'plain-file.sock');
  await writeFile(notSock, '');
  const r2 = await runCni(cniEnv({ KUBENET_SOCKET: notSock }), '{}');
  const e2 = parseError(t, r2.stdout);
  t.is(r2.exitCode, 1);
  t.deepEqual(e2, {
    cniVersion: '1.1.0',
    code: CNI_ERR_TRY_AGAIN_LATER,
    msg: `kubenet agent unreachable at ${notSock}`,
    details: 'Connection refused',
  });
  // the config's cniVersion is used when it is a non-empty string (the last one wins)
  for (const [text, want] of [
    ['{"cniVersion":""}', '1.1.0'],
    ['{"cniVersion":"0.4.0","cniVersion":""}', '1.1.0'],
    ['{"cniVersion":"1.0.0-long-version","cniVersion":"0.2.0"}', '0.2.0'],
    ['{"cniVersion":7}', '1.1.0'],
    ['{"cniVersion":"0.3.0",', '1.1.0'],
  ] as const) {
    t.is(parseError(t, (await runCni(cniEnv({ KUBENET_SOCKET: absent }), text)).stdout).cniVersion, want, text);
  }
  // a path too long for sockaddr_un
  const long = `/${'x'.repeat(200)}.sock`;
  const e3 = parseError(t, (await runCni(cniEnv({ KUBENET_SOCKET: long }), '{}')).stdout);
  t.is(e3.code, CNI_ERR_TRY_AGAIN_LATER);
  t.is(e3.details, 'File name too long');
});

// The binary runs in a private mount namespace with a tmpfs over /run, so whatever the host has at
// the default path is neither seen nor touched: first nothing is there, then a fake agent's socket
// is bind-mounted onto /run/kubenet/kubenet.sock.
const rootCcTest = blocker || process.getuid?.() !== 0 ? test.skip : test;
if (!blocker && process.getuid?.() !== 0)
  console.warn('kubenet-cni tests skipped: the default-socket test needs root (a private mount namespace)');

async function runCniPrivateRun(env: Record<string, string>, stdin: string, bindSocket?: string): Promise<Run> {
  const script = [
    'set -e',
    'mount -t tmpfs tmpfs /run',
    ...(bindSocket ? ['mkdir -p /run/kubenet', 'touch /run/kubenet/kubenet.sock', 'mount --bind "$1" /run/kubenet/kubenet.sock'] : []),
    'shift',
    'exec "$@"',
  ].join('\n');
  const r = await execa('unshare', ['--mount', '--propagation', 'private', 'sh', '-c', script, 'sh', bindSocket ?? '', bin], {
    env: { ...env, ...SANITIZER_ENV, PATH: process.env.PATH ?? '/usr/sbin:/usr/bin:/sbin:/bin' },
    extendEnv: false,
    input: stdin,
    reject: false,
    stripFinalNewline: false,
    timeout: 60_000,
  });
  return { exitCode: r.exitCode, stdout: r.stdout, stderr: r.stderr };
}

rootCcTest('the default socket is /run/kubenet/kubenet.sock', async (t) => {
  const none = await runCniPrivateRun(cniEnv(), '{}');
  t.is(parseError(t, none.stdout).msg, `kubenet agent unreachable at ${DEFAULT_SOCKET_PATH}`, none.stderr);
  const result = { cniVersion: '1.0.0', ips: [{ address: '10.244.1.5/24' }] };
  const agent = await fakeAgent(ok(result));
  try {
    const r = await runCniPrivateRun(cniEnv(), conf(), agent.path);
    t.is(r.exitCode, 0, r.stdout + r.stderr);
    t.deepEqual(JSON.parse(r.stdout), result);
    t.is(agent.seen.length, 1, 'the call reached the socket at the default path');
  } finally {
    await agent.close();
  }
});

ccTest('an agent that closes early or answers garbage yields code 11', async (t) => {
  const cases: Array<[string, (sock: Socket) => void, RegExp]> = [
    ['closes without answering', (s) => afterRequest(s, () => s.end()), /closed without a response/],
    [
      'closes mid-body',
      (s) => afterRequest(s, () => s.end('HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n{"short":')),
      /closed before the response was complete/,
    ],
    ['closes mid-head', (s) => afterRequest(s, () => s.end('HTTP/1.1 200 OK\r\nContent-Le')), /closed before the response was complete/],
    ['garbage', (s) => afterRequest(s, () => s.end('HELLO there\r\n\r\n')), /malformed HTTP status line/],
    [
      'bad chunking',
      (s) => afterRequest(s, () => s.end('HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n')),
      /malformed chunk size/,
    ],
    ['drops the connection before reading', (s) => s.destroy(), /closed without a response|Connection reset|Broken pipe/],
  ];
  for (const [name, onConn, details] of cases) {
    const agent = await rawAgent(onConn);
    try {
      const r = await runCni(cniEnv({ KUBENET_SOCKET: agent.path }), conf());
      t.is(r.exitCode, 1, name);
      const e = parseError(t, r.stdout);
      t.is(e.code, CNI_ERR_TRY_AGAIN_LATER, name);
      t.is(e.msg, `kubenet agent unreachable at ${agent.path}`, name);
      t.regex(e.details ?? '', details, name);
    } finally {
      await agent.close();
    }
  }
});

ccTest('a silent agent times out after KUBENET_CNI_TIMEOUT_SECONDS', async (t) => {
  const agent = await rawAgent(() => {}); // accepts, never answers
  try {
    const start = Date.now();
    const r = await runCni(cniEnv({ KUBENET_SOCKET: agent.path, KUBENET_CNI_TIMEOUT_SECONDS: '1' }), conf());
    const took = Date.now() - start;
    t.is(r.exitCode, 1);
    const e = parseError(t, r.stdout);
    t.is(e.code, CNI_ERR_TRY_AGAIN_LATER);
    t.regex(e.details ?? '', /timed out after 1 s/);
    t.log(`gave up after ${took} ms`);
  } finally {
    await agent.close();
  }
});

/** Runs a command `n` times sequentially; returns wall times in ms (spawn to exit). */
async function timeRuns(n: number, cmd: string, env: Record<string, string>, stdin: string): Promise<number[]> {
  const times: number[] = [];
  for (let i = 0; i < n; i++) {
    const start = process.hrtime.bigint();
    await new Promise<void>((resolve, reject) => {
      const child = spawn(cmd, [], { env: { ...env, ...SANITIZER_ENV }, stdio: ['pipe', 'ignore', 'ignore'] });
      child.on('error', reject);
      child.on('exit', (code) => (cmd === bin && code !== 0 ? reject(new Error(`exit ${code}`)) : resolve()));
      child.stdin.on('error', () => {});
      child.stdin.end(stdin);
    });
    times.push(Number(process.hrtime.bigint() - start) / 1e6);
  }
  return times;
}

function pct(sorted: number[], p: number): number {
  return sorted[Math.min(sorted.length - 1, Math.floor((sorted.length * p) / 100))] ?? NaN;
}

ccSerialTest('forwarding overhead (numbers only, no assertion on time)', async (t) => {
  const runs = Number(process.env.KUBENET_CNI_BENCH_RUNS ?? 200);
  const answer = JSON.stringify({ cniVersion: '1.0.0', ips: [{ address: '10.244.1.5/24' }] });
  const agent = await fakeAgent((_q, res) => res.writeHead(200, { 'content-type': 'application/json' }).end(answer));
  try {
    const stdin = conf({ socket: agent.path });
    await timeRuns(10, bin, cniEnv(), stdin); // warm up
    await timeRuns(10, '/bin/true', cniEnv(), stdin);
    const cni = (await timeRuns(runs, bin, cniEnv(), stdin)).sort((a, b) => a - b);
    const base = (await timeRuns(runs, '/bin/true', cniEnv(), stdin)).sort((a, b) => a - b);
    const line = (name: string, s: number[]) =>
      `${name.padEnd(14)} p50 ${pct(s, 50).toFixed(2)} ms  p90 ${pct(s, 90).toFixed(2)} ms  p99 ${pct(s, 99).toFixed(2)} ms`;
    t.log(`${runs} sequential runs each, spawned from node, fake agent in the same process`);
    t.log(line('kubenet-cni', cni));
    t.log(line('/bin/true', base));
    t.log(`forwarding overhead (median difference): ${(pct(cni, 50) - pct(base, 50)).toFixed(2)} ms`);
    t.is(agent.seen.length, runs + 10);
  } finally {
    await agent.close();
  }
});

// ---------------------------------------------------------------------------------------------
// As the IPAM shim (exec'd as kubenet-ipam by the bridge plugin of the agent's own config)

/** A fake host-local: prints its command, argv[0] and stdin, so a run shows what it was handed. */
async function fakeHostLocal(): Promise<string> {
  const d = join(dir, `hl-${++sockSeq}`);
  await mkdir(d);
  const script = join(d, 'host-local');
  await writeFile(
    script,
    '#!/bin/sh\nprintf \'{"ran":"%s","cmd":"%s","id":"%s","stdin":%s}\' "$0" "$CNI_COMMAND" "$CNI_CONTAINERID" "$(cat)"\n',
  );
  await chmod(script, 0o755);
  return d;
}

ccTest('kubenet-ipam: ADD is POSTed to /v1/ipam on the socket of the bridge config, and the answer printed', async (t) => {
  const result = { cniVersion: '1.0.0', ips: [{ address: '10.244.1.7/24', gateway: '10.244.1.1' }] };
  const agent = await fakeAgent(ok(result));
  try {
    const stdin = JSON.stringify({
      cniVersion: '1.0.0',
      name: 'kubenet',
      type: 'bridge',
      socket: agent.path,
      ipam: { type: 'kubenet-ipam', dataDir: '/x' },
    });
    const r = await runCni(cniEnv(), stdin, ipamBin);
    t.is(r.exitCode, 0, r.stdout + r.stderr);
    t.deepEqual(JSON.parse(r.stdout), result);
    t.is(agent.seen.length, 1);
    t.is(agent.seen[0]?.url, '/v1/ipam');
    t.deepEqual(parseCniRequest(JSON.parse(agent.seen[0]!.rawBody.toString('utf8'))), { env: cniEnv(), stdin });
  } finally {
    await agent.close();
  }
});

ccTest(
  'kubenet-ipam: every other command is host-local itself, first in CNI_PATH, with the stdin unread; none there is an error',
  async (t) => {
    const agent = await fakeAgent(ok({}));
    const hl = await fakeHostLocal();
    try {
      const stdin = JSON.stringify({
        cniVersion: '1.1.0',
        name: 'kubenet',
        type: 'bridge',
        socket: agent.path,
        ipam: { type: 'kubenet-ipam' },
      });
      const empty = join(dir, 'empty-dir');
      await mkdir(empty, { recursive: true });
      for (const cmd of ['DEL', 'CHECK', 'GC', 'STATUS', 'VERSION']) {
        const r = await runCni(cniEnv({ CNI_COMMAND: cmd, CNI_PATH: `${empty}:${hl}:/nonexistent` }), stdin, ipamBin);
        t.is(r.exitCode, 0, `${cmd}: ${r.stdout}${r.stderr}`);
        t.deepEqual(JSON.parse(r.stdout), { ran: join(hl, 'host-local'), cmd, id: 'c0ffee', stdin: JSON.parse(stdin) }, cmd);
      }
      t.is(agent.seen.length, 0, 'the agent is asked only for ADD');
      const r = await runCni(cniEnv({ CNI_COMMAND: 'DEL', CNI_PATH: `${empty}:/nonexistent` }), stdin, ipamBin);
      t.is(r.exitCode, 1);
      const err = parseError(t, r.stdout);
      t.is(err.code, 999);
      t.is(err.msg, 'kubenet-ipam: cannot run host-local');
      t.regex(err.details ?? '', /CNI_PATH=.*empty-dir:\/nonexistent: No such file or directory/);
    } finally {
      await agent.close();
      await rm(hl, { recursive: true, force: true });
    }
  },
);
