// CUDA graphs the way simpleCudaGraphs and graph-updating applications use them, through the
// CUDA 13.5 runtime: stream capture with fork/join, explicit graphs, cudaGraphExecUpdate,
// cudaGraphExec*SetParams, node parameter queries, memory alloc/free nodes, child graphs, event
// nodes, conditional nodes, enabling/disabling nodes. Only bytes moved by copies and memsets and
// host nodes are checked (kernels do not compute on simgpu).
// Prints {"check":"graphs", ...}; "FAIL ..." and exit 1 on any unexpected error.
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "check.h"

__global__ void scale(float *x, float f, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] *= f;
}

static int all(const unsigned char *p, size_t n, unsigned char v) {
    for (size_t i = 0; i < n; i++)
        if (p[i] != v) return 0;
    return 1;
}

static volatile int host_seen = 0;
static void CUDART_CB host_set(void *arg) { host_seen = (int)(size_t)arg; }

// Captures: h2d copy of `in` -> kernel -> (fork) memset of the second half to `v` on s2 (join)
// -> d2h copy into `out`.
static cudaGraph_t capture(cudaStream_t s1, cudaStream_t s2, unsigned char *d, const unsigned char *in,
                           unsigned char *out, size_t n, int v, cudaEvent_t fork, cudaEvent_t join) {
    cudaGraph_t g;
    CHECK(cudaStreamBeginCapture(s1, cudaStreamCaptureModeGlobal));
    CHECK(cudaMemcpyAsync(d, in, n, cudaMemcpyHostToDevice, s1));
    scale<<<(unsigned)(n / 4 / 256), 256, 0, s1>>>((float *)d, 2.0f, (int)(n / 4));
    CHECK(cudaEventRecord(fork, s1));
    CHECK(cudaStreamWaitEvent(s2, fork, 0));
    CHECK(cudaMemsetAsync(d + n / 2, v, n / 2, s2));
    CHECK(cudaEventRecord(join, s2));
    CHECK(cudaStreamWaitEvent(s1, join, 0));
    CHECK(cudaMemcpyAsync(out, d, n, cudaMemcpyDeviceToHost, s1));
    CHECK(cudaStreamEndCapture(s1, &g));
    return g;
}

int main(void) {
    const size_t n = 1 << 20;
    unsigned char *in, *out, *out2, *d, *d2;
    CHECK(cudaMallocHost(&in, n));
    CHECK(cudaMallocHost(&out, n));
    CHECK(cudaMallocHost(&out2, n));
    CHECK(cudaMalloc(&d, n));
    CHECK(cudaMalloc(&d2, n));
    cudaStream_t s1, s2;
    CHECK(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking));
    CHECK(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking));
    cudaEvent_t fork, join;
    CHECK(cudaEventCreateWithFlags(&fork, cudaEventDisableTiming));
    CHECK(cudaEventCreateWithFlags(&join, cudaEventDisableTiming));

    // 1. Capture, instantiate, launch.
    memset(in, 1, n);
    cudaGraph_t g1 = capture(s1, s2, d, in, out, n, 2, fork, join);
    size_t nodes = 0;
    CHECK(cudaGraphGetNodes(g1, NULL, &nodes));
    size_t edges = 0;
    CHECK(cudaGraphGetEdges(g1, NULL, NULL, NULL, &edges));
    cudaGraphExec_t exec;
    CHECK(cudaGraphInstantiate(&exec, g1, 0));
    CHECK(cudaGraphUpload(exec, s1));
    CHECK(cudaGraphLaunch(exec, s1));
    CHECK(cudaStreamSynchronize(s1));
    int capture_ok = all(out, n / 2, 1) && all(out + n / 2, n / 2, 2);

    // 2. Capture again with other buffers and values, update the executable graph in place.
    memset(in, 3, n);
    cudaGraph_t g2 = capture(s1, s2, d2, in, out2, n, 4, fork, join);
    cudaGraphExecUpdateResultInfo info;
    memset(&info, 0xff, sizeof info);
    CHECK(cudaGraphExecUpdate(exec, g2, &info));
    int update_result = (int)info.result;
    memset(out, 0, n);
    CHECK(cudaGraphLaunch(exec, s1));
    CHECK(cudaStreamSynchronize(s1));
    int update_ok = all(out2, n / 2, 3) && all(out2 + n / 2, n / 2, 4) && all(out, n, 0);
    // A graph of another shape cannot update it: cudaErrorGraphExecUpdateFailure, topology changed.
    cudaGraph_t g3;
    CHECK(cudaGraphCreate(&g3, 0));
    cudaGraphNode_t lone;
    CHECK(cudaGraphAddEmptyNode(&lone, g3, NULL, 0));
    memset(&info, 0, sizeof info);
    int topo_err = (int)cudaGraphExecUpdate(exec, g3, &info);
    int topo_result = (int)info.result;
    cudaGetLastError();

    // 3. Explicit graph: memset -> kernel -> copy -> host; then per-node exec updates.
    cudaGraph_t g;
    CHECK(cudaGraphCreate(&g, 0));
    cudaGraphNode_t nset, nker, ncpy, nhost;
    cudaMemsetParams mp = {};
    mp.dst = d;
    mp.value = 5;
    mp.elementSize = 4;
    mp.width = n / 4;
    mp.height = 1;
    CHECK(cudaGraphAddMemsetNode(&nset, g, NULL, 0, &mp));
    float f = 3.0f;
    int cnt = (int)(n / 4);
    float *df = (float *)d;
    void *kargs[] = {&df, &f, &cnt};
    cudaKernelNodeParams kp = {};
    kp.func = (void *)scale;
    kp.gridDim = dim3((unsigned)(n / 4 / 256));
    kp.blockDim = dim3(256);
    kp.kernelParams = kargs;
    CHECK(cudaGraphAddKernelNode(&nker, g, &nset, 1, &kp));
    CHECK(cudaGraphAddMemcpyNode1D(&ncpy, g, &nker, 1, out, d, n, cudaMemcpyDeviceToHost));
    cudaHostNodeParams hp = {host_set, (void *)7};
    CHECK(cudaGraphAddHostNode(&nhost, g, &ncpy, 1, &hp));
    cudaGraphNodeType type;
    CHECK(cudaGraphNodeGetType(ncpy, &type));
    EXPECT(type == cudaGraphNodeTypeMemcpy, "node type %d", (int)type);
    cudaKernelNodeParams kq = {};
    CHECK(cudaGraphKernelNodeGetParams(nker, &kq));
    EXPECT(kq.func == (void *)scale && kq.gridDim.x == n / 4 / 256 && kq.blockDim.x == 256, "kernel node params");
    cudaMemsetParams mq = {};
    CHECK(cudaGraphMemsetNodeGetParams(nset, &mq));
    EXPECT(mq.dst == d && mq.value == 5 && mq.elementSize == 4 && mq.width == n / 4, "memset node params");
    cudaMemcpy3DParms cq = {};
    CHECK(cudaGraphMemcpyNodeGetParams(ncpy, &cq));
    EXPECT(cq.dstPtr.ptr == out && cq.srcPtr.ptr == d && cq.extent.width == n, "memcpy node params");
    cudaHostNodeParams hq = {};
    CHECK(cudaGraphHostNodeGetParams(nhost, &hq));
    EXPECT(hq.fn == host_set && hq.userData == (void *)7, "host node params");
    size_t ndeps = 0, ndependents = 0;
    CHECK(cudaGraphNodeGetDependencies(nker, NULL, NULL, &ndeps));
    CHECK(cudaGraphNodeGetDependentNodes(nker, NULL, NULL, &ndependents));
    EXPECT(ndeps == 1 && ndependents == 1, "deps %zu dependents %zu", ndeps, ndependents);
    cudaGraphExec_t ex;
    CHECK(cudaGraphInstantiateWithFlags(&ex, g, cudaGraphInstantiateFlagAutoFreeOnLaunch));
    CHECK(cudaGraphLaunch(ex, s1));
    CHECK(cudaStreamSynchronize(s1));
    unsigned char five[4] = {5, 0, 0, 0};
    int explicit_ok = host_seen == 7;
    for (size_t i = 0; i < n; i++) explicit_ok &= out[i] == five[i % 4];
    // Update the instantiated nodes: memset value, copy destination, host argument, kernel grid.
    mp.value = 0x09090909;
    CHECK(cudaGraphExecMemsetNodeSetParams(ex, nset, &mp));
    memset(out, 0, n);
    CHECK(cudaGraphExecMemcpyNodeSetParams1D(ex, ncpy, out2, d, n, cudaMemcpyDeviceToHost));
    hp.userData = (void *)8;
    CHECK(cudaGraphExecHostNodeSetParams(ex, nhost, &hp));
    kp.gridDim = dim3(1);
    CHECK(cudaGraphExecKernelNodeSetParams(ex, nker, &kp));
    CHECK(cudaGraphLaunch(ex, s1));
    CHECK(cudaStreamSynchronize(s1));
    int exec_set_ok = host_seen == 8 && all(out2, n, 9) && all(out, n, 0);
    // The graph itself was not changed: a new instance copies into `out` again.
    cudaGraphExec_t ex2;
    CHECK(cudaGraphInstantiate(&ex2, g, 0));
    CHECK(cudaGraphLaunch(ex2, s1));
    CHECK(cudaStreamSynchronize(s1));
    int graph_unchanged = host_seen == 7 && out[0] == 5;
    // Node setters on the graph, then a whole-graph update from it.
    CHECK(cudaGraphMemcpyNodeSetParams1D(ncpy, out, d2, n, cudaMemcpyDeviceToHost));
    CHECK(cudaGraphKernelNodeSetParams(nker, &kp));
    mp.dst = d2;
    mp.value = 0x0b0b0b0b;
    CHECK(cudaGraphMemsetNodeSetParams(nset, &mp));
    CHECK(cudaGraphExecUpdate(ex2, g, &info));
    CHECK(cudaGraphLaunch(ex2, s1));
    CHECK(cudaStreamSynchronize(s1));
    int node_set_ok = all(out, n, 0x0b);
    // Disable the memcpy node in the instance: nothing copied.
    CHECK(cudaGraphNodeSetEnabled(ex2, ncpy, 0));
    unsigned enabled = 9;
    CHECK(cudaGraphNodeGetEnabled(ex2, ncpy, &enabled));
    memset(out, 0, n);
    CHECK(cudaGraphLaunch(ex2, s1));
    CHECK(cudaStreamSynchronize(s1));
    int disabled_ok = enabled == 0 && all(out, n, 0);

    // 4. Memory nodes: alloc -> memset -> copy out -> free, launched twice.
    cudaGraph_t gm;
    CHECK(cudaGraphCreate(&gm, 0));
    cudaMemAllocNodeParams ap = {};
    ap.poolProps.allocType = cudaMemAllocationTypePinned;
    ap.poolProps.location.type = cudaMemLocationTypeDevice;
    ap.poolProps.location.id = 0;
    ap.bytesize = n;
    cudaGraphNode_t nalloc, nms, ncp, nfree;
    CHECK(cudaGraphAddMemAllocNode(&nalloc, gm, NULL, 0, &ap));
    EXPECT(ap.dptr != NULL, "alloc node address");
    cudaMemsetParams mp2 = {};
    mp2.dst = ap.dptr;
    mp2.value = 0x44;
    mp2.elementSize = 1;
    mp2.width = n;
    mp2.height = 1;
    CHECK(cudaGraphAddMemsetNode(&nms, gm, &nalloc, 1, &mp2));
    CHECK(cudaGraphAddMemcpyNode1D(&ncp, gm, &nms, 1, out, ap.dptr, n, cudaMemcpyDeviceToHost));
    CHECK(cudaGraphAddMemFreeNode(&nfree, gm, &ncp, 1, ap.dptr));
    cudaMemAllocNodeParams aq = {};
    CHECK(cudaGraphMemAllocNodeGetParams(nalloc, &aq));
    void *freed = NULL;
    CHECK(cudaGraphMemFreeNodeGetParams(nfree, &freed));
    EXPECT(aq.bytesize == n && aq.dptr == ap.dptr && freed == ap.dptr, "mem node params");
    cudaGraphExec_t exm;
    CHECK(cudaGraphInstantiate(&exm, gm, 0));
    int mem_ok = 1;
    for (int i = 0; i < 2; i++) {
        memset(out, 0, n);
        CHECK(cudaGraphLaunch(exm, s1));
        CHECK(cudaStreamSynchronize(s1));
        mem_ok &= all(out, n, 0x44);
    }
    size_t used = 0;
    CHECK(cudaDeviceGetGraphMemAttribute(0, cudaGraphMemAttrUsedMemCurrent, &used));
    CHECK(cudaDeviceGraphMemTrim(0));

    // 5. Child graph and event nodes: record in the parent, wait, child copies.
    cudaGraph_t child, parent;
    CHECK(cudaGraphCreate(&child, 0));
    cudaGraphNode_t c1, c2;
    mp2.dst = d;
    mp2.value = 0x54;
    CHECK(cudaGraphAddMemsetNode(&c1, child, NULL, 0, &mp2));
    mp2.value = 0x55;
    CHECK(cudaGraphMemsetNodeSetParams(c1, &mp2));
    CHECK(cudaGraphAddMemcpyNode1D(&c2, child, &c1, 1, out, d, n, cudaMemcpyDeviceToHost));
    CHECK(cudaGraphCreate(&parent, 0));
    cudaEvent_t gev;
    CHECK(cudaEventCreate(&gev));
    cudaGraphNode_t pchild, prec, pwait;
    CHECK(cudaGraphAddChildGraphNode(&pchild, parent, NULL, 0, child));
    CHECK(cudaGraphAddEventRecordNode(&prec, parent, &pchild, 1, gev));
    CHECK(cudaGraphAddEventWaitNode(&pwait, parent, &prec, 1, gev));
    cudaGraph_t embedded;
    CHECK(cudaGraphChildGraphNodeGetGraph(pchild, &embedded));
    cudaGraphExec_t exp;
    CHECK(cudaGraphInstantiate(&exp, parent, 0));
    memset(out, 0, n);
    CHECK(cudaGraphLaunch(exp, s1));
    CHECK(cudaEventSynchronize(gev));
    CHECK(cudaStreamSynchronize(s1));
    int child_ok = all(out, n, 0x55);

    // 6. Conditional IF nodes (cudaGraphAddNode): the condition is the handle's default value,
    //    assigned at every launch; one body runs, the other does not.
    int cond_err = 0, cond_ok = 0;
    {
        cudaGraph_t gc;
        CHECK(cudaGraphCreate(&gc, 0));
        cudaGraphConditionalHandle yes, no;
        CHECK(cudaGraphConditionalHandleCreate(&yes, gc, 1, cudaGraphCondAssignDefault));
        CHECK(cudaGraphConditionalHandleCreate(&no, gc, 0, cudaGraphCondAssignDefault));
        cudaGraphNodeParams cp = {};
        cp.type = cudaGraphNodeTypeConditional;
        cp.conditional.handle = yes;
        cp.conditional.type = cudaGraphCondTypeIf;
        cp.conditional.size = 1;
        cudaGraphNode_t cy, cn;
        CHECK(cudaGraphAddNode(&cy, gc, NULL, NULL, 0, &cp));
        cudaGraph_t body_yes = cp.conditional.phGraph_out[0];
        cudaGraphNodeParams cp2 = {};
        cp2.type = cudaGraphNodeTypeConditional;
        cp2.conditional.handle = no;
        cp2.conditional.type = cudaGraphCondTypeIf;
        cp2.conditional.size = 1;
        CHECK(cudaGraphAddNode(&cn, gc, &cy, NULL, 1, &cp2));
        cudaGraph_t body_no = cp2.conditional.phGraph_out[0];
        cudaGraphNode_t b1, b2;
        cudaMemsetParams my = {};
        my.dst = d;
        my.value = 0x66;
        my.elementSize = 1;
        my.width = n / 2;
        my.height = 1;
        CHECK(cudaGraphAddMemsetNode(&b1, body_yes, NULL, 0, &my));
        my.dst = d + n / 2;
        my.value = 0x77;
        CHECK(cudaGraphAddMemsetNode(&b2, body_no, NULL, 0, &my));
        cudaGraphExec_t exc;
        CHECK(cudaMemset(d, 0, n));
        CHECK(cudaGraphInstantiate(&exc, gc, 0));
        CHECK(cudaGraphLaunch(exc, s1));
        CHECK(cudaStreamSynchronize(s1));
        CHECK(cudaMemcpy(out, d, n, cudaMemcpyDeviceToHost));
        cond_ok = all(out, n / 2, 0x66) && all(out + n / 2, n / 2, 0);
        CHECK(cudaGraphExecDestroy(exc));
        CHECK(cudaGraphDestroy(gc));
    }

    // 7. Capture into an existing graph, stream-ordered allocation inside a capture.
    cudaGraph_t gx;
    CHECK(cudaGraphCreate(&gx, 0));
    CHECK(cudaStreamBeginCaptureToGraph(s1, gx, NULL, NULL, 0, cudaStreamCaptureModeRelaxed));
    void *tmp;
    CHECK(cudaMallocAsync(&tmp, n, s1));
    CHECK(cudaMemsetAsync(tmp, 0x12, n, s1));
    CHECK(cudaMemcpyAsync(out, tmp, n, cudaMemcpyDeviceToHost, s1));
    CHECK(cudaFreeAsync(tmp, s1));
    cudaGraph_t gx2;
    CHECK(cudaStreamEndCapture(s1, &gx2));
    EXPECT(gx2 == gx, "capture to graph returned another graph");
    cudaGraphExec_t exx;
    CHECK(cudaGraphInstantiate(&exx, gx, 0));
    memset(out, 0, n);
    CHECK(cudaGraphLaunch(exx, s1));
    CHECK(cudaStreamSynchronize(s1));
    int capture_alloc_ok = all(out, n, 0x12);

    CHECK(cudaGraphExecDestroy(exec));
    CHECK(cudaGraphExecDestroy(ex));
    CHECK(cudaGraphExecDestroy(ex2));
    CHECK(cudaGraphExecDestroy(exm));
    CHECK(cudaGraphExecDestroy(exp));
    CHECK(cudaGraphExecDestroy(exx));
    CHECK(cudaGraphDestroy(g1));
    CHECK(cudaGraphDestroy(g2));
    CHECK(cudaGraphDestroy(g3));
    CHECK(cudaGraphDestroy(g));
    CHECK(cudaGraphDestroy(gm));
    CHECK(cudaGraphDestroy(parent));
    CHECK(cudaGraphDestroy(child));
    CHECK(cudaGraphDestroy(gx));
    CHECK(cudaDeviceSynchronize());
    printf("{\"check\":\"graphs\",\"nodes\":%zu,\"edges\":%zu,\"capture_ok\":%d,\"update_result\":%d,"
           "\"update_ok\":%d,\"topo_err\":%d,\"topo_result\":%d,\"explicit_ok\":%d,\"exec_set_ok\":%d,"
           "\"graph_unchanged\":%d,\"node_set_ok\":%d,\"disabled_ok\":%d,\"mem_ok\":%d,\"child_ok\":%d,"
           "\"cond_ok\":%d,\"cond_err\":%d,\"capture_alloc_ok\":%d}\n",
           nodes, edges, capture_ok, update_result, update_ok, topo_err, topo_result, explicit_ok, exec_set_ok,
           graph_unchanged, node_set_ok, disabled_ok, mem_ok, child_ok, cond_ok, cond_err, capture_alloc_ok);
    return 0;
}
