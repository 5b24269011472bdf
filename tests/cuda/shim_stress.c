/* Quota stress for the shim (tests/tests/shim_sharing.rs): THREADS threads allocate and free random
 * sizes through the driver API (dlopen + dlsym, like cudart), concurrently with other processes of
 * the same container.
 *
 * usage: shim_stress THREADS ITERATIONS MAX_MIB SEED
 * Initialises CUDA, prints "ready", then waits for stdin to close (so every process starts
 * together), runs, frees everything and prints one JSON line
 *   {"check":"stress","ok":true,"allocs":N,"ooms":N,"total":T,"min_free":F}
 * Any result other than success or CUDA_ERROR_OUT_OF_MEMORY, or cuMemGetInfo reporting
 * free > total, prints "FAIL ..." and exits 1. */
#include <cuda.h>
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "check.h"

#define MIB (1024ull * 1024ull)
#define LIVE 6



static CUresult (*cu_init)(unsigned);
static CUresult (*device_get)(CUdevice *, int);
static CUresult (*primary_retain)(CUcontext *, CUdevice);
static CUresult (*ctx_set_current)(CUcontext);
static CUresult (*mem_alloc)(CUdeviceptr *, size_t);
static CUresult (*mem_free)(CUdeviceptr);
static CUresult (*mem_get_info)(size_t *, size_t *);

static CUcontext ctx;
static int iterations;
static uint64_t max_bytes;
static unsigned seed;
static pthread_barrier_t start;

struct result {
    int index;
    unsigned long allocs, ooms;
    size_t total, min_free;
};

static uint64_t next(uint64_t *x) {
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    return *x;
}

static void *worker(void *arg) {
    struct result *r = arg;
    uint64_t x = 0x9E3779B97F4A7C15ull ^ ((uint64_t)seed << 32) ^ (uint64_t)(r->index + 1) * 0x100000001B3ull;
    CUdeviceptr live[LIVE] = {0};
    r->min_free = SIZE_MAX;
    CHECK(ctx_set_current(ctx));
    pthread_barrier_wait(&start);
    for (int i = 0; i < iterations; i++) {
        int k = (int)(next(&x) % LIVE);
        if (live[k]) {
            CHECK(mem_free(live[k]));
            live[k] = 0;
            continue;
        }
        /* 1 byte .. max_bytes, mostly not a multiple of anything. */
        size_t n = 1 + (size_t)(next(&x) % max_bytes);
        CUresult rc = mem_alloc(&live[k], n);
        if (rc == CUDA_SUCCESS) {
            r->allocs++;
        } else {
            EXPECT(rc == CUDA_ERROR_OUT_OF_MEMORY, "cuMemAlloc(%zu) returned %d", n, (int)rc);
            live[k] = 0;
            r->ooms++;
        }
        if (i % 64 == 0) {
            size_t f = 0, t = 0;
            CHECK(mem_get_info(&f, &t));
            EXPECT(f <= t, "cuMemGetInfo free %zu > total %zu", f, t);
            r->total = t;
            if (f < r->min_free) r->min_free = f;
        }
    }
    for (int k = 0; k < LIVE; k++)
        if (live[k]) CHECK(mem_free(live[k]));
    return NULL;
}

static void *sym(void *lib, const char *name) {
    void *p = dlsym(lib, name);
    EXPECT(p != NULL, "dlsym %s", name);
    return p;
}

int main(int argc, char **argv) {
    EXPECT(argc == 5, "usage: shim_stress THREADS ITERATIONS MAX_MIB SEED");
    int threads = atoi(argv[1]);
    iterations = atoi(argv[2]);
    max_bytes = strtoull(argv[3], NULL, 0) * MIB;
    seed = (unsigned)strtoul(argv[4], NULL, 0);
    EXPECT(threads > 0 && threads <= 64 && iterations > 0 && max_bytes > 0, "bad arguments");

    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    EXPECT(lib != NULL, "dlopen libcuda.so.1: %s", dlerror());
    cu_init = sym(lib, "cuInit");
    device_get = sym(lib, "cuDeviceGet");
    primary_retain = sym(lib, "cuDevicePrimaryCtxRetain");
    ctx_set_current = sym(lib, "cuCtxSetCurrent");
    mem_alloc = sym(lib, "cuMemAlloc_v2");
    mem_free = sym(lib, "cuMemFree_v2");
    mem_get_info = sym(lib, "cuMemGetInfo_v2");
    CHECK(cu_init(0));
    CUdevice dev;
    CHECK(device_get(&dev, 0));
    CHECK(primary_retain(&ctx, dev));

    printf("ready\n");
    fflush(stdout);
    char buf[64];
    while (fread(buf, 1, sizeof buf, stdin) > 0) {
    }

    pthread_t tid[64];
    struct result res[64];
    memset(res, 0, sizeof res);
    pthread_barrier_init(&start, NULL, (unsigned)threads);
    for (int t = 0; t < threads; t++) {
        res[t].index = t;
        EXPECT(pthread_create(&tid[t], NULL, worker, &res[t]) == 0, "pthread_create");
    }
    struct result sum = {0, 0, 0, 0, SIZE_MAX};
    for (int t = 0; t < threads; t++) {
        pthread_join(tid[t], NULL);
        sum.allocs += res[t].allocs;
        sum.ooms += res[t].ooms;
        if (res[t].total) sum.total = res[t].total;
        if (res[t].min_free < sum.min_free) sum.min_free = res[t].min_free;
    }
    printf("{\"check\":\"stress\",\"ok\":true,\"allocs\":%lu,\"ooms\":%lu,\"total\":%zu,"
           "\"min_free\":%zu}\n",
           sum.allocs, sum.ooms, sum.total, sum.min_free);
    return 0;
}
