/* NVML on simgpu, from C (run by tests/tests/sim_nvml.rs). Two modes:
 *
 *   nvml_test report          dlopens libnvidia-ml.so.1 (no cuInit) and prints one JSON line
 *                             {"check":"nvml",...} about device 0: count, name, uuid, bus id,
 *                             memory, utilisation, compute processes and per-process samples.
 *                             It also checks the NVML ABI conventions on the way (uninitialised
 *                             before nvmlInit, NULL arguments, the size protocol of the lists,
 *                             the v1 and v2 struct layouts agree) and prints "FAIL ..." and exits 1
 *                             if one does not hold.
 *   nvml_test job SECS MIB    a GPU user through the driver API (dlopens libcuda.so.1): allocates
 *                             MIB MiB, then keeps the device busy with 5 ms simgpu_spin kernels for
 *                             SECS seconds. Prints {"check":"job","pid":..,"uuid":"GPU-..."} once
 *                             the memory is held and the first kernels are queued, "OK" at the end.
 *
 * The NVML types are declared here from nvml.h (no header needed); the sizes are asserted. */
#include <cuda.h>
#include <dlfcn.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include "check.h"

/* ---- NVML ABI (nvml.h) ---- */
typedef int nvmlReturn_t;
typedef struct nvmlDevice_st *nvmlDevice_t;
typedef struct {
    unsigned long long total, free, used;
} nvmlMemory_t;
typedef struct {
    unsigned int version;
    unsigned long long total, reserved, free, used;
} nvmlMemory_v2_t;
typedef struct {
    unsigned int gpu, memory;
} nvmlUtilization_t;
typedef struct {
    char busIdLegacy[16];
    unsigned int domain, bus, device, pciDeviceId, pciSubSystemId;
    char busId[32];
} nvmlPciInfo_t;
typedef struct {
    unsigned int pid;
    unsigned long long usedGpuMemory;
} nvmlProcessInfo_v1_t;
typedef struct {
    unsigned int pid;
    unsigned long long usedGpuMemory;
    unsigned int gpuInstanceId, computeInstanceId;
} nvmlProcessInfo_t;
typedef struct {
    unsigned int pid;
    unsigned long long timeStamp;
    unsigned int smUtil, memUtil, encUtil, decUtil;
} nvmlProcessUtilizationSample_t;

_Static_assert(sizeof(nvmlMemory_t) == 24, "nvmlMemory_t");
_Static_assert(sizeof(nvmlMemory_v2_t) == 40, "nvmlMemory_v2_t");
_Static_assert(sizeof(nvmlPciInfo_t) == 68 && offsetof(nvmlPciInfo_t, busId) == 36, "nvmlPciInfo_t");
_Static_assert(sizeof(nvmlProcessInfo_v1_t) == 16, "nvmlProcessInfo_v1_t");
_Static_assert(sizeof(nvmlProcessInfo_t) == 24, "nvmlProcessInfo_t");
_Static_assert(sizeof(nvmlProcessUtilizationSample_t) == 32, "nvmlProcessUtilizationSample_t");

#define NVML_SUCCESS 0
#define NVML_ERROR_UNINITIALIZED 1
#define NVML_ERROR_INVALID_ARGUMENT 2
#define NVML_ERROR_NOT_FOUND 6
#define NVML_ERROR_INSUFFICIENT_SIZE 7
#define nvmlMemory_v2 ((unsigned int)(sizeof(nvmlMemory_v2_t) | (2 << 24)))
#define MAX_PROCS 64


static void *lib;

static void *sym(const char *name) {
    void *p = dlsym(lib, name);
    EXPECT(p != NULL, "%s is not exported", name);
    return p;
}

/* Calls NVML function `name` with the given prototype. */
#define NVML(name, proto) ((nvmlReturn_t(*) proto)sym(name))

static void check(nvmlReturn_t rc, const char *what) {
    if (rc != NVML_SUCCESS) {
        const char *(*err)(nvmlReturn_t) = (const char *(*)(nvmlReturn_t))sym("nvmlErrorString");
        EXPECT(rc == NVML_SUCCESS, "%s = %d (%s)", what, rc, err(rc));
    }
}

/* JSON string body: the values printed here are plain ASCII without quotes or backslashes. */
static void json_str(const char *key, const char *value) { printf("\"%s\":\"%s\",", key, value); }

static int report(void) {
    lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    EXPECT(lib != NULL, "dlopen libnvidia-ml.so.1: %s", dlerror());

    unsigned int count = 0;
    nvmlReturn_t rc = NVML("nvmlDeviceGetCount_v2", (unsigned int *))(&count);
    EXPECT(rc == NVML_ERROR_UNINITIALIZED, "nvmlDeviceGetCount_v2 before nvmlInit = %d", rc);

    check(NVML("nvmlInit_v2", (void))(), "nvmlInit_v2");
    check(NVML("nvmlDeviceGetCount_v2", (unsigned int *))(&count), "nvmlDeviceGetCount_v2");
    rc = NVML("nvmlDeviceGetCount_v2", (unsigned int *))(NULL);
    EXPECT(rc == NVML_ERROR_INVALID_ARGUMENT, "nvmlDeviceGetCount_v2(NULL) = %d", rc);

    nvmlDevice_t dev = NULL;
    check(NVML("nvmlDeviceGetHandleByIndex_v2", (unsigned int, nvmlDevice_t *))(0, &dev),
          "nvmlDeviceGetHandleByIndex_v2");
    rc = NVML("nvmlDeviceGetHandleByIndex_v2", (unsigned int, nvmlDevice_t *))(count, &dev);
    EXPECT(rc == NVML_ERROR_INVALID_ARGUMENT, "handle of index %u = %d", count, rc);

    char name[96], uuid[96], driver[80];
    check(NVML("nvmlDeviceGetName", (nvmlDevice_t, char *, unsigned int))(dev, name, sizeof name),
          "nvmlDeviceGetName");
    check(NVML("nvmlDeviceGetUUID", (nvmlDevice_t, char *, unsigned int))(dev, uuid, sizeof uuid),
          "nvmlDeviceGetUUID");
    check(NVML("nvmlSystemGetDriverVersion", (char *, unsigned int))(driver, sizeof driver),
          "nvmlSystemGetDriverVersion");
    nvmlDevice_t by_uuid = NULL;
    check(NVML("nvmlDeviceGetHandleByUUID", (const char *, nvmlDevice_t *))(uuid, &by_uuid),
          "nvmlDeviceGetHandleByUUID");
    EXPECT(by_uuid == dev, "handle by UUID %p != %p", (void *)by_uuid, (void *)dev);

    nvmlPciInfo_t pci;
    memset(&pci, 0xff, sizeof pci);
    check(NVML("nvmlDeviceGetPciInfo_v3", (nvmlDevice_t, nvmlPciInfo_t *))(dev, &pci),
          "nvmlDeviceGetPciInfo_v3");
    nvmlDevice_t by_bus = NULL;
    check(NVML("nvmlDeviceGetHandleByPciBusId_v2", (const char *, nvmlDevice_t *))(pci.busId, &by_bus),
          "nvmlDeviceGetHandleByPciBusId_v2");
    EXPECT(by_bus == dev, "handle by bus id %s", pci.busId);

    int cc_major = 0, cc_minor = 0, cuda_version = 0;
    check(NVML("nvmlDeviceGetCudaComputeCapability", (nvmlDevice_t, int *, int *))(dev, &cc_major, &cc_minor),
          "nvmlDeviceGetCudaComputeCapability");
    check(NVML("nvmlSystemGetCudaDriverVersion_v2", (int *))(&cuda_version),
          "nvmlSystemGetCudaDriverVersion_v2");

    nvmlMemory_t mem;
    check(NVML("nvmlDeviceGetMemoryInfo", (nvmlDevice_t, nvmlMemory_t *))(dev, &mem), "nvmlDeviceGetMemoryInfo");
    nvmlMemory_v2_t mem2;
    memset(&mem2, 0xff, sizeof mem2);
    mem2.version = nvmlMemory_v2;
    check(NVML("nvmlDeviceGetMemoryInfo_v2", (nvmlDevice_t, nvmlMemory_v2_t *))(dev, &mem2),
          "nvmlDeviceGetMemoryInfo_v2");
    EXPECT(mem.total == mem2.total && mem2.reserved == 0, "v1 total %llu, v2 total %llu reserved %llu",
           mem.total, mem2.total, mem2.reserved);
    EXPECT(mem.used + mem.free == mem.total, "used %llu + free %llu != total %llu", mem.used, mem.free,
           mem.total);

    nvmlUtilization_t util;
    check(NVML("nvmlDeviceGetUtilizationRates", (nvmlDevice_t, nvmlUtilization_t *))(dev, &util),
          "nvmlDeviceGetUtilizationRates");

    /* Compute processes: the size protocol, then v3 and v1 must agree. */
    typedef nvmlReturn_t (*procs_fn)(nvmlDevice_t, unsigned int *, void *);
    procs_fn procs_v3 = (procs_fn)sym("nvmlDeviceGetComputeRunningProcesses_v3");
    procs_fn procs_v1 = (procs_fn)sym("nvmlDeviceGetComputeRunningProcesses");
    unsigned int nprocs = 0;
    rc = procs_v3(dev, &nprocs, NULL);
    EXPECT(rc == NVML_SUCCESS || rc == NVML_ERROR_INSUFFICIENT_SIZE, "size query = %d", rc);
    EXPECT((rc == NVML_SUCCESS) == (nprocs == 0), "size query rc %d with count %u", rc, nprocs);
    nvmlProcessInfo_t procs[MAX_PROCS];
    nvmlProcessInfo_v1_t procs1[MAX_PROCS];
    nprocs = MAX_PROCS;
    check(procs_v3(dev, &nprocs, procs), "nvmlDeviceGetComputeRunningProcesses_v3");
    unsigned int nprocs1 = MAX_PROCS;
    check(procs_v1(dev, &nprocs1, procs1), "nvmlDeviceGetComputeRunningProcesses");
    if (nprocs1 == nprocs) {
        for (unsigned int i = 0; i < nprocs; i++) {
            EXPECT(procs1[i].pid == procs[i].pid && procs1[i].usedGpuMemory == procs[i].usedGpuMemory,
                   "v1/v3 entry %u differ: pid %u/%u", i, procs1[i].pid, procs[i].pid);
            EXPECT(procs[i].gpuInstanceId == 0xFFFFFFFFu && procs[i].computeInstanceId == 0xFFFFFFFFu,
                   "MIG ids of entry %u: %u %u", i, procs[i].gpuInstanceId, procs[i].computeInstanceId);
        }
    }
    if (nprocs > 0) {
        unsigned int small = 0;
        rc = procs_v3(dev, &small, procs);
        EXPECT(rc == NVML_ERROR_INSUFFICIENT_SIZE && small >= 1, "count 0 with %u processes: rc %d count %u",
               nprocs, rc, small);
    }
    nvmlProcessInfo_t graphics[4];
    unsigned int ngraphics = 4;
    check(NVML("nvmlDeviceGetGraphicsRunningProcesses_v3", (nvmlDevice_t, unsigned int *, nvmlProcessInfo_t *))(
              dev, &ngraphics, graphics),
          "nvmlDeviceGetGraphicsRunningProcesses_v3");
    EXPECT(ngraphics == 0, "%u graphics processes", ngraphics);

    /* Per-process utilisation since the start of the last second. */
    typedef nvmlReturn_t (*util_fn)(nvmlDevice_t, nvmlProcessUtilizationSample_t *, unsigned int *,
                                    unsigned long long);
    util_fn putil = (util_fn)sym("nvmlDeviceGetProcessUtilization");
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    unsigned long long since = (unsigned long long)now.tv_sec * 1000000ull - 1000000ull;
    nvmlProcessUtilizationSample_t samples[MAX_PROCS];
    unsigned int nsamples = 0;
    rc = putil(dev, NULL, &nsamples, since);
    EXPECT(rc == NVML_ERROR_NOT_FOUND || rc == NVML_ERROR_INSUFFICIENT_SIZE, "sample count query = %d", rc);
    if (rc == NVML_ERROR_INSUFFICIENT_SIZE) {
        nsamples = MAX_PROCS;
        check(putil(dev, samples, &nsamples, since), "nvmlDeviceGetProcessUtilization");
    } else {
        nsamples = 0;
    }
    unsigned int none = MAX_PROCS;
    rc = putil(dev, samples + nsamples, &none, ~0ull);
    EXPECT(rc == NVML_ERROR_NOT_FOUND, "samples after the end of time: rc %d", rc);

    printf("{\"check\":\"nvml\",\"count\":%u,", count);
    json_str("name", name);
    json_str("uuid", uuid);
    json_str("bus_id", pci.busId);
    json_str("bus_id_legacy", pci.busIdLegacy);
    json_str("driver", driver);
    printf("\"cuda_version\":%d,\"cc\":[%d,%d],\"pci\":[%u,%u,%u],", cuda_version, cc_major, cc_minor,
           pci.domain, pci.bus, pci.device);
    printf("\"total\":%llu,\"used\":%llu,\"free\":%llu,\"util_gpu\":%u,\"util_mem\":%u,\"processes\":[",
           mem.total, mem.used, mem.free, util.gpu, util.memory);
    for (unsigned int i = 0; i < nprocs; i++)
        printf("%s{\"pid\":%u,\"used\":%llu}", i ? "," : "", procs[i].pid, procs[i].usedGpuMemory);
    printf("],\"samples\":[");
    for (unsigned int i = 0; i < nsamples; i++)
        printf("%s{\"pid\":%u,\"sm\":%u,\"ts\":%llu}", i ? "," : "", samples[i].pid, samples[i].smUtil,
               samples[i].timeStamp);
    printf("]}\n");

    check(NVML("nvmlShutdown", (void))(), "nvmlShutdown");
    rc = NVML("nvmlDeviceGetCount_v2", (unsigned int *))(&count);
    EXPECT(rc == NVML_ERROR_UNINITIALIZED, "nvmlDeviceGetCount_v2 after nvmlShutdown = %d", rc);
    return 0;
}

/* ---- a GPU user ---- */

static const char SPIN_PTX[] = ".version 7.0\n"
                               ".target sm_70\n"
                               ".address_size 64\n"
                               ".visible .entry simgpu_spin(.param .u64 ns)\n"
                               "{\n"
                               "    ret;\n"
                               "}\n";

#define CU(call)                                                                           \
    do {                                                                                   \
        CUresult rc_ = (call);                                                             \
        EXPECT(rc_ == CUDA_SUCCESS, "%s = %d", #call, rc_);                                \
    } while (0)

static double seconds(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static int job(double secs, unsigned long long mib) {
    lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    EXPECT(lib != NULL, "dlopen libcuda.so.1: %s", dlerror());
    CUresult (*cu_init)(unsigned) = (CUresult(*)(unsigned))sym("cuInit");
    CUresult (*get_uuid)(CUuuid *, CUdevice) = (CUresult(*)(CUuuid *, CUdevice))sym("cuDeviceGetUuid");
    CUresult (*retain)(CUcontext *, CUdevice) = (CUresult(*)(CUcontext *, CUdevice))sym("cuDevicePrimaryCtxRetain");
    CUresult (*set_current)(CUcontext) = (CUresult(*)(CUcontext))sym("cuCtxSetCurrent");
    CUresult (*mem_alloc)(CUdeviceptr *, size_t) = (CUresult(*)(CUdeviceptr *, size_t))sym("cuMemAlloc_v2");
    CUresult (*mem_free)(CUdeviceptr) = (CUresult(*)(CUdeviceptr))sym("cuMemFree_v2");
    CUresult (*load)(CUmodule *, const void *) = (CUresult(*)(CUmodule *, const void *))sym("cuModuleLoadData");
    CUresult (*get_fn)(CUfunction *, CUmodule, const char *) =
        (CUresult(*)(CUfunction *, CUmodule, const char *))sym("cuModuleGetFunction");
    CUresult (*launch)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                       CUstream, void **, void **) =
        (CUresult(*)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, CUstream,
                     void **, void **))sym("cuLaunchKernel");
    CUresult (*sync)(void) = (CUresult(*)(void))sym("cuCtxSynchronize");

    CU(cu_init(0));
    CUuuid uuid;
    CU(get_uuid(&uuid, 0));
    CUcontext ctx;
    CU(retain(&ctx, 0));
    CU(set_current(ctx));
    CUdeviceptr buf;
    CU(mem_alloc(&buf, (size_t)(mib << 20)));
    CUmodule mod;
    CU(load(&mod, SPIN_PTX));
    CUfunction spin;
    CU(get_fn(&spin, mod, "simgpu_spin"));

    unsigned long long ns = 5000000; /* 5 ms per kernel */
    void *args[] = {&ns};
    double end = seconds() + secs;
    unsigned long launched = 0;
    int announced = 0;
    while (seconds() < end) {
        for (int i = 0; i < 4; i++, launched++)
            CU(launch(spin, 1, 1, 1, 32, 1, 1, 0, NULL, args, NULL));
        if (!announced) {
            const unsigned char *u = (const unsigned char *)uuid.bytes;
            printf("{\"check\":\"job\",\"pid\":%d,\"uuid\":\"GPU-", (int)getpid());
            for (int i = 0; i < 16; i++)
                printf("%s%02x", (i == 4 || i == 6 || i == 8 || i == 10) ? "-" : "", u[i]);
            printf("\"}\n");
            fflush(stdout);
            announced = 1;
        }
        CU(sync());
    }
    CU(mem_free(buf));
    printf("launched=%lu\nOK\n", launched);
    return 0;
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc == 2 && strcmp(argv[1], "report") == 0)
        return report();
    if (argc == 4 && strcmp(argv[1], "job") == 0)
        return job(atof(argv[2]), strtoull(argv[3], NULL, 10));
    fprintf(stderr, "usage: %s report | job SECS MIB\n", argv[0]);
    return 2;
}
