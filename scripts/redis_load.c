/* redis_load: the Redis side of scripts/bench_peers.py — SET + WAIT round trips at a given concurrency.
 *
 *   redis_load HOST PORT CONNECTIONS BATCH SECONDS SIZE
 *
 * One thread per connection (libhiredis, blocking). Each round trip sends BATCH `SET key <SIZE bytes>`
 * and one `WAIT 1 1000` pipelined, then reads the BATCH + 1 replies: the SETs count as acknowledged
 * when WAIT reports at least one replica (Redis' "in the replica's memory", as hasvc's SYNC_MASTER
 * with ASYNC_FLUSH). Prints one JSON object: acknowledged SETs, round trips, seconds, latency
 * percentiles of the round trips in microseconds, and round trips WAIT answered with 0 replicas.
 */
#include <hiredis/hiredis.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define KEYS_PER_THREAD 10000 /* keys cycle, so memory stays bounded */

struct worker {
    pthread_t thread;
    int index;
    long acked, round_trips, not_replicated, errors;
    double *latencies; /* microseconds, one per round trip */
    long capacity;
};

static const char *host;
static int port, batch, size;
static double seconds;
static char *payload;

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

static void *run(void *argument) {
    struct worker *w = argument;
    redisContext *c = redisConnect(host, port);
    if (c == NULL || c->err) {
        fprintf(stderr, "redis_load: connect: %s\n", c ? c->errstr : "out of memory");
        w->errors++;
        return NULL;
    }
    char key[64];
    long sequence = 0;
    double deadline = now() + seconds;
    while (now() < deadline) {
        double started = now();
        for (int i = 0; i < batch; i++) {
            snprintf(key, sizeof key, "k:%d:%ld", w->index, sequence++ % KEYS_PER_THREAD);
            redisAppendCommand(c, "SET %s %b", key, payload, (size_t)size);
        }
        redisAppendCommand(c, "WAIT 1 1000");
        redisReply *reply;
        int ok = 1;
        for (int i = 0; i < batch; i++) {
            if (redisGetReply(c, (void **)&reply) != REDIS_OK) {
                fprintf(stderr, "redis_load: %s\n", c->errstr);
                w->errors++;
                redisFree(c);
                return NULL;
            }
            if (reply->type == REDIS_REPLY_ERROR) ok = 0;
            freeReplyObject(reply);
        }
        if (redisGetReply(c, (void **)&reply) != REDIS_OK) {
            fprintf(stderr, "redis_load: %s\n", c->errstr);
            w->errors++;
            redisFree(c);
            return NULL;
        }
        int replicas = reply->type == REDIS_REPLY_INTEGER ? (int)reply->integer : 0;
        freeReplyObject(reply);
        double elapsed = (now() - started) * 1e6;
        if (w->round_trips == w->capacity) {
            w->capacity = w->capacity ? w->capacity * 2 : 65536;
            w->latencies = realloc(w->latencies, w->capacity * sizeof(double));
        }
        w->latencies[w->round_trips++] = elapsed;
        if (!ok) w->errors++;
        else if (replicas >= 1) w->acked += batch;
        else w->not_replicated++;
    }
    redisFree(c);
    return NULL;
}

static int compare(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv) {
    if (argc != 7) {
        fprintf(stderr, "usage: redis_load HOST PORT CONNECTIONS BATCH SECONDS SIZE\n");
        return 2;
    }
    host = argv[1];
    port = atoi(argv[2]);
    int connections = atoi(argv[3]);
    batch = atoi(argv[4]);
    seconds = atof(argv[5]);
    size = atoi(argv[6]);
    if (connections < 1 || batch < 1 || seconds <= 0 || size < 0) {
        fprintf(stderr, "redis_load: CONNECTIONS and BATCH must be >= 1, SECONDS > 0, SIZE >= 0\n");
        return 2;
    }
    payload = malloc(size + 1);
    for (int i = 0; i < size; i++) payload[i] = 'a' + i % 26;
    struct worker *workers = calloc(connections, sizeof *workers);
    double started = now();
    for (int i = 0; i < connections; i++) {
        workers[i].index = i;
        pthread_create(&workers[i].thread, NULL, run, &workers[i]);
    }
    long acked = 0, round_trips = 0, not_replicated = 0, errors = 0;
    for (int i = 0; i < connections; i++) {
        pthread_join(workers[i].thread, NULL);
        acked += workers[i].acked;
        round_trips += workers[i].round_trips;
        not_replicated += workers[i].not_replicated;
        errors += workers[i].errors;
    }
    double elapsed = now() - started;
    double *all = malloc((round_trips ? round_trips : 1) * sizeof(double));
    long n = 0;
    for (int i = 0; i < connections; i++) {
        memcpy(all + n, workers[i].latencies, workers[i].round_trips * sizeof(double));
        n += workers[i].round_trips;
    }
    qsort(all, n, sizeof(double), compare);
#define PCT(p) (n ? all[(long)((p) * n) < n ? (long)((p) * n) : n - 1] : 0.0)
    printf("{\"acked\": %ld, \"requests\": %ld, \"seconds\": %.6f, \"p50_us\": %.1f, \"p99_us\": %.1f, "
           "\"p999_us\": %.1f, \"not_replicated\": %ld, \"errors\": %ld}\n",
           acked, round_trips, elapsed, PCT(0.50), PCT(0.99), PCT(0.999), not_replicated, errors);
    return errors ? 1 : 0;
}
