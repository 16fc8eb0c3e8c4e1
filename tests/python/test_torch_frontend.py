"""The PyTorch frontend (python/tessel), checked against PyTorch eager.

Run through ctest (python_frontend) or by hand:
    PYTHONPATH=build/python /usr/bin/python3 -m unittest discover -s tests/python -v
"""
import math
import os
import re
import subprocess
import unittest

import torch
import torch.nn as nn
import torch.nn.functional as F

import tessel

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE_DIR = os.path.dirname(os.path.dirname(HERE))
SHARED_DIR = os.environ.get("TESSEL_SHARED_DIR", os.path.join(SOURCE_DIR, "..", "shared"))
TESSEL_BINARY = os.environ.get("TESSEL_BINARY", os.path.join(SOURCE_DIR, "build", "tessel"))

torch.set_num_threads(2)
TORCH2 = int(torch.__version__.split(".")[0]) >= 2


def max_rel(out, ref):
    return ((out - ref).abs().max() / ref.abs().max()).item()


class Block(nn.Module):
    """The pre-LN transformer block of ../shared/models/tblock_s (d=256) and tblock_bert (d=768)."""

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
        q = q.view(b, t, h, c // h).transpose(1, 2)
        k = k.view(b, t, h, c // h).transpose(1, 2)
        v = v.view(b, t, h, c // h).transpose(1, 2)
        a = ((q @ k.transpose(-2, -1)) / math.sqrt(c // h)).softmax(-1)
        y = (a @ v).transpose(1, 2).reshape(b, t, c)
        x = x + self.proj(y)
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class NonZeroBreak(nn.Module):
    """The PyTorch form of ../shared/models/nonzero_break: Linear -> ReLU -> nonzero -> rows -> Linear -> sums."""

    def __init__(self):
        super().__init__()
        self.a = nn.Linear(64, 64)
        self.b = nn.Linear(64, 64)

    def forward(self, x):
        h = torch.relu(self.a(x))
        idx = (h.sum(-1) > 0).nonzero().squeeze(1)
        return self.b(h[idx]).sum(0, keepdim=True) + h.mean(0, keepdim=True)


class BoolMaskBreak(nn.Module):
    """Boolean indexing on the first dim (the same break, written as x[mask])."""

    def __init__(self):
        super().__init__()
        self.a = nn.Linear(16, 16)

    def forward(self, x):
        h = torch.tanh(self.a(x))
        return torch.sigmoid(h[x[:, 0] > 0]).sum(0) * 2.0 + h.sum(0)


class MaskedSelectSum(nn.Module):
    def forward(self, x):
        return x.masked_select(x > 0.5).sum() * x + 1.0


class UnloweredOpInTheMiddle(nn.Module):
    """torch.erfinv has no tessel lowering: it becomes a TorchFallback break run by PyTorch."""

    def __init__(self):
        super().__init__()
        self.a = nn.Linear(8, 8)

    def forward(self, x):
        return torch.relu(self.a(torch.erfinv(torch.tanh(x))))


class DataDependentIf(nn.Module):
    def forward(self, x):
        if x.sum() > 0:
            return x * 2
        return x


class ItemInArithmetic(nn.Module):
    def forward(self, x):
        return x / x.abs().max().item()


class ItemInIf(nn.Module):
    def forward(self, x):
        if x.max().item() > 0:
            return x * 2
        return x


class ItemBreak(nn.Module):
    """.item() between two Linear layers: a real graph break (dynamo's on torch 2; the frontend's split on 1.13)."""

    def __init__(self):
        super().__init__()
        self.a = nn.Linear(32, 32)
        self.b = nn.Linear(32, 32)

    def forward(self, x):
        h = torch.relu(self.a(x))
        s = h.abs().max().item()
        return self.b(h / s)


class TransformerBlockTest(unittest.TestCase):
    def check_block(self, d, heads, mlp, seed):
        torch.manual_seed(seed)
        m = Block(d, heads, mlp).eval()
        x = torch.randn(1, 128, d)
        fast = tessel.compile(m, (x,), threads=2)
        self.assertEqual(fast.explanation.break_count, 0)
        self.assertEqual(fast.explanation.graph_count, 1)
        for _ in range(2):
            x = torch.randn(1, 128, d)
            with torch.no_grad():
                ref = m(x)
            out = fast(x)
            self.assertEqual(out.shape, ref.shape)
            self.assertLessEqual(max_rel(out, ref), 1e-4)

    def test_block_d256(self):
        self.check_block(256, 4, 1024, 0)

    def test_block_bert_base(self):
        self.check_block(768, 12, 3072, 1)


class GraphBreakTest(unittest.TestCase):
    def test_nonzero_break_explained(self):
        torch.manual_seed(0)
        m = NonZeroBreak().eval()
        e = tessel.explain(m, (torch.randn(32, 64),))
        self.assertEqual(e.break_count, 1)
        self.assertEqual(e.graph_count, 2)
        b = e.breaks[0]
        self.assertEqual(b["op"], "NonZero")
        self.assertEqual(b["kind"], "data-dependent shape")
        self.assertIn("data-dependent output shape", b["reason"])
        # Location: the aten node, its module path (root here) and the source line of this file.
        self.assertIn("<root>/nonzero", b["location"])
        self.assertRegex(b["location"], r"test_torch_frontend\.py:\d+ `idx = \(h\.sum\(-1\) > 0\)\.nonzero\(\)")
        self.assertIn("nonzero-gather-reduce", b["repair"])
        self.assertIn("torch.where", b["repair"])
        text = str(e)
        self.assertIn("2 graph(s), 1 break(s)", text)
        self.assertIn("break 1: NonZero (data-dependent shape), after graph 0", text)

    def test_nonzero_break_runs_partitioned_and_matches_eager(self):
        torch.manual_seed(0)
        m = NonZeroBreak().eval()
        fast = tessel.compile(m, (torch.randn(32, 64),), threads=2)
        self.assertEqual(fast.explanation.break_count, 1)
        for seed in range(3):
            torch.manual_seed(100 + seed)
            x = torch.randn(32, 64)
            with torch.no_grad():
                ref = m(x)
            self.assertLessEqual(max_rel(fast(x), ref), 1e-5)
        self.assertEqual(fast.stats.compiles, 1)   # the break does not recompile

    def test_nonzero_break_repaired(self):
        torch.manual_seed(0)
        m = NonZeroBreak().eval()
        x = torch.randn(32, 64)
        e = tessel.explain(m, (x,), repair=True)
        self.assertEqual(e.break_count, 0)
        self.assertEqual([r["pattern"] for r in e.repairs], ["nonzero-gather-reduce"])
        fast = tessel.compile(m, (x,), threads=2, repair=True)
        self.assertEqual(fast.explanation.break_count, 0)
        self.assertEqual(fast.explanation.graph_count, 1)
        for seed in range(3):
            torch.manual_seed(200 + seed)
            x = torch.randn(32, 64)
            with torch.no_grad():
                ref = m(x)
            self.assertLessEqual(max_rel(fast(x), ref), 1e-5)

    def test_boolean_mask_indexing(self):
        torch.manual_seed(0)
        m = BoolMaskBreak().eval()
        x = torch.randn(10, 16)
        plain = tessel.compile(m, (x,), backend="graph")
        self.assertEqual(plain.explanation.break_count, 1)
        repaired = tessel.compile(m, (x,), backend="graph", repair=True)
        self.assertEqual(repaired.explanation.break_count, 0)
        for seed in range(3):
            torch.manual_seed(300 + seed)
            x = torch.randn(10, 16)
            with torch.no_grad():
                ref = m(x)
            self.assertLessEqual(max_rel(plain(x), ref), 1e-5)
            self.assertLessEqual(max_rel(repaired(x), ref), 1e-5)

    def test_masked_select_sum_repaired(self):
        m = MaskedSelectSum()
        x = torch.rand(6, 7)
        e = tessel.explain(m, (x,))
        self.assertEqual(e.break_count, 1)
        self.assertEqual(e.breaks[0]["op"], "Compress")
        self.assertIn("compress-reduce", e.breaks[0]["repair"])
        plain = tessel.compile(m, (x,), backend="graph")
        repaired = tessel.compile(m, (x,), backend="graph", repair=True)
        self.assertEqual(repaired.explanation.break_count, 0)
        self.assertEqual([r["pattern"] for r in repaired.explanation.repairs], ["compress-reduce"])
        for seed in range(3):
            torch.manual_seed(400 + seed)
            x = torch.rand(6, 7)
            ref = m(x)
            self.assertLessEqual(max_rel(plain(x), ref), 1e-5)
            self.assertLessEqual(max_rel(repaired(x), ref), 1e-5)

    def test_unsupported_aten_op_runs_in_torch(self):
        torch.manual_seed(0)
        m = UnloweredOpInTheMiddle().eval()
        x = torch.randn(4, 8)
        fast = tessel.compile(m, (x,), threads=2)
        e = fast.explanation
        self.assertEqual(e.break_count, 1)
        b = e.breaks[0]
        self.assertEqual(b["kind"], "torch fallback")
        self.assertEqual(b["op"], "aten.erfinv.default")
        self.assertIn("unsupported aten op aten.erfinv.default: no tessel lowering", b["reason"])
        self.assertIn("aten_table.py", b["repair"])
        self.assertEqual(e.graph_count, 2)
        for seed in range(2):
            torch.manual_seed(500 + seed)
            x = torch.randn(4, 8)
            with torch.no_grad():
                ref = m(x)
            self.assertLessEqual(max_rel(fast(x), ref), 1e-5)


class LoweringTest(unittest.TestCase):
    """Convolutions, pooling, batch norm, embeddings, masks and views through the aten table."""

    def test_small_cnn(self):
        torch.manual_seed(0)
        cnn = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU6(), nn.MaxPool2d(2),
                            nn.Conv2d(8, 8, 3, groups=8, stride=2, padding=1), nn.AvgPool2d(2),
                            nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 4), nn.Softmax(-1)).eval()
        bn = cnn[1]
        with torch.no_grad():
            bn.weight.uniform_(0.5, 1.5)
            bn.bias.normal_()
            bn.running_mean.normal_()
            bn.running_var.uniform_(0.5, 2)
        x = torch.randn(2, 3, 32, 32)
        fast = tessel.compile(cnn, (x,), threads=2)
        self.assertEqual(fast.explanation.break_count, 0)
        with torch.no_grad():
            self.assertLessEqual(max_rel(fast(x), cnn(x)), 1e-5)

    def test_fresh_batch_norm_and_all_equal_weights(self):
        """All-equal constants feeding a conv or a matmul (a fresh BatchNorm folded after a conv, a Linear
        filled with one value, x @ ones): the simplifier makes them a scalar and a broadcast, and the
        compiled backend must still give oneDNN dense weights."""
        torch.manual_seed(0)
        cnn = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                            nn.Conv2d(8, 8, 3, padding=1), nn.BatchNorm2d(8)).eval()   # fresh statistics
        lin = nn.Linear(16, 8).eval()
        with torch.no_grad():
            cnn[3].weight.fill_(0.05)       # all-equal conv weights
            lin.weight.fill_(0.5)
            lin.bias.fill_(0.1)
        cases = [(cnn, torch.randn(2, 3, 16, 16)), (lin, torch.randn(4, 16)),
                 (lambda x: x @ torch.ones(16, 8) + 1.0, torch.randn(4, 16))]
        for m, x in cases:
            fast = tessel.compile(m, (x,), threads=2)
            with torch.no_grad():
                self.assertLessEqual(max_rel(fast(x), m(x)), 1e-5)

    def test_embedding_masks_views(self):
        torch.manual_seed(0)

        class Emb(nn.Module):
            def __init__(self):
                super().__init__()
                self.e = nn.Embedding(100, 32)
                self.ln = nn.LayerNorm(32)
                self.out = nn.Linear(32, 100)

            def forward(self, ids, mask):
                h = self.ln(self.e(ids)) * mask.unsqueeze(-1).float()
                h = h.masked_fill(mask.unsqueeze(-1) == 0, -1.0)
                return F.log_softmax(self.out(h), -1).mean(1), h.permute(0, 2, 1).contiguous().view(2, -1)[:, 3:10]

        m = Emb().eval()
        ids = torch.randint(0, 100, (2, 16))
        mask = (torch.rand(2, 16) > 0.3).long()
        fast = tessel.compile(m, (ids, mask), threads=2)
        self.assertEqual(fast.explanation.break_count, 0)
        outs = fast(ids, mask)
        with torch.no_grad():
            refs = m(ids, mask)
        self.assertIsInstance(outs, tuple)
        for o, r in zip(outs, refs):
            self.assertEqual(o.shape, r.shape)
            self.assertLessEqual(max_rel(o, r), 1e-5)


class GuardTest(unittest.TestCase):
    def setUp(self):
        torch.manual_seed(0)
        self.m = nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.Linear(64, 16)).eval()

    def check(self, fast, x):
        with torch.no_grad():
            ref = self.m(x)
        self.assertLessEqual(max_rel(fast(x), ref), 1e-5)

    def test_recompile_on_new_shape_and_cache_hit_on_repeat(self):
        fast = tessel.compile(self.m, (torch.randn(4, 32),), backend="graph")
        self.assertEqual(fast.stats.compiles, 1)
        self.check(fast, torch.randn(4, 32))
        self.assertEqual((fast.stats.compiles, fast.stats.cache_hits), (1, 1))
        self.check(fast, torch.randn(9, 32))          # a new shape: recompiles
        self.assertEqual((fast.stats.compiles, fast.stats.cache_hits), (2, 1))
        self.assertEqual(fast.stats.recompiles, ["input 0 shape [4, 32] -> [9, 32]"])
        self.check(fast, torch.randn(9, 32))          # repeated: a cache hit
        self.check(fast, torch.randn(4, 32))          # the first shape is still cached
        self.assertEqual((fast.stats.compiles, fast.stats.cache_hits), (2, 3))
        self.assertGreater(fast.stats.compile_seconds, 0)
        d = fast.stats.as_dict()
        self.assertEqual(d["compiles"], 2)
        self.assertEqual(d["calls"], 4)

    def test_dtype_change_recompiles(self):
        fast = tessel.compile(self.m, (torch.randn(4, 32),), backend="graph")
        m64 = self.m.double()
        x = torch.randn(4, 32, dtype=torch.float64)
        # The module's weights are now f64 too: the new compilation captures them.
        out = fast(x)
        self.assertEqual(out.dtype, torch.float64)
        self.assertLessEqual(max_rel(out, m64(x).detach()), 1e-10)
        self.assertEqual(fast.stats.compiles, 2)
        self.assertIn("dtype torch.float32 -> torch.float64", fast.stats.recompiles[0])

    def test_recompile_limit_raises(self):
        fast = tessel.compile(self.m, (torch.randn(1, 32),), backend="graph", cache_limit=2)
        fast(torch.randn(2, 32))
        with self.assertRaises(tessel.TesselRecompileLimit) as cm:
            fast(torch.randn(3, 32))
        self.assertIn("cache_limit=2", str(cm.exception))
        self.assertIn("input 0 shape [2, 32] -> [3, 32]", str(cm.exception))
        self.assertEqual(fast.stats.compiles, 2)

    def test_recompile_limit_falls_back_to_eager(self):
        fast = tessel.compile(self.m, (torch.randn(1, 32),), backend="graph", cache_limit=1, on_limit="eager")
        self.check(fast, torch.randn(5, 32))
        self.assertEqual((fast.stats.compiles, fast.stats.eager_calls), (1, 1))


class ItemTest(unittest.TestCase):
    """.item() values used in tensor arithmetic are captured as 0-d tensors: compiled, not baked in."""

    def test_item_in_arithmetic_is_compiled(self):
        m = ItemInArithmetic()
        fast = tessel.compile(m, (torch.randn(4),), threads=2)
        self.assertEqual(fast.explanation.break_count, 0)
        for seed in range(3):
            torch.manual_seed(600 + seed)
            x = torch.randn(4) * (seed + 1)     # a different max each time: the value is not a constant
            self.assertLessEqual(max_rel(fast(x), m(x)), 1e-6)
        self.assertEqual(fast.stats.compiles, 1)

    def test_item_between_layers(self):
        torch.manual_seed(0)
        m = ItemBreak().eval()
        fast = tessel.compile(m, (torch.randn(8, 32),), threads=2)
        self.assertEqual((fast.explanation.graph_count, fast.explanation.break_count), (1, 0))
        for seed in range(3):
            torch.manual_seed(700 + seed)
            x = torch.randn(8, 32)
            with torch.no_grad():
                self.assertLessEqual(max_rel(fast(x), m(x)), 1e-5)

    def test_item_of_a_constant_is_a_number(self):
        fast = tessel.compile(lambda x: x * torch.tensor([2.0]).item(), (torch.randn(3),), backend="graph")
        x = torch.randn(3)
        self.assertLessEqual(max_rel(fast(x), x * 2.0), 1e-7)


class ThreadsTest(unittest.TestCase):
    def test_torch_thread_count_is_kept(self):
        """The compiled backend sets OpenMP's thread count; PyTorch's stays what it was."""
        torch.manual_seed(0)
        m = nn.Sequential(nn.Linear(16, 16), nn.GELU(), nn.Linear(16, 4)).eval()
        x = torch.randn(4, 16)
        before = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            fast = tessel.compile(m, (x,), threads=2)
            self.assertEqual(torch.get_num_threads(), 1)
            with torch.no_grad():
                self.assertLessEqual(max_rel(fast(x), m(x)), 1e-5)
            self.assertEqual(torch.get_num_threads(), 1)
        finally:
            torch.set_num_threads(before)


class BadInputTest(unittest.TestCase):
    def test_unsupported_dtype(self):
        with self.assertRaises(tessel.TesselError) as cm:
            tessel.compile(nn.Identity(), (torch.zeros(3, dtype=torch.complex64),))
        self.assertIn("complex64", str(cm.exception))

    def test_data_dependent_if_is_a_value_guard(self):
        """`if x.sum() > 0:` was a TesselCaptureError; it is a value guard now (tests/python/test_hf_capture.py)."""
        m = DataDependentIf()
        fast = tessel.compile(m, (torch.ones(4),), backend="graph")
        self.assertRegex(fast.explanation.guards[0]["location"], r"test_torch_frontend\.py:\d+ `if x\.sum\(\) > 0:`")
        for x in (torch.ones(4), -torch.ones(4), torch.randn(4) + 3):
            self.assertLessEqual(max_rel(fast(x), m(x)), 1e-7)
        self.assertEqual(fast.stats.compiles, 2)

    def test_item_in_python_control_flow_names_the_line(self):
        e = tessel.explain(ItemInIf(), (torch.randn(4),))
        self.assertRegex(str(e), r"value guard 1: bool read as (True|False) at test_torch_frontend\.py:\d+ "
                                 r"`if x\.max\(\)\.item\(\) > 0:`")

    def test_non_tensor_inputs_and_options(self):
        with self.assertRaises(tessel.TesselError):
            tessel.compile(nn.Identity(), (object(),))      # (a number is a literal argument: specialised)
        with self.assertRaises(tessel.TesselError):
            tessel.compile(nn.ReLU(), (torch.randn(2),), backend="fast")
        with self.assertRaises(tessel.TesselError):
            tessel.compile(nn.ReLU(), (torch.randn(2),), target="tpu")
        fast = tessel.compile(nn.ReLU(), (torch.randn(2),), backend="graph")
        with self.assertRaises(tessel.TesselError):
            fast(torch.zeros(2, dtype=torch.complex64))

    def test_sparse_inputs_are_one_line_errors(self):
        """A sparse input at capture or at a call is a TesselError naming it (issue 41 case 5: a CSR input raised
        PyTorch's "unsupported memory format option Contiguous", a COO one numpy's TypeError)."""
        import warnings

        class SampledAddmm(nn.Module):
            def forward(self, s, x, y):
                return torch.sparse.sampled_addmm(s, x, y).to_dense()

        x = torch.randn(4, 4)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # (torch 1.13: "Sparse CSR tensor support is in beta state")
            csr, coo = torch.eye(4).to_sparse_csr(), x.to_sparse()
        for s, layout in ((csr, "sparse_csr"), (coo, "sparse_coo")):
            with self.assertRaisesRegex(tessel.TesselError, f"input 0 is a {layout} tensor"):
                tessel.compile(SampledAddmm(), (s, x, x))
        relu = tessel.compile(nn.ReLU(), (x,))
        for s, layout in ((csr, "sparse_csr"), (coo, "sparse_coo")):
            with self.assertRaisesRegex(tessel.TesselError, f"input 0 is a {layout} tensor"):
                relu(s)
        self.assertTrue(torch.equal(relu(x), torch.relu(x)))

    def test_errors_are_one_class(self):
        self.assertTrue(issubclass(tessel.TesselCaptureError, tessel.TesselError))
        self.assertTrue(issubclass(tessel.TesselRecompileLimit, tessel.TesselError))
        self.assertTrue(issubclass(tessel.TesselError, RuntimeError))


class DynamoTest(unittest.TestCase):
    def test_fallbacks_are_recorded(self):
        """A graph the backend leaves to PyTorch still runs there, and tessel.dynamo_fallbacks lists it with
        its reason (the benches count these): non-tensor inputs, and a graph tessel refuses to compile."""
        from torch.fx.experimental.proxy_tensor import make_fx
        x = torch.randn(4, 8)
        gm = make_fx(lambda t: torch.relu(t) * 2)(x)
        tessel.dynamo_fallbacks.clear()
        with self.assertWarns(UserWarning):
            self.assertEqual(tessel.tessel_backend(gm, [x, 3]), gm.forward)
        saved = dict(tessel.dynamo_options)
        tessel.dynamo_options.update(target="cpu", precision="bf16")   # bf16 is a CUDA option: refused
        try:
            fn = tessel.tessel_backend(gm, [x])
            with self.assertWarns(UserWarning):
                out = fn(x)
        finally:
            tessel.dynamo_options.clear()
            tessel.dynamo_options.update(saved)
        self.assertTrue(torch.equal(out, torch.relu(x) * 2))
        self.assertEqual(len(tessel.dynamo_fallbacks), 2, tessel.dynamo_fallbacks)
        self.assertIn("non-tensor inputs", tessel.dynamo_fallbacks[0])
        self.assertIn("could not compile a graph", tessel.dynamo_fallbacks[1])
        self.assertIn("bf16", tessel.dynamo_fallbacks[1])

    def test_registration_matches_torch_version(self):
        major = int(torch.__version__.split(".")[0])
        self.assertEqual(tessel.dynamo_registered, major >= 2)

    @unittest.skipUnless(TORCH2, "torch.compile needs torch >= 2")
    def test_torch_compile_backend(self):
        torch.manual_seed(0)
        m = NonZeroBreak().eval()
        opt = torch.compile(m, backend="tessel")
        x = torch.randn(32, 64)
        with torch.no_grad():
            self.assertLessEqual(max_rel(opt(x), m(x)), 1e-5)

    @unittest.skipUnless(TORCH2, "torch.compile needs torch >= 2")
    def test_torch_compile_block_is_one_tessel_graph(self):
        torch._dynamo.reset()
        tessel.dynamo_graphs.clear()
        torch.manual_seed(0)
        m = Block(256, 4, 1024).eval()
        opt = torch.compile(m, backend="tessel")
        for _ in range(2):
            x = torch.randn(1, 128, 256)
            with torch.no_grad():
                self.assertLessEqual(max_rel(opt(x), m(x)), 1e-4)
        self.assertEqual(len(tessel.dynamo_graphs), 1)
        g = tessel.dynamo_graphs[0]
        self.assertEqual((g.explanation.graph_count, g.explanation.break_count), (1, 0))
        self.assertEqual((g.stats.compiles, g.stats.calls), (1, 2))

    @unittest.skipUnless(TORCH2, "torch.compile needs torch >= 2")
    def test_torch_compile_item_break(self):
        """dynamo breaks the graph at .item(); the pieces either side compile in tessel."""
        torch._dynamo.reset()
        tessel.dynamo_graphs.clear()
        torch.manual_seed(0)
        m = ItemBreak().eval()
        opt = torch.compile(m, backend="tessel")
        for _ in range(2):
            x = torch.randn(8, 32)
            with torch.no_grad():
                self.assertLessEqual(max_rel(opt(x), m(x)), 1e-5)
        self.assertGreaterEqual(len(tessel.dynamo_graphs), 2)


def read(path):
    with open(path) as f:
        return f.read()


def fenced_blocks(path, lang):
    text = read(path)
    return re.findall(r"```" + lang + r"\n(.*?)```", text, re.S)


class DocsTest(unittest.TestCase):
    def test_python_md_example_runs(self):
        blocks = fenced_blocks(os.path.join(SOURCE_DIR, "docs", "python.md"), "python")
        self.assertTrue(blocks)
        for code in blocks:
            exec(compile(code, "docs/python.md", "exec"), {"__name__": "docs_example"})

    @unittest.skipUnless(os.path.isdir(os.path.join(SHARED_DIR, "models", "nonzero_break")), "needs ../shared")
    def test_graph_breaks_md_cli_example(self):
        """docs/graph-breaks.md shows `tessel explain` on nonzero_break; the command prints exactly that."""
        text = read(os.path.join(SOURCE_DIR, "docs", "graph-breaks.md"))
        examples = re.findall(r"```\n\$ (tessel explain [^\n]*)\n(.*?)```", text, re.S)
        self.assertEqual(len(examples), 2)
        for cmd, expected in examples:
            args = cmd.split()[1:]
            args = [os.path.join(SHARED_DIR, "models", "nonzero_break") if a == "../shared/models/nonzero_break" else a
                    for a in args]
            out = subprocess.run([TESSEL_BINARY] + args, capture_output=True, text=True, check=True).stdout
            self.assertEqual(out, expected, cmd)


class ZeroDimOutputs(unittest.TestCase):
    def test_a_0d_bf16_output_keeps_its_shape(self):
        """issue 41: a 0-d bf16 result came back with shape [1] (numpy's ascontiguousarray makes 0-d arrays 1-d)."""
        def f(x):
            return (x * 2).sum().to(torch.bfloat16), x.sum()
        x = torch.randn(4, 8)
        got = tessel.compile(f, (x,), threads=2)(x)
        want = f(x)
        for g, w in zip(got, want):
            self.assertEqual(g.shape, w.shape)
            self.assertEqual(g.dtype, w.dtype)
            self.assertTrue(torch.allclose(g.float(), w.float(), rtol=1e-2))


if __name__ == "__main__":
    unittest.main()
