#!/usr/bin/python3
"""The cost of a decoded token through a symbolic compilation (issue 34; docs/dynamic-shapes.md, "LLM
generation"), on this machine's torch: a GPT-style decoder (pre-norm blocks, causal attention over a KV
cache that grows by one position a step, the cache passed in and returned, as transformers' dynamic cache
does) compiled once with tessel.compile(dynamic_dims=...) and run step by step against eager, ABBA-paired
rounds of --tokens steps each. Every step is a new KV length: a new binding of the compilation, so the one
executable is rebound to it (the attention's kernels, arena plan and library calls redone) on the step's
critical path. The same compilation with an instance per binding instead (TESSEL_REBIND=0: instantiated
kernels, arena plan and library calls built per step) runs in the same rounds; the JSON gives the rebinds
and instances and the seconds they took beside the per-token times.

A prefill of --prompt tokens (after one cached position) is timed once per round beside it.

    /usr/bin/python3 bench/decode_step.py --layers 2 --dim 128 --tokens 64 --pairs 6 --threads 2 --json out.json
"""
import argparse
import json
import math
import os
import statistics
import time

import torch
import torch.nn as nn

import tessel


class Block(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.h, self.dh = heads, d // heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.o = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc1, self.fc2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x, kc, vc):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, -1)
        q = q.reshape(b, t, self.h, self.dh).transpose(1, 2)
        k = torch.cat([kc, k.reshape(b, t, self.h, self.dh).transpose(1, 2)], 2)
        v = torch.cat([vc, v.reshape(b, t, self.h, self.dh).transpose(1, 2)], 2)
        a = ((q @ k.transpose(-1, -2)) / math.sqrt(self.dh)).softmax(-1) @ v
        x = x + self.o(a.transpose(1, 2).reshape(b, t, d))
        return x + self.fc2(torch.nn.functional.gelu(self.fc1(self.ln2(x)))), k, v


class Decoder(nn.Module):
    def __init__(self, layers, d, heads, vocab, block=Block):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.blocks = nn.ModuleList([block(d, heads) for _ in range(layers)])
        self.ln, self.head = nn.LayerNorm(d), nn.Linear(d, vocab)

    def forward(self, ids, *cache):
        x, out = self.emb(ids), []
        for i, blk in enumerate(self.blocks):
            x, k, v = blk(x, cache[2 * i], cache[2 * i + 1])
            out += [k, v]
        return (self.head(self.ln(x)),) + tuple(out)


def decode(fn, ids, cache, tokens):
    """Greedy decoding of `tokens` steps from the cache; the token ids and the wall time per step."""
    got, t0 = [], time.perf_counter()
    for _ in range(tokens):
        logits, *cache = fn(ids, *cache)
        ids = logits[:, -1:].argmax(-1)
        got.append(ids)
    return torch.cat(got, 1), (time.perf_counter() - t0) / tokens


def add_decoder_args(ap):
    """The decoder's shape, for this bench and the ones built on its Decoder (static_cache_step.py)."""
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--vocab", type=int, default=1000)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_decoder_args(ap)
    ap.add_argument("--past", type=int, default=32, help="KV length before the first decoded token")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--prompt", type=int, default=256, help="a prefill's prompt length (timed in each round)")
    ap.add_argument("--pairs", type=int, default=6)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json")
    a = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(a.threads)
    model = Decoder(a.layers, a.dim, a.heads, a.vocab).eval()
    dh = a.dim // a.heads

    def cache(p):
        g = torch.Generator().manual_seed(p)
        return [torch.randn(1, a.heads, p, dh, generator=g) for _ in range(2 * a.layers)]
    ids = torch.tensor([[7]])
    dims = {0: {1: "t"}, **{1 + i: {2: "p"} for i in range(2 * a.layers)}}
    example = (torch.tensor([[1, 2, 3]]), *cache(5))
    t0 = time.perf_counter()
    fast = tessel.compile(model, example, dynamic_dims=dims, threads=a.threads)
    compile_s = time.perf_counter() - t0
    # the same compilation with an instance per binding (TESSEL_REBIND=0), the way before one executable
    # was rebound, measured beside it
    with torch.no_grad():
        want, _ = decode(model, ids, cache(a.past), a.tokens)
        got, _ = decode(fast, ids, cache(a.past), a.tokens)     # (warm: a decode step's t = 1 compiles once more)
        os.environ["TESSEL_REBIND"] = "0"                       # (read when a compilation is made)
        inst = tessel.compile(model, example, dynamic_dims=dims, threads=a.threads)
        got_inst, _ = decode(inst, ids, cache(a.past), a.tokens)
        del os.environ["TESSEL_REBIND"]
        equal = torch.equal(got, want) and torch.equal(got_inst, want)
        fns = {"eager": model, "tessel": fast, "tessel_instances": inst}
        times = {name: [] for name in fns}
        prefill = {name: [] for name in fns}
        prompt = torch.randint(0, a.vocab, (1, a.prompt), generator=torch.Generator().manual_seed(1))
        for k in range(a.pairs):
            order = list(fns) if k % 2 == 0 else list(reversed(fns))
            for name in order:
                # a new past length each round: every step is a binding not seen before
                _, dt = decode(fns[name], ids, cache(a.past + (k + 1) * a.tokens), a.tokens)
                times[name].append(dt)
                # a prefill (the prompt after one cached position), after decoding: a binding again
                t0 = time.perf_counter()
                fns[name](prompt, *cache(1))
                prefill[name].append(time.perf_counter() - t0)
    exe_stats = [e.exe.stats for e in fast._cache.values() if isinstance(getattr(getattr(e, "exe", None), "stats", None), dict)]
    inst_stats = [e.exe.stats for e in inst._cache.values() if isinstance(getattr(getattr(e, "exe", None), "stats", None), dict)]
    instances = sum(s.get("instances", 0) for s in inst_stats)
    instance_s = sum(s.get("instance_seconds", 0.0) for s in inst_stats)
    rebinds = sum(s.get("rebinds", 0) for s in exe_stats)
    rebind_s = sum(s.get("rebind_seconds", 0.0) for s in exe_stats)
    ratios = [t / e for t, e in zip(times["tessel"], times["eager"])]
    row = dict(layers=a.layers, dim=a.dim, heads=a.heads, past=a.past, tokens=a.tokens, pairs=a.pairs,
               threads=a.threads, torch=torch.__version__, tokens_equal=equal, compile_s=compile_s,
               compilations=fast.stats.compiles, recompiles=fast.stats.recompiles,
               eager_ms_per_token=statistics.median(times["eager"]) * 1e3,
               tessel_ms_per_token=statistics.median(times["tessel"]) * 1e3,
               tessel_instances_ms_per_token=statistics.median(times["tessel_instances"]) * 1e3,
               prompt=a.prompt, eager_prefill_ms=statistics.median(prefill["eager"]) * 1e3,
               tessel_prefill_ms=statistics.median(prefill["tessel"]) * 1e3,
               tessel_over_eager=statistics.median(ratios), tessel_won=sum(r < 1 for r in ratios) / len(ratios),
               instances=instances, instance_ms_mean=instance_s / max(1, instances) * 1e3,
               rebinds=rebinds, rebind_ms_mean=rebind_s / max(1, rebinds) * 1e3,
               refused=[s.get("rebind_refused") for s in exe_stats if s.get("rebind_refused")])
    print(f"decoder {a.layers}x{a.dim}, {a.tokens} tokens from KV length {a.past}, {a.threads} threads: tokens equal "
          f"{equal}; ms per token eager {row['eager_ms_per_token']:.3f}, tessel {row['tessel_ms_per_token']:.3f} "
          f"(tessel/eager {row['tessel_over_eager']:.2f}, won {row['tessel_won']:.0%}), tessel with an instance per "
          f"binding {row['tessel_instances_ms_per_token']:.3f}; compilations "
          f"{row['compilations']}, instances {instances} at {row['instance_ms_mean']:.3f} ms each, rebinds {rebinds} at "
          f"{row['rebind_ms_mean']:.3f} ms each; prefill of {a.prompt} tokens eager {row['eager_prefill_ms']:.2f} ms, "
          f"tessel {row['tessel_prefill_ms']:.2f} ms" + (f"; one executable refused: {row['refused']}" if row["refused"] else ""))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(row, f, indent=1)


if __name__ == "__main__":
    main()
