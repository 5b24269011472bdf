"""Train -> OOM -> recover, the loop of an ordinary PyTorch job that probes its batch size
(run by tests/tests/shim_torch_oom_loop.rs; issue 6, must-show 3).

usage: torch_oom_loop.py OOM_ROUNDS
The allocator comes from PYTORCH_CUDA_ALLOC_CONF (native, backend:cudaMallocAsync or
expandable_segments:True). Each round doubles the batch of an MLP trained with Adam until
torch.OutOfMemoryError, then drops the failed step's tensors, calls torch.cuda.empty_cache() and
trains on at the starting batch. Prints one JSON line per round ({"round": i, "batch": <largest
batch that fitted>, ...}), then {"done": true, ...} and the line READY; waits for a line on stdin
(the test reads the device and quota accounting meanwhile) and exits 0. Any other error: "FAIL
<error>", exit 1.
"""

import json
import sys
import traceback

MIB = 1 << 20


def main():
    import torch

    rounds = int(sys.argv[1])
    torch.manual_seed(0)
    width = 1024
    model = torch.nn.Sequential(
        torch.nn.Linear(width, width),
        torch.nn.ReLU(),
        torch.nn.Linear(width, width),
        torch.nn.ReLU(),
        torch.nn.Linear(width, 10),
    ).cuda()
    opt = torch.optim.Adam(model.parameters())

    def step(batch):
        # The batch comes from host memory, as from a data loader: copies queued on the stream
        # (batch x 4 KiB each, ~10 ms at 64k on the simulated PCIe) are still running when a
        # later allocation of the step fails, so the recovery frees memory under queued work.
        x = torch.empty(batch, width).cuda(non_blocking=True)
        t = torch.empty(batch, width).cuda(non_blocking=True)
        y = torch.randint(0, 10, (batch,), device="cuda")
        loss = torch.nn.functional.cross_entropy(model(x) + t[:, :10], y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    backend = torch.cuda.memory.get_allocator_backend()
    steps = 0
    for r in range(rounds):
        batch, fitted = 256, 0
        while True:
            try:
                step(batch)
                steps += 1
                fitted = batch
                batch *= 2
            except torch.OutOfMemoryError:
                break
            if batch > 1 << 24:
                raise AssertionError(f"no OOM up to batch {batch}: is memory limited?")
        # Recover: what the failed step held goes with its frame; the cache goes back to the
        # device while the work queued on it may still be running.
        opt.zero_grad(set_to_none=True)
        torch.cuda.empty_cache()
        for _ in range(3):
            step(256)
            steps += 1
        torch.cuda.synchronize()
        print(
            json.dumps(
                {
                    "round": r,
                    "batch": fitted,
                    "reserved": torch.cuda.memory_reserved(),
                    "allocated": torch.cuda.memory_allocated(),
                }
            ),
            flush=True,
        )
    torch.cuda.synchronize()
    print(
        json.dumps(
            {
                "done": True,
                "backend": backend,
                "steps": steps,
                "max_reserved": torch.cuda.max_memory_reserved(),
                "reserved": torch.cuda.memory_reserved(),
            }
        ),
        flush=True,
    )
    print("READY", flush=True)
    sys.stdin.readline()
    print("OK", flush=True)


if __name__ == "__main__":
    try:
        main()
    except Exception as e:  # noqa: BLE001 - any failure is reported as one line
        traceback.print_exc()
        print(f"FAIL {type(e).__name__}: {e}", flush=True)
        sys.exit(1)
