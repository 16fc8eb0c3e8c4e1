"""The course's transformer block (pre-LN attention + GELU MLP), written as transformers models write it."""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, d=256, heads=4, mlp=1024):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, mlp)
        self.fc2 = nn.Linear(mlp, d)

    def forward(self, x):
        b, t, c = x.shape
        h = self.heads
        q, k, v = self.qkv(self.ln1(x)).split(c, dim=-1)
        q, k, v = (z.view(b, t, h, c // h).transpose(1, 2) for z in (q, k, v))
        a = ((q @ k.transpose(-2, -1)) / math.sqrt(c // h)).softmax(-1)
        y = (a @ v).transpose(1, 2).reshape(b, t, c)
        x = x + self.proj(y)
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


def make(small):
    """(block, input): d=256, 128 tokens; --small: d=64, 16 tokens (what the test runs)."""
    torch.manual_seed(0)
    d, t = (64, 16) if small else (256, 128)
    return Block(d, 4, 4 * d).eval(), torch.randn(1, t, d)


def max_rel(a, b):
    return float((a - b).abs().max() / b.abs().max())


def median_ms(fn, x, calls):
    import statistics
    import time
    times = []
    for _ in range(calls):
        t0 = time.perf_counter()
        fn(x)
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)
