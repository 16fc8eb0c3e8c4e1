#!/usr/bin/env python3
"""The peers of `tessel bench --target cuda` on tblock_bert (bench/cuda_box.sh runs it on the GPU box):
a BERT-base-sized pre-LN transformer block (d=768, 12 heads, MLP 3072, GELU) in PyTorch, timed under
eager and torch.compile (Inductor, default mode) on CUDA: f32 at B=1 T=128 (tblock_bert's shape, TF32
off as tessel's cuBLASLt calls) and bf16 at B=4 T=512 (the issue's anchor). Times are CUDA-event
medians of back-to-back calls after warm-up; the first call's wall time is the compile time.
Writes one JSON object to stdout (the last line) and a readable line per case to stderr."""
import json
import math
import statistics
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, d=768, heads=12, mlp=3072):
        super().__init__()
        self.h, self.dk = heads, d // heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc1, self.fc2 = nn.Linear(d, mlp), nn.Linear(mlp, d)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=-1)
        q, k, v = (z.view(b, t, self.h, self.dk).transpose(1, 2) for z in (q, k, v))
        a = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(self.dk), dim=-1) @ v
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, d))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


def time_fn(fn, x, iters=200, warm=20):
    for _ in range(warm):
        fn(x)
    torch.cuda.synchronize()
    times = []
    for _ in range(5):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(iters):
            fn(x)
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b) / iters)
    return statistics.median(times)


def case(dtype, bsz, seq, label):
    torch.manual_seed(0)
    m = Block().cuda().to(dtype).eval()
    x = torch.randn(bsz, seq, 768, device="cuda", dtype=dtype)
    out = {"case": label, "dtype": str(dtype).replace("torch.", ""), "batch": bsz, "seq": seq}
    with torch.no_grad():
        out["eager_ms"] = time_fn(m, x)
        torch._dynamo.reset()
        c = torch.compile(m)
        t0 = time.perf_counter()
        c(x)
        torch.cuda.synchronize()
        out["inductor_compile_s"] = time.perf_counter() - t0
        out["inductor_ms"] = time_fn(c, x)
        # Inductor with CUDA graphs (mode="reduce-overhead"): the launch-overhead-free figure, the fair
        # peer of tessel's graph replay.
        torch._dynamo.reset()
        g = torch.compile(m, mode="reduce-overhead")
        t0 = time.perf_counter()
        for _ in range(3):
            g(x)
        torch.cuda.synchronize()
        out["inductor_cudagraphs_compile_s"] = time.perf_counter() - t0
        out["inductor_cudagraphs_ms"] = time_fn(g, x)
        flops = 2 * bsz * seq * (768 * 3 * 768 + 768 * 768 + 2 * 768 * 3072) + 4 * bsz * seq * seq * 768
        out["gflop"] = flops / 1e9
    print(f"{label}: eager {out['eager_ms']:.3f} ms, inductor {out['inductor_ms']:.3f} ms, "
          f"inductor reduce-overhead {out['inductor_cudagraphs_ms']:.3f} ms "
          f"(compile {out['inductor_compile_s']:.1f} s), {out['gflop']:.1f} GFLOP", file=sys.stderr)
    return out


def main():
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    res = {"torch": torch.__version__, "device": torch.cuda.get_device_name(0), "cases": []}
    res["cases"].append(case(torch.float32, 1, 128, "tblock_bert f32 B=1 T=128"))
    res["cases"].append(case(torch.bfloat16, 4, 512, "bert block bf16 B=4 T=512"))
    print(json.dumps(res))


if __name__ == "__main__":
    main()
