"""tessel.compile(..., target="cuda") and torch.compile(backend="tessel") on CUDA tensors, against PyTorch
eager on the same device: fp32 within 1e-4 relative, precision="bf16" within 2e-2 (torchvision resnet18, a
transformers BERT and GPT-2 from small configs with random weights, a small MLP); the call takes and returns
the caller's CUDA tensors and runs on the caller's stream without synchronising the host.

Without a usable GPU (the CI machine, a build without the CUDA target) the GPU tests skip with the reason
and one test checks the one-line error instead. docs/python.md, "CUDA tensors".
"""
import copy
import unittest

import torch

import tessel
from tessel import _tessel

_USABLE, _WHY = _tessel.cuda_device()
_TORCH_CUDA = torch.cuda.is_available()
GPU = _USABLE and _TORCH_CUDA
SKIP = ("no usable CUDA device for tessel: " + _WHY if not _USABLE else
        "PyTorch sees no CUDA device" if not _TORCH_CUDA else "")

try:
    import torchvision
except ImportError:  # pragma: no cover
    torchvision = None
try:
    import transformers
except ImportError:  # pragma: no cover
    transformers = None


def rel(out, ref):
    return float((out.float() - ref.float()).abs().max() / ref.float().abs().max())


class _MLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(64, 256)
        self.fc2 = torch.nn.Linear(256, 32)

    def forward(self, x):
        return torch.softmax(self.fc2(torch.nn.functional.gelu(self.fc1(x))), dim=-1) + x[..., :32]


class _Attention(torch.nn.Module):
    """Single-head attention over the sequence with a residual: a softmax over the symbolic length."""

    def __init__(self):
        super().__init__()
        self.qkv = torch.nn.Linear(64, 192)
        self.out = torch.nn.Linear(64, 64)

    def forward(self, x):
        q, k, v = self.qkv(x).split(64, dim=-1)
        p = torch.softmax(q @ k.transpose(-1, -2) / 8.0, dim=-1)
        return self.out(p @ v) + x


class _Decode(torch.nn.Module):
    """One decode step over a KV cache of 4 heads that grows by the new position (as transformers' dynamic
    cache): new caches returned beside the attention's output."""

    def __init__(self):
        super().__init__()
        self.qkv = torch.nn.Linear(64, 192)

    def forward(self, x, k_cache, v_cache):
        q, k, v = (t.view(1, 1, 4, 16).transpose(1, 2) for t in self.qkv(x).split(64, dim=-1))
        k_all = torch.cat([k_cache, k], dim=2)
        v_all = torch.cat([v_cache, v], dim=2)
        p = torch.softmax(q @ k_all.transpose(-1, -2) / 4.0, dim=-1)
        return (p @ v_all).transpose(1, 2).reshape(1, 1, 64), k_all, v_all


@unittest.skipIf(GPU, "a usable CUDA device is present: the GPU tests run instead")
class CudaTargetWithoutDevice(unittest.TestCase):
    def test_one_line_error(self):
        m = _MLP().eval()
        with self.assertRaises(tessel.TesselError) as c:
            tessel.compile(m, (torch.randn(2, 64),), target="cuda")
        msg = str(c.exception)
        self.assertTrue(msg.startswith("target 'cuda': "), msg)
        self.assertNotIn("\n", msg)

    def test_bf16_is_a_cuda_option(self):
        with self.assertRaises(tessel.TesselError) as c:
            tessel.compile(_MLP().eval(), (torch.randn(2, 64),), precision="bf16")
        self.assertIn("CUDA target option", str(c.exception))


@unittest.skipUnless(GPU, SKIP)
class CudaTarget(unittest.TestCase):
    def setUp(self):
        torch.manual_seed(0)
        self.dev = torch.device("cuda", 0)

    def test_mlp_matches_and_recompiles(self):
        m = _MLP().to(self.dev).eval()
        x = torch.randn(4, 64, device=self.dev)
        fast = tessel.compile(m, (x,))
        self.assertEqual(fast.target, "cuda")
        for _ in range(3):        # eager first call, captured second, replayed third
            out = fast(x)
            with torch.no_grad():
                ref = m(x)
            self.assertEqual(out.device, self.dev)
            self.assertLessEqual(rel(out, ref), 1e-4)
        x2 = torch.randn(9, 64, device=self.dev)
        with torch.no_grad():
            self.assertLessEqual(rel(fast(x2), m(x2)), 1e-4)
        self.assertEqual(fast.stats.compiles, 2)
        self.assertEqual(fast.stats.recompiles, ["input 0 shape [4, 64] -> [9, 64]"])
        with torch.no_grad():      # a changed weight: the frozen copy on the device is refreshed
            m.fc1.weight.mul_(0.5)
            self.assertLessEqual(rel(fast(x2), m(x2)), 1e-4)
        self.assertEqual(fast.stats.refreshes, 1)

    def test_memory_is_the_callers(self):
        m = _MLP().to(self.dev).eval()
        x = torch.randn(4, 64, device=self.dev)
        fast = tessel.compile(m, (x,))
        fast(x)
        fast(x)
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated(self.dev)
        x_ptr = x.data_ptr()
        out = fast(x)
        # the output is one new tensor of PyTorch's allocator and nothing else was allocated: no staging
        # copy of the input, no host round trip (tessel's own buffers are outside PyTorch's allocator)
        self.assertEqual(torch.cuda.memory_allocated(self.dev) - before, out.untyped_storage().nbytes())
        self.assertEqual(x.data_ptr(), x_ptr)
        self.assertTrue(out.is_contiguous() and out._base is None)
        with torch.no_grad():
            self.assertLessEqual(rel(out, m(x)), 1e-4)

    def test_runs_on_the_callers_stream_without_synchronising(self):
        m = _MLP().to(self.dev).eval()
        x = torch.randn(4, 64, device=self.dev)
        fast = tessel.compile(m, (x,))
        with torch.no_grad():
            ref = m(x)
        fast(x)                    # the first call (lazy kernel loading, cuBLASLt's first use) and
        fast(x)                    # the capture happen before; the steady state is what must not wait
        torch.cuda.synchronize()
        for _ in range(2):
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                torch.cuda._sleep(200_000_000)   # ~0.1 s of GPU time on the side stream
                xs = x * 1.0                     # written only after the sleep, on the side stream
                out = fast(xs)
                # the call returned while the stream still sleeps: it did not synchronise the host
                self.assertFalse(side.query(), "tessel's call waited for the stream")
            torch.cuda.synchronize()
            # and it ran after the side stream's work (it read xs once written): the caller's stream
            self.assertLessEqual(rel(out, ref), 1e-4)

    def test_cpu_tensor_to_a_cuda_callable(self):
        m = _MLP().to(self.dev).eval()
        fast = tessel.compile(m, (torch.randn(4, 64, device=self.dev),))
        with self.assertRaises(tessel.TesselError) as c:
            fast(torch.randn(4, 64))
        self.assertIn("pass CUDA tensors", str(c.exception))

    def test_an_input_written_in_place(self):
        # A static KV cache's write (index_copy_ into a tensor the caller keeps): the scatter runs on the
        # device (no host step, so the call is one CUDA graph) and the executable copies the new cache
        # straight into the caller's tensor; outputs and the cache equal eager's after every call, and the
        # cache's version counter moves as an in-place op's would.
        class Step(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.fc = torch.nn.Linear(16, 16)

            def forward(self, x, pos, cache):
                cache.index_copy_(0, pos, self.fc(x))
                return torch.softmax(x @ cache.t(), -1) @ cache
        m = Step().to(self.dev).eval()
        mine, ref = torch.zeros(32, 16, device=self.dev), torch.zeros(32, 16, device=self.dev)
        fast = tessel.compile(m, (torch.randn(4, 16, device=self.dev), torch.arange(4, device=self.dev), mine.clone()))
        with torch.no_grad():
            for start in (0, 4, 8, 2):
                x, pos = torch.randn(4, 16, device=self.dev), torch.arange(start, start + 4, device=self.dev)
                version = mine._version
                out = fast(x, pos, mine)
                self.assertLessEqual(rel(out, m(x, pos, ref)), 1e-5, start)
                self.assertLessEqual(rel(mine, ref), 1e-6, start)
                self.assertGreater(mine._version, version)
        self.assertEqual(fast.stats.compiles, 1)
        exe = next(iter(fast._cache.values())).exe
        self.assertEqual(exe.stats["host_steps"], 0, exe.stats["host_ops"])

    def test_a_cpu_scalar_beside_cuda_tensors(self):
        # PyTorch's CUDA ops take a 0-d CPU tensor beside CUDA ones (dynamo passes such a counter of
        # transformers' caches): the callable copies it up, as eager would use it.
        def f(x, s):
            return (x * s).relu()
        x = torch.randn(4, 64, device=self.dev)
        fast = tessel.compile(f, (x, torch.tensor(2.0, device=self.dev)))
        for v in (0.5, -3.0):
            s = torch.tensor(v)
            self.assertLessEqual(rel(fast(x, s), f(x, s)), 1e-6)

    def test_bf16_mlp(self):
        m = _MLP().to(self.dev).eval()
        x = torch.randn(4, 64, device=self.dev)
        fast = tessel.compile(m, (x,), precision="bf16")
        with torch.no_grad():
            ref = m(x)
        for _ in range(3):
            out = fast(x)
            self.assertEqual(out.dtype, torch.float32)
            self.assertLessEqual(rel(out, ref), 2e-2)

    @unittest.skipIf(torchvision is None, "torchvision is not installed")
    def test_resnet18(self):
        model = torchvision.models.resnet18().to(self.dev).eval()
        x = torch.randn(2, 3, 224, 224, device=self.dev)
        # The oracle is float64 on the CPU: PyTorch's own CUDA convolutions use TF32 by default
        # (torch.backends.cudnn.allow_tf32), about 3e-4 from exact on this model.
        with torch.no_grad():
            ref = copy.deepcopy(model).double().cpu()(x.double().cpu()).to(self.dev, torch.float32)
        self._check_precisions("resnet18", lambda p: tessel.compile(model, (x,), precision=p), lambda f: f(x), ref)

    def _check_precisions(self, name, compile_at, call, ref):
        """compile_at(precision) at f32 and bf16, each called 3 times (eager, captured, replayed): call(fast)
        within the issue's bars of ref."""
        for precision, tol in (("f32", 1e-4), ("bf16", 2e-2)):
            fast = compile_at(precision)
            for _ in range(3):
                err = rel(call(fast), ref)
                self.assertLessEqual(err, tol, f"{name} {precision}: rel err {err:.2e}")

    def _hf(self, model_type, **overrides):
        cfg = transformers.AutoConfig.for_model(model_type, **overrides)
        model = transformers.AutoModel.from_config(cfg).to(self.dev).eval()
        ids = torch.randint(3, cfg.vocab_size, (2, 64), device=self.dev)
        mask = torch.ones(2, 64, dtype=torch.long, device=self.dev)
        return model, dict(input_ids=ids, attention_mask=mask)

    def _check_hf(self, model, kw, name):
        with torch.no_grad():
            ref = model(**kw).last_hidden_state
        self._check_precisions(name, lambda p: tessel.compile(model, (), example_kwargs=kw, precision=p),
                               lambda f: f(**kw).last_hidden_state, ref)

    @unittest.skipIf(transformers is None, "transformers is not installed")
    def test_bert(self):
        model, kw = self._hf("bert", num_hidden_layers=2, hidden_size=256, intermediate_size=1024,
                             num_attention_heads=4, vocab_size=4000)
        self._check_hf(model, kw, "bert")

    @unittest.skipIf(transformers is None, "transformers is not installed")
    def test_gpt2(self):
        model, kw = self._hf("gpt2", n_layer=2, n_embd=256, n_head=4, vocab_size=4000)
        kw["use_cache"] = False
        self._check_hf(model, kw, "gpt2")

    def test_dynamic_one_compilation(self):
        """dynamic=True on CUDA: one compilation, its code generated once with the sizes as kernel
        parameters, serves every (batch, seq) shape (docs/dynamic-shapes.md, "On CUDA")."""
        m = _Attention().to(self.dev).eval()
        shapes = [(2, 7), (1, 33), (3, 12), (2, 7), (4, 100), (1, 1)]
        fast = tessel.compile(m, (torch.randn(*shapes[0], 64, device=self.dev),), dynamic=True)
        self.assertEqual(fast.target, "cuda")
        for b, t in shapes:
            x = torch.randn(b, t, 64, device=self.dev)
            with torch.no_grad():
                self.assertLessEqual(rel(fast(x), m(x)), 1e-4, (b, t))
        self.assertEqual(fast.stats.compiles, 1, fast.stats.recompiles)
        self.assertIsNone(fast.stats.dynamic_fallback)
        self.assertGreaterEqual(fast.stats.rebinds, 5)

    @unittest.skipUnless(hasattr(torch, "compile"), "torch.compile needs torch >= 2")
    def test_torch_compile_kv_cache_grows(self):
        """A decode step whose KV cache grows by one position a call, under torch.compile: dynamo marks the
        length dynamic, tessel compiles the symbolic graph once for CUDA, no call falls back to PyTorch."""
        import torch._dynamo
        torch._dynamo.reset()
        tessel.dynamo_graphs.clear()
        tessel.dynamo_fallbacks.clear()
        m = _Decode().to(self.dev).eval()
        opt = torch.compile(m, backend="tessel")
        k = torch.randn(1, 4, 3, 16, device=self.dev)
        v = torch.randn(1, 4, 3, 16, device=self.dev)
        with torch.no_grad():
            for step in range(12):
                x = torch.randn(1, 1, 64, device=self.dev)
                out, k2, v2 = opt(x, k, v)
                ref, rk, rv = m(x, k, v)
                self.assertLessEqual(rel(out, ref), 1e-4, step)
                self.assertTrue(torch.equal(k2, rk) and torch.equal(v2, rv), step)
                k, v = k2, v2
        self.assertEqual(tessel.dynamo_fallbacks, [])
        compiles = sum(g.stats.compiles for g in tessel.dynamo_graphs)
        self.assertLessEqual(compiles, 2, [g.stats.recompiles for g in tessel.dynamo_graphs])
        self.assertTrue(all(g.target == "cuda" for g in tessel.dynamo_graphs))

    @unittest.skipUnless(hasattr(torch, "compile"), "torch.compile needs torch >= 2")
    def test_torch_compile(self):
        import torch._dynamo
        torch._dynamo.reset()
        tessel.dynamo_graphs.clear()
        m = _MLP().to(self.dev).eval()
        x = torch.randn(4, 64, device=self.dev)
        opt = torch.compile(m, backend="tessel")
        with torch.no_grad():
            ref = m(x)
            for _ in range(3):
                out = opt(x)
                self.assertEqual(out.device, self.dev)
                self.assertLessEqual(rel(out, ref), 1e-4)
        self.assertTrue(tessel.dynamo_graphs)
        self.assertTrue(all(g.target == "cuda" for g in tessel.dynamo_graphs))


if __name__ == "__main__":
    unittest.main()
