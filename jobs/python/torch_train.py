"""PyTorch training of an MLP: `sharectl bench S8`'s opportunistic job.

An ordinary training loop that knows nothing about libshare: SGD on random data, the loss read
back every iteration (`loss.item()`, as loops that log do). Output lines are the jobs' format
(jobs/README.md): `start` (with `mono_s`), `progress` (cumulative `iters`), one `iter` line per
iteration with --trace, and `final`.

usage: torch_train.py [--width 2048] [--layers 4] [--batch 512] [--duration 10] [--warmup 2] [--start-at EPOCH]
                      [--trace] [--report-interval 0.1]
"""

import argparse
import json
import time


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--width", type=int, default=2048)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--batch", type=int, default=512)
    ap.add_argument("--duration", type=float, default=10.0)
    ap.add_argument("--warmup", type=float, default=2.0)
    ap.add_argument("--start-at", type=float, default=0.0,
                    help="warm up until this wall-clock time (seconds since the epoch) at least")
    ap.add_argument("--trace", action="store_true")
    ap.add_argument("--report-interval", type=float, default=0.1)
    a = ap.parse_args()
    import torch

    dev = torch.device("cuda")
    layers = []
    for _ in range(a.layers - 1):
        layers += [torch.nn.Linear(a.width, a.width), torch.nn.ReLU()]
    layers.append(torch.nn.Linear(a.width, 10))
    model = torch.nn.Sequential(*layers).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(a.batch, a.width, device=dev)
    y = torch.randint(0, 10, (a.batch,), device=dev)
    loss_fn = torch.nn.CrossEntropyLoss()

    def step():
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        return loss.item()

    end = time.monotonic() + max(a.warmup, a.start_at - time.time())
    while time.monotonic() < end:
        step()
    t0 = time.monotonic()
    emit = lambda d: print(json.dumps(d), flush=True)
    emit({"job": "torch-train", "t": 0.0, "event": "start", "mono_s": t0, "width": a.width,
          "layers": a.layers, "batch": a.batch})
    iters = 0
    next_report = a.report_interval if a.report_interval > 0 else None
    while True:
        s = time.monotonic() - t0
        if s >= a.duration:
            break
        step()
        e = time.monotonic() - t0
        iters += 1
        if a.trace:
            emit({"job": "torch-train", "event": "iter", "t": round(s, 6), "end": round(e, 6),
                  "phase": None})
        if next_report is not None and e >= next_report:
            emit({"job": "torch-train", "t": round(e, 6), "event": "progress", "iters": iters})
            next_report += a.report_interval
    t = time.monotonic() - t0
    emit({"job": "torch-train", "t": round(t, 6), "event": "final", "final": True,
          "iters": iters, "iters_per_s": iters / t})


if __name__ == "__main__":
    main()
