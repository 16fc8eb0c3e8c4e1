"""A training step of the tblock_bert block (pre-LN transformer block, d=768, 12 heads, MLP 3072, input
1x128x768): forward + backward + AdamW, tessel (tessel.compile(train=True) + tessel.optim.AdamW) against
PyTorch eager (torch.optim.AdamW), both at --threads; one run, steps alternating between the two,
medians, JSON out. Also the activation
bytes each keeps for the backward: tessel's remat partition's saved tensors, PyTorch's counted with
torch.autograd.graph.saved_tensors_hooks (distinct storages, parameters and the input excluded).

    OPENBLAS_CORETYPE=SkylakeX LD_LIBRARY_PATH=<OpenBLAS dir> PYTHONPATH=build/python \
        /usr/bin/python3 bench/train_step.py --threads 2 --json train_step.json
(bench/peers.py says how the OpenBLAS dir is made: Debian's torch links the netlib reference BLAS.)
"""
import argparse
import copy
import json
import math
import os
import statistics
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    """The computation of ../shared/models/tblock_bert (its ONNX graph: LayerNorm, one qkv MatMul, 12
    heads, softmax, proj, LayerNorm, fc1, exact GELU, fc2, two residuals)."""

    def __init__(self, d=768, heads=12, mlp=3072):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc1, self.fc2 = nn.Linear(d, mlp), nn.Linear(mlp, d)

    def forward(self, x):
        b, t, c = x.shape
        h = self.heads
        q, k, v = self.qkv(self.ln1(x)).split(c, dim=-1)
        q, k, v = (z.view(b, t, h, c // h).transpose(1, 2) for z in (q, k, v))
        a = ((q @ k.transpose(-2, -1)) / math.sqrt(c // h)).softmax(-1)
        x = x + self.proj((a @ v).transpose(1, 2).reshape(b, t, c))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


def torch_saved_bytes(model, x, w):
    """Bytes of the distinct tensors autograd saves for the backward, parameters and the input excluded."""
    seen, total = set(), [0]
    skip = {p.data_ptr() for p in model.parameters()} | {x.data_ptr()}

    def pack(t):
        key = (t.data_ptr(), t.numel(), t.dtype)
        if t.data_ptr() not in skip and key not in seen:
            seen.add(key)
            total[0] += t.numel() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = (model(x) * w).sum()
    loss.backward()
    model.zero_grad(set_to_none=True)
    return total[0]


def timed(steps, iters, warmup):
    """Per step function: (median step ms, every step's ms, median ms of its phases: forward, backward,
    optimizer). The systems alternate step by step, so both see the same machine load (this box is
    shared); `step(marks)` appends a perf_counter() after each phase."""
    for _ in range(warmup):
        for step in steps:
            step([])
    ms = [[] for _ in steps]
    phases = [[] for _ in steps]
    for _ in range(iters):
        for k, step in enumerate(steps):
            marks = [time.perf_counter()]
            step(marks)
            ms[k].append((marks[-1] - marks[0]) * 1e3)
            phases[k].append([(b - a) * 1e3 for a, b in zip(marks, marks[1:])])
    return [(statistics.median(m), m, dict(zip(("forward", "backward", "optimizer"),
                                               (statistics.median(c) for c in zip(*p)))))
            for m, p in zip(ms, phases)]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--json", default="")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    import tessel
    torch.manual_seed(0)
    x = torch.randn(1, 128, 768)
    w = torch.randn(1, 128, 768)
    ref = Block()
    mine = copy.deepcopy(ref)

    opt_t = torch.optim.AdamW(ref.parameters(), lr=1e-4)

    def torch_step(marks):
        opt_t.zero_grad(set_to_none=True)
        loss = (ref(x) * w).sum()
        marks.append(time.perf_counter())
        loss.backward()
        marks.append(time.perf_counter())
        opt_t.step()
        marks.append(time.perf_counter())

    t0 = time.perf_counter()
    fast = tessel.compile(mine, (x,), train=True, threads=a.threads)
    opt_m = tessel.optim.AdamW(mine.parameters(), lr=1e-4, threads=a.threads)
    compile_s = time.perf_counter() - t0

    def tessel_step(marks):
        opt_m.zero_grad(set_to_none=True)
        loss = (fast(x) * w).sum()
        marks.append(time.perf_counter())
        loss.backward()
        marks.append(time.perf_counter())
        opt_m.step()
        marks.append(time.perf_counter())

    t1 = time.perf_counter()
    tessel_step([])     # the first step compiles the AdamW graph
    opt_compile_s = time.perf_counter() - t1
    # Both models took the same steps from the same start: their losses agree (a check, not a timing).
    torch_step([])
    with torch.no_grad():
        diff = ((fast(x) - ref(x)).abs().max() / ref(x).abs().max()).item()
    (tessel_ms, tessel_all, tessel_phases), (torch_ms, torch_all, torch_phases) = timed(
        [tessel_step, torch_step], a.iters, a.warmup)
    res = dict(
        model="tblock_bert block (1x128x768, d=768, 12 heads, MLP 3072)", threads=a.threads, iters=a.iters,
        torch=torch.__version__, blas=os.environ.get("LD_LIBRARY_PATH", "system"),
        tessel_step_ms=tessel_ms, torch_step_ms=torch_ms, speedup=torch_ms / tessel_ms,
        # torch / tessel of each pair of neighbouring steps (the same machine load), median
        pair_ratio_median=statistics.median(b / a for a, b in zip(tessel_all, torch_all)),
        tessel_phases_ms=tessel_phases, torch_phases_ms=torch_phases,
        tessel_compile_s=compile_s, tessel_adamw_compile_s=opt_compile_s,
        tessel_saved_bytes=fast.step.saved_bytes, torch_saved_bytes=torch_saved_bytes(ref, x, w),
        output_rel_diff_after_one_step=diff, summary=fast.step.summary,
        tessel_ms_all=tessel_all, torch_ms_all=torch_all,
        load_average=os.getloadavg()[0])
    print(json.dumps({k: v for k, v in res.items() if not k.endswith("_all")}, indent=1))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
