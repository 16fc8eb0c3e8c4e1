#!/usr/bin/python3
"""How far valid fp32 evaluations of one torchvision model (bench/tv_onnx.py's weights, calibration and
input) spread around its float64 answer: torch's default path, channels-last, mkldnn off, one thread;
and the model's condition number (relative output change over a 1e-7 relative input perturbation, in
float64). When torch's own fp32 variants differ from float64 by more than tv_onnx.py's 1e-4, a tessel
backend within that spread is as exact as fp32 allows on that model (docs/conformance.md).

    /usr/bin/python3 bench/fp32_spread.py MODEL SIZE
"""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tv_onnx as tv  # noqa: E402
name, size = sys.argv[1], max(int(sys.argv[2]), tv.MIN_SIZE.get(sys.argv[1], 0))
torch.set_num_threads(2)
m = tv.build_model(name, 0); tv.calibrate_batchnorm(m, size, 0)
torch.manual_seed(1); x = torch.randn(1, 3, size, size)
with torch.no_grad():
    y = {"default": m(x)}
    y["channels_last"] = m.to(memory_format=torch.channels_last)(x.to(memory_format=torch.channels_last))
    m = m.to(memory_format=torch.contiguous_format)
    with torch.backends.mkldnn.flags(enabled=False):
        y["mkldnn_off"] = m(x)
    torch.set_num_threads(1); y["1thread"] = m(x); torch.set_num_threads(2)
    md = m.double(); y64 = md(x.double())
    xp = x.double() * (1 + 1e-7 * torch.randn_like(x.double()))
    kappa = ((md(xp) - y64).abs().max() / y64.abs().max()).item() / 1e-7
rel = lambda a: ((a.double() - y64).abs().max() / y64.abs().max()).item()
for k, v in y.items(): print(f"{name} torch {k:14} vs f64: {rel(v):.1e}")
print(f"{name} condition (rel out / rel in, input perturbed 1e-7): {kappa:.1e}")
