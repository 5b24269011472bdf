// simgpu features beyond the smoke tests, through the real CUDA 13.5 runtime:
//   sim_features graph_explicit  a graph built node by node with explicit dependencies, cloned
//   sim_features reset           cudaDeviceReset frees the context's memory
//   sim_features pageable        async copy to pageable memory is complete on return
//   sim_features oom             allocations past the configured memory (SIMGPU_MEMORY=1GiB)
//   sim_features faults_alloc    three cudaMalloc calls (run with SIMGPU_FAIL_ALLOC_NTH=2)
//   sim_features faults_launch   three launches (run with SIMGPU_LAUNCH_ERROR=2:719)
//   sim_features faults_stall    a stream that stops executing (SIMGPU_STALL_STREAM_AFTER=1)
//   sim_features graph           stream capture -> graph, replayed: timing and bytes
// Prints one JSON line {"check": ...}.
#include <cstdio>
#include <cstring>
#include <chrono>

__global__ void busy_kernel(float *x) { if (x) x[threadIdx.x] += 1.0f; }

static double now_ms() {
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

int main(int argc, char **argv) {
    const char *mode = argc > 1 ? argv[1] : "";
    if (!strcmp(mode, "faults_alloc")) {
        int r[3];
        void *p;
        for (int i = 0; i < 3; i++) r[i] = (int)cudaMalloc(&p, 1 << 20);
        printf("{\"check\":\"faults_alloc\",\"results\":[%d,%d,%d]}\n", r[0], r[1], r[2]);
        return 0;
    }
    if (!strcmp(mode, "oom")) {
        // Run with SIMGPU_MEMORY=1GiB: 600 MiB fit, 600 more do not, 300 more do; after a free, 600 fit.
        void *a, *b, *c, *d;
        int r0 = (int)cudaMalloc(&a, 600 << 20);
        int r1 = (int)cudaMalloc(&b, 600 << 20);
        cudaGetLastError();  // clear the (non-sticky) allocation error
        int r2 = (int)cudaMalloc(&c, 300 << 20);
        size_t free_b, total;
        cudaMemGetInfo(&free_b, &total);
        cudaFree(a);
        int r3 = (int)cudaMalloc(&d, 600 << 20);
        printf("{\"check\":\"oom\",\"results\":[%d,%d,%d,%d],\"free_mib\":%zu,\"total_mib\":%zu}\n",
               r0, r1, r2, r3, free_b >> 20, total >> 20);
        return 0;
    }
    if (!strcmp(mode, "graph_explicit")) {
        // h2d copy -> memset of the second half -> d2h copy -> host node, created in reverse
        // order and ordered only by explicit dependencies; then cloned and replayed.
        const size_t n = 1 << 16;
        static unsigned char a[1 << 16], b[1 << 16];
        static volatile int seen = -1;
        memset(a, 1, n);
        unsigned char *d;
        cudaMalloc(&d, n);
        cudaGraph_t g;
        cudaGraphCreate(&g, 0);
        cudaGraphNode_t host, d2h, set, h2d;
        cudaHostNodeParams hp = {};
        hp.fn = [](void *) { seen = b[(1 << 16) - 1] * 10 + b[0]; };
        int e = 0;
        e |= cudaGraphAddHostNode(&host, g, nullptr, 0, &hp);
        e |= cudaGraphAddMemcpyNode1D(&d2h, g, nullptr, 0, b, d, n, cudaMemcpyDeviceToHost);
        cudaMemsetParams mp = {};
        mp.dst = d + n / 2; mp.value = 2; mp.elementSize = 1; mp.width = n / 2; mp.height = 1;
        e |= cudaGraphAddMemsetNode(&set, g, nullptr, 0, &mp);
        e |= cudaGraphAddMemcpyNode1D(&h2d, g, nullptr, 0, d, a, n, cudaMemcpyHostToDevice);
        cudaGraphNode_t from[3] = {h2d, set, d2h}, to[3] = {set, d2h, host};
        e |= cudaGraphAddDependencies(g, from, to, nullptr, 3);  // CUDA 13: with edge data
        cudaGraphExec_t exec;
        e |= cudaGraphInstantiate(&exec, g, 0);
        e |= cudaGraphLaunch(exec, 0);
        e |= cudaDeviceSynchronize();
        int first = seen;
        cudaGraph_t c;
        e |= cudaGraphClone(&c, g);
        memset(a, 3, n);
        cudaGraphExec_t exec2;
        e |= cudaGraphInstantiate(&exec2, c, 0);
        e |= cudaGraphLaunch(exec2, 0);
        e |= cudaDeviceSynchronize();
        printf("{\"check\":\"graph_explicit\",\"errors\":%d,\"first\":%d,\"clone\":%d}\n", e, first, (int)seen);
        return 0;
    }
    if (!strcmp(mode, "reset")) {
        // cudaDeviceReset frees every allocation of the primary context.
        void *p;
        size_t f0, f1, f2, t;
        cudaMemGetInfo(&f0, &t);
        cudaMalloc(&p, 300 << 20);
        cudaMemGetInfo(&f1, &t);
        cudaDeviceReset();
        cudaMemGetInfo(&f2, &t);
        printf("{\"check\":\"reset\",\"before\":%zu,\"allocated\":%zu,\"after_reset\":%zu}\n", f0 >> 20,
               f1 >> 20, f2 >> 20);
        return 0;
    }
    if (!strcmp(mode, "pageable")) {
        // cudaMemcpyAsync to pageable host memory returns once the bytes are there.
        static char h[1 << 20], back[1 << 20];
        memset(h, 7, sizeof h);
        char *d;
        cudaMalloc(&d, sizeof h);
        cudaMemcpy(d, h, sizeof h, cudaMemcpyHostToDevice);
        cudaStream_t s;
        cudaStreamCreate(&s);
        cudaMemcpyAsync(back, d, sizeof back, cudaMemcpyDeviceToHost, s);
        printf("{\"check\":\"pageable\",\"visible\":%s}\n", back[sizeof back - 1] == 7 ? "true" : "false");
        return 0;
    }
    if (!strcmp(mode, "faults_launch")) {
        int r[3];
        for (int i = 0; i < 3; i++) {
            busy_kernel<<<1, 32>>>(nullptr);
            r[i] = (int)cudaGetLastError();
        }
        printf("{\"check\":\"faults_launch\",\"results\":[%d,%d,%d]}\n", r[0], r[1], r[2]);
        return 0;
    }
    if (!strcmp(mode, "faults_stall")) {
        cudaStream_t s;
        cudaStreamCreate(&s);
        busy_kernel<<<1, 32, 0, s>>>(nullptr);
        busy_kernel<<<1, 32, 0, s>>>(nullptr);
        // The first kernel runs; the stream then never executes anything again. Poll (never
        // synchronize: that would hang, which is what the fault is for) for 300 ms of host time.
        double t0 = now_ms();
        int first = (int)cudaStreamQuery(s), last = first, polls = 0;
        while (now_ms() - t0 < 300) { last = (int)cudaStreamQuery(s); polls++; }
        printf("{\"check\":\"faults_stall\",\"first\":%d,\"last\":%d,\"polls\":%d}\n", first, last, polls);
        return 0;
    }
    if (!strcmp(mode, "graph")) {
        const int n = 256;
        float host[n], back[n];
        for (int i = 0; i < n; i++) host[i] = 1.0f;
        float *d;
        cudaMalloc(&d, n * sizeof(float));
        cudaStream_t s;
        cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
        cudaGraph_t g;
        int e0 = (int)cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal);
        cudaStreamCaptureStatus st;
        cudaStreamIsCapturing(s, &st);
        cudaMemcpyAsync(d, host, sizeof host, cudaMemcpyHostToDevice, s);
        for (int i = 0; i < 5; i++) busy_kernel<<<1, 32, 0, s>>>(d);
        int e1 = (int)cudaStreamEndCapture(s, &g);
        size_t nodes = 0;
        cudaGraphGetNodes(g, nullptr, &nodes);
        cudaGraphExec_t exec;
        int e2 = (int)cudaGraphInstantiate(&exec, g, 0);
        // Captured copies read their source when the graph runs, not when it was captured.
        for (int i = 0; i < n; i++) host[i] = 7.0f;
        cudaEvent_t a, b;
        cudaEventCreate(&a);
        cudaEventCreate(&b);
        cudaEventRecord(a, s);
        int e3 = 0;
        for (int i = 0; i < 3; i++) e3 |= (int)cudaGraphLaunch(exec, s);
        cudaEventRecord(b, s);
        cudaStreamSynchronize(s);
        float ms = 0;
        cudaEventElapsedTime(&ms, a, b);
        cudaMemcpy(back, d, sizeof back, cudaMemcpyDeviceToHost);
        // Kernels do not compute on simgpu, so the buffer holds what the graph's copy wrote.
        printf("{\"check\":\"graph\",\"errors\":[%d,%d,%d,%d],\"capturing\":%d,\"nodes\":%zu,"
               "\"elapsed_ms\":%.3f,\"value\":%.1f}\n",
               e0, e1, e2, e3, (int)st, nodes, ms, back[n - 1]);
        return 0;
    }
    fprintf(stderr, "usage: sim_features faults_alloc|faults_launch|faults_stall|graph\n");
    return 2;
}
