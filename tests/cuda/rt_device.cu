// Device query the way deviceQuery / simpleOccupancy / simpleCooperativeGroups do it, through
// the real CUDA 13.5 runtime: every cudaDeviceProp field, every device attribute, limits, cache
// configs, PCI ids, occupancy, function attributes, cooperative and extended launches.
// Prints one JSON line {"check":"device", ...}; "FAIL ..." and exit 1 on any unexpected error.
#include <cuda_runtime.h>
#include <stdio.h>
#include <string.h>
#include "check.h"

__global__ void square(float *x, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = x[i] * x[i];
}

__global__ void dyn_shared(float *x) {
    extern __shared__ float s[];
    s[threadIdx.x] = x[threadIdx.x];
    __syncthreads();
    x[threadIdx.x] = s[blockDim.x - 1 - threadIdx.x];
}

// Launched cooperatively (cooperative_groups needs CCCL headers the pinned wheels lack).
__global__ void grid_sync(float *x) { x[blockIdx.x * blockDim.x + threadIdx.x] = 1.0f; }

int main(void) {
    int count = 0, drv = 0, rt = 0;
    CHECK(cudaGetDeviceCount(&count));
    CHECK(cudaDriverGetVersion(&drv));
    CHECK(cudaRuntimeGetVersion(&rt));
    EXPECT(count >= 1, "count %d", count);
    int attr_ok = 0, attr_err = 0;
    long long prop_sum = 0;
    for (int d = 0; d < count; d++) {
        CHECK(cudaSetDevice(d));
        cudaDeviceProp p;
        memset(&p, 0, sizeof p);
        CHECK(cudaGetDeviceProperties(&p, d));
        EXPECT(p.name[0] != 0, "empty name");
        EXPECT(p.totalGlobalMem > 0 && p.multiProcessorCount > 0 && p.warpSize == 32, "basic props");
        EXPECT(p.maxThreadsPerBlock >= 1024 && p.maxThreadsDim[0] >= 1024 && p.maxGridSize[0] > 65535,
               "limits %d %d %d", p.maxThreadsPerBlock, p.maxThreadsDim[0], p.maxGridSize[0]);
        EXPECT(p.sharedMemPerBlock >= 48 * 1024 && p.sharedMemPerBlockOptin >= p.sharedMemPerBlock,
               "shared %zu %zu", p.sharedMemPerBlock, p.sharedMemPerBlockOptin);
        EXPECT(p.unifiedAddressing == 1 && p.managedMemory == 1 && p.canMapHostMemory == 1,
               "uva %d managed %d map %d", p.unifiedAddressing, p.managedMemory, p.canMapHostMemory);
        EXPECT(p.concurrentKernels == 1 && p.asyncEngineCount >= 1, "concurrency");
        EXPECT(p.maxTexture1D > 0 && p.maxTexture2D[0] > 0 && p.maxTexture3D[2] > 0 &&
                   p.maxSurface2D[1] > 0 && p.textureAlignment > 0 && p.texturePitchAlignment > 0 &&
                   p.surfaceAlignment > 0,
               "texture limits %d %d %d", p.maxTexture1D, p.maxTexture2D[0], p.maxTexture3D[2]);
        EXPECT(p.l2CacheSize > 0 && p.memoryBusWidth > 0 && p.regsPerBlock > 0 &&
                   p.maxThreadsPerMultiProcessor >= 1024 && p.maxBlocksPerMultiProcessor > 0,
               "sm props");
        EXPECT(p.cooperativeLaunch == 1 && p.streamPrioritiesSupported == 1 && p.memoryPoolsSupported == 1,
               "coop %d prio %d pools %d", p.cooperativeLaunch, p.streamPrioritiesSupported,
               p.memoryPoolsSupported);
        prop_sum += p.major * 10 + p.minor + p.pciBusID + p.pciDomainID + p.pciDeviceID + p.ECCEnabled +
                    p.integrated + p.isMultiGpuBoard + p.hostNativeAtomicSupported + p.pageableMemoryAccess +
                    p.concurrentManagedAccess + p.computePreemptionSupported + p.clusterLaunch +
                    p.ipcEventSupported + p.hostRegisterSupported + p.sparseCudaArraySupported +
                    p.gpuDirectRDMASupported + p.deviceNumaConfig + p.mpsEnabled + p.accessPolicyMaxWindowSize +
                    (long long)p.reservedSharedMemPerBlock + (long long)p.memPitch + (long long)p.totalConstMem;
        for (int a = 1; a <= 150; a++) {
            int v = 0;
            cudaError_t e = cudaDeviceGetAttribute(&v, (cudaDeviceAttr)a, d);
            if (e == cudaSuccess) attr_ok++;
            else { attr_err++; cudaGetLastError(); }
        }
        int v = 0;
        CHECK(cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, d));
        EXPECT(v == p.multiProcessorCount, "attr/prop mismatch %d %d", v, p.multiProcessorCount);
        char bus[32];
        CHECK(cudaDeviceGetPCIBusId(bus, sizeof bus, d));
        int back = -1;
        CHECK(cudaDeviceGetByPCIBusId(&back, bus));
        EXPECT(back == d, "pci bus id %s -> %d", bus, back);
    }
    CHECK(cudaSetDevice(0));
    cudaDeviceProp want;
    memset(&want, 0, sizeof want);
    want.major = 8;
    int chosen = -1;
    CHECK(cudaChooseDevice(&chosen, &want));
    EXPECT(chosen >= 0 && chosen < count, "chosen %d", chosen);

    // Flags, limits and cache configuration.
    CHECK(cudaSetDeviceFlags(cudaDeviceScheduleBlockingSync | cudaDeviceMapHost));
    unsigned flags = 0;
    CHECK(cudaGetDeviceFlags(&flags));
    EXPECT(flags & cudaDeviceScheduleBlockingSync, "device flags %#x", flags);
    size_t lim = 0;
    CHECK(cudaDeviceSetLimit(cudaLimitStackSize, 4096));
    CHECK(cudaDeviceGetLimit(&lim, cudaLimitStackSize));
    EXPECT(lim >= 4096, "stack limit %zu", lim);
    CHECK(cudaDeviceSetLimit(cudaLimitMallocHeapSize, 64 << 20));
    CHECK(cudaDeviceGetLimit(&lim, cudaLimitMallocHeapSize));
    EXPECT(lim >= (64 << 20), "heap limit %zu", lim);
    CHECK(cudaDeviceGetLimit(&lim, cudaLimitPrintfFifoSize));
    CHECK(cudaDeviceSetCacheConfig(cudaFuncCachePreferShared));
    cudaFuncCache cc;
    CHECK(cudaDeviceGetCacheConfig(&cc));
    int lo = 0, hi = 0;
    CHECK(cudaDeviceGetStreamPriorityRange(&lo, &hi));
    EXPECT(hi < lo || (hi == 0 && lo == 0), "priority range %d %d", lo, hi);
    size_t free_b = 0, total_b = 0;
    CHECK(cudaMemGetInfo(&free_b, &total_b));
    EXPECT(free_b > 0 && free_b <= total_b, "meminfo %zu %zu", free_b, total_b);

    // Function attributes and occupancy (simpleOccupancy).
    cudaFuncAttributes fa;
    CHECK(cudaFuncGetAttributes(&fa, square));
    EXPECT(fa.maxThreadsPerBlock > 0 && fa.numRegs >= 0, "func attrs %d", fa.maxThreadsPerBlock);
    CHECK(cudaFuncSetAttribute(dyn_shared, cudaFuncAttributeMaxDynamicSharedMemorySize, 64 * 1024));
    CHECK(cudaFuncSetAttribute(dyn_shared, cudaFuncAttributePreferredSharedMemoryCarveout, 50));
    CHECK(cudaFuncSetCacheConfig(square, cudaFuncCachePreferL1));
    int blocks = 0;
    CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, square, 256, 0));
    EXPECT(blocks > 0, "occupancy %d", blocks);
    int min_grid = 0, block = 0;
    CHECK(cudaOccupancyMaxPotentialBlockSize(&min_grid, &block, square, 0, 0));
    EXPECT(min_grid > 0 && block > 0 && block <= 1024, "potential %d %d", min_grid, block);
    size_t dyn = 0;
    CHECK(cudaOccupancyAvailableDynamicSMemPerBlock(&dyn, dyn_shared, 2, 256));
    EXPECT(dyn > 0, "dynamic smem %zu", dyn);

    // Launches: plain, dynamic shared memory, cooperative, extended with attributes.
    float *x;
    const int n = 1 << 16;
    CHECK(cudaMalloc(&x, n * sizeof(float)));
    square<<<(n + block - 1) / block, block>>>(x, n);
    CHECK(cudaGetLastError());
    dyn_shared<<<1, 256, 256 * sizeof(float)>>>(x);
    CHECK(cudaGetLastError());
    dyn_shared<<<1, 256, 60 * 1024>>>(x);  // above 48 KiB: allowed by the attribute set above
    CHECK(cudaGetLastError());
    int coop_blocks = 0;
    CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&coop_blocks, grid_sync, 128, 0));
    int sms = 0;
    CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    void *args[] = {&x};
    CHECK(cudaLaunchCooperativeKernel((void *)grid_sync, dim3(sms * coop_blocks), dim3(128), args, 0, 0));
    cudaLaunchConfig_t cfg = {};
    cudaLaunchAttribute la[2];
    la[0].id = cudaLaunchAttributeCooperative;
    la[0].val.cooperative = 1;
    la[1].id = cudaLaunchAttributePriority;
    la[1].val.priority = 0;
    cfg.gridDim = dim3(4);
    cfg.blockDim = dim3(128);
    cfg.attrs = la;
    cfg.numAttrs = 2;
    CHECK(cudaLaunchKernelEx(&cfg, grid_sync, x));
    // Errors the runtime must report: too many threads, a bad device.
    square<<<1, 4096>>>(x, n);
    int too_many = (int)cudaGetLastError();
    int bad_dev = (int)cudaSetDevice(count + 3);
    cudaGetLastError();
    CHECK(cudaDeviceSynchronize());
    CHECK(cudaFree(x));
    printf("{\"check\":\"device\",\"count\":%d,\"driver\":%d,\"runtime\":%d,\"attr_ok\":%d,"
           "\"attr_err\":%d,\"prop_sum\":%lld,\"occupancy\":%d,\"block\":%d,\"coop_blocks\":%d,"
           "\"too_many_threads\":%d,\"bad_device\":%d}\n",
           count, drv, rt, attr_ok, attr_err, prop_sum, blocks, block, coop_blocks,
           too_many, bad_dev);
    return 0;
}
