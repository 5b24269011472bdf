/* hami_check MIB: what HAMi-core's own test programs check of a container's memory limit, on
 * the driver API and NVML only (no cudart), run inside a container HAMi's Allocate set up:
 *   - the device as the job sees it is the limit (cuMemGetInfo total; HAMi-core reports
 *     min(limit, device));
 *   - allocating up to the limit succeeds (MIB MiB, MIB = limit - 16 MiB);
 *   - past the limit an allocation fails with CUDA_ERROR_OUT_OF_MEMORY, the driver not asked;
 *   - NVML (nvmlDeviceGetMemoryInfo) reports the limit as the total and what is held as used.
 * Each check is a JSON line (the container tests' shape: mem, fill, past, then nvml and held);
 * it keeps its memory until standard input reaches end of file. */
#include <cuda.h>
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

typedef struct {
    unsigned long long total, free, used;
} nvml_memory;

int main(int argc, char **argv) {
    if (argc < 2) return 2;
    size_t mib = (size_t)atoi(argv[1]);
    size_t free_b = 0, total_b = 0;
    CUdevice d;
    CUcontext c;
    CUresult r = cuInit(0);
    if (!r) r = cuDeviceGet(&d, 0);
    if (!r) r = cuDevicePrimaryCtxRetain(&c, d);
    if (!r) r = cuCtxSetCurrent(c);
    if (!r) r = cuMemGetInfo(&free_b, &total_b);
    printf("{\"check\":\"mem\",\"result\":%d,\"total\":%zu,\"free\":%zu}\n", (int)r, total_b, free_b);
    fflush(stdout);
    if (r) return 1;
    CUdeviceptr p = 0, q = 0;
    r = cuMemAlloc(&p, mib << 20);
    printf("{\"check\":\"fill\",\"result\":%d}\n", (int)r);
    r = cuMemAlloc(&q, 32u << 20);
    printf("{\"check\":\"past\",\"result\":%d}\n", (int)r);
    void *lib = dlopen("libnvidia-ml.so.1", RTLD_NOW);
    int (*init)(void) = lib ? (int (*)(void))dlsym(lib, "nvmlInit_v2") : NULL;
    int (*handle)(unsigned, void **) = lib ? (int (*)(unsigned, void **))dlsym(lib, "nvmlDeviceGetHandleByIndex_v2") : NULL;
    int (*meminfo)(void *, nvml_memory *) = lib ? (int (*)(void *, nvml_memory *))dlsym(lib, "nvmlDeviceGetMemoryInfo") : NULL;
    void *dev = NULL;
    nvml_memory m = {0, 0, 0};
    int nr = (init && handle && meminfo) ? init() : -1;
    if (!nr) nr = handle(0, &dev);
    if (!nr) nr = meminfo(dev, &m);
    printf("{\"check\":\"nvml\",\"result\":%d,\"total\":%llu,\"used\":%llu}\n", nr, m.total, m.used);
    printf("{\"check\":\"held\"}\n");
    fflush(stdout);
    char ch;
    while (read(0, &ch, 1) > 0) {
    }
    return 0;
}
