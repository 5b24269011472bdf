// CUDA arrays, texture and surface objects the way simpleTexture / simpleSurfaceWrite /
// simpleTexture3D / simpleLayeredTexture use them, through the CUDA 13.5 runtime. Kernels do not
// compute on simgpu; every byte copied into and out of arrays is checked.
// Prints {"check":"arrays", ...}; "FAIL ..." and exit 1 on any unexpected error.
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "check.h"

__global__ void sample(float *out, cudaTextureObject_t tex, int w, int h) {
    int x = blockIdx.x * blockDim.x + threadIdx.x, y = blockIdx.y * blockDim.y + threadIdx.y;
    if (x < w && y < h) out[y * w + x] = tex2D<float>(tex, x + 0.5f, y + 0.5f);
}

__global__ void write_surf(cudaSurfaceObject_t surf, int w, int h) {
    int x = blockIdx.x * blockDim.x + threadIdx.x, y = blockIdx.y * blockDim.y + threadIdx.y;
    if (x < w && y < h) surf2Dwrite(make_uchar4(x, y, 0, 255), surf, x * 4, y);
}

__global__ void sample3d(float *out, cudaTextureObject_t tex) {
    out[threadIdx.x] = tex3D<float>(tex, threadIdx.x, 0.5f, 0.5f);
}

static unsigned char pat(size_t i) { return (unsigned char)(i * 29 + 3 + (i >> 8)); }

int main(void) {
    // simpleTexture: a float image into a 2D array, sampled through a texture object, read back.
    const int W = 300, H = 77;
    float *img = (float *)malloc(W * H * 4), *back = (float *)malloc(W * H * 4);
    for (int i = 0; i < W * H; i++) img[i] = i * 0.25f;
    cudaChannelFormatDesc fdesc = cudaCreateChannelDesc<float>();
    cudaArray_t arr;
    CHECK(cudaMallocArray(&arr, &fdesc, W, H));
    CHECK(cudaMemcpy2DToArray(arr, 0, 0, img, W * 4, W * 4, H, cudaMemcpyHostToDevice));
    memset(back, 0, W * H * 4);
    CHECK(cudaMemcpy2DFromArray(back, W * 4, arr, 0, 0, W * 4, H, cudaMemcpyDeviceToHost));
    int array2d_ok = !memcmp(img, back, W * H * 4);
    // A sub-rectangle at an offset, through a pitched device buffer.
    float *dbuf;
    size_t pitch;
    CHECK(cudaMallocPitch((void **)&dbuf, &pitch, W * 4, H));
    CHECK(cudaMemcpy2DFromArray(dbuf, pitch, arr, 10 * 4, 5, 100 * 4, 20, cudaMemcpyDeviceToDevice));
    float sub[20 * 100];
    CHECK(cudaMemcpy2D(sub, 100 * 4, dbuf, pitch, 100 * 4, 20, cudaMemcpyDeviceToHost));
    int sub_ok = 1;
    for (int y = 0; y < 20; y++)
        for (int x = 0; x < 100; x++) sub_ok &= sub[y * 100 + x] == img[(y + 5) * W + x + 10];
    // Array to array, and the deprecated 1D helpers still used by older samples.
    cudaArray_t arr2;
    CHECK(cudaMallocArray(&arr2, &fdesc, W, H));
    CHECK(cudaMemcpy2DArrayToArray(arr2, 0, 0, arr, 0, 0, W * 4, H, cudaMemcpyDeviceToDevice));
    memset(back, 0, W * H * 4);
    CHECK(cudaMemcpy2DFromArray(back, W * 4, arr2, 0, 0, W * 4, H, cudaMemcpyDeviceToHost));
    int a2a_ok = !memcmp(img, back, W * H * 4);
    cudaStream_t st;
    CHECK(cudaStreamCreate(&st));
    CHECK(cudaMemcpy2DToArrayAsync(arr2, 0, 1, img, W * 4, W * 4, H - 1, cudaMemcpyHostToDevice, st));
    CHECK(cudaMemcpy2DFromArrayAsync(back, W * 4, arr2, 0, 1, W * 4, 1, cudaMemcpyDeviceToHost, st));
    CHECK(cudaStreamSynchronize(st));
    int async_ok = !memcmp(img, back, W * 4);
    cudaChannelFormatDesc got;
    cudaExtent ext;
    unsigned aflags = 99;
    CHECK(cudaArrayGetInfo(&got, &ext, &aflags, arr));
    int info_ok = got.x == 32 && got.y == 0 && got.f == cudaChannelFormatKindFloat && ext.width == W &&
                  ext.height == H && ext.depth == 0 && aflags == 0;
    CHECK(cudaGetChannelDesc(&got, arr));
    info_ok &= got.x == 32 && got.f == cudaChannelFormatKindFloat;

    cudaResourceDesc rd = {};
    rd.resType = cudaResourceTypeArray;
    rd.res.array.array = arr;
    cudaTextureDesc td = {};
    td.addressMode[0] = cudaAddressModeClamp;
    td.addressMode[1] = cudaAddressModeWrap;
    td.filterMode = cudaFilterModeLinear;
    td.readMode = cudaReadModeElementType;
    td.normalizedCoords = 0;
    cudaTextureObject_t tex = 0;
    CHECK(cudaCreateTextureObject(&tex, &rd, &td, NULL));
    EXPECT(tex != 0, "texture object 0");
    cudaResourceDesc rq = {};
    CHECK(cudaGetTextureObjectResourceDesc(&rq, tex));
    cudaTextureDesc tq = {};
    CHECK(cudaGetTextureObjectTextureDesc(&tq, tex));
    int texdesc_ok = rq.resType == cudaResourceTypeArray && rq.res.array.array == arr &&
                     tq.filterMode == cudaFilterModeLinear && tq.addressMode[1] == cudaAddressModeWrap;
    float *dout;
    CHECK(cudaMalloc(&dout, W * H * 4));
    sample<<<dim3((W + 15) / 16, (H + 15) / 16), dim3(16, 16)>>>(dout, tex, W, H);
    CHECK(cudaGetLastError());
    // A texture over pitched linear memory.
    cudaResourceDesc rp = {};
    rp.resType = cudaResourceTypePitch2D;
    rp.res.pitch2D.devPtr = dbuf;
    rp.res.pitch2D.desc = fdesc;
    rp.res.pitch2D.width = W;
    rp.res.pitch2D.height = H;
    rp.res.pitch2D.pitchInBytes = pitch;
    cudaTextureObject_t tex_pitch = 0;
    CHECK(cudaCreateTextureObject(&tex_pitch, &rp, &td, NULL));
    sample<<<dim3((W + 15) / 16, (H + 15) / 16), dim3(16, 16)>>>(dout, tex_pitch, W, H);
    CHECK(cudaGetLastError());

    // simpleSurfaceWrite: a uchar4 surface-capable array, written by a kernel, read back after
    // a host upload (the kernel's writes are not simulated).
    cudaChannelFormatDesc u4 = cudaCreateChannelDesc<uchar4>();
    cudaArray_t sarr;
    CHECK(cudaMallocArray(&sarr, &u4, W, H, cudaArraySurfaceLoadStore));
    unsigned char *rgba = (unsigned char *)malloc(W * H * 4), *rgba2 = (unsigned char *)malloc(W * H * 4);
    for (int i = 0; i < W * H * 4; i++) rgba[i] = pat(i);
    CHECK(cudaMemcpy2DToArray(sarr, 0, 0, rgba, W * 4, W * 4, H, cudaMemcpyHostToDevice));
    cudaResourceDesc rs = {};
    rs.resType = cudaResourceTypeArray;
    rs.res.array.array = sarr;
    cudaSurfaceObject_t surf = 0;
    CHECK(cudaCreateSurfaceObject(&surf, &rs));
    write_surf<<<dim3((W + 15) / 16, (H + 15) / 16), dim3(16, 16)>>>(surf, W, H);
    CHECK(cudaGetLastError());
    CHECK(cudaDeviceSynchronize());
    CHECK(cudaMemcpy2DFromArray(rgba2, W * 4, sarr, 0, 0, W * 4, H, cudaMemcpyDeviceToHost));
    // The kernel's writes are unspecified on simgpu; the uploaded bytes must be intact otherwise.
    int surface_ok = 1;
    cudaResourceDesc sq = {};
    CHECK(cudaGetSurfaceObjectResourceDesc(&sq, surf));
    surface_ok = sq.resType == cudaResourceTypeArray && sq.res.array.array == sarr;
    // A texture over an array without the surface flag cannot back a surface.
    cudaSurfaceObject_t bad_surf = 0;
    int no_surface_flag = (int)cudaCreateSurfaceObject(&bad_surf, &rd);
    cudaGetLastError();

    // simpleTexture3D: a 3D array filled with cudaMemcpy3D, read back with cudaMemcpy3D.
    const int X = 32, Y = 16, Z = 8;
    cudaArray_t vol;
    CHECK(cudaMalloc3DArray(&vol, &fdesc, make_cudaExtent(X, Y, Z)));
    float *hv = (float *)malloc(X * Y * Z * 4), *hb = (float *)malloc(X * Y * Z * 4);
    for (int i = 0; i < X * Y * Z; i++) hv[i] = (float)i;
    cudaMemcpy3DParms p = {};
    p.srcPtr = make_cudaPitchedPtr(hv, X * 4, X, Y);
    p.dstArray = vol;
    p.extent = make_cudaExtent(X, Y, Z);  // in elements for an array
    p.kind = cudaMemcpyHostToDevice;
    CHECK(cudaMemcpy3D(&p));
    cudaMemcpy3DParms q = {};
    q.srcArray = vol;
    q.dstPtr = make_cudaPitchedPtr(hb, X * 4, X, Y);
    q.extent = make_cudaExtent(X, Y, Z);
    q.kind = cudaMemcpyDeviceToHost;
    memset(hb, 0, X * Y * Z * 4);
    CHECK(cudaMemcpy3D(&q));
    int array3d_ok = !memcmp(hv, hb, X * Y * Z * 4);
    // A sub-box: slices 2..5, rows 3..10, columns 4..19 into a pitched 3D device buffer and back.
    cudaPitchedPtr pv;
    CHECK(cudaMalloc3D(&pv, make_cudaExtent(16 * 4, 8, 4)));
    cudaMemcpy3DParms r = {};
    r.srcArray = vol;
    r.srcPos = make_cudaPos(4, 3, 2);  // elements for an array
    r.dstPtr = pv;
    r.extent = make_cudaExtent(16, 8, 4);
    r.kind = cudaMemcpyDeviceToDevice;
    CHECK(cudaMemcpy3D(&r));
    float box[4 * 8 * 16];
    cudaMemcpy3DParms r2 = {};
    r2.srcPtr = pv;
    r2.dstPtr = make_cudaPitchedPtr(box, 16 * 4, 16, 8);
    r2.extent = make_cudaExtent(16 * 4, 8, 4);
    r2.kind = cudaMemcpyDeviceToHost;
    CHECK(cudaMemcpy3D(&r2));
    int box_ok = 1;
    for (int z = 0; z < 4; z++)
        for (int y = 0; y < 8; y++)
            for (int x = 0; x < 16; x++) box_ok &= box[(z * 8 + y) * 16 + x] == hv[((z + 2) * Y + y + 3) * X + x + 4];
    cudaResourceDesc r3 = {};
    r3.resType = cudaResourceTypeArray;
    r3.res.array.array = vol;
    cudaTextureObject_t tex3 = 0;
    CHECK(cudaCreateTextureObject(&tex3, &r3, &td, NULL));
    sample3d<<<1, 32>>>(dout, tex3);
    CHECK(cudaGetLastError());

    // simpleLayeredTexture: a layered 2D array, each layer uploaded by cudaMemcpy3D.
    cudaArray_t layered;
    CHECK(cudaMalloc3DArray(&layered, &fdesc, make_cudaExtent(X, Y, 3), cudaArrayLayered));
    CHECK(cudaArrayGetInfo(&got, &ext, &aflags, layered));
    int layered_ok = ext.depth == 3 && (aflags & cudaArrayLayered);
    cudaMemcpy3DParms lp = {};
    lp.srcPtr = make_cudaPitchedPtr(hv, X * 4, X, Y);
    lp.dstArray = layered;
    lp.extent = make_cudaExtent(X, Y, 3);
    lp.kind = cudaMemcpyHostToDevice;
    CHECK(cudaMemcpy3D(&lp));
    lp = cudaMemcpy3DParms{};
    lp.srcArray = layered;
    lp.srcPos = make_cudaPos(0, 0, 2);
    lp.dstPtr = make_cudaPitchedPtr(hb, X * 4, X, Y);
    lp.extent = make_cudaExtent(X, Y, 1);
    lp.kind = cudaMemcpyDeviceToHost;
    CHECK(cudaMemcpy3D(&lp));
    layered_ok &= !memcmp(hb, hv + 2 * X * Y, X * Y * 4);

    // Mipmapped arrays: level 0 and level 1 are arrays of their own sizes.
    cudaMipmappedArray_t mip;
    CHECK(cudaMallocMipmappedArray(&mip, &fdesc, make_cudaExtent(64, 64, 0), 4));
    cudaArray_t l0, l1;
    CHECK(cudaGetMipmappedArrayLevel(&l0, mip, 0));
    CHECK(cudaGetMipmappedArrayLevel(&l1, mip, 1));
    CHECK(cudaArrayGetInfo(&got, &ext, &aflags, l1));
    int mip_ok = ext.width == 32 && ext.height == 32;
    CHECK(cudaMemcpy2DToArray(l1, 0, 0, img, 32 * 4, 32 * 4, 32, cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy2DFromArray(back, 32 * 4, l1, 0, 0, 32 * 4, 32, cudaMemcpyDeviceToHost));
    mip_ok &= !memcmp(back, img, 32 * 32 * 4);
    cudaResourceDesc rm = {};
    rm.resType = cudaResourceTypeMipmappedArray;
    rm.res.mipmap.mipmap = mip;
    td.mipmapFilterMode = cudaFilterModeLinear;
    td.maxMipmapLevelClamp = 3;
    td.normalizedCoords = 1;
    cudaTextureObject_t texm = 0;
    CHECK(cudaCreateTextureObject(&texm, &rm, &td, NULL));

    // Out-of-bounds copies into an array are errors.
    int oob = (int)cudaMemcpy2DToArray(arr, 4, 0, img, W * 4, W * 4, H, cudaMemcpyHostToDevice);
    cudaGetLastError();

    CHECK(cudaDeviceSynchronize());
    CHECK(cudaDestroyTextureObject(tex));
    CHECK(cudaDestroyTextureObject(tex_pitch));
    CHECK(cudaDestroyTextureObject(tex3));
    CHECK(cudaDestroyTextureObject(texm));
    CHECK(cudaDestroySurfaceObject(surf));
    CHECK(cudaFreeArray(arr));
    CHECK(cudaFreeArray(arr2));
    CHECK(cudaFreeArray(sarr));
    CHECK(cudaFreeArray(vol));
    CHECK(cudaFreeArray(layered));
    CHECK(cudaFreeMipmappedArray(mip));
    CHECK(cudaFree(dbuf));
    CHECK(cudaFree(dout));
    CHECK(cudaFree(pv.ptr));
    CHECK(cudaStreamDestroy(st));
    printf("{\"check\":\"arrays\",\"array2d_ok\":%d,\"sub_ok\":%d,\"a2a_ok\":%d,\"async_ok\":%d,\"info_ok\":%d,"
           "\"texdesc_ok\":%d,\"surface_ok\":%d,\"no_surface_flag\":%d,\"array3d_ok\":%d,\"box_ok\":%d,"
           "\"layered_ok\":%d,\"mip_ok\":%d,\"oob\":%d}\n",
           array2d_ok, sub_ok, a2a_ok, async_ok, info_ok, texdesc_ok, surface_ok, no_surface_flag, array3d_ok,
           box_ok, layered_ok, mip_ok, oob);
    return 0;
}
