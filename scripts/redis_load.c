/* redis_load: the Redis side of scripts/bench_peers.py — SET + WAIT round trips at a given concurrency.
 *
 *   redis_load HOST PORT CONNECTIONS BATCH SECONDS SIZE [THREADS]
 *
 * Theory of operation. THREADS (default 1) threads each run one epoll loop over their share of the
 * CONNECTIONS (round robin), as redis-benchmark's event loop does: a load generator with a thread
 * per connection put 64 threads on this 2-core machine beside Redis and took the CPU Redis needed
 * (issue 18: Redis measured 20-35 % below what it does). Each connection keeps exactly one round
 * trip in flight: BATCH `SET key <SIZE bytes>` and one `WAIT 1 1000`, written pipelined in one
 * buffer, then the BATCH + 1 replies read back. The SETs count as acknowledged only when that WAIT
 * reports at least one replica (Redis' "in the replica's memory", as hasvc's SYNC_MASTER with
 * ASYNC_FLUSH); a WAIT answering 0 counts as not replicated, an error reply as an error.
 *
 * Plain non-blocking sockets speaking RESP: every reply to SET and WAIT is one line (`+OK`, `-ERR
 * ...`, `:N`), so the parser only splits lines; any other reply type is a protocol error. Keys are
 * fixed width (`k:CCCCC:SSSS`, connection and a sequence cycling over KEYS_PER_CONNECTION) and
 * patched into the prebuilt request in place, so a round trip costs one write, one or a few reads
 * and no formatting. The clock starts once every connection is open; a round trip under way when
 * SECONDS run out finishes and counts.
 *
 * Prints one JSON object: acknowledged SETs, round trips, seconds, latency percentiles of the
 * round trips in microseconds, round trips WAIT answered with 0 replicas, errors, threads.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define KEYS_PER_CONNECTION 10000  /* keys cycle, so Redis' memory stays bounded (4 digits) */
#define CONNECTIONS_MAX 99999      /* the key's connection field is 5 digits */
#define THREADS_MAX 16
#define REPLY_LINE_MAX 4096        /* a reply line longer than this is a protocol error */
#define EVENTS_MAX 256             /* epoll events taken per wait */

struct connection {
    int fd, index;
    char *request;      /* BATCH SETs and one WAIT, RESP-encoded */
    size_t request_len, sent;
    size_t *key_digits; /* offsets of each SET's 4 sequence digits in request */
    long sequence;
    char in[REPLY_LINE_MAX];
    size_t in_len;
    int replies, failed; /* replies read this round trip; an error reply seen */
    long replicas;       /* WAIT's answer */
    int want_write;      /* EPOLLOUT registered */
    double started;
};

struct worker {
    pthread_t thread;
    struct connection *connections;
    int count;
    long acked, round_trips, not_replicated, errors;
    double *latencies; /* microseconds, one per round trip */
    long capacity;
};

static int batch, size;
static double seconds, deadline;

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

static void put_digits(char *at, long value, int width) {
    for (int i = width - 1; i >= 0; i--, value /= 10) at[i] = '0' + value % 10;
}

/* The request: BATCH x `SET k:CCCCC:SSSS <payload>` then `WAIT 1 1000`, digits patched per trip. */
static void build_request(struct connection *c, const char *payload) {
    static const char wait[] = "*3\r\n$4\r\nWAIT\r\n$1\r\n1\r\n$4\r\n1000\r\n";
    char head[128];
    int head_len = snprintf(head, sizeof head, "*3\r\n$3\r\nSET\r\n$12\r\nk:%05d:0000\r\n$%d\r\n", c->index, size);
    size_t one = head_len + size + 2;
    c->request_len = batch * one + sizeof wait - 1;
    c->request = malloc(c->request_len);
    c->key_digits = malloc(batch * sizeof(size_t));
    char *at = c->request;
    for (int i = 0; i < batch; i++, at += one) {
        memcpy(at, head, head_len);
        memcpy(at + head_len, payload, size);
        memcpy(at + head_len + size, "\r\n", 2);
        c->key_digits[i] = (at - c->request) + strstr(head, "k:") - head + 8;
    }
    memcpy(at, wait, sizeof wait - 1);
}

static void set_events(int epoll, struct connection *c, int want_write) {
    if (c->want_write == want_write) return;
    struct epoll_event event = {.events = EPOLLIN | (want_write ? EPOLLOUT : 0), .data.ptr = c};
    epoll_ctl(epoll, EPOLL_CTL_MOD, c->fd, &event);
    c->want_write = want_write;
}

/* Write what the socket takes; 0 on success (done or waiting for EPOLLOUT), -1 on error. */
static int flush_request(int epoll, struct connection *c) {
    while (c->sent < c->request_len) {
        ssize_t n = write(c->fd, c->request + c->sent, c->request_len - c->sent);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0 && errno == EAGAIN) {
            set_events(epoll, c, 1);
            return 0;
        }
        if (n < 0) {
            perror("redis_load: write");
            return -1;
        }
        c->sent += n;
    }
    set_events(epoll, c, 0);
    return 0;
}

static int start_round_trip(int epoll, struct connection *c) {
    for (int i = 0; i < batch; i++) put_digits(c->request + c->key_digits[i], c->sequence++ % KEYS_PER_CONNECTION, 4);
    c->sent = 0;
    c->replies = 0;
    c->failed = 0;
    c->replicas = 0;
    c->started = now();
    return flush_request(epoll, c);
}

/* The round trip's replies are all in: count it. */
static void finish_round_trip(struct worker *w, struct connection *c) {
    if (w->round_trips == w->capacity) {
        w->capacity = w->capacity ? w->capacity * 2 : 65536;
        w->latencies = realloc(w->latencies, w->capacity * sizeof(double));
    }
    w->latencies[w->round_trips++] = (now() - c->started) * 1e6;
    if (c->failed) w->errors++;
    else if (c->replicas >= 1) w->acked += batch;
    else w->not_replicated++;
}

/* Split the received bytes into reply lines. Returns 1 when the round trip is complete, 0 when
 * more is needed, -1 on a protocol error. */
static int parse_replies(struct connection *c) {
    size_t start = 0;
    char *end;
    while ((end = memchr(c->in + start, '\n', c->in_len - start)) != NULL) {
        char *line = c->in + start;
        size_t length = end - line + 1;
        if (length < 3 || end[-1] != '\r') goto protocol;
        if (c->replies >= batch + 1) goto protocol; /* a reply nobody asked for */
        int is_wait = c->replies == batch;
        if (line[0] == '-') {
            if (!c->failed) fprintf(stderr, "redis_load: %.*s\n", (int)(length - 2), line);
            c->failed = 1;
        } else if (is_wait && line[0] == ':') {
            c->replicas = strtol(line + 1, NULL, 10);
        } else if (is_wait || line[0] != '+') {
            goto protocol;
        }
        c->replies++;
        start += length;
    }
    if (c->in_len - start == sizeof c->in) goto protocol;
    memmove(c->in, c->in + start, c->in_len - start);
    c->in_len -= start;
    if (c->replies == batch + 1 && c->in_len) goto protocol;
    return c->replies == batch + 1;
protocol:
    fprintf(stderr, "redis_load: connection %d: unexpected reply %.*s\n", c->index, (int)(c->in_len < 60 ? c->in_len : 60), c->in);
    return -1;
}

/* Read what is there; 1 = round trip complete, 0 = wait, -1 = error or closed. */
static int receive(struct connection *c) {
    for (;;) {
        ssize_t n = read(c->fd, c->in + c->in_len, sizeof c->in - c->in_len);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0 && errno == EAGAIN) return 0;
        if (n <= 0) {
            fprintf(stderr, "redis_load: connection %d: %s\n", c->index, n == 0 ? "closed by Redis" : strerror(errno));
            return -1;
        }
        size_t asked = sizeof c->in - c->in_len;
        c->in_len += n;
        int done = parse_replies(c);
        if (done != 0) return done;
        if ((size_t)n < asked) return 0; /* drained: wait for epoll rather than a read that says EAGAIN */
    }
}

static void *run(void *argument) {
    struct worker *w = argument;
    int epoll = epoll_create1(0);
    int active = 0;
    for (int i = 0; i < w->count; i++) {
        struct connection *c = &w->connections[i];
        struct epoll_event event = {.events = EPOLLIN, .data.ptr = c};
        epoll_ctl(epoll, EPOLL_CTL_ADD, c->fd, &event);
        if (start_round_trip(epoll, c) == 0) active++;
        else w->errors++, close(c->fd);
    }
    struct epoll_event events[EVENTS_MAX];
    while (active > 0) {
        int ready = epoll_wait(epoll, events, EVENTS_MAX, 1000);
        if (ready < 0 && errno == EINTR) continue;
        for (int i = 0; i < ready; i++) {
            struct connection *c = events[i].data.ptr;
            int state = 0;
            if ((events[i].events & EPOLLOUT) && flush_request(epoll, c) < 0) state = -1;
            if (state == 0 && (events[i].events & (EPOLLIN | EPOLLERR | EPOLLHUP))) state = receive(c);
            if (state == 1) {
                finish_round_trip(w, c);
                if (now() < deadline && start_round_trip(epoll, c) == 0) continue;
            } else if (state == 0) {
                continue;
            } else {
                w->errors++;
            }
            close(c->fd); /* done or failed: closing also removes it from the epoll set */
            active--;
        }
    }
    close(epoll);
    return NULL;
}

static int open_connection(const char *host, const char *port) {
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *found;
    int status = getaddrinfo(host, port, &hints, &found);
    if (status != 0) {
        fprintf(stderr, "redis_load: %s:%s: %s\n", host, port, gai_strerror(status));
        return -1;
    }
    int fd = -1;
    for (struct addrinfo *a = found; a != NULL; a = a->ai_next) {
        fd = socket(a->ai_family, a->ai_socktype, a->ai_protocol);
        if (fd >= 0 && connect(fd, a->ai_addr, a->ai_addrlen) == 0) break;
        if (fd >= 0) close(fd);
        fd = -1;
    }
    freeaddrinfo(found);
    if (fd < 0) {
        fprintf(stderr, "redis_load: connect %s:%s: %s\n", host, port, strerror(errno));
        return -1;
    }
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
    return fd;
}

static int compare(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv) {
    if (argc != 7 && argc != 8) {
        fprintf(stderr, "usage: redis_load HOST PORT CONNECTIONS BATCH SECONDS SIZE [THREADS]\n");
        return 2;
    }
    int connections = atoi(argv[3]);
    batch = atoi(argv[4]);
    seconds = atof(argv[5]);
    size = atoi(argv[6]);
    int threads = argc == 8 ? atoi(argv[7]) : 1;
    if (connections < 1 || connections > CONNECTIONS_MAX || batch < 1 || seconds <= 0 || size < 0 || threads < 1 ||
        threads > THREADS_MAX) {
        fprintf(stderr, "redis_load: need 1 <= CONNECTIONS <= %d, BATCH >= 1, SECONDS > 0, SIZE >= 0, 1 <= THREADS <= %d\n",
                CONNECTIONS_MAX, THREADS_MAX);
        return 2;
    }
    if (threads > connections) threads = connections;
    signal(SIGPIPE, SIG_IGN);
    char *payload = malloc(size + 1);
    for (int i = 0; i < size; i++) payload[i] = 'a' + i % 26;
    struct worker *workers = calloc(threads, sizeof *workers);
    for (int t = 0; t < threads; t++) workers[t].connections = calloc(connections / threads + 1, sizeof(struct connection));
    for (int i = 0; i < connections; i++) {
        struct worker *w = &workers[i % threads];
        struct connection *c = &w->connections[w->count++];
        c->index = i;
        if ((c->fd = open_connection(argv[1], argv[2])) < 0) return 1;
        build_request(c, payload);
    }
    double started = now();
    deadline = started + seconds;
    for (int t = 0; t < threads; t++) pthread_create(&workers[t].thread, NULL, run, &workers[t]);
    long acked = 0, round_trips = 0, not_replicated = 0, errors = 0;
    for (int t = 0; t < threads; t++) {
        pthread_join(workers[t].thread, NULL);
        acked += workers[t].acked;
        round_trips += workers[t].round_trips;
        not_replicated += workers[t].not_replicated;
        errors += workers[t].errors;
    }
    double elapsed = now() - started;
    double *all = malloc((round_trips ? round_trips : 1) * sizeof(double));
    long n = 0;
    for (int t = 0; t < threads; t++) {
        memcpy(all + n, workers[t].latencies, workers[t].round_trips * sizeof(double));
        n += workers[t].round_trips;
    }
    qsort(all, n, sizeof(double), compare);
#define PCT(p) (n ? all[(long)((p) * n) < n ? (long)((p) * n) : n - 1] : 0.0)
    printf("{\"acked\": %ld, \"requests\": %ld, \"seconds\": %.6f, \"p50_us\": %.1f, \"p99_us\": %.1f, "
           "\"p999_us\": %.1f, \"not_replicated\": %ld, \"errors\": %ld, \"threads\": %d}\n",
           acked, round_trips, elapsed, PCT(0.50), PCT(0.99), PCT(0.999), not_replicated, errors, threads);
    return errors ? 1 : 0;
}
