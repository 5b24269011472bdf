// Pitched, 2D and 3D copies and memsets, and symbol copies, through the CUDA 13.5 runtime (the
// way cudaMallocPitch / cudaMemcpy2D / cudaMemcpy3D / cudaMemcpyToSymbol programs use them).
// Every byte that moves is checked. Prints {"check":"copies", ...}; "FAIL ..." and exit 1 otherwise.
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "check.h"

__constant__ float coeffs[64];
__device__ int table[1000];
__device__ unsigned char blob[3 * 1024];

__global__ void use(float *out) { out[threadIdx.x] = coeffs[threadIdx.x % 64] + table[threadIdx.x]; }

static unsigned char pattern(size_t i) { return (unsigned char)(i * 131 + 7 + (i >> 9)); }

int main(void) {
    // 2D: a W x H host image into a pitched allocation at an offset, back out, D2D between two.
    const size_t W = 1000, H = 77;  // bytes per row, rows
    unsigned char *img = (unsigned char *)malloc(W * H), *back = (unsigned char *)malloc(W * H);
    for (size_t i = 0; i < W * H; i++) img[i] = pattern(i);
    unsigned char *dp, *dp2;
    size_t pitch = 0, pitch2 = 0;
    CHECK(cudaMallocPitch((void **)&dp, &pitch, W + 24, H + 3));
    CHECK(cudaMallocPitch((void **)&dp2, &pitch2, W, H));
    EXPECT(pitch >= W + 24 && pitch % 128 == 0, "pitch %zu", pitch);
    CHECK(cudaMemset2D(dp, pitch, 0xee, W + 24, H + 3));
    CHECK(cudaMemcpy2D(dp + 3 * pitch + 24, pitch, img, W, W, H, cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy2D(dp2, pitch2, dp + 3 * pitch + 24, pitch, W, H, cudaMemcpyDeviceToDevice));
    memset(back, 0, W * H);
    CHECK(cudaMemcpy2D(back, W, dp2, pitch2, W, H, cudaMemcpyDeviceToHost));
    int copy2d_ok = !memcmp(back, img, W * H);
    // The margins kept the memset value.
    unsigned char row0[1024];
    CHECK(cudaMemcpy(row0, dp + 3 * pitch, 24, cudaMemcpyDeviceToHost));
    int margin_ok = 1;
    for (int i = 0; i < 24; i++) margin_ok &= row0[i] == 0xee;
    CHECK(cudaMemcpy(row0, dp, 24, cudaMemcpyDeviceToHost));
    for (int i = 0; i < 24; i++) margin_ok &= row0[i] == 0xee;
    // A column band: memset a 2D sub-rectangle, read it back with an async 2D copy.
    cudaStream_t st;
    CHECK(cudaStreamCreate(&st));
    CHECK(cudaMemset2DAsync(dp2 + 100, pitch2, 0x01, 50, H, st));
    CHECK(cudaMemcpy2DAsync(back, W, dp2, pitch2, W, H, cudaMemcpyDeviceToHost, st));
    CHECK(cudaStreamSynchronize(st));
    int band_ok = 1;
    for (size_t y = 0; y < H; y++)
        for (size_t x = 0; x < W; x++)
            band_ok &= back[y * W + x] == ((x >= 100 && x < 150) ? 0x01 : img[y * W + x]);
    // Pitch larger than width is an error; width larger than pitch is cudaErrorInvalidPitchValue.
    int bad_pitch = (int)cudaMemcpy2D(dp2, 10, img, W, W, H, cudaMemcpyHostToDevice);
    cudaGetLastError();

    // 3D: cudaMalloc3D, a host volume in at an offset, copied to a second volume, back out.
    const size_t X = 200, Y = 30, Z = 9;  // bytes, rows, slices
    cudaExtent ext = make_cudaExtent(X + 8, Y + 2, Z + 1);
    cudaPitchedPtr vol, vol2;
    CHECK(cudaMalloc3D(&vol, ext));
    CHECK(cudaMalloc3D(&vol2, make_cudaExtent(X, Y, Z)));
    EXPECT(vol.pitch >= X + 8 && vol.xsize == X + 8 && vol.ysize == Y + 2, "vol %zu %zu %zu", vol.pitch, vol.xsize, vol.ysize);
    CHECK(cudaMemset3D(vol, 0x99, ext));
    unsigned char *hv = (unsigned char *)malloc(X * Y * Z), *hb = (unsigned char *)malloc(X * Y * Z);
    for (size_t i = 0; i < X * Y * Z; i++) hv[i] = pattern(i * 3);
    cudaMemcpy3DParms p = {};
    p.srcPtr = make_cudaPitchedPtr(hv, X, X, Y);
    p.dstPtr = vol;
    p.dstPos = make_cudaPos(8, 2, 1);
    p.extent = make_cudaExtent(X, Y, Z);
    p.kind = cudaMemcpyHostToDevice;
    CHECK(cudaMemcpy3D(&p));
    cudaMemcpy3DParms q = {};
    q.srcPtr = vol;
    q.srcPos = make_cudaPos(8, 2, 1);
    q.dstPtr = vol2;
    q.extent = make_cudaExtent(X, Y, Z);
    q.kind = cudaMemcpyDeviceToDevice;
    CHECK(cudaMemcpy3DAsync(&q, st));
    CHECK(cudaStreamSynchronize(st));
    cudaMemcpy3DParms r = {};
    r.srcPtr = vol2;
    r.dstPtr = make_cudaPitchedPtr(hb, X, X, Y);
    r.extent = make_cudaExtent(X, Y, Z);
    r.kind = cudaMemcpyDefault;
    memset(hb, 0, X * Y * Z);
    CHECK(cudaMemcpy3D(&r));
    int copy3d_ok = !memcmp(hb, hv, X * Y * Z);
    // Slice 0 of the first volume kept the memset.
    CHECK(cudaMemcpy(hb, vol.ptr, vol.pitch, cudaMemcpyDeviceToHost));
    int memset3d_ok = 1;
    for (size_t i = 0; i < X + 8; i++) memset3d_ok &= hb[i] == 0x99;

    // Symbols: to/from with offsets, async, address and size.
    float c[64], cb[64];
    for (int i = 0; i < 64; i++) c[i] = i * 0.5f;
    CHECK(cudaMemcpyToSymbol(coeffs, c, sizeof c));
    int t[1000], tb[1000];
    for (int i = 0; i < 1000; i++) t[i] = i * i;
    CHECK(cudaMemcpyToSymbol(table, t, 500 * sizeof(int)));
    CHECK(cudaMemcpyToSymbol(table, t + 500, 500 * sizeof(int), 500 * sizeof(int), cudaMemcpyHostToDevice));
    CHECK(cudaMemcpyFromSymbol(cb, coeffs, sizeof cb));
    CHECK(cudaMemcpyFromSymbol(tb, table, sizeof tb));
    unsigned char bl[3 * 1024], blb[3 * 1024];
    for (int i = 0; i < 3 * 1024; i++) bl[i] = pattern(i + 5);
    CHECK(cudaMemcpyToSymbolAsync(blob, bl, sizeof bl, 0, cudaMemcpyHostToDevice, st));
    CHECK(cudaMemcpyFromSymbolAsync(blb, blob, 1024, 2048, cudaMemcpyDeviceToHost, st));
    CHECK(cudaStreamSynchronize(st));
    void *addr = NULL;
    size_t sz = 0;
    CHECK(cudaGetSymbolAddress(&addr, table));
    CHECK(cudaGetSymbolSize(&sz, table));
    int via_addr[10];
    CHECK(cudaMemcpy(via_addr, (int *)addr + 990, sizeof via_addr, cudaMemcpyDeviceToHost));
    int symbol_ok = !memcmp(c, cb, sizeof c) && !memcmp(t, tb, sizeof t) && !memcmp(bl + 2048, blb, 1024) &&
                    sz == sizeof t && !memcmp(via_addr, t + 990, sizeof via_addr);
    // Device to symbol through a device buffer.
    float *dc;
    CHECK(cudaMalloc(&dc, sizeof c));
    CHECK(cudaMemset(dc, 0, sizeof c));
    CHECK(cudaMemcpyToSymbol(coeffs, dc, sizeof c, 0, cudaMemcpyDeviceToDevice));
    CHECK(cudaMemcpyFromSymbol(cb, coeffs, sizeof cb));
    for (int i = 0; i < 64; i++) symbol_ok &= cb[i] == 0.0f;
    int past_end = (int)cudaMemcpyToSymbol(coeffs, c, sizeof c, 8, cudaMemcpyHostToDevice);  // cudaErrorInvalidValue
    cudaGetLastError();
    use<<<1, 64>>>(dc);
    CHECK(cudaGetLastError());

    // cudaMemcpy3DPeer on one device, and memset variants.
    cudaMemcpy3DPeerParms pp = {};
    pp.srcPtr = vol2;
    pp.srcDevice = 0;
    pp.dstPtr = make_cudaPitchedPtr(hb, X, X, Y);
    pp.dstDevice = 0;
    pp.extent = make_cudaExtent(X, Y, Z);
    memset(hb, 0, X * Y * Z);
    CHECK(cudaMemcpy3DPeer(&pp));
    int peer3d_ok = !memcmp(hb, hv, X * Y * Z);

    CHECK(cudaDeviceSynchronize());
    CHECK(cudaFree(dp));
    CHECK(cudaFree(dp2));
    CHECK(cudaFree(vol.ptr));
    CHECK(cudaFree(vol2.ptr));
    CHECK(cudaFree(dc));
    CHECK(cudaStreamDestroy(st));
    printf("{\"check\":\"copies\",\"pitch\":%zu,\"copy2d_ok\":%d,\"margin_ok\":%d,\"band_ok\":%d,"
           "\"bad_pitch\":%d,\"copy3d_ok\":%d,\"memset3d_ok\":%d,\"symbol_ok\":%d,\"past_end\":%d,"
           "\"peer3d_ok\":%d}\n",
           pitch, copy2d_ok, margin_ok, band_ok, bad_pitch, copy3d_ok, memset3d_ok, symbol_ok, past_end,
           peer3d_ok);
    return 0;
}
