"""Grouped-query attention through tessel.compile (docs/passes/algebraic.md, "product of a repeated
operand"): a Llama-style decoder whose key/value heads are repeated for their query heads (transformers'
repeat_kv: expand, then reshape) decodes the same tokens as eager over a static cache, and its compiled
products read the unrepeated caches (no copy of the cache per query head); heads repeated the other way
round (`repeat`, head h reading kv head h % KV), a prefill of several positions and other KV lengths
stay equal to eager; through ONNX with symbolic lengths, one compilation serves three sizes.

    PYTHONPATH=build/python /usr/bin/python3 -m unittest tests.python.test_grouped_attention -v
"""
import math
import os
import subprocess
import sys
import tempfile
import unittest

import torch
import torch.nn as nn

import tessel

SOURCE_DIR = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(SOURCE_DIR, "bench"))
from static_cache_step import LlamaDecoder  # noqa: E402

torch.set_num_threads(2)
TESSEL_BINARY = os.environ.get("TESSEL_BINARY", os.path.join(SOURCE_DIR, "build", "tessel"))


def caches(layers, kv, length, dh, seed):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(1, kv, length, dh, generator=g) for _ in range(2 * layers)]


class TiledAttention(nn.Module):
    """Keys and values repeated with `repeat` (query head h reads kv head h % KV, the repeat outermost in
    the head dim), over a KV length that may be symbolic."""

    def forward(self, q, k, v):
        g = q.shape[1] // k.shape[1]
        k, v = k.repeat(1, g, 1, 1), v.repeat(1, g, 1, 1)
        return ((q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])).softmax(-1) @ v


class GroupedAttention(nn.Module):
    """Keys and values repeated as transformers' repeat_kv does (query head h reads kv head h // G)."""

    def forward(self, q, k, v):
        b, kv, n, dh = k.shape
        g = q.shape[1] // kv
        k = k[:, :, None].expand(b, kv, g, n, dh).reshape(b, kv * g, n, dh)
        v = v[:, :, None].expand(b, kv, g, n, dh).reshape(b, kv * g, n, dh)
        return ((q @ k.transpose(-1, -2)) / math.sqrt(dh)).softmax(-1) @ v


class GroupedAttentionTest(unittest.TestCase):
    def test_llama_decode_equals_eager_without_repeating_the_cache(self):
        torch.manual_seed(0)
        model = LlamaDecoder(2, 64, 4, 100, kv_heads=2, mlp=96).eval()
        length = 40
        example = (torch.tensor([[3]]), torch.tensor([5]), *caches(2, 2, length, 16, 1))
        with tempfile.TemporaryDirectory() as dump:
            os.environ["TESSEL_DUMP_DIR"] = dump
            try:
                fn = tessel.compile(model, example, threads=2)
            finally:
                del os.environ["TESSEL_DUMP_DIR"]
            stages = [os.path.join(d, f) for d, _, fs in os.walk(dump) for f in fs if f.endswith("-algebraic.tsl")]
            self.assertTrue(stages, "no algebraic stage dumped")
            with open(stages[0]) as f:
                text = f.read()
        # each layer's two attention products read the unrepeated caches: 4 products over grouped rows
        grouped = [ln for ln in text.splitlines() if '.grouped_1": ' in ln and "] = dot_general(" in ln]
        self.assertEqual(len(grouped), 4, text)
        got, want = caches(2, 2, length, 16, 2), caches(2, 2, length, 16, 2)
        ids_g = ids_w = torch.tensor([[7]])
        with torch.no_grad():
            for step in range(8):
                pos = torch.tensor([20 + step])
                lg, lw = fn(ids_g, pos, *got), model(ids_w, pos, *want)
                self.assertLess(((lg - lw).abs().max() / lw.abs().max()).item(), 1e-5)
                ids_g, ids_w = lg[:, -1:].argmax(-1), lw[:, -1:].argmax(-1)
                self.assertTrue(torch.equal(ids_g, ids_w))
        for a, b in zip(got, want):
            self.assertTrue(torch.allclose(a, b, atol=1e-5))
        self.assertEqual(fn.stats.compiles, 1)

    def test_llama_prefill_equals_eager(self):
        torch.manual_seed(1)
        model = LlamaDecoder(2, 64, 8, 100, kv_heads=2, mlp=96).eval()
        ids, pos = torch.randint(0, 100, (1, 12)), torch.arange(12)
        got, want = caches(2, 2, 24, 8, 3), caches(2, 2, 24, 8, 3)
        fn = tessel.compile(model, (ids, pos, *caches(2, 2, 24, 8, 4)), threads=2)
        with torch.no_grad():
            lg, lw = fn(ids, pos, *got), model(ids, pos, *want)
        self.assertLess(((lg - lw).abs().max() / lw.abs().max()).item(), 1e-5)
        for a, b in zip(got, want):
            self.assertTrue(torch.allclose(a, b, atol=1e-5))

    def test_heads_repeated_either_way_equal_eager(self):
        g = torch.Generator().manual_seed(5)
        for module in (GroupedAttention(), TiledAttention()):
            for q_len in (1, 3):
                q = torch.randn(2, 6, q_len, 16, generator=g)
                k, v = torch.randn(2, 2, 9, 16, generator=g), torch.randn(2, 2, 9, 16, generator=g)
                fn = tessel.compile(module, (q, k, v), threads=2)
                with torch.no_grad():
                    got, want = fn(q, k, v), module(q, k, v)
                self.assertLess((got - want).abs().max().item(), 1e-5, f"{type(module).__name__}, {q_len} queries")

    def test_kv_lengths_equal_eager(self):
        # (a compilation per length: torch 1.13's symbolic trace cannot take expand's symbolic sizes)
        g = torch.Generator().manual_seed(6)
        module = GroupedAttention()
        q = torch.randn(1, 4, 1, 16, generator=g)
        k, v = torch.randn(1, 2, 5, 16, generator=g), torch.randn(1, 2, 5, 16, generator=g)
        fn = tessel.compile(module, (q, k, v), threads=2)
        with torch.no_grad():
            for n in (5, 17, 64, 3, 1):
                k, v = torch.randn(1, 2, n, 16, generator=g), torch.randn(1, 2, n, 16, generator=g)
                self.assertLess((fn(q, k, v) - module(q, k, v)).abs().max().item(), 1e-5, f"KV length {n}")

    @unittest.skipUnless(os.path.exists(TESSEL_BINARY), f"needs the tessel command ({TESSEL_BINARY}; set TESSEL_BINARY)")
    def test_symbolic_lengths_through_onnx(self):
        # ONNX dim_params for the queries (t) and the KV length (kv): one symbolic compilation, its products
        # grouped over the unrepeated keys/values, each data set checked against torch's output.
        from onnx import numpy_helper
        module = GroupedAttention()
        g = torch.Generator().manual_seed(7)
        with tempfile.TemporaryDirectory() as d:
            ex = (torch.randn(1, 4, 1, 16), torch.randn(1, 2, 7, 16), torch.randn(1, 2, 7, 16))
            torch.onnx.export(module, ex, os.path.join(d, "model.onnx"), input_names=["q", "k", "v"], output_names=["y"],
                              dynamic_axes={"q": {2: "t"}, "k": {2: "kv"}, "v": {2: "kv"}}, opset_version=17)
            sets = []
            for i, (t, n) in enumerate([(1, 5), (3, 17), (1, 64)]):
                sets.append(os.path.join(d, f"test_data_set_{i}"))
                os.makedirs(sets[-1])
                ins = [torch.randn(1, 4, t, 16, generator=g), torch.randn(1, 2, n, 16, generator=g),
                       torch.randn(1, 2, n, 16, generator=g)]
                for j, (name, x) in enumerate(zip("qkv", ins)):
                    with open(os.path.join(sets[-1], f"input_{j}.pb"), "wb") as f:
                        f.write(numpy_helper.from_array(x.numpy(), name).SerializeToString())
                with open(os.path.join(sets[-1], "output_0.pb"), "wb") as f:
                    f.write(numpy_helper.from_array(module(*ins).numpy(), "y").SerializeToString())
            run = subprocess.run([TESSEL_BINARY, "run", d, "--dynamic", "--backend", "compiled", "--threads", "2",
                                  "--inputs", ",".join(sets), "--check"], capture_output=True, text=True, timeout=300)
            self.assertEqual(run.returncode, 0, run.stdout + run.stderr)
            self.assertEqual(run.stdout.count("-> PASS"), 3, run.stdout)
            self.assertIn("compilations: 1", run.stdout)
            kernel = subprocess.run([TESSEL_BINARY, "compile", os.path.join(d, "model.onnx"), "--dynamic", "--emit", "kernel"],
                                    capture_output=True, text=True, timeout=300)
            self.assertIn("= reshape(%q) {shape = dims[1, 2, 2*t, 16]}", kernel.stdout)


if __name__ == "__main__":
    unittest.main()
