"""torch.compile(model, backend="tessel", dynamic=True) on torch >= 2 (the GPU box; skipped on torch 1.13):
dynamo's graphs with symbolic sizes compile once symbolically, their answers within 1e-4 of eager over
six shapes, with no graph left to PyTorch (docs/python.md, "Dynamic shapes"). The size mapping itself is
tested on torch 1.13 too (test_dynamic_shapes.DynamoSizes).

Run by hand on the box:
    PYTHONPATH=.pybox/pkg python3 -m unittest tests.python.test_dynamo_dynamic -v
"""
import unittest

import torch
import torch.nn as nn

import tessel

try:
    from .test_dynamic_shapes import attention, max_rel, mlp
except ImportError:      # run as a top-level module (unittest discover -s tests/python)
    from test_dynamic_shapes import attention, max_rel, mlp

TORCH2 = int(torch.__version__.split(".")[0]) >= 2


@unittest.skipUnless(TORCH2 and tessel.dynamo_registered, "torch.compile needs torch >= 2.0 (the GPU box)")
class DynamoDynamic(unittest.TestCase):

    def setUp(self):
        torch._dynamo.reset()
        tessel.dynamo_graphs.clear()
        tessel.dynamo_fallbacks.clear()

    def run_shapes(self, model, inputs):
        opt = torch.compile(model, backend="tessel", dynamic=True)
        with torch.no_grad():
            for x in inputs:
                ref = model(x)
                self.assertLess(max_rel(opt(x), ref), 1e-4, f"shape {tuple(x.shape)}")
        self.assertEqual(tessel.dynamo_fallbacks, [])
        self.assertGreaterEqual(len(tessel.dynamo_graphs), 1)
        self.assertLessEqual(len(tessel.dynamo_graphs), 2, [g.stats for g in tessel.dynamo_graphs])
        self.assertTrue(any(g.dynamic is not None for g in tessel.dynamo_graphs),
                        [g.stats.dynamic_fallback for g in tessel.dynamo_graphs])
        compiles = sum(g.stats.compiles for g in tessel.dynamo_graphs)
        self.assertLessEqual(compiles, 2, [g.stats.recompiles for g in tessel.dynamo_graphs])

    def test_mlp(self):
        self.run_shapes(mlp(), [torch.randn(b, 64) for b in (2, 3, 5, 8, 13, 7)])

    def test_padding_mask_indexing(self):
        """transformers' padding mask: mask[batch_idx, kv_idx] with two arange index tensors over symbolic
        sizes (GatherND with run-time strides), in tessel.compile's capture and in dynamo's graphs."""
        def masked(x, mask):
            b = torch.arange(x.shape[0])
            k = torch.arange(mask.shape[1])
            return x * mask[b[:, None], k[None, :]][:, :, None]

        def args(b, t):
            return torch.randn(b, t, 4), (torch.rand(b, t) > 0.3).float()
        fast = tessel.compile(masked, args(3, 7), dynamic_dims={0: {0: "b", 1: "t"}, 1: {0: "b", 1: "t"}})
        for b, t in ((3, 7), (2, 11), (5, 4), (4, 9)):
            a = args(b, t)
            self.assertLess(max_rel(fast(*a), masked(*a)), 1e-6)
        self.assertEqual(fast.stats.compiles, 1, (fast.stats.dynamic_fallback, fast.stats.recompiles))
        opt = torch.compile(masked, backend="tessel", dynamic=True)
        for b, t in ((3, 7), (2, 11), (5, 4), (4, 9)):
            a = args(b, t)
            self.assertLess(max_rel(opt(*a), masked(*a)), 1e-6)
        self.assertEqual(tessel.dynamo_fallbacks, [])
        self.assertLessEqual(sum(g.stats.compiles for g in tessel.dynamo_graphs), 2,
                             [(g.stats.dynamic_fallback, g.stats.recompiles) for g in tessel.dynamo_graphs])

    def test_float_attributes(self):
        """A module's float attributes under dynamic=True are graph inputs dynamo reads back with .item()
        (unspecialised floats): folded to their values, one symbolic compilation, no fallback."""
        class Norm(nn.Module):
            def __init__(self):
                super().__init__()
                self.eps, self.scale = 1e-2, 0.125
                self.fc = nn.Linear(16, 16)

            def forward(self, x):
                x = self.fc(x)
                return x / (x.pow(2).mean(-1, keepdim=True) + self.eps).sqrt() * self.scale
        self.run_shapes(Norm().eval(), [torch.randn(b, t, 16) for b, t in ((2, 5), (3, 9), (4, 17), (2, 33))])

    def test_attention(self):
        shapes = ((2, 16), (3, 5), (2, 7), (4, 33), (5, 2), (3, 64))
        self.run_shapes(attention(), [torch.randn(b, t, 64) for b, t in shapes])

    def test_grouped_query_attention(self):
        """scaled_dot_product_attention with enable_gqa (Qwen2's and Llama 3's attention: each group of query
        heads shares a key/value head) over a symbolic length: one symbolic compilation."""
        class GQA(nn.Module):
            def __init__(self):
                super().__init__()
                self.q, self.kv = nn.Linear(32, 32), nn.Linear(32, 16)

            def forward(self, x):
                b, t, _ = x.shape
                q = self.q(x).view(b, t, 4, 8).transpose(1, 2)
                k = self.kv(x).view(b, t, 2, 8).transpose(1, 2)
                o = torch.nn.functional.scaled_dot_product_attention(q, k, k, is_causal=True, enable_gqa=True)
                return o.transpose(1, 2).reshape(b, t, 32)
        self.run_shapes(GQA().eval(), [torch.randn(b, t, 32) for b, t in ((2, 5), (3, 9), (2, 17), (4, 3), (3, 6))])

    def test_an_input_written_in_place_compiles_symbolically(self):
        """A static KV cache's write (index_copy_ into a preallocated tensor the caller keeps) in a graph with
        a symbolic length: one symbolic compilation whose new cache is written back after each call, the
        outputs and the cache after every call equal to eager's (torch 1.13's symbolic trace cannot take
        index_copy_, so this is torch 2 only)."""
        class Step(nn.Module):
            def __init__(self):
                super().__init__()
                self.fc = nn.Linear(16, 16)

            def forward(self, x, pos, cache):
                cache.index_copy_(0, pos, self.fc(x))
                return torch.softmax(x @ cache.t(), -1) @ cache

        model = Step().eval()
        steps = ((5, 0), (3, 5), (7, 8), (2, 15), (9, 17), (4, 26))
        fast = tessel.compile(model, (torch.randn(5, 16), torch.arange(5), torch.zeros(64, 16)),
                              dynamic_dims={0: {0: "t"}, 1: {0: "t"}})
        opt = torch.compile(model, backend="tessel", dynamic=True)
        for fn in (fast, opt):
            mine, ref = torch.zeros(64, 16), torch.zeros(64, 16)
            with torch.no_grad():
                for t, start in steps:
                    x, pos = torch.randn(t, 16), torch.arange(start, start + t)
                    self.assertLess(max_rel(fn(x, pos, mine), model(x, pos, ref)), 1e-5, f"length {t}")
                    self.assertLess(max_rel(mine, ref), 1e-6, f"the cache after length {t}")
        self.assertEqual(fast.stats.compiles, 1, (fast.stats.dynamic_fallback, fast.stats.recompiles))
        self.assertIsNone(fast.stats.dynamic_fallback)
        self.assertEqual(tessel.dynamo_fallbacks, [])
        self.assertEqual([g.stats.dynamic_fallback for g in tessel.dynamo_graphs if g.stats.dynamic_fallback], [])
        self.assertLessEqual(sum(g.stats.compiles for g in tessel.dynamo_graphs), 2,
                             [g.stats.recompiles for g in tessel.dynamo_graphs])

    def test_a_static_mask_cut_to_a_symbolic_length(self):
        """transformers' sdpa_attention cuts a static cache's 4-D mask to the keys' length
        (`mask[:, :, :, :key.shape[-2]]`): the slice's clamp decides nothing for a length with no upper
        bound, so Qwen2's static-cache graph compiled per shape. The compilation now covers lengths up to
        the mask (the symbol's range narrowed to it): one symbolic compilation for lengths within it, and a
        longer key a recompile with the reason, never a wrong answer."""
        class Cut(nn.Module):
            def __init__(self):
                super().__init__()
                self.register_buffer("mask", torch.randn(1, 1, 1, 24))

            def forward(self, q, k):
                return torch.softmax(q @ k.transpose(-1, -2) + self.mask[:, :, :, :k.shape[-2]], -1) @ k

        model = Cut().eval()
        opt = torch.compile(model, backend="tessel", dynamic=True)
        q = torch.randn(1, 2, 3, 8)
        with torch.no_grad():
            for t in (5, 9, 17, 24):
                k = torch.randn(1, 2, t, 8)
                self.assertLess(max_rel(opt(q, k), model(q, k)), 1e-5, f"length {t}")
        self.assertEqual(tessel.dynamo_fallbacks, [])
        self.assertEqual([g.stats.dynamic_fallback for g in tessel.dynamo_graphs if g.stats.dynamic_fallback], [])
        self.assertLessEqual(sum(g.stats.compiles for g in tessel.dynamo_graphs), 2,
                             [g.stats.recompiles for g in tessel.dynamo_graphs])

    def test_a_static_shape_target_runs_new_shapes_in_pytorch_past_its_limit(self):
        """A target that compiles static shapes (here the Spyre-like chip's simulator, CUDA alike) takes a
        graph with symbolic sizes one shape at a time; past cache_limit its new shapes run in PyTorch with
        one fallback entry naming why, not TesselRecompileLimit from inside the model's call."""
        model = mlp()
        saved = dict(tessel.dynamo_options)
        tessel.dynamo_options.update(target="spyre", cache_limit=2)     # (the chip's 16-bit storage)
        try:
            opt = torch.compile(model, backend="tessel", dynamic=True)
            with torch.no_grad():
                for b in (2, 3, 5, 8, 13, 7):
                    x = torch.randn(b, 64)
                    self.assertLess(max_rel(opt(x), model(x)), 2e-2, f"batch {b}")
        finally:
            tessel.dynamo_options.clear()
            tessel.dynamo_options.update(saved)
        symbolic = [g for g in tessel.dynamo_graphs if g.stats.dynamic_fallback]
        self.assertEqual(len(symbolic), 1, [g.stats for g in tessel.dynamo_graphs])
        self.assertEqual(symbolic[0].stats.compiles, 2)
        self.assertGreaterEqual(symbolic[0].stats.eager_calls, 3)
        self.assertEqual(len(tessel.dynamo_fallbacks), 1, tessel.dynamo_fallbacks)
        self.assertIn("cache_limit=2 compilations are spent", tessel.dynamo_fallbacks[0])
        self.assertIn("static shapes", tessel.dynamo_fallbacks[0])


if __name__ == "__main__":
    unittest.main()
