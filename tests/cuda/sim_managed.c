/* simgpu's unified memory checked against what the real driver does (tests/tests/sim_managed.rs).
 * A driver-API program with one kernel, `touch(p)`, whose pointer argument tells simgpu which
 * managed allocation it references; kernels and transfers are timed with events (modelled
 * device time). NVML is dlopened. Modes (each prints one JSON line, or "FAIL ..." and exits 1):
 *
 *   lru          (SIMGPU_MEMORY=256MiB) A and B, 96 MiB each, migrated in that order, then A
 *                touched three more times while resident; a 160 MiB cuMemAlloc must evict 96 MiB.
 *                Prints the time of a kernel on B, then on A, after it ("b_ms", "a_ms"), and the
 *                wall time cuMemAlloc took ("alloc_ms": it waits for the write-back).
 *   costs        (1 GiB) a kernel faulting in 256 MiB ("fault_ms"), a 256 MiB prefetch to the
 *                device ("prefetch_ms"), two kernels on 64 MiB advised to prefer the CPU
 *                ("remote_ms" each) and the device memory that took ("remote_resident").
 *   nvml         (1 GiB) NVML used memory: before, after a 256 MiB cuMemAllocManaged, after a
 *                kernel faulted it in, after a prefetch to the host; the PCIe RX throughput after
 *                the kernel, TX after the prefetch, and both 100 ms later (KB/s).
 *   hold MIB     faults MIB MiB in, prints {"check":"hold"} and waits for stdin's EOF.
 *   after_death  allocates 192 MiB managed, prints {"check":"ready"}, waits for a line on
 *                stdin, then times a kernel faulting it in ("ms"), reads NVML used, frees it and
 *                times the same on a new 192 MiB allocation ("control_ms"). */
#include <cuda.h>
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include "check.h"

#define MIB (1024ull * 1024ull)

static const char ptx[] = ".version 7.0\n.target sm_80\n.address_size 64\n"
                          ".visible .entry touch(.param .u64 p)\n{\n ret;\n}\n";

static CUfunction kernel;
static CUstream stream;
static CUevent ev0, ev1;

/* ---- NVML (nvml.h) ---- */
typedef struct nvmlDevice_st *nvmlDevice_t;
typedef struct {
    unsigned long long total, free, used;
} nvmlMemory_t;
static int (*nvml_init)(void);
static int (*nvml_handle)(unsigned, nvmlDevice_t *);
static int (*nvml_memory)(nvmlDevice_t, nvmlMemory_t *);
static int (*nvml_pcie)(nvmlDevice_t, unsigned, unsigned *);
static nvmlDevice_t nvml_dev;

static void nvml_open(void) {
    void *h = dlopen("libnvidia-ml.so.1", RTLD_NOW);
    EXPECT(h, "dlopen libnvidia-ml.so.1: %s", dlerror());
    nvml_init = (int (*)(void))dlsym(h, "nvmlInit_v2");
    nvml_handle = (int (*)(unsigned, nvmlDevice_t *))dlsym(h, "nvmlDeviceGetHandleByIndex_v2");
    nvml_memory = (int (*)(nvmlDevice_t, nvmlMemory_t *))dlsym(h, "nvmlDeviceGetMemoryInfo");
    nvml_pcie = (int (*)(nvmlDevice_t, unsigned, unsigned *))dlsym(h, "nvmlDeviceGetPcieThroughput");
    EXPECT(nvml_init && nvml_handle && nvml_memory, "NVML symbols");
    EXPECT(nvml_init() == 0, "nvmlInit_v2");
    EXPECT(nvml_handle(0, &nvml_dev) == 0, "nvmlDeviceGetHandleByIndex_v2");
}

static unsigned long long nvml_used(void) {
    nvmlMemory_t m;
    EXPECT(nvml_memory(nvml_dev, &m) == 0, "nvmlDeviceGetMemoryInfo");
    return m.used;
}

/* NVML_PCIE_UTIL_TX_BYTES = 0, NVML_PCIE_UTIL_RX_BYTES = 1; KB/s. */
static unsigned pcie(unsigned counter) {
    unsigned v = 0;
    EXPECT(nvml_pcie, "nvmlDeviceGetPcieThroughput is not exported");
    EXPECT(nvml_pcie(nvml_dev, counter, &v) == 0, "nvmlDeviceGetPcieThroughput(%u)", counter);
    return v;
}

static void setup(void) {
    CHECK(cuInit(0));
    CUdevice d;
    CHECK(cuDeviceGet(&d, 0));
    CUcontext ctx;
    CHECK(cuDevicePrimaryCtxRetain(&ctx, d));
    CHECK(cuCtxSetCurrent(ctx));
    CUmodule mod;
    CHECK(cuModuleLoadData(&mod, ptx));
    CHECK(cuModuleGetFunction(&kernel, mod, "touch"));
    CHECK(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
    CHECK(cuEventCreate(&ev0, CU_EVENT_DEFAULT));
    CHECK(cuEventCreate(&ev1, CU_EVENT_DEFAULT));
}

static CUdeviceptr managed(unsigned long long bytes) {
    CUdeviceptr p;
    CHECK(cuMemAllocManaged(&p, bytes, CU_MEM_ATTACH_GLOBAL));
    return p;
}

static void launch(CUdeviceptr p) {
    void *args[] = {&p};
    CHECK(cuLaunchKernel(kernel, 1, 1, 1, 32, 1, 1, 0, stream, args, NULL));
}

/* CUDA 13's cuMemPrefetchAsync/cuMemAdvise take a CUmemLocation (the _v2 entry points). */
static CUmemLocation device_loc(CUdevice d) {
    CUmemLocation l = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = d};
    return l;
}

static CUmemLocation host_loc(void) {
    CUmemLocation l = {.type = CU_MEM_LOCATION_TYPE_HOST, .id = 0};
    return l;
}

static float elapsed(void) {
    CHECK(cuEventSynchronize(ev1));
    float ms = 0;
    CHECK(cuEventElapsedTime(&ms, ev0, ev1));
    return ms;
}

/* Device time of one kernel on p. */
static float timed_touch(CUdeviceptr p) {
    CHECK(cuEventRecord(ev0, stream));
    launch(p);
    CHECK(cuEventRecord(ev1, stream));
    return elapsed();
}

static void lru(void) {
    CUdeviceptr a = managed(96 * MIB), b = managed(96 * MIB);
    launch(a); /* A migrated in first */
    launch(b); /* then B */
    for (int i = 0; i < 3; i++)
        launch(a); /* accesses to resident pages: the driver never sees them */
    CHECK(cuStreamSynchronize(stream));
    CUdeviceptr d;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    CHECK(cuMemAlloc(&d, 160 * MIB)); /* 64 MiB free: 96 MiB of managed memory must go */
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double alloc_ms = (t1.tv_sec - t0.tv_sec) * 1e3 + (t1.tv_nsec - t0.tv_nsec) / 1e6;
    float b_ms = timed_touch(b);
    float a_ms = timed_touch(a);
    printf("{\"check\":\"lru\",\"b_ms\":%.4f,\"a_ms\":%.4f,\"alloc_ms\":%.4f}\n", b_ms, a_ms,
           alloc_ms);
}

static void costs(void) {
    CUdevice dev;
    CHECK(cuCtxGetDevice(&dev));
    CUdeviceptr x = managed(256 * MIB), y = managed(256 * MIB), z = managed(64 * MIB);
    float fault_ms = timed_touch(x);
    CHECK(cuEventRecord(ev0, stream));
    CHECK(cuMemPrefetchAsync(y, 256 * MIB, device_loc(dev), 0, stream));
    CHECK(cuEventRecord(ev1, stream));
    float prefetch_ms = elapsed();
    CHECK(cuMemAdvise(z, 64 * MIB, CU_MEM_ADVISE_SET_PREFERRED_LOCATION, host_loc()));
    size_t free0, free1, total;
    CHECK(cuMemGetInfo(&free0, &total));
    float r1 = timed_touch(z), r2 = timed_touch(z);
    CHECK(cuMemGetInfo(&free1, &total));
    printf("{\"check\":\"costs\",\"fault_ms\":%.4f,\"prefetch_ms\":%.4f,\"remote_ms\":[%.4f,%.4f],"
           "\"remote_resident\":%lld}\n",
           fault_ms, prefetch_ms, r1, r2, (long long)free0 - (long long)free1);
}

static void nvml(void) {
    nvml_open();
    unsigned long long u0 = nvml_used();
    CUdeviceptr m = managed(256 * MIB);
    unsigned long long u1 = nvml_used();
    launch(m);
    CHECK(cuStreamSynchronize(stream));
    unsigned long long u2 = nvml_used();
    unsigned rx = pcie(1);
    CHECK(cuMemPrefetchAsync(m, 256 * MIB, host_loc(), 0, stream));
    CHECK(cuStreamSynchronize(stream));
    unsigned long long u3 = nvml_used();
    unsigned tx = pcie(0);
    usleep(100 * 1000); /* nothing moves: both counters read 0 after their 20 ms sample */
    unsigned rx_idle = pcie(1), tx_idle = pcie(0);
    printf("{\"check\":\"nvml\",\"used\":[%llu,%llu,%llu,%llu],\"rx\":%u,\"tx\":%u,"
           "\"rx_idle\":%u,\"tx_idle\":%u}\n",
           u0, u1, u2, u3, rx, tx, rx_idle, tx_idle);
}

static void hold(unsigned long long mib) {
    CUdeviceptr m = managed(mib * MIB);
    launch(m);
    CHECK(cuStreamSynchronize(stream));
    printf("{\"check\":\"hold\"}\n");
    fflush(stdout);
    char buf[64];
    while (fread(buf, 1, sizeof buf, stdin) > 0) {
    }
}

static void after_death(void) {
    nvml_open();
    CUdeviceptr m = managed(192 * MIB);
    printf("{\"check\":\"ready\"}\n");
    fflush(stdout);
    char line[64];
    EXPECT(fgets(line, sizeof line, stdin), "a line on stdin");
    float ms = timed_touch(m); /* first: before anything else could notice the death */
    unsigned long long used = nvml_used();
    /* The same on a device nobody else used: the control. */
    CHECK(cuMemFree(m));
    float control_ms = timed_touch(managed(192 * MIB));
    printf("{\"check\":\"after_death\",\"ms\":%.4f,\"control_ms\":%.4f,\"used\":%llu}\n",
           ms, control_ms, used);
}

int main(int argc, char **argv) {
    EXPECT(argc >= 2, "usage: sim_managed lru|costs|nvml|hold MIB|after_death");
    setup();
    if (!strcmp(argv[1], "lru"))
        lru();
    else if (!strcmp(argv[1], "costs"))
        costs();
    else if (!strcmp(argv[1], "nvml"))
        nvml();
    else if (!strcmp(argv[1], "hold") && argc == 3)
        hold(strtoull(argv[2], NULL, 10));
    else if (!strcmp(argv[1], "after_death"))
        after_death();
    else
        EXPECT(0, "unknown mode %s", argv[1]);
    return 0;
}
