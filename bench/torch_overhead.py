#!/usr/bin/python3
"""Per-call and per-partition overheads of tessel.compile (the Python side around the executable).

    PYTHONPATH=build/python /usr/bin/python3 bench/torch_overhead.py [--threads 2] [--calls 3000]
        [--breaks 0,1,2,4,8] [--json out.json]

- per call: a tiny module (Linear 4->4 on [1, 4]) through tessel.compile (graph and compiled backends),
  against PyTorch eager on the same module and against the executable's own run() (so the Python
  overhead is call - run), with its parts (signature, guard, input adoption) timed on their own;
- guards: the per-call check of the frozen parameters and buffers of torchvision resnet18 and resnet50
  (how many tensors and modules are checked, microseconds);
- per partition: a chain of k graph breaks (an aten op with no lowering, digamma, between lowered
  elementwise ops on [1, 64]) -- the slope of the call time over k, minus what PyTorch eager takes for
  the op itself, is what a partition boundary costs.

All timings are medians of --calls calls at the same thread count for tessel and PyTorch. Prints JSON.
"""
import argparse
import json
import os
import platform
import statistics
import sys
import time

import torch
import torch.nn as nn

import tessel
from tessel._compile import _split_call
from tessel._convert import to_buffer


def median_us(fn, *args, calls=3000):
    for _ in range(100):
        fn(*args)
    ts = []
    for _ in range(calls):
        t0 = time.perf_counter()
        fn(*args)
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts) * 1e6


def entry_of(compiled):
    return compiled._cache[compiled._last_key]


def per_call(threads, calls):
    torch.manual_seed(0)
    m = nn.Linear(4, 4).eval()
    x = torch.randn(1, 4)
    out = {}
    with torch.no_grad():
        out["eager_us"] = median_us(m, x, calls=calls)
    for backend in ("graph", "compiled"):
        fast = tessel.compile(m, (x,), backend=backend, threads=threads)
        e = entry_of(fast)
        ins = [to_buffer(x)]
        call = median_us(fast, x, calls=calls)
        run = median_us(e.exe.run, ins, None, calls=calls)
        out[backend] = dict(call_us=call, executable_run_us=run, python_overhead_us=call - run,
                            signature_us=median_us(_split_call, (x,), {}, calls=calls),
                            guard_us=median_us(e.guard.stale, (x,), calls=calls),
                            adopt_input_us=median_us(to_buffer, x, calls=calls))
    return out


def guards(calls):
    try:
        import torchvision
    except ImportError:
        return {"skipped": "torchvision is not installed"}
    out = {}
    for name in ("resnet18", "resnet50"):
        m = getattr(torchvision.models, name)().eval()
        x = torch.randn(1, 3, 32, 32)
        fast = tessel.compile(m, (x,), backend="graph")
        g = entry_of(fast).guard
        out[name] = dict(frozen_tensors=len(g.tensors), modules=len(g.modules),
                         guard_us=median_us(g.stale, (x,), calls=calls))
    return out


class Chain(nn.Module):
    """k graph breaks (digamma has no lowering) between lowered elementwise ops."""

    def __init__(self, k):
        super().__init__()
        self.k = k

    def forward(self, x):
        y = torch.tanh(x)
        for _ in range(self.k):
            y = torch.tanh(torch.digamma(y.abs() + 1.0))
        return y * 2.0


def partitions(threads, calls, ks):
    x = torch.randn(1, 64)
    rows = []
    for k in ks:
        fast = tessel.compile(Chain(k), (x,), backend="compiled", threads=threads)
        rows.append(dict(breaks=k, reported_breaks=fast.explanation.break_count,
                         graphs=fast.explanation.graph_count, call_us=median_us(fast, x, calls=calls)))
    with torch.no_grad():
        op_us = median_us(torch.digamma, x, calls=calls)
    if len(rows) > 1:
        # least-squares slope of call time over the number of breaks
        xs = [r["breaks"] for r in rows]
        ys = [r["call_us"] for r in rows]
        mx, my = statistics.mean(xs), statistics.mean(ys)
        slope = sum((a - mx) * (b - my) for a, b in zip(xs, ys)) / sum((a - mx) ** 2 for a in xs)
    else:
        slope = float("nan")
    return dict(rows=rows, per_break_us=slope, eager_digamma_us=op_us, per_boundary_us=slope - op_us)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--calls", type=int, default=3000)
    ap.add_argument("--breaks", default="0,1,2,4,8")
    ap.add_argument("--json", help="also write the result here")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    result = dict(threads=a.threads, calls=a.calls, torch_version=torch.__version__,
                  python=platform.python_version(), load_average=os.getloadavg()[0],
                  per_call=per_call(a.threads, a.calls), guards=guards(max(a.calls // 10, 100)),
                  partitions=partitions(a.threads, a.calls, [int(k) for k in a.breaks.split(",")]))
    text = json.dumps(result, indent=1)
    print(text)
    if a.json:
        with open(a.json, "w") as f:
            f.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
