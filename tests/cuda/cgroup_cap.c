/* cgroup_cap fill STEP_MIB MAX_MIB   allocate STEP MiB at a time (plain driver API, no shim
 *                                    needed) until an allocation fails or MAX MiB are held; print
 *                                    {"check":"fill","allocated_mib":N,"result":<CUresult of the
 *                                    last call>}
 * cgroup_cap limits NAMESPACE        the driver's per-cgroup memory limits of device 0 for the
 *                                    cgroup directory NAMESPACE (nvmlDeviceGetMemoryLimits_v1,
 *                                    resolved by name: older drivers lack it); print
 *                                    {"check":"limits","result":<nvmlReturn_t>,"soft":..,"hard":..,"used":..}
 * The structure is NVIDIA's documented nvmlGetMemoryLimits_v1_t (NVML API reference, r615). */
#include <cuda.h>
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    const char *nameSpace;
    unsigned long long softLimit;
    unsigned long long hardLimit;
    unsigned long long currentUsed;
} get_limits_v1;

static int limits(const char *ns) {
    void *lib = dlopen("libnvidia-ml.so.1", RTLD_NOW);
    if (!lib) {
        printf("{\"check\":\"limits\",\"result\":-1}\n");
        return 1;
    }
    int (*init)(void) = (int (*)(void))dlsym(lib, "nvmlInit_v2");
    int (*handle)(unsigned, void **) = (int (*)(unsigned, void **))dlsym(lib, "nvmlDeviceGetHandleByIndex_v2");
    int (*get)(void *, get_limits_v1 *) = (int (*)(void *, get_limits_v1 *))dlsym(lib, "nvmlDeviceGetMemoryLimits_v1");
    void *dev = NULL;
    if (!init || !handle || init() || handle(0, &dev)) {
        printf("{\"check\":\"limits\",\"result\":-2}\n");
        return 1;
    }
    if (!get) {
        printf("{\"check\":\"limits\",\"result\":-3}\n");
        return 0;
    }
    get_limits_v1 l = {ns, 0, 0, 0};
    int r = get(dev, &l);
    printf("{\"check\":\"limits\",\"result\":%d,\"soft\":%llu,\"hard\":%llu,\"used\":%llu}\n", r,
           l.softLimit, l.hardLimit, l.currentUsed);
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 3) return 2;
    if (!strcmp(argv[1], "limits")) return limits(argv[2]);
    if (strcmp(argv[1], "fill") || argc < 4) return 2;
    size_t step = (size_t)atoi(argv[2]) << 20, max = (size_t)atoi(argv[3]) << 20, held = 0;
    CUdevice d;
    CUcontext c;
    CUresult r = cuInit(0);
    if (!r) r = cuDeviceGet(&d, 0);
    if (!r) r = cuDevicePrimaryCtxRetain(&c, d);
    if (!r) r = cuCtxSetCurrent(c);
    while (!r && held < max) {
        CUdeviceptr p;
        r = cuMemAlloc(&p, step);
        if (!r) held += step;
    }
    printf("{\"check\":\"fill\",\"allocated_mib\":%zu,\"result\":%d}\n", held >> 20, (int)r);
    return 0;
}
