"""torch.distributed with the NCCL backend and one rank (what torchrun --nproc_per_node=1 runs):
NCCL's topology probing (NVML), VMM host/device buffers and buffer registration on simgpu."""
import json
import os

import torch
import torch.distributed as dist

os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
os.environ.setdefault("MASTER_PORT", str(20000 + os.getpid() % 20000))
dist.init_process_group("nccl", rank=0, world_size=1, device_id=torch.device("cuda:0"))
t = torch.ones(4, device="cuda")
dist.all_reduce(t)
m = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 8).cuda())
m(torch.randn(4, 8, device="cuda")).sum().backward()
torch.cuda.synchronize()
dist.destroy_process_group()
print(json.dumps({"check": "nccl", "ok": True}))
