"""Common PyTorch features beyond torch_broad.py, on simgpu: the profiler (CUPTI), NVTX, TorchScript
(NVRTC fusers), cuSPARSE, cuSOLVER, CUB, cuDNN benchmark mode, AMP, torch.compile with CUDA graphs,
each SDPA backend, memory history, memory fraction, stream priorities, IPC events, NVML queries,
the caching allocator API, DataLoader workers with pinned memory, jiterator, expandable segments.

Kernels do not compute on simgpu: only success, shapes and dtypes are checked, never values.
One JSON line per step: {"step", "ok"} plus "error" or step details."""
import json, os, sys, time
import torch, torch.nn as nn, torch.nn.functional as F

dev = 'cuda'


def step(name, f):
    t = time.time()
    try:
        extra = f() or {}
        print(json.dumps({"step": name, "ok": True, "s": round(time.time() - t, 2), **extra}), flush=True)
    except Exception as e:
        print(json.dumps({"step": name, "ok": False, "error": f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"}), flush=True)


def check(t, shape, dtype=torch.float32):
    assert t.device.type == 'cuda', t.device
    assert tuple(t.shape) == tuple(shape), (tuple(t.shape), shape)
    assert t.dtype == dtype, (t.dtype, dtype)


def profiler():
    from torch.profiler import profile, ProfilerActivity, record_function, schedule
    m = nn.Linear(64, 64).to(dev)
    x = torch.randn(32, 64, device=dev)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], record_shapes=True, profile_memory=True) as prof:
        with record_function("fwd_bwd"):
            m(x).sum().backward()
        torch.cuda.synchronize()
    names = {e.key for e in prof.key_averages()}
    assert "fwd_bwd" in names and "aten::addmm" in names, sorted(names)[:20]
    prof.key_averages().table(sort_by="cuda_time_total", row_limit=5)
    path = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"simgpu-trace-{os.getpid()}.json")
    prof.export_chrome_trace(path)
    with open(path) as f:
        trace = json.load(f)
    os.unlink(path)
    assert trace["deviceProperties"][0]["numSms"] == torch.cuda.get_device_properties(0).multi_processor_count
    # A schedule, as training loops use it.
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], schedule=schedule(wait=1, warmup=1, active=2)) as p:
        for _ in range(5):
            m(x).sum().backward()
            p.step()
    with torch.autograd.profiler.emit_nvtx():
        m(x)
    cuda_events = sum(1 for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA)
    return {"cuda_events": cuda_events}


def nvtx():
    torch.cuda.nvtx.range_push("a")
    torch.ones(3, device=dev)
    torch.cuda.nvtx.range_pop()
    with torch.cuda.nvtx.range("b"):
        torch.ones(3, device=dev)
    torch.cuda.nvtx.mark("m")


def jit():
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.l = nn.Linear(16, 16)

        def forward(self, x):
            return torch.relu(self.l(x)) * 2 + 1

    m = M().to(dev)
    x = torch.randn(8, 16, device=dev)
    sm, tm = torch.jit.script(m), torch.jit.trace(m, x)

    @torch.jit.script
    def fused(a, b):
        return (a * b + a).sigmoid() * b.tanh()

    for _ in range(4):  # the profiling executor fuses (NVRTC) after a few runs
        check(sm(x), (8, 16)); check(tm(x), (8, 16)); check(fused(x, x), (8, 16))
    check(fused(x.half(), x.half()), (8, 16), torch.float16)
    torch.cuda.synchronize()


def sparse():
    a = torch.randn(64, 64, device=dev)
    a = a * (torch.rand(64, 64, device=dev) < 0.1)
    d = torch.randn(64, 8, device=dev)
    s = a.to_sparse()
    check(torch.sparse.mm(s, d), (64, 8))
    csr = a.to_sparse_csr()
    assert csr.layout == torch.sparse_csr
    check(csr @ d, (64, 8))
    check(torch.sparse.addmm(torch.zeros(64, 8, device=dev), s, d), (64, 8))
    check((s + s).coalesce().to_dense(), (64, 64))
    check(csr.to_dense(), (64, 64))
    idx = torch.tensor([[0, 1, 2], [2, 0, 1]], device=dev)
    coo = torch.sparse_coo_tensor(idx, torch.ones(3, device=dev), (3, 3))
    check(torch.sparse.sum(coo, dim=1).to_dense(), (3,))
    torch.cuda.synchronize()


def linalg():
    n = 16
    a = torch.randn(n, n, device=dev)
    spd = a @ a.T + n * torch.eye(n, device=dev)
    b = torch.randn(n, 2, device=dev)
    u, s, vh = torch.linalg.svd(a)
    check(u, (n, n)); check(s, (n,)); check(vh, (n, n))
    w, v = torch.linalg.eigh(spd)
    check(w, (n,)); check(v, (n, n))
    check(torch.linalg.eigvalsh(spd), (n,))
    check(torch.linalg.solve(spd, b), (n, 2))
    check(torch.linalg.cholesky(spd), (n, n))
    q, r = torch.linalg.qr(a)
    check(q, (n, n)); check(r, (n, n))
    check(torch.linalg.lstsq(a, b).solution, (n, 2))
    check(torch.linalg.det(a), ())
    check(torch.linalg.inv(spd), (n, n))
    check(torch.linalg.pinv(a), (n, n))
    check(torch.linalg.matrix_norm(a), ())
    batch = torch.randn(4, 8, 8, device=dev)
    check(torch.linalg.svd(batch)[1], (4, 8))
    check(torch.linalg.solve(batch, torch.randn(4, 8, device=dev)), (4, 8))
    lu, piv = torch.linalg.lu_factor(batch)
    check(lu, (4, 8, 8)); check(piv, (4, 8), torch.int32)
    check(torch.cholesky_solve(b, torch.linalg.cholesky(spd)), (n, 2))
    check(torch.linalg.svd(a.double())[1], (n,), torch.float64)
    torch.cuda.synchronize()


def cub():
    x = torch.randn(10000, device=dev)
    i = torch.randint(0, 100, (10000,), device=dev)
    check(torch.sort(x)[0], (10000,)); check(torch.sort(x)[1], (10000,), torch.int64)
    check(torch.topk(x, 10)[0], (10,))
    u, inv, cnt = torch.unique(i, return_inverse=True, return_counts=True)
    assert u.dim() == 1 and inv.shape == i.shape and cnt.shape == u.shape
    nz = torch.nonzero(x > 0)
    assert nz.dim() == 2 and nz.shape[1] == 1
    check(torch.multinomial(torch.rand(4, 100, device=dev), 5, replacement=True), (4, 5), torch.int64)
    check(torch.multinomial(torch.rand(100, device=dev), 5), (5,), torch.int64)
    assert torch.bincount(i).dim() == 1
    check(torch.cumsum(x, 0), (10000,)); check(torch.cumprod(x, 0), (10000,))
    check(torch.argsort(i, stable=True), (10000,), torch.int64)
    assert torch.unique_consecutive(i).dim() == 1
    check(torch.histc(x), (100,))
    check(torch.searchsorted(torch.sort(x)[0], x), (10000,), torch.int64)
    assert x[x > 0].dim() == 1
    torch.cuda.synchronize()


def cudnn_benchmark():
    torch.backends.cudnn.benchmark = True
    try:
        m = nn.Sequential(nn.Conv2d(3, 16, 3), nn.ReLU(), nn.Conv2d(16, 8, 3, stride=2)).to(dev)
        x = torch.randn(4, 3, 32, 32, device=dev)
        y = m(x)
        check(y, (4, 8, 14, 14))
        y.sum().backward()
        m = m.to(memory_format=torch.channels_last)
        x = x.to(memory_format=torch.channels_last)
        with torch.autocast('cuda', dtype=torch.float16):
            y = m(x)
        check(y, (4, 8, 14, 14), torch.float16)
        assert y.is_contiguous(memory_format=torch.channels_last)
        y.float().sum().backward()
        torch.cuda.synchronize()
    finally:
        torch.backends.cudnn.benchmark = False


def amp_training():
    m = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 4)).to(dev)
    opt = torch.optim.AdamW(m.parameters())
    scaler = torch.amp.GradScaler('cuda')
    for _ in range(3):
        with torch.autocast('cuda', dtype=torch.float16):
            out = m(torch.randn(16, 32, device=dev))
            loss = F.cross_entropy(out, torch.randint(0, 4, (16,), device=dev))
        check(out, (16, 4), torch.float16)
        opt.zero_grad()
        scaler.scale(loss).backward()
        scaler.unscale_(opt)
        nn.utils.clip_grad_norm_(m.parameters(), 1.0)
        scaler.step(opt)
        scaler.update()
    torch.cuda.synchronize()


def compile_reduce_overhead():
    m = nn.Sequential(nn.Linear(32, 32), nn.GELU(), nn.Linear(32, 32)).to(dev)
    f = torch.compile(m, mode="reduce-overhead")
    x = torch.randn(8, 32, device=dev)
    for _ in range(4):  # warm-up, record the CUDA graph, replay it
        y = f(x)
    torch.cuda.synchronize()
    check(y, (8, 32))


def sdpa_backends():
    from torch.nn.attention import sdpa_kernel, SDPBackend
    q = torch.randn(2, 4, 128, 64, device=dev, dtype=torch.float16)
    done = []
    for b in [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.CUDNN_ATTENTION, SDPBackend.MATH]:
        with sdpa_kernel(b):
            qq = q.clone().requires_grad_()
            o = F.scaled_dot_product_attention(qq, qq, qq, is_causal=True)
            check(o, (2, 4, 128, 64), torch.float16)
            o.sum().backward()
            check(qq.grad, (2, 4, 128, 64), torch.float16)
        done.append(b.name)
    torch.cuda.synchronize()
    return {"backends": done}


def memory_history():
    torch.cuda.memory._record_memory_history(max_entries=1000)
    x = torch.randn(1000, device=dev)
    del x
    snap = torch.cuda.memory._snapshot()
    assert snap["segments"] and snap["device_traces"], list(snap)
    torch.cuda.memory._record_memory_history(enabled=None)


def memory_fraction():
    total = torch.cuda.get_device_properties(0).total_memory
    torch.cuda.set_per_process_memory_fraction(0.25)
    try:
        try:
            torch.empty(total // 2, dtype=torch.uint8, device=dev)
            raise AssertionError("allocation over the fraction succeeded")
        except torch.cuda.OutOfMemoryError:
            pass
        check(torch.empty(1 << 20, device=dev), (1 << 20,))
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0)
    try:
        torch.empty(1 << 41, dtype=torch.uint8, device=dev)
        raise AssertionError("2 TiB allocation succeeded")
    except torch.cuda.OutOfMemoryError:
        pass


def pinned():
    x = torch.randn(1 << 20).pin_memory()
    assert x.is_pinned()
    y = x.to(dev, non_blocking=True)
    z = torch.empty_like(x, pin_memory=True)
    z.copy_(y, non_blocking=True)
    torch.cuda.synchronize()
    assert torch.equal(z, x)  # copies move real bytes


def streams_events():
    lo, hi = torch.cuda.Stream.priority_range()
    s = torch.cuda.Stream(priority=-1)
    assert s.priority == max(-1, hi), (s.priority, lo, hi)
    with torch.cuda.stream(s):
        check(torch.ones(10, device=dev) + 1, (10,))
    s.synchronize()
    assert s.query()
    e = torch.cuda.Event(interprocess=True)
    e.record(s)
    e.synchronize()
    assert len(e.ipc_handle()) == 64
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record(); torch.ones(10, device=dev); b.record(); b.synchronize()
    assert a.elapsed_time(b) >= 0
    torch.cuda.Event(blocking=True).record()
    torch.cuda.ExternalStream(s.cuda_stream).synchronize()
    return {"priority_range": [lo, hi]}


def properties():
    p = torch.cuda.get_device_properties(0)
    assert (p.major, p.minor) == (8, 0) and p.multi_processor_count > 0 and p.total_memory > 0
    assert p.warp_size == 32 and p.L2_cache_size > 0 and p.max_threads_per_multi_processor == 2048
    assert len(str(p.uuid)) == 36 and p.name
    assert torch.cuda.is_bf16_supported() and 'sm_80' in torch.cuda.get_arch_list()
    free, total = torch.cuda.mem_get_info()
    assert 0 < free <= total
    return {"name": p.name}


def nvml():
    x = torch.empty(64 << 20, dtype=torch.uint8, device=dev)
    torch.cuda.synchronize()
    assert 0 <= torch.cuda.utilization() <= 100 and 0 <= torch.cuda.memory_usage() <= 100
    torch.cuda.temperature(); torch.cuda.power_draw()
    assert torch.cuda.clock_rate() > 0
    assert torch.cuda.device_memory_used() >= 64 << 20
    procs = torch.cuda.list_gpu_processes()
    assert str(os.getpid()) in procs, procs
    del x


def caching_allocator():
    p = torch.cuda.caching_allocator_alloc(1 << 20)
    torch.cuda.caching_allocator_delete(p)
    s = torch.cuda.Stream()
    p = torch.cuda.caching_allocator_alloc(4096, stream=s)
    torch.cuda.caching_allocator_delete(p)
    pool = torch.cuda.MemPool()
    with torch.cuda.use_mem_pool(pool):
        check(torch.randn(1000, device=dev), (1000,))
    x = torch.randn(4, device=dev)
    x.record_stream(s)


def dataloader():
    import torch.utils.data as tud
    ds = tud.TensorDataset(torch.randn(256, 16), torch.randint(0, 4, (256,)))
    dl = tud.DataLoader(ds, batch_size=32, shuffle=True, pin_memory=True, num_workers=2)
    m = nn.Linear(16, 4).to(dev)
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    n = 0
    for x, y in dl:
        assert x.is_pinned()
        x, y = x.to(dev, non_blocking=True), y.to(dev, non_blocking=True)
        opt.zero_grad()
        F.cross_entropy(m(x), y).backward()
        opt.step()
        n += 1
    torch.cuda.synchronize()
    assert n == 8


def jiterator_and_nvrtc():
    code = "template <typename T> T my_op(T x, T y, T alpha) { return -x + alpha * y; }"
    fn = torch.cuda.jiterator._create_jit_fn(code, alpha=1.0)
    a = torch.rand(100, device=dev)
    check(fn(a, a, alpha=2.0), (100,))
    check(torch.special.i1e(a), (100,))
    c = torch.randn(10, dtype=torch.complex64, device=dev)
    check(torch.tan(c), (10,), torch.complex64)
    torch.cuda.synchronize()


def graphed_callables():
    m = nn.Sequential(nn.Linear(16, 16), nn.ReLU()).to(dev)
    x = torch.randn(4, 16, device=dev, requires_grad=True)
    g = torch.cuda.make_graphed_callables(m, (x,))
    y = g(x)
    check(y, (4, 16))
    y.sum().backward()
    torch.cuda.synchronize()


def nn_layers():
    x = torch.randn(2, 3, 16, 16, device=dev)
    check(F.interpolate(x, scale_factor=2, mode='bilinear'), (2, 3, 32, 32))
    check(F.interpolate(x, size=(7, 7), mode='bicubic', antialias=True), (2, 3, 7, 7))
    check(F.grid_sample(x, torch.rand(2, 8, 8, 2, device=dev) * 2 - 1, align_corners=False), (2, 3, 8, 8))
    check(nn.Conv3d(3, 4, 3).to(dev)(torch.randn(1, 3, 8, 8, 8, device=dev)), (1, 4, 6, 6, 6))
    check(nn.ConvTranspose2d(3, 4, 3, stride=2).to(dev)(x), (2, 4, 33, 33))
    eb = nn.EmbeddingBag(100, 8, mode='mean').to(dev)
    check(eb(torch.randint(0, 100, (20,), device=dev), torch.tensor([0, 5, 10], device=dev)), (3, 8))
    lp = torch.randn(30, 2, 10, device=dev).log_softmax(2)
    F.ctc_loss(lp, torch.randint(1, 10, (2, 5), device=dev), torch.tensor([30, 30]), torch.tensor([5, 5]))
    enc = nn.TransformerEncoder(nn.TransformerEncoderLayer(32, 4, 64, batch_first=True), 2).to(dev).eval()
    with torch.no_grad():
        check(enc(torch.randn(2, 10, 32, device=dev)), (2, 10, 32))
    check(nn.GRU(8, 16, 2, bidirectional=True).to(dev)(torch.randn(5, 3, 8, device=dev))[0], (5, 3, 32))
    lin = nn.Linear(8, 8).to(dev)
    torch.utils.checkpoint.checkpoint(lin, torch.randn(2, 8, device=dev, requires_grad=True), use_reentrant=False).sum().backward()
    a, w, b = torch.randn(64, 128, device=dev), torch.randn(256, 128, device=dev), torch.randn(256, device=dev)
    check(torch._addmm_activation(b, a, w.t(), use_gelu=True), (64, 256))
    torch.cuda.synchronize()


def rng():
    s = torch.cuda.get_rng_state()
    torch.rand(3, device=dev)
    torch.cuda.set_rng_state(s)
    g = torch.Generator(device=dev)
    g.manual_seed(1)
    check(torch.randn(3, device=dev, generator=g), (3,))


def expandable_segments():
    torch.cuda.empty_cache()
    torch.cuda.memory._set_allocator_settings("expandable_segments:True")
    try:
        x = torch.empty(300 << 20, dtype=torch.uint8, device=dev)
        y = torch.empty(100 << 20, dtype=torch.uint8, device=dev)
        del x, y
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
    finally:
        torch.cuda.memory._set_allocator_settings("expandable_segments:False")


# The steps whose result shapes (nonzero counts, nnz, cuSOLVER info) are read back from memory a
# kernel was meant to write run first: simgpu's kernels write nothing, so those reads return whatever
# the memory held, and only memory that never held copied-in bytes reads as zeros (a count of 0,
# info 0). Once a model's weights were copied in, PyTorch's caching allocator reuses those blocks
# and the same calls may fail (see simgpu/README.md, "Results that steer the host").
for name, f in [
    ("linalg (cuSOLVER)", linalg),
    ("sort/topk/unique/nonzero/multinomial/bincount/cumsum (CUB)", cub),
    ("sparse (cuSPARSE)", sparse),
    ("profiler (CUPTI)", profiler),
    ("nvtx", nvtx),
    ("torch.jit script/trace/fuser", jit),
    ("cudnn.benchmark + channels_last", cudnn_benchmark),
    ("AMP GradScaler training loop", amp_training),
    ("torch.compile reduce-overhead (CUDA graphs)", compile_reduce_overhead),
    ("SDPA backends", sdpa_backends),
    ("memory history snapshot", memory_history),
    ("per-process memory fraction", memory_fraction),
    ("pinned non_blocking copies", pinned),
    ("stream priority, IPC/timing events", streams_events),
    ("device properties", properties),
    ("NVML queries", nvml),
    ("caching allocator API, MemPool", caching_allocator),
    ("DataLoader workers + pin_memory", dataloader),
    ("jiterator (NVRTC)", jiterator_and_nvrtc),
    ("make_graphed_callables", graphed_callables),
    ("nn layers", nn_layers),
    ("cuda RNG state", rng),
    ("expandable segments (VMM)", expandable_segments),
]:
    step(name, f)
