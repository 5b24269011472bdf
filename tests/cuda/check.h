/* Shared by the C/CUDA test programs: fail with one "FAIL ..." line on stdout and exit 1.
 *   EXPECT(cond, fmt, ...)   a condition
 *   CHECK(call)              a runtime call (cuda_runtime_api.h included first) or a driver call
 *                            (cuda.h included first) that must succeed */
#ifndef LIBSHARE_TESTS_CHECK_H
#define LIBSHARE_TESTS_CHECK_H
#include <stdio.h>
#include <stdlib.h>

#define EXPECT(cond, ...)                                                                  \
    do {                                                                                   \
        if (!(cond)) {                                                                     \
            printf("FAIL %s: ", #cond);                                                    \
            printf(__VA_ARGS__);                                                           \
            printf("\n");                                                                  \
            fflush(stdout);                                                                \
            exit(1);                                                                       \
        }                                                                                  \
    } while (0)

#if defined(CUDART_VERSION)
#define CHECK(call)                                                                        \
    do {                                                                                   \
        cudaError_t err_ = (call);                                                         \
        EXPECT(err_ == cudaSuccess, "%s %s (%s, %d)", #call, cudaGetErrorString(err_),     \
               cudaGetErrorName(err_), (int)err_);                                         \
    } while (0)
#elif defined(CUDA_VERSION)
#define CHECK(call)                                                                        \
    do {                                                                                   \
        CUresult rc_ = (call);                                                             \
        EXPECT(rc_ == CUDA_SUCCESS, "%s returned %d", #call, (int)rc_);                    \
    } while (0)
#endif
#endif
