"""torch 1.13 eager alone (its own process, nothing else loaded) on bench/train_step.py's block: fwd + bwd + AdamW
at 2 threads, medians of 35 steps. Run it with and without MALLOC_MMAP_THRESHOLD_/MALLOC_TRIM_THRESHOLD_ raised:
glibc returns torch's 28 MB of fresh gradients to the kernel each step unless they are, and the page faults
are most of the difference (docs/BENCHMARKS.md, seventh session).

    OPENBLAS_CORETYPE=SkylakeX LD_LIBRARY_PATH=<OpenBLAS dir> /usr/bin/python3 bench/train_torch_alone.py
"""
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from train_step import Block  # noqa: E402
torch.set_num_threads(2); torch.manual_seed(0)
x = torch.randn(1,128,768); w = torch.randn(1,128,768)
m = Block(); opt = torch.optim.AdamW(m.parameters(), lr=1e-4)
ph=[]; tot=[]
for i in range(40):
    t=[time.perf_counter()]
    opt.zero_grad(set_to_none=True); loss=(m(x)*w).sum(); t.append(time.perf_counter())
    loss.backward(); t.append(time.perf_counter()); opt.step(); t.append(time.perf_counter())
    if i>=5: tot.append((t[-1]-t[0])*1e3); ph.append([(b-a)*1e3 for a,b in zip(t,t[1:])])
print("torch alone step %.1f ms  fwd/bwd/opt %s" % (statistics.median(tot), [round(statistics.median(c),1) for c in zip(*ph)]))
