"""Under the shim with CUDA_VISIBLE_DEVICES=1 on a two-GPU node, NVML reports the quota for the
device CUDA sees (NVML index 1, CUDA ordinal 0) and the real figures for the one it does not."""
import json
import pynvml
import torch

torch.zeros(1, device="cuda")
pynvml.nvmlInit()
totals = [pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(i)).total
          for i in range(pynvml.nvmlDeviceGetCount())]
print(json.dumps({"check": "nvml_visible", "nvml_totals": totals, "cuda_total": torch.cuda.mem_get_info()[1]}))
