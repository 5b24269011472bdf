/* Freeing device memory on simgpu as the driver does it (driver API, linked with -lcuda), one
 * mode per run; each prints one JSON line {"check": <mode>, ...} or "FAIL ..." and exits 1.
 *
 *   sim_free pending      cuMemFree, cuArrayDestroy, cuMemUnmap, cuMemFreeHost and
 *                         cuMemPoolTrimTo with copies still queued on the memory: each waits for
 *                         them (no crash), the stream is idle afterwards, the memory comes back
 *   sim_free ctx_race     allocations (plain, stream-ordered, arrays) in other threads racing
 *                         cuCtxDestroy: none survives it
 *   sim_free arrays       oversized and overflowing arrays are refused and charge nothing; an
 *                         array is freed with its context
 *   sim_free primary      the last cuDevicePrimaryCtxRelease frees the context's memory
 *   sim_free vmm_release_mapped   a VMM allocation released while mapped still counts
 *
 * Device memory is read with cuMemGetInfo (simgpu's own accounting of the device). */
#include <cuda.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include "check.h"

#define MIB (1ull << 20)

static size_t used(void) {
    size_t f, t;
    CHECK(cuMemGetInfo(&f, &t));
    return t - f;
}

/* Queues `n` host-to-device copies of `bytes` from pinned `src` to `dst` on `s` (each takes
 * bytes / 25 GB/s of modelled time, so the queue is still full when the caller frees). */
static void queue_copies(CUdeviceptr dst, const void *src, size_t bytes, int n, CUstream s) {
    for (int i = 0; i < n; i++) CHECK(cuMemcpyHtoDAsync(dst, src, bytes, s));
}

static int pending(void) {
    CUdevice d; CUcontext c; CUstream s;
    CHECK(cuInit(0)); CHECK(cuDeviceGet(&d, 0));
    CHECK(cuDevicePrimaryCtxRetain(&c, d)); CHECK(cuCtxSetCurrent(c));
    CHECK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    const size_t bytes = 32 * MIB;
    void *host;
    CHECK(cuMemHostAlloc(&host, bytes, 0));
    memset(host, 7, bytes);
    size_t base = used();

    /* cuMemFree */
    CUdeviceptr p;
    CHECK(cuMemAlloc(&p, bytes));
    queue_copies(p, host, bytes, 20, s);
    int busy_free = cuStreamQuery(s) == CUDA_ERROR_NOT_READY;
    CHECK(cuMemFree(p));
    int idle_free = cuStreamQuery(s) == CUDA_SUCCESS;
    size_t after_free = used();

    /* cuArrayDestroy */
    CUDA_ARRAY_DESCRIPTOR ad = {.Width = 4096, .Height = 2048, .Format = CU_AD_FORMAT_UNSIGNED_INT32, .NumChannels = 1}; /* 32 MiB */
    CUarray arr;
    CHECK(cuArrayCreate(&arr, &ad));
    for (int i = 0; i < 20; i++) CHECK(cuMemcpyHtoAAsync(arr, 0, host, bytes, s));
    CHECK(cuArrayDestroy(arr));
    int idle_array = cuStreamQuery(s) == CUDA_SUCCESS;
    size_t after_array = used();

    /* cuMemUnmap / cuMemRelease */
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof prop);
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = 0;
    CUdeviceptr va;
    CUmemGenericAllocationHandle h;
    CHECK(cuMemAddressReserve(&va, bytes, 0, 0, 0));
    CHECK(cuMemCreate(&h, bytes, &prop, 0));
    CHECK(cuMemMap(va, bytes, 0, h, 0));
    CUmemAccessDesc acc = {.location = prop.location, .flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
    CHECK(cuMemSetAccess(va, bytes, &acc, 1));
    /* Released while mapped: the memory stays until its last mapping goes. */
    CHECK(cuMemRelease(h));
    size_t released_mapped = used();
    queue_copies(va, host, bytes, 20, s);
    CHECK(cuMemUnmap(va, bytes));
    int idle_unmap = cuStreamQuery(s) == CUDA_SUCCESS;
    size_t after_unmap = used();
    CHECK(cuMemAddressFree(va, bytes));

    /* A pool block freed in stream order, trimmed before the stream reached the free. */
    CUdeviceptr q;
    CHECK(cuMemAllocAsync(&q, bytes, s));
    queue_copies(q, host, bytes, 20, s);
    CHECK(cuMemFreeAsync(q, s));
    CUmemoryPool pool;
    CHECK(cuDeviceGetDefaultMemPool(&pool, d));
    CHECK(cuMemPoolTrimTo(pool, 0));
    CHECK(cuStreamSynchronize(s));
    CHECK(cuMemPoolTrimTo(pool, 0));
    size_t after_pool = used();

    /* cuMemFreeHost of the source of queued copies. */
    CHECK(cuMemAlloc(&p, bytes));
    queue_copies(p, host, bytes, 20, s);
    CHECK(cuMemFreeHost(host));
    int idle_free_host = cuStreamQuery(s) == CUDA_SUCCESS;
    CHECK(cuMemFree(p));
    size_t end = used();

    printf("{\"check\":\"pending\",\"busy_before_free\":%d,\"idle_after_free\":%d,"
           "\"idle_after_array_destroy\":%d,\"idle_after_unmap\":%d,\"idle_after_free_host\":%d,"
           "\"base\":%zu,\"after_free\":%zu,\"after_array\":%zu,\"released_mapped\":%zu,"
           "\"after_unmap\":%zu,\"after_pool\":%zu,\"end\":%zu}\n",
           busy_free, idle_free, idle_array, idle_unmap, idle_free_host, base, after_free,
           after_array, released_mapped, after_unmap, after_pool, end);
    return 0;
}

static CUcontext race_ctx;
static int race_started, race_go;

/* Allocates 1 MiB in `race_ctx` — plain, stream-ordered (legacy stream) and as a CUDA array,
 * in turn — until an allocation fails (the context is gone). */
static void *racer(void *arg) {
    long *ok = arg;
    CHECK(cuCtxSetCurrent(race_ctx));
    __atomic_add_fetch(&race_started, 1, __ATOMIC_ACQ_REL);
    while (!__atomic_load_n(&race_go, __ATOMIC_ACQUIRE)) sched_yield();
    CUDA_ARRAY_DESCRIPTOR ad = {.Width = 1024, .Height = 256, .Format = CU_AD_FORMAT_FLOAT, .NumChannels = 1};
    for (long i = 0;; i++) {
        CUdeviceptr p;
        CUarray a;
        CUresult r = i % 3 == 0   ? cuMemAlloc(&p, MIB)
                     : i % 3 == 1 ? cuMemAllocAsync(&p, MIB, 0)
                                  : cuArrayCreate(&a, &ad);
        if (r != CUDA_SUCCESS) break;
        (*ok)++;
    }
    return NULL;
}

static int ctx_race(void) {
    CUdevice d;
    CHECK(cuInit(0)); CHECK(cuDeviceGet(&d, 0));
    CUcontext keep;
    CHECK(cuCtxCreate(&keep, NULL, 0, d)); /* for cuMemGetInfo between rounds */
    size_t base = used();
    long allocated = 0, leaked_rounds = 0;
    const int rounds = 100, threads = 4;
    for (int r = 0; r < rounds; r++) {
        CHECK(cuCtxCreate(&race_ctx, NULL, 0, d));
        CHECK(cuCtxSetCurrent(keep));
        race_started = 0;
        race_go = 0;
        pthread_t t[threads];
        long ok[threads];
        for (int i = 0; i < threads; i++) {
            ok[i] = 0;
            pthread_create(&t[i], NULL, racer, &ok[i]);
        }
        while (__atomic_load_n(&race_started, __ATOMIC_ACQUIRE) < threads) sched_yield();
        __atomic_store_n(&race_go, 1, __ATOMIC_RELEASE);
        struct timespec ts = {0, (r % 10) * 20000}; /* 0-180 us into the allocations */
        nanosleep(&ts, NULL);
        CHECK(cuCtxDestroy(race_ctx));
        for (int i = 0; i < threads; i++) {
            pthread_join(t[i], NULL);
            allocated += ok[i];
        }
        CHECK(cuCtxSetCurrent(keep));
        if (used() != base) leaked_rounds++;
        EXPECT(used() - base < 512 * MIB, "round %d: %zu MiB left", r, (used() - base) >> 20);
    }
    printf("{\"check\":\"ctx_race\",\"rounds\":%d,\"allocated\":%ld,\"leaked_rounds\":%ld,"
           "\"base\":%zu,\"end\":%zu}\n",
           rounds, allocated, leaked_rounds, base, used());
    return 0;
}

static int arrays(void) {
    CUdevice d; CUcontext c;
    CHECK(cuInit(0)); CHECK(cuDeviceGet(&d, 0));
    CHECK(cuCtxCreate(&c, NULL, 0, d));
    size_t base = used();
    CUarray a;
    /* 2^40 x 2^40 elements: the byte count overflows 64 bits. */
    CUDA_ARRAY_DESCRIPTOR huge = {.Width = 1ull << 40, .Height = 1ull << 40, .Format = CU_AD_FORMAT_FLOAT, .NumChannels = 4};
    int r_huge = cuArrayCreate(&a, &huge);
    CUDA_ARRAY3D_DESCRIPTOR huge3 = {.Width = 1ull << 40, .Height = 1ull << 40, .Depth = 1ull << 40, .Format = CU_AD_FORMAT_FLOAT, .NumChannels = 4};
    int r_huge3 = cuArray3DCreate(&a, &huge3);
    /* One past the 1D texture limit (131072). */
    CUDA_ARRAY_DESCRIPTOR wide = {.Width = 131073, .Height = 0, .Format = CU_AD_FORMAT_UNSIGNED_INT8, .NumChannels = 1};
    int r_wide = cuArrayCreate(&a, &wide);
    /* Within every limit but 64 TiB: more than the device has. */
    CUDA_ARRAY3D_DESCRIPTOR big = {.Width = 16384, .Height = 16384, .Depth = 16384, .Format = CU_AD_FORMAT_FLOAT, .NumChannels = 4};
    int r_big = cuArray3DCreate(&a, &big);
    size_t after_refused = used();
    /* A 64 MiB array left to its context's destruction. */
    CUDA_ARRAY_DESCRIPTOR ok = {.Width = 8192, .Height = 2048, .Format = CU_AD_FORMAT_FLOAT, .NumChannels = 1};
    CHECK(cuArrayCreate(&a, &ok));
    size_t with_array = used();
    CHECK(cuCtxDestroy(c));
    CHECK(cuCtxCreate(&c, NULL, 0, d));
    size_t after_destroy = used();
    printf("{\"check\":\"arrays\",\"huge\":%d,\"huge3d\":%d,\"wide\":%d,\"big\":%d,\"base\":%zu,"
           "\"after_refused\":%zu,\"with_array\":%zu,\"after_destroy\":%zu}\n",
           r_huge, r_huge3, r_wide, r_big, base, after_refused, with_array, after_destroy);
    return 0;
}

static int primary(void) {
    CUdevice d; CUcontext c, keep;
    CHECK(cuInit(0)); CHECK(cuDeviceGet(&d, 0));
    CHECK(cuCtxCreate(&keep, NULL, 0, d)); /* for cuMemGetInfo once the primary is gone */
    size_t base = used();
    CHECK(cuDevicePrimaryCtxRetain(&c, d));
    CHECK(cuDevicePrimaryCtxRetain(&c, d));
    CHECK(cuCtxPushCurrent(c));
    CUdeviceptr p;
    CHECK(cuMemAlloc(&p, 100 * MIB));
    CUDA_ARRAY_DESCRIPTOR ad = {.Width = 4096, .Height = 1024, .Format = CU_AD_FORMAT_FLOAT, .NumChannels = 1};
    CUarray a;
    CHECK(cuArrayCreate(&a, &ad)); /* 16 MiB */
    CHECK(cuCtxPopCurrent(NULL));
    size_t allocated = used();
    CHECK(cuDevicePrimaryCtxRelease(d)); /* 2 -> 1: still alive */
    size_t after_first = used();
    unsigned flags; int active;
    CHECK(cuDevicePrimaryCtxGetState(d, &flags, &active));
    CHECK(cuDevicePrimaryCtxRelease(d)); /* 1 -> 0: destroyed with its memory */
    size_t after_last = used();
    int active_after;
    CHECK(cuDevicePrimaryCtxGetState(d, &flags, &active_after));
    int extra_release = cuDevicePrimaryCtxRelease(d);
    printf("{\"check\":\"primary\",\"base\":%zu,\"allocated\":%zu,\"after_first_release\":%zu,"
           "\"active\":%d,\"after_last_release\":%zu,\"active_after\":%d,\"extra_release\":%d}\n",
           base, allocated, after_first, active, after_last, active_after, extra_release);
    return 0;
}

/* A VMM allocation released while still mapped keeps its memory (CUDA frees it at the last
 * unmap), so a quota must keep charging it: after the release, an allocation as large must
 * still be refused under a quota that fitted only the first. Prints the result codes. */
static int vmm_release_mapped(void) {
    CUdevice d; CUcontext c;
    CHECK(cuInit(0)); CHECK(cuDeviceGet(&d, 0));
    CHECK(cuDevicePrimaryCtxRetain(&c, d)); CHECK(cuCtxSetCurrent(c));
    const size_t bytes = 384 * MIB;
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof prop);
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = 0;
    CUdeviceptr va, p;
    CUmemGenericAllocationHandle h;
    CHECK(cuMemAddressReserve(&va, bytes, 0, 0, 0));
    CHECK(cuMemCreate(&h, bytes, &prop, 0));
    CHECK(cuMemMap(va, bytes, 0, h, 0));
    CHECK(cuMemRelease(h));
    int second = cuMemAlloc(&p, bytes);
    if (second == CUDA_SUCCESS) CHECK(cuMemFree(p));
    CHECK(cuMemUnmap(va, bytes));
    CHECK(cuMemAddressFree(va, bytes));
    int after_unmap = cuMemAlloc(&p, bytes);
    printf("{\"check\":\"vmm_release_mapped\",\"second\":%d,\"after_unmap\":%d}\n", second, after_unmap);
    return 0;
}

int main(int argc, char **argv) {
    const char *mode = argc > 1 ? argv[1] : "";
    if (!strcmp(mode, "pending")) return pending();
    if (!strcmp(mode, "ctx_race")) return ctx_race();
    if (!strcmp(mode, "arrays")) return arrays();
    if (!strcmp(mode, "primary")) return primary();
    if (!strcmp(mode, "vmm_release_mapped")) return vmm_release_mapped();
    printf("FAIL unknown mode %s\n", mode);
    return 1;
}
