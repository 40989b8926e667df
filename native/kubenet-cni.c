/*
 * kubenet-cni: the CNI binary container runtimes exec as <cni-bin-dir>/kubenet.
 *
 * It forwards one CNI call to the kubenet node agent over a unix socket and relays the answer.
 * The protocol (mirrored for the agent in src/daemon/protocol.ts):
 *
 *   POST /v1/cni HTTP/1.1
 *   Host: kubenet
 *   Content-Type: application/json
 *   Content-Length: N
 *   Connection: close
 *
 *   {"env":{"CNI_COMMAND":"ADD",...only the CNI_* variables that are set...},"stdin":"<raw config>"}
 *
 *   200           -> body printed to stdout, exit 0 (empty body: nothing printed)
 *   other status  -> body (a CNI error object) printed to stdout, exit 1
 *   no agent, timeout, garbled answer -> a CNI error object with code 11 (try again later), exit 1
 *
 * Socket: top-level "socket" string of the network config on stdin, else $KUBENET_SOCKET,
 * else /run/kubenet/kubenet.sock. Timeout for the whole exchange: $KUBENET_CNI_TIMEOUT_SECONDS
 * (default 120). VERSION is answered locally without touching the socket.
 *
 * IPAM mode: exec'd under the name `kubenet-ipam` (hack/build-native.sh links it as
 * native/build/ipam/kubenet-ipam), it is the IPAM plugin of the agent's own bridge config. The
 * agent starts the reference host-local ADD for a pod itself, next to the bridge plugin's exec,
 * and this answers the bridge's IPAM ADD with that result: `POST /v1/ipam` with the same body,
 * to the socket named by the bridge config's top-level "socket". Every other command (DEL,
 * CHECK, GC, STATUS, VERSION) is host-local's own: this execs host-local (first of $CNI_PATH)
 * with the same environment and the unread stdin.
 *
 * Single file, libc only: node needs ~40 ms to start, this needs ~1 ms (statically linked, as
 * hack/build-native.sh builds it when the C library allows: no dynamic loader at each exec).
 * Build: cc -O2 -static -Wall -Wextra -Werror -o native/build/kubenet-cni native/kubenet-cni.c
 */
#define _GNU_SOURCE
#include <errno.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#define DEFAULT_SOCKET "/run/kubenet/kubenet.sock"
#define IPAM_NAME "kubenet-ipam"
#define IPAM_DELEGATE "host-local"
#define DEFAULT_CNI_VERSION "1.1.0"
#define DEFAULT_TIMEOUT_SECONDS 120L
#define MAX_RESPONSE (64u * 1024u * 1024u)

#define CNI_ERR_INVALID_CONFIG 7
/* what the reference plugins report for an error of their own */
#define CNI_ERR_GENERIC 999
#define CNI_ERR_TRY_AGAIN_LATER 11

static const char VERSION_ANSWER[] =
    "{\"cniVersion\":\"1.1.0\",\"supportedVersions\":"
    "[\"0.1.0\",\"0.2.0\",\"0.3.0\",\"0.3.1\",\"0.4.0\",\"1.0.0\",\"1.1.0\"]}";

/* forwarded in this order, each only when set (an empty value is still forwarded) */
static const char *const CNI_ENV_KEYS[] = {"CNI_COMMAND", "CNI_CONTAINERID", "CNI_NETNS",
                                           "CNI_IFNAME",  "CNI_ARGS",        "CNI_PATH"};

/* ------------------------------------------------------------------------------------------ */
/* growable byte buffer                                                                        */

typedef struct {
    char *data;
    size_t len;
    size_t cap;
} buf_t;

static void die_oom(void) {
    static const char msg[] = "kubenet-cni: out of memory\n";
    ssize_t r = write(2, msg, sizeof msg - 1);
    (void)r;
    _exit(1);
}

/* Makes room for `extra` more bytes plus a NUL; the contents stay NUL-terminated. */
static void buf_reserve(buf_t *b, size_t extra) {
    if (b->len + extra + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 4096;
        while (cap < b->len + extra + 1) {
            if (cap > SIZE_MAX / 2) die_oom();
            cap *= 2;
        }
        char *p = realloc(b->data, cap);
        if (!p) die_oom();
        b->data = p;
        b->cap = cap;
    }
    b->data[b->len] = '\0';
}

static void buf_put(buf_t *b, const char *s, size_t n) {
    buf_reserve(b, n);
    memcpy(b->data + b->len, s, n);
    b->len += n;
    b->data[b->len] = '\0';
}

static void buf_puts(buf_t *b, const char *s) { buf_put(b, s, strlen(s)); }

static void buf_putc(buf_t *b, char c) { buf_put(b, &c, 1); }

/* Appends s as the contents of a JSON string (no quotes). Invalid UTF-8 bytes become \ufffd so
 * the request is always valid JSON; valid UTF-8 passes through byte for byte. */
static void buf_put_json_chars(buf_t *b, const char *s, size_t n) {
    static const char hex[] = "0123456789abcdef";
    const unsigned char *p = (const unsigned char *)s;
    size_t i = 0;
    buf_reserve(b, n + n / 8 + 16);
    while (i < n) {
        unsigned char c = p[i];
        if (c == '"' || c == '\\') {
            buf_putc(b, '\\');
            buf_putc(b, (char)c);
            i++;
        } else if (c < 0x20) {
            switch (c) {
            case '\n': buf_put(b, "\\n", 2); break;
            case '\r': buf_put(b, "\\r", 2); break;
            case '\t': buf_put(b, "\\t", 2); break;
            case '\b': buf_put(b, "\\b", 2); break;
            case '\f': buf_put(b, "\\f", 2); break;
            default: {
                char e[6] = {'\\', 'u', '0', '0', hex[c >> 4], hex[c & 15]};
                buf_put(b, e, 6);
            }
            }
            i++;
        } else if (c < 0x80) {
            /* copy a run of plain ASCII at once */
            size_t j = i;
            while (j < n && p[j] >= 0x20 && p[j] < 0x80 && p[j] != '"' && p[j] != '\\') j++;
            buf_put(b, s + i, j - i);
            i = j;
        } else {
            /* validate one UTF-8 sequence (RFC 3629: no overlongs, no surrogates, <= U+10FFFF) */
            size_t len = 0;
            uint32_t min = 0, cp = 0;
            if (c >= 0xc2 && c <= 0xdf) { len = 2; cp = c & 0x1f; min = 0x80; }
            else if (c >= 0xe0 && c <= 0xef) { len = 3; cp = c & 0x0f; min = 0x800; }
            else if (c >= 0xf0 && c <= 0xf4) { len = 4; cp = c & 0x07; min = 0x10000; }
            int ok = len != 0 && i + len <= n;
            for (size_t k = 1; ok && k < len; k++) {
                if ((p[i + k] & 0xc0) != 0x80) ok = 0;
                else cp = (cp << 6) | (p[i + k] & 0x3f);
            }
            if (ok && (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))) ok = 0;
            if (ok) {
                buf_put(b, s + i, len);
                i += len;
            } else {
                buf_put(b, "\\ufffd", 6);
                i++;
            }
        }
    }
}

static void buf_put_json_string(buf_t *b, const char *s, size_t n) {
    buf_putc(b, '"');
    buf_put_json_chars(b, s, n);
    buf_putc(b, '"');
}

/* ------------------------------------------------------------------------------------------ */
/* a small JSON scanner: finds a top-level string member of an object, skipping everything else */

typedef struct {
    const unsigned char *p;
    const unsigned char *end;
} scan_t;

enum { JSON_ABSENT = 0, JSON_STRING = 1, JSON_NOT_STRING = 2, JSON_MALFORMED = -1 };

static void skip_ws(scan_t *s) {
    while (s->p < s->end && (*s->p == ' ' || *s->p == '\t' || *s->p == '\n' || *s->p == '\r')) s->p++;
}

static int hex4(const unsigned char *p, uint32_t *out) {
    uint32_t v = 0;
    for (int i = 0; i < 4; i++) {
        unsigned char c = p[i];
        v <<= 4;
        if (c >= '0' && c <= '9') v |= (uint32_t)(c - '0');
        else if (c >= 'a' && c <= 'f') v |= (uint32_t)(c - 'a' + 10);
        else if (c >= 'A' && c <= 'F') v |= (uint32_t)(c - 'A' + 10);
        else return -1;
    }
    *out = v;
    return 0;
}

static void put_utf8(buf_t *b, uint32_t cp) {
    char u[4];
    if (cp < 0x80) {
        u[0] = (char)cp;
        buf_put(b, u, 1);
    } else if (cp < 0x800) {
        u[0] = (char)(0xc0 | (cp >> 6));
        u[1] = (char)(0x80 | (cp & 0x3f));
        buf_put(b, u, 2);
    } else if (cp < 0x10000) {
        u[0] = (char)(0xe0 | (cp >> 12));
        u[1] = (char)(0x80 | ((cp >> 6) & 0x3f));
        u[2] = (char)(0x80 | (cp & 0x3f));
        buf_put(b, u, 3);
    } else {
        u[0] = (char)(0xf0 | (cp >> 18));
        u[1] = (char)(0x80 | ((cp >> 12) & 0x3f));
        u[2] = (char)(0x80 | ((cp >> 6) & 0x3f));
        u[3] = (char)(0x80 | (cp & 0x3f));
        buf_put(b, u, 4);
    }
}

/* At an opening quote: consumes the string. Decodes it into out when out is not NULL
 * (escapes resolved, surrogate pairs joined, lone surrogates as U+FFFD). */
static int scan_string(scan_t *s, buf_t *out) {
    if (s->p >= s->end || *s->p != '"') return -1;
    s->p++;
    while (s->p < s->end) {
        unsigned char c = *s->p;
        if (c == '"') {
            s->p++;
            return 0;
        }
        if (c < 0x20) return -1; /* raw control characters are not allowed in JSON strings */
        if (c != '\\') {
            const unsigned char *start = s->p;
            while (s->p < s->end && *s->p != '"' && *s->p != '\\' && *s->p >= 0x20) s->p++;
            if (out) buf_put(out, (const char *)start, (size_t)(s->p - start));
            continue;
        }
        if (s->end - s->p < 2) return -1;
        unsigned char e = s->p[1];
        s->p += 2;
        char d;
        switch (e) {
        case '"': d = '"'; break;
        case '\\': d = '\\'; break;
        case '/': d = '/'; break;
        case 'b': d = '\b'; break;
        case 'f': d = '\f'; break;
        case 'n': d = '\n'; break;
        case 'r': d = '\r'; break;
        case 't': d = '\t'; break;
        case 'u': {
            uint32_t cp;
            if (s->end - s->p < 4 || hex4(s->p, &cp) < 0) return -1;
            s->p += 4;
            if (cp >= 0xd800 && cp <= 0xdbff) {
                uint32_t lo;
                if (s->end - s->p >= 6 && s->p[0] == '\\' && s->p[1] == 'u' && hex4(s->p + 2, &lo) == 0 &&
                    lo >= 0xdc00 && lo <= 0xdfff) {
                    s->p += 6;
                    cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
                } else {
                    cp = 0xfffd;
                }
            } else if (cp >= 0xdc00 && cp <= 0xdfff) {
                cp = 0xfffd;
            }
            if (out) put_utf8(out, cp);
            continue;
        }
        default: return -1;
        }
        if (out) buf_putc(out, d);
    }
    return -1; /* unterminated */
}

/* Skips one value of any kind. Containers are skipped iteratively by bracket depth, with
 * strings consumed whole so brackets and quotes inside them do not count. */
static int skip_value(scan_t *s) {
    skip_ws(s);
    if (s->p >= s->end) return -1;
    unsigned char c = *s->p;
    if (c == '"') return scan_string(s, NULL);
    if (c == '{' || c == '[') {
        /* a stack of open brackets so "[}" is refused; depth beyond the stack is still skipped */
        char stack[256];
        size_t depth = 0;
        do {
            c = *s->p;
            if (c == '"') {
                if (scan_string(s, NULL) < 0) return -1;
                continue;
            }
            if (c == '{' || c == '[') {
                if (depth < sizeof stack) stack[depth] = (char)c;
                depth++;
            } else if (c == '}' || c == ']') {
                if (depth == 0) return -1;
                depth--;
                if (depth < sizeof stack && stack[depth] != (c == '}' ? '{' : '[')) return -1;
            }
            s->p++;
        } while (depth > 0 && s->p < s->end);
        return depth == 0 ? 0 : -1;
    }
    /* true, false, null */
    static const char *const literals[] = {"true", "false", "null"};
    for (size_t i = 0; i < 3; i++) {
        size_t n = strlen(literals[i]);
        if ((size_t)(s->end - s->p) >= n && memcmp(s->p, literals[i], n) == 0) {
            s->p += n;
            return 0;
        }
    }
    /* a number: the characters it may contain (the exact grammar does not matter for skipping) */
    const unsigned char *start = s->p;
    while (s->p < s->end) {
        c = *s->p;
        if ((c >= '0' && c <= '9') || c == '-' || c == '+' || c == '.' || c == 'e' || c == 'E')
            s->p++;
        else
            break;
    }
    return s->p > start ? 0 : -1;
}

/*
 * Looks up the top-level member `key` of the JSON object in doc[0..len).
 * JSON_STRING: *out holds the decoded value (malloc'd, NUL-terminated, *outlen bytes).
 * JSON_NOT_STRING: the member exists but is not a string. JSON_ABSENT: no such member.
 * JSON_MALFORMED: doc is not a JSON object (then nothing found in it is trusted).
 * Duplicate members: the last one wins, as with JSON.parse and Go's encoding/json.
 */
static int json_top_string(const char *doc, size_t len, const char *key, char **out, size_t *outlen) {
    scan_t s = {(const unsigned char *)doc, (const unsigned char *)doc + len};
    buf_t k = {0}, v = {0};
    int result = JSON_ABSENT;
    *out = NULL;
    *outlen = 0;
    skip_ws(&s);
    if (s.p >= s.end || *s.p != '{') goto malformed;
    s.p++;
    skip_ws(&s);
    if (s.p < s.end && *s.p == '}') {
        s.p++;
        goto done;
    }
    for (;;) {
        skip_ws(&s);
        k.len = 0;
        if (scan_string(&s, &k) < 0) goto malformed;
        skip_ws(&s);
        if (s.p >= s.end || *s.p != ':') goto malformed;
        s.p++;
        skip_ws(&s);
        if (s.p >= s.end) goto malformed;
        int match = k.data && k.len == strlen(key) && memcmp(k.data, key, k.len) == 0;
        if (match && *s.p == '"') {
            v.len = 0;
            buf_reserve(&v, 0);
            if (scan_string(&s, &v) < 0) goto malformed;
            result = JSON_STRING;
        } else {
            if (skip_value(&s) < 0) goto malformed;
            if (match) result = JSON_NOT_STRING;
        }
        skip_ws(&s);
        if (s.p >= s.end) goto malformed;
        if (*s.p == ',') {
            s.p++;
            continue;
        }
        if (*s.p == '}') {
            s.p++;
            break;
        }
        goto malformed;
    }
done:
    skip_ws(&s);
    if (s.p != s.end) goto malformed;
    free(k.data);
    if (result == JSON_STRING) {
        *out = v.data;
        *outlen = v.len;
    } else {
        free(v.data);
    }
    return result;
malformed:
    free(k.data);
    free(v.data);
    return JSON_MALFORMED;
}

/* ------------------------------------------------------------------------------------------ */
/* output                                                                                      */

static int write_all(int fd, const char *p, size_t n) {
    while (n > 0) {
        ssize_t w = write(fd, p, n);
        if (w < 0) {
            if (errno == EINTR) continue;
            return -1;
        }
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

static const char *g_cni_version = DEFAULT_CNI_VERSION;

/* Prints a CNI error object on stdout and exits 1. */
static void cni_error_exit(int code, const char *msg, const char *details) {
    buf_t b = {0};
    char num[16];
    buf_puts(&b, "{\"cniVersion\":");
    buf_put_json_string(&b, g_cni_version, strlen(g_cni_version));
    snprintf(num, sizeof num, "%d", code);
    buf_puts(&b, ",\"code\":");
    buf_puts(&b, num);
    buf_puts(&b, ",\"msg\":");
    buf_put_json_string(&b, msg, strlen(msg));
    if (details) {
        buf_puts(&b, ",\"details\":");
        buf_put_json_string(&b, details, strlen(details));
    }
    buf_puts(&b, "}\n");
    (void)write_all(1, b.data, b.len);
    exit(1);
}

static const char *g_socket_path = DEFAULT_SOCKET;

static void unreachable_exit(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void unreachable_exit(const char *fmt, ...) {
    char msg[512], details[512];
    va_list ap;
    snprintf(msg, sizeof msg, "kubenet agent unreachable at %s", g_socket_path);
    va_start(ap, fmt);
    vsnprintf(details, sizeof details, fmt, ap);
    va_end(ap);
    cni_error_exit(CNI_ERR_TRY_AGAIN_LATER, msg, details);
}

/* ------------------------------------------------------------------------------------------ */
/* HTTP response parsing                                                                       */

enum { RESP_NEED_MORE = 0, RESP_COMPLETE = 1, RESP_BAD = -1 };

typedef struct {
    int status;
    const char *body; /* for chunked bodies: points into `decoded` */
    size_t body_len;
    buf_t decoded;
    const char *why; /* set when RESP_BAD */
} response_t;

/* Finds the end of the line starting at p (LF, optionally preceded by CR). Returns a pointer
 * past the LF and sets *line_len to the length without CR/LF, or NULL when incomplete. */
static const char *next_line(const char *p, const char *end, size_t *line_len) {
    const char *nl = memchr(p, '\n', (size_t)(end - p));
    if (!nl) return NULL;
    size_t n = (size_t)(nl - p);
    if (n > 0 && p[n - 1] == '\r') n--;
    *line_len = n;
    return nl + 1;
}

static int parse_size(const char *p, size_t n, int base, size_t *out) {
    size_t v = 0;
    if (n == 0) return -1;
    for (size_t i = 0; i < n; i++) {
        int d;
        char c = p[i];
        if (c >= '0' && c <= '9') d = c - '0';
        else if (base == 16 && c >= 'a' && c <= 'f') d = c - 'a' + 10;
        else if (base == 16 && c >= 'A' && c <= 'F') d = c - 'A' + 10;
        else return -1;
        if (v > (MAX_RESPONSE - (size_t)d) / (size_t)base) return -1;
        v = v * (size_t)base + (size_t)d;
    }
    *out = v;
    return 0;
}

static int header_is(const char *line, size_t n, const char *name, const char **value, size_t *vlen) {
    size_t k = strlen(name);
    if (n <= k || line[k] != ':' || strncasecmp(line, name, k) != 0) return 0;
    const char *v = line + k + 1, *e = line + n;
    while (v < e && (*v == ' ' || *v == '\t')) v++;
    while (e > v && (e[-1] == ' ' || e[-1] == '\t')) e--;
    *value = v;
    *vlen = (size_t)(e - v);
    return 1;
}

/* Decodes a chunked body starting at p. */
static int parse_chunked(const char *p, const char *end, response_t *r) {
    r->decoded.len = 0;
    buf_reserve(&r->decoded, 0);
    for (;;) {
        size_t n, size;
        const char *next = next_line(p, end, &n);
        if (!next) return RESP_NEED_MORE;
        const char *semi = memchr(p, ';', n); /* chunk extensions are ignored */
        size_t digits = semi ? (size_t)(semi - p) : n;
        while (digits > 0 && (p[digits - 1] == ' ' || p[digits - 1] == '\t')) digits--;
        if (parse_size(p, digits, 16, &size) < 0) {
            r->why = "malformed chunk size in response";
            return RESP_BAD;
        }
        p = next;
        if (size == 0) {
            /* trailers, then an empty line */
            for (;;) {
                next = next_line(p, end, &n);
                if (!next) return RESP_NEED_MORE;
                p = next;
                if (n == 0) break;
            }
            r->body = r->decoded.data;
            r->body_len = r->decoded.len;
            return RESP_COMPLETE;
        }
        if ((size_t)(end - p) < size) return RESP_NEED_MORE;
        buf_put(&r->decoded, p, size);
        p += size;
        next = next_line(p, end, &n);
        if (!next) return RESP_NEED_MORE;
        if (n != 0) {
            r->why = "malformed chunk terminator in response";
            return RESP_BAD;
        }
        p = next;
    }
}

/* Parses what has been received so far. With eof set, a close-delimited body is complete. */
static int parse_response(const char *data, size_t len, int eof, response_t *r) {
    const char *p = data, *end = data + len;
    for (;;) {
        size_t n;
        const char *next = next_line(p, end, &n);
        if (!next) return RESP_NEED_MORE;
        /* status line: HTTP/1.x SP 3DIGIT [SP reason] */
        if (n < 12 || memcmp(p, "HTTP/1.", 7) != 0 || p[8] != ' ' || p[9] < '1' || p[9] > '5' || p[10] < '0' ||
            p[10] > '9' || p[11] < '0' || p[11] > '9' || (n > 12 && p[12] != ' ')) {
            r->why = "malformed HTTP status line in response";
            return RESP_BAD;
        }
        r->status = (p[9] - '0') * 100 + (p[10] - '0') * 10 + (p[11] - '0');
        p = next;
        int have_length = 0, chunked = 0;
        size_t content_length = 0;
        for (;;) {
            next = next_line(p, end, &n);
            if (!next) return RESP_NEED_MORE;
            const char *line = p;
            p = next;
            if (n == 0) break;
            const char *v;
            size_t vlen;
            if (header_is(line, n, "Content-Length", &v, &vlen)) {
                size_t cl;
                if (parse_size(v, vlen, 10, &cl) < 0 || (have_length && cl != content_length)) {
                    r->why = "malformed Content-Length in response";
                    return RESP_BAD;
                }
                have_length = 1;
                content_length = cl;
            } else if (header_is(line, n, "Transfer-Encoding", &v, &vlen)) {
                /* only "chunked" is meaningful here; it must be the last coding */
                if (vlen >= 7 && strncasecmp(v + vlen - 7, "chunked", 7) == 0) chunked = 1;
                else {
                    r->why = "unsupported Transfer-Encoding in response";
                    return RESP_BAD;
                }
            }
        }
        if (r->status < 200) continue; /* interim 1xx response: the real one follows */
        if (chunked) return parse_chunked(p, end, r);
        if (have_length) {
            if ((size_t)(end - p) < content_length) return RESP_NEED_MORE;
            r->body = p;
            r->body_len = content_length;
            return RESP_COMPLETE;
        }
        if (!eof) return RESP_NEED_MORE;
        r->body = p;
        r->body_len = (size_t)(end - p);
        return RESP_COMPLETE;
    }
}

/* ------------------------------------------------------------------------------------------ */
/* I/O with one deadline for the whole exchange                                                */

static struct timespec g_deadline;
static long g_timeout_seconds = DEFAULT_TIMEOUT_SECONDS;

/* Sets SO_RCVTIMEO/SO_SNDTIMEO to the time left; returns -1 (errno ETIMEDOUT) when none is. */
static int arm_timeouts(int fd) {
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    long long left_us = (long long)(g_deadline.tv_sec - now.tv_sec) * 1000000LL + (g_deadline.tv_nsec - now.tv_nsec) / 1000;
    if (left_us <= 0) {
        errno = ETIMEDOUT;
        return -1;
    }
    struct timeval tv = {.tv_sec = (time_t)(left_us / 1000000LL), .tv_usec = (suseconds_t)(left_us % 1000000LL)};
    if (setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv) < 0) return -1;
    if (setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv) < 0) return -1;
    return 0;
}

static const char *io_error(int err) {
    static char text[128];
    if (err == EAGAIN || err == EWOULDBLOCK || err == ETIMEDOUT || err == EINPROGRESS) {
        snprintf(text, sizeof text, "timed out after %ld s (KUBENET_CNI_TIMEOUT_SECONDS)", g_timeout_seconds);
        return text;
    }
    return strerror(err);
}

static long timeout_from_env(void) {
    const char *t = getenv("KUBENET_CNI_TIMEOUT_SECONDS");
    if (!t || !*t) return DEFAULT_TIMEOUT_SECONDS;
    char *e;
    errno = 0;
    long v = strtol(t, &e, 10);
    if (errno || *e || v <= 0 || v > 86400) return DEFAULT_TIMEOUT_SECONDS;
    return v;
}

/* ------------------------------------------------------------------------------------------ */

static void read_stdin(buf_t *in) {
    for (;;) {
        buf_reserve(in, 65536);
        ssize_t r = read(0, in->data + in->len, in->cap - in->len - 1);
        if (r < 0) {
            if (errno == EINTR) continue;
            if (errno == EBADF) break; /* no stdin at all: an empty config */
            cni_error_exit(CNI_ERR_INVALID_CONFIG, "kubenet: cannot read the network config from stdin", strerror(errno));
        }
        if (r == 0) break;
        in->len += (size_t)r;
        in->data[in->len] = '\0';
    }
}

/* IPAM mode, any command but ADD: becomes host-local, found in $CNI_PATH (stdin still unread). */
static void exec_delegate(void) {
    const char *path = getenv("CNI_PATH");
    char file[4096];
    int last_err = ENOENT;
    for (const char *p = path ? path : ""; *p;) {
        size_t n = strcspn(p, ":");
        if (n > 0 && n + 1 + sizeof IPAM_DELEGATE < sizeof file) {
            memcpy(file, p, n);
            file[n] = '/';
            memcpy(file + n + 1, IPAM_DELEGATE, sizeof IPAM_DELEGATE);
            char *const argv[] = {file, NULL};
            execv(file, argv);
            if (errno != ENOENT) last_err = errno;
        }
        p += n;
        if (*p == ':') p++;
    }
    char details[512];
    snprintf(details, sizeof details, "CNI_PATH=%s: %s", path ? path : "(unset)", strerror(last_err));
    cni_error_exit(CNI_ERR_GENERIC, IPAM_NAME ": cannot run " IPAM_DELEGATE, details);
}

int main(int argc, char **argv) {
    signal(SIGPIPE, SIG_IGN);

    const char *self = argc > 0 && argv[0] ? strrchr(argv[0], '/') : NULL;
    self = self ? self + 1 : (argc > 0 && argv[0] ? argv[0] : "");
    const int ipam_mode = strcmp(self, IPAM_NAME) == 0;
    const char *command = getenv("CNI_COMMAND");
    if (ipam_mode && !(command && strcmp(command, "ADD") == 0)) exec_delegate();

    buf_t in = {0};
    read_stdin(&in);
    buf_reserve(&in, 0);

    char *value;
    size_t value_len;
    if (json_top_string(in.data, in.len, "cniVersion", &value, &value_len) == JSON_STRING) {
        if (strlen(value) == value_len && value_len > 0 && value_len < 64) g_cni_version = value;
        else free(value);
    }

    if (command && strcmp(command, "VERSION") == 0) {
        if (write_all(1, VERSION_ANSWER, sizeof VERSION_ANSWER - 1) < 0 || write_all(1, "\n", 1) < 0) return 1;
        return 0;
    }

    int found = json_top_string(in.data, in.len, "socket", &value, &value_len);
    if (found == JSON_STRING && value_len > 0 && strlen(value) == value_len) {
        g_socket_path = value;
    } else if (found == JSON_STRING || found == JSON_NOT_STRING) {
        cni_error_exit(CNI_ERR_INVALID_CONFIG, "kubenet: invalid \"socket\" in the network config",
                       "want a non-empty string: the path of the kubenet agent's unix socket");
    } else {
        const char *env = getenv("KUBENET_SOCKET");
        if (env && *env) g_socket_path = env;
    }
    g_timeout_seconds = timeout_from_env();

    /* request body */
    buf_t body = {0};
    buf_reserve(&body, in.len + in.len / 8 + 1024);
    buf_puts(&body, "{\"env\":{");
    int first = 1;
    for (size_t i = 0; i < sizeof CNI_ENV_KEYS / sizeof CNI_ENV_KEYS[0]; i++) {
        const char *v = getenv(CNI_ENV_KEYS[i]);
        if (!v) continue;
        if (!first) buf_putc(&body, ',');
        first = 0;
        buf_put_json_string(&body, CNI_ENV_KEYS[i], strlen(CNI_ENV_KEYS[i]));
        buf_putc(&body, ':');
        buf_put_json_string(&body, v, strlen(v));
    }
    buf_puts(&body, "},\"stdin\":");
    buf_put_json_string(&body, in.data, in.len);
    buf_putc(&body, '}');
    free(in.data);

    char head[256];
    int head_len = snprintf(head, sizeof head,
                            "POST %s HTTP/1.1\r\n"
                            "Host: kubenet\r\n"
                            "Content-Type: application/json\r\n"
                            "Content-Length: %zu\r\n"
                            "Connection: close\r\n"
                            "\r\n",
                            ipam_mode ? "/v1/ipam" : "/v1/cni", body.len);

    clock_gettime(CLOCK_MONOTONIC, &g_deadline);
    g_deadline.tv_sec += g_timeout_seconds;

    struct sockaddr_un addr;
    memset(&addr, 0, sizeof addr);
    addr.sun_family = AF_UNIX;
    if (strlen(g_socket_path) >= sizeof addr.sun_path) unreachable_exit("%s", strerror(ENAMETOOLONG));
    memcpy(addr.sun_path, g_socket_path, strlen(g_socket_path) + 1);

    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) unreachable_exit("%s", strerror(errno));
    if (arm_timeouts(fd) < 0) unreachable_exit("%s", io_error(errno));
    while (connect(fd, (struct sockaddr *)&addr, sizeof addr) < 0) {
        if (errno == EINTR) continue;
        unreachable_exit("%s", io_error(errno));
    }

    /* send head and body, in one buffer so that they leave in one send() (the agent then reads
     * the whole request at once instead of the head first and the body on a later wakeup). If the
     * agent stops reading (EPIPE, ECONNRESET) it may still have answered, e.g. with an error about
     * the request: read that answer before giving up. */
    buf_t req = {0};
    buf_reserve(&req, (size_t)head_len + body.len + 1);
    buf_put(&req, head, (size_t)head_len);
    buf_put(&req, body.data, body.len);
    free(body.data);
    int send_err = 0;
    {
        const char *p = req.data;
        size_t n = req.len;
        while (n > 0) {
            if (arm_timeouts(fd) < 0) unreachable_exit("sending the request: %s", io_error(errno));
            ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
            if (w < 0) {
                if (errno == EINTR) continue;
                if (errno != EPIPE && errno != ECONNRESET) unreachable_exit("sending the request: %s", io_error(errno));
                send_err = errno;
                break;
            }
            p += w;
            n -= (size_t)w;
        }
    }
    free(req.data);

    /* receive until the response is complete or the agent closes */
    buf_t resp = {0};
    response_t r;
    memset(&r, 0, sizeof r);
    int state = RESP_NEED_MORE;
    for (;;) {
        if (arm_timeouts(fd) < 0) unreachable_exit("waiting for the response: %s", io_error(errno));
        buf_reserve(&resp, 65536);
        ssize_t got = recv(fd, resp.data + resp.len, resp.cap - resp.len - 1, 0);
        if (got < 0) {
            if (errno == EINTR) continue;
            if (send_err) unreachable_exit("sending the request: %s", strerror(send_err));
            unreachable_exit("waiting for the response: %s", io_error(errno));
        }
        if (got == 0) {
            state = parse_response(resp.data, resp.len, 1, &r);
            break;
        }
        resp.len += (size_t)got;
        resp.data[resp.len] = '\0';
        if (resp.len > MAX_RESPONSE) unreachable_exit("response larger than %u bytes", MAX_RESPONSE);
        state = parse_response(resp.data, resp.len, 0, &r);
        if (state != RESP_NEED_MORE) break;
    }
    close(fd);

    if (state == RESP_BAD) unreachable_exit("%s", r.why ? r.why : "malformed response");
    if (state != RESP_COMPLETE) {
        if (send_err) unreachable_exit("sending the request: %s", strerror(send_err));
        if (resp.len == 0) unreachable_exit("connection closed without a response");
        unreachable_exit("connection closed before the response was complete");
    }

    if (r.status == 200) {
        if (write_all(1, r.body, r.body_len) < 0) return 1;
        return 0;
    }
    if (r.body_len == 0) {
        char msg[128];
        snprintf(msg, sizeof msg, "kubenet agent answered HTTP %d without a CNI error object", r.status);
        cni_error_exit(999, msg, NULL);
    }
    (void)write_all(1, r.body, r.body_len);
    return 1;
}
