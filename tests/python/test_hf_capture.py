"""tessel.compile on modules that do what Hugging Face transformers' models do, checked against eager:
data-dependent Python in mask code (`if mask.all():`, `.item()` deciding a shape or a branch) becomes
value guards, and outputs that are ModelOutput-like dicts or hold a cache object come back as the module
returns them. (transformers itself is not installed here; the real models ran on the GPU box:
docs/BENCHMARKS.md, "tessel.compile on transformers models".)
"""
import collections
import unittest

import torch
import torch.nn as nn
import torch.nn.functional as F

import tessel

torch.set_num_threads(2)


def max_rel(out, ref):
    return ((out - ref).abs().max() / ref.abs().max().clamp_min(1e-30)).item()


class Attention(nn.Module):
    """Self-attention with transformers' mask preparation: an all-ones padding mask is dropped (`if
    mask.all(): mask = None`, as masking_utils' _ignore_causal_mask_sdpa does), else it becomes an
    additive bias."""

    def __init__(self, d=16, heads=2):
        super().__init__()
        self.qkv = nn.Linear(d, 3 * d)
        self.out = nn.Linear(d, d)
        self.heads = heads

    def forward(self, x, mask):
        b, s, d = x.shape
        q, k, v = self.qkv(x).view(b, s, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        if mask.all():
            bias = None
        else:
            bias = (1.0 - mask[:, None, None, :].to(x.dtype)) * -1e9
        att = q @ k.transpose(-1, -2) / (d // self.heads) ** 0.5
        if bias is not None:
            att = att + bias
        y = (att.softmax(-1) @ v).transpose(1, 2).reshape(b, s, d)
        return self.out(y)


class Output(collections.OrderedDict):
    """Like transformers' ModelOutput: a dict whose entries are also attributes."""

    def __init__(self, **kw):
        super().__init__(**kw)
        for k, v in kw.items():
            object.__setattr__(self, k, v)

    def __setitem__(self, k, v):
        super().__setitem__(k, v)
        object.__setattr__(self, k, v)


class Layer:
    def __init__(self):
        self.keys = None
        self.values = None


class Cache:
    """Like transformers' DynamicCache: a plain object with a list of layers holding tensors."""

    def __init__(self, n):
        self.layers = [Layer() for _ in range(n)]
        self.seen_tokens = 0

    def update(self, i, k, v):
        layer = self.layers[i]
        layer.keys = k if layer.keys is None else torch.cat([layer.keys, k], 1)
        layer.values = v if layer.values is None else torch.cat([layer.values, v], 1)
        self.seen_tokens += k.shape[1]


class TinyLM(nn.Module):
    """An embedding, two masked attention layers and a head, returning an Output that holds the logits
    and a new Cache of every layer's keys and values (use_cache=True)."""

    def __init__(self, vocab=50, d=16):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.layers = nn.ModuleList([Attention(d), Attention(d)])
        self.head = nn.Linear(d, vocab)

    def forward(self, ids, mask):
        h = self.emb(ids)
        cache = Cache(len(self.layers))
        for i, layer in enumerate(self.layers):
            cache.update(i, h * 0.5, h + 1.0)
            h = h + layer(h, mask)
        return Output(logits=self.head(h), past_key_values=cache, hidden_size=h.shape[-1])


class ItemSizedSlice(nn.Module):
    """An integer .item() deciding a shape: the number of real tokens keeps that many columns."""

    def forward(self, x, mask):
        n = mask.sum().item()
        return x[:, :n].sum(1)


class IntIf(nn.Module):
    """int() of a tensor in an if, and a Python max over a .tolist()."""

    def forward(self, x, k):
        if int(k) > 2:
            x = x * 3
        return x + max(k.view(1).tolist())


class FloatItemUse(nn.Module):
    """A floating-point .item() used in Python: the 0-d tensor it gives is read by float()."""

    def forward(self, x):
        s = x.abs().max().item()
        return x * (2.0 if float(s) > 1.0 else 0.5)


def padded(mask_row):
    return torch.tensor([mask_row], dtype=torch.long)


class MaskGuardTest(unittest.TestCase):
    def setUp(self):
        torch.manual_seed(0)
        self.m = Attention().eval()
        self.x = torch.randn(1, 6, 16)

    def test_mask_all_is_a_value_guard(self):
        """Before: TesselCaptureError (`aten._local_scalar_dense` on a traced value). Now compiled with a
        guard; a padded mask takes the other branch: a second specialisation, both exact."""
        full, pad = padded([1] * 6), padded([1, 1, 1, 1, 0, 0])
        fast = tessel.compile(self.m, (self.x, full), backend="graph")
        guards = fast.explanation.guards
        self.assertEqual(len(guards), 1)
        self.assertEqual((guards[0]["kind"], guards[0]["value"]), ("bool", True))
        self.assertRegex(guards[0]["location"], r"test_hf_capture\.py:\d+ `if mask\.all\(\):`")
        self.assertIn("value guard 1: bool read as True", str(fast.explanation))
        with torch.no_grad():
            for mask in (full, pad, full, pad):
                x = torch.randn(1, 6, 16)
                self.assertLessEqual(max_rel(fast(x, mask), self.m(x, mask)), 1e-5)
        self.assertEqual(fast.stats.compiles, 2)
        self.assertEqual(len(fast.stats.recompiles), 1)
        self.assertIn("`if mask.all():` was True at capture, now False", fast.stats.recompiles[0])
        self.assertEqual(fast.stats.cache_hits, 3)      # the third and fourth call: after a miss

    def test_guard_limit(self):
        full, pad = padded([1] * 6), padded([1, 1, 1, 0, 0, 0])
        fast = tessel.compile(self.m, (self.x, full), backend="graph", cache_limit=1, on_limit="eager")
        with torch.no_grad():
            self.assertLessEqual(max_rel(fast(self.x, pad), self.m(self.x, pad)), 1e-5)
        self.assertEqual((fast.stats.compiles, fast.stats.eager_calls), (1, 1))
        strict = tessel.compile(self.m, (self.x, full), backend="graph", cache_limit=1)
        with self.assertRaises(tessel.TesselRecompileLimit) as cm:
            strict(self.x, pad)
        self.assertIn("value guard", str(cm.exception))


class ValueReadTest(unittest.TestCase):
    def test_item_decides_a_shape(self):
        m = ItemSizedSlice()
        x = torch.randn(2, 8)
        fast = tessel.compile(m, (x, padded([1] * 5 + [0] * 3)), backend="graph")
        self.assertEqual(fast.explanation.guards[0]["value"], 5)
        for row in ([1] * 5 + [0] * 3, [1] * 2 + [0] * 6, [1] * 5 + [0] * 3):
            x = torch.randn(2, 8)
            self.assertLessEqual(max_rel(fast(x, padded(row)), m(x, padded(row))), 1e-6)
        self.assertEqual(fast.stats.compiles, 2)

    def test_int_and_tolist(self):
        m = IntIf()
        fast = tessel.compile(m, (torch.randn(4), torch.tensor(3)), backend="graph")
        self.assertEqual([g["kind"] for g in fast.explanation.guards], ["int", "tolist"])
        for k in (3, 1, 5, 3):
            x = torch.randn(4)
            self.assertLessEqual(max_rel(fast(x, torch.tensor(k)), m(x, torch.tensor(k))), 1e-6)
        self.assertEqual(fast.stats.compiles, 3)      # k = 3, 1, 5 read different lists

    def test_float_item_read_in_python(self):
        m = FloatItemUse()
        fast = tessel.compile(m, (torch.randn(5) * 3,), backend="graph")
        self.assertEqual([g["kind"] for g in fast.explanation.guards], ["float"])
        for scale in (3.0, 0.1, 4.0):
            x = torch.randn(5) * scale
            self.assertLessEqual(max_rel(fast(x), m(x)), 1e-6)

    def test_comparisons_returning_a_bool(self):
        """torch.equal / allclose / is_nonzero read values in C++: captured as bool reads of the same answer."""
        def f(x, y):
            if torch.equal(x, y):
                return x + 1
            if torch.allclose(x, y, atol=0.5):
                return x + 2
            return x - 1 if (x[:1] - y[:1]).is_nonzero() else x
        y = torch.zeros(3)
        fast = tessel.compile(f, (torch.zeros(3), y), backend="graph")
        self.assertEqual(fast.explanation.guards[0]["kind"], "bool")
        self.assertRegex(fast.explanation.guards[0]["location"], r"`if torch\.equal\(x, y\):`")
        for x in (torch.zeros(3), torch.full((3,), 0.25), torch.ones(3), torch.tensor([0.0, 1.0, 1.0]),
                  torch.zeros(3)):
            self.assertTrue(torch.equal(fast(x, y), f(x, y)), x)
        self.assertEqual(fast.stats.compiles, 4)

    def test_float_item_in_arithmetic_is_not_a_guard(self):
        fast = tessel.compile(lambda x: x / x.abs().max().item(), (torch.randn(4),), backend="graph")
        self.assertEqual(fast.explanation.guards, [])

    def test_tensor_as_a_size_outside_python_is_a_clear_error(self):
        """A traced 0-d tensor handed to torch where a number is expected is read inside PyTorch's C++,
        which tessel cannot intercept: a TesselCaptureError that says what to do."""
        def f(x):
            n = x.long().sum().reshape(())
            return x.new_zeros(n)
        with self.assertRaises(tessel.TesselCaptureError) as cm:
            tessel.compile(f, (torch.ones(3),))
        self.assertIn("int(tensor)", str(cm.exception))


class StructuredOutputTest(unittest.TestCase):
    def setUp(self):
        torch.manual_seed(1)
        self.m = TinyLM().eval()
        self.ids = torch.randint(0, 50, (1, 6))

    def check_same(self, out, ref):
        self.assertIs(type(out), Output)
        self.assertEqual(list(out.keys()), list(ref.keys()))
        self.assertLessEqual(max_rel(out.logits, ref.logits), 1e-5)
        self.assertIs(out["logits"], out.logits)
        self.assertEqual(out.hidden_size, 16)
        cache = out.past_key_values
        self.assertIs(type(cache), Cache)
        self.assertEqual(cache.seen_tokens, ref.past_key_values.seen_tokens)
        for a, b in zip(cache.layers, ref.past_key_values.layers):
            self.assertIs(type(a), Layer)
            self.assertLessEqual(max_rel(a.keys, b.keys), 1e-6)
            self.assertLessEqual(max_rel(a.values, b.values), 1e-6)

    def test_model_output_and_cache_come_back(self):
        """Before: TesselCaptureError (the mask's `if mask.all():`; then the Cache object in the output,
        which make_fx cannot return). Now the output is an Output holding a new Cache on every call."""
        full = padded([1] * 6)
        fast = tessel.compile(self.m, (self.ids, full))
        with torch.no_grad():
            first = fast(self.ids, full)
            self.check_same(first, self.m(self.ids, full))
            ids = torch.randint(0, 50, (1, 6))
            for mask in (padded([1, 1, 1, 1, 1, 0]), full):
                self.check_same(fast(ids, mask), self.m(ids, mask))
        self.assertIsNot(fast(ids, full).past_key_values, first.past_key_values)
        self.assertEqual(fast.stats.compiles, 2)

    def test_unrebuildable_output_is_a_clear_error(self):
        class Weird(nn.Module):
            def forward(self, x):
                return x + 1, torch.Generator()
        with self.assertRaises(tessel.TesselCaptureError) as cm:
            tessel.compile(Weird(), (torch.randn(2),))
        self.assertIn("Generator", str(cm.exception))

        class NoCopy:
            def __init__(self, t):
                self.t = t

            def __reduce_ex__(self, protocol):
                raise TypeError("NoCopy cannot be copied")

        with self.assertRaises(tessel.TesselCaptureError) as cm:
            tessel.compile(lambda x: NoCopy(x + 1), (torch.randn(2),))
        self.assertIn("NoCopy cannot be copied", str(cm.exception))


class KeywordCall(nn.Module):
    """Called as transformers models are: keyword tensors, None, and flags."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, input_ids=None, past_key_values=None, attention_mask=None, use_cache=True, return_dict=True):
        h = self.lin(input_ids)
        if attention_mask is not None:
            h = h * attention_mask[..., None]
        out = Output(last_hidden_state=h, past_key_values=None)
        return out if return_dict else (h,)


class ArgumentsTest(unittest.TestCase):
    def test_keyword_and_literal_arguments(self):
        torch.manual_seed(2)
        m = KeywordCall().eval()
        x, mask = torch.randn(1, 3, 8), torch.tensor([[1.0, 1.0, 0.0]])
        fast = tessel.compile(m, (), example_kwargs=dict(input_ids=x, attention_mask=mask), backend="graph")
        with torch.no_grad():
            out = fast(input_ids=x, attention_mask=mask)
            self.assertIs(type(out), Output)
            self.assertIsNone(out.past_key_values)
            self.assertLessEqual(max_rel(out.last_hidden_state, m(input_ids=x, attention_mask=mask).last_hidden_state),
                                 1e-6)
            t = fast(input_ids=x, attention_mask=mask, return_dict=False)     # another signature: a recompile
            self.assertIs(type(t), tuple)
            self.assertLessEqual(max_rel(t[0], m(x, None, mask, True, False)[0]), 1e-6)
            self.assertLessEqual(max_rel(fast(x, None, mask, True, False)[0], t[0]), 1e-6)
        self.assertEqual(fast.stats.compiles, 3)
        self.assertEqual(fast.stats.recompiles[0],
                         "keyword arguments ['attention_mask', 'input_ids'] -> ['attention_mask', 'input_ids', 'return_dict']")
        self.assertEqual(fast.stats.recompiles[1], "keyword arguments ['attention_mask', 'input_ids', 'return_dict'] -> []")

    def test_literal_argument_change_is_named(self):
        fast = tessel.compile(KeywordCall(), (torch.randn(1, 2, 8), None, None, True, True), backend="graph")
        fast(torch.randn(1, 2, 8), None, None, True, False)
        self.assertEqual(fast.stats.recompiles, ["input 4 True -> False"])

    def test_object_argument_is_a_clear_error(self):
        fast = tessel.compile(KeywordCall(), (), example_kwargs=dict(input_ids=torch.randn(1, 2, 8)), backend="graph")
        with self.assertRaises(tessel.TesselError) as cm:
            fast(input_ids=torch.randn(1, 2, 8), past_key_values=Cache(1))
        self.assertIn("keyword argument 'past_key_values' is a Cache", str(cm.exception))




class LeavesAFunctorchLayer(nn.Module):
    """Fails inside the trace the way torch's functionalization did on timm's coat_lite_tiny (torch 2.11):
    an error raised after a functorch layer was entered and before it was left."""

    def forward(self, x):
        torch._C._functorch._func_increment_nesting(True)
        raise RuntimeError("simulated internal assert inside functionalization")


_FUNCTORCH = getattr(torch._C, "_functorch", None)


@unittest.skipUnless(hasattr(_FUNCTORCH, "pop_dynamic_layer_stack_and_undo_to_depth")
                     and hasattr(_FUNCTORCH, "_func_increment_nesting"), "needs torch >= 2's functorch stack API")
class FailedCaptureTest(unittest.TestCase):
    def test_a_failed_capture_leaves_functorch_as_it_was(self):
        depth = _FUNCTORCH.get_dynamic_layer_stack_depth()
        with self.assertRaises(tessel.TesselError):
            tessel.compile(LeavesAFunctorchLayer(), (torch.randn(2, 3),))
        self.assertEqual(_FUNCTORCH.get_dynamic_layer_stack_depth(), depth)
        # the process can still compile: the next model captures and matches eager
        m = nn.Linear(3, 4)
        x = torch.randn(2, 3)
        with torch.no_grad():
            self.assertLess((tessel.compile(m, (x,))(x) - m(x)).abs().max().item(), 1e-5)


if __name__ == "__main__":
    unittest.main()
