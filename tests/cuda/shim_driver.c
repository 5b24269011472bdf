/* Driver-API probes for the shim tests (tests/tests/shim_*.rs). Compiled twice by the harness:
 * `shim_driver` dlopens libcuda.so.1 like cudart does; `shim_driver_linked` (-DSHIM_LINKED -lcuda)
 * also calls the exported symbols directly.
 *
 * usage: shim_driver quota <export|dlsym|gpa|gpa_v2|gpa_v2_ptds>
 *            600 MiB, 600 MiB (expected over a 1 GiB quota), 300 MiB, with every entry point
 *            obtained through the named resolution path; prints what it saw.
 *        shim_driver hold <MiB>        allocate, print "held", wait for stdin to close, free
 *        shim_driver try <MiB>...      allocate each size in turn (kept), print each result
 *        shim_driver fork              fork after cuInit with 100 MiB held in the parent (see below)
 *        shim_driver ignore_init       carry on after a failed cuInit: allocation must still fail
 *        shim_driver paths             every allocation and launch path once (counters test)
 *        shim_driver arrays            CUDA arrays under a 64 MiB quota (charged, refused, returned)
 *        shim_driver graph_mem         CUDA-graph memory under a 64 MiB quota (held while a graph exists)
 *        shim_driver async_window      a stream-ordered free returns the quota when the stream reaches it
 *        shim_driver pool_retention    what a memory pool keeps stays charged; at the quota it is trimmed
 * Prints "key=value" lines; "FAIL ..." and exit 1 on an unexpected result; "OK" at the end. */
#define _GNU_SOURCE
#include <cuda.h>
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include "check.h"

#define MIB (1024ull * 1024ull)



typedef CUresult (*get_proc_v1_fn)(const char *, void **, int, cuuint64_t);
typedef CUresult (*get_proc_v2_fn)(const char *, void **, int, cuuint64_t,
                                   CUdriverProcAddressQueryResult *);

/* The entry points a probe uses, however they were obtained. */
static struct {
    CUresult (*init)(unsigned);
    CUresult (*device_get)(CUdevice *, int);
    CUresult (*primary_retain)(CUcontext *, CUdevice);
    CUresult (*ctx_set_current)(CUcontext);
    CUresult (*mem_alloc)(CUdeviceptr *, size_t);
    CUresult (*mem_alloc_2)(CUdeviceptr *, size_t); /* a second lookup, used for the 2nd alloc */
    CUresult (*mem_free)(CUdeviceptr);
    CUresult (*mem_get_info)(size_t *, size_t *);
    CUresult (*mem_alloc_async)(CUdeviceptr *, size_t, CUstream);
    CUresult (*mem_free_async)(CUdeviceptr, CUstream);
    CUresult (*ctx_synchronize)(void);
} api;

static void *lib;
static get_proc_v1_fn gpa1; /* what cuGetProcAddress returned for "cuGetProcAddress" */
static get_proc_v2_fn gpa2;
static cuuint64_t gpa_flags;

static void *dl(const char *name) {
    void *p = dlsym(lib, name);
    EXPECT(p != NULL, "dlsym(libcuda, %s) = NULL", name);
    return p;
}

static void *get(const char *name, int version) {
    void *p = NULL;
    if (gpa1) {
        CUresult rc = gpa1(name, &p, version, gpa_flags);
        EXPECT(rc == CUDA_SUCCESS && p, "cuGetProcAddress(%s, %d) = %d", name, version, (int)rc);
    } else if (gpa2) {
        CUdriverProcAddressQueryResult st = -1;
        CUresult rc = gpa2(name, &p, version, gpa_flags, &st);
        EXPECT(rc == CUDA_SUCCESS && p && st == CU_GET_PROC_ADDRESS_SUCCESS,
               "cuGetProcAddress_v2(%s, %d) = %d, status %d", name, version, (int)rc, (int)st);
    } else {
        p = dl(name);
    }
    return p;
}

/* Whether `p` lies in libshare.so (the shim). */
static int in_shim(void *p) {
    Dl_info info;
    if (!p || !dladdr(p, &info) || !info.dli_fname) return 0;
    return strstr(info.dli_fname, "libshare") != NULL;
}

static void open_driver(void) {
    lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    EXPECT(lib != NULL, "dlopen libcuda.so.1: %s", dlerror());
}

static void resolve_all(void) {
    api.init = get("cuInit", 2000);
    api.device_get = get("cuDeviceGet", 2000);
    api.primary_retain = get("cuDevicePrimaryCtxRetain", 7000);
    api.ctx_set_current = get("cuCtxSetCurrent", 4000);
    if (gpa1 || gpa2) {
        api.mem_alloc = get("cuMemAlloc", 3020);
        api.mem_alloc_2 = get("cuMemAlloc", gpa1 ? 11030 : 12000);
        api.mem_free = get("cuMemFree", 3020);
        api.mem_get_info = get("cuMemGetInfo", 3020);
        api.ctx_synchronize = get("cuCtxSynchronize", 2000);
    } else {
        api.mem_alloc = api.mem_alloc_2 = get("cuMemAlloc_v2", 0);
        api.mem_free = get("cuMemFree_v2", 0);
        api.mem_get_info = get("cuMemGetInfo_v2", 0);
        api.ctx_synchronize = get("cuCtxSynchronize", 0);
    }
}

#ifdef SHIM_LINKED
/* Direct calls of the exported symbols (cuda.h maps cuMemAlloc to cuMemAlloc_v2 etc.). */
static CUresult d_init(unsigned f) { return cuInit(f); }
static CUresult d_device_get(CUdevice *d, int i) { return cuDeviceGet(d, i); }
static CUresult d_primary_retain(CUcontext *c, CUdevice d) { return cuDevicePrimaryCtxRetain(c, d); }
static CUresult d_ctx_set_current(CUcontext c) { return cuCtxSetCurrent(c); }
static CUresult d_mem_alloc(CUdeviceptr *p, size_t n) { return cuMemAlloc(p, n); }
static CUresult d_mem_free(CUdeviceptr p) { return cuMemFree(p); }
static CUresult d_mem_get_info(size_t *f, size_t *t) { return cuMemGetInfo(f, t); }
static CUresult d_ctx_synchronize(void) { return cuCtxSynchronize(); }

static void resolve_exported(void) {
    api.init = d_init;
    api.device_get = d_device_get;
    api.primary_retain = d_primary_retain;
    api.ctx_set_current = d_ctx_set_current;
    api.mem_alloc = api.mem_alloc_2 = d_mem_alloc;
    api.mem_free = d_mem_free;
    api.mem_get_info = d_mem_get_info;
    api.ctx_synchronize = d_ctx_synchronize;
}
#endif

/* Chooses how every entry point is obtained. */
static void resolver(const char *how) {
    if (!strcmp(how, "export")) {
#ifdef SHIM_LINKED
        resolve_exported();
        printf("path=export\n");
        return;
#else
        EXPECT(0, "the export path needs the -DSHIM_LINKED build");
#endif
    }
    open_driver();
    if (!strcmp(how, "dlsym")) {
        printf("path=dlsym\nalloc_in_shim=%d\n", in_shim(dl("cuMemAlloc_v2")));
    } else if (!strcmp(how, "gpa")) {
        /* cuGetProcAddress (v1), as CUDA 11.3-11.8 runtimes use it: first ask it for itself. */
        get_proc_v1_fn first = (get_proc_v1_fn)dl("cuGetProcAddress");
        void *self = NULL;
        CHECK(first("cuGetProcAddress", &self, 11030, 0));
        printf("path=gpa\ngpa_self_in_shim=%d\n", in_shim(self));
        gpa1 = (get_proc_v1_fn)self;
    } else if (!strcmp(how, "gpa_v2") || !strcmp(how, "gpa_v2_ptds")) {
        get_proc_v2_fn first = (get_proc_v2_fn)dl("cuGetProcAddress_v2");
        void *self = NULL;
        CUdriverProcAddressQueryResult st = -1;
        CHECK(first("cuGetProcAddress", &self, 12000, 0, &st));
        EXPECT(st == CU_GET_PROC_ADDRESS_SUCCESS, "status %d", (int)st);
        printf("path=%s\ngpa_self_in_shim=%d\n", how, in_shim(self));
        gpa2 = (get_proc_v2_fn)self;
        if (!strcmp(how, "gpa_v2_ptds")) gpa_flags = CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM;
    } else {
        EXPECT(0, "unknown resolution path %s", how);
    }
    resolve_all();
    printf("mem_alloc_in_shim=%d\n", in_shim((void *)api.mem_alloc));
    if (gpa_flags) {
        /* With the per-thread flag, the allocations go through cuMemAllocAsync -> _ptsz. */
        api.mem_alloc_async = get("cuMemAllocAsync", 11020);
        api.mem_free_async = get("cuMemFreeAsync", 11020);
        Dl_info info;
        printf("alloc_async_symbol=%s\n",
               dladdr((void *)api.mem_alloc_async, &info) && info.dli_sname ? info.dli_sname : "?");
    }
}

static CUcontext setup(void) {
    CHECK(api.init(0));
    CUdevice dev;
    CHECK(api.device_get(&dev, 0));
    CUcontext ctx;
    CHECK(api.primary_retain(&ctx, dev));
    CHECK(api.ctx_set_current(ctx));
    return ctx;
}

static size_t free_now(void) {
    size_t f = 0, t = 0;
    CHECK(api.mem_get_info(&f, &t));
    return f;
}

static CUresult alloc(CUdeviceptr *p, size_t n, int second) {
    if (api.mem_alloc_async) {
        CUresult rc = api.mem_alloc_async(p, n, 0);
        if (rc == CUDA_SUCCESS) CHECK(api.ctx_synchronize());
        return rc;
    }
    return second ? api.mem_alloc_2(p, n) : api.mem_alloc(p, n);
}

static void release(CUdeviceptr p) {
    if (api.mem_free_async) {
        CHECK(api.mem_free_async(p, 0));
        CHECK(api.ctx_synchronize());
    } else {
        CHECK(api.mem_free(p));
    }
}

static int quota(const char *how) {
    resolver(how);
    setup();
    size_t f0 = 0, t0 = 0;
    CHECK(api.mem_get_info(&f0, &t0));
    printf("total=%zu\nfree_start=%zu\n", t0, f0);
    CUdeviceptr a = 0, b = 0, c = 0;
    CUresult rc = alloc(&a, 600 * MIB, 0);
    printf("alloc_600_rc=%d\nfree_after_600=%zu\n", (int)rc, free_now());
    rc = alloc(&b, 600 * MIB, 1);
    printf("alloc_600_again_rc=%d\n", (int)rc);
    if (rc == CUDA_SUCCESS) release(b);
    rc = alloc(&c, 300 * MIB, 0);
    printf("alloc_300_rc=%d\nfree_after_900=%zu\n", (int)rc, free_now());
    if (a) release(a);
    if (c) release(c);
    printf("free_end=%zu\n", free_now());
    printf("OK\n");
    return 0;
}

static int hold(size_t mib) {
    resolver("dlsym");
    setup();
    CUdeviceptr p = 0;
    CUresult rc = api.mem_alloc(&p, mib * MIB);
    printf("hold_rc=%d\nfree=%zu\nheld\n", (int)rc, free_now());
    fflush(stdout);
    char buf[64];
    while (fread(buf, 1, sizeof buf, stdin) > 0) {
    }
    if (rc == CUDA_SUCCESS) CHECK(api.mem_free(p));
    printf("free_end=%zu\nOK\n", free_now());
    return 0;
}

static int try_sizes(int n, char **sizes) {
    resolver("dlsym");
    setup();
    printf("free_start=%zu\n", free_now());
    for (int i = 0; i < n; i++) {
        CUdeviceptr p = 0;
        CUresult rc = api.mem_alloc(&p, strtoull(sizes[i], NULL, 0) * MIB);
        printf("alloc_%s_rc=%d\n", sizes[i], (int)rc);
    }
    printf("free_end=%zu\nOK\n", free_now());
    return 0;
}

/* Parent: cuInit, 100 MiB; fork. Child: a call with the parent's context fails; cuInit again,
 * 300 MiB, sees 400 MiB charged; _exit(0). Parent: prints "child_exited" and waits for stdin to
 * close (the test inspects the state file), then checks it is charged only its own 100 MiB. */
static int fork_test(void) {
    setvbuf(stdout, NULL, _IONBF, 0);
    resolver("dlsym");
    setup();
    size_t total = 0, f0 = 0;
    CHECK(api.mem_get_info(&f0, &total));
    CUdeviceptr parent_mem = 0;
    CHECK(api.mem_alloc(&parent_mem, 100 * MIB));
    size_t f1 = free_now();
    printf("parent_pid=%d\ntotal=%zu\nparent_free_after_100=%zu\n", (int)getpid(), total, f1);
    pid_t pid = fork();
    EXPECT(pid >= 0, "fork failed");
    if (pid == 0) {
        CUdeviceptr p = 0;
        CUresult rc = api.mem_alloc(&p, 300 * MIB);
        printf("child_pid=%d\nchild_first_alloc_rc=%d\n", (int)getpid(), (int)rc);
        if (rc == CUDA_SUCCESS) _exit(3); /* the parent's context must not work in the child */
        rc = api.init(0);
        printf("child_init_rc=%d\n", (int)rc);
        if (rc != CUDA_SUCCESS) _exit(4);
        CUdevice dev;
        CUcontext ctx;
        if (api.device_get(&dev, 0) || api.primary_retain(&ctx, dev) || api.ctx_set_current(ctx))
            _exit(5);
        size_t cf0 = 0, ct = 0;
        if (api.mem_get_info(&cf0, &ct)) _exit(6);
        printf("child_free_start=%zu\n", cf0);
        /* The parent's allocation is not the child's to free. */
        rc = api.mem_free(parent_mem);
        printf("child_free_parent_rc=%d\n", (int)rc);
        rc = api.mem_alloc(&p, 300 * MIB);
        printf("child_alloc_300_rc=%d\n", (int)rc);
        size_t cf1 = 0;
        if (api.mem_get_info(&cf1, &ct)) _exit(7);
        printf("child_free_after_300=%zu\n", cf1);
        _exit(0);
    }
    int status = 0;
    EXPECT(waitpid(pid, &status, 0) == pid, "waitpid");
    printf("child_status=%d\n", WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status));
    printf("child_exited\n");
    char buf[64];
    while (fread(buf, 1, sizeof buf, stdin) > 0) {
    }
    /* 900 MiB fits only once the dead child's 300 MiB are returned to the quota. */
    CUdeviceptr big = 0;
    CUresult rc = api.mem_alloc(&big, 900 * MIB);
    printf("parent_alloc_900_rc=%d\nparent_free_with_1000=%zu\n", (int)rc, free_now());
    if (rc == CUDA_SUCCESS) CHECK(api.mem_free(big));
    printf("parent_free_with_100=%zu\n", free_now());
    CHECK(api.mem_free(parent_mem));
    printf("parent_free_end=%zu\nOK\n", free_now());
    return 0;
}

static int ignore_init(void) {
    resolver("dlsym");
    CUresult rc = api.init(0);
    printf("init_rc=%d\n", (int)rc);
    CUdevice dev = 0;
    CUcontext ctx = NULL;
    rc = api.device_get(&dev, 0);
    printf("device_get_rc=%d\n", (int)rc);
    rc = api.primary_retain(&ctx, dev);
    printf("primary_retain_rc=%d\n", (int)rc);
    if (rc == CUDA_SUCCESS) rc = api.ctx_set_current(ctx);
    printf("ctx_rc=%d\n", (int)rc);
    CUdeviceptr p = 0;
    rc = api.mem_alloc(&p, 1 * MIB);
    printf("alloc_rc=%d\n", (int)rc);
    printf("OK\n");
    return 0;
}

/* A kernel simgpu can load from PTX text. */
static const char ptx[] = ".version 7.0\n.target sm_80\n.address_size 64\n"
                          ".visible .entry probe_kernel(.param .u64 out)\n{\n ret;\n}\n";

static int paths(void) {
    resolver("dlsym");
    CUcontext ctx = setup();
    (void)ctx;
    CUdevice dev = 0;
    CUresult (*alloc_pitch)(CUdeviceptr *, size_t *, size_t, size_t, unsigned) =
        dl("cuMemAllocPitch_v2");
    CUresult (*alloc_managed)(CUdeviceptr *, size_t, unsigned) = dl("cuMemAllocManaged");
    CUresult (*alloc_async)(CUdeviceptr *, size_t, CUstream) = dl("cuMemAllocAsync");
    CUresult (*alloc_pool)(CUdeviceptr *, size_t, CUmemoryPool, CUstream) =
        dl("cuMemAllocFromPoolAsync");
    CUresult (*free_async)(CUdeviceptr, CUstream) = dl("cuMemFreeAsync");
    CUresult (*default_pool)(CUmemoryPool *, CUdevice) = dl("cuDeviceGetDefaultMemPool");
    CUresult (*trim)(CUmemoryPool, size_t) = dl("cuMemPoolTrimTo");
    CUresult (*granularity)(size_t *, const CUmemAllocationProp *, CUmemAllocationGranularity_flags) =
        dl("cuMemGetAllocationGranularity");
    CUresult (*create)(CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *,
                       unsigned long long) = dl("cuMemCreate");
    CUresult (*mrelease)(CUmemGenericAllocationHandle) = dl("cuMemRelease");
    CUresult (*module_load)(CUmodule *, const void *) = dl("cuModuleLoadData");
    CUresult (*get_function)(CUfunction *, CUmodule, const char *) = dl("cuModuleGetFunction");
    CUresult (*launch)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                       unsigned, CUstream, void **, void **) = dl("cuLaunchKernel");
    CUresult (*launch_ptsz)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                            unsigned, CUstream, void **, void **) = dl("cuLaunchKernel_ptsz");
    CUresult (*launch_ex)(const CUlaunchConfig *, CUfunction, void **, void **) =
        dl("cuLaunchKernelEx");
    CUresult (*launch_coop)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                            unsigned, CUstream, void **) = dl("cuLaunchCooperativeKernel");
    CUresult (*stream_create)(CUstream *, unsigned) = dl("cuStreamCreate");
    CUresult (*begin_capture)(CUstream, CUstreamCaptureMode) = dl("cuStreamBeginCapture_v2");
    CUresult (*end_capture)(CUstream, CUgraph *) = dl("cuStreamEndCapture");
    CUresult (*instantiate)(CUgraphExec *, CUgraph, unsigned long long) =
        dl("cuGraphInstantiateWithFlags");
    CUresult (*graph_launch)(CUgraphExec, CUstream) = dl("cuGraphLaunch");
    CUresult (*stream_sync)(CUstream) = dl("cuStreamSynchronize");

    size_t total = 0, f0 = 0;
    CHECK(api.mem_get_info(&f0, &total));
    int allocs = 0;
    CUdeviceptr p = 0;
    size_t pitch = 0;

    CHECK(api.mem_alloc(&p, 3 * MIB + 5)); allocs++;
    CHECK(api.mem_free(p));
    CHECK(alloc_pitch(&p, &pitch, 1000, 1000, 4)); allocs++;
    printf("pitch=%zu\nfree_with_pitch=%zu\n", pitch, free_now());
    EXPECT(free_now() == f0 - pitch * 1000, "pitch allocation charged %zu, expected %zu",
           f0 - free_now(), pitch * 1000);
    CHECK(api.mem_free(p));
    CHECK(alloc_managed(&p, 5 * MIB, CU_MEM_ATTACH_GLOBAL)); allocs++;
    CHECK(api.mem_free(p));
    CHECK(alloc_async(&p, 7 * MIB, 0)); allocs++;
    CHECK(free_async(p, 0));
    CUmemoryPool pool;
    CHECK(default_pool(&pool, dev));
    CHECK(alloc_pool(&p, 9 * MIB, pool, 0)); allocs++;
    CHECK(free_async(p, 0));
    CHECK(api.ctx_synchronize());
    CHECK(trim(pool, 0));
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof prop);
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = 0;
    size_t gran = 0;
    CHECK(granularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
    CUmemGenericAllocationHandle h;
    CHECK(create(&h, 4 * gran, &prop, 0)); allocs++;
    printf("free_with_vmm=%zu\n", free_now());
    EXPECT(free_now() == f0 - 4 * gran, "cuMemCreate charged %zu, expected %zu", f0 - free_now(),
           4 * gran);
    CHECK(mrelease(h));
    printf("expected_allocs=%d\nfree_after_allocs=%zu\n", allocs, free_now());
    EXPECT(free_now() == f0, "free %zu after every allocation was freed, expected %zu", free_now(),
           f0);

    CUmodule mod;
    CHECK(module_load(&mod, ptx));
    CUfunction fn;
    CHECK(get_function(&fn, mod, "probe_kernel"));
    CUdeviceptr out = 0;
    CHECK(api.mem_alloc(&out, 4096)); allocs++;
    void *args[] = {&out};
    int launches = 0;
    for (int i = 0; i < 3; i++) {
        CHECK(launch(fn, 1, 1, 1, 32, 1, 1, 0, 0, args, NULL)); launches++;
    }
    CHECK(launch_ptsz(fn, 2, 1, 1, 32, 1, 1, 0, 0, args, NULL)); launches++;
    CUlaunchConfig cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.gridDimX = cfg.gridDimY = cfg.gridDimZ = 1;
    cfg.blockDimX = 64;
    cfg.blockDimY = cfg.blockDimZ = 1;
    CHECK(launch_ex(&cfg, fn, args, NULL)); launches++;
    CHECK(launch_coop(fn, 1, 1, 1, 32, 1, 1, 0, 0, args)); launches++;
    CUstream s;
    CHECK(stream_create(&s, CU_STREAM_NON_BLOCKING));
    CHECK(begin_capture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
    CHECK(launch(fn, 1, 1, 1, 32, 1, 1, 0, s, args, NULL)); launches++;
    CHECK(launch(fn, 1, 1, 1, 32, 1, 1, 0, s, args, NULL)); launches++;
    CUgraph g;
    CHECK(end_capture(s, &g));
    CUgraphExec ge;
    CHECK(instantiate(&ge, g, 0));
    for (int i = 0; i < 4; i++) {
        CHECK(graph_launch(ge, s)); launches++;
    }
    CHECK(stream_sync(s));
    CHECK(api.ctx_synchronize());
    CHECK(api.mem_free(out));
    printf("expected_api_allocs=%d\nexpected_launches=%d\nOK\n", allocs, launches);
    return 0;
}

/* CUDA arrays under a 64 MiB quota: charged at their dense size, refused past the quota,
 * returned on destroy. */
static int arrays(void) {
    resolver("dlsym");
    setup();
    CUresult (*create2d)(CUarray *, const CUDA_ARRAY_DESCRIPTOR *) = dl("cuArrayCreate_v2");
    CUresult (*create3d)(CUarray *, const CUDA_ARRAY3D_DESCRIPTOR *) = dl("cuArray3DCreate_v2");
    CUresult (*destroy)(CUarray) = dl("cuArrayDestroy");
    CUresult (*mip_create)(CUmipmappedArray *, const CUDA_ARRAY3D_DESCRIPTOR *, unsigned) =
        dl("cuMipmappedArrayCreate");
    CUresult (*mip_destroy)(CUmipmappedArray) = dl("cuMipmappedArrayDestroy");
    size_t f0 = free_now();

    CUDA_ARRAY_DESCRIPTOR d2 = {.Width = 2048, .Height = 1024, .Format = CU_AD_FORMAT_FLOAT,
                                .NumChannels = 4};
    CUarray a2;
    CHECK(create2d(&a2, &d2));
    EXPECT(free_now() == f0 - 32 * MIB, "2D float4 array charged %llu", (unsigned long long)(f0 - free_now()));
    CUDA_ARRAY3D_DESCRIPTOR d3 = {.Width = 1024, .Height = 1024, .Depth = 8,
                                  .Format = CU_AD_FORMAT_UNSIGNED_INT32, .NumChannels = 1,
                                  .Flags = CUDA_ARRAY3D_LAYERED};
    CUarray a3;
    CHECK(create3d(&a3, &d3));
    EXPECT(free_now() == f0 - 64 * MIB, "layered array charged %llu", (unsigned long long)(f0 - free_now() - 32 * MIB));
    CUDA_ARRAY_DESCRIPTOR small = {.Width = 1024, .Height = 0, .Format = CU_AD_FORMAT_UNSIGNED_INT8,
                                   .NumChannels = 1};
    CUarray over = NULL;
    CUresult rc = create2d(&over, &small);
    printf("over_quota=%d\n", (int)rc);
    EXPECT(rc == CUDA_ERROR_OUT_OF_MEMORY, "an array past the quota returned %d", (int)rc);
    CHECK(destroy(a2));
    EXPECT(free_now() == f0 - 32 * MIB, "destroy returned %llu", (unsigned long long)(free_now() - (f0 - 64 * MIB)));
    CUDA_ARRAY3D_DESCRIPTOR dm = {.Width = 1024, .Height = 1024, .Format = CU_AD_FORMAT_FLOAT,
                                  .NumChannels = 1};
    CUmipmappedArray m;
    CHECK(mip_create(&m, &dm, 3)); /* 4 MiB + 1 MiB + 256 KiB */
    EXPECT(free_now() == f0 - 32 * MIB - 5 * MIB - 256 * 1024, "mipmapped array charged %llu",
           (unsigned long long)(f0 - 32 * MIB - free_now()));
    CHECK(mip_destroy(m));
    CHECK(destroy(a3));
    EXPECT(free_now() == f0, "free %llu after destroying every array, expected %llu",
           (unsigned long long)free_now(), (unsigned long long)f0);
    printf("OK\n");
    return 0;
}

/* CUDA-graph memory under a 64 MiB quota: an allocation node is charged when added and stays
 * charged while a graph or an executable graph made from it exists, free nodes or not (dedicated
 * functions and cuGraphAddNode). */
static int graph_mem(void) {
    resolver("dlsym");
    setup();
    CUresult (*graph_create)(CUgraph *, unsigned) = dl("cuGraphCreate");
    CUresult (*add_alloc)(CUgraphNode *, CUgraph, const CUgraphNode *, size_t,
                          CUDA_MEM_ALLOC_NODE_PARAMS *) = dl("cuGraphAddMemAllocNode");
    CUresult (*add_free)(CUgraphNode *, CUgraph, const CUgraphNode *, size_t, CUdeviceptr) =
        dl("cuGraphAddMemFreeNode");
    CUresult (*add_node)(CUgraphNode *, CUgraph, const CUgraphNode *, const CUgraphEdgeData *,
                         size_t, CUgraphNodeParams *) = dl("cuGraphAddNode_v2");
    CUresult (*instantiate)(CUgraphExec *, CUgraph, unsigned long long) =
        dl("cuGraphInstantiateWithFlags");
    CUresult (*graph_launch)(CUgraphExec, CUstream) = dl("cuGraphLaunch");
    CUresult (*exec_destroy)(CUgraphExec) = dl("cuGraphExecDestroy");
    CUresult (*graph_destroy)(CUgraph) = dl("cuGraphDestroy");
    size_t f0 = free_now();
#define CHARGED(mib, what)                                                                         \
    EXPECT(free_now() == f0 - (mib) * MIB, "%s: charged %llu MiB, expected %d", what,             \
           (unsigned long long)((f0 - free_now()) / MIB), (int)(mib))

    CUgraph g;
    CHECK(graph_create(&g, 0));
    CUDA_MEM_ALLOC_NODE_PARAMS ap;
    memset(&ap, 0, sizeof ap);
    ap.poolProps.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
    ap.poolProps.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    ap.poolProps.location.id = 0;
    ap.bytesize = 48 * MIB;
    CUgraphNode a1, f1, a2, f2;
    CHECK(add_alloc(&a1, g, NULL, 0, &ap));
    EXPECT(ap.dptr != 0, "no address for the allocation node");
    CHARGED(48, "allocation node");
    CUDA_MEM_ALLOC_NODE_PARAMS big = ap;
    big.bytesize = 32 * MIB;
    big.dptr = 0;
    CUgraphNode refused;
    CUresult rc = add_alloc(&refused, g, &a1, 1, &big);
    printf("over_quota=%d\n", (int)rc);
    EXPECT(rc == CUDA_ERROR_OUT_OF_MEMORY, "an allocation node past the quota returned %d", (int)rc);
    CHECK(add_free(&f1, g, &a1, 1, ap.dptr));
    CHARGED(48, "after its free node (the graph still holds it)");

    CUgraphNodeParams np;
    memset(&np, 0, sizeof np);
    np.type = CU_GRAPH_NODE_TYPE_MEM_ALLOC;
    np.alloc.poolProps = ap.poolProps;
    np.alloc.bytesize = 16 * MIB;
    CHECK(add_node(&a2, g, &f1, NULL, 1, &np));
    CHARGED(64, "cuGraphAddNode allocation");
    CUdeviceptr p2 = np.alloc.dptr;
    memset(&np, 0, sizeof np);
    np.type = CU_GRAPH_NODE_TYPE_MEM_FREE;
    np.free.dptr = p2;
    CHECK(add_node(&f2, g, &a2, NULL, 1, &np));
    CHARGED(64, "cuGraphAddNode free");

    /* While the graph can run, its memory is not the container's to allocate again. */
    CUdeviceptr outside = 0;
    rc = api.mem_alloc(&outside, 8 * MIB);
    printf("alloc_while_graph_exists=%d\n", (int)rc);
    EXPECT(rc == CUDA_ERROR_OUT_OF_MEMORY, "cuMemAlloc beside a 64 MiB graph returned %d", (int)rc);

    CUgraphExec ge;
    CHECK(instantiate(&ge, g, 0));
    CHECK(graph_launch(ge, 0));
    CHECK(api.ctx_synchronize());
    CHECK(graph_destroy(g));
    CHARGED(64, "graph destroyed, executable graph alive");
    CHECK(exec_destroy(ge));
    CHARGED(0, "both destroyed");
    printf("OK\n");
    return 0;
#undef CHARGED
}

/* A stream-ordered free returns the quota when the stream reaches it, not when it is issued:
 * under a 256 MiB quota, 200 MiB freed behind a 300 ms kernel stays charged until then, and a
 * 200 MiB cuMemAlloc meanwhile waits for it instead of exceeding the quota. */
static int async_window(void) {
    resolver("dlsym");
    setup();
    CUresult (*stream_create)(CUstream *, unsigned) = dl("cuStreamCreate");
    CUresult (*stream_sync)(CUstream) = dl("cuStreamSynchronize");
    CUresult (*module_load)(CUmodule *, const void *) = dl("cuModuleLoadData");
    CUresult (*get_function)(CUfunction *, CUmodule, const char *) = dl("cuModuleGetFunction");
    CUresult (*launch)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                       unsigned, CUstream, void **, void **) = dl("cuLaunchKernel");
    CUresult (*alloc_async)(CUdeviceptr *, size_t, CUstream) = dl("cuMemAllocAsync");
    CUresult (*free_async)(CUdeviceptr, CUstream) = dl("cuMemFreeAsync");
    static const char spin_ptx[] = ".version 7.0\n.target sm_80\n.address_size 64\n"
                                   ".visible .entry simgpu_spin(.param .u64 ns)\n{\n ret;\n}\n";
    CUstream s;
    CHECK(stream_create(&s, CU_STREAM_NON_BLOCKING));
    CUmodule mod;
    CHECK(module_load(&mod, spin_ptx));
    CUfunction spin;
    CHECK(get_function(&spin, mod, "simgpu_spin"));
    size_t f0 = free_now();
    CUdeviceptr a = 0, b = 0;
    CHECK(alloc_async(&a, 200 * MIB, s));
    unsigned long long ns = 300000000ull;
    void *args[] = {&ns};
    CHECK(launch(spin, 1, 1, 1, 32, 1, 1, 0, s, args, NULL));
    CHECK(free_async(a, s));
    size_t during = free_now();
    printf("charged_while_queued_mib=%llu\n", (unsigned long long)((f0 - during) / MIB));
    EXPECT(f0 - during == 200 * MIB, "a queued free returned its charge early");
    CHECK(api.mem_alloc(&b, 200 * MIB)); /* waits for the free, then fits */
    printf("alloc_after_wait=0\n");
    CHECK(api.mem_free(b));
    CHECK(stream_sync(s));
    EXPECT(free_now() == f0, "free %llu MiB at the end, expected %llu",
           (unsigned long long)(free_now() / MIB), (unsigned long long)(f0 / MIB));
    printf("OK\n");
    return 0;
}

/* A memory pool that keeps freed blocks (release threshold at the maximum, as PyTorch's
 * cudaMallocAsync backend sets it) keeps them charged to the container: under a 256 MiB quota,
 * 200 MiB freed into the pool stay charged; a 50 MiB allocation served from them adds nothing
 * once the pool is reconciled; a 150 MiB one, which does not fit beside what the pool keeps, is
 * charged in full (the pool may not serve it from kept blocks) so the shim trims the pool
 * first; and a 200 MiB cuMemAlloc trims it again instead of exceeding the quota. */
static int pool_retention(void) {
    resolver("dlsym");
    setup();
    CUresult (*stream_create)(CUstream *, unsigned) = dl("cuStreamCreate");
    CUresult (*stream_sync)(CUstream) = dl("cuStreamSynchronize");
    CUresult (*alloc_async)(CUdeviceptr *, size_t, CUstream) = dl("cuMemAllocAsync");
    CUresult (*free_async)(CUdeviceptr, CUstream) = dl("cuMemFreeAsync");
    CUresult (*default_pool)(CUmemoryPool *, CUdevice) = dl("cuDeviceGetDefaultMemPool");
    CUresult (*set_attr)(CUmemoryPool, CUmemPool_attribute, void *) = dl("cuMemPoolSetAttribute");
    CUresult (*get_attr)(CUmemoryPool, CUmemPool_attribute, void *) = dl("cuMemPoolGetAttribute");
    CUstream s;
    CHECK(stream_create(&s, CU_STREAM_NON_BLOCKING));
    CUmemoryPool pool;
    CHECK(default_pool(&pool, 0));
    cuuint64_t keep_all = ~0ull;
    CHECK(set_attr(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &keep_all));
    size_t f0 = free_now();
#define CHARGED_MIB() ((unsigned long long)((f0 - free_now()) / MIB))

    CUdeviceptr a = 0, b = 0, c = 0;
    CHECK(alloc_async(&a, 200 * MIB, s));
    CHECK(free_async(a, s));
    CHECK(stream_sync(s));
    cuuint64_t reserved = 0;
    CHECK(get_attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &reserved));
    printf("pool_reserved_mib=%llu\nkept_charged_mib=%llu\n", (unsigned long long)(reserved / MIB),
           CHARGED_MIB());
    EXPECT(CHARGED_MIB() == 200, "memory the pool keeps is not charged");

    CHECK(alloc_async(&b, 50 * MIB, s)); /* fits beside the kept block; served from it */
    printf("reuse_charged_mib=%llu\n", CHARGED_MIB());
    EXPECT(CHARGED_MIB() == 200, "reusing kept memory charged it twice");
    CHECK(free_async(b, s));
    CHECK(stream_sync(s));

    CHECK(alloc_async(&b, 150 * MIB, s)); /* does not fit beside it: charged in full */
    CHECK(get_attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &reserved));
    printf("full_charge_reserved_mib=%llu\nfull_charge_charged_mib=%llu\n",
           (unsigned long long)(reserved / MIB), CHARGED_MIB());
    EXPECT(reserved / MIB == 150 && CHARGED_MIB() == 150, "the pool was not trimmed for a full charge");
    CHECK(free_async(b, s));
    CHECK(stream_sync(s));

    CHECK(api.mem_alloc(&c, 200 * MIB)); /* at the quota: the shim trims the pool */
    CHECK(get_attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &reserved));
    printf("after_trim_reserved_mib=%llu\nafter_trim_charged_mib=%llu\n",
           (unsigned long long)(reserved / MIB), CHARGED_MIB());
    EXPECT(reserved == 0 && CHARGED_MIB() == 200, "the pool was not trimmed");
    CHECK(api.mem_free(c));
    EXPECT(CHARGED_MIB() == 0, "charged %llu MiB at the end", CHARGED_MIB());
    printf("OK\n");
    return 0;
#undef CHARGED_MIB
}

int main(int argc, char **argv) {
    const char *mode = argc > 1 ? argv[1] : "";
    if (!strcmp(mode, "quota") && argc == 3) return quota(argv[2]);
    if (!strcmp(mode, "hold") && argc == 3) return hold(strtoull(argv[2], NULL, 0));
    if (!strcmp(mode, "try") && argc >= 3) return try_sizes(argc - 2, argv + 2);
    if (!strcmp(mode, "fork")) return fork_test();
    if (!strcmp(mode, "ignore_init")) return ignore_init();
    if (!strcmp(mode, "paths")) return paths();
    if (!strcmp(mode, "arrays")) return arrays();
    if (!strcmp(mode, "graph_mem")) return graph_mem();
    if (!strcmp(mode, "async_window")) return async_window();
    if (!strcmp(mode, "pool_retention")) return pool_retention();
    fprintf(stderr, "usage: see the comment at the top of shim_driver.c\n");
    return 2;
}
