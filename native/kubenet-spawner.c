/*
 * kubenet-spawner: the agent's plugin exec'er (src/cni/spawner.ts is the other side).
 *
 * Why: Node starts a child by forking the whole agent (libuv fork + exec); the fork copies the
 * page tables of a 60-200 MB process and costs 3-8 ms per CNI plugin exec. The agent instead starts
 * this tiny process once and asks it to start each plugin: a fork of a ~1 MB process.
 *
 * Lifetime: it lives exactly as long as its agent. When the agent dies (EOF on the request
 * channel, or PR_SET_PDEATHSIG's SIGUSR2 should the channel have leaked to another process), it
 * SIGKILLs the whole process group of every plugin still running (so the delegates a plugin
 * started, host-local or iptables, die too), then exits: plugins started by a dead agent do not
 * keep changing the node. Each plugin also gets PR_SET_PDEATHSIG(SIGKILL) towards this process.
 * SIGINT, SIGTERM, SIGHUP and SIGPIPE are ignored: an init system's SIGTERM to the whole group
 * must not kill pod setups the agent is still finishing (the agent is started in its own session
 * by the agent, so a terminal's signals do not reach it anyway).
 *
 * Protocol (all integers little-endian), agent -> fd 0, fd 1 -> agent; fd 2 stays the agent's
 * stderr for this program's own complaints. Every frame: u32 len (of what follows), u8 type,
 * u32 id, then len - 5 bytes of payload.
 *
 *   agent -> spawner
 *     'S' spawn  payload: u32 n, n bytes of stdin, then NUL-terminated strings: the executable's
 *                path (also argv[0]) followed by the complete environment, one "K=V" each.
 *     'K' kill   no payload: SIGKILL the plugin's process group, stop reading its output (a
 *                delegate that left the group may hold the pipes), answer 'X' once it is reaped.
 *   spawner -> agent
 *     'P' started      payload: u32 pid (also the process group id)
 *     'F' not started  payload: u32 errno (from pipe, fork or execve; nothing is left running)
 *     'O' / 'E'        payload: bytes the plugin wrote to stdout / stderr
 *     'X' done         payload: i32 wait status; sent once the plugin is reaped and its stdout
 *                      and stderr are at EOF (or were dropped by 'K'). Last frame of that id.
 *
 * Usage: kubenet-spawner AGENT_PID   (exits at once when its parent is not AGENT_PID)
 * Build: cc -O2 -Wall -Wextra -Werror -o native/build/kubenet-spawner native/kubenet-spawner.c
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#define MAX_FRAME (256u * 1024u * 1024u)
#define READ_CHUNK 65536
/* Stop reading plugin output while this much is waiting to be written to the agent. */
#define OUT_HIGH_WATER (4u * 1024u * 1024u)
#define DEATH_SIGNAL SIGUSR2

typedef struct {
    unsigned char *data;
    size_t len; /* bytes held, starting at data + off */
    size_t off;
    size_t cap;
} buf_t;

typedef struct {
    uint32_t id;
    pid_t pid;
    int in_fd;  /* our end of the plugin's stdin, -1 once closed */
    int out_fd; /* our end of its stdout */
    int err_fd; /* our end of its stderr */
    unsigned char *stdin_data;
    size_t stdin_len;
    size_t stdin_off;
    int reaped;
    int status;
} child_t;

static buf_t inbuf, outbuf;
static child_t **children;
static size_t nchildren, capchildren;
static int ctl_in = 0, ctl_out = 1;

static void complain(const char *what, int err) {
    fprintf(stderr, "kubenet-spawner: %s: %s\n", what, strerror(err));
}

static void die_oom(void) {
    static const char msg[] = "kubenet-spawner: out of memory\n";
    ssize_t r = write(2, msg, sizeof msg - 1);
    (void)r;
    _exit(1);
}

static void *xrealloc(void *p, size_t n) {
    void *q = realloc(p, n ? n : 1);
    if (!q) die_oom();
    return q;
}

static void buf_compact(buf_t *b) {
    if (b->off == 0) return;
    if (b->len) memmove(b->data, b->data + b->off, b->len);
    b->off = 0;
}

static void buf_reserve(buf_t *b, size_t extra) {
    if (b->off + b->len + extra <= b->cap) return;
    buf_compact(b);
    if (b->len + extra <= b->cap) return;
    size_t cap = b->cap ? b->cap : 65536;
    while (cap < b->len + extra) {
        if (cap > SIZE_MAX / 2) die_oom();
        cap *= 2;
    }
    b->data = xrealloc(b->data, cap);
    b->cap = cap;
}

static void put_u32(unsigned char *p, uint32_t v) {
    p[0] = (unsigned char)v;
    p[1] = (unsigned char)(v >> 8);
    p[2] = (unsigned char)(v >> 16);
    p[3] = (unsigned char)(v >> 24);
}

static uint32_t get_u32(const unsigned char *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* Queues one frame for the agent; written by flush_out (poll loop) or right away. */
static void send_frame(char type, uint32_t id, const void *payload, size_t n) {
    buf_reserve(&outbuf, 9 + n);
    unsigned char *p = outbuf.data + outbuf.off + outbuf.len;
    put_u32(p, (uint32_t)(5 + n));
    p[4] = (unsigned char)type;
    put_u32(p + 5, id);
    if (n) memcpy(p + 9, payload, n);
    outbuf.len += 9 + n;
}

static void send_u32(char type, uint32_t id, uint32_t v) {
    unsigned char b[4];
    put_u32(b, v);
    send_frame(type, id, b, 4);
}

static void close_fd(int *fd) {
    if (*fd >= 0) close(*fd);
    *fd = -1;
}

/* The agent is gone: nothing may keep running on its behalf. */
static void kill_all_and_exit(void) {
    /* Also for a plugin already reaped whose delegates still hold its pipes: the group outlives
     * its leader, and its id cannot be handed out again while any member lives. */
    for (size_t i = 0; i < nchildren; i++) kill(-children[i]->pid, SIGKILL);
    _exit(0);
}

static void flush_out(void) {
    while (outbuf.len) {
        ssize_t w = write(ctl_out, outbuf.data + outbuf.off, outbuf.len);
        if (w < 0) {
            if (errno == EINTR) continue;
            if (errno == EAGAIN) return;
            kill_all_and_exit(); /* EPIPE and friends: the agent is gone */
        }
        outbuf.off += (size_t)w;
        outbuf.len -= (size_t)w;
    }
    outbuf.off = 0;
}

static void remove_child(size_t i) {
    child_t *c = children[i];
    close_fd(&c->in_fd);
    close_fd(&c->out_fd);
    close_fd(&c->err_fd);
    free(c->stdin_data);
    free(c);
    children[i] = children[--nchildren];
}

/* Sends 'X' and forgets the child once it is reaped and its output pipes are closed. */
static void maybe_finish(size_t i) {
    child_t *c = children[i];
    if (!c->reaped || c->out_fd >= 0 || c->err_fd >= 0) return;
    send_u32('X', c->id, (uint32_t)c->status);
    remove_child(i);
}

static child_t *find_child(uint32_t id, size_t *index) {
    for (size_t i = 0; i < nchildren; i++) {
        if (children[i]->id == id) {
            if (index) *index = i;
            return children[i];
        }
    }
    return NULL;
}

static int set_nonblock(int fd) {
    int fl = fcntl(fd, F_GETFL);
    return fl < 0 ? -1 : fcntl(fd, F_SETFL, fl | O_NONBLOCK);
}

/* In the forked child, before execve: only async-signal-safe calls. Never returns. */
static void child_exec(pid_t spawner, int in_r, int out_w, int err_w, int status_w, const char *path, char *const argv[], char *const envp[]) {
    int e;
    if (setpgid(0, 0) < 0) goto fail;
    /* Dies with the spawner; the spawner itself kills the whole group when the agent dies. */
    if (prctl(PR_SET_PDEATHSIG, SIGKILL) < 0) goto fail;
    if (getppid() != spawner) _exit(127);
    /* The spawner blocks signals (signalfd) and ignores a few: plugins start with defaults. */
    struct sigaction dfl;
    memset(&dfl, 0, sizeof dfl);
    dfl.sa_handler = SIG_DFL;
    for (int s = 1; s < NSIG; s++) {
        if (s == SIGKILL || s == SIGSTOP) continue;
        sigaction(s, &dfl, NULL); /* EINVAL for the few glibc reserves: fine */
    }
    sigset_t none;
    sigemptyset(&none);
    if (sigprocmask(SIG_SETMASK, &none, NULL) < 0) goto fail;
    if (dup2(in_r, 0) < 0 || dup2(out_w, 1) < 0 || dup2(err_w, 2) < 0) goto fail;
    /* Every other descriptor is O_CLOEXEC already; this also covers any we inherited. */
    syscall(SYS_close_range, 3u, ~0u, 4u /* CLOSE_RANGE_CLOEXEC */);
    execve(path, argv, envp);
fail:
    e = errno;
    while (write(status_w, &e, sizeof e) < 0 && errno == EINTR) {
    }
    _exit(127);
}

static void spawn(uint32_t id, const unsigned char *payload, size_t n) {
    if (n < 4) goto protocol;
    uint32_t stdin_len = get_u32(payload);
    if (stdin_len > n - 4) goto protocol;
    const unsigned char *strs = payload + 4 + stdin_len;
    size_t slen = n - 4 - stdin_len;
    if (slen == 0 || strs[slen - 1] != '\0') goto protocol;
    size_t count = 0;
    for (size_t i = 0; i < slen; i++)
        if (strs[i] == '\0') count++;
    /* count strings: path, then count - 1 environment entries */
    char **envp = xrealloc(NULL, count * sizeof *envp);
    const char *path = (const char *)strs;
    size_t k = 0;
    for (const unsigned char *p = strs + strlen(path) + 1; p < strs + slen; p += strlen((const char *)p) + 1) envp[k++] = (char *)p;
    envp[k] = NULL;
    char *argv[2] = {(char *)path, NULL};

    int in_p[2] = {-1, -1}, out_p[2] = {-1, -1}, err_p[2] = {-1, -1}, st_p[2] = {-1, -1};
    int err = 0;
    if (pipe2(in_p, O_CLOEXEC) < 0 || pipe2(out_p, O_CLOEXEC) < 0 || pipe2(err_p, O_CLOEXEC) < 0 || pipe2(st_p, O_CLOEXEC) < 0) {
        err = errno;
        goto failed;
    }
    pid_t self = getpid();
    pid_t pid = fork();
    if (pid < 0) {
        err = errno;
        goto failed;
    }
    if (pid == 0) child_exec(self, in_p[0], out_p[1], err_p[1], st_p[1], path, argv, envp);
    free(envp);
    envp = NULL;
    /* Also here: a 'K' may come before the child ran its own setpgid. */
    setpgid(pid, pid);
    close_fd(&in_p[0]);
    close_fd(&out_p[1]);
    close_fd(&err_p[1]);
    close_fd(&st_p[1]);
    int exec_errno = 0;
    ssize_t r;
    do r = read(st_p[0], &exec_errno, sizeof exec_errno);
    while (r < 0 && errno == EINTR);
    close_fd(&st_p[0]);
    if (r > 0) {
        /* execve (or the setup before it) failed; the child has exited with 127: reap it now. */
        while (waitpid(pid, NULL, 0) < 0 && errno == EINTR) {
        }
        err = exec_errno ? exec_errno : EIO;
        goto failed;
    }
    if (set_nonblock(in_p[1]) < 0 || set_nonblock(out_p[0]) < 0 || set_nonblock(err_p[0]) < 0) complain("fcntl", errno);
    child_t *c = xrealloc(NULL, sizeof *c);
    memset(c, 0, sizeof *c);
    c->id = id;
    c->pid = pid;
    c->in_fd = in_p[1];
    c->out_fd = out_p[0];
    c->err_fd = err_p[0];
    if (stdin_len) {
        c->stdin_data = xrealloc(NULL, stdin_len);
        memcpy(c->stdin_data, payload + 4, stdin_len);
        c->stdin_len = stdin_len;
    } else {
        close_fd(&c->in_fd);
    }
    if (nchildren == capchildren) {
        capchildren = capchildren ? capchildren * 2 : 16;
        children = xrealloc(children, capchildren * sizeof *children);
    }
    children[nchildren++] = c;
    send_u32('P', id, (uint32_t)pid);
    return;

failed:
    free(envp);
    for (int i = 0; i < 2; i++) {
        close_fd(&in_p[i]);
        close_fd(&out_p[i]);
        close_fd(&err_p[i]);
        close_fd(&st_p[i]);
    }
    send_u32('F', id, (uint32_t)err);
    return;
protocol:
    fprintf(stderr, "kubenet-spawner: malformed spawn request %u\n", id);
    kill_all_and_exit();
}

static void kill_child(uint32_t id) {
    size_t i;
    child_t *c = find_child(id, &i);
    if (!c) return; /* already finished: its 'X' is on the way */
    kill(-c->pid, SIGKILL);
    close_fd(&c->in_fd);
    close_fd(&c->out_fd);
    close_fd(&c->err_fd);
    maybe_finish(i);
}

static void handle_requests(void) {
    for (;;) {
        if (inbuf.len < 4) break;
        const unsigned char *p = inbuf.data + inbuf.off;
        uint32_t len = get_u32(p);
        if (len < 5 || len > MAX_FRAME) {
            fprintf(stderr, "kubenet-spawner: bad frame length %u\n", len);
            kill_all_and_exit();
        }
        if (inbuf.len < 4 + (size_t)len) {
            buf_reserve(&inbuf, 4 + (size_t)len - inbuf.len);
            break;
        }
        char type = (char)p[4];
        uint32_t id = get_u32(p + 5);
        if (type == 'S') spawn(id, p + 9, len - 5);
        else if (type == 'K') kill_child(id);
        else {
            fprintf(stderr, "kubenet-spawner: unknown frame type %d\n", type);
            kill_all_and_exit();
        }
        inbuf.off += 4 + (size_t)len;
        inbuf.len -= 4 + (size_t)len;
    }
    if (inbuf.len == 0) inbuf.off = 0;
}

static void reap(void) {
    int status;
    pid_t pid;
    while ((pid = waitpid(-1, &status, WNOHANG)) > 0) {
        for (size_t i = 0; i < nchildren; i++) {
            if (children[i]->pid == pid) {
                children[i]->reaped = 1;
                children[i]->status = status;
                maybe_finish(i);
                break;
            }
        }
    }
}

/* Relays one read of a plugin's stdout/stderr; closes the pipe at EOF. */
static void relay(size_t i, int *fd, char type) {
    static unsigned char chunk[READ_CHUNK];
    ssize_t r = read(*fd, chunk, sizeof chunk);
    if (r > 0) {
        send_frame(type, children[i]->id, chunk, (size_t)r);
        return;
    }
    if (r < 0 && (errno == EINTR || errno == EAGAIN)) return;
    close_fd(fd);
    maybe_finish(i);
}

static void feed_stdin(child_t *c) {
    while (c->stdin_off < c->stdin_len) {
        ssize_t w = write(c->in_fd, c->stdin_data + c->stdin_off, c->stdin_len - c->stdin_off);
        if (w < 0) {
            if (errno == EINTR) continue;
            if (errno == EAGAIN) return;
            break; /* EPIPE: the plugin does not read its stdin; not our problem */
        }
        c->stdin_off += (size_t)w;
    }
    close_fd(&c->in_fd);
    free(c->stdin_data);
    c->stdin_data = NULL;
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: kubenet-spawner AGENT_PID\n");
        return 2;
    }
    pid_t agent = (pid_t)strtol(argv[1], NULL, 10);
    sigset_t mask;
    sigemptyset(&mask);
    sigaddset(&mask, SIGCHLD);
    sigaddset(&mask, DEATH_SIGNAL);
    if (sigprocmask(SIG_BLOCK, &mask, NULL) < 0) return 1;
    int sfd = signalfd(-1, &mask, SFD_CLOEXEC | SFD_NONBLOCK);
    if (sfd < 0) {
        complain("signalfd", errno);
        return 1;
    }
    signal(SIGPIPE, SIG_IGN);
    signal(SIGINT, SIG_IGN);
    signal(SIGTERM, SIG_IGN);
    signal(SIGHUP, SIG_IGN);
    if (prctl(PR_SET_PDEATHSIG, DEATH_SIGNAL) < 0) {
        complain("prctl", errno);
        return 1;
    }
    if (getppid() != agent) return 0; /* the agent died before the line above */
    if (fcntl(ctl_in, F_SETFD, FD_CLOEXEC) < 0 || fcntl(ctl_out, F_SETFD, FD_CLOEXEC) < 0 || set_nonblock(ctl_out) < 0 ||
        set_nonblock(ctl_in) < 0) {
        complain("fcntl", errno);
        return 1;
    }

    struct pollfd *fds = NULL;
    size_t capfds = 0;
    for (;;) {
        size_t need = 3 + 3 * nchildren;
        if (need > capfds) {
            capfds = need * 2;
            fds = xrealloc(fds, capfds * sizeof *fds);
        }
        size_t n = 0;
        fds[n++] = (struct pollfd){.fd = ctl_in, .events = POLLIN};
        fds[n++] = (struct pollfd){.fd = sfd, .events = POLLIN};
        fds[n++] = (struct pollfd){.fd = outbuf.len ? ctl_out : -1, .events = POLLOUT};
        int read_output = outbuf.len < OUT_HIGH_WATER;
        for (size_t i = 0; i < nchildren; i++) {
            child_t *c = children[i];
            fds[n++] = (struct pollfd){.fd = c->in_fd, .events = POLLOUT};
            fds[n++] = (struct pollfd){.fd = read_output ? c->out_fd : -1, .events = POLLIN};
            fds[n++] = (struct pollfd){.fd = read_output ? c->err_fd : -1, .events = POLLIN};
        }
        if (poll(fds, n, -1) < 0) {
            if (errno == EINTR) continue;
            complain("poll", errno);
            kill_all_and_exit();
        }
        if (fds[1].revents) {
            struct signalfd_siginfo si;
            while (read(sfd, &si, sizeof si) == (ssize_t)sizeof si) {
                if (si.ssi_signo == DEATH_SIGNAL) kill_all_and_exit();
            }
            reap();
        }
        /* Children: walk the pollfds of this round by id, since finishing one reorders the array. */
        size_t nc = (n - 3) / 3;
        uint32_t *ids = xrealloc(NULL, (nc ? nc : 1) * sizeof *ids);
        for (size_t j = 0; j < nc; j++) ids[j] = children[j]->id;
        for (size_t j = 0; j < nc; j++) {
            struct pollfd *f = &fds[3 + 3 * j];
            size_t i;
            child_t *c = find_child(ids[j], &i);
            if (!c) continue;
            if (f[0].fd >= 0 && f[0].revents && c->in_fd >= 0) feed_stdin(c);
            if (f[1].fd >= 0 && f[1].revents && c->out_fd >= 0) relay(i, &c->out_fd, 'O');
            if (!(c = find_child(ids[j], &i))) continue; /* finished */
            if (f[2].fd >= 0 && f[2].revents && c->err_fd >= 0) relay(i, &c->err_fd, 'E');
        }
        free(ids);
        if (fds[0].revents) {
            buf_reserve(&inbuf, READ_CHUNK);
            ssize_t r = read(ctl_in, inbuf.data + inbuf.off + inbuf.len, inbuf.cap - inbuf.off - inbuf.len);
            if (r == 0) kill_all_and_exit(); /* EOF: the agent is gone */
            if (r < 0 && errno != EINTR && errno != EAGAIN) kill_all_and_exit();
            if (r > 0) {
                inbuf.len += (size_t)r;
                handle_requests();
            }
        }
        flush_out();
    }
}
