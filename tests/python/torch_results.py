"""The kernel results simgpu produces (simgpu/src/driver/results.rs): PyTorch's contiguous fills
write their value, and the CUB kernels that count for nonzero/unique/masked indexing write a zero
count, so those calls give empty results instead of failing on stale bytes. Every step first
leaves real bytes in the caching allocator's blocks (a copied-in tensor, freed). One JSON line."""
import json
import torch


def stale():
    junk = torch.randn(1 << 16).cuda()  # H2D: real bytes in a cached block
    del junk


out = {}
for dtype in [torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int32, torch.int64,
              torch.uint8, torch.bool]:
    stale()
    full = torch.full((1000,), 3, dtype=dtype, device="cuda")
    zeros = torch.zeros(257, dtype=dtype, device="cuda")
    ones = torch.ones(33, dtype=dtype, device="cuda")
    out[str(dtype).removeprefix("torch.")] = {
        "full": torch.equal(full.cpu(), torch.full((1000,), 3, dtype=dtype)),
        "zeros": torch.equal(zeros.cpu(), torch.zeros(257, dtype=dtype)),
        "ones": torch.equal(ones.cpu(), torch.ones(33, dtype=dtype)),
    }
stale()
x = torch.empty(64, 64, device="cuda")
x.fill_(2.5)
x[:, :8].zero_()  # not contiguous: not modelled, must not disturb the rest
out["fill_"] = bool((x.cpu()[:, 8:] == 2.5).all())  # (copying a strided view is a kernel too)

shapes = {}
for name, f in {
    "nonzero": lambda: torch.nonzero(torch.randn(100, device="cuda") > 0),
    "masked_select": lambda: torch.masked_select(torch.randn(100, device="cuda"), torch.randn(100, device="cuda") > 0),
    "boolean_index": lambda: torch.randn(10, 10, device="cuda")[torch.randn(10, device="cuda") > 0],
    "unique": lambda: torch.unique(torch.randint(0, 10, (100,), device="cuda")),
    "argwhere": lambda: torch.argwhere(torch.randn(10, 10, device="cuda") > 0),
}.items():
    stale()
    try:
        shapes[name] = list(f().shape)
    except Exception as e:
        shapes[name] = f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
out["shapes"] = shapes
print(json.dumps({"check": "results", **out}))
