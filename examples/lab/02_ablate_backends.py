"""Lab step 2: where the speedup comes from. The same block on each backend, against PyTorch eager:
tessel's eager interpreter (reference kernels, one op at a time), the graph backend (core ops with
precompiled kernels and a planned arena), the compiled backend (fused kernels, generated C++, oneDNN);
on torch >= 2 also torch.compile's aot_eager (capture alone) and inductor.

    PYTHONPATH=build/python /usr/bin/python3 examples/lab/02_ablate_backends.py [--small]
"""
import sys

import torch

import tessel
from block import make, max_rel, median_ms

small = "--small" in sys.argv
torch.set_num_threads(2)
block, x = make(small)
calls = 5 if small else 20
rows = []
with torch.no_grad():
    ref = block(x)
    base = median_ms(block, x, calls)
    rows.append(("pytorch eager", base, 0.0))
    for backend in ("eager", "graph", "compiled"):
        fast = tessel.compile(block, (x,), backend=backend, threads=2)
        rows.append((f"tessel {backend}", median_ms(fast, x, calls), max_rel(fast(x), ref)))
    if int(torch.__version__.split(".")[0]) >= 2:
        for backend in ("aot_eager", "inductor"):
            torch._dynamo.reset()
            opt = torch.compile(block, backend=backend)
            opt(x)
            rows.append((f"torch.compile {backend}", median_ms(opt, x, calls), max_rel(opt(x), ref)))
print(f"{'backend':<24} {'ms/call':>9} {'vs eager':>9} {'rel err':>9}")
for name, ms, err in rows:
    print(f"{name:<24} {ms:9.3f} {base / ms:8.2f}x {err:9.1e}")
bad = [name for name, _, err in rows if err > 1e-4]
assert not bad, f"outputs differ from eager: {bad}"
