/* Issue 6 must-show 2 (tests/tests/shim_quota_stress.rs): THREADS threads mix every allocation path
 * with frees, primary-context resets and context create/destroy, against other processes of the
 * same container (and the harness's kill -9). Driver API, linked with -lcuda.
 *
 * usage: shim_quota_stress THREADS OPS SEED STAGE
 *   STAGE wait   initialise, print "ready", wait for stdin to close, run
 *         exec   as wait, but thread 0 execs this program again (STAGE execd, SEED+1) when it is
 *                half way, while the other threads are in the middle of their work
 *         execd  run at once (the image an exec started)
 *         probe  initialise, print "probe", wait for a line on stdin, exit (the harness's look at
 *                the container once every stress process is gone)
 * Paths: cuMemAlloc, cuMemAllocPitch, cuMemAllocManaged, cuMemAllocAsync/cuMemFreeAsync on the
 * default pool with release threshold = max, cuMemCreate + cuMemMap, cuArrayCreate, a created
 * context destroyed with its allocations alive, cuDevicePrimaryCtxReset (the threads drop what
 * the reset freed). Any result other than success or CUDA_ERROR_OUT_OF_MEMORY prints "FAIL ..."
 * and exits 1; at the end one JSON line {"check":"stress_proc",...}. */
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
static CUcontext primary;
static int ops_per_thread;
static uint64_t seed;
static int stage_exec;
static char **saved_argv;
static size_t vmm_gran;
static pthread_barrier_t start;

/* Resets take it for writing; every operation on the primary context runs under it for reading,
 * so no thread uses (or frees) what a reset has just freed. */
static pthread_rwlock_t reset_lock;
static unsigned reset_gen; /* under reset_lock */

#define OK_OR_OOM(rc, what)                                                                    \
    EXPECT((rc) == CUDA_SUCCESS || (rc) == CUDA_ERROR_OUT_OF_MEMORY, "%s returned %d", what,  \
           (int)(rc))

enum { PLAIN = 4, PITCHED = 2, MANAGED = 2, ASYNC = 3, VMM = 2 };

struct worker {
    int index;
    uint64_t x;
    unsigned gen;
    CUstream stream;
    CUdeviceptr plain[PLAIN], pitched[PITCHED], managed[MANAGED], async[ASYNC];
    struct { CUmemGenericAllocationHandle h; CUdeviceptr va; size_t size; } vmm[VMM];
    unsigned long allocs, ooms, resets, contexts, arrays;
};

static uint64_t next(uint64_t *x) {
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    return *x;
}

static size_t upto(struct worker *w, size_t max) { return 1 + (size_t)(next(&w->x) % max); }

static void count(struct worker *w, CUresult rc, const char *what) {
    OK_OR_OOM(rc, what);
    if (rc == CUDA_SUCCESS) w->allocs++;
    else w->ooms++;
}

/* After a reset: what the primary context held is gone (never freed again), its streams too. */
static void adopt_generation(struct worker *w, unsigned gen) {
    memset(w->plain, 0, sizeof w->plain);
    memset(w->pitched, 0, sizeof w->pitched);
    memset(w->managed, 0, sizeof w->managed);
    memset(w->async, 0, sizeof w->async);
    CHECK(cuDevicePrimaryCtxRetain(&primary, dev));
    CHECK(cuCtxSetCurrent(primary));
    CHECK(cuStreamCreate(&w->stream, CU_STREAM_NON_BLOCKING));
    w->gen = gen;
}

static void slot_plain(struct worker *w, CUdeviceptr *p, int kind) {
    if (*p) {
        CHECK(cuMemFree(*p));
        *p = 0;
        return;
    }
    CUresult rc;
    if (kind == 0) {
        rc = cuMemAlloc(p, upto(w, 8 * MIB));
        count(w, rc, "cuMemAlloc");
    } else if (kind == 1) {
        size_t pitch;
        rc = cuMemAllocPitch(p, &pitch, upto(w, 4096) * 4, upto(w, 1024), 4);
        count(w, rc, "cuMemAllocPitch");
    } else {
        rc = cuMemAllocManaged(p, upto(w, 8 * MIB), CU_MEM_ATTACH_GLOBAL);
        count(w, rc, "cuMemAllocManaged");
    }
    if (rc != CUDA_SUCCESS) *p = 0;
}

static void slot_async(struct worker *w, CUdeviceptr *p) {
    if (*p) {
        CHECK(cuMemFreeAsync(*p, w->stream));
        *p = 0;
        return;
    }
    CUresult rc = cuMemAllocAsync(p, upto(w, 8 * MIB), w->stream);
    count(w, rc, "cuMemAllocAsync");
    if (rc != CUDA_SUCCESS) *p = 0;
}

static void vmm_free(struct worker *w, int k) {
    CHECK(cuMemUnmap(w->vmm[k].va, w->vmm[k].size));
    CHECK(cuMemAddressFree(w->vmm[k].va, w->vmm[k].size));
    CHECK(cuMemRelease(w->vmm[k].h));
    w->vmm[k].h = 0;
}

static void slot_vmm(struct worker *w, int k) {
    if (w->vmm[k].h) {
        vmm_free(w, k);
        return;
    }
    size_t size = upto(w, 4) * vmm_gran;
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof prop);
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = dev;
    CUmemGenericAllocationHandle h;
    CUresult rc = cuMemCreate(&h, size, &prop, 0);
    count(w, rc, "cuMemCreate");
    if (rc != CUDA_SUCCESS) return;
    CUdeviceptr va;
    CHECK(cuMemAddressReserve(&va, size, 0, 0, 0));
    CHECK(cuMemMap(va, size, 0, h, 0));
    CUmemAccessDesc access;
    memset(&access, 0, sizeof access);
    access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    access.location.id = dev;
    access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    CHECK(cuMemSetAccess(va, size, &access, 1));
    w->vmm[k].h = h;
    w->vmm[k].va = va;
    w->vmm[k].size = size;
}

static void array_once(struct worker *w) {
    CUDA_ARRAY_DESCRIPTOR d = {upto(w, 2048), upto(w, 1024), CU_AD_FORMAT_FLOAT, 1};
    CUarray a;
    CUresult rc = cuArrayCreate(&a, &d);
    count(w, rc, "cuArrayCreate");
    if (rc == CUDA_SUCCESS) {
        w->arrays++;
        CHECK(cuArrayDestroy(a));
    }
}

/* A created context, destroyed with allocations alive (the driver frees them with it). */
static void context_once(struct worker *w) {
    CUcontext c;
    CHECK(cuCtxCreate(&c, NULL, 0, dev));
    CUdeviceptr p[3] = {0};
    for (int i = 0; i < 3; i++) {
        CUresult rc = cuMemAlloc(&p[i], upto(w, 8 * MIB));
        count(w, rc, "cuMemAlloc in a created context");
        if (rc != CUDA_SUCCESS) p[i] = 0;
    }
    if (p[0]) CHECK(cuMemFree(p[0]));
    CHECK(cuCtxDestroy(c));
    CHECK(cuCtxSetCurrent(primary));
    w->contexts++;
}

static void *work(void *arg) {
    struct worker *w = arg;
    CHECK(cuCtxSetCurrent(primary));
    CHECK(cuStreamCreate(&w->stream, CU_STREAM_NON_BLOCKING));
    pthread_barrier_wait(&start);
    for (int i = 0; i < ops_per_thread; i++) {
        if (stage_exec && w->index == 0 && i == ops_per_thread / 2) {
            /* A new image of this process while the other threads work (they vanish). */
            char threads[16], ops[16], s[32];
            snprintf(threads, sizeof threads, "%s", saved_argv[1]);
            snprintf(ops, sizeof ops, "%s", saved_argv[2]);
            snprintf(s, sizeof s, "%llu", (unsigned long long)(seed + 1));
            char *args[] = {saved_argv[0], threads, ops, s, "execd", NULL};
            fflush(stdout);
            execv("/proc/self/exe", args);
            EXPECT(0, "execv failed");
        }
        unsigned op = (unsigned)(next(&w->x) % 100);
        if (op >= 98) {
            if (op == 99 && next(&w->x) % 4 == 0) {
                pthread_rwlock_wrlock(&reset_lock);
                CHECK(cuDevicePrimaryCtxReset(dev));
                reset_gen++;
                pthread_rwlock_unlock(&reset_lock);
                w->resets++;
            } else {
                context_once(w);
            }
            continue;
        }
        pthread_rwlock_rdlock(&reset_lock);
        if (w->gen != reset_gen) adopt_generation(w, reset_gen);
        if (op < 30) slot_plain(w, &w->plain[next(&w->x) % PLAIN], 0);
        else if (op < 45) slot_plain(w, &w->pitched[next(&w->x) % PITCHED], 1);
        else if (op < 55) slot_plain(w, &w->managed[next(&w->x) % MANAGED], 2);
        else if (op < 80) slot_async(w, &w->async[next(&w->x) % ASYNC]);
        else if (op < 90) slot_vmm(w, (int)(next(&w->x) % VMM));
        else array_once(w);
        if (op % 8 == 0) CHECK(cuStreamSynchronize(w->stream));
        pthread_rwlock_unlock(&reset_lock);
    }
    pthread_rwlock_rdlock(&reset_lock);
    if (w->gen == reset_gen) {
        for (int k = 0; k < PLAIN; k++) if (w->plain[k]) CHECK(cuMemFree(w->plain[k]));
        for (int k = 0; k < PITCHED; k++) if (w->pitched[k]) CHECK(cuMemFree(w->pitched[k]));
        for (int k = 0; k < MANAGED; k++) if (w->managed[k]) CHECK(cuMemFree(w->managed[k]));
        for (int k = 0; k < ASYNC; k++) if (w->async[k]) CHECK(cuMemFreeAsync(w->async[k], w->stream));
        CHECK(cuStreamSynchronize(w->stream));
    }
    pthread_rwlock_unlock(&reset_lock);
    for (int k = 0; k < VMM; k++)
        if (w->vmm[k].h) vmm_free(w, k);
    return NULL;
}

static void setup(void) {
    CHECK(cuInit(0));
    CHECK(cuDeviceGet(&dev, 0));
    CHECK(cuDevicePrimaryCtxRetain(&primary, dev));
    CHECK(cuCtxSetCurrent(primary));
}

int main(int argc, char **argv) {
    EXPECT(argc == 5, "usage: shim_quota_stress THREADS OPS SEED wait|exec|execd|probe");
    saved_argv = argv;
    int threads = atoi(argv[1]);
    ops_per_thread = atoi(argv[2]);
    seed = strtoull(argv[3], NULL, 0);
    const char *stage = argv[4];
    setup();
    if (!strcmp(stage, "probe")) {
        size_t f = 0, t = 0;
        CHECK(cuMemGetInfo(&f, &t));
        printf("{\"check\":\"probe\",\"free\":%zu,\"total\":%zu}\n", f, t);
        printf("probe\n");
        fflush(stdout);
        char line[16];
        if (!fgets(line, sizeof line, stdin)) {
        }
        return 0;
    }
    EXPECT(threads > 0 && threads <= 32 && ops_per_thread > 0, "bad arguments");
    stage_exec = !strcmp(stage, "exec");
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof prop);
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = dev;
    CHECK(cuMemGetAllocationGranularity(&vmm_gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
    CUmemoryPool pool;
    CHECK(cuDeviceGetDefaultMemPool(&pool, dev));
    cuuint64_t keep_all = ~0ull;
    CHECK(cuMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &keep_all));
    if (strcmp(stage, "execd") != 0) {
        printf("ready\n");
        fflush(stdout);
        char buf[64];
        while (fread(buf, 1, sizeof buf, stdin) > 0) {
        }
    }
    pthread_rwlockattr_t attr; /* writers first: a reset must not wait for ever */
    pthread_rwlockattr_init(&attr);
    pthread_rwlockattr_setkind_np(&attr, PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP);
    pthread_rwlock_init(&reset_lock, &attr);
    pthread_t tid[32];
    static struct worker ws[32];
    pthread_barrier_init(&start, NULL, (unsigned)threads);
    for (int t = 0; t < threads; t++) {
        ws[t].index = t;
        ws[t].x = 0x9E3779B97F4A7C15ull ^ (seed << 20) ^ (uint64_t)(t + 1) * 0x100000001B3ull;
        EXPECT(pthread_create(&tid[t], NULL, work, &ws[t]) == 0, "pthread_create");
    }
    struct worker sum;
    memset(&sum, 0, sizeof sum);
    for (int t = 0; t < threads; t++) {
        pthread_join(tid[t], NULL);
        sum.allocs += ws[t].allocs;
        sum.ooms += ws[t].ooms;
        sum.resets += ws[t].resets;
        sum.contexts += ws[t].contexts;
        sum.arrays += ws[t].arrays;
    }
    printf("{\"check\":\"stress_proc\",\"stage\":\"%s\",\"allocs\":%lu,\"ooms\":%lu,\"resets\":%lu,"
           "\"contexts\":%lu,\"arrays\":%lu}\n",
           stage, sum.allocs, sum.ooms, sum.resets, sum.contexts, sum.arrays);
    return 0;
}
