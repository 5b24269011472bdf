/* Every launch path once, on the test's command, for the gate tests (tests/tests/shim_gate.rs).
 *
 * usage: shim_gate paths
 *   Sets up (context, stream, the spin kernel, a graph captured from one spin launch), prints
 *   "ready", then for each line "go <path>" read from stdin launches a 1 ms spin kernel through
 *   that path and prints "launched <path>" once the call returned (then synchronises). Paths:
 *   kernel kernel_ptsz ex ex_ptsz coop coop_ptsz graph graph_ptsz, and the deprecated ones:
 *   grid (cuLaunchGrid, from cuGetProcAddress as an old binary asks: the 4-argument
 *   cuGetProcAddress at CUDA 2.0), grid_async (cuLaunchGridAsync, linked directly), launch
 *   (cuLaunch, by dlsym), multi (cuLaunchCooperativeKernelMultiDevice, one entry, from
 *   cuGetProcAddress_v2 at CUDA 9.0). Memsets and device-to-device copies of 64 MiB (issue 18,
 *   must-show 3), printing "launched <path>" the same way: memset (cuMemsetD8_v2), memset_ptds
 *   (cuMemsetD32_v2_ptds), memset_2d (cuMemsetD2D16_v2), memset_proc (cuMemsetD16 from
 *   cuGetProcAddress at CUDA 3.2), memset_async (cuMemsetD8Async), memset_async_ptsz
 *   (cuMemsetD2D32Async_ptsz), dtod (cuMemcpyDtoD_v2), dtod_ptds, dtod_async
 *   (cuMemcpyDtoDAsync_v2), dtod_async_ptsz, copy (cuMemcpy, both pointers device memory),
 *   copy_async (cuMemcpyAsync), copy_async_ptsz; and copy_h2d (cuMemcpy from host memory, not
 *   a device-to-device copy). "OK" at EOF.
 * Entry points come from dlsym(RTLD_DEFAULT) (the shim's exports when preloaded), the _ptsz
 * ones by their ABI names. The legacy launches use the block shape and parameter buffer set on
 * the spin kernel once. */
#define _GNU_SOURCE
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
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
typedef CUresult (*grid_fn)(CUfunction, int, int);
typedef CUresult (*legacy_fn)(CUfunction);
typedef CUresult (*multi_fn)(CUDA_LAUNCH_PARAMS *, unsigned, unsigned);
typedef CUresult (*memset8_fn)(CUdeviceptr, unsigned char, size_t);
typedef CUresult (*memset32_fn)(CUdeviceptr, unsigned int, size_t);
typedef CUresult (*memset2d16_fn)(CUdeviceptr, size_t, unsigned short, size_t, size_t);
typedef CUresult (*memset16_fn)(CUdeviceptr, unsigned short, size_t);
typedef CUresult (*memset8_async_fn)(CUdeviceptr, unsigned char, size_t, CUstream);
typedef CUresult (*memset2d32_async_fn)(CUdeviceptr, size_t, unsigned int, size_t, size_t,
                                        CUstream);
typedef CUresult (*copy_fn)(CUdeviceptr, CUdeviceptr, size_t);
typedef CUresult (*copy_async_fn)(CUdeviceptr, CUdeviceptr, size_t, CUstream);
typedef CUresult (*proc_v1_fn)(const char *, void **, int, cuuint64_t);

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

    /* The deprecated API's entry points, as old binaries reach them. */
    proc_v1_fn proc_v1 = (proc_v1_fn)dl("cuGetProcAddress");
    grid_fn grid = NULL;
    CHECK(proc_v1("cuLaunchGrid", (void **)&grid, 2000, CU_GET_PROC_ADDRESS_DEFAULT));
    EXPECT(grid != NULL, "cuGetProcAddress(cuLaunchGrid) = NULL");
    legacy_fn launch = (legacy_fn)dl("cuLaunch");
    multi_fn multi = NULL;
    CUdriverProcAddressQueryResult found;
    CHECK(cuGetProcAddress("cuLaunchCooperativeKernelMultiDevice", (void **)&multi, 9000,
                           CU_GET_PROC_ADDRESS_DEFAULT, &found));
    EXPECT(multi != NULL && found == CU_GET_PROC_ADDRESS_SUCCESS,
           "cuGetProcAddress(cuLaunchCooperativeKernelMultiDevice) = %p", (void *)multi);
    CHECK(cuFuncSetBlockShape(spin, 32, 1, 1));
    CHECK(cuFuncSetSharedSize(spin, 0));
    CHECK(cuParamSetv(spin, 0, &ns, sizeof ns));
    CHECK(cuParamSetSize(spin, sizeof ns));
    CUDA_LAUNCH_PARAMS entry;
    memset(&entry, 0, sizeof entry);
    entry.function = spin;
    entry.gridDimX = entry.gridDimY = entry.gridDimZ = 1;
    entry.blockDimX = 32;
    entry.blockDimY = entry.blockDimZ = 1;
    entry.hStream = s;
    entry.kernelParams = args;

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

    /* Memsets and device-to-device copies, by their ABI names. */
    enum { BYTES = 64 << 20 };
    CUdeviceptr a, b;
    CHECK(cuMemAlloc(&a, BYTES));
    CHECK(cuMemAlloc(&b, BYTES));
    static char host[1 << 20];
    memset8_fn memset8 = (memset8_fn)dl("cuMemsetD8_v2");
    memset32_fn memset32_ptds = (memset32_fn)dl("cuMemsetD32_v2_ptds");
    memset2d16_fn memset2d16 = (memset2d16_fn)dl("cuMemsetD2D16_v2");
    memset8_async_fn memset8_async = (memset8_async_fn)dl("cuMemsetD8Async");
    memset2d32_async_fn memset2d32_async_ptsz = (memset2d32_async_fn)dl("cuMemsetD2D32Async_ptsz");
    copy_fn dtod = (copy_fn)dl("cuMemcpyDtoD_v2");
    copy_fn dtod_ptds = (copy_fn)dl("cuMemcpyDtoD_v2_ptds");
    copy_async_fn dtod_async = (copy_async_fn)dl("cuMemcpyDtoDAsync_v2");
    copy_async_fn dtod_async_ptsz = (copy_async_fn)dl("cuMemcpyDtoDAsync_v2_ptsz");
    copy_fn copy = (copy_fn)dl("cuMemcpy");
    copy_async_fn copy_async = (copy_async_fn)dl("cuMemcpyAsync");
    copy_async_fn copy_async_ptsz = (copy_async_fn)dl("cuMemcpyAsync_ptsz");
    memset16_fn memset16 = NULL;
    CHECK(cuGetProcAddress("cuMemsetD16", (void **)&memset16, 3020, CU_GET_PROC_ADDRESS_DEFAULT,
                           &found));
    EXPECT(memset16 != NULL && found == CU_GET_PROC_ADDRESS_SUCCESS,
           "cuGetProcAddress(cuMemsetD16) = %p", (void *)memset16);

    printf("ready\n");
    fflush(stdout);
    char line[128], path[64];
    while (fgets(line, sizeof line, stdin)) {
        EXPECT(sscanf(line, "go %63s", path) == 1, "bad command %s", line);
        CUresult rc;
        int ptsz = strstr(path, "_ptsz") != NULL || strstr(path, "_ptds") != NULL;
        /* The synchronous forms run on the legacy NULL stream. */
        int legacy = !strcmp(path, "grid") || !strcmp(path, "launch") || !strcmp(path, "memset") ||
                     !strcmp(path, "memset_2d") || !strcmp(path, "memset_proc") ||
                     !strcmp(path, "dtod") || !strcmp(path, "copy") || !strcmp(path, "copy_h2d");
        if (!strcmp(path, "kernel")) rc = kernel(spin, 1, 1, 1, 32, 1, 1, 0, s, args, NULL);
        else if (!strcmp(path, "kernel_ptsz")) rc = kernel_ptsz(spin, 1, 1, 1, 32, 1, 1, 0, NULL, args, NULL);
        else if (!strcmp(path, "ex")) rc = ex(&cfg, spin, args, NULL);
        else if (!strcmp(path, "ex_ptsz")) rc = ex_ptsz(&cfg_ptsz, spin, args, NULL);
        else if (!strcmp(path, "coop")) rc = coop(spin, 1, 1, 1, 32, 1, 1, 0, s, args);
        else if (!strcmp(path, "coop_ptsz")) rc = coop_ptsz(spin, 1, 1, 1, 32, 1, 1, 0, NULL, args);
        else if (!strcmp(path, "graph")) rc = graph(exec, s);
        else if (!strcmp(path, "graph_ptsz")) rc = graph_ptsz(exec, NULL);
        else if (!strcmp(path, "grid")) rc = grid(spin, 1, 1);
        else if (!strcmp(path, "grid_async")) rc = cuLaunchGridAsync(spin, 1, 1, s);
        else if (!strcmp(path, "launch")) rc = launch(spin);
        else if (!strcmp(path, "multi")) rc = multi(&entry, 1, 0);
        else if (!strcmp(path, "memset")) rc = memset8(a, 1, BYTES);
        else if (!strcmp(path, "memset_ptds")) rc = memset32_ptds(a, 2, BYTES / 4);
        else if (!strcmp(path, "memset_2d")) rc = memset2d16(a, 4096, 3, 2048, BYTES / 4096);
        else if (!strcmp(path, "memset_proc")) rc = memset16(a, 4, BYTES / 2);
        else if (!strcmp(path, "memset_async")) rc = memset8_async(a, 5, BYTES, s);
        else if (!strcmp(path, "memset_async_ptsz"))
            rc = memset2d32_async_ptsz(a, 4096, 6, 1024, BYTES / 4096, NULL);
        else if (!strcmp(path, "dtod")) rc = dtod(b, a, BYTES);
        else if (!strcmp(path, "dtod_ptds")) rc = dtod_ptds(b, a, BYTES);
        else if (!strcmp(path, "dtod_async")) rc = dtod_async(b, a, BYTES, s);
        else if (!strcmp(path, "dtod_async_ptsz")) rc = dtod_async_ptsz(b, a, BYTES, NULL);
        else if (!strcmp(path, "copy")) rc = copy(b, a, BYTES);
        else if (!strcmp(path, "copy_async")) rc = copy_async(b, a, BYTES, s);
        else if (!strcmp(path, "copy_async_ptsz")) rc = copy_async_ptsz(b, a, BYTES, NULL);
        else if (!strcmp(path, "copy_h2d")) rc = copy(a, (CUdeviceptr)host, sizeof host);
        else EXPECT(0, "unknown path %s", path);
        EXPECT(rc == CUDA_SUCCESS, "%s returned %d", path, (int)rc);
        printf("launched %s\n", path);
        fflush(stdout);
        if (ptsz) CHECK(sync_ptsz(NULL));
        else if (legacy) CHECK(cuCtxSynchronize());
        else CHECK(cuStreamSynchronize(s));
    }
    printf("OK\n");
    return 0;
}
