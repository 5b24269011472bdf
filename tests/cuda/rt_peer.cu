// Two GPUs the way simpleP2P / multi-GPU programs use them, through the CUDA 13.5 runtime (run
// with SIMGPU_DEVICES=2): peer capability queries, enabling/disabling peer access and its error
// codes, cudaMemcpyPeer(Async), cudaMemcpy with cudaMemcpyDefault across devices, a kernel on one
// device given the other's memory, cross-device event waits, pointer attributes.
// Prints {"check":"peer", ...}; "FAIL ..." and exit 1 on any unexpected error.
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "check.h"

__global__ void add(float *dst, const float *src, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) dst[i] += src[i];
}

static int all(const unsigned char *p, size_t n, unsigned char v) {
    for (size_t i = 0; i < n; i++)
        if (p[i] != v) return 0;
    return 1;
}

int main(void) {
    int count = 0;
    CHECK(cudaGetDeviceCount(&count));
    EXPECT(count >= 2, "need 2 devices, have %d", count);
    int can01 = -1, can10 = -1, can00 = -1;
    CHECK(cudaDeviceCanAccessPeer(&can01, 0, 1));
    CHECK(cudaDeviceCanAccessPeer(&can10, 1, 0));
    CHECK(cudaDeviceCanAccessPeer(&can00, 0, 0));
    int perf = -1, access = -1, atomics = -1;
    CHECK(cudaDeviceGetP2PAttribute(&perf, cudaDevP2PAttrPerformanceRank, 0, 1));
    CHECK(cudaDeviceGetP2PAttribute(&access, cudaDevP2PAttrAccessSupported, 0, 1));
    CHECK(cudaDeviceGetP2PAttribute(&atomics, cudaDevP2PAttrNativeAtomicSupported, 0, 1));

    const size_t n = 4 << 20;
    unsigned char *h;
    CHECK(cudaMallocHost(&h, n));
    unsigned char *d0, *d1;
    CHECK(cudaSetDevice(0));
    CHECK(cudaMalloc(&d0, n));
    int not_enabled = (int)cudaDeviceDisablePeerAccess(1);  // cudaErrorPeerAccessNotEnabled
    cudaGetLastError();
    CHECK(cudaDeviceEnablePeerAccess(1, 0));
    int again = (int)cudaDeviceEnablePeerAccess(1, 0);  // cudaErrorPeerAccessAlreadyEnabled
    cudaGetLastError();
    int self = (int)cudaDeviceEnablePeerAccess(0, 0);  // cudaErrorInvalidDevice
    cudaGetLastError();
    CHECK(cudaSetDevice(1));
    CHECK(cudaMalloc(&d1, n));
    CHECK(cudaDeviceEnablePeerAccess(0, 0));

    // Synchronous peer copy, both directions.
    memset(h, 0x21, n);
    CHECK(cudaSetDevice(0));
    CHECK(cudaMemcpy(d0, h, n, cudaMemcpyHostToDevice));
    CHECK(cudaMemcpyPeer(d1, 1, d0, 0, n));
    memset(h, 0, n);
    CHECK(cudaSetDevice(1));
    CHECK(cudaMemcpy(h, d1, n, cudaMemcpyDeviceToHost));
    int peer_ok = all(h, n, 0x21);

    // Asynchronous peer copy on a stream of device 1, waited for by device 0 through an event.
    cudaStream_t s1, s0;
    cudaEvent_t done;
    CHECK(cudaStreamCreate(&s1));
    CHECK(cudaEventCreateWithFlags(&done, cudaEventDisableTiming));
    CHECK(cudaMemsetAsync(d1, 0x3c, n, s1));
    CHECK(cudaMemcpyPeerAsync(d0, 0, d1, 1, n, s1));
    CHECK(cudaEventRecord(done, s1));
    CHECK(cudaSetDevice(0));
    CHECK(cudaStreamCreate(&s0));
    CHECK(cudaStreamWaitEvent(s0, done, 0));
    CHECK(cudaMemcpyAsync(h, d0, n, cudaMemcpyDeviceToHost, s0));
    CHECK(cudaStreamSynchronize(s0));
    int async_ok = all(h, n, 0x3c);

    // UVA: cudaMemcpyDefault between the devices' allocations; a kernel on 0 reads device 1.
    CHECK(cudaMemset(d0, 0x5e, n / 2));
    CHECK(cudaMemcpy(d1 + n / 2, d0, n / 2, cudaMemcpyDefault));
    CHECK(cudaMemcpy(h, d1 + n / 2, n / 2, cudaMemcpyDefault));
    int uva_ok = all(h, n / 2, 0x5e);
    add<<<(unsigned)(n / 4 / 256), 256, 0, s0>>>((float *)d0, (const float *)d1, (int)(n / 4));
    CHECK(cudaGetLastError());
    CHECK(cudaStreamSynchronize(s0));
    cudaPointerAttributes pa0, pa1;
    CHECK(cudaPointerGetAttributes(&pa0, d0));
    CHECK(cudaPointerGetAttributes(&pa1, d1 + 100));
    int attr_ok = pa0.device == 0 && pa1.device == 1 && pa1.type == cudaMemoryTypeDevice &&
                  pa1.devicePointer == d1 + 100;

    // Each device keeps its own memory accounting.
    size_t f0, t0, f1, t1;
    CHECK(cudaSetDevice(0));
    CHECK(cudaMemGetInfo(&f0, &t0));
    unsigned char *big;
    CHECK(cudaMalloc(&big, 64 << 20));
    size_t f0b, t0b;
    CHECK(cudaMemGetInfo(&f0b, &t0b));
    CHECK(cudaSetDevice(1));
    CHECK(cudaMemGetInfo(&f1, &t1));
    int accounting_ok = f0 - f0b >= (64 << 20) && f1 > f0b;
    CHECK(cudaSetDevice(0));
    CHECK(cudaFree(big));

    CHECK(cudaDeviceDisablePeerAccess(1));
    int disabled_again = (int)cudaDeviceDisablePeerAccess(1);  // cudaErrorPeerAccessNotEnabled
    cudaGetLastError();
    CHECK(cudaStreamDestroy(s0));
    CHECK(cudaFree(d0));
    CHECK(cudaSetDevice(1));
    CHECK(cudaDeviceDisablePeerAccess(0));
    CHECK(cudaStreamDestroy(s1));
    CHECK(cudaEventDestroy(done));
    CHECK(cudaFree(d1));
    CHECK(cudaFreeHost(h));
    printf("{\"check\":\"peer\",\"count\":%d,\"can01\":%d,\"can10\":%d,\"can00\":%d,\"perf\":%d,"
           "\"access\":%d,\"atomics\":%d,\"not_enabled\":%d,\"again\":%d,\"self\":%d,\"peer_ok\":%d,"
           "\"async_ok\":%d,\"uva_ok\":%d,\"attr_ok\":%d,\"accounting_ok\":%d,\"disabled_again\":%d}\n",
           count, can01, can10, can00, perf, access, atomics, not_enabled, again, self, peer_ok, async_ok,
           uva_ok, attr_ok, accounting_ok, disabled_again);
    return 0;
}
