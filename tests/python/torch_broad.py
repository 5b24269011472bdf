"""A broad PyTorch workload on simgpu: what real training and inference scripts use beyond the smoke
test (cuDNN convolutions and RNNs, mixed precision, Adam, pinned-memory copies, several streams,
memory statistics, cuSOLVER, attention, RNG, torch.compile through Triton). Kernels do not compute
on simgpu: only success and shapes are checked. One JSON line per step."""
import json, time
import torch, torch.nn as nn, torch.nn.functional as F
dev = 'cuda'
def step(name, f):
    t = time.time()
    try:
        f()
        print(json.dumps({"step": name, "ok": True, "s": round(time.time() - t, 2)}))
    except Exception as e:
        print(json.dumps({"step": name, "ok": False, "error": f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"}))
def conv():
    m = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(), nn.Linear(16*16*16, 10)).to(dev)
    x = torch.randn(8, 3, 32, 32, device=dev); y = torch.randint(0, 10, (8,), device=dev)
    opt = torch.optim.Adam(m.parameters())
    for _ in range(2):
        opt.zero_grad(); loss = F.cross_entropy(m(x), y); loss.backward(); opt.step()
    torch.cuda.synchronize()
step("conv2d+bn+adam", conv)
def amp():
    m = nn.Linear(64, 64).to(dev); opt = torch.optim.SGD(m.parameters(), lr=0.1); scaler = torch.amp.GradScaler()
    with torch.autocast('cuda', dtype=torch.float16):
        loss = m(torch.randn(32, 64, device=dev)).float().pow(2).mean()
    scaler.scale(loss).backward(); scaler.step(opt); scaler.update(); torch.cuda.synchronize()
step("amp fp16 + GradScaler", amp)
def bf16():
    a = torch.randn(128, 128, device=dev, dtype=torch.bfloat16); (a @ a).sum().item()
step("bf16 matmul", bf16)
def pinned():
    x = torch.randn(1024, 1024).pin_memory(); y = x.to(dev, non_blocking=True); torch.cuda.synchronize(); assert torch.equal(y.cpu(), x)
step("pinned non_blocking copy roundtrip", pinned)
def streams():
    s1, s2 = torch.cuda.Stream(), torch.cuda.Stream()
    with torch.cuda.stream(s1): a = torch.ones(1000, device=dev) * 2
    s2.wait_stream(s1)
    with torch.cuda.stream(s2): b = a + 1
    torch.cuda.synchronize()
step("multi-stream", streams)
def memstats():
    x = torch.empty(64 << 20, dtype=torch.uint8, device=dev)
    assert torch.cuda.memory_allocated() >= 64 << 20; torch.cuda.max_memory_allocated(); torch.cuda.memory_stats(); torch.cuda.memory_summary()
    del x; torch.cuda.empty_cache(); torch.cuda.reset_peak_memory_stats()
step("memory stats", memstats)
def ops():
    x = torch.randn(1000, device=dev)
    torch.sort(x); torch.topk(x, 5); torch.cumsum(x, 0); x.sum(); x.max(); torch.unique(x.round()); x[x > 0]; torch.nonzero(x > 0)
    torch.linalg.norm(x)
step("misc ops (sort/topk/unique/masked)", ops)
def linalg():
    a = torch.randn(32, 32, device=dev); torch.linalg.inv(a + 32 * torch.eye(32, device=dev)); torch.linalg.svd(a)
step("linalg inv/svd (cusolver)", linalg)
def sdpa():
    q = torch.randn(2, 4, 128, 64, device=dev, dtype=torch.float16); F.scaled_dot_product_attention(q, q, q); torch.cuda.synchronize()
step("scaled_dot_product_attention fp16", sdpa)
def rnn():
    m = nn.LSTM(32, 64, batch_first=True).to(dev); m(torch.randn(4, 10, 32, device=dev))[0].sum().backward()
step("LSTM (cudnn rnn)", rnn)
def embed():
    e = nn.Embedding(1000, 64).to(dev); e(torch.randint(0, 1000, (16, 8), device=dev)).sum().backward()
step("embedding", embed)
def compiled():
    f = torch.compile(lambda x: torch.sin(x) + torch.cos(x)); f(torch.randn(100, device=dev)); torch.cuda.synchronize()
step("torch.compile (triton)", compiled)
def rng():
    torch.manual_seed(0); torch.cuda.manual_seed_all(0); torch.rand(10, device=dev); torch.randperm(100, device=dev); torch.multinomial(torch.ones(10, device=dev), 3)
step("rng", rng)
def props():
    torch.cuda.get_device_capability(); torch.cuda.get_device_name(); torch.cuda.device_count(); torch.cuda.current_device()
    torch.cuda.utilization()  # through NVML
step("props/utilization(nvml)", props)
