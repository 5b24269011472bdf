/* Driver-API probes for tests/tests/bad_input.rs. dlopens libcuda.so.1 like cudart does and calls the
 * driver directly (cuda.h from the CUDA 13.5 wheel for the types only).
 *
 * usage: driver_api_test export_table   unknown UUID -> CUDA_ERROR_NOT_SUPPORTED + NULL table
 *        driver_api_test bogus_launch   cuLaunchKernel((CUfunction)0x1234) -> an error, no crash
 * Prints "check=value" lines, "FAIL ..." and exit 1 on a failed expectation, "OK" at the end. */
#include <cuda.h>
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "check.h"

typedef CUresult (*init_fn)(unsigned);
typedef CUresult (*get_export_table_fn)(const void **, const CUuuid *);
typedef CUresult (*device_get_fn)(CUdevice *, int);
typedef CUresult (*primary_retain_fn)(CUcontext *, CUdevice);
typedef CUresult (*primary_release_fn)(CUdevice);
typedef CUresult (*ctx_set_current_fn)(CUcontext);
typedef CUresult (*ctx_sync_fn)(void);
typedef CUresult (*mem_alloc_fn)(CUdeviceptr *, size_t);
typedef CUresult (*mem_free_fn)(CUdeviceptr);
typedef CUresult (*launch_fn)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                              unsigned, CUstream, void **, void **);
typedef CUresult (*get_proc_fn)(const char *, void **, int, cuuint64_t, CUdriverProcAddressQueryResult *);

static void *lib;

static void *sym(const char *name) {
    void *p = dlsym(lib, name);
    if (!p) {
        /* Fall back to cuGetProcAddress_v2, the way cudart resolves everything. */
        get_proc_fn gpa = (get_proc_fn)dlsym(lib, "cuGetProcAddress_v2");
        CUdriverProcAddressQueryResult st;
        if (gpa) gpa(name, &p, 12000, 0, &st);
    }
    if (!p) {
        printf("FAIL dlsym %s: not exported\n", name);
        exit(1);
    }
    return p;
}


static int export_table(void) {
    init_fn cu_init = (init_fn)sym("cuInit");
    get_export_table_fn get = (get_export_table_fn)sym("cuGetExportTable");
    CUresult rc = cu_init(0);
    EXPECT(rc == CUDA_SUCCESS, "cuInit = %d", rc);

    /* Positive control: CUDART_INTERFACE (6bd5fb6c-5bf4-e74a-8987-d93912fd9df9) is served. */
    CUuuid known = {{(char)0x6b, (char)0xd5, (char)0xfb, (char)0x6c, (char)0x5b, (char)0xf4, (char)0xe7,
                     (char)0x4a, (char)0x89, (char)0x87, (char)0xd9, (char)0x39, (char)0x12, (char)0xfd,
                     (char)0x9d, (char)0xf9}};
    const void *table = NULL;
    rc = get(&table, &known);
    printf("known_rc=%d\n", rc);
    EXPECT(rc == CUDA_SUCCESS && table != NULL, "CUDART_INTERFACE: rc %d table %p", rc, table);

    /* A made-up UUID. */
    CUuuid bogus = {{'l', 'i', 'b', 's', 'h', 'a', 'r', 'e', '-', 'n', 'o', '-', 's', 'u', 'c', 'h'}};
    table = (const void *)0x1; /* must be overwritten with NULL */
    rc = get(&table, &bogus);
    printf("unknown_rc=%d\nunknown_table=%p\n", rc, table);
    EXPECT(rc == CUDA_ERROR_NOT_SUPPORTED, "unknown UUID: rc %d, expected %d", rc,
           CUDA_ERROR_NOT_SUPPORTED);
    EXPECT(table == NULL, "unknown UUID: table %p, expected NULL", table);

    /* NULL arguments are rejected, not dereferenced. */
    rc = get(NULL, &known);
    printf("null_table_rc=%d\n", rc);
    EXPECT(rc != CUDA_SUCCESS, "cuGetExportTable(NULL, id) succeeded");
    table = NULL;
    rc = get(&table, NULL);
    printf("null_id_rc=%d\n", rc);
    EXPECT(rc != CUDA_SUCCESS, "cuGetExportTable(&t, NULL) succeeded");
    return 0;
}

static int bogus_launch(void) {
    init_fn cu_init = (init_fn)sym("cuInit");
    device_get_fn dev_get = (device_get_fn)sym("cuDeviceGet");
    primary_retain_fn retain = (primary_retain_fn)sym("cuDevicePrimaryCtxRetain");
    primary_release_fn release = (primary_release_fn)sym("cuDevicePrimaryCtxRelease_v2");
    ctx_set_current_fn set_current = (ctx_set_current_fn)sym("cuCtxSetCurrent");
    ctx_sync_fn ctx_sync = (ctx_sync_fn)sym("cuCtxSynchronize");
    mem_alloc_fn mem_alloc = (mem_alloc_fn)sym("cuMemAlloc_v2");
    mem_free_fn mem_free = (mem_free_fn)sym("cuMemFree_v2");
    launch_fn launch = (launch_fn)sym("cuLaunchKernel");

    CUresult rc = cu_init(0);
    EXPECT(rc == CUDA_SUCCESS, "cuInit = %d", rc);
    CUdevice dev;
    rc = dev_get(&dev, 0);
    EXPECT(rc == CUDA_SUCCESS, "cuDeviceGet = %d", rc);
    CUcontext ctx = NULL;
    rc = retain(&ctx, dev);
    EXPECT(rc == CUDA_SUCCESS && ctx != NULL, "cuDevicePrimaryCtxRetain = %d", rc);
    rc = set_current(ctx);
    EXPECT(rc == CUDA_SUCCESS, "cuCtxSetCurrent = %d", rc);

    int arg = 7;
    void *params[] = {&arg};
    rc = launch((CUfunction)0x1234, 1, 1, 1, 32, 1, 1, 0, NULL, params, NULL);
    printf("bogus_launch_rc=%d\n", rc);
    EXPECT(rc != CUDA_SUCCESS, "cuLaunchKernel with a bogus CUfunction succeeded");
    rc = launch((CUfunction)NULL, 1, 1, 1, 32, 1, 1, 0, NULL, params, NULL);
    printf("null_launch_rc=%d\n", rc);
    EXPECT(rc != CUDA_SUCCESS, "cuLaunchKernel with a NULL CUfunction succeeded");

    /* The context is still usable afterwards: the error is not sticky. */
    rc = ctx_sync();
    printf("sync_rc=%d\n", rc);
    EXPECT(rc == CUDA_SUCCESS, "cuCtxSynchronize after a bad launch = %d", rc);
    CUdeviceptr p = 0;
    rc = mem_alloc(&p, 1 << 20);
    EXPECT(rc == CUDA_SUCCESS && p != 0, "cuMemAlloc after a bad launch = %d", rc);
    rc = mem_free(p);
    EXPECT(rc == CUDA_SUCCESS, "cuMemFree = %d", rc);
    rc = release(dev);
    EXPECT(rc == CUDA_SUCCESS, "cuDevicePrimaryCtxRelease = %d", rc);
    return 0;
}

int main(int argc, char **argv) {
    lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        printf("FAIL dlopen libcuda.so.1: %s\n", dlerror());
        return 1;
    }
    const char *mode = argc > 1 ? argv[1] : "";
    int rc;
    if (!strcmp(mode, "export_table")) rc = export_table();
    else if (!strcmp(mode, "bogus_launch")) rc = bogus_launch();
    else {
        fprintf(stderr, "usage: driver_api_test export_table|bogus_launch\n");
        return 2;
    }
    if (rc == 0) printf("OK\n");
    fflush(stdout);
    return rc;
}
