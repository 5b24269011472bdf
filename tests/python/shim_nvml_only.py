"""An NVML-only process (a monitoring tool; it never initialises CUDA) under the shim: NVML's
memory figures for device 0, as JSON."""
import json
import pynvml

pynvml.nvmlInit()
m = pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(0))
print(json.dumps({"check": "nvml_only", "total": m.total, "free": m.free, "used": m.used}))
