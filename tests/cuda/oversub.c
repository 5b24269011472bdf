/* Oversubscription through the shim (tests/tests/shim_oversub.rs): a job that asks for more
 * device memory than the device has, and checks every byte it wrote.
 *
 *   oversub TARGET_MIB   cuMemAlloc (and every fourth one cuMemAllocPitch) in 32 MiB pieces until
 *                        TARGET_MIB or the first error; each piece filled with its own pattern
 *                        (cuMemsetD32) and touched by a kernel (simgpu faults managed memory in,
 *                        evicting older pieces), then every piece's first, middle and last words
 *                        read back. Then the paths that stay device memory: a stream-ordered
 *                        32 MiB allocation, a 32 MiB VMM cuMemCreate, a VMM cuMemCreate larger
 *                        than the device (CUDA_ERROR_OUT_OF_MEMORY expected, never a crash), a
 *                        32 MiB CUDA array, and the IPC export of the first piece (refused by
 *                        the driver for managed memory).
 * Prints one JSON line, check "oversub". */
#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>
#include "check.h"

#define MIB (1024ull * 1024ull)
#define PIECE (32 * MIB)
#define MAX_PIECES 256

static const char ptx[] = ".version 7.0\n.target sm_80\n.address_size 64\n"
                          ".visible .entry touch(.param .u64 p)\n{\n ret;\n}\n";

static int is_managed(CUdeviceptr p) {
    unsigned v = 0;
    CHECK(cuPointerGetAttribute(&v, CU_POINTER_ATTRIBUTE_IS_MANAGED, p));
    return (int)v;
}

static unsigned read_word(CUdeviceptr p) {
    unsigned v = 0;
    CHECK(cuMemcpyDtoH(&v, p, sizeof v));
    return v;
}

int main(int argc, char **argv) {
    EXPECT(argc == 2, "usage: oversub TARGET_MIB");
    unsigned long long target = strtoull(argv[1], NULL, 10) * MIB;
    CHECK(cuInit(0));
    CUdevice dev;
    CHECK(cuDeviceGet(&dev, 0));
    CUcontext ctx;
    CHECK(cuDevicePrimaryCtxRetain(&ctx, dev));
    CHECK(cuCtxSetCurrent(ctx));
    CUmodule mod;
    CHECK(cuModuleLoadData(&mod, ptx));
    CUfunction touch;
    CHECK(cuModuleGetFunction(&touch, mod, "touch"));
    size_t free0, total0;
    CHECK(cuMemGetInfo(&free0, &total0));

    static CUdeviceptr piece[MAX_PIECES];
    int n = 0, managed = 0, alloc_error = 0;
    while ((unsigned long long)n * PIECE < target && n < MAX_PIECES) {
        CUresult r;
        if (n % 4 == 3) {
            size_t pitch = 0; /* 8 MiB wide rows of 4-byte elements, 4 rows */
            r = cuMemAllocPitch(&piece[n], &pitch, 8 * MIB, 4, 4);
            if (r == CUDA_SUCCESS)
                EXPECT(pitch == 8 * MIB, "pitch %zu", pitch);
        } else {
            r = cuMemAlloc(&piece[n], PIECE);
        }
        if (r != CUDA_SUCCESS) {
            alloc_error = (int)r;
            break;
        }
        managed += is_managed(piece[n]);
        CHECK(cuMemsetD32(piece[n], 0x1000u + (unsigned)n, PIECE / 4));
        void *args[] = {&piece[n]};
        CHECK(cuLaunchKernel(touch, 1, 1, 1, 32, 1, 1, 0, NULL, args, NULL));
        n++;
    }
    CHECK(cuCtxSynchronize());
    int bad = 0;
    for (int i = 0; i < n; i++) {
        unsigned want = 0x1000u + (unsigned)i;
        CUdeviceptr at[] = {piece[i], piece[i] + PIECE / 2, piece[i] + PIECE - 4};
        for (int k = 0; k < 3; k++)
            bad += read_word(at[k]) != want;
    }
    size_t free1, total1;
    CHECK(cuMemGetInfo(&free1, &total1));

    /* What stays device memory. */
    CUstream s;
    CHECK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    CUdeviceptr pooled = 0;
    int pool_rc = (int)cuMemAllocAsync(&pooled, PIECE, s);
    int pool_managed = pool_rc == 0 ? is_managed(pooled) : -1;
    if (pool_rc == 0) {
        CHECK(cuMemFreeAsync(pooled, s));
        CHECK(cuStreamSynchronize(s));
    }
    CUmemAllocationProp prop = {0};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = dev;
    CUmemGenericAllocationHandle h;
    int vmm_rc = (int)cuMemCreate(&h, PIECE, &prop, 0);
    if (vmm_rc == 0)
        CHECK(cuMemRelease(h));
    size_t device_total = 0;
    CHECK(cuDeviceTotalMem(&device_total, dev));
    int vmm_big_rc = (int)cuMemCreate(&h, 4 * total0 > device_total ? 4 * total0 : device_total * 4, &prop, 0);
    if (vmm_big_rc == 0)
        CHECK(cuMemRelease(h));

    /* A CUDA array stays device memory; IPC export of what cuMemAlloc returned is refused by
     * the driver when that is managed memory (an error code, never a crash). */
    CUDA_ARRAY_DESCRIPTOR ad = {.Width = 4096, .Height = 2048, .Format = CU_AD_FORMAT_FLOAT, .NumChannels = 1};
    CUarray arr;
    int array_rc = (int)cuArrayCreate(&arr, &ad);
    if (array_rc == 0)
        CHECK(cuArrayDestroy(arr));
    CUipcMemHandle ipc;
    int ipc_rc = n > 0 ? (int)cuIpcGetMemHandle(&ipc, piece[0]) : -1;
    for (int i = 0; i < n; i++)
        CHECK(cuMemFree(piece[i]));
    size_t free2, total2;
    CHECK(cuMemGetInfo(&free2, &total2));
    printf("{\"check\":\"oversub\",\"allocated_mib\":%llu,\"alloc_error\":%d,\"managed\":%d,"
           "\"pieces\":%d,\"bad_words\":%d,\"total_mib\":%zu,\"free_mib\":[%zu,%zu,%zu],"
           "\"pool_rc\":%d,\"pool_managed\":%d,\"vmm_rc\":%d,\"vmm_big_rc\":%d,\"array_rc\":%d,"
           "\"ipc_rc\":%d}\n",
           (unsigned long long)n * PIECE / MIB, alloc_error, managed, n, bad, (size_t)(total0 / MIB),
           (size_t)(free0 / MIB), (size_t)(free1 / MIB), (size_t)(free2 / MIB), pool_rc, pool_managed, vmm_rc, vmm_big_rc,
           array_rc, ipc_rc);
    return 0;
}
