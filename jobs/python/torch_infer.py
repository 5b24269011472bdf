"""PyTorch inference served at a fixed request rate: `sharectl bench S8`'s production job.

An ordinary PyTorch program that knows nothing about libshare. Requests arrive open-loop at
--rate per second on absolute deadlines; each copies its input to the GPU, runs an MLP forward
pass (`torch.inference_mode`) and copies the answer back (which waits for the GPU). Latency
counts from the request's due time, as `simjob-infer`'s does, and the output lines are the
jobs' format (jobs/README.md): `start` (with `mono_s`), `progress`, one `request` line per
request with --trace, and `final`.

usage: torch_infer.py [--rate 20] [--width 2048] [--layers 4] [--batch 64]
                      [--duration 10] [--warmup 2] [--start-at EPOCH] [--trace] [--report-interval 0.1]
"""

import argparse
import json
import time


def pct(xs, p):
    if not xs:
        return None
    s = sorted(xs)
    k = max(0, min(len(s) - 1, int(-(-p * len(s) // 100)) - 1))
    return s[k]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rate", type=float, default=20.0)
    ap.add_argument("--width", type=int, default=2048)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--batch", type=int, default=64)
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
    layers.append(torch.nn.Linear(a.width, 16))
    model = torch.nn.Sequential(*layers).to(dev).eval()
    inp = torch.randn(a.batch, a.width).pin_memory()

    def serve():
        with torch.inference_mode():
            return model(inp.to(dev, non_blocking=True)).cpu()

    # Warm up (cuBLAS handles, the caching allocator) at the serving rate.
    end = time.monotonic() + max(a.warmup, a.start_at - time.time())
    while time.monotonic() < end:
        serve()
        time.sleep(1.0 / a.rate)

    t0 = time.monotonic()
    emit = lambda d: print(json.dumps(d), flush=True)
    emit({"job": "torch-infer", "t": 0.0, "event": "start", "mono_s": t0, "rate": a.rate,
          "width": a.width, "layers": a.layers, "batch": a.batch})
    period = 1.0 / a.rate
    lat, served = [], 0
    next_report = a.report_interval if a.report_interval > 0 else None
    i = 0
    while True:
        due = i * period
        if due >= a.duration:
            break
        now = time.monotonic() - t0
        if now < due:
            time.sleep(due - now)
        began = time.monotonic() - t0
        serve()
        done = time.monotonic() - t0
        ms = (done - due) * 1e3
        lat.append(ms)
        served += 1
        if a.trace:
            emit({"job": "torch-infer", "event": "request", "t": round(due, 6),
                  "end": round(done, 6), "latency_ms": round(ms, 3), "began": round(began, 6)})
        if next_report is not None and done >= next_report:
            emit({"job": "torch-infer", "t": round(done, 6), "event": "progress",
                  "requests": served})
            next_report += a.report_interval
        i += 1
    t = time.monotonic() - t0
    emit({"job": "torch-infer", "t": round(t, 6), "event": "final", "final": True,
          "requests": served, "achieved_rate": served / t, "p50_ms": pct(lat, 50),
          "p99_ms": pct(lat, 99), "max_ms": max(lat) if lat else None})


if __name__ == "__main__":
    main()
