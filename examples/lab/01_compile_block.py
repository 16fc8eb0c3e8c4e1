"""Lab step 1: compile a transformer block and measure it against PyTorch eager: compile latency, steady-state
call time, and the break-even call count (after how many calls compiling has paid for itself).

    PYTHONPATH=build/python /usr/bin/python3 examples/lab/01_compile_block.py [--small]
"""
import math
import sys
import time

import torch

import tessel
from block import make, max_rel, median_ms

small = "--small" in sys.argv
torch.set_num_threads(2)
block, x = make(small)
with torch.no_grad():
    ref = block(x)
    eager_ms = median_ms(block, x, 20)
    t0 = time.perf_counter()
    fast = tessel.compile(block, (x,), threads=2)
    out = fast(x)                                        # the first call (compiles nothing more)
    compile_s = time.perf_counter() - t0
    tessel_ms = median_ms(fast, x, 20)
err = max_rel(out, ref)
print(f"block {tuple(x.shape)}: eager {eager_ms:.3f} ms/call, tessel {tessel_ms:.3f} ms/call "
      f"({eager_ms / tessel_ms:.2f}x), compile + first call {compile_s:.2f} s, rel err {err:.1e}")
saved_ms = eager_ms - tessel_ms
if saved_ms > 0:
    calls = math.ceil(compile_s * 1e3 / saved_ms)
    print(f"break-even: compile / (eager - tessel) = {compile_s * 1e3:.1f} ms / {saved_ms:.3f} ms = {calls} calls")
else:
    print("break-even: never at this size (tessel is not faster per call here)")
assert err < 1e-4, f"tessel's output differs from eager: rel err {err:.2e}"
