/* JIT linking on simgpu (driver API, linked with -lcuda): two PTX inputs are linked, the image
 * is loaded, both kernels are found, and a launch of `simgpu_spin` takes the duration given by its
 * first (u64) parameter — so the parameter layout survived the link. */
#include <cuda.h>
#include <stdio.h>
#include <string.h>
#include "check.h"

static const char *a = ".version 7.0\n.target sm_80\n.address_size 64\n"
                       ".visible .entry simgpu_spin(.param .u64 ns, .param .u64 buf)\n{\n ret;\n}\n";
static const char *b = ".version 7.0\n.target sm_80\n.address_size 64\n"
                       ".visible .global .align 4 .b8 counter[4];\n"
                       ".visible .entry other(.param .u32 n)\n{\n ret;\n}\n";

int main(void) {
    CUdevice d;
    CUcontext c;
    CUlinkState ls;
    CUmodule m;
    CUfunction spin, other;
    CUevent e0, e1;
    void *image;
    size_t size, gsize;
    CUdeviceptr g;
    CHECK(cuInit(0));
    CHECK(cuDeviceGet(&d, 0));
    CHECK(cuDevicePrimaryCtxRetain(&c, d));
    CHECK(cuCtxSetCurrent(c));
    CHECK(cuLinkCreate(0, NULL, NULL, &ls));
    CHECK(cuLinkAddData(ls, CU_JIT_INPUT_PTX, (void *)a, strlen(a) + 1, "a.ptx", 0, NULL, NULL));
    CHECK(cuLinkAddData(ls, CU_JIT_INPUT_PTX, (void *)b, strlen(b) + 1, "b.ptx", 0, NULL, NULL));
    CHECK(cuLinkComplete(ls, &image, &size));
    CHECK(cuModuleLoadData(&m, image));
    CHECK(cuLinkDestroy(ls));
    CHECK(cuModuleGetFunction(&spin, m, "simgpu_spin"));
    CHECK(cuModuleGetFunction(&other, m, "other"));
    CHECK(cuModuleGetGlobal(&g, &gsize, m, "counter"));
    unsigned long long ns = 5000000, buf = 0;
    void *args[] = {&ns, &buf};
    CHECK(cuEventCreate(&e0, 0));
    CHECK(cuEventCreate(&e1, 0));
    CHECK(cuEventRecord(e0, 0));
    CHECK(cuLaunchKernel(spin, 1, 1, 1, 32, 1, 1, 0, 0, args, NULL));
    CHECK(cuEventRecord(e1, 0));
    CHECK(cuEventSynchronize(e1));
    float ms = 0;
    CHECK(cuEventElapsedTime(&ms, e0, e1));
    printf("{\"check\":\"link\",\"image_bytes\":%zu,\"global_bytes\":%zu,\"spin_ms\":%.3f}\n", size, gsize, ms);
    return 0;
}
