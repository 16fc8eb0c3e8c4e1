#!/usr/bin/python3
"""torchvision models through tessel.compile and (torch >= 2) torch.compile(backend="tessel"), against
eager at the same thread count: graph breaks, max relative error, first-call seconds, median ms, and a
fresh result after an optimizer step (frozen parameters are guarded: docs/python.md).

    PYTHONPATH=build/python /usr/bin/python3 bench/torch_compile_models.py [--threads 2] [--iters 10]
        [--models resnet18,resnet50,mobilenet_v2,mobilenet_v3_large] [--size 224] [--paths tessel,dynamo]
        [--step-check resnet18] [--backend compiled] [--json out.json]

Per model and path: `breaks` (the tessel partitioner's; under torch.compile summed over dynamo's
graphs), `graphs` (dynamo graphs for torch.compile), `first_call_s`, `ms` (median of --iters calls,
alternating with eager), `eager_ms`, `max_rel`; `after_step_max_rel` for the models in --step-check
(an SGD step between two calls). Prints JSON.
"""
import argparse
import json
import os
import platform
import statistics
import sys
import time
import warnings

import torch
import torchvision

import tessel

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_frontend import time_calls  # noqa: E402  (one timing loop for the bench scripts)

TORCH2 = int(torch.__version__.split(".")[0]) >= 2


def rel(a, b):
    return ((a - b).abs().max() / b.abs().max()).item()


def make(path, m, x, threads, backend):
    if path == "tessel":
        return tessel.compile(m, (x,), threads=threads, backend=backend)
    tessel.dynamo_options.update(threads=threads, backend=backend)
    tessel.dynamo_graphs.clear()
    torch._dynamo.reset()
    return torch.compile(m, backend="tessel")


def breaks_of(path, fast):
    if path == "tessel":
        return fast.explanation.break_count, 1
    return sum(g.explanation.break_count for g in tessel.dynamo_graphs), len(tessel.dynamo_graphs)


def run_model(name, path, a):
    torch.manual_seed(0)
    m = getattr(torchvision.models, name)().eval()
    x = torch.randn(1, 3, a.size, a.size)
    with torch.no_grad():
        ref = m(x)
    t0 = time.perf_counter()
    fast = make(path, m, x, a.threads, a.backend)
    with torch.no_grad():
        out = fast(x)
    first = time.perf_counter() - t0
    row = dict(model=name, path=path, first_call_s=first, max_rel=rel(out, ref))
    row["breaks"], row["graphs"] = breaks_of(path, fast)
    fast(x)
    m(x)
    tt, te = [], []
    for _ in range(a.iters):
        tt += time_calls(fast, x, 1)
        te += time_calls(m, x, 1)
    row.update(ms=statistics.median(tt), eager_ms=statistics.median(te))
    row["speedup"] = row["eager_ms"] / row["ms"]
    if name in a.step_check.split(","):
        opt = torch.optim.SGD(m.parameters(), lr=0.1)
        m(x).square().mean().backward()
        opt.step()
        opt.zero_grad()
        with torch.no_grad():
            ref = m(x)
            t0 = time.perf_counter()
            out = fast(x)
        row.update(after_step_max_rel=rel(out, ref), after_step_call_s=time.perf_counter() - t0)
    return row


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--models", default="resnet18,resnet50,mobilenet_v2,mobilenet_v3_large")
    ap.add_argument("--size", type=int, default=224)
    ap.add_argument("--paths", default="tessel,dynamo" if TORCH2 else "tessel")
    ap.add_argument("--step-check", default="resnet18")
    ap.add_argument("--backend", default="compiled")
    ap.add_argument("--json")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    warnings.filterwarnings("ignore")
    rows = []
    for name in a.models.split(","):
        for path in a.paths.split(","):
            try:
                row = run_model(name, path, a)
            except Exception as e:  # noqa: BLE001 -- a failing model is a row, not the end of the run
                row = dict(model=name, path=path, error=f"{type(e).__name__}: {str(e)[:300]}")
            print(json.dumps(row), flush=True)
            rows.append(row)
    result = dict(threads=a.threads, backend=a.backend, size=a.size, iters=a.iters, torch_version=torch.__version__,
                  torchvision_version=torchvision.__version__, python=platform.python_version(),
                  cpus=os.cpu_count(), load_average=os.getloadavg()[0], rows=rows)
    if a.json:
        with open(a.json, "w") as f:
            f.write(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
