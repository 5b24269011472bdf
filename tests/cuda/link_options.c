/* cuLinkCreate's output options (issue 19), as NVIDIA's ptxjit sample reads them: the wall time
 * (a float written into its option-value slot), the info and error logs (NUL-terminated, the
 * *_SIZE_BYTES slots overwritten with the bytes written); a bad input fills the error logs of the
 * call and of the link. Prints one JSON line {"check":"link_options", ...}. */
#include <cuda.h>
#include <stdio.h>
#include <string.h>
#include "check.h"

static const char *ptx = ".version 7.0\n.target sm_80\n.address_size 64\n"
                         ".visible .entry simgpu_spin(.param .u64 ns, .param .u64 buf)\n{\n ret;\n}\n";
static const char junk[] = "this is not an image";

int main(void) {
    CUdevice d;
    CUcontext c;
    CUlinkState ls, bad;
    CHECK(cuInit(0));
    CHECK(cuDeviceGet(&d, 0));
    CHECK(cuDevicePrimaryCtxRetain(&c, d));
    CHECK(cuCtxSetCurrent(c));
    static char info[1024], error[1024], bad_error[1024], input_error[1024];
    memset(info, 'X', sizeof info);
    memset(error, 'X', sizeof error);
    float sentinel = -1.0f;
    CUjit_option o[6] = {CU_JIT_WALL_TIME, CU_JIT_INFO_LOG_BUFFER, CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES,
                         CU_JIT_ERROR_LOG_BUFFER, CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES, CU_JIT_LOG_VERBOSE};
    void *v[6];
    memcpy(&v[0], &sentinel, sizeof sentinel);
    v[1] = info;
    v[2] = (void *)(size_t)sizeof info;
    v[3] = error;
    v[4] = (void *)(size_t)sizeof error;
    v[5] = (void *)1;
    CHECK(cuLinkCreate(6, o, v, &ls));
    CHECK(cuLinkAddData(ls, CU_JIT_INPUT_PTX, (void *)ptx, strlen(ptx) + 1, "spin.ptx", 0, NULL, NULL));
    void *image;
    size_t size;
    CHECK(cuLinkComplete(ls, &image, &size));
    float wall = *(float *)&v[0];
    size_t info_size = (size_t)v[2], error_size = (size_t)v[4];
    int info_ok = info_size > 1 && info_size <= sizeof info && info[info_size - 1] == 0 &&
                  strlen(info) + 1 == info_size && !strncmp(info, "info", 4);
    int error_empty = error[0] == 0 && error_size == 0;
    CHECK(cuLinkDestroy(ls));

    /* A bad input: the call's own error log (8 bytes: capped, NUL-terminated) and the link's. */
    memset(bad_error, 'X', sizeof bad_error);
    memset(input_error, 'X', sizeof input_error);
    CUjit_option bo[2] = {CU_JIT_ERROR_LOG_BUFFER, CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES};
    void *bv[2] = {bad_error, (void *)(size_t)sizeof bad_error};
    CHECK(cuLinkCreate(2, bo, bv, &bad));
    void *iv[2] = {input_error, (void *)(size_t)8};
    CUresult r = cuLinkAddData(bad, CU_JIT_INPUT_PTX, (void *)junk, sizeof junk, "junk.ptx", 2, bo, iv);
    size_t bad_size = (size_t)bv[1], input_size = (size_t)iv[1];
    int bad_ok = bad_size > 1 && bad_error[bad_size - 1] == 0 && strstr(bad_error, "junk.ptx") != NULL;
    int input_capped = input_size == 8 && input_error[7] == 0 && strlen(input_error) == 7;
    CHECK(cuLinkDestroy(bad));

    /* cuModuleLoadDataEx takes the same options. */
    CUjit_option mo[1] = {CU_JIT_WALL_TIME};
    void *mv[1];
    memcpy(&mv[0], &sentinel, sizeof sentinel);
    CUmodule m;
    CHECK(cuModuleLoadDataEx(&m, ptx, 1, mo, mv));
    float load_wall = *(float *)&mv[0];
    CHECK(cuModuleUnload(m));
    printf("{\"check\":\"link_options\",\"wall_ms\":%.6f,\"info_size\":%zu,\"info_ok\":%d,"
           "\"error_empty\":%d,\"bad_input\":%d,\"bad_log_ok\":%d,\"input_log_capped\":%d,"
           "\"load_wall_ms\":%.6f}\n",
           wall, info_size, info_ok, error_empty, (int)r, bad_ok, input_capped, load_wall);
    return 0;
}
