/* VMM on simgpu (driver API, linked with -lcuda): bytes round-trip through a mapped range, and a
 * copy or memset into the unmapped rest of the reservation is an error, not a crash. */
#include <cuda.h>
#include <stdio.h>
#include <string.h>
int main() {
  CUdevice d; CUcontext c; CUdeviceptr va; CUmemGenericAllocationHandle h; size_t g;
  cuInit(0); cuDeviceGet(&d, 0); cuDevicePrimaryCtxRetain(&c, d); cuCtxSetCurrent(c);
  CUmemAllocationProp p; memset(&p, 0, sizeof p); p.type = CU_MEM_ALLOCATION_TYPE_PINNED; p.location.type = CU_MEM_LOCATION_TYPE_DEVICE; p.location.id = 0;
  cuMemGetAllocationGranularity(&g, &p, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
  cuMemAddressReserve(&va, 4 * g, 0, 0, 0); cuMemCreate(&h, g, &p, 0); cuMemMap(va, g, 0, h, 0);
  CUmemAccessDesc a = { .location = p.location, .flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE }; cuMemSetAccess(va, g, &a, 1);
  char buf[64] = "hello", back[64] = {0};
  int mapped = cuMemcpyHtoD(va, buf, 64);
  int roundtrip = cuMemcpyDtoH(back, va, 64) == CUDA_SUCCESS && !strcmp(back, "hello");
  int copy = cuMemcpyHtoD(va + 2 * g, buf, 64);
  int set = cuMemsetD8(va + 3 * g, 0, 64);
  printf("{\"check\":\"vmm\",\"mapped\":%d,\"roundtrip\":%d,\"unmapped_copy\":%d,\"unmapped_memset\":%d}\n",
         mapped, roundtrip, copy, set);
  return 0; }
