"""Lab step 5: the block's row on the Accelerator Landscape Map -- the same model on the Spyre-like chip, the
TPU-like chips (timed simulation) and this CPU (measured).

    PYTHONPATH=build/python /usr/bin/python3 examples/lab/05_landscape.py [--small]
"""
import sys

import torch

import tessel
from block import make

small = "--small" in sys.argv
torch.set_num_threads(2)
block, x = make(small)
rows = tessel.landscape(block, (x,), targets=("spyre", "tpu-v5e", "tpu-v4", "cpu"), threads=2, iters=5 if small else 20)
print(f"{'target':<9} {'time us':>9} {'util %':>7} {'DRAM MB':>8} {'pad MB':>7} {'spad KB':>8} {'dtype':>6} {'rel err':>8}")
for r in rows:
    if r["target"] == "cpu":
        print(f"{'cpu':<9} {r['time_us']:9.1f} {'-':>7} {'-':>8} {'-':>7} {'-':>8} {'f32':>6} {r['max_rel_err']:8.1e}")
        continue
    print(f"{r['target']:<9} {r['time_us']:9.1f} {100 * r['utilisation']:7.2f} {r['dram_mb']:8.3f} {r['padding_mb']:7.3f} "
          f"{r['scratchpad_peak_kb']:8.1f} {r['dtype']:>6} {r['max_rel_err']:8.1e}")
tol = {"f16": 2e-2, "bf16": 5e-2}
assert rows[-1]["max_rel_err"] < 1e-4
assert all(r["max_rel_err"] < tol[r["dtype"]] for r in rows[:-1]), rows
