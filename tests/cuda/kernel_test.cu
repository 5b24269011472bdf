// Kernel test, compiled with the CUDA 13.5 nvcc (shared and static cudart), run by
// tests/tests/sim_nvcc_kernel.rs. Kernels do not compute on simgpu: nothing here looks at their output.
//
// usage: kernel_test props
//        kernel_test symbol
//        kernel_test time <busy|other|both> <grid> <block> <launches>
//        kernel_test gap <host_sleep_ms>
//        kernel_test late_sync <grid> <block> <host_sleep_ms>
//        kernel_test copy <MiB>
// Prints one JSON line per check ({"check": ...}); "FAIL <call> <error>" and exit 1 on any error.
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include "check.h"



__device__ unsigned char dev_bytes[4096];
__device__ int dev_counter;

__global__ void busy_kernel(float *out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = 2.0f * i + dev_counter;
}

__global__ void other_kernel(float *out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = out[i] * 0.5f + dev_bytes[i % 4096];
}

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static void sleep_ms(double ms) {
    struct timespec ts;
    ts.tv_sec = (time_t)(ms / 1000);
    ts.tv_nsec = (long)((ms - ts.tv_sec * 1000.0) * 1e6);
    while (nanosleep(&ts, &ts) != 0) {
    }
}

static int props(void) {
    cudaDeviceProp p;
    CHECK(cudaGetDeviceProperties(&p, 0));
    printf("{\"check\":\"props\",\"name\":\"%s\",\"sm_count\":%d,\"cc\":\"%d.%d\","
           "\"max_threads_per_sm\":%d,\"total_global_mem\":%zu}\n",
           p.name, p.multiProcessorCount, p.major, p.minor, p.maxThreadsPerMultiProcessor,
           p.totalGlobalMem);
    return 0;
}

static int symbol(void) {
    unsigned char in[4096], out[4096];
    for (int i = 0; i < 4096; i++) in[i] = (unsigned char)(i * 37 + 11);
    memset(out, 0, sizeof out);
    CHECK(cudaMemcpyToSymbol(dev_bytes, in, sizeof in));
    CHECK(cudaMemcpyFromSymbol(out, dev_bytes, sizeof out));
    for (int i = 0; i < 4096; i++)
        EXPECT(out[i] == in[i], "dev_bytes[%d] = %d after round trip, expected %d", i, out[i], in[i]);

    // Partial copy at an offset.
    unsigned char patch[100];
    for (int i = 0; i < 100; i++) patch[i] = (unsigned char)(255 - i);
    CHECK(cudaMemcpyToSymbol(dev_bytes, patch, sizeof patch, 1000));
    CHECK(cudaMemcpyFromSymbol(out, dev_bytes, sizeof out));
    for (int i = 0; i < 4096; i++) {
        unsigned char want = (i >= 1000 && i < 1100) ? patch[i - 1000] : in[i];
        EXPECT(out[i] == want, "dev_bytes[%d] = %d after offset copy, expected %d", i, out[i], want);
    }

    int counter = 0x12345678, back = 0;
    CHECK(cudaMemcpyToSymbol(dev_counter, &counter, sizeof counter));
    CHECK(cudaMemcpyFromSymbol(&back, dev_counter, sizeof back));
    EXPECT(back == counter, "dev_counter = 0x%x, expected 0x%x", back, counter);

    // The symbol's device address is a real allocation: copy through it directly.
    void *addr = NULL;
    size_t size = 0;
    CHECK(cudaGetSymbolAddress(&addr, dev_bytes));
    CHECK(cudaGetSymbolSize(&size, dev_bytes));
    EXPECT(size == 4096, "cudaGetSymbolSize = %zu", size);
    memset(out, 0, sizeof out);
    CHECK(cudaMemcpy(out, addr, 4096, cudaMemcpyDeviceToHost));
    EXPECT(out[0] == in[0] && out[1000] == patch[0], "copy through cudaGetSymbolAddress differs");

    // Launch both kernels once.
    const int n = 1 << 16;
    float *d = NULL;
    CHECK(cudaMalloc(&d, n * sizeof(float)));
    busy_kernel<<<n / 256, 256>>>(d, n);
    CHECK(cudaGetLastError());
    other_kernel<<<n / 128, 128>>>(d, n);
    CHECK(cudaGetLastError());
    CHECK(cudaDeviceSynchronize());
    CHECK(cudaFree(d));
    printf("{\"check\":\"symbol\",\"ok\":true,\"bytes\":4096}\n");
    return 0;
}

// Kernels do not run on simgpu, so big grids need no big buffer.
static size_t buffer_len(int grid, int block) {
    size_t n = (size_t)grid * block;
    return n < (1u << 20) ? n : (1u << 20);
}

static int gate_open;

/* A host function that holds its stream until the main thread opens the gate. */
static void CUDART_CB gate(void *) {
    while (!__atomic_load_n(&gate_open, __ATOMIC_ACQUIRE)) usleep(100);
}

static int timed(const char *which, int grid, int block, int launches) {
    size_t n = buffer_len(grid, block);
    float *d = NULL;
    CHECK(cudaMalloc(&d, n * sizeof(float)));
    cudaStream_t s;
    CHECK(cudaStreamCreate(&s));
    cudaEvent_t e0, e1;
    CHECK(cudaEventCreate(&e0));
    CHECK(cudaEventCreate(&e1));
    // Warm-up launch: module loading happens at the first launch.
    busy_kernel<<<1, 32, 0, s>>>(d, 32);
    other_kernel<<<1, 32, 0, s>>>(d, 32);
    CHECK(cudaGetLastError());
    CHECK(cudaStreamSynchronize(s));

    // The stream waits on a host function until every launch is enqueued, so the events time
    // the kernels back to back, not the host's enqueueing (which a loaded machine can stretch).
    gate_open = 0;
    CHECK(cudaLaunchHostFunc(s, gate, NULL));
    double t0 = now_ms();
    CHECK(cudaEventRecord(e0, s));
    for (int i = 0; i < launches; i++) {
        if (!strcmp(which, "busy") || !strcmp(which, "both")) busy_kernel<<<grid, block, 0, s>>>(d, (int)n);
        if (!strcmp(which, "other") || !strcmp(which, "both")) other_kernel<<<grid, block, 0, s>>>(d, (int)n);
        CHECK(cudaGetLastError());
    }
    CHECK(cudaEventRecord(e1, s));
    double t1 = now_ms();
    __atomic_store_n(&gate_open, 1, __ATOMIC_RELEASE);
    CHECK(cudaEventSynchronize(e1));
    double t2 = now_ms();
    float ms = -1;
    CHECK(cudaEventElapsedTime(&ms, e0, e1));
    printf("{\"check\":\"time\",\"kernel\":\"%s\",\"grid\":%d,\"block\":%d,\"launches\":%d,"
           "\"elapsed_ms\":%.4f,\"enqueue_ms\":%.4f,\"host_ms\":%.4f}\n",
           which, grid, block, launches, ms, t1 - t0, t2 - t0);
    CHECK(cudaEventDestroy(e0));
    CHECK(cudaEventDestroy(e1));
    CHECK(cudaStreamDestroy(s));
    CHECK(cudaFree(d));
    return 0;
}

// Two events recorded on an idle stream with the host sleeping in between: they complete when
// recorded, so the elapsed time is the host gap.
static int gap(double sleep) {
    cudaStream_t s;
    CHECK(cudaStreamCreate(&s));
    cudaEvent_t e0, e1;
    CHECK(cudaEventCreate(&e0));
    CHECK(cudaEventCreate(&e1));
    CHECK(cudaEventRecord(e0, s));
    CHECK(cudaEventSynchronize(e0));
    double t0 = now_ms();
    sleep_ms(sleep);
    double t1 = now_ms();
    CHECK(cudaEventRecord(e1, s));
    CHECK(cudaEventSynchronize(e1));
    float ms = -1;
    CHECK(cudaEventElapsedTime(&ms, e0, e1));
    printf("{\"check\":\"gap\",\"elapsed_ms\":%.4f,\"host_gap_ms\":%.4f}\n", ms, t1 - t0);
    CHECK(cudaStreamDestroy(s));
    return 0;
}

// Events around one kernel, then the host sleeps before synchronizing: the elapsed time must be the
// kernel's (modelled) device time, not the time until the host looked.
static int late_sync(int grid, int block, double sleep) {
    size_t n = buffer_len(grid, block);
    float *d = NULL;
    CHECK(cudaMalloc(&d, n * sizeof(float)));
    cudaStream_t s;
    CHECK(cudaStreamCreate(&s));
    cudaEvent_t e0, e1;
    CHECK(cudaEventCreate(&e0));
    CHECK(cudaEventCreate(&e1));
    busy_kernel<<<1, 32, 0, s>>>(d, 32);
    CHECK(cudaStreamSynchronize(s));
    double t0 = now_ms();
    CHECK(cudaEventRecord(e0, s));
    busy_kernel<<<grid, block, 0, s>>>(d, (int)n);
    CHECK(cudaGetLastError());
    CHECK(cudaEventRecord(e1, s));
    sleep_ms(sleep);
    CHECK(cudaEventSynchronize(e1));
    double t1 = now_ms();
    float ms = -1;
    CHECK(cudaEventElapsedTime(&ms, e0, e1));
    printf("{\"check\":\"late_sync\",\"elapsed_ms\":%.4f,\"host_ms\":%.4f}\n", ms, t1 - t0);
    CHECK(cudaStreamDestroy(s));
    CHECK(cudaFree(d));
    return 0;
}

// Pinned host<->device copies timed with events: each direction alone, then both at once on two
// streams (a GPU has one copy engine per direction, so they overlap).
static int copies(int mib) {
    size_t n = (size_t)mib << 20;
    unsigned char *h1 = NULL, *h2 = NULL, *d1 = NULL, *d2 = NULL;
    CHECK(cudaMallocHost((void **)&h1, n));
    CHECK(cudaMallocHost((void **)&h2, n));
    CHECK(cudaMalloc((void **)&d1, n));
    CHECK(cudaMalloc((void **)&d2, n));
    for (size_t i = 0; i < n; i += 4096) h1[i] = (unsigned char)(i >> 12);
    cudaStream_t s1, s2;
    CHECK(cudaStreamCreate(&s1));
    CHECK(cudaStreamCreate(&s2));
    cudaEvent_t e0, e1, e2;
    CHECK(cudaEventCreate(&e0));
    CHECK(cudaEventCreate(&e1));
    CHECK(cudaEventCreate(&e2));
    float h2d = -1, d2h = -1, both = -1;

    CHECK(cudaEventRecord(e0, s1));
    CHECK(cudaMemcpyAsync(d1, h1, n, cudaMemcpyHostToDevice, s1));
    CHECK(cudaEventRecord(e1, s1));
    CHECK(cudaEventSynchronize(e1));
    CHECK(cudaEventElapsedTime(&h2d, e0, e1));

    CHECK(cudaEventRecord(e0, s1));
    CHECK(cudaMemcpyAsync(h2, d1, n, cudaMemcpyDeviceToHost, s1));
    CHECK(cudaEventRecord(e1, s1));
    CHECK(cudaEventSynchronize(e1));
    CHECK(cudaEventElapsedTime(&d2h, e0, e1));
    for (size_t i = 0; i < n; i += 4096)
        EXPECT(h2[i] == h1[i], "byte %zu differs after the timed round trip", i);

    CHECK(cudaEventRecord(e0, s1));
    CHECK(cudaStreamWaitEvent(s2, e0, 0));
    CHECK(cudaMemcpyAsync(d2, h1, n, cudaMemcpyHostToDevice, s1));
    CHECK(cudaMemcpyAsync(h2, d1, n, cudaMemcpyDeviceToHost, s2));
    CHECK(cudaEventRecord(e2, s2));
    CHECK(cudaStreamWaitEvent(s1, e2, 0));
    CHECK(cudaEventRecord(e1, s1));
    CHECK(cudaEventSynchronize(e1));
    CHECK(cudaEventElapsedTime(&both, e0, e1));

    printf("{\"check\":\"copy\",\"bytes\":%zu,\"h2d_ms\":%.4f,\"d2h_ms\":%.4f,\"both_ms\":%.4f}\n", n,
           h2d, d2h, both);
    CHECK(cudaStreamDestroy(s1));
    CHECK(cudaStreamDestroy(s2));
    CHECK(cudaFreeHost(h1));
    CHECK(cudaFreeHost(h2));
    CHECK(cudaFree(d1));
    CHECK(cudaFree(d2));
    return 0;
}

int main(int argc, char **argv) {
    const char *mode = argc > 1 ? argv[1] : "symbol";
    int rc;
    if (!strcmp(mode, "props")) rc = props();
    else if (!strcmp(mode, "symbol")) rc = symbol();
    else if (!strcmp(mode, "time") && argc == 6)
        rc = timed(argv[2], atoi(argv[3]), atoi(argv[4]), atoi(argv[5]));
    else if (!strcmp(mode, "gap") && argc == 3) rc = gap(atof(argv[2]));
    else if (!strcmp(mode, "copy") && argc == 3) rc = copies(atoi(argv[2]));
    else if (!strcmp(mode, "late_sync") && argc == 5)
        rc = late_sync(atoi(argv[2]), atoi(argv[3]), atof(argv[4]));
    else {
        fprintf(stderr, "usage: see the comment at the top of kernel_test.cu\n");
        return 2;
    }
    if (rc == 0) {
        CHECK(cudaDeviceSynchronize());
        printf("OK\n");
    }
    return rc;
}
