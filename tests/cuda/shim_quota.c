/* Regression probes for the quota ledger (tests/tests/shim_quota_regressions.rs, issue 6). Driver
 * API, linked with -lcuda (the shim is preloaded and interposes the exports).
 *
 * usage: shim_quota reset ROUNDS        a created context holds 600 MiB; each round fills the
 *                                       primary context in 100 MiB steps until refused, then
 *                                       cuDevicePrimaryCtxReset (issue 6 item 1)
 *        shim_quota async THREADS ITERS threads hold <= 100 MiB each through cuMemAllocAsync /
 *                                       cuMemFreeAsync on the default pool, release threshold max
 *                                       (item 2)
 *        shim_quota churn THREADS ITERS threads allocate and free 1 B .. 1 MiB with cuMemAlloc /
 *                                       cuMemFree, 8 live each (item 3)
 *        shim_quota ctx_race THREADS ROUNDS threads allocate in a context another thread destroys
 *                                       and replaces ROUNDS times (item 4)
 *        shim_quota uncharged           block-compressed and planar arrays, legacy cuMemAlloc (v1),
 *                                       pitched sizes that overflow (item 11)
 *        shim_quota primary_release     200 MiB in the primary context, released to refcount 0
 *
 * At each point where the harness compares the shim's charge with simgpu's device memory the
 * program prints a tag line ("held", "freed", ...) and waits for a line on stdin. "charged" is what
 * the process sees charged through cuMemGetInfo (quota - free). Prints "key=value" lines, "FAIL
 * ..." and exit 1 on an unexpected result, "OK" at the end. */
#define _GNU_SOURCE
#include <cuda.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "check.h"

#define MIB (1024ull * 1024ull)

static CUdevice dev;
static size_t quota_total;

/* The harness compares the figures now; goes on when it sends a line. */
static void pause_at(const char *tag) {
    printf("%s\n", tag);
    fflush(stdout);
    char line[64];
    if (!fgets(line, sizeof line, stdin)) {
        /* stdin closed: go on */
    }
}

static size_t free_now(void) {
    size_t f = 0, t = 0;
    CHECK(cuMemGetInfo(&f, &t));
    quota_total = t;
    return f;
}

/* Evaluates free_now() first: it sets quota_total. */
static unsigned long long charged_bytes(void) {
    size_t f = free_now();
    return (unsigned long long)(quota_total - f);
}

static unsigned long long charged_mib(void) {
    size_t f = free_now();
    return (unsigned long long)((quota_total - f) / MIB);
}

static uint64_t next(uint64_t *x) {
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    return *x;
}

static void setup(void) {
    CHECK(cuInit(0));
    CHECK(cuDeviceGet(&dev, 0));
}

/* ---- item 1: primary reset with a created context's allocations alive ---- */

static int reset(int rounds) {
    setup();
    CUcontext created, primary;
    CHECK(cuCtxCreate(&created, NULL, 0, dev));
    CUdeviceptr keep[2];
    CHECK(cuMemAlloc(&keep[0], 300 * MIB));
    CHECK(cuMemAlloc(&keep[1], 300 * MIB));
    EXPECT(charged_mib() == 600, "the created context's 600 MiB: charged %llu MiB", charged_mib());
    CHECK(cuCtxPopCurrent(NULL));
    CHECK(cuDevicePrimaryCtxRetain(&primary, dev));
    CHECK(cuCtxSetCurrent(primary));
    for (int r = 0; r < rounds; r++) {
        int got = 0;
        for (;;) {
            CUdeviceptr p;
            CUresult rc = cuMemAlloc(&p, 100 * MIB);
            if (rc == CUDA_ERROR_OUT_OF_MEMORY) break;
            EXPECT(rc == CUDA_SUCCESS, "round %d: cuMemAlloc(100 MiB) returned %d", r, (int)rc);
            EXPECT(++got <= 10, "round %d: more than 10 x 100 MiB under a 1 GiB quota", r);
        }
        /* 600 MiB of the created context + 4 x 100 MiB fit 1 GiB; a fifth does not. */
        EXPECT(got == 4, "round %d: %d x 100 MiB fitted beside the created context's 600 MiB", r,
               got);
        CHECK(cuDevicePrimaryCtxReset(dev));
        /* As cudart after cudaDeviceReset: the primary context is retained again. */
        CHECK(cuDevicePrimaryCtxRetain(&primary, dev));
        CHECK(cuCtxSetCurrent(primary));
        EXPECT(charged_mib() == 600, "round %d: after the reset %llu MiB charged, not the created "
               "context's 600", r, charged_mib());
    }
    printf("rounds=%d\n", rounds);
    pause_at("held"); /* the created context's 600 MiB only */
    CHECK(cuCtxSetCurrent(created));
    CHECK(cuMemFree(keep[0]));
    CHECK(cuCtxDestroy(created)); /* keep[1] goes with its context */
    CHECK(cuCtxSetCurrent(primary));
    EXPECT(charged_mib() == 0, "after the destroy %llu MiB charged", charged_mib());
    pause_at("freed");
    printf("OK\n");
    return 0;
}

/* ---- item 2: stream-ordered allocation on a retaining pool ---- */

static CUcontext shared_ctx;
static int iterations;
static pthread_barrier_t start;

struct async_result {
    int index;
    unsigned long allocs, ooms;
};

static void *async_worker(void *arg) {
    struct async_result *r = arg;
    uint64_t x = 0x9E3779B97F4A7C15ull ^ (uint64_t)(r->index + 1) * 0x100000001B3ull;
    enum { LIVE = 4 };
    CUdeviceptr live[LIVE] = {0};
    size_t size[LIVE] = {0};
    size_t held = 0;
    CUstream s;
    CHECK(cuCtxSetCurrent(shared_ctx));
    CHECK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    pthread_barrier_wait(&start);
    for (int i = 0; i < iterations; i++) {
        int k = (int)(next(&x) % LIVE);
        if (live[k]) {
            CHECK(cuMemFreeAsync(live[k], s));
            held -= size[k];
            live[k] = 0;
        } else {
            /* 1 B .. 50 MiB, never more than 100 MiB held by this thread. */
            size_t n = 1 + (size_t)(next(&x) % (50 * MIB));
            if (held + n > 100 * MIB) continue;
            CUresult rc = cuMemAllocAsync(&live[k], n, s);
            if (rc == CUDA_SUCCESS) {
                r->allocs++;
                size[k] = n;
                held += n;
            } else {
                EXPECT(rc == CUDA_ERROR_OUT_OF_MEMORY, "cuMemAllocAsync(%zu) returned %d", n,
                       (int)rc);
                live[k] = 0;
                r->ooms++;
            }
        }
        if (i % 16 == 0) CHECK(cuStreamSynchronize(s));
    }
    for (int k = 0; k < LIVE; k++)
        if (live[k]) CHECK(cuMemFreeAsync(live[k], s));
    CHECK(cuStreamSynchronize(s));
    CHECK(cuStreamDestroy(s));
    return NULL;
}

static int async_pool(int threads, int iters) {
    setup();
    iterations = iters;
    CHECK(cuDevicePrimaryCtxRetain(&shared_ctx, dev));
    CHECK(cuCtxSetCurrent(shared_ctx));
    CUmemoryPool pool;
    CHECK(cuDeviceGetDefaultMemPool(&pool, dev));
    cuuint64_t keep_all = ~0ull;
    CHECK(cuMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &keep_all));
    pthread_t tid[64];
    struct async_result res[64];
    memset(res, 0, sizeof res);
    pthread_barrier_init(&start, NULL, (unsigned)threads);
    for (int t = 0; t < threads; t++) {
        res[t].index = t;
        EXPECT(pthread_create(&tid[t], NULL, async_worker, &res[t]) == 0, "pthread_create");
    }
    unsigned long allocs = 0, ooms = 0;
    for (int t = 0; t < threads; t++) {
        pthread_join(tid[t], NULL);
        allocs += res[t].allocs;
        ooms += res[t].ooms;
    }
    cuuint64_t reserved = 0;
    CHECK(cuMemPoolGetAttribute(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &reserved));
    printf("allocs=%lu\nooms=%lu\npool_reserved=%llu\ncharged=%llu\n", allocs, ooms,
           (unsigned long long)reserved, charged_bytes());
    pause_at("held"); /* everything freed; the pool keeps what it reserved */
    CHECK(cuMemPoolTrimTo(pool, 0));
    CHECK(cuMemPoolGetAttribute(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &reserved));
    printf("trimmed_reserved=%llu\ntrimmed_charged=%llu\n", (unsigned long long)reserved,
           charged_bytes());
    pause_at("trimmed");
    printf("OK\n");
    return 0;
}

/* ---- item 3: many threads allocating and freeing ---- */

enum { CHURN_LIVE = 8 };
struct churn_result {
    int index;
    unsigned long ops, ooms;
    CUdeviceptr live[CHURN_LIVE];
    size_t size[CHURN_LIVE];
};

static void *churn_worker(void *arg) {
    struct churn_result *r = arg;
    uint64_t x = 0xD1B54A32D192ED03ull ^ (uint64_t)(r->index + 1) * 0x100000001B3ull;
    CHECK(cuCtxSetCurrent(shared_ctx));
    pthread_barrier_wait(&start);
    for (int i = 0; i < iterations; i++) {
        int k = (int)(next(&x) % CHURN_LIVE);
        if (r->live[k]) {
            CHECK(cuMemFree(r->live[k]));
            r->live[k] = 0;
        } else {
            size_t n = 1 + (size_t)(next(&x) % MIB);
            CUresult rc = cuMemAlloc(&r->live[k], n);
            if (rc == CUDA_SUCCESS) {
                r->size[k] = n;
            } else {
                EXPECT(rc == CUDA_ERROR_OUT_OF_MEMORY, "cuMemAlloc(%zu) returned %d", n, (int)rc);
                r->live[k] = 0;
                r->ooms++;
            }
        }
        r->ops++;
    }
    return NULL;
}

static int churn(int threads, int iters) {
    setup();
    iterations = iters;
    CHECK(cuDevicePrimaryCtxRetain(&shared_ctx, dev));
    CHECK(cuCtxSetCurrent(shared_ctx));
    pthread_t tid[64];
    static struct churn_result res[64];
    pthread_barrier_init(&start, NULL, (unsigned)threads);
    for (int t = 0; t < threads; t++) {
        res[t].index = t;
        EXPECT(pthread_create(&tid[t], NULL, churn_worker, &res[t]) == 0, "pthread_create");
    }
    unsigned long ops = 0, ooms = 0;
    unsigned long long held = 0;
    for (int t = 0; t < threads; t++) {
        pthread_join(tid[t], NULL);
        ops += res[t].ops;
        ooms += res[t].ooms;
        for (int k = 0; k < CHURN_LIVE; k++)
            if (res[t].live[k]) held += res[t].size[k];
    }
    printf("ops=%lu\nooms=%lu\nheld=%llu\ncharged=%llu\n", ops, ooms, held,
           charged_bytes());
    pause_at("held");
    for (int t = 0; t < threads; t++)
        for (int k = 0; k < CHURN_LIVE; k++)
            if (res[t].live[k]) CHECK(cuMemFree(res[t].live[k]));
    printf("freed_charged=%llu\n", charged_bytes());
    pause_at("freed");
    printf("OK\n");
    return 0;
}

/* ---- item 4: cuCtxDestroy racing allocations in other threads ---- */

static pthread_rwlock_t ctx_lock;
static CUcontext race_ctx;     /* under ctx_lock */
static unsigned race_gen;      /* under ctx_lock */
static volatile int race_done; /* set by the destroyer */

struct race_result {
    int index;
    unsigned long allocs, stale, ooms, invalid;
};

static void *race_worker(void *arg) {
    struct race_result *r = arg;
    uint64_t x = 0xA0761D6478BD642Full ^ (uint64_t)(r->index + 1) * 0x100000001B3ull;
    enum { LIVE = 6 };
    CUdeviceptr live[LIVE] = {0};
    unsigned gen_of[LIVE] = {0};
    unsigned cur_gen = ~0u;
    pthread_barrier_wait(&start);
    while (!__atomic_load_n(&race_done, __ATOMIC_ACQUIRE)) {
        pthread_rwlock_rdlock(&ctx_lock);
        unsigned gen = race_gen;
        CUcontext c = race_ctx;
        pthread_rwlock_unlock(&ctx_lock);
        if (gen != cur_gen) {
            /* A new context: memory of the old one went with it (never freed again: its
             * address may belong to someone else by now). */
            if (cuCtxSetCurrent(c) != CUDA_SUCCESS) continue;
            cur_gen = gen;
        }
        int k = (int)(next(&x) % LIVE);
        if (live[k]) {
            /* Freed only while its context certainly exists. */
            pthread_rwlock_rdlock(&ctx_lock);
            if (race_gen == gen_of[k]) CHECK(cuMemFree(live[k]));
            else r->stale++;
            pthread_rwlock_unlock(&ctx_lock);
            live[k] = 0;
            continue;
        }
        /* Outside the lock: this allocation races the destroy. */
        size_t n = (1 + next(&x) % 8) * MIB - next(&x) % 4096;
        CUresult rc = cuMemAlloc(&live[k], n);
        if (rc == CUDA_SUCCESS) {
            r->allocs++;
            gen_of[k] = cur_gen;
        } else {
            live[k] = 0;
            if (rc == CUDA_ERROR_OUT_OF_MEMORY) r->ooms++;
            else {
                EXPECT(rc == CUDA_ERROR_INVALID_CONTEXT || rc == CUDA_ERROR_CONTEXT_IS_DESTROYED,
                       "cuMemAlloc(%zu) returned %d", n, (int)rc);
                r->invalid++;
                cur_gen = ~0u;
            }
        }
    }
    /* What this thread still holds in the live context stays, the harness compares it. */
    return NULL;
}

static int ctx_race(int threads, int rounds) {
    setup();
    pthread_rwlockattr_t attr; /* writers first: the destroyer must not wait for ever */
    pthread_rwlockattr_init(&attr);
    pthread_rwlockattr_setkind_np(&attr, PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP);
    pthread_rwlock_init(&ctx_lock, &attr);
    CHECK(cuCtxCreate(&race_ctx, NULL, 0, dev));
    CHECK(cuCtxPopCurrent(NULL));
    race_gen = 1;
    pthread_t tid[64];
    struct race_result res[64];
    memset(res, 0, sizeof res);
    pthread_barrier_init(&start, NULL, (unsigned)threads + 1);
    for (int t = 0; t < threads; t++) {
        res[t].index = t;
        EXPECT(pthread_create(&tid[t], NULL, race_worker, &res[t]) == 0, "pthread_create");
    }
    pthread_barrier_wait(&start);
    for (int r = 0; r < rounds; r++) {
        usleep(2000); /* let the threads allocate in this context */
        CUcontext fresh;
        CHECK(cuCtxCreate(&fresh, NULL, 0, dev));
        CHECK(cuCtxPopCurrent(NULL));
        pthread_rwlock_wrlock(&ctx_lock);
        CUcontext old = race_ctx;
        race_ctx = fresh;
        race_gen++;
        pthread_rwlock_unlock(&ctx_lock);
        /* Threads still allocating in `old` race this destroy. */
        CHECK(cuCtxDestroy(old));
    }
    __atomic_store_n(&race_done, 1, __ATOMIC_RELEASE);
    unsigned long allocs = 0, stale = 0, ooms = 0, invalid = 0;
    for (int t = 0; t < threads; t++) {
        pthread_join(tid[t], NULL);
        allocs += res[t].allocs;
        stale += res[t].stale;
        ooms += res[t].ooms;
        invalid += res[t].invalid;
    }
    CHECK(cuCtxSetCurrent(race_ctx));
    printf("allocs=%lu\nstale=%lu\nooms=%lu\ninvalid_context=%lu\ncharged=%llu\n", allocs, stale,
           ooms, invalid, charged_bytes());
    pause_at("held");
    CHECK(cuCtxDestroy(race_ctx));
    CUcontext primary;
    CHECK(cuDevicePrimaryCtxRetain(&primary, dev));
    CHECK(cuCtxSetCurrent(primary));
    printf("destroyed_charged=%llu\n", charged_bytes());
    pause_at("destroyed");
    printf("OK\n");
    return 0;
}

/* ---- item 11: allocation paths that were not charged ---- */

static void array_probe(const char *name, unsigned format, unsigned channels, size_t w, size_t h,
                        int three_d) {
    size_t f0 = free_now();
    CUarray a = NULL;
    CUresult rc;
    if (three_d) {
        CUDA_ARRAY3D_DESCRIPTOR d = {w, h, 4, (CUarray_format)format, channels, 0};
        rc = cuArray3DCreate(&a, &d);
    } else {
        CUDA_ARRAY_DESCRIPTOR d = {w, h, (CUarray_format)format, channels};
        rc = cuArrayCreate(&a, &d);
    }
    size_t f1 = free_now();
    printf("array_%s_rc=%d\narray_%s_charged=%llu\n", name, (int)rc, name,
           (unsigned long long)(f0 - f1));
    if (rc == CUDA_SUCCESS) {
        /* Never less than the array's real size: at least w*h (4:2:0 or block data). */
        EXPECT(f0 - f1 >= w * h * (three_d ? 4 : 1) / 2, "%s array charged %zu bytes", name,
               f0 - f1);
        CHECK(cuArrayDestroy(a));
    } else {
        EXPECT(rc == CUDA_ERROR_INVALID_VALUE || rc == CUDA_ERROR_NOT_SUPPORTED,
               "%s array: %d", name, (int)rc);
    }
    EXPECT(free_now() == f0, "%s array: %zu bytes left charged", name, f0 - free_now());
}

static int uncharged(void) {
    setup();
    CUcontext primary;
    CHECK(cuDevicePrimaryCtxRetain(&primary, dev));
    CHECK(cuCtxSetCurrent(primary));
    size_t f0 = free_now();

    array_probe("bc1", CU_AD_FORMAT_BC1_UNORM, 4, 4096, 4096, 0);
    array_probe("bc7", CU_AD_FORMAT_BC7_UNORM, 4, 4096, 4096, 0);
    array_probe("bc7_3d", CU_AD_FORMAT_BC7_UNORM, 4, 1024, 1024, 1);
    array_probe("nv12", CU_AD_FORMAT_NV12, 3, 4096, 4096, 0);
    array_probe("p010", CU_AD_FORMAT_P010, 3, 4096, 2048, 0);

    /* Legacy cuMemAlloc of the CUDA 2.x ABI (32-bit pointer and size). */
    CUresult (*alloc_v1)(unsigned *, unsigned) = NULL;
    CUresult (*free_v1)(unsigned) = NULL;
    CUresult g1 = cuGetProcAddress("cuMemAlloc", (void **)&alloc_v1, 2000, 0, NULL);
    CUresult g2 = cuGetProcAddress("cuMemFree", (void **)&free_v1, 2000, 0, NULL);
    printf("gpa_v1_rc=%d,%d\n", (int)g1, (int)g2);
    if (g1 == CUDA_SUCCESS && alloc_v1) {
        unsigned p = 0;
        CUresult rc = alloc_v1(&p, 64 * MIB);
        unsigned long long c = (unsigned long long)(f0 - free_now());
        printf("alloc_v1_rc=%d\nalloc_v1_charged=%llu\n", (int)rc, c);
        if (rc == CUDA_SUCCESS) EXPECT(c == 64 * MIB, "cuMemAlloc (v1) of 64 MiB charged %llu bytes", c);
        else EXPECT(c == 0, "a refused cuMemAlloc (v1) charged %llu bytes", c);
        pause_at("v1");
        if (rc == CUDA_SUCCESS) {
            EXPECT(g2 == CUDA_SUCCESS && free_v1, "no cuMemFree (v1) beside cuMemAlloc (v1)");
            CHECK(free_v1(p));
        }
    } else {
        printf("alloc_v1_rc=%d\n", (int)g1);
        pause_at("v1");
    }
    EXPECT(free_now() == f0, "after cuMemAlloc (v1): %zu bytes charged", f0 - free_now());

    /* Pitched allocations whose width x height overflows: refused, nothing charged. */
    struct { size_t w, h; } sizes[] = {
        {(size_t)1 << 40, (size_t)1 << 30}, /* 2^70 */
        {SIZE_MAX - 16, 2},                 /* width rounds up past 2^64 */
        {(size_t)1 << 33, (size_t)1 << 31}, /* 2^64 exactly */
        {(size_t)1 << 20, (size_t)1 << 20}, /* 1 TiB: no overflow, over the quota */
    };
    for (unsigned i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        CUdeviceptr p = 0;
        size_t pitch = 0;
        CUresult rc = cuMemAllocPitch(&p, &pitch, sizes[i].w, sizes[i].h, 4);
        printf("pitch_%u_rc=%d\n", i, (int)rc);
        EXPECT(rc != CUDA_SUCCESS, "cuMemAllocPitch(%zu, %zu) succeeded (pitch %zu)", sizes[i].w,
               sizes[i].h, pitch);
        EXPECT(free_now() == f0, "cuMemAllocPitch(%zu, %zu) refused with %d left %zu bytes charged",
               sizes[i].w, sizes[i].h, (int)rc, f0 - free_now());
    }
    pause_at("done");
    printf("OK\n");
    return 0;
}

static int primary_release(void) {
    setup();
    CUcontext primary;
    CHECK(cuDevicePrimaryCtxRetain(&primary, dev));
    CHECK(cuCtxSetCurrent(primary));
    CUdeviceptr p;
    CHECK(cuMemAlloc(&p, 200 * MIB));
    EXPECT(charged_mib() == 200, "200 MiB allocated, %llu MiB charged", charged_mib());
    pause_at("held");
    CHECK(cuCtxSetCurrent(NULL));
    CHECK(cuDevicePrimaryCtxRelease(dev));
    unsigned flags = 0;
    int active = -1;
    CHECK(cuDevicePrimaryCtxGetState(dev, &flags, &active));
    printf("active_after_release=%d\n", active);
    EXPECT(active == 0, "the primary context is still active after its last release");
    /* cuMemGetInfo needs a context: a created one, which charges nothing itself. */
    CUcontext probe;
    CHECK(cuCtxCreate(&probe, NULL, 0, dev));
    printf("released_charged=%llu\n", charged_bytes());
    pause_at("released");
    CHECK(cuCtxDestroy(probe));
    printf("OK\n");
    return 0;
}

int main(int argc, char **argv) {
    const char *mode = argc > 1 ? argv[1] : "";
    if (!strcmp(mode, "reset") && argc == 3) return reset(atoi(argv[2]));
    if (!strcmp(mode, "async") && argc == 4) return async_pool(atoi(argv[2]), atoi(argv[3]));
    if (!strcmp(mode, "churn") && argc == 4) return churn(atoi(argv[2]), atoi(argv[3]));
    if (!strcmp(mode, "ctx_race") && argc == 4) return ctx_race(atoi(argv[2]), atoi(argv[3]));
    if (!strcmp(mode, "uncharged")) return uncharged();
    if (!strcmp(mode, "primary_release")) return primary_release();
    fprintf(stderr, "usage: see the comment at the top of shim_quota.c\n");
    return 2;
}
