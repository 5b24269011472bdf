/* Every launch path once, on the test's command, for the gate tests (tests/tests/shim_gate.rs).
 *
 * usage: shim_gate paths
 *   Sets up (context, stream, the spin kernel, a graph captured from one spin launch), prints
 *   "ready", then for each line "go <path>" read from stdin launches a 1 ms spin kernel through
 *   that path and prints "launched <path>" once the call returned (then synchronises). Paths:
 *   kernel kernel_ptsz ex ex_ptsz coop coop_ptsz graph graph_ptsz. "OK" at EOF.
 * Entry points come from dlsym(RTLD_DEFAULT) (the shim's exports when preloaded), the _ptsz
 * ones by their ABI names. */
#define _GNU_SOURCE
#include <cuda.h>
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>
#include "check.h"

static void *dl(const char *name) {
    void *p = dlsym(RTLD_DEFAULT, name);
    EXPECT(p != NULL, "dlsym(%s) = NULL", name);
    return p;
}

typedef CUresult (*launch_fn)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned,
                              unsigned, unsigned, CUstream, void **, void **);
typedef CUresult (*coop_fn)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned,
                            unsigned, unsigned, CUstream, void **);
typedef CUresult (*ex_fn)(const CUlaunchConfig *, CUfunction, void **, void **);
typedef CUresult (*graph_fn)(CUgraphExec, CUstream);

int main(int argc, char **argv) {
    EXPECT(argc == 2 && strcmp(argv[1], "paths") == 0, "usage: shim_gate paths");
    CHECK(cuInit(0));
    CUdevice dev;
    CHECK(cuDeviceGet(&dev, 0));
    CUcontext ctx;
    CHECK(cuDevicePrimaryCtxRetain(&ctx, dev));
    CHECK(cuCtxSetCurrent(ctx));
    CUstream s;
    CHECK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    static const char ptx[] = ".version 7.0\n.target sm_80\n.address_size 64\n"
                              ".visible .entry simgpu_spin(.param .u64 ns)\n{\n ret;\n}\n";
    CUmodule mod;
    CHECK(cuModuleLoadData(&mod, ptx));
    CUfunction spin;
    CHECK(cuModuleGetFunction(&spin, mod, "simgpu_spin"));
    unsigned long long ns = 1000000ull;
    void *args[] = {&ns};

    launch_fn kernel = (launch_fn)dl("cuLaunchKernel");
    launch_fn kernel_ptsz = (launch_fn)dl("cuLaunchKernel_ptsz");
    coop_fn coop = (coop_fn)dl("cuLaunchCooperativeKernel");
    coop_fn coop_ptsz = (coop_fn)dl("cuLaunchCooperativeKernel_ptsz");
    ex_fn ex = (ex_fn)dl("cuLaunchKernelEx");
    ex_fn ex_ptsz = (ex_fn)dl("cuLaunchKernelEx_ptsz");
    graph_fn graph = (graph_fn)dl("cuGraphLaunch");
    graph_fn graph_ptsz = (graph_fn)dl("cuGraphLaunch_ptsz");
    CUresult (*sync_ptsz)(CUstream) = dl("cuStreamSynchronize_ptsz");

    /* A graph of one spin launch, captured (a capturing launch is not gated: nothing runs). */
    CUgraph g;
    CUgraphExec exec;
    CHECK(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
    CHECK(kernel(spin, 1, 1, 1, 32, 1, 1, 0, s, args, NULL));
    CHECK(cuStreamEndCapture(s, &g));
    CHECK(cuGraphInstantiateWithFlags(&exec, g, 0));

    CUlaunchConfig cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.gridDimX = cfg.gridDimY = cfg.gridDimZ = 1;
    cfg.blockDimX = 32;
    cfg.blockDimY = cfg.blockDimZ = 1;
    cfg.hStream = s;
    CUlaunchConfig cfg_ptsz = cfg;
    cfg_ptsz.hStream = NULL; /* the per-thread default stream */

    printf("ready\n");
    fflush(stdout);
    char line[128], path[64];
    while (fgets(line, sizeof line, stdin)) {
        EXPECT(sscanf(line, "go %63s", path) == 1, "bad command %s", line);
        CUresult rc;
        int ptsz = strstr(path, "_ptsz") != NULL;
        if (!strcmp(path, "kernel")) rc = kernel(spin, 1, 1, 1, 32, 1, 1, 0, s, args, NULL);
        else if (!strcmp(path, "kernel_ptsz")) rc = kernel_ptsz(spin, 1, 1, 1, 32, 1, 1, 0, NULL, args, NULL);
        else if (!strcmp(path, "ex")) rc = ex(&cfg, spin, args, NULL);
        else if (!strcmp(path, "ex_ptsz")) rc = ex_ptsz(&cfg_ptsz, spin, args, NULL);
        else if (!strcmp(path, "coop")) rc = coop(spin, 1, 1, 1, 32, 1, 1, 0, s, args);
        else if (!strcmp(path, "coop_ptsz")) rc = coop_ptsz(spin, 1, 1, 1, 32, 1, 1, 0, NULL, args);
        else if (!strcmp(path, "graph")) rc = graph(exec, s);
        else if (!strcmp(path, "graph_ptsz")) rc = graph_ptsz(exec, NULL);
        else EXPECT(0, "unknown path %s", path);
        EXPECT(rc == CUDA_SUCCESS, "%s returned %d", path, (int)rc);
        printf("launched %s\n", path);
        fflush(stdout);
        if (ptsz) CHECK(sync_ptsz(NULL));
        else CHECK(cuStreamSynchronize(s));
    }
    printf("OK\n");
    return 0;
}
