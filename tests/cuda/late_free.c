/* Frees device memory from an exit handler registered before cuInit, so it runs after the
 * shim's (and simgpu's) own exit handler: that memory must not be returned to the quota twice. */
#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>
static CUdeviceptr p;
static void late(void) { cuMemFree(p); }   /* runs after libshare's exit handler */
int main() {
  atexit(late);
  CUdevice d; CUcontext c;
  cuInit(0); cuDeviceGet(&d, 0); cuDevicePrimaryCtxRetain(&c, d); cuCtxSetCurrent(c);
  printf("alloc %d\n", cuMemAlloc(&p, 200 << 20));
  return 0; }
