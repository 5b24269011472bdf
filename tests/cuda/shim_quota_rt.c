/* Issue 6 item 3 through cudart (tests/tests/shim_quota_regressions.rs): THREADS threads allocate
 * and free 1 B .. 1 MiB with cudaMalloc / cudaFree, 8 live each, ITERS operations per thread.
 *
 * usage: shim_quota_rt THREADS ITERS
 * Prints "ops=..", "held=.." (bytes still allocated), then "held" and waits for a line on stdin
 * (the harness compares the shim's charge with simgpu's memory), frees everything, prints "freed"
 * and waits again; "FAIL ..." and exit 1 on an unexpected result, "OK" at the end. */
#include <cuda_runtime_api.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "check.h"

#define MIB (1024ull * 1024ull)
enum { LIVE = 8 };

static int iterations;
static pthread_barrier_t start;

struct result {
    int index;
    unsigned long ops, ooms;
    void *live[LIVE];
    size_t size[LIVE];
};

static uint64_t next(uint64_t *x) {
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    return *x;
}

static void pause_at(const char *tag) {
    printf("%s\n", tag);
    fflush(stdout);
    char line[64];
    if (!fgets(line, sizeof line, stdin)) {
        /* stdin closed: go on */
    }
}

static void *worker(void *arg) {
    struct result *r = arg;
    uint64_t x = 0x2545F4914F6CDD1Dull ^ (uint64_t)(r->index + 1) * 0x100000001B3ull;
    CHECK(cudaSetDevice(0));
    pthread_barrier_wait(&start);
    for (int i = 0; i < iterations; i++) {
        int k = (int)(next(&x) % LIVE);
        if (r->live[k]) {
            CHECK(cudaFree(r->live[k]));
            r->live[k] = NULL;
        } else {
            size_t n = 1 + (size_t)(next(&x) % MIB);
            cudaError_t e = cudaMalloc(&r->live[k], n);
            if (e == cudaSuccess) {
                r->size[k] = n;
            } else {
                EXPECT(e == cudaErrorMemoryAllocation, "cudaMalloc(%zu): %s", n,
                       cudaGetErrorName(e));
                (void)cudaGetLastError();
                r->live[k] = NULL;
                r->ooms++;
            }
        }
        r->ops++;
    }
    return NULL;
}

static size_t charged(void) {
    size_t f = 0, t = 0;
    CHECK(cudaMemGetInfo(&f, &t));
    return t - f;
}

int main(int argc, char **argv) {
    EXPECT(argc == 3, "usage: shim_quota_rt THREADS ITERS");
    int threads = atoi(argv[1]);
    iterations = atoi(argv[2]);
    EXPECT(threads > 0 && threads <= 64 && iterations > 0, "bad arguments");
    CHECK(cudaSetDevice(0));
    CHECK(cudaFree(0)); /* the primary context */
    pthread_t tid[64];
    static struct result res[64];
    pthread_barrier_init(&start, NULL, (unsigned)threads);
    for (int t = 0; t < threads; t++) {
        res[t].index = t;
        EXPECT(pthread_create(&tid[t], NULL, worker, &res[t]) == 0, "pthread_create");
    }
    unsigned long ops = 0, ooms = 0;
    unsigned long long held = 0;
    for (int t = 0; t < threads; t++) {
        pthread_join(tid[t], NULL);
        ops += res[t].ops;
        ooms += res[t].ooms;
        for (int k = 0; k < LIVE; k++)
            if (res[t].live[k]) held += res[t].size[k];
    }
    printf("ops=%lu\nooms=%lu\nheld=%llu\ncharged=%zu\n", ops, ooms, held, charged());
    pause_at("held");
    for (int t = 0; t < threads; t++)
        for (int k = 0; k < LIVE; k++)
            if (res[t].live[k]) CHECK(cudaFree(res[t].live[k]));
    printf("freed_charged=%zu\n", charged());
    pause_at("freed");
    printf("OK\n");
    return 0;
}
