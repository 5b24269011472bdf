"""PyTorch as an oversubscribing opportunistic job (run by tests/tests/shim_oversub.rs).

usage: torch_oversub.py DEVICE_BYTES QUOTA_BYTES
The container may oversubscribe and its quota is above the device: the job fills tensors past
the device's memory (each with its own value, checked by reading back its first and last
elements), trains a small model a few steps with all of it held, sees a device of its quota in
mem_get_info, and past the quota gets torch.OutOfMemoryError. One JSON line per step; "FAIL
<step> <error>" and exit 1 on the first failure; "OK" at the end.
"""

import json
import sys
import traceback

DEVICE = int(sys.argv[1])
QUOTA = int(sys.argv[2])
MIB = 1 << 20
CHUNK = 64 * MIB
STEP = "import"


def report(**fields):
    print(json.dumps({"step": STEP, "ok": True, **fields}), flush=True)


def expect(cond, msg):
    if not cond:
        raise AssertionError(msg)


def main():
    global STEP
    import torch

    STEP = "init"
    free, total = torch.cuda.mem_get_info()
    props = torch.cuda.get_device_properties(0)
    expect(total == QUOTA, f"mem_get_info total {total} != quota {QUOTA}")
    expect(props.total_memory == QUOTA, f"total_memory {props.total_memory} != quota {QUOTA}")
    report(free=free, total=total)

    STEP = "fill"
    # 1.5 × the device, in 64 MiB tensors of float32, each filled with its index.
    n = (DEVICE * 3 // 2) // CHUNK
    held = [torch.full((CHUNK // 4,), float(i), device="cuda") for i in range(n)]
    torch.cuda.synchronize()
    bad = [i for i, t in enumerate(held) if t[0].item() != i or t[-1].item() != i]
    expect(not bad, f"tensors {bad} did not read back their value")
    reserved = torch.cuda.memory_reserved()
    expect(reserved > DEVICE, f"reserved {reserved} is not above the device's {DEVICE}")
    report(tensors=n, reserved=reserved)

    STEP = "train"
    model = torch.nn.Sequential(torch.nn.Linear(512, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10)).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(64, 512, device="cuda")
    y = torch.randint(0, 10, (64,), device="cuda")
    for _ in range(5):
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
    torch.cuda.synchronize()
    free, total = torch.cuda.mem_get_info()
    expect(total == QUOTA, f"total {total} != quota {QUOTA}")
    used = total - free
    expect(
        abs(used - torch.cuda.memory_reserved()) <= 64 * MIB,
        f"used {used} vs reserved {torch.cuda.memory_reserved()}",
    )
    report(free=free, total=total)

    STEP = "over_quota"
    try:
        torch.empty(QUOTA, dtype=torch.uint8, device="cuda")
        raise AssertionError("an allocation of the whole quota on top succeeded")
    except torch.OutOfMemoryError:
        pass
    report()

    STEP = "freed"
    del held
    torch.cuda.empty_cache()
    free, total = torch.cuda.mem_get_info()
    expect(free >= total - 64 * MIB, f"free {free} of {total} after empty_cache")
    report(free=free)


if __name__ == "__main__":
    try:
        main()
    except BaseException as e:  # noqa: BLE001 - the test reads the step and the error
        print(json.dumps({"step": STEP, "ok": False, "error": type(e).__name__, "message": str(e)}), flush=True)
        traceback.print_exc()
        print(f"FAIL {STEP} {type(e).__name__}", flush=True)
        sys.exit(1)
    print("OK", flush=True)
