/* hasvc_load: a C load generator for hasvc's client protocol (docs/PROTOCOL.md §1-2), the
 * counterpart of scripts/redis_load.c, so that neither side of scripts/bench_peers is measured
 * through a Python client.
 *
 *   hasvc_load HOST PORT CONNECTIONS PRODUCERS BATCH SECONDS SIZE [THREADS]
 *
 * PRODUCERS producers share CONNECTIONS connections. THREADS (default 1) threads each run one
 * epoll loop over their share of the connections (round robin), as scripts/redis_load.c does:
 * a thread per connection put 64 threads beside the broker on this 2-core machine, and every
 * answer then woke a different sleeping thread (issue 18 found the same design holding Redis
 * 20-35 % back). Each producer keeps one SEND of BATCH messages of SIZE bytes in flight (queue
 * id = producer index % 4, as hasvc.bench_sync); the requests of all of a connection's producers
 * that became ready in one read go out in one write, as the Python client does. A message counts
 * as acknowledged when its response says PUT_OK. The clock starts once every connection is open
 * and greeted. Prints one JSON object: acknowledged messages, requests, seconds, request latency
 * percentiles in microseconds, and messages by status name. Clusters with a secret are not
 * supported (the preface's proof would need HMAC-SHA256).
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define TOPIC "BenchTopic"
#define QUEUES 4
#define STATUSES_MAX 16
#define FRAME_SIZE_MAX (16 * 1024 * 1024) /* the broker's frame_size_max */
#define THREADS_MAX 16
#define EVENTS_MAX 256 /* epoll events taken per wait */

struct status_count {
    char name[40];
    long count;
};

struct connection {
    int fd, first_producer, producers, in_flight, want_write;
    double *sent_at; /* per local producer (= request id) */
    unsigned char *out, *in;
    size_t out_used, out_sent, out_capacity, in_used, in_capacity;
};

struct worker {
    pthread_t thread;
    struct connection *connections;
    int count;
    long acked, requests, errors;
    double *latencies; /* microseconds, one per request */
    long capacity;
    struct status_count statuses[STATUSES_MAX];
    int status_kinds;
};

static const char *host;
static int port, batch, size;
static double seconds, deadline;
static unsigned char *request_template; /* a whole SEND frame; request id and queue patched in */
static size_t request_size;

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

static unsigned char *put_u16(unsigned char *p, uint16_t v) { v = htons(v); memcpy(p, &v, 2); return p + 2; }
static unsigned char *put_u32(unsigned char *p, uint32_t v) { v = htonl(v); memcpy(p, &v, 4); return p + 4; }
static uint32_t get_u32(const unsigned char *p) { uint32_t v; memcpy(&v, p, 4); return ntohl(v); }
static uint16_t get_u16(const unsigned char *p) { uint16_t v; memcpy(&v, p, 2); return ntohs(v); }

static void build_template(void) {
    size_t payload = 2 + strlen(TOPIC) + 4 + 4 + 8 + 4 + (size_t)batch * 2 + (size_t)batch * (4 + size);
    request_size = 4 + 1 + 4 + payload;
    unsigned char *p = request_template = calloc(1, request_size);
    p = put_u32(p, (uint32_t)(request_size - 4));
    *p++ = 1; /* SEND */
    p = put_u32(p, 0); /* request id, patched */
    p = put_u16(p, strlen(TOPIC));
    memcpy(p, TOPIC, strlen(TOPIC));
    p += strlen(TOPIC);
    p = put_u32(p, 0); /* queue id, patched */
    p = put_u32(p, 0); /* flag */
    uint64_t born = (uint64_t)time(NULL) * 1000;
    p = put_u32(p, (uint32_t)(born >> 32));
    p = put_u32(p, (uint32_t)born);
    p = put_u32(p, (uint32_t)batch);
    for (int i = 0; i < batch; i++) { /* each message: properties (none), then body */
        p = put_u16(p, 0);
        p = put_u32(p, (uint32_t)size);
        for (int j = 0; j < size; j++) *p++ = (unsigned char)('a' + (i + j) % 26);
    }
}

static int read_exactly(int fd, unsigned char *buffer, size_t n) {
    while (n) {
        ssize_t got = read(fd, buffer, n);
        if (got <= 0) return -1;
        buffer += got;
        n -= got;
    }
    return 0;
}

static int write_all(int fd, const unsigned char *buffer, size_t n) {
    while (n) {
        ssize_t sent = write(fd, buffer, n);
        if (sent < 0 && errno == EINTR) continue;
        if (sent <= 0) return -1;
        buffer += sent;
        n -= sent;
    }
    return 0;
}

static int connect_and_greet(void) {
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *found;
    char service[16];
    snprintf(service, sizeof service, "%d", port);
    if (getaddrinfo(host, service, &hints, &found) != 0) return -1;
    int fd = socket(found->ai_family, SOCK_STREAM, 0);
    if (fd < 0 || connect(fd, found->ai_addr, found->ai_addrlen) != 0) {
        freeaddrinfo(found);
        return -1;
    }
    freeaddrinfo(found);
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    unsigned char hello[39], auth[69] = {0}, auth_ok[33];
    if (read_exactly(fd, hello, sizeof hello) || memcmp(hello, "HSVC", 4) != 0 || hello[5] != 1) {
        fprintf(stderr, "hasvc_load: not a hasvc client port\n");
        close(fd);
        return -1;
    }
    if (hello[6]) {
        fprintf(stderr, "hasvc_load: the broker requires a secret; hasvc_load supports only brokers without one\n");
        close(fd);
        return -1;
    }
    memcpy(auth, "HSVC", 4);
    auth[4] = 1;
    for (int i = 5; i < 37; i++) auth[i] = (unsigned char)rand();
    if (write_all(fd, auth, sizeof auth) || read_exactly(fd, auth_ok, sizeof auth_ok) || auth_ok[0] != 0) {
        fprintf(stderr, "hasvc_load: preface refused\n");
        close(fd);
        return -1;
    }
    return fd;
}

static void count_status(struct worker *w, const unsigned char *name, size_t length) {
    if (length >= sizeof w->statuses[0].name) length = sizeof w->statuses[0].name - 1;
    for (int i = 0; i < w->status_kinds; i++) {
        if (strlen(w->statuses[i].name) == length && memcmp(w->statuses[i].name, name, length) == 0) {
            w->statuses[i].count += batch;
            return;
        }
    }
    if (w->status_kinds == STATUSES_MAX) return;
    memcpy(w->statuses[w->status_kinds].name, name, length);
    w->statuses[w->status_kinds].name[length] = 0;
    w->statuses[w->status_kinds++].count = batch;
}

static void queue_request(unsigned char **out, size_t *out_used, size_t *out_capacity, int producer, uint32_t id) {
    if (*out_used + request_size > *out_capacity) {
        *out_capacity = (*out_used + request_size) * 2;
        *out = realloc(*out, *out_capacity);
    }
    unsigned char *frame = *out + *out_used;
    memcpy(frame, request_template, request_size);
    put_u32(frame + 5, id);
    put_u32(frame + 9 + 2 + strlen(TOPIC), (uint32_t)(producer % QUEUES));
    *out_used += request_size;
}

static void set_events(int epoll, struct connection *c, int want_write) {
    if (c->want_write == want_write) return;
    struct epoll_event event = {.events = EPOLLIN | (want_write ? EPOLLOUT : 0), .data.ptr = c};
    epoll_ctl(epoll, EPOLL_CTL_MOD, c->fd, &event);
    c->want_write = want_write;
}

/* Write what the socket takes of the queued requests; -1 on error. */
static int flush_requests(int epoll, struct connection *c) {
    while (c->out_sent < c->out_used) {
        ssize_t n = write(c->fd, c->out + c->out_sent, c->out_used - c->out_sent);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0 && errno == EAGAIN) {
            set_events(epoll, c, 1);
            return 0;
        }
        if (n < 0) return -1;
        c->out_sent += n;
    }
    c->out_used = c->out_sent = 0;
    set_events(epoll, c, 0);
    return 0;
}

/* Count the whole responses in c->in and queue each producer's next request; -1 if malformed. */
static int take_responses(struct worker *w, struct connection *c) {
    size_t at = 0;
    double time_now = now();
    while (c->in_used - at >= 4) {
        uint32_t length = get_u32(c->in + at);
        if (length < 7 || length > FRAME_SIZE_MAX) return -1;
        if (c->in_used - at < 4 + (size_t)length) {
            if (4 + (size_t)length > c->in_capacity) {
                c->in_capacity = 4 + (size_t)length + 65536;
                c->in = realloc(c->in, c->in_capacity);
            }
            break;
        }
        const unsigned char *frame = c->in + at + 4;
        uint32_t id = get_u32(frame + 1);
        if (frame[0] != 0x81 || id >= (uint32_t)c->producers) return -1;
        uint16_t status_length = get_u16(frame + 5);
        if (7 + (size_t)status_length > length) return -1;
        count_status(w, frame + 7, status_length); /* counted per message */
        if (status_length == 6 && memcmp(frame + 7, "PUT_OK", 6) == 0) w->acked += batch;
        if (w->requests == w->capacity) {
            w->capacity = w->capacity ? w->capacity * 2 : 65536;
            w->latencies = realloc(w->latencies, w->capacity * sizeof(double));
        }
        w->latencies[w->requests++] = (time_now - c->sent_at[id]) * 1e6;
        c->in_flight--;
        if (time_now < deadline) {
            queue_request(&c->out, &c->out_used, &c->out_capacity, c->first_producer + (int)id, id);
            c->sent_at[id] = time_now;
            c->in_flight++;
        }
        at += 4 + (size_t)length;
    }
    memmove(c->in, c->in + at, c->in_used - at);
    c->in_used -= at;
    return 0;
}

/* Read what is there, answer it with the next requests; 1 = the connection is done, -1 = error. */
static int on_readable(int epoll, struct worker *w, struct connection *c) {
    for (;;) {
        if (c->in_capacity - c->in_used < 65536) {
            c->in_capacity *= 2;
            c->in = realloc(c->in, c->in_capacity);
        }
        size_t asked = c->in_capacity - c->in_used;
        ssize_t got = read(c->fd, c->in + c->in_used, asked);
        if (got < 0 && errno == EINTR) continue;
        if (got < 0 && errno == EAGAIN) break;
        if (got <= 0) return -1;
        c->in_used += got;
        if (take_responses(w, c) < 0) return -1;
        if ((size_t)got < asked) break; /* drained: wait for epoll rather than a read that says EAGAIN */
    }
    if (flush_requests(epoll, c) < 0) return -1;
    return c->in_flight == 0 && c->out_used == 0;
}

static void *run(void *argument) {
    struct worker *w = argument;
    int epoll = epoll_create1(0), active = 0;
    for (int i = 0; i < w->count; i++) {
        struct connection *c = &w->connections[i];
        struct epoll_event event = {.events = EPOLLIN, .data.ptr = c};
        epoll_ctl(epoll, EPOLL_CTL_ADD, c->fd, &event);
        for (int p = 0; p < c->producers; p++) { /* request id = local producer index */
            queue_request(&c->out, &c->out_used, &c->out_capacity, c->first_producer + p, (uint32_t)p);
            c->sent_at[p] = now();
            c->in_flight++;
        }
        if (flush_requests(epoll, c) < 0) {
            fprintf(stderr, "hasvc_load: write: %s\n", strerror(errno));
            w->errors++;
            close(c->fd);
            continue;
        }
        active++;
    }
    struct epoll_event events[EVENTS_MAX];
    while (active > 0) {
        int ready = epoll_wait(epoll, events, EVENTS_MAX, 1000);
        if (ready < 0 && errno == EINTR) continue;
        for (int i = 0; i < ready; i++) {
            struct connection *c = events[i].data.ptr;
            int state = 0;
            if ((events[i].events & EPOLLOUT) && flush_requests(epoll, c) < 0) state = -1;
            if (state == 0 && (events[i].events & (EPOLLIN | EPOLLERR | EPOLLHUP))) state = on_readable(epoll, w, c);
            if (state == 0) continue;
            if (state < 0) {
                fprintf(stderr, "hasvc_load: connection broken or malformed response\n");
                w->errors++;
            }
            close(c->fd); /* done or failed: closing also removes it from the epoll set */
            active--;
        }
    }
    close(epoll);
    return NULL;
}

static int compare(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv) {
    if (argc != 8 && argc != 9) {
        fprintf(stderr, "usage: hasvc_load HOST PORT CONNECTIONS PRODUCERS BATCH SECONDS SIZE [THREADS]\n");
        return 2;
    }
    host = argv[1];
    port = atoi(argv[2]);
    int connections = atoi(argv[3]), producers = atoi(argv[4]);
    batch = atoi(argv[5]);
    seconds = atof(argv[6]);
    size = atoi(argv[7]);
    int threads = argc == 9 ? atoi(argv[8]) : 1;
    if (connections < 1 || producers < connections || batch < 1 || batch > 65536 || seconds <= 0 || size < 0 ||
        threads < 1 || threads > THREADS_MAX) {
        fprintf(stderr, "hasvc_load: need 1 <= CONNECTIONS <= PRODUCERS, 1 <= BATCH <= 65536, SECONDS > 0, SIZE >= 0, "
                        "1 <= THREADS <= %d\n", THREADS_MAX);
        return 2;
    }
    if (threads > connections) threads = connections;
    build_template();
    struct worker *workers = calloc(threads, sizeof *workers);
    for (int t = 0; t < threads; t++) workers[t].connections = calloc(connections / threads + 1, sizeof(struct connection));
    for (int i = 0, first = 0; i < connections; i++) {
        struct worker *w = &workers[i % threads];
        struct connection *c = &w->connections[w->count++];
        c->first_producer = first;
        c->producers = producers / connections + (i < producers % connections);
        first += c->producers;
        if ((c->fd = connect_and_greet()) < 0) {
            fprintf(stderr, "hasvc_load: cannot connect to %s:%d\n", host, port);
            return 1;
        }
        fcntl(c->fd, F_SETFL, fcntl(c->fd, F_GETFL) | O_NONBLOCK);
        c->sent_at = calloc(c->producers, sizeof(double));
        c->out_capacity = request_size * c->producers;
        c->out = malloc(c->out_capacity);
        c->in_capacity = 1 << 20;
        c->in = malloc(c->in_capacity);
    }
    double started = now();
    deadline = started + seconds;
    for (int t = 0; t < threads; t++) pthread_create(&workers[t].thread, NULL, run, &workers[t]);
    long acked = 0, requests = 0, errors = 0;
    struct status_count statuses[STATUSES_MAX];
    int kinds = 0;
    for (int i = 0; i < threads; i++) {
        pthread_join(workers[i].thread, NULL);
        acked += workers[i].acked;
        requests += workers[i].requests;
        errors += workers[i].errors;
        for (int k = 0; k < workers[i].status_kinds; k++) {
            int j = 0;
            while (j < kinds && strcmp(statuses[j].name, workers[i].statuses[k].name) != 0) j++;
            if (j == kinds) {
                if (kinds == STATUSES_MAX) continue;
                statuses[kinds] = workers[i].statuses[k];
                kinds++;
            } else {
                statuses[j].count += workers[i].statuses[k].count;
            }
        }
    }
    double elapsed = now() - started;
    double *all = malloc((requests ? requests : 1) * sizeof(double));
    long n = 0;
    for (int i = 0; i < threads; i++) {
        memcpy(all + n, workers[i].latencies, workers[i].requests * sizeof(double));
        n += workers[i].requests;
    }
    qsort(all, n, sizeof(double), compare);
#define PCT(p) (n ? all[(long)((p) * n) < n ? (long)((p) * n) : n - 1] : 0.0)
    printf("{\"acked\": %ld, \"requests\": %ld, \"seconds\": %.6f, \"p50_us\": %.1f, \"p99_us\": %.1f, "
           "\"p999_us\": %.1f, \"errors\": %ld, \"statuses\": {",
           acked, requests, elapsed, PCT(0.50), PCT(0.99), PCT(0.999), errors);
    for (int j = 0; j < kinds; j++) printf("%s\"%s\": %ld", j ? ", " : "", statuses[j].name, statuses[j].count);
    printf("}}\n");
    return errors ? 1 : 0;
}
