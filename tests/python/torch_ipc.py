"""CUDA tensors shared between processes (torch.multiprocessing, CUDA IPC) on simgpu: the consumer
reads the producer's bytes, and bytes it copies in are seen by the producer (one memory)."""
import json
import torch
import torch.multiprocessing as mp


def consumer(q, out):
    t = q.get()  # a CUDA tensor received through cudaIpcOpenMemHandle
    out.put(t.cpu().tolist()[:4])
    t.copy_(torch.full((16,), 7.0))  # a host-to-device copy into the shared memory
    torch.cuda.synchronize()
    out.put("done")
    q.get()  # keep the mapping until the producer has looked


if __name__ == "__main__":
    mp.set_start_method("spawn")
    q, out = mp.Queue(), mp.Queue()
    t = torch.arange(16, dtype=torch.float32).cuda()
    p = mp.Process(target=consumer, args=(q, out))
    p.start()
    q.put(t)
    seen = out.get(timeout=60)
    out.get(timeout=60)
    after = t.cpu().tolist()[:4]
    q.put("bye")
    p.join(timeout=60)
    print(json.dumps({"check": "ipc", "seen": seen, "after": after, "exit": p.exitcode}))
