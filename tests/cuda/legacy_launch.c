/* The deprecated launch API on simgpu (tests/tests/sim_features.rs): the CUDA 2.x/3.x
 * execution control (block shape, shared size and parameter buffer set on the function, then
 * cuLaunch / cuLaunchGrid / cuLaunchGridAsync) and cuLaunchCooperativeKernelMultiDevice, with a
 * kernel whose result simgpu produces: cuSOLVER's `set_info_ker(int value, int *info)` writes
 * `value` to `*info` (simgpu/src/driver/results.rs). Prints one JSON line, check "legacy":
 * the values read back and the return codes of the invalid calls. Needs SIMGPU_DEVICES >= 2. */
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
#include <cuda.h>
#include <stdio.h>
#include <string.h>
#include "check.h"

static const char ptx[] = ".version 7.0\n.target sm_80\n.address_size 64\n"
                          ".visible .entry _Z12set_info_keriPi(.param .u32 value, .param .u64 info)\n"
                          "{\n ret;\n}\n";

static CUfunction load_kernel(void) {
    CUmodule mod;
    CHECK(cuModuleLoadData(&mod, ptx));
    CUfunction f;
    CHECK(cuModuleGetFunction(&f, mod, "_Z12set_info_keriPi"));
    return f;
}

/* The legacy parameter buffer of set_info_ker: value at 0, the pointer at 8 (aligned). */
static void set_params(CUfunction f, unsigned value, CUdeviceptr info, unsigned size) {
    CHECK(cuParamSeti(f, 0, value));
    CHECK(cuParamSetv(f, 8, &info, sizeof info));
    CHECK(cuParamSetSize(f, size));
}

static int read_int(CUdeviceptr p) {
    int v = -1;
    CHECK(cuMemcpyDtoH(&v, p, sizeof v));
    return v;
}

int main(void) {
    CHECK(cuInit(0));
    int n = 0;
    CHECK(cuDeviceGetCount(&n));
    EXPECT(n >= 2, "%d devices (set SIMGPU_DEVICES=2)", n);
    CUcontext ctx[2];
    for (int i = 0; i < 2; i++) {
        CUdevice d;
        CHECK(cuDeviceGet(&d, i));
        CHECK(cuDevicePrimaryCtxRetain(&ctx[i], d));
    }
    CHECK(cuCtxSetCurrent(ctx[0]));
    CUfunction f = load_kernel();
    CUdeviceptr d;
    CHECK(cuMemAlloc(&d, 4 * sizeof(int)));
    CHECK(cuMemsetD8(d, 0, 4 * sizeof(int)));
    CUstream s;
    CHECK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));

    CHECK(cuFuncSetBlockShape(f, 32, 2, 1));
    CHECK(cuFuncSetSharedSize(f, 256));
    set_params(f, 0x1234, d, 16);
    CHECK(cuLaunchGrid(f, 4, 3));
    CHECK(cuCtxSynchronize());
    int grid = read_int(d);

    set_params(f, 0x2345, d + 4, 16);
    CHECK(cuLaunch(f));
    CHECK(cuCtxSynchronize());
    int launch = read_int(d + 4);

    set_params(f, 0x3456, d + 8, 16);
    CHECK(cuLaunchGridAsync(f, 1, 1, s));
    CHECK(cuStreamSynchronize(s));
    int grid_async = read_int(d + 8);

    /* A parameter size of 8 leaves the pointer out: the kernel sees NULL and writes nothing. */
    set_params(f, 0x4567, d + 12, 8);
    CHECK(cuLaunchGrid(f, 1, 1));
    CHECK(cuCtxSynchronize());
    int truncated = read_int(d + 12);

    /* Invalid uses. */
    CUfunction fresh;
    {
        CUmodule m2;
        CHECK(cuModuleLoadData(&m2, ptx));
        CHECK(cuModuleGetFunction(&fresh, m2, "_Z12set_info_keriPi"));
    }
    int no_shape = (int)cuLaunchGrid(fresh, 1, 1);
    int zero_grid = (int)cuLaunchGrid(f, 0, 1);
    int bad_shape = (int)cuFuncSetBlockShape(f, -1, 1, 1);
    CUdeviceptr p = d;
    int past_space = (int)cuParamSetv(f, 4092, &p, sizeof p);
    int bad_tex_unit = (int)cuParamSetTexRef(f, 0, NULL);

    /* Multi-device: one entry per device, each on a stream (and function) of its context. */
    CUDA_LAUNCH_PARAMS list[2];
    CUdeviceptr out[2];
    unsigned value[2];
    void *args[2][2];
    for (int i = 0; i < 2; i++) {
        CHECK(cuCtxSetCurrent(ctx[i]));
        CUfunction fi = load_kernel();
        CUstream si;
        CHECK(cuStreamCreate(&si, CU_STREAM_NON_BLOCKING));
        CHECK(cuMemAlloc(&out[i], sizeof(int)));
        CHECK(cuMemsetD8(out[i], 0, sizeof(int)));
        value[i] = 0x100 + i;
        args[i][0] = &value[i];
        args[i][1] = &out[i];
        memset(&list[i], 0, sizeof list[i]);
        list[i].function = fi;
        list[i].gridDimX = list[i].gridDimY = list[i].gridDimZ = 1;
        list[i].blockDimX = 64;
        list[i].blockDimY = list[i].blockDimZ = 1;
        list[i].hStream = si;
        list[i].kernelParams = args[i];
    }
    CHECK(cuCtxSetCurrent(ctx[0]));
    CHECK(cuLaunchCooperativeKernelMultiDevice(list, 2, 0));
    int multi[2];
    for (int i = 0; i < 2; i++) {
        CHECK(cuCtxSetCurrent(ctx[i]));
        CHECK(cuStreamSynchronize(list[i].hStream));
        multi[i] = read_int(out[i]);
    }
    CHECK(cuCtxSetCurrent(ctx[0]));
    CUDA_LAUNCH_PARAMS same[2] = {list[0], list[0]};
    int same_device = (int)cuLaunchCooperativeKernelMultiDevice(same, 2, 0);
    CUDA_LAUNCH_PARAMS null_stream = list[0];
    null_stream.hStream = NULL;
    int multi_null_stream = (int)cuLaunchCooperativeKernelMultiDevice(&null_stream, 1, 0);
    CUDA_LAUNCH_PARAMS other_shape[2] = {list[0], list[1]};
    other_shape[1].blockDimX = 32;
    int multi_mismatch = (int)cuLaunchCooperativeKernelMultiDevice(other_shape, 2, 0);

    printf("{\"check\":\"legacy\",\"grid\":%d,\"launch\":%d,\"grid_async\":%d,\"truncated\":%d,"
           "\"no_shape\":%d,\"zero_grid\":%d,\"bad_shape\":%d,\"past_space\":%d,"
           "\"bad_tex_unit\":%d,\"multi\":[%d,%d],\"same_device\":%d,"
           "\"multi_null_stream\":%d,\"multi_mismatch\":%d}\n",
           grid, launch, grid_async, truncated, no_shape, zero_grid, bad_shape, past_space,
           bad_tex_unit, multi[0], multi[1], same_device, multi_null_stream, multi_mismatch);
    return 0;
}
