/* Driver-API probes for tests/tests/sim_bad_input.rs. dlopens libcuda.so.1 like cudart does and calls the
 * driver directly (cuda.h from the CUDA 13.5 wheel for the types only).
 *
 * usage: driver_api_test export_table   unknown UUID -> CUDA_ERROR_NOT_SUPPORTED + NULL table
 *        driver_api_test bogus_launch   cuLaunchKernel((CUfunction)0x1234) -> an error, no crash
 *        driver_api_test tools_module   the ToolsModule export table (6e163fbe-...) cuFFT uses: slot 7
 *                                       visits every function of a module; unknown slots are errors
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
typedef CUresult (*module_load_data_fn)(CUmodule *, const void *);
typedef CUresult (*module_get_function_fn)(CUfunction *, CUmodule, const char *);
typedef CUresult (*module_unload_fn)(CUmodule);
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

static const char *two_kernels = ".version 7.0\n.target sm_80\n.address_size 64\n"
                                 ".visible .entry first(.param .u64 p)\n{\n ret;\n}\n"
                                 ".visible .entry second(.param .u32 n)\n{\n ret;\n}\n";

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

    /* A real kernel with launch dimensions past the device's limits: CUDA_ERROR_INVALID_VALUE. */
    module_load_data_fn load = (module_load_data_fn)sym("cuModuleLoadData");
    module_get_function_fn get_function = (module_get_function_fn)sym("cuModuleGetFunction");
    CUmodule mod;
    EXPECT(load(&mod, two_kernels) == CUDA_SUCCESS, "cuModuleLoadData");
    CUfunction f;
    EXPECT(get_function(&f, mod, "second") == CUDA_SUCCESS, "cuModuleGetFunction");
    static const unsigned dims[][6] = {
        {1, 65536, 1, 32, 1, 1}, /* grid y past 65535 */
        {1, 1, 65536, 32, 1, 1}, /* grid z past 65535 */
        {0, 1, 1, 32, 1, 1},     /* an empty grid */
        {1, 1, 1, 2048, 1, 1},   /* more than 1024 threads */
        {1, 1, 1, 1, 1, 65},     /* block z past 64 */
        {1, 1, 1, 32, 32, 2},    /* 2048 threads in three dimensions */
    };
    int bad_dims_refused = 0;
    for (unsigned i = 0; i < sizeof dims / sizeof dims[0]; i++) {
        const unsigned *d = dims[i];
        rc = launch(f, d[0], d[1], d[2], d[3], d[4], d[5], 0, NULL, params, NULL);
        EXPECT(rc == CUDA_ERROR_INVALID_VALUE, "launch dims #%u returned %d", i, rc);
        bad_dims_refused++;
    }
    printf("bad_dims_refused=%d\n", bad_dims_refused);
    /* At the limits (kept short: a kernel's modelled time grows with its blocks). */
    rc = launch(f, 1, 65535, 1, 1, 1, 64, 0, NULL, params, NULL);
    EXPECT(rc == CUDA_SUCCESS, "launch with grid y 65535, block z 64 returned %d", rc);
    rc = launch(f, 1, 1, 65535, 1024, 1, 1, 0, NULL, params, NULL);
    EXPECT(rc == CUDA_SUCCESS, "launch with grid z 65535, 1024 threads returned %d", rc);

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

/* ToolsModule slot 7: (ctx, module, visitor, opaque) -> number of functions visited. */
typedef void (*visitor_fn)(void *opaque, CUfunction f);
typedef size_t (*module_functions_fn)(CUcontext, CUmodule, visitor_fn, void *);
typedef size_t (*any_slot_fn)(size_t, size_t, size_t, size_t);

struct visited {
    CUfunction f[8];
    int n;
};

static void visit(void *opaque, CUfunction f) {
    struct visited *v = (struct visited *)opaque;
    if (v->n < 8) v->f[v->n] = f;
    v->n++;
}

static int tools_module(void) {
    init_fn cu_init = (init_fn)sym("cuInit");
    get_export_table_fn get = (get_export_table_fn)sym("cuGetExportTable");
    device_get_fn dev_get = (device_get_fn)sym("cuDeviceGet");
    primary_retain_fn retain = (primary_retain_fn)sym("cuDevicePrimaryCtxRetain");
    ctx_set_current_fn set_current = (ctx_set_current_fn)sym("cuCtxSetCurrent");
    module_load_data_fn load = (module_load_data_fn)sym("cuModuleLoadData");
    module_get_function_fn get_function = (module_get_function_fn)sym("cuModuleGetFunction");
    module_unload_fn unload = (module_unload_fn)sym("cuModuleUnload");

    CUresult rc = cu_init(0);
    EXPECT(rc == CUDA_SUCCESS, "cuInit = %d", rc);
    CUdevice dev;
    EXPECT(dev_get(&dev, 0) == CUDA_SUCCESS, "cuDeviceGet");
    CUcontext ctx = NULL;
    EXPECT(retain(&ctx, dev) == CUDA_SUCCESS, "cuDevicePrimaryCtxRetain");
    EXPECT(set_current(ctx) == CUDA_SUCCESS, "cuCtxSetCurrent");

    CUuuid id = {{(char)0x6e, (char)0x16, (char)0x3f, (char)0xbe, (char)0xb9, (char)0x58, (char)0x44,
                  (char)0x4d, (char)0x83, (char)0x5c, (char)0xe1, (char)0x82, (char)0xaf, (char)0xf1,
                  (char)0x99, (char)0x1e}};
    const void *const *table = NULL;
    rc = get((const void **)&table, &id);
    EXPECT(rc == CUDA_SUCCESS && table != NULL, "ToolsModule: rc %d table %p", rc, (void *)table);
    size_t size = (size_t)table[0];
    printf("table_bytes=%zu\n", size);
    /* cuFFT checks that the size covers slot 7. */
    EXPECT(size >= 8 * sizeof(void *), "table of %zu bytes has no slot 7", size);
    module_functions_fn functions = (module_functions_fn)table[7];

    CUmodule m = NULL;
    rc = load(&m, two_kernels);
    EXPECT(rc == CUDA_SUCCESS, "cuModuleLoadData = %d", rc);
    CUfunction first = NULL, second = NULL;
    EXPECT(get_function(&first, m, "first") == CUDA_SUCCESS, "cuModuleGetFunction(first)");

    struct visited v = {{0}, 0};
    size_t n = functions(ctx, m, visit, &v);
    printf("visited=%zu\ncallbacks=%d\n", n, v.n);
    EXPECT(n == 2 && v.n == 2, "visited %zu functions with %d callbacks, expected 2", n, v.n);
    EXPECT(get_function(&second, m, "second") == CUDA_SUCCESS, "cuModuleGetFunction(second)");
    /* The same handles as cuModuleGetFunction, in image order, whether or not asked for first. */
    EXPECT(v.f[0] == first && v.f[1] == second, "visited %p %p, cuModuleGetFunction gives %p %p",
           (void *)v.f[0], (void *)v.f[1], (void *)first, (void *)second);

    /* A NULL context means the current one. */
    v.n = 0;
    n = functions(NULL, m, visit, &v);
    EXPECT(n == 2 && v.n == 2 && v.f[0] == first, "NULL ctx: visited %zu", n);

    /* An unknown module: nothing visited, count 0 (cuFFT turns that into its own error). */
    v.n = 0;
    n = functions(ctx, (CUmodule)0x1234, visit, &v);
    printf("bogus_module_visited=%zu\n", n);
    EXPECT(n == 0 && v.n == 0, "bogus module: visited %zu", n);
    EXPECT(unload(m) == CUDA_SUCCESS, "cuModuleUnload");
    v.n = 0;
    n = functions(ctx, m, visit, &v);
    EXPECT(n == 0 && v.n == 0, "unloaded module: visited %zu", n);

    /* Slot 1 has no known meaning: it is a logging stub that reports an error. */
    size_t r = ((any_slot_fn)table[1])(1, 2, 3, 4);
    printf("unknown_slot_rc=%zu\n", r);
    EXPECT(r == CUDA_ERROR_NOT_SUPPORTED, "unknown slot returned %zu", r);
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
    else if (!strcmp(mode, "tools_module")) rc = tools_module();
    else {
        fprintf(stderr, "usage: driver_api_test export_table|bogus_launch|tools_module\n");
        return 2;
    }
    if (rc == 0) printf("OK\n");
    fflush(stdout);
    return rc;
}
