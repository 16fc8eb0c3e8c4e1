"""A dynamo graph's SymInt inputs that no tensor dim carries (transformers' static KV cache passes its
max_cache_len so) are folded to the call's value: free_int_inputs finds them, fold_ints removes them,
_FreeInts compiles one specialisation per set of values. torch 1.13 has no dynamo: the graph is built by
hand with its placeholders' example values as dynamo writes them (a SymInt is an object whose .node.expr
is a sympy symbol)."""
import types
import unittest
import warnings

import sympy
import torch
import torch.fx

import tessel
from tessel import _dynamo


def sym_int(name):
    return types.SimpleNamespace(node=types.SimpleNamespace(expr=sympy.Symbol(name, integer=True, positive=True)))


def graph(n_meta):
    """f(x, n) = x * n + arange(n)[:3], x f32[2, 3]; n's example value `n_meta`."""
    g = torch.fx.Graph()
    x = g.placeholder("x")
    n = g.placeholder("n")
    x.meta["example_value"] = torch.zeros(2, 3)
    n.meta["example_value"] = n_meta
    r = g.call_function(torch.ops.aten.arange.default, (n,), {"dtype": torch.float32})
    r3 = g.call_function(torch.ops.aten.slice.Tensor, (r, 0, 0, 3))
    m = g.call_function(torch.ops.aten.mul.Tensor, (x, n))
    g.output((g.call_function(torch.ops.aten.add.Tensor, (m, r3)),))
    return torch.fx.GraphModule(torch.nn.Module(), g)


class FreeInts(unittest.TestCase):
    def test_found_folded_and_specialised(self):
        gm = graph(sym_int("s72"))
        self.assertEqual(_dynamo.free_int_inputs(gm, [torch.zeros(2, 3), sym_int("s72")]), [1])
        folded = _dynamo.fold_ints(gm, [1], [5])
        x = torch.randn(2, 3)
        want = x * 5 + torch.arange(5, dtype=torch.float32)[:3]
        torch.testing.assert_close(folded(x)[0], want)
        calls = _dynamo._FreeInts(gm, [torch.zeros(2, 3), sym_int("s72")], [1], {})
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for n in (5, 5, 7, 5):
                got = calls(x, n)[0]
                torch.testing.assert_close(got, x * n + torch.arange(n, dtype=torch.float32)[:3])
        self.assertEqual(sorted(calls.compiled), [("5",), ("7",)])
        self.assertEqual(tessel.dynamo_fallbacks, [])

    def test_a_carried_symbol_is_not_free(self):
        # n's symbol is x's dim 0: the symbolic compilation computes n from x's size (nothing to fold).
        gm = graph(sym_int("s0"))
        x = [n for n in gm.graph.nodes if n.op == "placeholder"][0]
        fake = _WithShape(torch.zeros(2, 3), (sym_int("s0"), 3))
        x.meta["example_value"] = fake
        self.assertEqual(_dynamo.free_int_inputs(gm, [fake, sym_int("s0")]), [])
        x.meta["example_value"] = _WithShape(torch.zeros(2, 3), (sym_int("s1"), 3))
        self.assertEqual(_dynamo.free_int_inputs(gm, [fake, sym_int("s0")]), [1])


class SizesFixed(unittest.TestCase):
    def test_a_symbol_fixed_to_a_number_compiles_static(self):
        # dynamo's automatic dynamic shapes (torch.compile's default mode) can give a dim a symbol that its
        # shape environment later replaces by a number: the graph has no symbolic size left, so it is
        # compiled for the static sizes, not left to PyTorch ("non-tensor inputs that are not sizes"). A dim
        # that is still a symbol makes the graph symbolic.
        g = torch.fx.Graph()
        x = g.placeholder("x")
        x.meta["example_value"] = _WithShape(torch.zeros(2, 3), (types.SimpleNamespace(node=types.SimpleNamespace(
            expr=sympy.Integer(2))), 3))
        g.output((g.call_function(torch.ops.aten.tanh.default, (g.call_function(torch.ops.aten.mul.Tensor, (x, x)),)),))
        gm = torch.fx.GraphModule(torch.nn.Module(), g)
        self.assertFalse(_dynamo._has_symbolic_dims(gm))
        tessel.dynamo_fallbacks.clear()
        tessel.dynamo_graphs.clear()
        fn = _dynamo.tessel_backend(gm, [torch.zeros(2, 3)])
        self.assertIsInstance(fn, _dynamo._FirstCall)
        self.assertIsNone(fn.sizes)
        a = torch.randn(2, 3)
        torch.testing.assert_close(fn(a)[0], torch.tanh(a * a))
        self.assertEqual(tessel.dynamo_fallbacks, [])
        self.assertEqual(len(tessel.dynamo_graphs), 1)
        self.assertIsNone(tessel.dynamo_graphs[0].dynamic)
        x.meta["example_value"] = _WithShape(torch.zeros(2, 3), (sym_int("s0"), 3))
        self.assertTrue(_dynamo._has_symbolic_dims(gm))
        b = torch.randn(4, 3)            # another shape: tessel's own guard compiles again, never a wrong size
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.testing.assert_close(fn(b)[0], torch.tanh(b * b))


class _WithShape(torch.Tensor):
    """A tensor whose .shape reports symbolic sizes (what a fake tensor's example value shows dynamo)."""

    @staticmethod
    def __new__(cls, t, shape):
        r = torch.Tensor._make_subclass(cls, t)
        r._shape = shape
        return r

    @property
    def shape(self):
        return self._shape


if __name__ == "__main__":
    unittest.main()
