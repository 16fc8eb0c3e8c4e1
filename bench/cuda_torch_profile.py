#!/usr/bin/env python3
"""Where the time goes, kernel by kernel, for torch.compile(backend="tessel") and Inductor (default mode) on
one model of bench/cuda_torch_models.py (same builds: batch 8, T=128, random weights, TF32 off): each path's
steady-state call time, then the CUDA kernels torch.profiler (CUPTI) saw over --iters calls, grouped by
kernel name, with their time per call. tessel runs twice when --timed is given: with its cuBLASLt
algorithms the heuristic's first (the default) and chosen by timing candidates (TESSEL_CUDA_TIME_MATMULS=1).
docs/BENCHMARKS.md, "Tenth session".

    PYTHONPATH=.pybox/pkg python3 bench/cuda_torch_profile.py --model gpt2 [--precision f32] [--timed] [--source F.cu] [--json F]
"""
import argparse
import collections
import json
import os
import sys

import torch
from torch.profiler import ProfilerActivity, profile

import tessel

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cuda_torch_models import prepare, rel, time_ms  # noqa: E402


def kernel_table(fn, iters):
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(iters):
            fn()
        torch.cuda.synchronize()
    groups = collections.defaultdict(lambda: [0, 0.0])
    for e in prof.events():
        t = getattr(e, "device_time", None)
        if t is None:
            t = getattr(e, "cuda_time", 0.0)
        if not t:
            continue
        g = groups[e.name]
        g[0] += 1
        g[1] += t
    rows = [dict(kernel=k, per_call=c / iters, us_per_call=us / iters) for k, (c, us) in groups.items()]
    rows.sort(key=lambda r: -r["us_per_call"])
    return rows


def run(model, path, precision, a, refs):
    fn, args, kw, pick, ref = prepare(model, path, precision, a, refs)
    with torch.no_grad():
        out = pick(fn(*args, **kw))
        r = dict(path=path, max_rel=rel(out, ref))
        call = lambda: fn(*args, **kw)  # noqa: E731
        r["ms"] = time_ms(call, a.iters, a.reps)
        r["kernels"] = kernel_table(call, a.iters)
    r["kernel_ms_sum"] = sum(k["us_per_call"] for k in r["kernels"]) / 1000
    if path.startswith("tessel"):
        exes = [e.exe for g in tessel.dynamo_graphs for e in g._cache.values() if hasattr(e.exe, "stats")]
        r["stats"] = [{k: v for k, v in x.stats.items() if isinstance(v, (int, float, str))} for x in exes]
        # the generated kernels' steps (tsl_kN is step kN): what each is, to read beside its time
        steps = {f"tsl_{s['name']}": s for x in exes for s in x.steps}
        for k in r["kernels"]:
            s = steps.get(k["kernel"])
            if s:
                k["step"] = s
                k["gb_per_s"] = s["bytes"] / (k["us_per_call"] * 1e3) if k["us_per_call"] else 0
        if a.source and exes:
            with open(a.source, "w") as f:
                f.write(exes[0].source)
    return r


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="gpt2")
    p.add_argument("--precision", default="f32")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--top", type=int, default=14)
    p.add_argument("--timed", action="store_true")
    p.add_argument("--source", help="write the first tessel graph's generated CUDA C++ here")
    p.add_argument("--json")
    a = p.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    refs = {}
    runs = [run(a.model, "inductor", a.precision, a, refs), run(a.model, "tessel", a.precision, a, refs)]
    if a.timed:
        os.environ["TESSEL_CUDA_TIME_MATMULS"] = "1"
        r = run(a.model, "tessel", a.precision, a, refs)
        r["path"] = "tessel, timed algorithms"
        runs.append(r)
        del os.environ["TESSEL_CUDA_TIME_MATMULS"]
    for r in runs:
        print(f"\n== {a.model} {a.precision} {r['path']}: {r['ms']:.3f} ms per call, kernels {r['kernel_ms_sum']:.3f} ms, "
              f"max rel {r['max_rel']:.2g} {r.get('stats', '')}")
        for k in r["kernels"][:a.top]:
            s = k.get("step")
            what = f"  [{s['how'][:60]}; {s['bytes'] / 1e6:.1f} MB, {k['gb_per_s']:.0f} GB/s; {s['epilogue'][:70]}]" if s else ""
            print(f"  {k['us_per_call']:9.1f} us  x{k['per_call']:<5g} {k['kernel'][:110]}{what}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(dict(device=torch.cuda.get_device_name(0), torch=torch.__version__, model=a.model,
                           precision=a.precision, batch=a.batch, seq=a.seq, runs=runs), f, indent=1)


if __name__ == "__main__":
    main()
