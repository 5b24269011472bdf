"""NVML (nvidia-ml-py / pynvml) on simgpu's libnvidia-ml.so.1 (run by tests/tests/sim_nvml.rs).

usage: nvml_smoke.py EXPECTED_TOTAL_BYTES
Prints one JSON line with what NVML reported, "FAIL <what>" and exit 1 on a failed expectation,
"OK" at the end.
"""

import json
import sys

import pynvml


def main():
    expected_total = int(sys.argv[1])
    pynvml.nvmlInit()
    count = pynvml.nvmlDeviceGetCount()
    assert count >= 1, f"device count {count}"
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    name = pynvml.nvmlDeviceGetName(h)
    name = name.decode() if isinstance(name, bytes) else name
    mem = pynvml.nvmlDeviceGetMemoryInfo(h)
    assert mem.total == expected_total, f"memory total {mem.total} != {expected_total}"
    assert mem.free <= mem.total and mem.used <= mem.total, f"free {mem.free} used {mem.used}"
    uuid = pynvml.nvmlDeviceGetUUID(h)
    uuid = uuid.decode() if isinstance(uuid, bytes) else uuid
    assert uuid.startswith("GPU-"), f"UUID {uuid!r}"
    util = pynvml.nvmlDeviceGetUtilizationRates(h)
    assert 0 <= util.gpu <= 100, f"utilization {util.gpu}"
    driver = pynvml.nvmlSystemGetDriverVersion()
    driver = driver.decode() if isinstance(driver, bytes) else driver
    procs = pynvml.nvmlDeviceGetComputeRunningProcesses(h)
    print(json.dumps({
        "check": "nvml",
        "count": count,
        "name": name,
        "total": mem.total,
        "free": mem.free,
        "uuid": uuid,
        "util": util.gpu,
        "driver": driver,
        "processes": len(procs),
    }), flush=True)
    pynvml.nvmlShutdown()


if __name__ == "__main__":
    try:
        main()
    except Exception as e:  # noqa: BLE001 - report any failure as one line
        print(f"FAIL {type(e).__name__}: {e}", flush=True)
        raise
    print("OK", flush=True)
