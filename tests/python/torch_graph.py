"""PyTorch CUDA graphs on simgpu: capture a Linear layer with torch.cuda.graph, replay it, and
check that replays take the captured kernels' modelled time and that the captured copy of new
input data (a static input buffer, as CUDA-graph users do) reaches the device at replay."""
import json, torch

m = torch.nn.Linear(256, 256).cuda()
static_in = torch.zeros(64, 256, device="cuda")
s = torch.cuda.Stream()
s.wait_stream(torch.cuda.current_stream())
with torch.cuda.stream(s):
    for _ in range(3):  # warm-up outside the capture, as PyTorch requires
        m(static_in)
torch.cuda.current_stream().wait_stream(s)

g = torch.cuda.CUDAGraph()
with torch.cuda.graph(g):
    static_out = m(static_in)

new = torch.full((64, 256), 3.0)
static_in.copy_(new)  # a plain copy into the captured input, then replay
a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
a.record()
for _ in range(10):
    g.replay()
b.record()
torch.cuda.synchronize()
print(json.dumps({"check": "graph", "ok": True, "replay_ms": a.elapsed_time(b),
                  "input_roundtrip": bool(torch.equal(static_in.cpu(), new)),
                  "out_shape": list(static_out.shape)}))

# The graph goes first, then the tensor made during capture: with the cudaMallocAsync backend
# that tensor's memory is a graph allocation, freed after its graph is gone (legal in CUDA).
del g
del static_out
torch.cuda.synchronize()
after = torch.empty(1 << 20, device="cuda")
torch.cuda.synchronize()
print(json.dumps({"check": "graph_freed", "ok": True, "free_total": list(torch.cuda.mem_get_info())}))
