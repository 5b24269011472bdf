/* container_quota: the cudart program the container tests run inside a container
 * (tests/tests/containers_*.rs), where libshare was injected by the runtime.
 *   container_quota MIB   prints the device as the job sees it (cudaMemGetInfo), allocates
 *                         MIB MiB with cudaMalloc, then 32 MiB more with cuMemAlloc (past a quota
 *                         of MIB + 16 MiB or less: CUDA_ERROR_OUT_OF_MEMORY), each as a JSON line;
 *                         then prints {"check":"held"} and keeps the memory until standard input
 *                         reaches end of file. */
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

int main(int argc, char **argv) {
    if (argc < 2) return 2;
    size_t mib = (size_t)atoi(argv[1]);
    size_t free_b = 0, total_b = 0;
    cudaError_t e = cudaMemGetInfo(&free_b, &total_b);
    printf("{\"check\":\"mem\",\"result\":%d,\"total\":%zu,\"free\":%zu}\n", (int)e, total_b, free_b);
    void *p = NULL;
    e = cudaMalloc(&p, mib << 20);
    printf("{\"check\":\"fill\",\"result\":%d}\n", (int)e);
    CUdeviceptr q = 0;
    CUresult r = cuMemAlloc(&q, 32u << 20);
    printf("{\"check\":\"past\",\"result\":%d}\n", (int)r);
    printf("{\"check\":\"held\"}\n");
    fflush(stdout);
    char c;
    while (read(0, &c, 1) > 0) {
    }
    return 0;
}
