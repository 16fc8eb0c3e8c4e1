"""Dynamic shapes through tessel.compile (issue 34; docs/python.md, "Dynamic shapes"): one symbolic
compilation serves every size its symbols cover, checked against PyTorch eager; recompiles name their
reason; what the symbolic capture cannot take compiles per shape with a warning.

Run through ctest (python_frontend) or by hand:
    PYTHONPATH=build/python /usr/bin/python3 -m unittest tests.python.test_dynamic_shapes -v
"""
import math
import os
import unittest
import warnings

import torch
import torch.fx
import torch.nn as nn
import torch.nn.functional as F

import tessel
from tessel import _tessel
from tessel._dynamic import torch_major
from tessel._sym import SymDim, Unsupported, same

torch.set_num_threads(2)
SANITIZED = bool(os.environ.get("TESSEL_SANITIZED"))


def max_rel(out, ref):
    return ((out - ref).abs().max() / ref.abs().max()).item()


def mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(64, 128), nn.ReLU(inplace=True), nn.Linear(128, 16)).eval()


class Attention(nn.Module):
    """A GPT-2-like block written the way transformers models are: the size read from the input,
    view(B, T, H, D) and transposes, a causal mask from torch.ones(T, T).tril(), arange positions into
    an embedding, LayerNorm, scaled softmax, a GELU MLP."""

    def __init__(self, d=64, heads=4, max_len=256):
        super().__init__()
        self.heads = heads
        self.pos = nn.Embedding(max_len, d)
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc1, self.fc2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)
        self.drop = nn.Dropout(0.1)

    def forward(self, x):
        b, t, c = x.shape
        x = x + self.pos(torch.arange(t, device=x.device))
        q, k, v = self.qkv(self.ln1(x)).split(c, dim=-1)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        a = (q @ k.transpose(-2, -1)) / math.sqrt(c // self.heads)
        causal = torch.ones(t, t, device=x.device).tril()
        a = self.drop(a.masked_fill(causal == 0, float("-inf")).softmax(-1))
        y = (a @ v).transpose(1, 2).contiguous().view(b, t, c)
        x = x + self.proj(y)
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


def attention():
    torch.manual_seed(0)
    return Attention().eval()


def check(test, fast, module, inputs, tol=1e-4):
    with torch.no_grad():
        ref = module(*inputs)
    out = fast(*inputs)
    test.assertLess(max_rel(out, ref), tol, f"shapes {[tuple(t.shape) for t in inputs]}")


class SizeArithmetic(unittest.TestCase):
    """SymDim: tessel's Dim arithmetic; a question the symbols do not decide raises Unsupported."""

    def test_arithmetic_and_exact_division(self):
        s = SymDim("s0")
        self.assertEqual(str(s * 64), "64*s0")
        self.assertEqual(str(s + 1), "s0+1")
        self.assertEqual((s * 64) // 64, s)
        self.assertEqual(s * 4 - s * 4, 0)
        self.assertIsInstance(s * 4 - s * 4, int)
        self.assertEqual((s * 6) % 3, 0)
        with self.assertRaisesRegex(Unsupported, "not exact"):
            s // 3
        with self.assertRaisesRegex(Unsupported, "depends on the value"):
            s % 3

    def test_comparisons_hold_for_every_value_or_raise(self):
        s = SymDim("s0")
        self.assertTrue(s >= 1)
        self.assertFalse(s < 0)
        self.assertTrue(2 * s > s)
        self.assertFalse(s == 0)
        with self.assertRaisesRegex(Unsupported, "s0 == 1"):
            s == 1
        with self.assertRaisesRegex(Unsupported, "symbolic"):
            int(s)
        with self.assertRaisesRegex(Unsupported, "as a float"):
            s / 2

    def test_same_never_raises(self):
        s = SymDim("s0")
        self.assertTrue(same([s, 4], [SymDim("s0"), 4]))
        self.assertFalse(same([s, 4], [1, 4]))
        self.assertFalse(same(s, SymDim("s1")))


class Builder(unittest.TestCase):
    """GraphBuilder's symbolic inputs, types, size attributes and the size functions."""

    def test_symbolic_input_and_type(self):
        b = _tessel.GraphBuilder("g")
        b.declare_symbol("s0", 2, 512, 2)
        x = b.input("x", "f32", ["s0", 64])
        self.assertEqual(b.type(x), ("f32", ["s0", 64]))
        self.assertEqual(b.symbols(), [("s0", 2, 512, 2)])
        y = b.node("Relu", "r", [x])[0]
        sizes = b.node("Sizes", "sz", [], 1, {"dims": ["2*s0", 32], "shape": [2], "dtype": "i64"})[0]
        z = b.node("Reshape", "rs", [y, sizes])[0]
        self.assertEqual(b.type(z), ("f32", ["2*s0", 32]))

    def test_undeclared_symbol_and_bad_size_are_one_line_errors(self):
        b = _tessel.GraphBuilder("g")
        with self.assertRaisesRegex(tessel.TesselError, "names size symbol 's1', which is not declared"):
            b.input("x", "f32", ["s1", 4])
        with self.assertRaisesRegex(tessel.TesselError, "'s0 x' is not a size"):
            b.input("x", "f32", ["s0 x", 4])
        with self.assertRaisesRegex(tessel.TesselError, "is not a size"):
            b.input("x", "f32", [2.5, 4])

    def test_size_functions(self):
        self.assertEqual(_tessel.dim_binary("mul", "s0", 4), "4*s0")
        self.assertIsNone(_tessel.dim_binary("div", "s0", 4))
        self.assertEqual(_tessel.dim_binary("div", "4*s0", 4), "s0")
        self.assertTrue(_tessel.dim_nonneg("s0-1"))
        self.assertEqual(_tessel.dim_eval("2*s0+1", {"s0": 5}), 11)


class NarrowedRange(unittest.TestCase):
    """A static axis cut to a symbolic length (aten.slice up to a size symbol: transformers' sdpa_attention
    cutting a static cache's mask to the keys' length): the lowering narrows the symbol's range to the
    axis where the example's length lies within it, and the Slice's shape rule then takes the length as
    is (the C++ rules read the narrowed range). The end-to-end case is torch 2's (test_dynamo_dynamic);
    torch 1.13's symbolic trace cannot slice by a SymInt."""

    def lowered_cut(self, hint, hi=None):
        from types import SimpleNamespace
        from tessel._convert import _Lowerer
        from tessel._dynamic import Symbolic, SymbolSpec
        from tessel.aten_table import _slice
        spec = SymbolSpec("s0") if hi is None else SymbolSpec("s0", 2, hi)
        sym = Symbolic({}, {"s0": spec}, [], [])
        b = _tessel.GraphBuilder("g")
        sym.declare(b)
        m = b.input("m", "f32", [1, 1, 1, 24])
        L = _Lowerer(b, "cut", symbolic=sym)
        node = SimpleNamespace(args=(None, 3, 0, SimpleNamespace(meta={"val": hint})), kwargs={})
        return b, spec, L, _slice(L, node, m, 3, 0, SymDim("s0"))

    def test_the_range_narrowed_to_the_axis(self):
        b, spec, _, y = self.lowered_cut(10)
        self.assertEqual((spec.lo, spec.hi), (2, 24))
        self.assertEqual(b.symbols(), [("s0", 2, 24, 1)])
        self.assertEqual(b.type(y), ("f32", [1, 1, 1, "s0"]))
        self.assertFalse(spec.holds(25))     # the guard: a longer key recompiles

    def test_an_example_past_the_axis_narrows_nothing(self):
        with self.assertRaisesRegex(tessel.TesselError, "depends on the symbols"):
            self.lowered_cut(30)

    def test_a_range_within_the_axis_stays(self):
        b, spec, L, y = self.lowered_cut(10, hi=16)
        self.assertEqual(b.symbols(), [("s0", 2, 16, 1)])
        self.assertEqual(b.type(y), ("f32", [1, 1, 1, "s0"]))
        self.assertFalse(L.narrow_symbol(SymDim("2*s0"), 24, 4))   # an expression: no narrowing


class Mlp(unittest.TestCase):

    def test_one_compilation_for_every_batch(self):
        m = mlp()
        fast = tessel.compile(m, (torch.randn(4, 64),), dynamic=True)
        for b in (2, 3, 5, 8, 16, 7):
            check(self, fast, m, (torch.randn(b, 64),))
        self.assertEqual(fast.stats.compiles, 1, (fast.stats.dynamic_fallback, fast.stats.recompiles))
        self.assertEqual(fast.stats.bindings, 7)
        # one executable rebound to each new batch (none of the 7 calls repeats the call before it)
        self.assertEqual(fast.stats.instances, 0)
        self.assertGreaterEqual(fast.stats.rebinds, 6)
        info = fast.dynamic
        self.assertEqual(info["inputs"], {0: ["s0", "64"]})
        self.assertEqual(info["symbols"], {"s0": (2, 1 << 31, 1)})
        # dynamic=True made dim 1 a symbol too; the Linear tied it to 64
        self.assertTrue(any("dim 1" in s and "64" in s for s in info["specialised"]), info)
        self.assertIsNone(fast.stats.dynamic_fallback)

    def test_size_one_compiles_once_more_with_the_reason(self):
        m = mlp()
        fast = tessel.compile(m, (torch.randn(4, 64),), dynamic_dims={0: [0]})
        check(self, fast, m, (torch.randn(1, 64),))
        check(self, fast, m, (torch.randn(6, 64),))
        self.assertEqual(fast.stats.compiles, 2)
        self.assertEqual(fast.stats.recompiles, ["input 0 dim 0 is 1, outside s0 in [2, 2147483648]"])

    def test_outside_the_declared_range_recompiles(self):
        m = mlp()
        fast = tessel.compile(m, (torch.randn(4, 64),), dynamic_dims={0: {0: ("batch", 2, 8)}})
        check(self, fast, m, (torch.randn(8, 64),))
        check(self, fast, m, (torch.randn(9, 64),))
        check(self, fast, m, (torch.randn(5, 64),))
        self.assertEqual(fast.stats.compiles, 2)
        self.assertEqual(fast.stats.recompiles, ["input 0 dim 0 is 9, outside batch in [2, 8]"])

    def test_multiple_of(self):
        m = mlp()
        fast = tessel.compile(m, (torch.randn(8, 64),), dynamic_dims={0: {0: ("batch", 2, 64, 4)}})
        check(self, fast, m, (torch.randn(12, 64),))
        check(self, fast, m, (torch.randn(10, 64),))
        self.assertEqual(fast.stats.recompiles, ["input 0 dim 0 is 10, outside batch in [2, 64] multiple_of 4"])

    def test_a_wrong_static_dim_names_it(self):
        m = mlp()
        fast = tessel.compile(m, (torch.randn(4, 64),), dynamic=True)
        with self.assertRaises(tessel.TesselCaptureError):
            fast(torch.randn(4, 32))          # the Linear cannot take it: captured again, PyTorch's error
        self.assertEqual(fast.stats.compiles, 1)

        double = tessel.compile(lambda x: x * 2, (torch.randn(4, 8),), dynamic_dims={0: [0]})
        check(self, double, lambda x: x * 2, (torch.randn(3, 5),))
        self.assertEqual(double.stats.recompiles, ["input 0 dim 1 is 5, compiled for 8"])

    def test_the_compiled_backends_guard_failure_recompiles(self):
        """GuardFailure from C++ reaches Python as tessel.GuardFailure, and a call it refuses recompiles
        with its reason (here with the Python-side check switched off, so that the C++ one decides)."""
        m = mlp()
        fast = tessel.compile(m, (torch.randn(4, 64),), dynamic_dims={0: {0: ("batch", 2, 8)}})
        entry = next(e for e in fast._cache.values() if e.symbolic is not None)
        with self.assertRaisesRegex(tessel.GuardFailure, "batch = 9 is outside"):
            entry.exe.run([(torch.randn(9, 64).numpy(), "f32")])
        entry.admits = lambda args: None
        check(self, fast, m, (torch.randn(9, 64),))
        self.assertEqual(fast.stats.compiles, 2)
        self.assertIn("batch = 9 is outside", fast.stats.recompiles[0])

    def test_eager_backend(self):
        m = mlp()
        fast = tessel.compile(m, (torch.randn(4, 64),), dynamic=True, backend="eager")
        for b in (2, 3, 9):
            check(self, fast, m, (torch.randn(b, 64),))
        self.assertEqual(fast.stats.compiles, 1)
        entry = next(e for e in fast._cache.values() if e.symbolic is not None)
        with self.assertRaisesRegex(tessel.GuardFailure, "dim 1 is 32"):
            entry.exe.run([(torch.randn(4, 32).numpy(), "f32")])

    def test_graph_backend_falls_back_with_a_warning(self):
        m = mlp()
        with self.assertWarnsRegex(UserWarning, "graph backend plans static shapes"):
            fast = tessel.compile(m, (torch.randn(4, 64),), dynamic=True, backend="graph")
        check(self, fast, m, (torch.randn(3, 64),))
        self.assertEqual(fast.stats.compiles, 2)
        self.assertIn("graph backend", fast.stats.dynamic_fallback)

    def test_bad_dynamic_dims_are_one_line_errors(self):
        m = mlp()
        x = torch.randn(4, 64)
        for dims, msg in (({1: [0]}, "names input 1"), ({0: [2]}, "not a dim"), ({0: {0: ("b", 8, 2)}}, "empty"),
                          ({0: {0: "9x"}}, "not a size symbol name"), ({0: {0: ("b", 5, 9)}}, "outside b in")):
            with self.assertRaisesRegex(tessel.TesselError, msg):
                tessel.compile(m, (x,), dynamic_dims=dims)
        with self.assertRaisesRegex(tessel.TesselError, "at least 2"):
            tessel.compile(m, (torch.randn(1, 64),), dynamic_dims={0: [0]})
        with self.assertRaisesRegex(tessel.TesselError, "different sizes"):
            tessel.compile(lambda a, b: a + b.sum(), (torch.randn(4, 3), torch.randn(5, 3)),
                           dynamic_dims={0: {0: "n"}, 1: {0: "n"}})


class AttentionBlock(unittest.TestCase):

    def test_batch_and_sequence(self):
        m = attention()
        fast = tessel.compile(m, (torch.randn(2, 16, 64),), dynamic_dims={0: {0: "batch", 1: ("seq", 2, 128)}})
        for b, t in ((3, 5), (2, 7), (4, 33), (5, 2), (2, 128), (3, 64)):
            check(self, fast, m, (torch.randn(b, t, 64),))
        self.assertEqual(fast.stats.compiles, 1, (fast.stats.dynamic_fallback, fast.stats.recompiles))
        self.assertEqual(fast.dynamic["inputs"], {0: ["batch", "seq", "64"]})
        check(self, fast, m, (torch.randn(2, 129, 64),))
        self.assertEqual(fast.stats.recompiles, ["input 0 dim 1 is 129, outside seq in [2, 128]"])

    def test_one_name_in_two_inputs_is_one_symbol(self):
        class Pooled(nn.Module):
            def __init__(self):
                super().__init__()
                self.block = attention()

            def forward(self, x, keep):
                return self.block(x).mean(1) + keep.mean(1, keepdim=True)
        pooled = Pooled().eval()
        x, keep = torch.randn(2, 8, 64), torch.ones(2, 8)
        fast = tessel.compile(pooled, (x, keep), dynamic_dims={0: {0: "b", 1: "t"}, 1: {0: "b", 1: "t"}})
        check(self, fast, pooled, (torch.randn(3, 11, 64), torch.rand(3, 11)))
        self.assertEqual(fast.stats.compiles, 1, (fast.stats.dynamic_fallback, fast.stats.recompiles))
        self.assertEqual(fast.dynamic["inputs"], {0: ["b", "t", "64"], 1: ["b", "t"]})
        # eager takes different lengths here; the compilation that made them one symbol does not
        check(self, fast, pooled, (torch.randn(3, 11, 64), torch.rand(3, 12)))
        self.assertEqual(fast.stats.recompiles, ["input 1 dim 1 is 12, but input 0 dim 1 (t) is 11"])

    def test_a_branch_on_a_size_is_a_shape_guard(self):
        def branchy(x):
            return x * 2 if x.shape[1] > 8 else x * 3
        fast = tessel.compile(branchy, (torch.randn(2, 4),), dynamic=True)
        for t in (5, 12, 6, 20):
            check(self, fast, branchy, (torch.randn(2, t),))
        self.assertEqual(fast.stats.compiles, 2)
        self.assertEqual(len(fast.stats.recompiles), 1)
        self.assertRegex(fast.stats.recompiles[0], r"shape guard (s1 > 8 was False|s1 <= 8 was True) at capture .*not for s1=12")

    def test_sizes_as_tensor_values(self):
        """A size used as a tensor value (a mean by hand; transformers' `torch.arange(q) + past_length`)
        is computed at run time: one symbolic compilation."""
        def scaled(x):
            return x / x.shape[0]

        def offsets(x, kv):
            q, p = x.shape[1], kv.shape[1]
            pos = torch.arange(q) + p                     # the queries' positions after p cached keys
            mask = torch.arange(p + q).unsqueeze(0) <= pos.unsqueeze(1)
            s = x @ torch.cat([kv, x], 1).transpose(1, 2)
            return s.masked_fill(~mask, -1e9).softmax(-1) * (p + 1)
        fast = tessel.compile(scaled, (torch.randn(4, 3),), dynamic_dims={0: [0]})
        for b in (5, 9, 2):
            check(self, fast, scaled, (torch.randn(b, 3),))
        fast2 = tessel.compile(offsets, (torch.randn(2, 3, 8), torch.randn(2, 5, 8)),
                               dynamic_dims={0: {1: "q"}, 1: {1: "p"}})
        for q, p in ((3, 5), (2, 6), (4, 9), (2, 2), (7, 3)):
            check(self, fast2, offsets, (torch.randn(2, q, 8), torch.randn(2, p, 8)))
        for f in (fast, fast2):
            self.assertEqual(f.stats.compiles, 1, (f.stats.dynamic_fallback, f.stats.recompiles))
            self.assertIsNotNone(f.dynamic)

    def test_what_the_symbolic_capture_cannot_take_compiles_per_shape(self):
        def conv(x):
            return F.conv1d(x, torch.ones(2, 3, 3))      # a spatial dim: its output size is a floor division
        with self.assertWarnsRegex(UserWarning, "fall back to a compilation per input shape"):
            fast = tessel.compile(conv, (torch.randn(2, 3, 9),), dynamic_dims={0: [2]})
        check(self, fast, conv, (torch.randn(2, 3, 11),))
        self.assertEqual(fast.stats.compiles, 2)
        self.assertIn("dim 2 is symbolic (s0)", fast.stats.dynamic_fallback)
        # with dynamic=True the refusal names the spatial symbol: that dim is made static, the batch stays one
        with self.assertWarnsRegex(UserWarning, "dynamic shapes: s2 static"):
            fast = tessel.compile(conv, (torch.randn(2, 3, 9),), dynamic=True)
        check(self, fast, conv, (torch.randn(4, 3, 9),))
        self.assertEqual((fast.stats.compiles, fast.dynamic["inputs"]), (1, {0: ["s0", "3", "9"]}))

        def reads(x):
            return x * 2 if bool(x.sum() > 0) else x * 3     # a value read: a value guard, on real tensors
        with self.assertWarnsRegex(UserWarning, "fall back"):
            fast = tessel.compile(reads, (torch.ones(4, 3),), dynamic=True)
        check(self, fast, reads, (-torch.ones(4, 3),))
        self.assertEqual(len(fast.explanation.guards), 1)


class TorchModules(unittest.TestCase):
    """nn.TransformerEncoder and nn.MultiheadAttention in eval take fused fast paths
    (_transformer_encoder_layer_fwd, _native_multi_head_attention) that torch 1.13 cannot trace
    symbolically: their Python forms trace instead."""

    def test_transformer_encoder(self):
        torch.manual_seed(0)
        layer = nn.TransformerEncoderLayer(64, 4, 128, dropout=0.0, batch_first=True, norm_first=True)
        m = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False).eval()
        fast = tessel.compile(m, (torch.randn(2, 8, 64),), dynamic_dims={0: {0: "batch", 1: "seq"}})
        for b, t in ((3, 5), (2, 17), (4, 9)):
            check(self, fast, m, (torch.randn(b, t, 64),))
        self.assertEqual(fast.stats.compiles, 1, (fast.stats.dynamic_fallback, fast.stats.recompiles))

    def test_multihead_attention_with_a_padding_mask(self):
        torch.manual_seed(0)

        class Attend(nn.Module):
            def __init__(self):
                super().__init__()
                self.mha = nn.MultiheadAttention(64, 4, batch_first=True)

            def forward(self, x, pad):
                return self.mha(x, x, x, key_padding_mask=pad, need_weights=False)[0]
        attend = Attend().eval()
        x, pad = torch.randn(2, 8, 64), torch.zeros(2, 8, dtype=torch.bool)
        pad[:, -2:] = True
        fast = tessel.compile(attend, (x, pad), dynamic_dims={0: {0: "b", 1: "t"}, 1: {0: "b", 1: "t"}})
        pad = torch.zeros(3, 11, dtype=torch.bool)
        pad[:, -3:] = True
        check(self, fast, attend, (torch.randn(3, 11, 64), pad))
        self.assertEqual(fast.stats.compiles, 1, (fast.stats.dynamic_fallback, fast.stats.recompiles))


class Convolutions(unittest.TestCase):

    def test_dynamic_true_makes_spatial_dims_static_and_keeps_the_batch(self):
        torch.manual_seed(0)
        m = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                          nn.Linear(8, 4)).eval()
        with self.assertWarnsRegex(UserWarning, r"s2 static \(.*Conv over f32\[s0,3,s2,s3\]: dim 2 is symbolic"):
            fast = tessel.compile(m, (torch.randn(2, 3, 16, 16),), dynamic=True)
        for b in (3, 5):
            check(self, fast, m, (torch.randn(b, 3, 16, 16),))
        self.assertEqual(fast.stats.compiles, 1)
        self.assertEqual(fast.dynamic["inputs"], {0: ["s0", "3", "16", "16"]})
        self.assertEqual(len(fast.dynamic["specialised"]), 3)     # s1 by the weight, s2 and s3 by Conv


@unittest.skipIf(SANITIZED, "torchvision models are slow in the sanitized build")
class Torchvision(unittest.TestCase):
    """Convolutions and pooling over a symbolic batch. PyTorch specialises sizes 0 and 1 (a size 1
    broadcasts), so batch 1 gets a compilation of its own; every other batch shares one."""

    def run_model(self, name):
        import torchvision
        torch.manual_seed(0)
        m = getattr(torchvision.models, name)().eval()
        fast = tessel.compile(m, (torch.randn(2, 3, 64, 64),), dynamic_dims={0: [0]})
        for b in (1, 2, 3, 4, 5, 6):
            check(self, fast, m, (torch.randn(b, 3, 64, 64),))
        self.assertEqual(fast.stats.compiles, 2, fast.stats.recompiles)
        self.assertEqual(fast.stats.recompiles, ["input 0 dim 0 is 1, outside s0 in [2, 2147483648]"])
        self.assertEqual(fast.stats.bindings, 5)     # batches 2..6 on the symbolic compilation

    def test_resnet18(self):
        self.run_model("resnet18")

    def test_mobilenet_v2(self):
        self.run_model("mobilenet_v2")


class KVCacheDecode(unittest.TestCase):
    """Greedy decoding with a KV cache that grows one position a step (the cache passed in and returned,
    as transformers' dynamic cache does): one symbolic compilation for the prompt and one for the
    one-token steps serve every length, each step within 1e-5 of eager and the same tokens."""

    def test_every_step_is_a_binding_of_one_compilation(self):
        torch.manual_seed(0)
        d, h = 32, 2

        class Decoder(nn.Module):
            def __init__(self):
                super().__init__()
                self.emb, self.qkv, self.head = nn.Embedding(50, d), nn.Linear(d, 3 * d), nn.Linear(d, 50)

            def forward(self, ids, kc, vc):
                x = self.emb(ids)
                b, t, _ = x.shape
                q, k, v = self.qkv(x).split(d, -1)
                q = q.reshape(b, t, h, d // h).transpose(1, 2)
                k = torch.cat([kc, k.reshape(b, t, h, d // h).transpose(1, 2)], 2)
                v = torch.cat([vc, v.reshape(b, t, h, d // h).transpose(1, 2)], 2)
                a = (q @ k.transpose(-1, -2) / math.sqrt(d // h)).softmax(-1) @ v
                return self.head(x + a.transpose(1, 2).reshape(b, t, d)), k, v
        m = Decoder().eval()
        fast = tessel.compile(m, (torch.tensor([[1, 2, 3]]), torch.randn(1, h, 4, d // h), torch.randn(1, h, 4, d // h)),
                              dynamic_dims={0: {1: "t"}, 1: {2: "p"}, 2: {2: "p"}})

        def generate(fn, steps):
            ids, out = torch.tensor([[4, 9, 1, 7]]), []
            kc = vc = torch.randn(1, h, 2, d // h, generator=torch.Generator().manual_seed(1))
            for _ in range(steps):
                logits, kc, vc = fn(ids, kc, vc)
                out.append(logits)
                ids = logits[:, -1:].argmax(-1)
            return out
        with torch.no_grad():
            want, got = generate(m, 12), generate(fast, 12)
        for k, (g, w) in enumerate(zip(got, want)):
            self.assertLess(max_rel(g, w), 1e-5, f"step {k}")
        self.assertEqual(fast.stats.compiles, 2, fast.stats.recompiles)     # the prompt, then t = 1
        self.assertGreaterEqual(fast.stats.bindings, 12)


class NeededEqual(unittest.TestCase):
    """Two symbols the graph needs equal (a refusal of tessel's shape rules says so; dynamo gives each KV
    cache tensor of a transformers model its own length symbol) become one when the call agrees."""

    def test_refusals_that_merge_two_symbols(self):
        from tessel._compile import _needed_equal
        from tessel._dynamic import DynamicPlan, SymbolSpec
        a, b, c = SymbolSpec("s53"), SymbolSpec("s40"), SymbolSpec("s7")
        plan = DynamicPlan({0: {2: a}, 1: {2: b}, 2: {0: c}})
        args = [torch.zeros(1, 4, 9, 2), torch.zeros(1, 4, 9, 2), torch.zeros(5)]
        why = ("[infer] node 'x' (MatMul): MatMul inner dimensions differ: [1,4,1,s53+1] and [1,4,s40+1,32]: "
               "s53+1 and s40+1 must be equal, which the symbols do not decide")
        self.assertEqual(_needed_equal(why, plan, args), ("s53", "s40"))
        merged = plan.merged("s53", "s40")
        self.assertEqual(sorted(merged.symbols), ["s53", "s7"])
        self.assertEqual(merged.dims[1][2].name, "s53")
        self.assertEqual(_needed_equal("shapes [s53,8] and [s40,8] broadcast only if s53 equals s40 (or either is 1), "
                                       "which the symbols do not decide", plan, args), ("s53", "s40"))
        # sizes that differ in this call, offsets that differ, a symbol that is not the plan's: no merge
        self.assertIsNone(_needed_equal("s53 and s7 must be equal, which the symbols do not decide", plan, args))
        self.assertIsNone(_needed_equal("s53+1 and s40 must be equal, which the symbols do not decide", plan, args))
        self.assertIsNone(_needed_equal("s53 and u0 must be equal, which the symbols do not decide", plan, args))


class DynamoSizes(unittest.TestCase):
    """torch.compile's graphs with symbolic sizes, made by hand on torch 1.13 (placeholders whose
    example values are a SymInt and a fake tensor with symbolic dims, as dynamo gives them)."""

    def graph(self, fn, shape):
        from torch._subclasses.fake_tensor import FakeTensorMode
        from torch.fx.experimental.symbolic_shapes import ShapeEnv

        class M(nn.Module):
            def forward(self, n, x):
                return fn(n, x)
        gm = torch.fx.symbolic_trace(M())
        if torch_major() >= 2:      # (the mode's ShapeEnv gives every dim a symbol)
            fake = FakeTensorMode(shape_env=ShapeEnv()).from_tensor(torch.randn(*shape))
        else:
            fake = FakeTensorMode().from_tensor(torch.randn(*shape), shape_env=ShapeEnv())
        n, x = (p for p in gm.graph.nodes if p.op == "placeholder")
        n.meta["example_value"], x.meta["example_value"] = fake.shape[0], fake
        return gm, [fake.shape[0], fake]

    def test_size_expressions_evaluate_as_sympy_does(self):
        # _SizedCall checks each SymInt input against its expression on every call, through closures
        # built once (_evaluator); they give sympy's own value for sums, products, powers, floor
        # division and remainders, and refuse a form they do not compute.
        import sympy
        from tessel._dynamo import _evaluator
        from tessel._sym import Unsupported
        try:
            from torch.utils._sympy.functions import FloorDiv
        except ImportError:     # (torch 1.13)
            from torch.fx.experimental.symbolic_shapes import FloorDiv
        s0, s1 = sympy.symbols("s0 s1", integer=True, positive=True)
        exprs = [s0 + 1, 2 * s0 * s1 + 3, s0 ** 2 - s1, FloorDiv(s0 * s1, 4), sympy.Mod(s0 + 7, s1), sympy.Integer(5)]
        for e in exprs:
            for v0, v1 in ((1, 1), (7, 3), (128, 9)):
                want = e.subs({s0: v0, s1: v1})
                self.assertEqual(_evaluator(e)({"s0": v0, "s1": v1}), int(want), str(e))
        with self.assertRaises(Unsupported):
            _evaluator(sympy.sqrt(s0))

    def setUp(self):
        tessel.dynamo_graphs.clear()
        tessel.dynamo_fallbacks.clear()

    @staticmethod
    def reshape_relu(n, x):
        return (x.reshape(n, -1) * 2).relu()

    def test_symint_inputs_come_from_tensor_dims(self):
        fn = self.reshape_relu
        gm, example = self.graph(fn, (4, 8))
        compiled = tessel.tessel_backend(gm, example)
        for b in (4, 6, 9):
            x = torch.randn(b, 8)
            self.assertTrue(torch.allclose(compiled(b, x), fn(b, x)))
        self.assertEqual(tessel.dynamo_fallbacks, [])
        self.assertEqual(len(tessel.dynamo_graphs), 1)
        self.assertEqual(tessel.dynamo_graphs[0].stats.compiles, 1)
        # a SymInt argument that is not what the tensor gives it: the graph runs in PyTorch
        x = torch.randn(4, 8)
        self.assertTrue(torch.equal(compiled(2, x), fn(2, x)))
        self.assertEqual(tessel.dynamo_graphs[0].stats.eager_calls, 1)

    def test_a_size_the_graph_returns_is_computed_from_the_call(self):
        # A graph that returns a SymInt beside its tensors (transformers' static cache returns a length):
        # tessel compiles the tensors symbolically and computes the size from the call's tensor dims.
        fn = self.reshape_relu
        gm, example = self.graph(lambda n, x: (fn(n, x), n + 3, x.shape[0] * 2), (4, 8))
        out = next(p for p in gm.graph.nodes if p.op == "output")
        _, plus, twice = out.args[0]
        plus.meta["example_value"] = example[0] + 3
        twice.meta["example_value"] = example[1].shape[0] * 2
        compiled = tessel.tessel_backend(gm, example)
        for b in (4, 6, 9):
            x = torch.randn(b, 8)
            y, m, k = compiled(b, x)
            self.assertTrue(torch.allclose(y, fn(b, x)))
            self.assertEqual((m, k), (b + 3, 2 * b))
        self.assertEqual(tessel.dynamo_fallbacks, [])
        self.assertEqual(len(tessel.dynamo_graphs), 1)
        self.assertEqual(tessel.dynamo_graphs[0].stats.compiles, 1)

    def test_a_static_shape_target_runs_new_shapes_in_pytorch_past_its_limit(self):
        # The Spyre-like chip compiles static shapes: a graph with symbolic sizes compiles once per shape
        # while cache_limit allows; past it each new shape runs in PyTorch, one fallback entry for the
        # graph (a generate() on CUDA with the dynamic KV cache meets a new shape every token).
        fn = self.reshape_relu
        gm, example = self.graph(fn, (4, 8))
        compiled = tessel.tessel_backend(gm, example, target="spyre", cache_limit=2)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for b in (4, 6, 9, 5, 4, 3):
                x = torch.randn(b, 8)
                # (the chip's storage is 16-bit: x * 2 rounds once)
                self.assertTrue(torch.allclose(compiled(b, x), fn(b, x), rtol=2e-3, atol=1e-3), b)
        self.assertEqual(len(tessel.dynamo_graphs), 1, tessel.dynamo_fallbacks)
        stats = tessel.dynamo_graphs[0].stats
        self.assertIn("static shapes", stats.dynamic_fallback)
        self.assertEqual(stats.compiles, 2)
        self.assertEqual(stats.eager_calls, 3)          # 9, 5 and 3; the second 4 reuses its compilation
        self.assertEqual(len(tessel.dynamo_fallbacks), 1, tessel.dynamo_fallbacks)
        self.assertIn("cache_limit=2 compilations are spent", tessel.dynamo_fallbacks[0])

    def test_numbers_read_from_inputs_are_folded(self):
        """dynamo's unspecialised floats (a norm's eps, attention's scaling: 0-d float64 inputs the graph
        reads with .item()) are folded to the call's values: one symbolic compilation per set of values,
        the values checked on every call (transformers' GPT-2 and Llama graphs under dynamic=True)."""
        from torch._subclasses.fake_tensor import FakeTensorMode
        from torch.fx.experimental.symbolic_shapes import ShapeEnv
        from tessel._dynamo import number_inputs

        class M(nn.Module):
            def forward(self, x, eps, scale):
                return x / (x.pow(2).mean(-1, keepdim=True) + eps.item()).sqrt() * scale.item()
        gm = torch.fx.symbolic_trace(M())
        if torch_major() >= 2:
            fake = FakeTensorMode(shape_env=ShapeEnv()).from_tensor(torch.randn(4, 8))
        else:
            fake = FakeTensorMode().from_tensor(torch.randn(4, 8), shape_env=ShapeEnv())
        x_node, eps_node, scale_node = (p for p in gm.graph.nodes if p.op == "placeholder")
        x_node.meta["example_value"] = fake
        eps_node.meta["example_value"] = scale_node.meta["example_value"] = torch.tensor(0.5, dtype=torch.float64)
        example = [fake, torch.tensor(0.5, dtype=torch.float64), torch.tensor(2.0, dtype=torch.float64)]
        self.assertEqual(number_inputs(gm, example), [1, 2])
        compiled = tessel.tessel_backend(gm, example)

        def f64(v):
            return torch.tensor(v, dtype=torch.float64)
        for b, eps in ((4, 0.5), (6, 0.5), (9, 0.5), (3, 4.0), (5, 4.0)):
            x = torch.randn(b, 8)
            got = compiled(x, f64(eps), f64(2.0))
            self.assertLess(max_rel(got, M()(x, f64(eps), f64(2.0))), 1e-6, (b, eps))
        self.assertEqual(tessel.dynamo_fallbacks, [])
        self.assertEqual(len(tessel.dynamo_graphs), 2)            # eps 0.5, then eps 4.0
        for g in tessel.dynamo_graphs:
            self.assertEqual(g.stats.compiles, 1, g.stats.recompiles)
            self.assertIsNotNone(g.dynamic)

    def test_sizes_no_tensor_carries_are_folded_per_call(self):
        # A SymInt whose symbol no tensor dim carries cannot be computed from the tensors' sizes: the
        # symbolic path refuses it, and the backend folds it to each call's value instead of leaving the
        # graph to PyTorch (the static KV cache's max_cache_len; tests/python/test_dynamo_free_ints.py).
        import sympy
        from tessel._dynamo import _FreeInts, symbolic_sizes
        gm, example = self.graph(lambda n, x: x * n, (4, 8))
        n = next(p for p in gm.graph.nodes if p.op == "placeholder")
        n.meta["example_value"] = type("S", (), {"expr": sympy.Symbol("u0", positive=True, integer=True)})()
        with self.assertRaisesRegex(Unsupported, "no tensor dim carries"):
            symbolic_sizes(gm, example)
        fn = tessel.tessel_backend(gm, example)
        self.assertIsInstance(fn, _FreeInts)
        x = torch.randn(4, 8)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for k in (3, 3, 5):
                torch.testing.assert_close(fn(k, x), x * k)
        self.assertEqual(sorted(fn.compiled), [("3",), ("5",)])
        self.assertEqual(tessel.dynamo_fallbacks, [])


if __name__ == "__main__":
    unittest.main()
