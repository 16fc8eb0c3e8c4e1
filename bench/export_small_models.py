#!/usr/bin/python3
"""Two small models for the KTIR check (docs/ktir.md), exported with torch's ONNX exporter (opset 17) in the
ONNX model-zoo layout (model.onnx, test_data_set_0/input_0.pb, output_0.pb):

  vit_tiny     torchvision's VisionTransformer: 32x32 images, 8x8 patches, 2 layers, 2 heads, width 64
  llama_tiny   a Llama-style decoder written with torch.nn: token embedding, 2 layers of RMSNorm ->
               causal attention with rotary position embedding -> RMSNorm -> SwiGLU MLP, final RMSNorm and
               the vocabulary projection; 32 tokens, width 64, 4 heads
  ksplit_linear  one Linear(1024, 64) on one row: spyre's mapper splits its K over 4 cores (a cross-core sum)
  ksplit_uneven  one Linear(1100, 64) on one row: K over 6 cores of 192, the last core's slice 140 (a partial tile)
  conv_kinds   every convolution kind with a border on a 30x26 image: 3x3 stride 2 with padding, depthwise 3x3,
               grouped 3x3 (4 groups), dilated 3x3 (dilation 2), each padded, ReLU between

    /usr/bin/python3 bench/export_small_models.py OUTDIR [NAME ...]   (default: all of them)

Seeded: the same weights and inputs every run. Needs torch (1.13 here) and torchvision; the test data is written by bench/tensor_pb.py (no onnx package).
"""
import math
import os
import sys

import numpy as np
import torch
from torch import nn


class RMSNorm(nn.Module):
    def __init__(self, d, eps=1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(1 + 0.1 * torch.randn(d))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rotary(x, cos, sin):
    # x [B, H, T, D]: the two halves of D rotated by the position's angle
    h = x.shape[-1] // 2
    x1, x2 = x[..., :h], x[..., h:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


class Block(nn.Module):
    def __init__(self, d, heads, hidden):
        super().__init__()
        self.heads, self.hd = heads, d // heads
        self.n1, self.n2 = RMSNorm(d), RMSNorm(d)
        self.q, self.k, self.v, self.o = (nn.Linear(d, d, bias=False) for _ in range(4))
        self.gate, self.up = nn.Linear(d, hidden, bias=False), nn.Linear(d, hidden, bias=False)
        self.down = nn.Linear(hidden, d, bias=False)

    def forward(self, x, cos, sin, mask):
        b, t, d = x.shape
        h = self.n1(x)
        q = self.q(h).view(b, t, self.heads, self.hd).transpose(1, 2)
        k = self.k(h).view(b, t, self.heads, self.hd).transpose(1, 2)
        v = self.v(h).view(b, t, self.heads, self.hd).transpose(1, 2)
        q, k = rotary(q, cos, sin), rotary(k, cos, sin)
        s = q @ k.transpose(-1, -2) / math.sqrt(self.hd) + mask
        a = torch.softmax(s, dim=-1) @ v
        x = x + self.o(a.transpose(1, 2).reshape(b, t, d))
        h = self.n2(x)
        return x + self.down(torch.nn.functional.silu(self.gate(h)) * self.up(h))


class LlamaTiny(nn.Module):
    def __init__(self, vocab=128, d=64, heads=4, hidden=128, layers=2, t=32):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.blocks = nn.ModuleList(Block(d, heads, hidden) for _ in range(layers))
        self.norm = RMSNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)
        hd = d // heads
        inv = 1.0 / (10000 ** (torch.arange(0, hd // 2).float() / (hd // 2)))
        ang = torch.arange(t).float()[:, None] * inv[None, :]
        self.register_buffer("cos", torch.cos(ang))
        self.register_buffer("sin", torch.sin(ang))
        self.register_buffer("mask", torch.triu(torch.full((t, t), -1e4), diagonal=1))

    def forward(self, ids):
        x = self.emb(ids)
        for blk in self.blocks:
            x = blk(x, self.cos, self.sin, self.mask)
        return self.head(self.norm(x))


def save(folder, model, x, name):
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import tensor_pb
    os.makedirs(os.path.join(folder, "test_data_set_0"), exist_ok=True)
    model.eval()
    with torch.no_grad():
        y = model(x)
    # with gradients on, nn.MultiheadAttention takes its plain path (the fused fast path, taken under
    # no_grad in eval mode, has no ONNX export in torch 1.13)
    torch.onnx.export(model, (x,), os.path.join(folder, "model.onnx"), opset_version=17, input_names=["input"],
                      output_names=["output"], do_constant_folding=True)
    for what, t in (("input_0", x), ("output_0", y)):
        tensor_pb.write(os.path.join(folder, "test_data_set_0", what + ".pb"), t.numpy(),
                        "input" if what == "input_0" else "output")
    print(f"{name}: {os.path.getsize(os.path.join(folder, 'model.onnx')) / 1e6:.2f} MB, output {tuple(y.shape)}")


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "."
    only = set(sys.argv[2:])
    if not only or "vit_tiny" in only or "llama_tiny" in only or "ksplit_linear" in only:
        first_three(out)
    if not only or "ksplit_uneven" in only:
        torch.manual_seed(3)
        save(os.path.join(out, "ksplit_uneven"), nn.Linear(1100, 64), torch.randn(1, 1100), "ksplit_uneven")
    if not only or "conv_kinds" in only:
        torch.manual_seed(4)
        convs = nn.Sequential(nn.Conv2d(3, 16, 3, stride=2, padding=1), nn.ReLU(),
                              nn.Conv2d(16, 16, 3, padding=1, groups=16), nn.ReLU(),
                              nn.Conv2d(16, 32, 3, padding=1, groups=4), nn.ReLU(),
                              nn.Conv2d(32, 16, 3, padding=2, dilation=2))
        save(os.path.join(out, "conv_kinds"), convs, torch.randn(1, 3, 30, 26), "conv_kinds")


def first_three(out):
    torch.manual_seed(0)
    from torchvision.models.vision_transformer import VisionTransformer
    vit = VisionTransformer(image_size=32, patch_size=8, num_layers=2, num_heads=2, hidden_dim=64, mlp_dim=128,
                            num_classes=10)
    # torchvision zero-initialises the classification head: a random one makes the output depend on the rest
    nn.init.normal_(vit.heads.head.weight, std=0.2)
    nn.init.normal_(vit.heads.head.bias, std=0.2)
    save(os.path.join(out, "vit_tiny"), vit, torch.randn(1, 3, 32, 32), "vit_tiny")
    torch.manual_seed(1)
    llama = LlamaTiny()
    ids = torch.from_numpy(np.random.default_rng(0).integers(0, 128, size=(1, 32))).long()
    save(os.path.join(out, "llama_tiny"), llama, ids, "llama_tiny")
    torch.manual_seed(2)
    save(os.path.join(out, "ksplit_linear"), nn.Linear(1024, 64), torch.randn(1, 1024), "ksplit_linear")


if __name__ == "__main__":
    main()
