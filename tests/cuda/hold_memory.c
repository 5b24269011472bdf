/* hold_memory hold MIB [ORD]  allocate MIB of device memory (on CUDA ordinal ORD, default 0),
 *                        print {"check":"held",...}, then sleep
 * hold_memory try MIB [ORD]   try to allocate MIB, print {"check":"try","result":<CUresult>}, exit
 * hold_memory init 0     time cuInit (where the shim registers with a daemon), print
 *                        {"check":"init","ns":<ns>,"result":<CUresult>}, exit
 * hold_memory init wait  the same, once standard input reaches end of file (a start signal:
 *                        many processes started on one pipe call cuInit at the same moment)
 * A plain driver-API program (linked with -lcuda) for the shim's kill -9 test. */
#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

int main(int argc, char **argv) {
    if (argc < 3) return 2;
    size_t bytes = (size_t)atoi(argv[2]) << 20;
    if (!strcmp(argv[1], "init")) {
        if (!strcmp(argv[2], "wait")) {
            char c;
            while (read(0, &c, 1) > 0) {
            }
        }
        struct timespec a, b;
        clock_gettime(CLOCK_MONOTONIC, &a);
        CUresult r = cuInit(0);
        clock_gettime(CLOCK_MONOTONIC, &b);
        long long ns = (b.tv_sec - a.tv_sec) * 1000000000LL + (b.tv_nsec - a.tv_nsec);
        printf("{\"check\":\"init\",\"ns\":%lld,\"result\":%d}\n", ns, (int)r);
        return r != 0;
    }
    CUdevice d;
    CUcontext c;
    CUdeviceptr p;
    if (cuInit(0) || cuDeviceGet(&d, argc > 3 ? atoi(argv[3]) : 0) || cuDevicePrimaryCtxRetain(&c, d) || cuCtxSetCurrent(c)) {
        printf("{\"check\":\"init\",\"ok\":false}\n");
        return 1;
    }
    CUresult r = cuMemAlloc(&p, bytes);
    if (!strcmp(argv[1], "try")) {
        printf("{\"check\":\"try\",\"result\":%d}\n", (int)r);
        return 0;
    }
    printf("{\"check\":\"held\",\"result\":%d}\n", (int)r);
    fflush(stdout);
    for (;;) pause();
}
