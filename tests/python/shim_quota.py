"""PyTorch under a libshare memory quota (run by tests/tests/shim_torch_quota.rs).

usage: shim_quota.py QUOTA_BYTES
The allocator comes from PYTORCH_CUDA_ALLOC_CONF (native, backend:cudaMallocAsync or
expandable_segments:True), set by the test. Prints one JSON line per step
({"step": ..., "ok": true, ...}); on the first failure {"step": ..., "ok": false, "error": ...} and
"FAIL <step> <error>", exit 1; "OK" at the end.
"""

import json
import os
import sys
import traceback

QUOTA = int(sys.argv[1])
MIB = 1 << 20
# What the job may see used beyond its own tensors (cudart/cuBLAS internals; rounding).
SLACK = 64 * MIB
STEP = "import"


def report(**fields):
    print(json.dumps({"step": STEP, "ok": True, **fields}), flush=True)


def expect(cond, msg):
    if not cond:
        raise AssertionError(msg)


def check_info(torch, what):
    """mem_get_info: total is the quota, free consistent with what torch holds."""
    free, total = torch.cuda.mem_get_info()
    reserved = torch.cuda.memory_reserved()
    expect(total == QUOTA, f"{what}: mem_get_info total {total} != quota {QUOTA}")
    expect(0 <= free <= total, f"{what}: free {free} not within [0, total {total}]")
    expect(
        abs((total - free) - reserved) <= SLACK,
        f"{what}: used {total - free} (total - free) vs {reserved} reserved by torch",
    )
    return free, total, reserved


def main():
    global STEP
    import torch

    report(
        version=torch.__version__,
        cuda=torch.version.cuda,
        python=sys.executable,
        python_version=sys.version.split()[0],
        alloc_conf=os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""),
    )

    STEP = "init"
    expect(torch.cuda.is_available(), "torch.cuda.is_available() is False")
    props = torch.cuda.get_device_properties(0)
    backend = torch.cuda.memory.get_allocator_backend()
    expect(props.total_memory == QUOTA, f"total_memory {props.total_memory} != quota {QUOTA}")
    free, total, reserved = check_info(torch, "start")
    report(total_memory=props.total_memory, free=free, total=total, backend=backend)

    STEP = "fill"
    # 3 × 256 MiB = 768 MiB of the 1 GiB quota.
    held = [torch.empty(256 * MIB, dtype=torch.uint8, device="cuda") for _ in range(3)]
    torch.cuda.synchronize()
    free, total, reserved = check_info(torch, "after 768 MiB")
    expect(free <= total - 768 * MIB, f"free {free} after 768 MiB of {total}")
    report(free=free, reserved=reserved)

    STEP = "over_quota"
    # 512 MiB more cannot fit in 1 GiB: the caching allocator frees its cache, retries, and must
    # raise torch.OutOfMemoryError — not a RuntimeError about a CUDA error.
    error_type = None
    try:
        extra = torch.empty(512 * MIB, dtype=torch.uint8, device="cuda")
        torch.cuda.synchronize()
        del extra
    except torch.OutOfMemoryError as e:
        error_type = type(e).__name__
        message = str(e).splitlines()[0]
    expect(error_type == "OutOfMemoryError", "512 MiB over a full quota did not raise")
    free, total, reserved = check_info(torch, "after the OOM")
    report(error=error_type, message=message, free=free)

    STEP = "still_usable"
    # The process is healthy after the OOM: a small allocation and a copy work.
    # (Kernels do not compute on simgpu; copies move real bytes.)
    src = torch.arange(1000, dtype=torch.float32)
    small = src.to("cuda")
    expect(torch.equal(small.cpu(), src), "a host -> device -> host copy differs after the OOM")
    del small
    report()

    STEP = "freed"
    del held
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    free, total, reserved = check_info(torch, "after empty_cache")
    expect(free >= total - SLACK, f"free {free} of {total} after freeing everything")
    report(free=free, reserved=reserved)

    STEP = "again"
    # After freeing, the quota is available again: 896 MiB in one piece.
    big = torch.empty(896 * MIB, dtype=torch.uint8, device="cuda")
    torch.cuda.synchronize()
    free, total, reserved = check_info(torch, "after 896 MiB")
    expect(free <= total - 896 * MIB, f"free {free} with 896 MiB held")
    del big
    torch.cuda.empty_cache()
    report(free=free)


if __name__ == "__main__":
    try:
        main()
    except BaseException as e:  # noqa: BLE001 - report any failure as one line
        print(json.dumps({"step": STEP, "ok": False, "error": f"{type(e).__name__}: {e}"}), flush=True)
        print(f"FAIL {STEP} {type(e).__name__}: {e}", flush=True)
        traceback.print_exc()
        sys.exit(1)
    print("OK", flush=True)
