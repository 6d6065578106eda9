/* hasvc_load: a C load generator for hasvc's client protocol (docs/PROTOCOL.md §1-2), the
 * counterpart of scripts/redis_load.c, so that neither side of scripts/bench_peers is measured
 * through a Python client.
 *
 *   hasvc_load HOST PORT CONNECTIONS PRODUCERS BATCH SECONDS SIZE
 *
 * PRODUCERS producers share CONNECTIONS connections (one thread per connection, blocking
 * sockets). Each producer keeps one SEND of BATCH messages of SIZE bytes in flight (queue id =
 * producer index % 4, as hasvc.bench_sync); a thread writes the requests of all its producers
 * that became ready in one read in one write, as the Python client does. A message counts as
 * acknowledged when its response says PUT_OK. Prints one JSON object: acknowledged messages,
 * requests, seconds, request latency percentiles in microseconds, and messages by status name.
 * Clusters with a secret are not supported (the preface's proof would need HMAC-SHA256).
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define TOPIC "BenchTopic"
#define QUEUES 4
#define STATUSES_MAX 16
#define FRAME_SIZE_MAX (16 * 1024 * 1024) /* the broker's frame_size_max */

struct status_count {
    char name[40];
    long count;
};

struct worker {
    pthread_t thread;
    int first_producer, producers;
    long acked, requests, errors;
    double *latencies; /* microseconds, one per request */
    long capacity;
    struct status_count statuses[STATUSES_MAX];
    int status_kinds;
};

static const char *host;
static int port, batch, size;
static double seconds;
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

static void *run(void *argument) {
    struct worker *w = argument;
    int fd = connect_and_greet();
    if (fd < 0) {
        w->errors++;
        return NULL;
    }
    /* request id = local producer index; one request in flight per producer */
    double *sent_at = calloc(w->producers, sizeof(double));
    size_t out_capacity = request_size * w->producers, out_used = 0, in_used = 0, in_capacity = 1 << 20;
    unsigned char *out = malloc(out_capacity), *in = malloc(in_capacity);
    double deadline = now() + seconds;
    int in_flight = 0;
    for (int i = 0; i < w->producers; i++) {
        queue_request(&out, &out_used, &out_capacity, w->first_producer + i, (uint32_t)i);
        sent_at[i] = now();
        in_flight++;
    }
    while (in_flight > 0) {
        if (out_used) {
            if (write_all(fd, out, out_used)) goto broken;
            out_used = 0;
        }
        if (in_capacity - in_used < 65536) {
            in_capacity *= 2;
            in = realloc(in, in_capacity);
        }
        ssize_t got = read(fd, in + in_used, in_capacity - in_used);
        if (got <= 0) goto broken;
        in_used += got;
        size_t at = 0;
        double time_now = now();
        while (in_used - at >= 4) {
            uint32_t length = get_u32(in + at);
            if (length < 5 || length > FRAME_SIZE_MAX) goto broken;
            if (in_used - at < 4 + (size_t)length) {
                if (4 + (size_t)length > in_capacity) {
                    in_capacity = 4 + (size_t)length + 65536;
                    in = realloc(in, in_capacity);
                }
                break;
            }
            const unsigned char *frame = in + at + 4;
            uint32_t id = get_u32(frame + 1);
            if (frame[0] != 0x81 || id >= (uint32_t)w->producers || length < 7) goto broken;
            uint16_t status_length = get_u16(frame + 5);
            if (7 + (size_t)status_length > length) goto broken;
            count_status(w, frame + 7, status_length); /* counted per message */
            if (status_length == 6 && memcmp(frame + 7, "PUT_OK", 6) == 0) w->acked += batch;
            if (w->requests == w->capacity) {
                w->capacity = w->capacity ? w->capacity * 2 : 65536;
                w->latencies = realloc(w->latencies, w->capacity * sizeof(double));
            }
            w->latencies[w->requests++] = (time_now - sent_at[id]) * 1e6;
            in_flight--;
            if (time_now < deadline) {
                queue_request(&out, &out_used, &out_capacity, w->first_producer + (int)id, id);
                sent_at[id] = time_now;
                in_flight++;
            }
            at += 4 + (size_t)length;
        }
        memmove(in, in + at, in_used - at);
        in_used -= at;
    }
    close(fd);
    return NULL;
broken:
    fprintf(stderr, "hasvc_load: connection broken or malformed response\n");
    w->errors++;
    close(fd);
    return NULL;
}

static int compare(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv) {
    if (argc != 8) {
        fprintf(stderr, "usage: hasvc_load HOST PORT CONNECTIONS PRODUCERS BATCH SECONDS SIZE\n");
        return 2;
    }
    host = argv[1];
    port = atoi(argv[2]);
    int connections = atoi(argv[3]), producers = atoi(argv[4]);
    batch = atoi(argv[5]);
    seconds = atof(argv[6]);
    size = atoi(argv[7]);
    if (connections < 1 || producers < connections || batch < 1 || batch > 65536 || seconds <= 0 || size < 0) {
        fprintf(stderr, "hasvc_load: need 1 <= CONNECTIONS <= PRODUCERS, 1 <= BATCH <= 65536, SECONDS > 0, SIZE >= 0\n");
        return 2;
    }
    build_template();
    struct worker *workers = calloc(connections, sizeof *workers);
    double started = now();
    for (int i = 0, first = 0; i < connections; i++) {
        workers[i].first_producer = first;
        workers[i].producers = producers / connections + (i < producers % connections);
        first += workers[i].producers;
        pthread_create(&workers[i].thread, NULL, run, &workers[i]);
    }
    long acked = 0, requests = 0, errors = 0;
    struct status_count statuses[STATUSES_MAX];
    int kinds = 0;
    for (int i = 0; i < connections; i++) {
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
    for (int i = 0; i < connections; i++) {
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
