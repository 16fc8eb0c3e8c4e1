"""Lab step 4: read what the compiler made of the block on the Spyre-like chip. The fusion table (each tile
kernel, its kind, how many graph nodes it fused, the traffic fusion saved, the work split it chose and
its time against its roofline), then the kernel-level text of the first kernel, then the stage dumps
the command line writes for the same graph (`tessel sim <folder> --hw spyre --dump-ir DIR`).

    PYTHONPATH=build/python /usr/bin/python3 examples/lab/04_read_kernels.py [--small]
"""
import os
import subprocess
import sys
import tempfile

import torch

import tessel
from block import make, max_rel

small = "--small" in sys.argv
block, x = make(small)
fast = tessel.compile(block, (x,), target="spyre")
with torch.no_grad():
    err = max_rel(fast(x), block(x))
r = fast.report
print(f"{'kernel':<6} {'kind':<8} {'from':>5} {'saved KB':>9} {'split':<12} {'sim us':>8} {'bound us':>9}")
for k in r["kernels"]:
    saved = k["fusion_traffic_saved_bytes"] / 1e3
    print(f"{k['name']:<6} {k['kind']:<8} {len(k['sources']):>5} {saved:9.1f} {k['split']:<12} {k['simulated_us']:8.2f} "
          f"{k['roofline_us']:9.2f}")
# ('from': the graph-level nodes a kernel came from; the kernel text says how many core ops it fused)
text = fast.kernels()
start = text.index("\nkernel k0 ")
first = text[start + 1:text.index("\n}", start) + 2]
print("\nthe kernel level, first kernel (its loops, accesses and the fused core ops, phase by phase):\n" + first)
assert "fused" in first and "store" in first
print(f"\nfunctional simulation vs eager: rel err {err:.1e} ({fast.storage} storage)")
assert err < 2e-2
assert sum(len(k["sources"]) for k in r["kernels"]) >= len(r["kernels"])

tessel_cmd = os.environ.get("TESSEL_BINARY", os.path.join(os.path.dirname(__file__), "..", "..", "build", "tessel"))
if os.path.exists(tessel_cmd):
    out = tempfile.mkdtemp(prefix="lab4-")
    folder = tessel.export(block, (x,), os.path.join(out, "block"))
    subprocess.run([tessel_cmd, "--quiet", "sim", folder, "--hw", "spyre", "--no-functional", "--dump-ir",
                    os.path.join(out, "stages")], check=True, capture_output=True)
    print("stages written by tessel sim --dump-ir:", " ".join(sorted(os.listdir(os.path.join(out, "stages")))[:12]), "...")
