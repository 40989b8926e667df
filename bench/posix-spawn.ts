/**
 * The alternative to the plugin spawner that issue 10 also asked to measure: `posix_spawn` from the
 * agent itself through koffi (glibc's posix_spawn is a clone(CLONE_VM|CLONE_VFORK): it does not copy
 * the address space), pipes wrapped as net.Sockets, the child reaped with waitpid(pid, WNOHANG) once
 * its stdout and stderr closed (never waitpid(-1): libuv reaps only its own pids, so nothing is
 * stolen). Used by bench/cni-exec.ts only; the product uses src/cni/spawner.ts (see there why).
 *
 * What it cannot do: die with the agent. A posix_spawn'd child runs nothing of ours between fork
 * and exec, so PR_SET_PDEATHSIG cannot be set; the only way is an exec shim (`shim` below): a tiny
 * C program that sets PR_SET_PDEATHSIG and execs the plugin (kills the plugin, not its delegates:
 * the death signal is not inherited across fork), or one that forks the plugin and waits, killing
 * the whole group when its death signal comes (delegates too; one more fork). The bench measures both.
 */
import koffi from 'koffi';
import { Socket } from 'node:net';
import { constants as osConstants } from 'node:os';

const libc = koffi.load('libc.so.6');
const c = {
  pipe2: libc.func('int pipe2(int *fds, int flags)'),
  close: libc.func('int close(int fd)'),
  waitpid: libc.func('int waitpid(int pid, int *status, int options)'),
  sigemptyset: libc.func('int sigemptyset(void *set)'),
  sigfillset: libc.func('int sigfillset(void *set)'),
  fa_init: libc.func('int posix_spawn_file_actions_init(void *fa)'),
  fa_destroy: libc.func('int posix_spawn_file_actions_destroy(void *fa)'),
  fa_adddup2: libc.func('int posix_spawn_file_actions_adddup2(void *fa, int fd, int newfd)'),
  attr_init: libc.func('int posix_spawnattr_init(void *attr)'),
  attr_destroy: libc.func('int posix_spawnattr_destroy(void *attr)'),
  attr_setflags: libc.func('int posix_spawnattr_setflags(void *attr, short flags)'),
  attr_setpgroup: libc.func('int posix_spawnattr_setpgroup(void *attr, int pgroup)'),
  attr_setsigmask: libc.func('int posix_spawnattr_setsigmask(void *attr, void *set)'),
  attr_setsigdefault: libc.func('int posix_spawnattr_setsigdefault(void *attr, void *set)'),
  posix_spawn: libc.func('int posix_spawn(_Out_ int *pid, const char *path, void *fa, void *attr, const char **argv, const char **envp)'),
};
const O_CLOEXEC = 0o2000000;
const WNOHANG = 1;
const POSIX_SPAWN_SETPGROUP = 0x02;
const POSIX_SPAWN_SETSIGDEF = 0x04;
const POSIX_SPAWN_SETSIGMASK = 0x08;
const SIGNAL_NAMES = new Map<number, string>(Object.entries(osConstants.signals).map(([k, v]) => [v, k]));
const ERRNO_NAMES = new Map<number, string>(Object.entries(osConstants.errno).map(([k, v]) => [v, k]));

// glibc x86_64/arm64: posix_spawn_file_actions_t 80 bytes, posix_spawnattr_t 336, sigset_t 128.
const sigAll = Buffer.alloc(128);
const sigNone = Buffer.alloc(128);
c.sigfillset(sigAll);
c.sigemptyset(sigNone);

export interface PosixOutcome {
  pid: number | undefined;
  exitCode: number | undefined;
  signal: string | undefined;
  errno: string | undefined;
  timedOut: boolean;
  stdout: string;
  stderr: string;
}

function pipe(): [number, number] {
  const fds = new Int32Array(2);
  if (c.pipe2(fds, O_CLOEXEC) !== 0) throw new Error(`pipe2: errno ${koffi.errno()}`);
  return [fds[0] ?? -1, fds[1] ?? -1];
}

/** Runs `argv[0]` with exactly `env`; same outcome shape and timeout semantics as the spawner. */
export function posixSpawnRun(
  argv: string[],
  env: Record<string, string>,
  stdin: string | Uint8Array,
  timeoutMs: number,
): Promise<PosixOutcome> {
  const [inR, inW] = pipe();
  const [outR, outW] = pipe();
  const [errR, errW] = pipe();
  const fa = Buffer.alloc(256);
  const attr = Buffer.alloc(512);
  c.fa_init(fa);
  c.fa_adddup2(fa, inR, 0);
  c.fa_adddup2(fa, outW, 1);
  c.fa_adddup2(fa, errW, 2);
  c.attr_init(attr);
  c.attr_setflags(attr, POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGDEF | POSIX_SPAWN_SETSIGMASK);
  c.attr_setpgroup(attr, 0);
  c.attr_setsigdefault(attr, sigAll);
  c.attr_setsigmask(attr, sigNone);
  const pidOut = [0];
  const envp = [...Object.entries(env).map(([k, v]) => `${k}=${v}`), null];
  const rc = c.posix_spawn(pidOut, argv[0] ?? '', fa, attr, [...argv, null], envp) as number;
  c.fa_destroy(fa);
  c.attr_destroy(attr);
  c.close(inR);
  c.close(outW);
  c.close(errW);
  if (rc !== 0) {
    for (const fd of [inW, outR, errR]) c.close(fd);
    return Promise.resolve({
      pid: undefined,
      exitCode: undefined,
      signal: undefined,
      errno: ERRNO_NAMES.get(rc) ?? `errno ${rc}`,
      timedOut: false,
      stdout: '',
      stderr: '',
    });
  }
  const pid = pidOut[0] ?? 0;
  const input = new Socket({ fd: inW, readable: false, writable: true });
  const out = new Socket({ fd: outR, readable: true, writable: false });
  const err = new Socket({ fd: errR, readable: true, writable: false });
  input.on('error', () => undefined); // EPIPE: the plugin did not read its stdin
  input.end(stdin);
  const so: Buffer[] = [];
  const se: Buffer[] = [];
  out.on('data', (b: Buffer) => so.push(b));
  err.on('data', (b: Buffer) => se.push(b));
  return new Promise((resolveRun) => {
    let timedOut = false;
    let open = 2;
    let finished = false;
    const status = new Int32Array(1);
    const finish = (st: number | undefined) => {
      if (finished) return;
      finished = true;
      clearTimeout(timer);
      const sig = st === undefined ? 0 : st & 0x7f;
      resolveRun({
        pid,
        exitCode: st !== undefined && sig === 0 ? (st >> 8) & 0xff : undefined,
        signal: sig ? SIGNAL_NAMES.get(sig) : undefined,
        errno: undefined,
        timedOut,
        stdout: Buffer.concat(so)
          .toString('utf8')
          .replace(/\r?\n$/, ''),
        stderr: Buffer.concat(se)
          .toString('utf8')
          .replace(/\r?\n$/, ''),
      });
    };
    let delay = 0;
    const reap = () => {
      const r = c.waitpid(pid, status, WNOHANG) as number;
      if (r === pid) return finish(status[0]);
      if (r < 0) return finish(undefined);
      // Its pipes closed as it exited; the exit itself may lag by microseconds.
      if (delay === 0) setImmediate(reap);
      else setTimeout(reap, delay);
      delay = Math.min(Math.max(1, delay * 2), 50);
    };
    const closed = () => {
      if (--open === 0) reap();
    };
    out.once('close', closed);
    err.once('close', closed);
    const timer = setTimeout(() => {
      timedOut = true;
      try {
        process.kill(-pid, 'SIGKILL');
      } catch {
        // gone
      }
      out.destroy();
      err.destroy();
      input.destroy();
    }, timeoutMs);
  });
}

/** C source of the two exec shims (built by bench/cni-exec.ts with cc into a temp dir). */
export const SHIM_C = `
#define _GNU_SOURCE
#include <signal.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>
extern char **environ;
/* usage: shim exec|fork AGENT_PID PLUGIN [ARGS...] */
int main(int argc, char **argv) {
    if (argc < 4) return 127;
    pid_t agent = (pid_t)atoi(argv[2]);
    if (argv[1][0] == 'e') {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != agent) return 127;
        execve(argv[3], argv + 3, environ);
        return 127;
    }
    sigset_t m;
    sigemptyset(&m);
    sigaddset(&m, SIGUSR2);
    sigaddset(&m, SIGCHLD);
    sigprocmask(SIG_BLOCK, &m, NULL);
    prctl(PR_SET_PDEATHSIG, SIGUSR2);
    if (getppid() != agent) return 127;
    pid_t pid = fork();
    if (pid < 0) return 127;
    if (pid == 0) {
        sigprocmask(SIG_UNBLOCK, &m, NULL);
        execve(argv[3], argv + 3, environ);
        _exit(127);
    }
    for (;;) {
        int sig = 0;
        sigwait(&m, &sig);
        if (sig == SIGUSR2) kill(0, SIGKILL); /* the agent died: the whole group */
        int st;
        if (waitpid(pid, &st, WNOHANG) == pid) {
            if (WIFEXITED(st)) return WEXITSTATUS(st);
            signal(WTERMSIG(st), SIG_DFL);
            sigprocmask(SIG_UNBLOCK, &m, NULL);
            raise(WTERMSIG(st));
            return 128 + WTERMSIG(st);
        }
    }
}
`;
