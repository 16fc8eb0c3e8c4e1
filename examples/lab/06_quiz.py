"""Lab step 6: the quiz arithmetic, by hand and by tessel. Each figure is computed here from the formula and
the numbers that go into it (shapes, dtype sizes, the hardware file's facts), printed, and compared with
what tessel's report says for the same graph on the Spyre-like chip; a mismatch is an AssertionError.

 1. A matmul's roofline: FLOPs, the bytes it must move, arithmetic intensity, and which roof bounds it.
 2. Padding waste: Spyre stores a tensor's innermost dim in whole 128-byte sticks.
 3. Fusion traffic saved: relu(x*x + x) as three kernels moves each intermediate through DRAM; fused, it
    reads x and writes the result once.
 4. A scratchpad slice: what one core holds of each operand for the matmul's work split.

    PYTHONPATH=build/python /usr/bin/python3 examples/lab/06_quiz.py
"""
import json
import math
import os

import torch
import torch.nn as nn

import tessel

HW = json.load(open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "hw", "spyre.json")))
F16 = 2      # bytes per element in Spyre's storage (f16, DL16)
F32 = 4      # bytes per element of the model's own dtype (what the kernel level counts fusion traffic in)


def check(what, hand, tessel_says, rel=1e-9):
    ok = abs(hand - tessel_says) <= rel * max(abs(hand), 1)
    print(f"   -> by hand {hand:g}, tessel's report {tessel_says:g}: {'agree' if ok else 'DISAGREE'}")
    assert ok, f"{what}: hand {hand} != tessel {tessel_says}"


class MatMul(nn.Module):
    def __init__(self, k, n):
        super().__init__()
        self.w = nn.Parameter(torch.randn(k, n))

    def forward(self, x):
        return x @ self.w


class Chain(nn.Module):
    def forward(self, x):
        return torch.relu(x * x + x)


# 1. the roofline of x[M,K] @ w[K,N]
M, K, N = 16, 64, 128
mm = tessel.compile(MatMul(K, N), (torch.randn(M, K),), target="spyre")
k = mm.report["kernels"][0]
flops = 2 * M * K * N
moved = (M * K + K * N + M * N) * F16
peak = HW["matrix_unit"]["macs_per_cycle"] * HW["cores"] * HW["clock_ghz"] * 1e9 * 2
bw = HW["dram"]["read_gbps"] * 1e9
print(f"1. matmul [{M},{K}] x [{K},{N}] on spyre")
print(f"   FLOPs = 2*M*K*N = 2*{M}*{K}*{N} = {flops}")
check("flops", flops, k["flops"])
print(f"   bytes = (M*K + K*N + M*N) * {F16} B = ({M*K} + {K*N} + {M*N}) * {F16} = {moved}")
check("bytes", moved, k["min_dram_bytes"])
print(f"   intensity = FLOPs / bytes = {flops} / {moved} = {flops / moved:.3f} FLOP/B "
      f"(ridge: peak / bandwidth = {peak / 1e12:.1f} TFLOP/s / {bw / 1e9:.0f} GB/s = {peak / bw:.1f} FLOP/B)")
check("intensity", flops / moved, k["arithmetic_intensity"])
bound = max(flops / peak, moved / bw) * 1e6
print(f"   bound = max(FLOPs / peak, bytes / bandwidth) = max({flops / peak * 1e6:.5f}, {moved / bw * 1e6:.5f}) us = "
      f"{bound:.5f} us: {'memory' if moved / bw > flops / peak else 'compute'}-bound")
check("roofline", bound, k["roofline_us"])

# 2. padding waste of x[16,100] and relu(x*x+x)[16,100] in sticks of 128 B
R, C = 16, 100
stick = HW["layout"]["stick_bytes"]
chain = tessel.compile(Chain(), (torch.randn(R, C),), target="spyre")
r = chain.report
row = math.ceil(C * F16 / stick) * stick
print(f"2. padding: a [{R},{C}] f16 tensor: a row is {C}*{F16} = {C * F16} B, stored as ceil({C * F16}/{stick}) = "
      f"{row // stick} sticks = {row} B")
print(f"   waste per tensor = {R}*({row} - {C * F16}) = {R * (row - C * F16)} B; the graph stores x and the result: "
      f"2*{R * (row - C * F16)}")
check("padding", 2 * R * (row - C * F16), r["padding_waste_bytes"])

# 3. fusion traffic: relu(x*x + x) over n elements, counted in the model's f32
n = R * C
unfused = (3 * n + 3 * n + 3 * n) * F32       # mul: x, x -> t1; add: t1, x -> t2; relu = max(t2, 0): t2, 0 -> y
fused = (n + n) * F32                          # read x, write y
print(f"3. fusion: relu(x*x + x), n = {n} elements of {F32} B")
print(f"   unfused: mul reads x twice and writes t1, add reads t1 and x and writes t2, relu (max(t2, 0), its 0 "
      f"broadcast) reads two and writes y: 9n * {F32} = {unfused} B")
print(f"   fused: read x, write y: 2n * {F32} = {fused} B; saved {unfused} - {fused} = {unfused - fused} B")
check("fusion", unfused - fused, r["fusion_traffic_saved_bytes"])

# 4. scratchpad slices of the matmul's split
split = k["split"]                             # e.g. "n2": n split over 2 cores
parts = dict((s[0], int(s[1:])) for s in split.split() if s[0] in "mnk" and s[1:].isdigit())
pm, pn, pk = parts.get("m", 1), parts.get("n", 1), parts.get("k", 1)
sl = {s["tensor"]: s["slice_bytes"] for s in k["slices"]}
w_slice = (K // pk) * (N // pn) * F16
x_slice = (M // pm) * (K // pk) * F16
print(f"4. slices for split '{split}': one core's w is [{K}/{pk}, {N}/{pn}] * {F16} B = {w_slice} B, "
      f"its x [{M}/{pm}, {K}/{pk}] * {F16} B = {x_slice} B")
check("w slice", w_slice, sl["w"])
x_name = next(t for t in sl if t not in ("w", "acc") and "MatMul" not in t)
check("x slice", x_slice, sl[x_name])
print("all four agree")
