// Streams, events and host memory the way simpleStreams / asyncAPI / simpleCallback /
// simpleZeroCopy / simpleHostRegister / UnifiedMemoryStreams use them, through the CUDA 13.5
// runtime. Kernels do not compute on simgpu: only bytes moved by copies and memsets are checked.
// Prints one JSON line {"check":"streams", ...}; "FAIL ..." and exit 1 on any unexpected error.
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include "check.h"

__global__ void touch(unsigned char *p, size_t n) {
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i < n) p[i] ^= 1;
}

static int order[16];
static volatile int order_n = 0;
static void CUDART_CB host_fn(void *arg) { order[order_n++] = (int)(size_t)arg; }
static void CUDART_CB callback(cudaStream_t, cudaError_t status, void *arg) {
    order[order_n++] = status == cudaSuccess ? (int)(size_t)arg : -1;
}

static int check_bytes(const unsigned char *p, size_t n, unsigned char v) {
    for (size_t i = 0; i < n; i++)
        if (p[i] != v) return 0;
    return 1;
}

int main(void) {
    CHECK(cudaSetDeviceFlags(cudaDeviceMapHost));
    const size_t n = 4 << 20;
    const int nstreams = 4;

    // simpleStreams: pinned memory, one chunk per stream: memset, kernel, copy back.
    unsigned char *h, *d;
    CHECK(cudaMallocHost(&h, n));
    CHECK(cudaMalloc(&d, n));
    int lo = 0, hi = 0;
    CHECK(cudaDeviceGetStreamPriorityRange(&lo, &hi));
    cudaStream_t s[nstreams];
    for (int i = 0; i < nstreams; i++) {
        if (i % 2) CHECK(cudaStreamCreateWithPriority(&s[i], cudaStreamNonBlocking, i == 1 ? hi : lo));
        else CHECK(cudaStreamCreateWithFlags(&s[i], cudaStreamDefault));
    }
    int prio = 99;
    unsigned sflags = 99;
    CHECK(cudaStreamGetPriority(s[1], &prio));
    CHECK(cudaStreamGetFlags(s[1], &sflags));
    EXPECT(prio == hi && sflags == cudaStreamNonBlocking, "priority %d flags %u", prio, sflags);
    unsigned long long sid0 = 0, sid1 = 0;
    CHECK(cudaStreamGetId(s[0], &sid0));
    CHECK(cudaStreamGetId(s[1], &sid1));
    EXPECT(sid0 != sid1, "stream ids");
    cudaEvent_t start, stop;
    CHECK(cudaEventCreate(&start));
    CHECK(cudaEventCreateWithFlags(&stop, cudaEventBlockingSync));
    CHECK(cudaEventRecord(start, 0));
    const size_t chunk = n / nstreams;
    for (int i = 0; i < nstreams; i++) {
        CHECK(cudaMemsetAsync(d + i * chunk, 0x10 + i, chunk, s[i]));
        touch<<<(unsigned)(chunk / 256), 256, 0, s[i]>>>(d + i * chunk, chunk);
        CHECK(cudaMemcpyAsync(h + i * chunk, d + i * chunk, chunk, cudaMemcpyDeviceToHost, s[i]));
    }
    CHECK(cudaEventRecord(stop, 0));
    CHECK(cudaEventSynchronize(stop));
    float ms = -1;
    CHECK(cudaEventElapsedTime(&ms, start, stop));
    int streams_ok = 1;
    for (int i = 0; i < nstreams; i++) streams_ok &= check_bytes(h + i * chunk, chunk, 0x10 + i);

    // asyncAPI: poll an event while the GPU works; cross-stream waits.
    cudaEvent_t ev, nt;
    CHECK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
    CHECK(cudaEventCreateWithFlags(&nt, cudaEventDisableTiming));
    memset(h, 0x5a, n);
    CHECK(cudaMemcpyAsync(d, h, n, cudaMemcpyHostToDevice, s[0]));
    CHECK(cudaEventRecord(ev, s[0]));
    CHECK(cudaStreamWaitEvent(s[1], ev, 0));
    CHECK(cudaMemcpyAsync(h + n / 2, d, n / 2, cudaMemcpyDeviceToHost, s[1]));
    CHECK(cudaEventRecord(nt, s[1]));
    long polls = 0;
    while (cudaEventQuery(nt) == cudaErrorNotReady) polls++;
    CHECK(cudaStreamSynchronize(s[1]));
    EXPECT(cudaStreamQuery(s[1]) == cudaSuccess, "stream query after sync");
    int wait_ok = check_bytes(h, n, 0x5a);
    float bad_ms;
    int no_timing = (int)cudaEventElapsedTime(&bad_ms, ev, nt);  // cudaErrorInvalidResourceHandle
    cudaGetLastError();

    // simpleCallback: host functions and callbacks run in stream order after earlier work.
    order_n = 0;
    CHECK(cudaLaunchHostFunc(s[2], host_fn, (void *)1));
    CHECK(cudaMemsetAsync(d, 7, n, s[2]));
    CHECK(cudaStreamAddCallback(s[2], callback, (void *)2, 0));
    CHECK(cudaLaunchHostFunc(s[2], host_fn, (void *)3));
    CHECK(cudaStreamSynchronize(s[2]));
    int cb_ok = order_n == 3 && order[0] == 1 && order[1] == 2 && order[2] == 3;

    // simpleZeroCopy: mapped pinned memory, seen through its device pointer.
    unsigned char *mapped, *mapped_dev;
    CHECK(cudaHostAlloc(&mapped, 1 << 20, cudaHostAllocMapped | cudaHostAllocPortable | cudaHostAllocWriteCombined));
    CHECK(cudaHostGetDevicePointer(&mapped_dev, mapped, 0));
    unsigned hflags = 0;
    CHECK(cudaHostGetFlags(&hflags, mapped));
    EXPECT(hflags & cudaHostAllocMapped, "host flags %#x", hflags);
    touch<<<4096, 256>>>(mapped_dev, 1 << 20);
    CHECK(cudaMemset(mapped_dev, 0x33, 1 << 20));
    CHECK(cudaDeviceSynchronize());
    int zero_copy_ok = check_bytes(mapped, 1 << 20, 0x33);

    // simpleHostRegister: page-locking an existing allocation, then async copies from it.
    size_t rn = 2 << 20;
    unsigned char *reg = (unsigned char *)mmap(NULL, rn, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    EXPECT(reg != MAP_FAILED, "mmap");
    memset(reg, 0x42, rn);
    CHECK(cudaHostRegister(reg, rn, cudaHostRegisterMapped | cudaHostRegisterPortable));
    unsigned char *reg_dev;
    CHECK(cudaHostGetDevicePointer(&reg_dev, reg, 0));
    CHECK(cudaMemcpyAsync(d, reg, rn, cudaMemcpyHostToDevice, s[3]));
    CHECK(cudaMemsetAsync(reg_dev + rn / 2, 0x24, rn / 2, s[3]));
    CHECK(cudaStreamSynchronize(s[3]));
    CHECK(cudaMemcpy(h, d, rn, cudaMemcpyDeviceToHost));
    int reg_ok = check_bytes(h, rn, 0x42) && check_bytes(reg + rn / 2, rn / 2, 0x24) && check_bytes(reg, rn / 2, 0x42);
    cudaPointerAttributes pa;
    CHECK(cudaPointerGetAttributes(&pa, reg));
    int reg_type = (int)pa.type;
    CHECK(cudaHostUnregister(reg));
    int unreg_again = (int)cudaHostUnregister(reg);  // cudaErrorHostMemoryNotRegistered
    cudaGetLastError();
    munmap(reg, rn);

    // UnifiedMemoryStreams: managed memory, prefetch, advice, attach, host access after sync.
    unsigned char *m;
    const size_t mn = 8 << 20;
    CHECK(cudaMallocManaged(&m, mn, cudaMemAttachGlobal));
    memset(m, 0x11, mn);
    cudaMemLocation dev0 = {cudaMemLocationTypeDevice, 0};
    cudaMemLocation host = {cudaMemLocationTypeHost, 0};
    CHECK(cudaMemAdvise(m, mn, cudaMemAdviseSetPreferredLocation, dev0));
    CHECK(cudaMemAdvise(m, mn, cudaMemAdviseSetAccessedBy, dev0));
    CHECK(cudaMemAdvise(m, mn / 2, cudaMemAdviseSetReadMostly, dev0));
    CHECK(cudaMemPrefetchAsync(m, mn, dev0, 0, s[0]));
    touch<<<(unsigned)(mn / 256), 256, 0, s[0]>>>(m, mn);
    CHECK(cudaMemsetAsync(m, 0x22, mn / 2, s[0]));
    CHECK(cudaMemPrefetchAsync(m, mn, host, 0, s[0]));
    CHECK(cudaStreamSynchronize(s[0]));
    int managed_ok = check_bytes(m, mn / 2, 0x22);
    int loc = -5;
    CHECK(cudaMemRangeGetAttribute(&loc, sizeof loc, cudaMemRangeAttributePreferredLocation, m, mn));
    int read_mostly = -1;
    CHECK(cudaMemRangeGetAttribute(&read_mostly, sizeof read_mostly, cudaMemRangeAttributeReadMostly, m, mn / 2));
    int last_prefetch = -5;
    CHECK(cudaMemRangeGetAttribute(&last_prefetch, sizeof last_prefetch,
                                   cudaMemRangeAttributeLastPrefetchLocation, m, mn));
    int accessed_by[2] = {-5, -5};
    CHECK(cudaMemRangeGetAttribute(accessed_by, sizeof accessed_by, cudaMemRangeAttributeAccessedBy, m, mn));
    unsigned char *m2;
    CHECK(cudaMallocManaged(&m2, 1 << 20, cudaMemAttachHost));
    CHECK(cudaStreamAttachMemAsync(s[1], m2, 0, cudaMemAttachSingle));
    CHECK(cudaMemsetAsync(m2, 9, 1 << 20, s[1]));
    CHECK(cudaStreamSynchronize(s[1]));
    int attach_ok = check_bytes(m2, 1 << 20, 9);
    CHECK(cudaMemAdvise(m, mn, cudaMemAdviseUnsetPreferredLocation, dev0));
    CHECK(cudaPointerGetAttributes(&pa, m));
    int managed_type = (int)pa.type;

    // Stream-ordered allocation, cudaMemcpyDefault (UVA) and a default-stream sync.
    void *a;
    CHECK(cudaMallocAsync(&a, 1 << 20, s[2]));
    CHECK(cudaMemsetAsync(a, 0x77, 1 << 20, s[2]));
    CHECK(cudaMemcpyAsync(h, a, 1 << 20, cudaMemcpyDefault, s[2]));
    CHECK(cudaFreeAsync(a, s[2]));
    CHECK(cudaStreamSynchronize(s[2]));
    int pool_ok = check_bytes(h, 1 << 20, 0x77);

    // Callbacks registered on the legacy stream and a per-thread stream.
    order_n = 0;
    CHECK(cudaLaunchHostFunc(cudaStreamPerThread, host_fn, (void *)4));
    CHECK(cudaStreamSynchronize(cudaStreamPerThread));
    CHECK(cudaLaunchHostFunc(cudaStreamLegacy, host_fn, (void *)5));
    CHECK(cudaDeviceSynchronize());
    int default_cb_ok = order_n == 2 && order[0] == 4 && order[1] == 5;

    for (int i = 0; i < nstreams; i++) CHECK(cudaStreamDestroy(s[i]));
    CHECK(cudaEventDestroy(start));
    CHECK(cudaEventDestroy(stop));
    CHECK(cudaEventDestroy(ev));
    CHECK(cudaEventDestroy(nt));
    CHECK(cudaFree(m));
    CHECK(cudaFree(m2));
    CHECK(cudaFreeHost(mapped));
    CHECK(cudaFreeHost(h));
    CHECK(cudaFree(d));
    printf("{\"check\":\"streams\",\"streams_ok\":%d,\"elapsed_ms\":%.3f,\"wait_ok\":%d,\"polls\":%ld,"
           "\"no_timing\":%d,\"callbacks_ok\":%d,\"zero_copy_ok\":%d,\"registered_ok\":%d,"
           "\"registered_type\":%d,\"unregister_again\":%d,\"managed_ok\":%d,\"preferred\":%d,"
           "\"read_mostly\":%d,\"last_prefetch\":%d,\"accessed_by\":[%d,%d],\"attach_ok\":%d,\"managed_type\":%d,"
           "\"pool_ok\":%d,\"default_cb_ok\":%d}\n",
           streams_ok, ms, wait_ok, polls, no_timing, cb_ok, zero_copy_ok, reg_ok, reg_type, unreg_again,
           managed_ok, loc, read_mostly, last_prefetch, accessed_by[0], accessed_by[1], attach_ok,
           managed_type, pool_ok, default_cb_ok);
    return 0;
}
