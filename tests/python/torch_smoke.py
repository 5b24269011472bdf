"""PyTorch smoke test on simgpu (run by tests/tests/sim_torch.rs).

Kernels do not compute on simgpu, so nothing here asserts on computed values: only on device
properties, memory accounting, bytes that round-trip through copies, shapes and the absence of errors.

usage: torch_smoke.py EXPECTED_TOTAL_BYTES
Prints one JSON line per step ({"step": ..., "ok": true, ...}); on the first failure prints
{"step": ..., "ok": false, "error": ...} and "FAIL <step> <error>" and exits 1; "OK" at the end.
"""

import json
import sys
import time
import traceback

EXPECTED_TOTAL = int(sys.argv[1]) if len(sys.argv) > 1 else None
STEP = "import"


def report(**fields):
    print(json.dumps({"step": STEP, "ok": True, **fields}), flush=True)


def expect(cond, msg):
    if not cond:
        raise AssertionError(msg)


def main():
    global STEP
    t0 = time.monotonic()
    import torch

    report(version=torch.__version__, cuda=torch.version.cuda, seconds=round(time.monotonic() - t0, 2))

    STEP = "is_available"
    expect(torch.cuda.is_available(), "torch.cuda.is_available() is False")
    n = torch.cuda.device_count()
    expect(n >= 1, f"device_count {n}")
    report(device_count=n)

    STEP = "properties"
    name = torch.cuda.get_device_name(0)
    props = torch.cuda.get_device_properties(0)
    cap = torch.cuda.get_device_capability(0)
    expect(name and name == props.name, f"name {name!r} vs properties {props.name!r}")
    expect(props.multi_processor_count > 0, f"multi_processor_count {props.multi_processor_count}")
    expect(cap[0] >= 7, f"capability {cap}")
    if EXPECTED_TOTAL is not None:
        expect(props.total_memory == EXPECTED_TOTAL, f"total_memory {props.total_memory} != {EXPECTED_TOTAL}")
    report(name=name, total_memory=props.total_memory, sm_count=props.multi_processor_count, capability=list(cap))

    STEP = "zeros"
    z = torch.zeros(1024, 3, device="cuda")
    expect(z.is_cuda and z.shape == (1024, 3) and z.dtype == torch.float32, f"zeros: {z.device} {z.shape}")
    zc = z.cpu()
    # cudaMemset moves real bytes, so zeros really are zeros.
    expect(bool((zc == 0).all()), "torch.zeros on cuda came back non-zero")
    report(shape=list(z.shape))

    STEP = "copy_roundtrip"
    g = torch.Generator().manual_seed(1234)
    for dtype in (torch.float32, torch.float16, torch.int64, torch.uint8):
        if dtype.is_floating_point:
            src = torch.randn(257, 33, generator=g).to(dtype)
        else:
            src = torch.randint(0, 250, (257, 33), generator=g).to(dtype)
        d = src.to("cuda")
        back = d.cpu()
        expect(back.dtype == dtype and back.shape == src.shape, f"{dtype}: {back.dtype} {back.shape}")
        expect(torch.equal(back, src), f"{dtype}: bytes differ after cpu -> cuda -> cpu")
        # device-to-device copy and a pinned, non-blocking round trip
        d2 = d.clone()
        expect(torch.equal(d2.cpu(), src), f"{dtype}: device clone differs")
        pinned = src.pin_memory()
        d3 = pinned.to("cuda", non_blocking=True)
        out = torch.empty_like(pinned).pin_memory()
        out.copy_(d3, non_blocking=True)
        torch.cuda.synchronize()
        expect(torch.equal(out, src), f"{dtype}: pinned async round trip differs")
    # slicing: a strided device view copied back
    big = torch.arange(10000, dtype=torch.float32)
    dbig = big.cuda()
    expect(torch.equal(dbig[100:200].cpu(), big[100:200]), "slice copy differs")
    report(dtypes=4)

    STEP = "linear_fwd_bwd"
    torch.manual_seed(0)
    lin = torch.nn.Linear(64, 32).cuda()
    x = torch.randn(16, 64, device="cuda", requires_grad=True)
    y = lin(x)
    expect(y.shape == (16, 32) and y.is_cuda, f"linear output {y.shape} {y.device}")
    y.sum().backward()
    expect(lin.weight.grad is not None and lin.weight.grad.shape == lin.weight.shape, "no weight grad")
    expect(x.grad is not None and x.grad.shape == x.shape, "no input grad")
    torch.cuda.synchronize()
    report(out_shape=list(y.shape))

    STEP = "sgd_steps"
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8)).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    data = torch.randn(128, 32, device="cuda")
    target = torch.randint(0, 8, (128,), device="cuda")
    for _ in range(3):
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(data), target)
        loss.backward()
        opt.step()
    torch.cuda.synchronize()
    loss_value = loss.item()  # a copy back; the value itself is unspecified on simgpu
    report(steps=3, loss_is_float=isinstance(loss_value, float))

    STEP = "events"
    start = torch.cuda.Event(enable_timing=True)
    end = torch.cuda.Event(enable_timing=True)
    a = torch.randn(256, 256, device="cuda")
    start.record()
    for _ in range(5):
        a = a @ a
    end.record()
    end.synchronize()
    expect(end.query(), "event not complete after synchronize")
    ms = start.elapsed_time(end)
    expect(ms >= 0.0, f"elapsed_time {ms}")
    report(elapsed_ms=ms)

    STEP = "mem_get_info"
    free, total = torch.cuda.mem_get_info()
    expect(free <= total, f"free {free} > total {total}")
    expect(total == props.total_memory, f"mem_get_info total {total} != total_memory {props.total_memory}")
    if EXPECTED_TOTAL is not None:
        expect(total == EXPECTED_TOTAL, f"mem_get_info total {total} != {EXPECTED_TOTAL}")
    reserved = torch.cuda.memory_reserved()
    expect(reserved > 0, "nothing reserved by the caching allocator")
    expect(total - free >= reserved, f"used {total - free} < reserved by torch {reserved}")
    # A 256 MiB tensor makes free drop by at least that much.
    before, _ = torch.cuda.mem_get_info()
    blob = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    after, _ = torch.cuda.mem_get_info()
    expect(before - after >= 256 << 20, f"free {before} -> {after} after a 256 MiB tensor")
    del blob
    torch.cuda.empty_cache()
    report(free=free, total=total, reserved=reserved)

    STEP = "synchronize"
    torch.cuda.synchronize()
    report(seconds=round(time.monotonic() - t0, 2))


if __name__ == "__main__":
    try:
        main()
    except BaseException as e:  # noqa: BLE001 - report any failure as one line
        print(json.dumps({"step": STEP, "ok": False, "error": f"{type(e).__name__}: {e}"}), flush=True)
        print(f"FAIL {STEP} {type(e).__name__}: {e}", flush=True)
        traceback.print_exc()
        sys.exit(1)
    print("OK", flush=True)
