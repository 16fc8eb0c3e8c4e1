#!/usr/bin/python3
"""A decoded token over a static KV cache (issue 34; docs/python.md, mutations), on this machine's torch:
a GPT-style decoder whose caches are preallocated to --cache-len positions and written with index_copy_
at the step's position, as transformers' StaticCache does, attention over the whole cache under a mask
of the positions written. Every decode step has the same shapes, so tessel.compile compiles it once
(statically); the caches are inputs the module mutates. Three systems in ABBA-paired rounds of --tokens
steps: eager, tessel with the new caches written over the caller's caches (output_aliases: the scatter
writes its one position in place), and tessel with TESSEL_OUTPUT_ALIASES=0 (the executable computes each
new cache in its own memory and the call copies it back, the way before). Tokens and final caches are
checked against eager. `--arch llama` decodes a Llama-style model instead (LlamaDecoder: RMSNorm, rotary
embedding from inv_freq @ positions, grouped-query attention through repeat_kv's expand + reshape, SiLU-gated
MLP, no biases; --kv-heads).

    /usr/bin/python3 bench/static_cache_step.py --cache-len 384 1024 --tokens 64 --pairs 4 --threads 2 --json out.json
"""
import argparse
import json
import math
import os
import statistics
import time

import torch
import torch.nn as nn

import decode_step
import tessel


class StaticBlock(decode_step.Block):
    """decode_step's block with the step's keys and values written into preallocated caches at `pos`."""

    def forward(self, x, kc, vc, pos, mask):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, -1)
        q = q.reshape(b, t, self.h, self.dh).transpose(1, 2)
        kc.index_copy_(2, pos, k.reshape(b, t, self.h, self.dh).transpose(1, 2))
        vc.index_copy_(2, pos, v.reshape(b, t, self.h, self.dh).transpose(1, 2))
        a = ((q @ kc.transpose(-1, -2)) / math.sqrt(self.dh) + mask).softmax(-1) @ vc
        x = x + self.o(a.transpose(1, 2).reshape(b, t, d))
        return x + self.fc2(torch.nn.functional.gelu(self.fc1(self.ln2(x))))


class Decoder(decode_step.Decoder):
    """decode_step's decoder over StaticBlocks; the caches (2 per layer) are inputs it writes."""

    def __init__(self, layers, d, heads, vocab):
        super().__init__(layers, d, heads, vocab, block=StaticBlock)

    def forward(self, ids, pos, *cache):
        length = cache[0].shape[2]
        mask = torch.where(torch.arange(length)[None, :] <= pos[:, None], 0.0, float("-inf"))[None, None]
        x = self.emb(ids)
        for i, blk in enumerate(self.blocks):
            x = blk(x, cache[2 * i], cache[2 * i + 1], pos, mask)
        return self.head(self.ln(x))


class LlamaBlock(nn.Module):
    """A Llama decoder layer as transformers 5 computes it on the CPU without SDPA: RMSNorm, q/k/v
    projections without bias, the rotary embedding (rotate_half through torch.cat), the step's keys and
    values written into the static caches at `pos`, each key/value head repeated for its query heads
    (repeat_kv: expand, then reshape), scaled softmax attention, a SiLU-gated MLP."""

    def __init__(self, d, heads, kv_heads, mlp):
        super().__init__()
        self.h, self.kv, self.dh = heads, kv_heads, d // heads
        self.q = nn.Linear(d, d, bias=False)
        self.k = nn.Linear(d, kv_heads * self.dh, bias=False)
        self.v = nn.Linear(d, kv_heads * self.dh, bias=False)
        self.o = nn.Linear(d, d, bias=False)
        self.gate = nn.Linear(d, mlp, bias=False)
        self.up = nn.Linear(d, mlp, bias=False)
        self.down = nn.Linear(mlp, d, bias=False)
        self.n1 = nn.Parameter(1 + 0.1 * torch.randn(d))
        self.n2 = nn.Parameter(1 + 0.1 * torch.randn(d))

    @staticmethod
    def rms(x, w):
        return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6))

    @staticmethod
    def rotate_half(x):
        h = x.shape[-1] // 2
        return torch.cat((-x[..., h:], x[..., :h]), -1)

    def repeat_kv(self, x):
        b, kv, length, dh = x.shape
        n = self.h // kv
        return x[:, :, None].expand(b, kv, n, length, dh).reshape(b, kv * n, length, dh)

    def forward(self, x, kc, vc, pos, mask, cos, sin):
        b, t, d = x.shape
        h = self.rms(x, self.n1)
        q = self.q(h).view(b, t, self.h, self.dh).transpose(1, 2)
        k = self.k(h).view(b, t, self.kv, self.dh).transpose(1, 2)
        v = self.v(h).view(b, t, self.kv, self.dh).transpose(1, 2)
        q = q * cos + self.rotate_half(q) * sin
        k = k * cos + self.rotate_half(k) * sin
        kc.index_copy_(2, pos, k)
        vc.index_copy_(2, pos, v)
        a = ((q @ self.repeat_kv(kc).transpose(2, 3)) / math.sqrt(self.dh) + mask).softmax(-1) @ self.repeat_kv(vc)
        x = x + self.o(a.transpose(1, 2).reshape(b, t, d))
        h = self.rms(x, self.n2)
        return x + self.down(torch.nn.functional.silu(self.gate(h)) * self.up(h))


class LlamaDecoder(nn.Module):
    """LlamaBlocks over static caches (2 per layer, [1, kv_heads, length, d/heads]) written at `pos`; the
    rotary angles computed as transformers' rotary embedding does (inv_freq @ positions)."""

    def __init__(self, layers, d, heads, vocab, kv_heads=2, mlp=344):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.blocks = nn.ModuleList(LlamaBlock(d, heads, kv_heads, mlp) for _ in range(layers))
        self.norm = nn.Parameter(torch.ones(d))
        self.head = nn.Linear(d, vocab, bias=False)
        dh = d // heads
        self.register_buffer("inv_freq", 1.0 / (10000 ** (torch.arange(0, dh, 2).float() / dh)))

    def forward(self, ids, pos, *cache):
        length = cache[0].shape[2]
        mask = torch.where(torch.arange(length)[None, :] <= pos[:, None], 0.0, float("-inf"))[None, None]
        x = self.emb(ids)
        f = (self.inv_freq[None, :, None].expand(1, -1, 1) @ pos[None, None, :].float()).transpose(1, 2)
        e = torch.cat((f, f), -1)
        cos, sin = e.cos()[:, None], e.sin()[:, None]
        for i, blk in enumerate(self.blocks):
            x = blk(x, cache[2 * i], cache[2 * i + 1], pos, mask, cos, sin)
        return self.head(LlamaBlock.rms(x, self.norm))


def decode(fn, caches, start, tokens):
    """Greedy decoding of `tokens` steps written at positions start, start+1, ...; the tokens and the wall
    time per step."""
    ids, got = torch.tensor([[7]]), []
    t0 = time.perf_counter()
    for s in range(tokens):
        logits = fn(ids, torch.tensor([start + s]), *caches)
        ids = logits[:, -1:].argmax(-1)
        got.append(ids)
    return torch.cat(got, 1), (time.perf_counter() - t0) / tokens


def cache_heads(a):
    """The heads a layer's cache holds: the key/value heads (fewer than the query heads for --arch llama)."""
    return a.kv_heads if a.arch == "llama" else a.heads


def one_length(model, a, length):
    heads, dh = cache_heads(a), a.dim // a.heads

    def caches():
        g = torch.Generator().manual_seed(length)
        return [torch.randn(1, heads, length, dh, generator=g) for _ in range(2 * a.layers)]
    example = (torch.tensor([[3]]), torch.tensor([5]), *caches())
    fns = {"eager": model, "tessel": tessel.compile(model, example, threads=a.threads)}
    os.environ["TESSEL_OUTPUT_ALIASES"] = "0"          # (read when a compilation is made)
    try:
        fns["tessel_copies"] = tessel.compile(model, example, threads=a.threads)
    finally:
        del os.environ["TESSEL_OUTPUT_ALIASES"]
    start = max(0, length - a.tokens - 1)
    with torch.no_grad():
        ends = {}
        for name, fn in fns.items():
            c = caches()
            tok, _ = decode(fn, c, start, a.tokens)
            ends[name] = (tok, c)
        want_tok, want_c = ends["eager"]
        equal = {name: bool(torch.equal(tok, want_tok)) and all(torch.allclose(x, y, atol=1e-5) for x, y in zip(c, want_c))
                 for name, (tok, c) in ends.items() if name != "eager"}
        times = {name: [] for name in fns}
        for k in range(a.pairs):
            for name in (list(fns) if k % 2 == 0 else list(reversed(fns))):
                times[name].append(decode(fns[name], caches(), start, a.tokens)[1])
    counts = {name: next(iter(fns[name]._cache.values())).exe.alias_counts for name in ("tessel", "tessel_copies")}
    med = {name: statistics.median(t) * 1e3 for name, t in times.items()}
    return dict(cache_len=length, tokens_and_caches_equal=equal, ms_per_token=med, alias_counts=counts,
                tessel_over_eager=med["tessel"] / med["eager"], copies_over_eager=med["tessel_copies"] / med["eager"],
                compilations=fns["tessel"].stats.compiles)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    decode_step.add_decoder_args(ap)
    ap.add_argument("--cache-len", type=int, nargs="+", default=[384, 1024])
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--pairs", type=int, default=4)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--arch", choices=("gpt", "llama"), default="gpt")
    ap.add_argument("--kv-heads", type=int, default=2, help="--arch llama: key/value heads (grouped-query attention)")
    ap.add_argument("--json")
    a = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(a.threads)
    if a.arch == "llama":
        model = LlamaDecoder(a.layers, a.dim, a.heads, a.vocab, a.kv_heads).eval()
    else:
        model = Decoder(a.layers, a.dim, a.heads, a.vocab).eval()
    rows = []
    for length in a.cache_len:
        r = one_length(model, a, length)
        rows.append(r)
        m = r["ms_per_token"]
        print(f"static cache of {length}, {a.arch} decoder {a.layers}x{a.dim}, {a.threads} threads: equal to eager "
              f"{r['tokens_and_caches_equal']}; ms per token eager {m['eager']:.3f}, tessel {m['tessel']:.3f} "
              f"(in place: {r['alias_counts']['tessel']['outputs_in_place']} caches), tessel copying the caches "
              f"{m['tessel_copies']:.3f}; tessel/eager {r['tessel_over_eager']:.2f}, copies/eager {r['copies_over_eager']:.2f}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(dict(arch=a.arch, kv_heads=cache_heads(a), layers=a.layers, dim=a.dim, heads=a.heads, tokens=a.tokens, pairs=a.pairs, threads=a.threads,
                           torch=torch.__version__, rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
