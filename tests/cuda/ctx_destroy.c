/* A created context is destroyed with 300 MiB still allocated: the driver frees them, and the
 * shim returns them to the quota (driver API, linked with -lcuda). */
#include <cuda.h>
#include <stdio.h>
int main() {
  CUdevice d; CUcontext c; CUdeviceptr p; size_t f0, f1, f2, t;
  cuInit(0); cuDeviceGet(&d, 0); cuCtxCreate(&c, NULL, 0, d);
  cuMemGetInfo(&f0, &t); cuMemAlloc(&p, 300 << 20); cuMemGetInfo(&f1, &t);
  cuCtxDestroy(c);
  CUcontext c2; cuCtxCreate(&c2, NULL, 0, d); cuMemGetInfo(&f2, &t);
  printf("{\"check\":\"ctx_destroy\",\"before\":%zu,\"allocated\":%zu,\"after_destroy\":%zu}\n", f0 >> 20, f1 >> 20, f2 >> 20);
  return 0; }
