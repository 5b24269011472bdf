// Kernels written the ways CUDA programs write them, for the slicer's corpus (tests/tests/
// slice_ptx.rs): nvcc turns this into PTX for compute_80 and compute_90, libshare_slice rewrites
// it, and ptxas must compile the result. Each kernel's name says what the slicer must do with it:
// `sliced_*` kernels are cut into block ranges, `whole_*` kernels run whole (the reason after
// `whole_`). Nothing here runs; the file is only compiled.
#include <cstdio>

extern "C" __global__ void sliced_saxpy(int n, float a, const float *x, float *y) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i] + y[i];
}

// A grid-stride loop reads gridDim: the slice must see the whole grid's.
extern "C" __global__ void sliced_grid_stride(int n, float *y) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
        y[i] *= 2.0f;
}

extern "C" __global__ void sliced_tile_3d(float *out, int nx, int ny, int nz) {
    int x = blockIdx.x * blockDim.x + threadIdx.x;
    int y = blockIdx.y * blockDim.y + threadIdx.y;
    int z = blockIdx.z * blockDim.z + threadIdx.z;
    if (x < nx && y < ny && z < nz) out[(z * ny + y) * nx + x] = (float)(gridDim.x + gridDim.y + gridDim.z);
}

extern "C" __global__ void sliced_block_sum(const float *in, float *partial, int n) {
    __shared__ float s[256];
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    s[threadIdx.x] = i < n ? in[i] : 0.0f;
    __syncthreads();
    for (int step = blockDim.x / 2; step > 0; step >>= 1) {
        if (threadIdx.x < step) s[threadIdx.x] += s[threadIdx.x + step];
        __syncthreads();
    }
    if (threadIdx.x == 0) partial[blockIdx.x] = s[0];
}

extern "C" __global__ void sliced_dynamic_shared(float *out) {
    extern __shared__ float dyn[];
    dyn[threadIdx.x] = (float)blockIdx.x;
    __syncthreads();
    out[blockIdx.x * blockDim.x + threadIdx.x] = dyn[blockDim.x - 1 - threadIdx.x];
}

// The last block to finish sums the partials: it waits on no later block, so ranges in order keep it.
extern "C" __global__ void sliced_last_block(const float *partial, float *total, unsigned *done) {
    __shared__ bool last;
    __threadfence();
    if (threadIdx.x == 0) last = atomicAdd(done, 1u) == gridDim.x - 1;
    __syncthreads();
    if (last && threadIdx.x == 0) {
        float t = 0;
        for (unsigned b = 0; b < gridDim.x; b++) t += partial[b];
        *total = t;
    }
}

extern "C" __global__ void sliced_warp_shuffle(float *v) {
    float x = v[blockIdx.x * 32 + threadIdx.x];
    for (int o = 16; o > 0; o >>= 1) x += __shfl_down_sync(0xffffffffu, x, o);
    if (threadIdx.x == 0) v[blockIdx.x * 32] = x;
}

extern "C" __global__ void sliced_printf() {
    if (threadIdx.x == 0) printf("block %d of %d\n", blockIdx.x, gridDim.x);
}

// The block index read through inline PTX, as libraries do for the registers C++ does not name.
extern "C" __global__ void sliced_inline_asm_index(int *out) {
    unsigned b;
    asm volatile("mov.u32 %0, %%ctaid.x;" : "=r"(b));
    out[b * blockDim.x + threadIdx.x] = (int)b;
}

template <typename T, int N>
__global__ void sliced_template(T *out) {
#pragma unroll
    for (int k = 0; k < N; k++) out[(blockIdx.x * N + k) * blockDim.x + threadIdx.x] = T(k);
}
template __global__ void sliced_template<double, 4>(double *);
template __global__ void sliced_template<int, 2>(int *);

__device__ __noinline__ float thread_scale(float v) { return v * (float)threadIdx.x; }

extern "C" __global__ void sliced_calls_thread_only(float *v) {
    v[blockIdx.x * blockDim.x + threadIdx.x] = thread_scale(v[threadIdx.x]);
}

__device__ __noinline__ int block_of() { return blockIdx.x; }

extern "C" __global__ void whole_callee_reads_index(int *out) { out[threadIdx.x] = block_of(); }

__constant__ float coefficients[4];

extern "C" __global__ void whole_module_variable(float *out) {
    out[blockIdx.x * blockDim.x + threadIdx.x] = coefficients[threadIdx.x & 3];
}

__device__ unsigned long long counter;

extern "C" __global__ void whole_device_counter() { atomicAdd(&counter, 1ull); }

#if __CUDA_ARCH__ >= 900
extern "C" __global__ void __cluster_dims__(2, 1, 1) whole_cluster(int *out) {
    unsigned rank;
    asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(rank));
    out[blockIdx.x] = (int)rank;
}
#endif
