/* gpu_probe: the driver-API measurements and checks of `sharectl gpu-check` (issue 33). One
 * program, compiled here with gcc against the CUDA 13.5 `cuda.h` and run on whatever driver the
 * process finds (NVIDIA's on a GPU node, simgpu's otherwise): it links with -lcuda and loads
 * kernels as PTX text, which the driver compiles, so it needs no toolkit on the GPU machine.
 * Every mode prints JSON lines, {"check":"<mode>",...}; a call that must work and does not prints
 * "FAIL ..." and exits 1. Results the caller judges (a refused allocation, an unsupported kind)
 * are printed as CUresult codes, never asserted here.
 *
 *   gpu_probe info                  driver, device and NVML facts (versions, MIG, compute mode,
 *                                   per-cgroup memory limits offered, MPS pipe, unified memory)
 *   gpu_probe procaddr API_LIST     every (name, version, flags) of the API list through
 *                                   cuGetProcAddress_v2, and every export through dlsym: the
 *                                   status and the symbol the pointer lies in, and whether it lies
 *                                   in libshare (the shim). One line per query.
 *   gpu_probe kinds QUOTA_MIB       per allocation kind: 3/4 of QUOTA, then 1/2 more, then free:
 *                                   the codes and cuMemGetInfo's free after each step
 *   gpu_probe views MIB             MIB allocated, then cuMemGetInfo and NVML's memory of device 0
 *   gpu_probe overhead SHIM N       M1/M2 on this driver: N launches (batches of 256) and N/16
 *                                   1 MiB alloc + free pairs, direct against through SHIM (dlopened,
 *                                   LIBSHARE_REAL_LIBCUDA = this driver), batches alternating
 *   gpu_probe kernels               an empty kernel's time by grid size (waves), the jobs' spin
 *                                   kernel's time against what it was asked
 *   gpu_probe copies                pinned and pageable host<->device, device<->device, memset,
 *                                   and a 4 KiB copy's latency
 *   gpu_probe managed MIB           unified memory: a kernel faulting MIB in, one 2 MiB chunk,
 *                                   a prefetch to the device and back
 *   gpu_probe slices SECS           spin kernels of 100 us back to back for SECS, an event after
 *                                   each; waits for stdin's EOF before it starts (so two processes
 *                                   start together) and prints the gaps in the completions
 *
 * The spin kernel is the jobs' (jobs/src/spin.ptx, path in GPU_PROBE_SPIN_PTX): on a GPU it
 * busy-waits on %globaltimer; on simgpu it is modelled as its first parameter in ns. */
#define _GNU_SOURCE
#include <cuda.h>
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include "check.h"

#define MIB (1024ull * 1024ull)

static CUdevice dev;
static CUcontext ctx;
static CUstream stream;

static double now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e9 + (double)t.tv_nsec;
}

static void setup(void) {
    CHECK(cuInit(0));
    CHECK(cuDeviceGet(&dev, 0));
    CHECK(cuDevicePrimaryCtxRetain(&ctx, dev));
    CHECK(cuCtxSetCurrent(ctx));
    CHECK(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
}

static int attr(CUdevice_attribute a) {
    int v = -1;
    if (cuDeviceGetAttribute(&v, a, dev) != CUDA_SUCCESS) return -1;
    return v;
}

/* ---- kernels ---- */

static const char empty_ptx[] = ".version 7.0\n.target sm_70\n.address_size 64\n"
                                ".visible .entry calib_empty()\n{\n ret;\n}\n";

static CUfunction load(const char *image, const char *name) {
    CUmodule m;
    CHECK(cuModuleLoadData(&m, image));
    CUfunction f;
    CHECK(cuModuleGetFunction(&f, m, name));
    return f;
}

static char *read_file(const char *path) {
    FILE *f = fopen(path, "rb");
    EXPECT(f, "cannot open %s", path);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)n + 1);
    EXPECT(buf && fread(buf, 1, (size_t)n, f) == (size_t)n, "cannot read %s", path);
    buf[n] = 0;
    fclose(f);
    return buf;
}

static char *spin_image;
static CUfunction spin_fn(const char *name) {
    if (!spin_image) {
        const char *p = getenv("GPU_PROBE_SPIN_PTX");
        EXPECT(p && *p, "GPU_PROBE_SPIN_PTX is not set (the jobs' spin.ptx)");
        spin_image = read_file(p);
    }
    return load(spin_image, name);
}

static void launch_spin(CUfunction f, unsigned long long ns) {
    void *args[] = {&ns};
    CHECK(cuLaunchKernel(f, 1, 1, 1, 32, 1, 1, 0, stream, args, NULL));
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/* Device time (ms) between two events, after the second completed. */
static double elapsed_ms(CUevent a, CUevent b) {
    CHECK(cuEventSynchronize(b));
    float ms = 0;
    CHECK(cuEventElapsedTime(&ms, a, b));
    return ms;
}

/* ---- info ---- */

typedef struct nvmlDevice_st *nvmlDevice_t;
typedef struct {
    unsigned long long total, free, used;
} nvml_memory_t;

static void *nvml_lib;
static void *nvml(const char *name) { return nvml_lib ? dlsym(nvml_lib, name) : NULL; }
static nvmlDevice_t nvml_dev;

static int nvml_open(void) {
    nvml_lib = dlopen("libnvidia-ml.so.1", RTLD_NOW);
    if (!nvml_lib) return 0;
    int (*init)(void) = (int (*)(void))nvml("nvmlInit_v2");
    int (*handle)(unsigned, nvmlDevice_t *) =
        (int (*)(unsigned, nvmlDevice_t *))nvml("nvmlDeviceGetHandleByIndex_v2");
    return init && handle && init() == 0 && handle(0, &nvml_dev) == 0;
}

/* Prints `"key":"text"` with the text escaped for JSON. */
static void json_str(const char *key, const char *s) {
    printf("\"%s\":\"", key);
    for (; s && *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') printf("\\%c", c);
        else if (c < 0x20) printf("\\u%04x", c);
        else putchar(c);
    }
    printf("\"");
}

static const char *lib_of(void *p) {
    Dl_info i;
    return p && dladdr(p, &i) && i.dli_fname ? i.dli_fname : "";
}

static int info(void) {
    setup();
    int version = 0;
    CHECK(cuDriverGetVersion(&version));
    char name[256] = {0};
    CHECK(cuDeviceGetName(name, sizeof name, dev));
    size_t total = 0;
    CHECK(cuDeviceTotalMem(&total, dev));
    int count = 0;
    CHECK(cuDeviceGetCount(&count));
    CUuuid u;
    CHECK(cuDeviceGetUuid(&u, dev));
    char uuid[64];
    unsigned char *b = (unsigned char *)u.bytes;
    snprintf(uuid, sizeof uuid,
             "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0], b[1],
             b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14],
             b[15]);
    printf("{\"check\":\"info\",");
    json_str("libcuda", lib_of((void *)cuInit));
    printf(",\"cuda_driver_version\":%d,\"devices\":%d,", version, count);
    json_str("name", name);
    printf(",");
    json_str("uuid", uuid);
    printf(",\"memory_bytes\":%zu,\"sms\":%d,\"cc\":\"%d.%d\",\"compute_mode\":%d,"
           "\"managed_memory\":%d,\"concurrent_managed_access\":%d,\"pageable_memory_access\":%d,"
           "\"unified_addressing\":%d,\"max_threads_per_sm\":%d",
           total, attr(CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT),
           attr(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR),
           attr(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR), attr(CU_DEVICE_ATTRIBUTE_COMPUTE_MODE),
           attr(CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY),
           attr(CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS),
           attr(CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS),
           attr(CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING),
           attr(CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR));
    int have_nvml = nvml_open();
    printf(",\"nvml\":%s", have_nvml ? "true" : "false");
    if (have_nvml) {
        char text[256] = {0};
        int (*driver)(char *, unsigned) = (int (*)(char *, unsigned))nvml("nvmlSystemGetDriverVersion");
        if (driver && driver(text, sizeof text) == 0) {
            printf(",");
            json_str("driver_version", text);
        }
        int cuda = 0;
        int (*cudav)(int *) = (int (*)(int *))nvml("nvmlSystemGetCudaDriverVersion_v2");
        if (cudav && cudav(&cuda) == 0) printf(",\"nvml_cuda_version\":%d", cuda);
        printf(",");
        json_str("libnvidia_ml", lib_of(nvml("nvmlInit_v2")));
        unsigned cur = 0, pend = 0;
        int (*mig)(nvmlDevice_t, unsigned *, unsigned *) =
            (int (*)(nvmlDevice_t, unsigned *, unsigned *))nvml("nvmlDeviceGetMigMode");
        int rc = mig ? mig(nvml_dev, &cur, &pend) : -1;
        /* NVML_ERROR_NOT_SUPPORTED (3): a GPU without MIG. */
        printf(",\"mig_rc\":%d,\"mig_current\":%u,\"mig_pending\":%u", rc, cur, pend);
        unsigned mode = 0;
        int (*cmode)(nvmlDevice_t, unsigned *) =
            (int (*)(nvmlDevice_t, unsigned *))nvml("nvmlDeviceGetComputeMode");
        rc = cmode ? cmode(nvml_dev, &mode) : -1;
        printf(",\"nvml_compute_mode_rc\":%d,\"nvml_compute_mode\":%u", rc, mode);
        /* The driver's per-cgroup memory limits (r615+): offered when exported. */
        printf(",\"memory_limits_set\":%s,\"memory_limits_get\":%s",
               nvml("nvmlDeviceSetMemoryLimits_v1") ? "true" : "false",
               nvml("nvmlDeviceGetMemoryLimits_v1") ? "true" : "false");
        nvml_memory_t m;
        int (*mem)(nvmlDevice_t, nvml_memory_t *) =
            (int (*)(nvmlDevice_t, nvml_memory_t *))nvml("nvmlDeviceGetMemoryInfo");
        if (mem && mem(nvml_dev, &m) == 0)
            printf(",\"nvml_total\":%llu,\"nvml_used\":%llu", m.total, m.used);
    }
    /* MPS: a control daemon listens on its pipe directory (CUDA_MPS_PIPE_DIRECTORY, default
     * /tmp/nvidia-mps); a client connects to it at cuInit. */
    const char *pipe_dir = getenv("CUDA_MPS_PIPE_DIRECTORY");
    char control[512];
    snprintf(control, sizeof control, "%s/control", pipe_dir && *pipe_dir ? pipe_dir : "/tmp/nvidia-mps");
    printf(",\"mps_control_pipe\":%s", access(control, F_OK) == 0 ? "true" : "false");
    printf(",");
    json_str("mps_pipe_directory", pipe_dir ? pipe_dir : "/tmp/nvidia-mps");
    printf("}\n");
    return 0;
}

/* ---- procaddr ---- */

typedef CUresult (*gpa2_fn)(const char *, void **, int, cuuint64_t, CUdriverProcAddressQueryResult *);

/* The symbol `p` lies in ("-" if none), and 1 if in libshare. */
static void where(void *p, const char **sym, int *shim) {
    Dl_info i;
    *sym = "-";
    *shim = 0;
    if (p && dladdr(p, &i)) {
        if (i.dli_sname) *sym = i.dli_sname;
        *shim = i.dli_fname && strstr(i.dli_fname, "libshare") != NULL;
    }
}

static int procaddr(const char *list) {
    CHECK(cuInit(0));
    int driver = 0;
    CHECK(cuDriverGetVersion(&driver));
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    EXPECT(h, "dlopen libcuda.so.1: %s", dlerror());
    gpa2_fn gpa2 = (gpa2_fn)dlsym(h, "cuGetProcAddress_v2");
    EXPECT(gpa2, "no cuGetProcAddress_v2");
    /* cuGetProcAddress asked for itself, as cudart does: everything below goes through it. */
    void *self = NULL;
    CUdriverProcAddressQueryResult st;
    CHECK(gpa2("cuGetProcAddress", &self, 12000, 0, &st));
    const char *sym;
    int in;
    where(self, &sym, &in);
    printf("{\"check\":\"procaddr_self\",\"symbol\":\"%s\",\"in_shim\":%d,\"driver_version\":%d}\n", sym,
           in, driver);
    gpa2 = (gpa2_fn)self;
    FILE *f = fopen(list, "r");
    EXPECT(f, "cannot open %s", list);
    static const int asked[] = {2000, 3020, 4000, 7000, 11030, 12000, 13000};
    char line[1024], prev[256] = "";
    int queries = 0;
    while (fgets(line, sizeof line, f)) {
        char base[256], flag[16], export[256];
        int ver;
        if (line[0] == '#' || sscanf(line, "%255s %d %15s %255s", base, &ver, flag, export) != 4) continue;
        /* Exports: by the default lookup and on the driver's handle (the shim answers dlsym). */
        void *a = dlsym(RTLD_DEFAULT, export), *b = dlsym(h, export);
        int ia, ib;
        const char *sa, *sb;
        where(a, &sa, &ia);
        where(b, &sb, &ib);
        printf("E %s %d %d %d\n", export, b != NULL, ia, ib);
        if (!strcmp(base, prev)) continue; /* each name's versions once */
        snprintf(prev, sizeof prev, "%s", base);
        int versions[16], nv = 0;
        for (size_t k = 0; k < sizeof asked / sizeof *asked; k++) versions[nv++] = asked[k];
        versions[nv++] = driver;
        for (int k = 0; k < nv; k++) {
            for (int per_thread = 0; per_thread < 2; per_thread++) {
                void *p = NULL;
                CUdriverProcAddressQueryResult s = -1;
                CUresult rc = gpa2(base, &p, versions[k],
                                   per_thread ? CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM
                                              : CU_GET_PROC_ADDRESS_DEFAULT,
                                   &s);
                const char *ps;
                int pi;
                where(p, &ps, &pi);
                printf("P %s %d %d %d %d %s %d\n", base, versions[k], per_thread, (int)rc, (int)s,
                       p ? ps : "NULL", pi);
                queries++;
            }
        }
    }
    fclose(f);
    printf("{\"check\":\"procaddr\",\"queries\":%d}\n", queries);
    return 0;
}

/* ---- kinds ---- */

static size_t free_now(void) {
    size_t f = 0, t = 0;
    CHECK(cuMemGetInfo(&f, &t));
    return f;
}

typedef struct {
    CUdeviceptr ptr;
    CUarray array;
    CUmemGenericAllocationHandle handle;
    void *host;
} block;

/* Allocates `bytes` of `kind`; returns the CUresult. */
static CUresult alloc_kind(const char *kind, size_t bytes, block *b) {
    memset(b, 0, sizeof *b);
    if (!strcmp(kind, "mem_alloc")) return cuMemAlloc(&b->ptr, bytes);
    if (!strcmp(kind, "pitch")) {
        size_t pitch;
        return cuMemAllocPitch(&b->ptr, &pitch, 1 << 20, bytes >> 20, 16);
    }
    if (!strcmp(kind, "managed")) return cuMemAllocManaged(&b->ptr, bytes, CU_MEM_ATTACH_GLOBAL);
    if (!strcmp(kind, "async")) {
        CUresult rc = cuMemAllocAsync(&b->ptr, bytes, stream);
        CUresult s = cuStreamSynchronize(stream);
        return rc ? rc : s;
    }
    if (!strcmp(kind, "host")) return cuMemAllocHost(&b->host, bytes);
    if (!strcmp(kind, "array")) {
        CUDA_ARRAY_DESCRIPTOR d = {.Width = 8192, .Height = bytes / (8192 * 4),
                                   .Format = CU_AD_FORMAT_FLOAT, .NumChannels = 1};
        return cuArrayCreate(&b->array, &d);
    }
    if (!strcmp(kind, "vmm")) {
        CUmemAllocationProp p;
        memset(&p, 0, sizeof p);
        p.type = CU_MEM_ALLOCATION_TYPE_PINNED;
        p.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        p.location.id = dev;
        return cuMemCreate(&b->handle, bytes, &p, 0);
    }
    EXPECT(0, "unknown kind %s", kind);
    return CUDA_ERROR_INVALID_VALUE;
}

static CUresult free_kind(const char *kind, block *b) {
    if (!strcmp(kind, "host")) return cuMemFreeHost(b->host);
    if (!strcmp(kind, "array")) return cuArrayDestroy(b->array);
    if (!strcmp(kind, "vmm")) return cuMemRelease(b->handle);
    if (!strcmp(kind, "async")) {
        CUresult rc = cuMemFreeAsync(b->ptr, stream);
        CUresult s = cuStreamSynchronize(stream);
        /* What the pool keeps stays charged (README): give it back for the next kind. */
        CUmemoryPool pool;
        if (cuDeviceGetDefaultMemPool(&pool, dev) == CUDA_SUCCESS) cuMemPoolTrimTo(pool, 0);
        return rc ? rc : s;
    }
    return cuMemFree(b->ptr);
}

static int kinds(unsigned quota_mib) {
    setup();
    static const char *all[] = {"mem_alloc", "pitch", "managed", "async", "vmm", "array", "host"};
    size_t first = (size_t)quota_mib * 3 / 4 * MIB, second = (size_t)quota_mib / 2 * MIB;
    for (size_t k = 0; k < sizeof all / sizeof *all; k++) {
        const char *kind = all[k];
        size_t f0 = free_now();
        block a, b;
        CUresult r1 = alloc_kind(kind, first, &a);
        size_t f1 = free_now();
        CUresult r2 = alloc_kind(kind, second, &b);
        size_t f2 = free_now();
        CUresult fb = r2 == CUDA_SUCCESS ? free_kind(kind, &b) : CUDA_SUCCESS;
        CUresult fa = r1 == CUDA_SUCCESS ? free_kind(kind, &a) : CUDA_SUCCESS;
        size_t f3 = free_now();
        printf("{\"check\":\"kind\",\"kind\":\"%s\",\"first_mib\":%zu,\"second_mib\":%zu,"
               "\"free_before\":%zu,\"first_rc\":%d,\"free_after_first\":%zu,\"second_rc\":%d,"
               "\"free_after_second\":%zu,\"free_rc\":%d,\"free_end\":%zu}\n",
               kind, first >> 20, second >> 20, f0, (int)r1, f1, (int)r2, f2, (int)(fa ? fa : fb), f3);
        fflush(stdout);
    }
    return 0;
}

/* ---- views ---- */

static int views(unsigned mib) {
    setup();
    CUdeviceptr p = 0;
    CHECK(cuMemAlloc(&p, (size_t)mib * MIB));
    size_t f = 0, t = 0;
    CHECK(cuMemGetInfo(&f, &t));
    printf("{\"check\":\"views\",\"mib\":%u,\"cuda_free\":%zu,\"cuda_total\":%zu", mib, f, t);
    if (nvml_open()) {
        nvml_memory_t m;
        int (*mem)(nvmlDevice_t, nvml_memory_t *) =
            (int (*)(nvmlDevice_t, nvml_memory_t *))nvml("nvmlDeviceGetMemoryInfo");
        int rc = mem ? mem(nvml_dev, &m) : -1;
        printf(",\"nvml_rc\":%d", rc);
        if (rc == 0) printf(",\"nvml_free\":%llu,\"nvml_total\":%llu,\"nvml_used\":%llu", m.free, m.total, m.used);
    }
    printf("}\n");
    CHECK(cuMemFree(p));
    return 0;
}

/* ---- overhead (M1/M2 on this driver) ---- */

typedef CUresult (*launch_fn)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                              unsigned, CUstream, void **, void **);
typedef CUresult (*alloc_fn)(CUdeviceptr *, size_t);
typedef CUresult (*free_fn)(CUdeviceptr);

#define BATCH 256

static int overhead(const char *shim_path, int n) {
    setup();
    CUfunction k = load(empty_ptx, "calib_empty");
    /* This driver's path, for the shim to load (as LD_PRELOAD would find it). */
    const char *driver = lib_of((void *)cuInit);
    EXPECT(*driver, "cannot tell where cuInit lies");
    setenv("LIBSHARE_REAL_LIBCUDA", driver, 1);
    void *shim = dlopen(shim_path, RTLD_NOW | RTLD_LOCAL);
    EXPECT(shim, "dlopen %s: %s", shim_path, dlerror());
    CUresult (*s_init)(unsigned) = (CUresult(*)(unsigned))dlsym(shim, "cuInit");
    CUresult (*s_set)(CUcontext) = (CUresult(*)(CUcontext))dlsym(shim, "cuCtxSetCurrent");
    gpa2_fn s_gpa = (gpa2_fn)dlsym(shim, "cuGetProcAddress_v2");
    EXPECT(s_init && s_set && s_gpa, "the shim's cuInit, cuCtxSetCurrent, cuGetProcAddress_v2");
    CHECK(s_init(0));
    CHECK(s_set(ctx));
    void *p;
    CUdriverProcAddressQueryResult st;
    CHECK(s_gpa("cuLaunchKernel", &p, 12000, 0, &st));
    launch_fn s_launch = (launch_fn)p;
    CHECK(s_gpa("cuMemAlloc", &p, 12000, 0, &st));
    alloc_fn s_alloc = (alloc_fn)p;
    CHECK(s_gpa("cuMemFree", &p, 12000, 0, &st));
    free_fn s_free = (free_fn)p;
    const char *sym;
    int in;
    where((void *)s_launch, &sym, &in);
    EXPECT(in, "the shim's cuGetProcAddress_v2(cuLaunchKernel) is not its hook (%s)", sym);
    launch_fn d_launch = cuLaunchKernel;
    alloc_fn d_alloc = cuMemAlloc;
    free_fn d_free = cuMemFree;
    int batches = n / BATCH < 4 ? 4 : n / BATCH;
    double *ld = calloc((size_t)batches, sizeof(double)), *ls = calloc((size_t)batches, sizeof(double));
    double *ad = calloc((size_t)batches, sizeof(double)), *as = calloc((size_t)batches, sizeof(double));
    for (int i = 0; i < batches; i++) {
        /* Alternate which goes first, so drift and warm caches favour neither. */
        for (int j = 0; j < 2; j++) {
            int shim_turn = (i + j) % 2;
            launch_fn f = shim_turn ? s_launch : d_launch;
            double t0 = now_ns();
            for (int b = 0; b < BATCH; b++)
                CHECK(f(k, 1, 1, 1, 32, 1, 1, 0, stream, NULL, NULL));
            double t1 = now_ns();
            CHECK(cuStreamSynchronize(stream));
            (shim_turn ? ls : ld)[i] = (t1 - t0) / BATCH;
            alloc_fn a = shim_turn ? s_alloc : d_alloc;
            free_fn fr = shim_turn ? s_free : d_free;
            t0 = now_ns();
            for (int b = 0; b < BATCH / 16; b++) {
                CUdeviceptr q;
                CHECK(a(&q, MIB));
                CHECK(fr(q));
            }
            t1 = now_ns();
            (shim_turn ? as : ad)[i] = (t1 - t0) / (BATCH / 16);
        }
    }
    double l_d = median(ld, batches), l_s = median(ls, batches);
    double a_d = median(ad, batches), a_s = median(as, batches);
    printf("{\"check\":\"overhead\",\"batches\":%d,\"launch_direct_ns\":%.1f,\"launch_shim_ns\":%.1f,"
           "\"launch_added_ns\":%.1f,\"alloc_free_direct_ns\":%.1f,\"alloc_free_shim_ns\":%.1f,"
           "\"alloc_free_added_ns\":%.1f}\n",
           batches, l_d, l_s, l_s - l_d, a_d, a_s, a_s - a_d);
    return 0;
}

/* ---- kernels ---- */

/* Keeps the stream busy for 200 us, so that the event recorded next completes when the work
 * after it is already queued: event to event is then the device's time, not the host's launch. */
static void busy(CUfunction spin) { launch_spin(spin, 200000); }

static int kernels(void) {
    setup();
    int sms = attr(CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT);
    CUfunction k = load(empty_ptx, "calib_empty");
    CUfunction spin = spin_fn("simgpu_spin");
    CUevent e0, e1;
    CHECK(cuEventCreate(&e0, CU_EVENT_DEFAULT));
    CHECK(cuEventCreate(&e1, CU_EVENT_DEFAULT));
    enum { REPS = 21 };
    double t[REPS];
    /* Warm up (module load, first launch). */
    for (int i = 0; i < 5; i++) CHECK(cuLaunchKernel(k, 1, 1, 1, 32, 1, 1, 0, stream, NULL, NULL));
    CHECK(cuStreamSynchronize(stream));
    /* 256 threads a block: 8 blocks resident per SM (2048 threads), so a wave is 8 x SMs. */
    static const int waves[] = {1, 2, 4, 8, 16, 32, 64};
    for (size_t w = 0; w < sizeof waves / sizeof *waves; w++) {
        unsigned grid = (unsigned)(waves[w] * 8 * sms);
        for (int r = 0; r < REPS; r++) {
            busy(spin);
            CHECK(cuEventRecord(e0, stream));
            CHECK(cuLaunchKernel(k, grid, 1, 1, 256, 1, 1, 0, stream, NULL, NULL));
            CHECK(cuEventRecord(e1, stream));
            t[r] = elapsed_ms(e0, e1);
        }
        printf("{\"check\":\"kernel_waves\",\"waves\":%d,\"blocks\":%u,\"threads\":256,\"ms\":%.5f}\n",
               waves[w], grid, median(t, REPS));
    }
    /* One block of 32 threads (as the jobs launch theirs). */
    for (int r = 0; r < REPS; r++) {
        busy(spin);
        CHECK(cuEventRecord(e0, stream));
        CHECK(cuLaunchKernel(k, 1, 1, 1, 32, 1, 1, 0, stream, NULL, NULL));
        CHECK(cuEventRecord(e1, stream));
        t[r] = elapsed_ms(e0, e1);
    }
    printf("{\"check\":\"kernel_empty\",\"ms\":%.5f}\n", median(t, REPS));
    /* Back to back: the time between completions of empty kernels queued deep. */
    busy(spin);
    CHECK(cuEventRecord(e0, stream));
    for (int i = 0; i < 1000; i++) CHECK(cuLaunchKernel(k, 1, 1, 1, 32, 1, 1, 0, stream, NULL, NULL));
    CHECK(cuEventRecord(e1, stream));
    printf("{\"check\":\"kernel_back_to_back\",\"kernels\":1000,\"ms_each\":%.5f}\n",
           elapsed_ms(e0, e1) / 1000);
    /* The jobs' kernel: simgpu_spin(ns). */
    static const unsigned long long asks[] = {50000, 500000, 2000000};
    for (size_t a = 0; a < sizeof asks / sizeof *asks; a++) {
        for (int r = 0; r < 7; r++) {
            busy(spin);
            CHECK(cuEventRecord(e0, stream));
            launch_spin(spin, asks[a]);
            CHECK(cuEventRecord(e1, stream));
            t[r] = elapsed_ms(e0, e1);
        }
        printf("{\"check\":\"kernel_spin\",\"asked_ms\":%.3f,\"ms\":%.5f}\n", asks[a] / 1e6, median(t, 7));
    }
    return 0;
}

/* ---- copies ---- */

static double copy_ms(CUdeviceptr dst_d, void *dst_h, CUdeviceptr src_d, const void *src_h, size_t n,
                      CUevent e0, CUevent e1) {
    CHECK(cuEventRecord(e0, stream));
    if (dst_d && src_d) CHECK(cuMemcpyDtoDAsync(dst_d, src_d, n, stream));
    else if (dst_d) CHECK(cuMemcpyHtoDAsync(dst_d, src_h, n, stream));
    else CHECK(cuMemcpyDtoHAsync(dst_h, src_d, n, stream));
    CHECK(cuEventRecord(e1, stream));
    return elapsed_ms(e0, e1);
}

static void bw_line(const char *what, size_t bytes, double ms) {
    printf("{\"check\":\"copy\",\"what\":\"%s\",\"bytes\":%zu,\"ms\":%.5f,\"gb_per_s\":%.3f}\n", what,
           bytes, ms, ms > 0 ? bytes / (ms * 1e6) : 0.0);
}

static int copies(void) {
    setup();
    const size_t n = 64 * MIB, big = 256 * MIB;
    CUdeviceptr d, d2;
    CHECK(cuMemAlloc(&d, big));
    CHECK(cuMemAlloc(&d2, big));
    void *pinned;
    CHECK(cuMemAllocHost(&pinned, n));
    char *pageable = malloc(n);
    EXPECT(pageable, "malloc");
    memset(pageable, 1, n);
    memset(pinned, 1, n);
    CUevent e0, e1;
    CHECK(cuEventCreate(&e0, CU_EVENT_DEFAULT));
    CHECK(cuEventCreate(&e1, CU_EVENT_DEFAULT));
    enum { REPS = 5 };
    double t[REPS];
    copy_ms(d, NULL, 0, pinned, n, e0, e1); /* warm-up */
    for (int r = 0; r < REPS; r++) t[r] = copy_ms(d, NULL, 0, pinned, n, e0, e1);
    bw_line("h2d_pinned", n, median(t, REPS));
    for (int r = 0; r < REPS; r++) t[r] = copy_ms(0, pinned, d, NULL, n, e0, e1);
    bw_line("d2h_pinned", n, median(t, REPS));
    /* Pageable: the driver stages them through its own pinned buffers; the events bracket that. */
    for (int r = 0; r < REPS; r++) t[r] = copy_ms(d, NULL, 0, pageable, n, e0, e1);
    bw_line("h2d_pageable", n, median(t, REPS));
    for (int r = 0; r < REPS; r++) t[r] = copy_ms(0, pageable, d, NULL, n, e0, e1);
    bw_line("d2h_pageable", n, median(t, REPS));
    for (int r = 0; r < REPS; r++) t[r] = copy_ms(d2, NULL, d, NULL, big, e0, e1);
    bw_line("d2d", big, median(t, REPS));
    for (int r = 0; r < REPS; r++) {
        CHECK(cuEventRecord(e0, stream));
        CHECK(cuMemsetD8Async(d, 0, big, stream));
        CHECK(cuEventRecord(e1, stream));
        t[r] = elapsed_ms(e0, e1);
    }
    bw_line("memset", big, median(t, REPS));
    /* Latency: a 4 KiB pinned copy, queued behind a kernel (so the events time the device). */
    CUfunction spin = spin_fn("simgpu_spin");
    double small[21];
    for (int r = 0; r < 21; r++) {
        busy(spin);
        small[r] = copy_ms(d, NULL, 0, pinned, 4096, e0, e1);
    }
    bw_line("h2d_4k", 4096, median(small, 21));
    CHECK(cuMemFreeHost(pinned));
    CHECK(cuMemFree(d));
    CHECK(cuMemFree(d2));
    free(pageable);
    return 0;
}

/* ---- managed ---- */

static int managed(unsigned mib) {
    setup();
    int have = attr(CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY), conc = attr(CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS);
    CUdeviceptr m = 0;
    size_t bytes = (size_t)mib * MIB;
    CUresult rc = have == 1 ? cuMemAllocManaged(&m, bytes, CU_MEM_ATTACH_GLOBAL) : CUDA_ERROR_NOT_SUPPORTED;
    if (rc != CUDA_SUCCESS || conc != 1) {
        /* Without concurrent managed access there are no GPU page faults to measure. */
        printf("{\"check\":\"managed\",\"available\":false,\"managed_memory\":%d,"
               "\"concurrent_managed_access\":%d,\"alloc_rc\":%d}\n", have, conc, (int)rc);
        return 0;
    }
    CUfunction touch = spin_fn("simgpu_spin_touch"), spin = spin_fn("simgpu_spin");
    CUevent e0, e1;
    CHECK(cuEventCreate(&e0, CU_EVENT_DEFAULT));
    CHECK(cuEventCreate(&e1, CU_EVENT_DEFAULT));
    CUmemLocation on_dev = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = dev};
    CUmemLocation on_host = {.type = CU_MEM_LOCATION_TYPE_HOST, .id = 0};
    /* A separate 2 MiB allocation: one chunk (simgpu faults a referenced allocation as a whole). */
    CUdeviceptr one = 0;
    CHECK(cuMemAllocManaged(&one, 2 * MIB, CU_MEM_ATTACH_GLOBAL));
    memset((void *)(uintptr_t)m, 1, bytes); /* first touch on the host */
    memset((void *)(uintptr_t)one, 1, 2 * MIB);
    enum { REPS = 3 };
    double fault[REPS], chunk[REPS], pre[REPS], back[REPS], resident[REPS];
    for (int r = 0; r < REPS; r++) {
        /* Every run starts with the pages on the host. */
        CHECK(cuMemPrefetchAsync(m, bytes, on_host, 0, stream));
        CHECK(cuMemPrefetchAsync(one, 2 * MIB, on_host, 0, stream));
        CHECK(cuStreamSynchronize(stream));
        /* The jobs' kernel touching every 64 KiB page of the allocation (then spinning 0 ns). */
        unsigned long long zero = 0, n = bytes, two = 2 * MIB;
        void *args[] = {&zero, &m, &n}, *args1[] = {&zero, &one, &two};
        busy(spin);
        CHECK(cuEventRecord(e0, stream));
        CHECK(cuLaunchKernel(touch, 1, 1, 1, 32, 1, 1, 0, stream, args, NULL));
        CHECK(cuEventRecord(e1, stream));
        fault[r] = elapsed_ms(e0, e1);
        /* Again, resident now: the kernel's own time. */
        busy(spin);
        CHECK(cuEventRecord(e0, stream));
        CHECK(cuLaunchKernel(touch, 1, 1, 1, 32, 1, 1, 0, stream, args, NULL));
        CHECK(cuEventRecord(e1, stream));
        resident[r] = elapsed_ms(e0, e1);
        busy(spin);
        CHECK(cuEventRecord(e0, stream));
        CHECK(cuLaunchKernel(touch, 1, 1, 1, 32, 1, 1, 0, stream, args1, NULL));
        CHECK(cuEventRecord(e1, stream));
        chunk[r] = elapsed_ms(e0, e1);
        /* Back to the host, then prefetched in, on the copy engines. */
        CHECK(cuEventRecord(e0, stream));
        CHECK(cuMemPrefetchAsync(m, bytes, on_host, 0, stream));
        CHECK(cuEventRecord(e1, stream));
        back[r] = elapsed_ms(e0, e1);
        CHECK(cuEventRecord(e0, stream));
        CHECK(cuMemPrefetchAsync(m, bytes, on_dev, 0, stream));
        CHECK(cuEventRecord(e1, stream));
        pre[r] = elapsed_ms(e0, e1);
    }
    printf("{\"check\":\"managed\",\"available\":true,\"mib\":%u,\"fault_ms\":%.4f,\"resident_ms\":%.4f,"
           "\"chunk_2mib_ms\":%.4f,\"prefetch_to_device_ms\":%.4f,\"prefetch_to_host_ms\":%.4f}\n",
           mib, median(fault, REPS), median(resident, REPS), median(chunk, REPS), median(pre, REPS),
           median(back, REPS));
    CHECK(cuMemFree(one));
    CHECK(cuMemFree(m));
    return 0;
}

/* ---- slices ---- */

static int slices(double secs) {
    setup();
    CUfunction spin = spin_fn("simgpu_spin");
    const unsigned long long d = 100000; /* 100 us */
    int n = (int)(secs * 1e9 / d);
    CUevent *ev = calloc((size_t)n + 1, sizeof *ev);
    EXPECT(ev, "calloc");
    for (int i = 0; i <= n; i++) CHECK(cuEventCreate(&ev[i], CU_EVENT_DEFAULT));
    launch_spin(spin, 1000); /* module and first launch out of the way */
    CHECK(cuStreamSynchronize(stream));
    printf("{\"check\":\"slices_ready\"}\n");
    fflush(stdout);
    char c;
    while (read(0, &c, 1) > 0) {
    }
    CHECK(cuEventRecord(ev[0], stream));
    for (int i = 1; i <= n; i++) {
        launch_spin(spin, d);
        CHECK(cuEventRecord(ev[i], stream));
    }
    CHECK(cuEventSynchronize(ev[n]));
    /* Completion times from the first event, us; a gap is a completion later than the kernel's
     * own 100 us plus half of it: [index of the completion after it, its start, its end]. */
    printf("{\"check\":\"slices\",\"kernel_us\":%llu,\"kernels\":%d,\"gaps\":[", d / 1000, n);
    double prev = 0, window = 0;
    int gaps = 0;
    for (int i = 1; i <= n; i++) {
        float ms = 0;
        CHECK(cuEventElapsedTime(&ms, ev[0], ev[i]));
        double us = ms * 1e3;
        if (i > 1 && us - prev > 1.5 * d / 1e3)
            printf("%s[%d,%.1f,%.1f]", gaps++ ? "," : "", i, prev, us);
        prev = us;
        window = us;
    }
    printf("],\"window_us\":%.1f}\n", window);
    return 0;
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    const char *mode = argc > 1 ? argv[1] : "";
    if (!strcmp(mode, "info")) return info();
    if (!strcmp(mode, "procaddr") && argc > 2) return procaddr(argv[2]);
    if (!strcmp(mode, "kinds") && argc > 2) return kinds((unsigned)atoi(argv[2]));
    if (!strcmp(mode, "views") && argc > 2) return views((unsigned)atoi(argv[2]));
    if (!strcmp(mode, "overhead") && argc > 3) return overhead(argv[2], atoi(argv[3]));
    if (!strcmp(mode, "kernels")) return kernels();
    if (!strcmp(mode, "copies")) return copies();
    if (!strcmp(mode, "managed") && argc > 2) return managed((unsigned)atoi(argv[2]));
    if (!strcmp(mode, "slices") && argc > 2) return slices(atof(argv[2]));
    fprintf(stderr, "usage: gpu_probe info | procaddr API_LIST | kinds QUOTA_MIB | views MIB | "
                    "overhead SHIM N | kernels | copies | managed MIB | slices SECS\n");
    return 2;
}
