/* The demotion protocol (tests/tests/oversub_demotion.rs), two roles of one driver-API program:
 *
 *   demote hold MIB    an opportunistic job: cuMemAlloc in 8 MiB pieces up to MIB (managed under
 *                      an oversubscribing container), each filled with its own pattern and
 *                      touched by a kernel (resident), prints {"check":"hold"}; then until stdin's
 *                      EOF touches every piece every 5 ms; then reads every piece's first and last
 *                      words back and prints {"check":"held","pieces":N,"demoted":D,"bad_words":B}
 *                      where D counts pieces whose preferred location is the host (demoted then).
 *   demote alloc MIB   a production job: one cuMemAlloc of MIB, timed (wall clock), filled and read
 *                      back; prints {"check":"alloc","error":E,"ms":T,"bad_words":B}. With a second
 *                      MIB argument, prints {"check":"first"} after the first allocation and makes a
 *                      second allocation of that size 1.2 s later ("ms2", "error2").
 *   demote take KIND MIB [N]   prints {"check":"ready"}, waits for a line on stdin, then makes N
 *                      (default 1) allocations of MIB, untouched, of KIND: vmm (cuMemCreate on
 *                      the device), pool (cuMemAllocAsync) or alloc (cuMemAlloc: managed under an
 *                      oversubscribing container); prints {"check":"take","ok":K,"error":E} (K made,
 *                      E the first error) and holds them until stdin's EOF.
 */
#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/select.h>
#include <time.h>
#include <unistd.h>
#include "check.h"

#define MIB (1024ull * 1024ull)
#define PIECE (8 * MIB)
#define MAX_PIECES 1024

static const char ptx[] = ".version 7.0\n.target sm_80\n.address_size 64\n"
                          ".visible .entry touch(.param .u64 p)\n{\n ret;\n}\n";
static CUfunction kernel;

static double now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

static void setup(void) {
    CHECK(cuInit(0));
    CUdevice d;
    CHECK(cuDeviceGet(&d, 0));
    CUcontext ctx;
    CHECK(cuDevicePrimaryCtxRetain(&ctx, d));
    CHECK(cuCtxSetCurrent(ctx));
    CUmodule mod;
    CHECK(cuModuleLoadData(&mod, ptx));
    CHECK(cuModuleGetFunction(&kernel, mod, "touch"));
}

static void touch(CUdeviceptr p) {
    void *args[] = {&p};
    CHECK(cuLaunchKernel(kernel, 1, 1, 1, 32, 1, 1, 0, NULL, args, NULL));
}

static unsigned read_word(CUdeviceptr p) {
    unsigned v = 0;
    CHECK(cuMemcpyDtoH(&v, p, sizeof v));
    return v;
}

/* Wrong words among the first and last of `bytes` at p filled with `pattern`. */
static int bad_words(CUdeviceptr p, unsigned long long bytes, unsigned pattern) {
    return (read_word(p) != pattern) + (read_word(p + bytes - 4) != pattern);
}

static int stdin_open(void) {
    fd_set r;
    FD_ZERO(&r);
    FD_SET(0, &r);
    struct timeval tv = {0, 5000};
    if (select(1, &r, NULL, NULL, &tv) <= 0)
        return 1;
    char buf[64];
    return read(0, buf, sizeof buf) > 0;
}

static void hold(unsigned long long mib) {
    static CUdeviceptr piece[MAX_PIECES];
    int n = 0;
    while ((unsigned long long)n * PIECE < mib * MIB && n < MAX_PIECES) {
        CHECK(cuMemAlloc(&piece[n], PIECE));
        CHECK(cuMemsetD32(piece[n], 0xd0000000u + n, PIECE / 4));
        touch(piece[n]);
        n++;
    }
    CHECK(cuCtxSynchronize());
    printf("{\"check\":\"hold\",\"pieces\":%d}\n", n);
    fflush(stdout);
    while (stdin_open()) {
        for (int i = 0; i < n; i++)
            touch(piece[i]);
        CHECK(cuCtxSynchronize());
    }
    int demoted = 0, bad = 0;
    for (int i = 0; i < n; i++) {
        int loc = 0;
        CHECK(cuMemRangeGetAttribute(&loc, sizeof loc, CU_MEM_RANGE_ATTRIBUTE_PREFERRED_LOCATION,
                                     piece[i], PIECE));
        demoted += loc == CU_DEVICE_CPU;
        bad += bad_words(piece[i], PIECE, 0xd0000000u + i);
    }
    printf("{\"check\":\"held\",\"pieces\":%d,\"demoted\":%d,\"bad_words\":%d}\n", n, demoted, bad);
}

static CUresult timed_alloc(CUdeviceptr *p, unsigned long long bytes, double *ms) {
    double t0 = now_ms();
    CUresult r = cuMemAlloc(p, bytes);
    *ms = now_ms() - t0;
    return r;
}

static void alloc(unsigned long long mib, unsigned long long mib2) {
    CUdeviceptr p = 0, p2 = 0;
    double ms = 0, ms2 = 0;
    CUresult r = timed_alloc(&p, mib * MIB, &ms), r2 = CUDA_SUCCESS;
    int bad = 0;
    if (r == CUDA_SUCCESS) {
        CHECK(cuMemsetD32(p, 0x5eed5eedu, mib * MIB / 4));
        bad += bad_words(p, mib * MIB, 0x5eed5eedu);
    }
    if (mib2) {
        printf("{\"check\":\"first\"}\n");
        fflush(stdout);
        usleep(1200 * 1000);
        r2 = timed_alloc(&p2, mib2 * MIB, &ms2);
    }
    printf("{\"check\":\"alloc\",\"error\":%d,\"ms\":%.3f,\"error2\":%d,\"ms2\":%.3f,"
           "\"bad_words\":%d}\n",
           (int)r, ms, (int)r2, ms2, bad);
}

static void take(const char *kind, unsigned long long mib, int n) {
    CUstream s;
    CHECK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    CUdevice dev;
    CHECK(cuCtxGetDevice(&dev));
    printf("{\"check\":\"ready\"}\n");
    fflush(stdout);
    char line[64];
    EXPECT(fgets(line, sizeof line, stdin) != NULL, "no start line");
    int ok = 0;
    CUresult err = CUDA_SUCCESS;
    for (int i = 0; i < n && err == CUDA_SUCCESS; i++) {
        if (!strcmp(kind, "vmm")) {
            CUmemAllocationProp prop = {0};
            prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
            prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
            prop.location.id = dev;
            CUmemGenericAllocationHandle h;
            err = cuMemCreate(&h, mib * MIB, &prop, 0);
        } else if (!strcmp(kind, "pool")) {
            CUdeviceptr p;
            err = cuMemAllocAsync(&p, mib * MIB, s);
            if (err == CUDA_SUCCESS)
                err = cuStreamSynchronize(s);
        } else if (!strcmp(kind, "alloc")) {
            CUdeviceptr p;
            err = cuMemAlloc(&p, mib * MIB);
        } else {
            EXPECT(0, "unknown kind %s", kind);
        }
        ok += err == CUDA_SUCCESS;
    }
    printf("{\"check\":\"take\",\"ok\":%d,\"error\":%d}\n", ok, (int)err);
    fflush(stdout);
    while (fgets(line, sizeof line, stdin) != NULL) {
    }
}

int main(int argc, char **argv) {
    EXPECT(argc >= 3, "usage: demote hold|alloc MIB [MIB2] | take KIND MIB [N]");
    setup();
    if (!strcmp(argv[1], "take")) {
        EXPECT(argc >= 4, "usage: demote take KIND MIB [N]");
        take(argv[2], strtoull(argv[3], NULL, 10), argc > 4 ? atoi(argv[4]) : 1);
        return 0;
    }
    unsigned long long mib = strtoull(argv[2], NULL, 10);
    if (!strcmp(argv[1], "hold"))
        hold(mib);
    else if (!strcmp(argv[1], "alloc"))
        alloc(mib, argc > 3 ? strtoull(argv[3], NULL, 10) : 0);
    else
        EXPECT(0, "unknown mode %s", argv[1]);
    return 0;
}
