// simgpu behaving as a GPU where NVIDIA's samples found it did not (issue 19), through cudart 13.5:
//   sim_fidelity graph_relaunch  a graph with an allocation node, launched, its memory freed by the
//                                host (cudaFreeAsync / cudaFree alternately), relaunched 200 times
//   sim_fidelity capture_null    cudaStreamEndCapture(stream, NULL) after cudaStreamBeginCaptureToGraph
//   sim_fidelity hog             launches hog_kernel back to back until killed ("running" once started)
//   sim_fidelity probe SECONDS   launches probe_kernel one at a time for SECONDS, each waited for;
//                                reports the longest wall time from launch to completion
// Prints one JSON line {"check": ...}; any unexpected error is a FAIL line (check.h).
#include <cuda_runtime_api.h>
#include <cstdio>
#include <cstring>
#include <chrono>
#include "check.h"

__global__ void hog_kernel(int *x) { if (x) x[threadIdx.x] = 1; }
__global__ void probe_kernel(int *x) { if (x) x[threadIdx.x] = 2; }

static double now_ms() {
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

static int hog() {
    cudaStream_t s;
    CHECK(cudaStreamCreate(&s));
    for (int round = 0;; round++) {
        for (int i = 0; i < 16; i++) hog_kernel<<<1, 32, 0, s>>>(nullptr);
        CHECK(cudaGetLastError());
        CHECK(cudaStreamSynchronize(s));
        if (round == 0) {
            printf("running\n");
            fflush(stdout);
        }
    }
}

static int probe(double seconds) {
    cudaStream_t s;
    CHECK(cudaStreamCreate(&s));
    probe_kernel<<<1, 32, 0, s>>>(nullptr);  // warm up
    CHECK(cudaStreamSynchronize(s));
    printf("start\n");
    fflush(stdout);
    double t_end = now_ms() + seconds * 1e3, max_ms = 0;
    int count = 0;
    while (now_ms() < t_end) {
        double t0 = now_ms();
        probe_kernel<<<1, 32, 0, s>>>(nullptr);
        CHECK(cudaGetLastError());
        CHECK(cudaStreamSynchronize(s));
        double ms = now_ms() - t0;
        if (ms > max_ms) max_ms = ms;
        count++;
    }
    printf("{\"check\":\"probe\",\"kernels\":%d,\"max_ms\":%.3f}\n", count, max_ms);
    return 0;
}

static int graph_relaunch() {
    const size_t n = 1 << 16;
    static unsigned char in[1 << 16], out[1 << 16];
    cudaStream_t s;
    CHECK(cudaStreamCreate(&s));
    // alloc -> copy in -> copy out; no free node: the host frees the allocation.
    cudaGraph_t g;
    CHECK(cudaGraphCreate(&g, 0));
    cudaMemAllocNodeParams ap = {};
    ap.poolProps.allocType = cudaMemAllocationTypePinned;
    ap.poolProps.location.type = cudaMemLocationTypeDevice;
    ap.poolProps.location.id = 0;
    ap.bytesize = n;
    cudaGraphNode_t nalloc, nin, nout;
    CHECK(cudaGraphAddMemAllocNode(&nalloc, g, NULL, 0, &ap));
    void *d = ap.dptr;
    CHECK(cudaGraphAddMemcpyNode1D(&nin, g, &nalloc, 1, d, in, n, cudaMemcpyHostToDevice));
    CHECK(cudaGraphAddMemcpyNode1D(&nout, g, &nin, 1, out, d, n, cudaMemcpyDeviceToHost));
    cudaGraphExec_t ex;
    CHECK(cudaGraphInstantiate(&ex, g, 0));
    int launches = 0, bytes_ok = 1, free_errors = 0;
    for (int i = 0; i < 200; i++) {
        memset(in, i & 0xff, n);
        memset(out, 0xff - (i & 0xff), n);
        CHECK(cudaGraphLaunch(ex, s));
        CHECK(cudaStreamSynchronize(s));
        launches++;
        for (size_t k = 0; k < n; k += 4093) bytes_ok &= out[k] == (i & 0xff);
        bytes_ok &= out[n - 1] == (i & 0xff);
        cudaError_t e = (i % 2) ? cudaFree(d) : cudaFreeAsync(d, s);
        if (e != cudaSuccess) {
            free_errors++;
            printf("free %d: %s\n", i, cudaGetErrorName(e));
        }
    }
    CHECK(cudaStreamSynchronize(s));
    // Documented errors: freeing an allocation twice, relaunching while it is still allocated.
    int double_free = (int)cudaFreeAsync(d, s);
    cudaGetLastError();
    CHECK(cudaGraphLaunch(ex, s));
    int live_relaunch = (int)cudaGraphLaunch(ex, s);
    cudaGetLastError();
    CHECK(cudaStreamSynchronize(s));
    CHECK(cudaFree(d));
    // An instance made with cudaGraphInstantiateFlagAutoFreeOnLaunch frees it itself.
    CHECK(cudaGraphExecDestroy(ex));
    CHECK(cudaGraphInstantiateWithFlags(&ex, g, cudaGraphInstantiateFlagAutoFreeOnLaunch));
    int auto_free = 0;
    for (int i = 0; i < 3; i++) auto_free += cudaGraphLaunch(ex, s) == cudaSuccess;
    CHECK(cudaStreamSynchronize(s));
    CHECK(cudaFree(d));
    CHECK(cudaGraphExecDestroy(ex));
    CHECK(cudaGraphDestroy(g));
    printf("{\"check\":\"graph_relaunch\",\"launches\":%d,\"bytes_ok\":%d,\"free_errors\":%d,"
           "\"double_free\":%d,\"live_relaunch\":%d,\"auto_free_launches\":%d}\n",
           launches, bytes_ok, free_errors, double_free, live_relaunch, auto_free);
    return 0;
}

static int capture_null() {
    const size_t n = 4096;
    static unsigned char out[4096];
    cudaStream_t s;
    CHECK(cudaStreamCreate(&s));
    void *d;
    CHECK(cudaMalloc(&d, n));
    cudaGraph_t g;
    CHECK(cudaGraphCreate(&g, 0));
    CHECK(cudaStreamBeginCaptureToGraph(s, g, NULL, NULL, 0, cudaStreamCaptureModeGlobal));
    CHECK(cudaMemsetAsync(d, 0x5a, n, s));
    CHECK(cudaMemcpyAsync(out, d, n, cudaMemcpyDeviceToHost, s));
    int end = (int)cudaStreamEndCapture(s, nullptr);
    cudaStreamCaptureStatus st = cudaStreamCaptureStatusActive;
    CHECK(cudaStreamIsCapturing(s, &st));
    size_t nodes = 0;
    CHECK(cudaGraphGetNodes(g, NULL, &nodes));
    cudaGraphExec_t ex;
    CHECK(cudaGraphInstantiate(&ex, g, 0));
    CHECK(cudaGraphLaunch(ex, s));
    CHECK(cudaStreamSynchronize(s));
    printf("{\"check\":\"capture_null\",\"end\":%d,\"capturing\":%d,\"nodes\":%zu,\"byte\":%d}\n", end,
           (int)st, nodes, out[n - 1]);
    return 0;
}

int main(int argc, char **argv) {
    const char *mode = argc > 1 ? argv[1] : "";
    if (!strcmp(mode, "graph_relaunch")) return graph_relaunch();
    if (!strcmp(mode, "capture_null")) return capture_null();
    if (!strcmp(mode, "hog")) return hog();
    if (!strcmp(mode, "probe") && argc > 2) return probe(atof(argv[2]));
    printf("FAIL unknown mode %s\n", mode);
    return 1;
}
