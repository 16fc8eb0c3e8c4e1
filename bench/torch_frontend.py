#!/usr/bin/python3
"""tessel.compile vs PyTorch eager on the BERT-base-sized transformer block (d=768, 12 heads, MLP 3072,
input 1x128x768), both at the same thread count (torch.set_num_threads, tessel threads=).

    PYTHONPATH=build/python /usr/bin/python3 bench/torch_frontend.py [--threads 2] [--iters 20] [--rounds 3]
        [--d 768 --heads 12 --mlp 3072 --seq 128] [--json out.json]

Rounds alternate tessel and torch (so load changes hit both); each round times --iters calls after
warm-up; the figures are the medians over all timed calls, and per round. Prints JSON.
"""
import argparse
import json
import os
import platform
import statistics
import sys
import time

import torch

import tessel


# The block under test is the one tests/python/test_torch_frontend.py checks against eager.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "python"))
from test_torch_frontend import Block  # noqa: E402


def time_calls(fn, x, iters):
    out = []
    with torch.no_grad():
        for _ in range(iters):
            t0 = time.perf_counter()
            fn(x)
            out.append((time.perf_counter() - t0) * 1e3)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--d", type=int, default=768)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--mlp", type=int, default=3072)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--backend", default="compiled")
    ap.add_argument("--json", help="also write the result here")
    a = ap.parse_args()

    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    m = Block(a.d, a.heads, a.mlp).eval()
    x = torch.randn(1, a.seq, a.d)
    t0 = time.perf_counter()
    fast = tessel.compile(m, (x,), backend=a.backend, threads=a.threads)
    compile_s = time.perf_counter() - t0
    with torch.no_grad():
        ref = m(x)
    rel = ((fast(x) - ref).abs().max() / ref.abs().max()).item()
    for _ in range(3):
        time_calls(fast, x, 1)
        time_calls(m, x, 1)
    rounds = []
    all_t, all_e = [], []
    for _ in range(a.rounds):
        tt = time_calls(fast, x, a.iters)
        te = time_calls(m, x, a.iters)
        all_t += tt
        all_e += te
        rounds.append(dict(tessel_ms=statistics.median(tt), torch_ms=statistics.median(te)))
    med_t, med_e = statistics.median(all_t), statistics.median(all_e)
    result = dict(
        model=f"transformer block d={a.d} heads={a.heads} mlp={a.mlp} input 1x{a.seq}x{a.d}",
        threads=a.threads, backend=a.backend, iters=a.iters, rounds=a.rounds,
        torch_version=torch.__version__, python=platform.python_version(),
        load_average=os.getloadavg()[0], compile_seconds=compile_s, max_rel_error=rel,
        tessel_median_ms=med_t, torch_median_ms=med_e, speedup=med_e / med_t, per_round=rounds,
        stats=fast.stats.as_dict())
    text = json.dumps(result, indent=1)
    print(text)
    if a.json:
        with open(a.json, "w") as f:
            f.write(text + "\n")
    return 0 if rel <= 1e-4 else 1


if __name__ == "__main__":
    sys.exit(main())
