"""An ordinary PyTorch training loop, used as a production or opportunistic job in the compute
sharing test (tests/tests/shim_torch_sharing.rs). It knows nothing about libshare.

usage: torch_train_loop.py SECONDS [START_AT] [WIDTH] [BATCH] [HOLD_BYTES]
A small MLP trained with SGD on random data; the loss is read back every iteration (`loss.item()`,
as training loops that log do). It trains (warming up) until the wall-clock time START_AT
(seconds since the epoch; default: one second after setup), so that several jobs measure the
same interval, then counts iterations for SECONDS and prints one JSON line per second ({"t": ..., "iters": ...}) and a final line
{"done": true, "iters": N, "seconds": S, "iters_per_s": R}. With HOLD_BYTES, it first fills that
much in 64 MiB tensors (a data set kept on the GPU; each holds its index, checked at the end:
"held_bad" counts those that did not read back), allocated before the model, and trains beside
them (the oversubscription test, tests/tests/oversub_torch.rs).
"""

import json
import sys
import time


def main():
    seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 5.0
    start_at = float(sys.argv[2]) if len(sys.argv) > 2 else 0.0
    width = int(sys.argv[3]) if len(sys.argv) > 3 else 1024
    batch = int(sys.argv[4]) if len(sys.argv) > 4 else 256
    hold = int(sys.argv[5]) if len(sys.argv) > 5 else 0
    import torch

    dev = torch.device("cuda")
    chunk = 64 << 20
    held = [torch.full((chunk // 4,), float(i), device=dev) for i in range(hold // chunk)]
    if held:
        torch.cuda.synchronize()
        print(json.dumps({"filled": len(held)}), flush=True)
    model = torch.nn.Sequential(
        torch.nn.Linear(width, width),
        torch.nn.ReLU(),
        torch.nn.Linear(width, width),
        torch.nn.ReLU(),
        torch.nn.Linear(width, 10),
    ).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(batch, width, device=dev)
    y = torch.randint(0, 10, (batch,), device=dev)
    loss_fn = torch.nn.CrossEntropyLoss()

    def step():
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        return loss.item()

    warm_end = time.monotonic() + max(1.0, start_at - time.time())
    while time.monotonic() < warm_end:
        step()
    late = time.time() - start_at if start_at else 0.0
    start = time.monotonic()
    end = start + seconds
    next_report = start + 1.0
    iters = 0
    while True:
        now = time.monotonic()
        if now >= end:
            break
        step()
        iters += 1
        if now >= next_report:
            print(json.dumps({"t": round(now - start, 3), "iters": iters}), flush=True)
            next_report += 1.0
    elapsed = time.monotonic() - start
    held_bad = sum(1 for i, t in enumerate(held) if t[0].item() != i or t[-1].item() != i)
    print(
        json.dumps(
            {
                "done": True,
                "iters": iters,
                "seconds": round(elapsed, 3),
                "iters_per_s": iters / elapsed,
                "late_s": round(late, 3),
                "held": len(held),
                "held_bad": held_bad,
            }
        ),
        flush=True,
    )


if __name__ == "__main__":
    main()
