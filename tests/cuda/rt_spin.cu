// A cudart program of long kernels made of waves of blocks (the runtime's own path: its
// fatbin registered, the kernel loaded through cuLibraryLoadData/cuLibraryGetKernel and
// launched by cudart), run by tests/tests/daemon_slicing.rs as an opportunistic job whose
// kernels the shim can cut only through the PTX the fatbin carries.
//
// usage: rt_spin <seconds> <kernel_ms> <wave_us>
// Launches rt_block_spin kernels of <kernel_ms> (waves of 8 resident 256-thread blocks per SM,
// each spinning <wave_us> on %globaltimer, as simgpu costs a wave), two in flight, for
// <seconds>; prints {"launches": N}. "FAIL <call> <error>" and exit 1 on any error.
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include "check.h"

// Reads no block index and no module variable: a launch cut into block ranges does the same.
__global__ void rt_block_spin(unsigned long long ns) {
    unsigned long long t0, t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    do {
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    } while (t - t0 < ns);
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: rt_spin <seconds> <kernel_ms> <wave_us>\n");
        return 2;
    }
    double seconds = atof(argv[1]), kernel_ms = atof(argv[2]), wave_us = atof(argv[3]);
    int sms = 0;
    CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    unsigned waves = (unsigned)(kernel_ms * 1000.0 / wave_us + 0.5);
    unsigned blocks = (waves ? waves : 1) * (unsigned)sms * 8;
    cudaStream_t s;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    long launches = 0;
    double start = now_s();
    while (now_s() - start < seconds) {
        rt_block_spin<<<blocks, 256, 0, s>>>((unsigned long long)(wave_us * 1000.0));
        CHECK(cudaGetLastError());
        if (++launches % 2 == 0) CHECK(cudaStreamSynchronize(s));
    }
    CHECK(cudaStreamSynchronize(s));
    printf("{\"launches\": %ld, \"blocks\": %u}\n", launches, blocks);
    return 0;
}
