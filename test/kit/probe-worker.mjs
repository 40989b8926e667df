// A TCP probe like kubelet's HTTP probe, run inside a test namespace by probe.ts (plain JS: it
// starts with `node` in a netns without a loader). Two modes:
//   server HOST PORT: answers every connection's first line with "ok\n" and closes; prints
//     "listening" once bound.
//   client HOST PORT INTERVAL_MS DURATION_MS TIMEOUT_MS: every INTERVAL_MS for DURATION_MS opens a
//     new connection, sends "probe\n", reads the answer, closes; the time from connect() to the
//     answer is the try's time. Tries overlap if one is slow. Prints one JSON line at the end:
//     {"ms": [time or null per try, in start order], "errors": {code: count}}; null = failed or
//     no answer within TIMEOUT_MS.
// Traffic goes only to the HOST given, which the caller picks among its own namespaces.
import net from 'node:net';
import { performance } from 'node:perf_hooks';

const [mode, host, portText, ...rest] = process.argv.slice(2);
const port = Number(portText);

if (mode === 'server') {
  const server = net.createServer((sock) => {
    sock.setNoDelay(true);
    let buf = '';
    sock.on('data', (d) => {
      buf += d.toString();
      if (buf.includes('\n')) sock.end('ok\n');
    });
    sock.on('error', () => sock.destroy());
  });
  server.listen(port, host, () => process.stdout.write('listening\n'));
  process.on('SIGTERM', () => process.exit(0));
} else if (mode === 'client') {
  const [intervalMs, durationMs, timeoutMs] = rest.map(Number);
  const ms = [];
  const errors = {};
  const pending = new Set();
  const once = (i) =>
    new Promise((resolve) => {
      const t0 = performance.now();
      let answer = '';
      let done = false;
      const finish = (value, code) => {
        if (done) return;
        done = true;
        clearTimeout(timer);
        ms[i] = value;
        if (code) errors[code] = (errors[code] ?? 0) + 1;
        sock.destroy();
        resolve();
      };
      const timer = setTimeout(() => finish(null, 'TIMEOUT'), timeoutMs);
      const sock = net.connect({ host, port, noDelay: true }, () => sock.write('probe\n'));
      sock.on('data', (d) => {
        answer += d.toString();
        if (answer.includes('\n')) finish(performance.now() - t0);
      });
      sock.on('error', (err) => finish(null, err.code ?? 'ERROR'));
      sock.on('close', () => finish(null, 'CLOSED'));
    });
  const start = performance.now();
  let i = 0;
  const tick = () => {
    if (performance.now() - start >= durationMs) {
      clearInterval(timer);
      Promise.all([...pending]).then(() => process.stdout.write(JSON.stringify({ ms, errors }) + '\n'));
      return;
    }
    const p = once(i++);
    pending.add(p);
    void p.then(() => pending.delete(p));
  };
  const timer = setInterval(tick, intervalMs);
  tick();
} else {
  process.stderr.write('usage: probe-worker.mjs server HOST PORT | client HOST PORT INTERVAL_MS DURATION_MS TIMEOUT_MS\n');
  process.exit(2);
}
