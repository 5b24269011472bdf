/* cudart C test: one source, compiled with gcc against cudart 12.9 and 13.5 (tests/tests/sim_cudart.rs).
 *
 * usage: rt_test [EXPECTED_TOTAL_BYTES]
 * Every call is checked: on failure it prints "FAIL <call> <error string>" and exits 1.
 * Prints "key=value" facts and "OK" at the end. */
#include <cuda_runtime_api.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "check.h"



static void pattern(unsigned char *buf, size_t n, unsigned seed) {
    uint32_t x = seed * 2654435761u + 1;
    for (size_t i = 0; i < n; i++) {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        buf[i] = (unsigned char)x;
    }
}

static size_t first_diff(const unsigned char *a, const unsigned char *b, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (a[i] != b[i]) return i;
    return n;
}

int main(int argc, char **argv) {
    unsigned long long expected_total = argc > 1 ? strtoull(argv[1], NULL, 0) : 0;

    int runtime = 0, driver = 0;
    CHECK(cudaRuntimeGetVersion(&runtime));
    CHECK(cudaDriverGetVersion(&driver));
    printf("runtime_version=%d\ndriver_version=%d\n", runtime, driver);

    int count = 0;
    CHECK(cudaGetDeviceCount(&count));
    printf("device_count=%d\n", count);
    EXPECT(count >= 1, "device count %d", count);

    CHECK(cudaSetDevice(0));
    struct cudaDeviceProp prop;
    memset(&prop, 0, sizeof prop);
    CHECK(cudaGetDeviceProperties(&prop, 0));
    printf("name=%s\ntotal_global_mem=%zu\nsm_count=%d\ncc=%d.%d\n", prop.name, prop.totalGlobalMem,
           prop.multiProcessorCount, prop.major, prop.minor);
    EXPECT(prop.name[0] != '\0', "empty device name");
    EXPECT(prop.multiProcessorCount > 0, "SM count %d", prop.multiProcessorCount);
    EXPECT(prop.major >= 3, "compute capability %d.%d", prop.major, prop.minor);
    if (expected_total)
        EXPECT(prop.totalGlobalMem == expected_total, "totalGlobalMem %zu, expected %llu",
               prop.totalGlobalMem, expected_total);

    /* Memory accounting. */
    size_t free0 = 0, total0 = 0;
    CHECK(cudaMemGetInfo(&free0, &total0));
    printf("mem_total=%zu\nmem_free_before=%zu\n", total0, free0);
    EXPECT(free0 <= total0, "free %zu > total %zu", free0, total0);
    EXPECT(total0 == prop.totalGlobalMem, "cudaMemGetInfo total %zu != totalGlobalMem %zu", total0,
           prop.totalGlobalMem);
    if (expected_total)
        EXPECT(total0 == expected_total, "cudaMemGetInfo total %zu, expected %llu", total0,
               expected_total);

    const size_t big = 256u << 20; /* 256 MiB */
    void *d_big = NULL;
    CHECK(cudaMalloc(&d_big, big));
    EXPECT(d_big != NULL, "cudaMalloc returned NULL");
    size_t free1 = 0, total1 = 0;
    CHECK(cudaMemGetInfo(&free1, &total1));
    printf("mem_free_after=%zu\n", free1);
    EXPECT(total1 == total0, "total changed: %zu -> %zu", total0, total1);
    EXPECT(free1 + big <= free0, "free %zu -> %zu after cudaMalloc(%zu): did not drop by the allocation",
           free0, free1, big);

    /* Synchronous copies: a pattern must round-trip through the device. */
    const size_t n = (4u << 20) + 123; /* odd size, > one page */
    unsigned char *h_src = malloc(n), *h_dst = malloc(n);
    EXPECT(h_src && h_dst, "host malloc");
    pattern(h_src, n, 1);
    memset(h_dst, 0, n);
    unsigned char *d_a = NULL, *d_b = NULL;
    CHECK(cudaMalloc((void **)&d_a, n));
    CHECK(cudaMalloc((void **)&d_b, n));
    EXPECT(d_a != d_b, "two allocations share an address");
    CHECK(cudaMemcpy(d_a, h_src, n, cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(h_dst, d_a, n, cudaMemcpyDeviceToHost));
    size_t at = first_diff(h_src, h_dst, n);
    EXPECT(at == n, "H->D->H round trip differs at byte %zu", at);

    /* Device-to-device. */
    memset(h_dst, 0, n);
    CHECK(cudaMemcpy(d_b, d_a, n, cudaMemcpyDeviceToDevice));
    CHECK(cudaMemcpy(h_dst, d_b, n, cudaMemcpyDeviceToHost));
    at = first_diff(h_src, h_dst, n);
    EXPECT(at == n, "D->D copy differs at byte %zu", at);

    /* Copy at an offset inside an allocation. */
    CHECK(cudaMemcpy(d_b + 1000, h_src + 5, 4096, cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(h_dst, d_b + 1000, 4096, cudaMemcpyDeviceToHost));
    at = first_diff(h_src + 5, h_dst, 4096);
    EXPECT(at == 4096, "offset copy differs at byte %zu", at);

    /* Memset of a sub-range. */
    CHECK(cudaMemset(d_a + 16, 0xA5, 1 << 20));
    CHECK(cudaMemcpy(h_dst, d_a, n, cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < n; i++) {
        unsigned char want = (i >= 16 && i < 16 + (1u << 20)) ? 0xA5 : h_src[i];
        EXPECT(h_dst[i] == want, "after cudaMemset byte %zu is 0x%02x, expected 0x%02x", i, h_dst[i],
               want);
    }

    /* Streams and async copies. */
    cudaStream_t stream;
    CHECK(cudaStreamCreate(&stream));
    unsigned char *h_pin = NULL;
    CHECK(cudaMallocHost((void **)&h_pin, n));
    pattern(h_pin, n, 2);
    CHECK(cudaMemcpyAsync(d_b, h_pin, n, cudaMemcpyHostToDevice, stream));
    memset(h_dst, 0, n);
    CHECK(cudaMemcpyAsync(h_dst, d_b, n, cudaMemcpyDeviceToHost, stream));
    CHECK(cudaStreamSynchronize(stream));
    at = first_diff(h_pin, h_dst, n);
    EXPECT(at == n, "async round trip differs at byte %zu", at);
    CHECK(cudaStreamQuery(stream));

    /* Events. */
    cudaEvent_t ev0, ev1;
    CHECK(cudaEventCreate(&ev0));
    CHECK(cudaEventCreate(&ev1));
    CHECK(cudaEventRecord(ev0, stream));
    CHECK(cudaMemcpyAsync(d_a, h_pin, n, cudaMemcpyHostToDevice, stream));
    CHECK(cudaEventRecord(ev1, stream));
    CHECK(cudaEventSynchronize(ev1));
    CHECK(cudaEventQuery(ev1));
    float ms = -1.0f;
    CHECK(cudaEventElapsedTime(&ms, ev0, ev1));
    printf("event_elapsed_ms=%f\n", ms);
    EXPECT(ms >= 0.0f, "elapsed %f ms", ms);
    CHECK(cudaEventDestroy(ev0));
    CHECK(cudaEventDestroy(ev1));

    CHECK(cudaStreamDestroy(stream));
    CHECK(cudaFreeHost(h_pin));
    CHECK(cudaFree(d_a));
    CHECK(cudaFree(d_b));
    CHECK(cudaFree(d_big));
    size_t free2 = 0, total2 = 0;
    CHECK(cudaMemGetInfo(&free2, &total2));
    printf("mem_free_end=%zu\n", free2);
    EXPECT(free2 >= free1 + big, "free %zu after cudaFree, was %zu with the 256 MiB allocation", free2,
           free1);
    CHECK(cudaDeviceSynchronize());
    CHECK(cudaGetLastError());
    free(h_src);
    free(h_dst);
    printf("OK\n");
    return 0;
}
