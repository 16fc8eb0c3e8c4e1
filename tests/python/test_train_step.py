"""tessel.compile(module, inputs, train=True): loss.backward() through tessel's compiled backward fills the
parameters' .grad as PyTorch's autograd does (torch 1.13 here; the same test on torch 2.x).

Gradients are compared by the relative error of each parameter's whole gradient, ||tessel - torch|| /
||torch|| <= 1e-4 (single elements of a float32 gradient that is a sum of thousands of products carry
rounding of the order of the largest terms, not of themselves).

    PYTHONPATH=build/python /usr/bin/python3 -m unittest tests/python/test_train_step.py -v
"""
import math
import unittest

import torch
import torch.nn as nn
import torch.nn.functional as F

import tessel

torch.set_num_threads(2)

try:
    import torchvision.models as M
except ImportError:  # pragma: no cover
    M = None

import os

# The sanitized build runs this suite under ASan: the torchvision models take minutes there.
SANITIZED = bool(os.environ.get("TESSEL_SANITIZED"))

try:
    import transformers  # the GPU box has it; this machine does not
except ImportError:
    transformers = None


def rel(a, b):
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def clone_module(m):
    import copy
    return copy.deepcopy(m)


class Attention(nn.Module):
    def __init__(self, d, heads, causal):
        super().__init__()
        self.heads, self.causal = heads, causal
        self.qkv = nn.Linear(d, 3 * d)
        self.out = nn.Linear(d, d)

    def forward(self, x, mask=None):
        b, t, c = x.shape
        q, k, v = self.qkv(x).split(c, dim=-1)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        s = (q @ k.transpose(-2, -1)) / math.sqrt(c // self.heads)
        if self.causal:
            keep = torch.ones(t, t, dtype=torch.bool).tril()
            s = s.masked_fill(~keep, float("-inf"))
        if mask is not None:
            s = s + mask
        y = s.softmax(-1) @ v
        return self.out(y.transpose(1, 2).reshape(b, t, c))


class BertLike(nn.Module):
    """Post-LN encoder: token + position + type embeddings, LayerNorm, attention with a padding mask,
    exact GELU, a pooler (tanh)."""

    def __init__(self, vocab=50, d=32, heads=4, layers=2, t=8):
        super().__init__()
        self.tok, self.pos, self.typ = nn.Embedding(vocab, d), nn.Embedding(t, d), nn.Embedding(2, d)
        self.ln0 = nn.LayerNorm(d)
        self.att = nn.ModuleList(Attention(d, heads, False) for _ in range(layers))
        self.ln1 = nn.ModuleList(nn.LayerNorm(d) for _ in range(layers))
        self.ff = nn.ModuleList(nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d)) for _ in range(layers))
        self.ln2 = nn.ModuleList(nn.LayerNorm(d) for _ in range(layers))
        self.pool = nn.Linear(d, d)

    def forward(self, ids, types, attn):
        t = ids.shape[1]
        x = self.ln0(self.tok(ids) + self.pos(torch.arange(t)) + self.typ(types))
        mask = (1.0 - attn[:, None, None, :].float()) * -10000.0
        for a, l1, f, l2 in zip(self.att, self.ln1, self.ff, self.ln2):
            x = l1(x + a(x, mask))
            x = l2(x + f(x))
        return torch.tanh(self.pool(x[:, 0]))


class GPT2Like(nn.Module):
    """Pre-LN decoder: token + position embeddings, causal attention, tanh-GELU, a tied LM head and the
    next-token cross-entropy loss."""

    def __init__(self, vocab=64, d=32, heads=4, layers=2, t=8):
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, d), nn.Embedding(t, d)
        self.ln1 = nn.ModuleList(nn.LayerNorm(d) for _ in range(layers))
        self.att = nn.ModuleList(Attention(d, heads, True) for _ in range(layers))
        self.ln2 = nn.ModuleList(nn.LayerNorm(d) for _ in range(layers))
        self.ff = nn.ModuleList(nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(approximate="tanh"), nn.Linear(4 * d, d))
                                for _ in range(layers))
        self.lnf = nn.LayerNorm(d)

    def forward(self, ids, targets):
        t = ids.shape[1]
        x = self.tok(ids) + self.pos(torch.arange(t))
        for l1, a, l2, f in zip(self.ln1, self.att, self.ln2, self.ff):
            x = x + a(l1(x))
            x = x + f(l2(x))
        logits = self.lnf(x) @ self.tok.weight.t()
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


class ConvRelu(nn.Module):
    """Conv (zero bias) -> ReLU on an input with zero blocks: many pre-activations are exactly 0, where
    PyTorch's relu passes no gradient (threshold_backward), so the bias gradient counts only x > 0."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.fc = nn.Linear(4 * 6 * 6, 5)
        with torch.no_grad():
            self.conv.bias.zero_()

    def forward(self, x):
        h = F.max_pool2d(F.relu(self.conv(x)), 2, 2, padding=1)
        return F.relu6(self.fc(h.flatten(1)) * 4)


class ReadsValues(nn.Module):
    """Python that reads tensor values: a bool (a branch on the ids) and an int (how many columns to
    keep), as transformers' models do on their way to the logits."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(6, 6)

    def forward(self, x, ids):
        y = self.fc(x)
        if (ids == 0).any():
            y = y * 2
        n = int((ids > 2).sum())
        return torch.tanh(y[:, :n]).sum(1)


class Grads(unittest.TestCase):
    def check(self, model, inputs, loss=lambda y: (y * torch.linspace(-1, 1, y.numel()).reshape(y.shape)).sum(),
              backend="compiled", tol=1e-4):
        ref = clone_module(model)
        fast = tessel.compile(model, inputs, train=True, backend=backend, threads=2)
        y = fast(*inputs)
        loss(y).backward()
        yr = ref(*inputs)
        loss(yr).backward()
        self.assertLessEqual(rel(y.detach(), yr.detach()), tol)
        named = dict(ref.named_parameters())
        checked = 0
        for n, p in model.named_parameters():
            if p.grad is None and named[n].grad is None:
                continue
            self.assertIsNotNone(p.grad, n)
            self.assertLessEqual(rel(p.grad, named[n].grad), tol, n)
            checked += 1
        self.assertGreater(checked, 0)
        return fast

    def test_value_reads_are_guarded(self):
        # train=True specialises on the values the module reads into Python, as inference does: the
        # forward returns the read tensors, a call on which one differs recompiles (or takes another
        # cached specialisation); every call's gradients are torch's.
        torch.manual_seed(3)
        m = ReadsValues()
        ref = clone_module(m)
        x = torch.randn(4, 6)
        calls = [torch.tensor([0, 3, 4, 1]), torch.tensor([5, 3, 4, 1]), torch.tensor([1, 3, 9, 0]),
                 torch.tensor([7, 3, 4, 1])]
        fast = tessel.compile(m, (x, calls[0]), train=True, threads=2)
        for k, ids in enumerate(calls):
            for mod in (m, ref):
                mod.zero_grad(set_to_none=True)
            y = fast(x, ids)
            yr = ref(x, ids)
            self.assertEqual(y.shape, yr.shape, k)
            (y * torch.linspace(-1, 1, y.numel())).sum().backward()
            (yr * torch.linspace(-1, 1, yr.numel())).sum().backward()
            self.assertLessEqual(rel(y.detach(), yr.detach()), 1e-5, k)
            for p, q in zip(m.parameters(), ref.parameters()):
                self.assertLessEqual(rel(p.grad, q.grad), 1e-5, k)
        # calls 0 and 2 read the same values (a zero id, two ids > 2), 1 and 3 others: two compilations
        self.assertEqual(fast.stats.compiles, 2)
        self.assertEqual(len(fast.stats.recompiles), 1)
        self.assertIn("value guard", fast.stats.recompiles[0])
        self.assertEqual(fast.stats.cache_hits, 3)   # calls 0, 2 and 3

    def test_relu_ties_at_zero(self):
        torch.manual_seed(0)
        m = ConvRelu()
        x = torch.randn(2, 3, 10, 10)
        x[:, :, 3:8, 3:8] = 0          # the conv (bias 0) gives exact zeros there
        fast = self.check(m, (x,))
        # The exact zeros really are there, and a 1/2 at the tie would have moved the bias gradient.
        with torch.no_grad():
            pre = m.conv(x)
        self.assertGreater(int((pre == 0).sum()), 50)
        self.assertIn("train:", fast.step.summary)

    def test_bert_like(self):
        torch.manual_seed(1)
        m = BertLike()
        ids = torch.randint(0, 50, (2, 8))
        types = torch.randint(0, 2, (2, 8))
        attn = torch.ones(2, 8, dtype=torch.long)
        attn[1, 5:] = 0
        self.check(m, (ids, types, attn))

    def test_gpt2_like_cross_entropy(self):
        torch.manual_seed(2)
        m = GPT2Like()
        ids = torch.randint(0, 64, (2, 8))
        self.check(m, (ids, torch.roll(ids, -1, 1)), loss=lambda y: y)

    def test_input_gradient_and_a_second_step(self):
        torch.manual_seed(3)
        m = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 2))
        x = torch.randn(4, 6, requires_grad=True)
        fast = tessel.compile(m, (x,), train=True, threads=2)
        xr = x.detach().clone().requires_grad_()
        ref = clone_module(m)
        for _ in range(2):   # the second call reuses the compilation; grads accumulate as in PyTorch
            fast(x).pow(2).sum().backward()
            ref(xr).pow(2).sum().backward()
        self.assertEqual(fast.stats.compiles, 1)
        self.assertLessEqual(rel(x.grad, xr.grad), 1e-5)
        # A parameter the output does not use keeps .grad None, as in PyTorch.
        m2 = nn.Linear(6, 2)
        m2.unused = nn.Parameter(torch.ones(3))
        tessel.compile(m2, (x,), train=True, threads=2)(x).sum().backward()
        self.assertIsNone(m2.unused.grad)
        self.assertIsNotNone(m2.weight.grad)
        for (n, p), q in zip(m.named_parameters(), ref.parameters()):
            self.assertLessEqual(rel(p.grad, q.grad), 1e-5, n)

    def test_other_backends_and_a_changed_buffer(self):
        torch.manual_seed(9)
        for backend in ("graph", "eager"):
            m = nn.Sequential(nn.Linear(6, 8), nn.GELU(), nn.LayerNorm(8), nn.Linear(8, 2))
            self.check(m, (torch.randn(4, 6),), backend=backend)
        # A frozen buffer (eval BatchNorm's running mean) changed in place: the next call recompiles.
        m = nn.Sequential(nn.Linear(6, 8), nn.BatchNorm1d(8)).eval()
        x = torch.randn(4, 6)
        fast = tessel.compile(m, (x,), train=True, threads=2)
        fast(x).sum().backward()
        with torch.no_grad():
            m[1].running_mean.add_(1)
        m.zero_grad()
        ref = clone_module(m)
        fast(x).sum().backward()
        ref(x).sum().backward()
        self.assertEqual(len(fast.stats.recompiles), 1)
        self.assertIn("running_mean", fast.stats.recompiles[0])
        for p, q in zip(m.parameters(), ref.parameters()):
            self.assertLessEqual(rel(p.grad, q.grad), 1e-5)

    def check_train_bn(self, model, x, steps=2, f64=False, seed=None):
        """Training-mode BatchNorm: batch statistics in the forward (with their gradients) and the running
        statistics updated as PyTorch updates them (momentum, unbiased variance, num_batches_tracked),
        over `steps` forward/backward passes. f64: the gradients' oracle is PyTorch in float64, and the
        bar 1e-4 or, where float32 itself is worse conditioned than that, PyTorch float32's own error.
        seed: the model has dropout; every forward of a step starts from this seed plus the step, so
        tessel and PyTorch draw the same masks."""
        ref = clone_module(model)
        ref64 = clone_module(model).double() if f64 else None
        # PyTorch float32 once more on the input with every element moved to a neighbouring float32 (up or
        # down at random): how far float32 lands from float64 depends on where the roundings fall, so
        # float32's own error is read from both runs (the larger), not from one draw of them
        ref2 = clone_module(model) if f64 else None
        if f64:
            g = torch.Generator().manual_seed(0)
            up = torch.randint(0, 2, x.shape, generator=g).bool()
            x_moved = torch.nextafter(x, torch.where(up, torch.full_like(x, float("inf")), torch.full_like(x, float("-inf"))))
        fast = tessel.compile(model, (x,), train=True, threads=2)
        w = None
        def seeded(f, *a):
            if seed is not None:
                torch.manual_seed(seed + step)
            return f(*a)
        for step in range(steps):
            y, yr = seeded(fast, x), seeded(ref, x)
            w = torch.linspace(-1, 1, y.numel()).reshape(y.shape) if w is None else w
            (y * w).sum().backward()
            (yr * w).sum().backward()
            if f64:
                (seeded(ref64, x.double()) * w.double()).sum().backward()
                (seeded(ref2, x_moved) * w).sum().backward()
            self.assertLessEqual(rel(y.detach(), yr.detach()), 1e-4)
            # A gradient that is zero in exact arithmetic (a bias right before a train-mode BatchNorm,
            # which subtracts the batch mean) is compared against the model's largest gradient.
            oracle = ref64 if f64 else ref
            scale = max(float(q.grad.norm()) for q in oracle.parameters())
            refs32 = [ref.parameters(), ref2.parameters()] if f64 else [ref.parameters()]
            for (n, p), q, *q32s in zip(model.named_parameters(), oracle.parameters(), *refs32):
                bound = max(float(q.grad.norm()), 1e-2 * scale)
                err = float((p.grad.double() - q.grad.double()).norm()) / bound
                torch_err = max(float((q32.grad.double() - q.grad.double()).norm()) / bound for q32 in q32s) if f64 else 0.0
                self.assertLessEqual(err, max(1e-4, 2 * torch_err), n)
            # Running means that are zero in exact arithmetic (a 1x1 convolution of a BatchNorm's output,
            # whose batch mean is 0) are compared against the largest running statistic.
            bscale = max(float(c.norm()) for c in oracle.buffers() if c.is_floating_point())
            for (n, b), c, c32 in zip(model.named_buffers(), oracle.buffers(), ref.buffers()):
                if b.is_floating_point():
                    bound = max(float(c.norm()), 1e-3 * bscale)
                    err = float((b.double() - c.double()).norm()) / bound
                    torch_err = float((c32.double() - c.double()).norm()) / bound if f64 else 0.0
                    self.assertLessEqual(err, max(1e-5, 2 * torch_err), n)
                else:
                    self.assertTrue(torch.equal(b, c), n)
        self.assertEqual(fast.stats.compiles, 1)
        return fast

    def test_train_mode_batchnorm(self):
        torch.manual_seed(6)
        m = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(), nn.Linear(144, 3),
                          nn.BatchNorm1d(3, momentum=0.3)).train()
        self.check_train_bn(m, torch.randn(2, 3, 8, 8), steps=3)
        self.assertEqual(int(m[1].num_batches_tracked), 3)
        # back in eval mode: the running statistics as constants (a recompile, the training flag changed)
        m.eval()
        fast = tessel.compile(m, (torch.randn(2, 3, 8, 8),), train=True, threads=2)
        x = torch.randn(2, 3, 8, 8)
        self.assertLessEqual(rel(fast(x).detach(), m(x).detach()), 1e-5)

    @unittest.skipIf(M is None or SANITIZED, "needs torchvision (not under ASan: minutes)")
    def test_resnet18_train_batchnorm(self):
        torch.manual_seed(4)
        self.check_train_bn(M.resnet18(num_classes=10).train(), torch.randn(2, 3, 64, 64))

    @unittest.skipIf(M is None or SANITIZED, "needs torchvision (not under ASan: minutes)")
    def test_mobilenet_v2_train_batchnorm(self):
        torch.manual_seed(5)
        m = M.mobilenet_v2(num_classes=10).train()   # its classifier's Dropout(0.2) too: the same masks as eager
        # Batch statistics over few values per channel (2x2 maps in the last blocks) make float32 training
        # ill-conditioned: PyTorch's own gradients move by up to 7e-3 between 1 and 2 threads. The
        # oracle is PyTorch in float64; tessel must be within 1e-4 of it or as close as PyTorch float32.
        self.check_train_bn(m, torch.randn(2, 3, 64, 64), f64=True, seed=50)

    @unittest.skipIf(M is None or SANITIZED, "needs torchvision (not under ASan: minutes)")
    def test_resnet18_eval_batchnorm(self):
        torch.manual_seed(4)
        m = M.resnet18(num_classes=10).eval()
        self.check(m, (torch.randn(2, 3, 64, 64),))

    @unittest.skipIf(M is None or SANITIZED, "needs torchvision (not under ASan: minutes)")
    def test_mobilenet_v2_eval_batchnorm(self):
        torch.manual_seed(5)
        m = M.mobilenet_v2(num_classes=10).eval()
        self.check(m, (torch.randn(2, 3, 64, 64),))


class DropoutAttention(Attention):
    """Attention with dropout on its probabilities (BERT's attention_probs_dropout)."""

    def __init__(self, d, heads, p):
        super().__init__(d, heads, False)
        self.drop = nn.Dropout(p)

    def forward(self, x, mask=None):
        b, t, c = x.shape
        q, k, v = self.qkv(x).split(c, dim=-1)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        a = self.drop(((q @ k.transpose(-2, -1)) / math.sqrt(c // self.heads)).softmax(-1))
        return self.out((a @ v).transpose(1, 2).reshape(b, t, c))


class Dropout(unittest.TestCase):
    """Training-mode dropout: PyTorch's CPU dropout draws `empty_like(x).bernoulli_(1 - p)`; capture makes
    each draw a mask input of the graph, drawn by PyTorch before every forward in graph order, so under
    one seed tessel's masks are eager's and the outputs and gradients match (docs/training.md, "Dropout")."""

    def check(self, m, x, steps=3, tol=1e-5):
        ref = clone_module(m)
        state = torch.get_rng_state()
        fast = tessel.compile(m, (x,), train=True, threads=2)
        self.assertTrue(torch.equal(state, torch.get_rng_state()))   # compiling draws nothing from it
        w = torch.linspace(-1, 1, ref(x).numel())
        outs = []
        for step in range(steps):
            torch.manual_seed(100 + step)
            yr = ref(x)
            torch.manual_seed(100 + step)
            y = fast(x)
            self.assertLessEqual(rel(y.detach(), yr.detach()), tol, step)
            (yr.reshape(-1) * w).sum().backward()
            (y.reshape(-1) * w).sum().backward()
            for (n, p), q in zip(m.named_parameters(), ref.parameters()):
                self.assertLessEqual(rel(p.grad, q.grad), tol, (step, n))
            m.zero_grad(set_to_none=True)
            ref.zero_grad(set_to_none=True)
            outs.append(y.detach())
        # fresh masks on every call: the steps' outputs differ
        self.assertFalse(torch.equal(outs[0], outs[1]))
        self.assertEqual(fast.stats.compiles, 1)
        return fast

    def test_mlp_dropouts(self):
        torch.manual_seed(0)
        m = nn.Sequential(nn.Linear(16, 32), nn.Dropout(0.25), nn.ReLU(), nn.Linear(32, 8), nn.Dropout()).train()
        fast = self.check(m, torch.randn(4, 16))
        # two masks, both inputs of the forward, none differentiated
        self.assertEqual(len(fast._last.masks), 2)
        self.assertEqual([k.p for k in fast._last.masks], [0.75, 0.5])
        # the fraction kept is about 1 - p (32768 draws: 0.75 +- 0.01)
        x = torch.ones(64, 512, requires_grad=True)
        drop = tessel.compile(nn.Dropout(0.25).train(), (x,), train=True, threads=2)
        self.assertAlmostEqual(float((drop(x) != 0).float().mean()), 0.75, delta=0.01)

    def test_attention_probability_dropout(self):
        torch.manual_seed(1)
        m = nn.Sequential(DropoutAttention(32, 4, 0.1), nn.Dropout(0.1)).train()
        self.check(m, torch.randn(2, 8, 32), tol=1e-4)

    def test_eval_mode_has_no_masks(self):
        torch.manual_seed(2)
        m = nn.Sequential(nn.Linear(8, 8), nn.Dropout(0.5)).eval()
        fast = tessel.compile(m, (torch.randn(2, 8),), train=True, threads=2)
        self.assertEqual(fast._last.masks, [])

    def test_inference_compile_draws_in_pytorch(self):
        # tessel.compile without train=True: the draw is a graph break run by PyTorch, the same masks
        torch.manual_seed(3)
        m = nn.Sequential(nn.Linear(8, 8), nn.Dropout(0.5), nn.Linear(8, 4)).train()
        x = torch.randn(4, 8)
        fast = tessel.compile(m, (x,))
        torch.manual_seed(9)
        y = fast(x)
        torch.manual_seed(9)
        with torch.no_grad():
            self.assertLessEqual(rel(y, m(x)), 1e-5)


class Optimizers(unittest.TestCase):
    """tessel.optim's compiled steps against torch.optim on the same model, data and hyperparameters."""

    def run_both(self, make_opt, make_ref, steps, compiled=True):
        torch.manual_seed(8)
        m = nn.Sequential(nn.Linear(10, 32), nn.GELU(), nn.Linear(32, 32), nn.Tanh(), nn.Linear(32, 1))
        ref = clone_module(m)
        x = torch.randn(64, 10)
        y = torch.sin(x.sum(1, keepdim=True))
        fast = tessel.compile(m, (x,), train=True, threads=2) if compiled else m
        opt, opt_r = make_opt(m.parameters()), make_ref(ref.parameters())
        curve, curve_r = [], []
        for _ in range(steps):
            for model, o, c in ((fast, opt, curve), (ref, opt_r, curve_r)):
                o.zero_grad()
                loss = ((model(x) - y) ** 2).mean()
                loss.backward()
                o.step()
                c.append(loss.item())
        return m, ref, opt, curve, curve_r

    def test_adamw_100_steps_track_torch(self):
        m, ref, opt, curve, curve_r = self.run_both(
            lambda p: tessel.optim.AdamW(p, lr=1e-2, weight_decay=0.05, threads=2),
            lambda p: torch.optim.AdamW(p, lr=1e-2, weight_decay=0.05), 100)
        self.assertLess(curve_r[-1], 0.5 * curve_r[0])     # it trains
        for i, (a, b) in enumerate(zip(curve, curve_r)):
            self.assertLessEqual(abs(a - b), 1e-3 * max(abs(b), 1e-3), f"step {i}: {a} vs {b}")
        for p, q in zip(m.parameters(), ref.parameters()):
            self.assertLessEqual(rel(p.detach(), q.detach()), 1e-3)
        # One compiled graph for the group: at most one fused loop per parameter (the scalar -step_size
        # is one more; the two [32] biases share one): 6, where fusion without vertical group merging gave 22.
        (step,) = opt.compiled_steps
        self.assertLessEqual(step.loop_kernels, 6)
        self.assertEqual(step.state_count, 2)
        # In place: every new p, m and v is written straight over the parameter and its state.
        self.assertEqual(step.outputs_in_place, 3 * len(list(m.parameters())))

    def test_sgd_momentum_and_nesterov_track_torch(self):
        for kw in (dict(momentum=0.9), dict(momentum=0.9, nesterov=True, weight_decay=1e-3),
                   dict(momentum=0.5, dampening=0.1), dict()):
            m, ref, _, curve, curve_r = self.run_both(
                lambda p: tessel.optim.SGD(p, lr=0.05, threads=2, **kw),
                lambda p: torch.optim.SGD(p, lr=0.05, **kw), 30, compiled=False)
            for i, (a, b) in enumerate(zip(curve, curve_r)):
                self.assertLessEqual(abs(a - b), 1e-4 * max(abs(b), 1e-3), f"{kw} step {i}: {a} vs {b}")
            for p, q in zip(m.parameters(), ref.parameters()):
                self.assertLessEqual(rel(p.detach(), q.detach()), 1e-5, kw)

    def test_bad_hyperparameters(self):
        p = [nn.Parameter(torch.zeros(3))]
        with self.assertRaises(ValueError):
            tessel.optim.AdamW(p, betas=(1.5, 0.9))
        with self.assertRaises(ValueError):
            tessel.optim.SGD(p, nesterov=True)
        q = [nn.Parameter(torch.zeros(3, dtype=torch.float64))]
        q[0].grad = torch.ones(3, dtype=torch.float64)
        with self.assertRaisesRegex(tessel.TesselError, "float32"):
            tessel.optim.AdamW(q).step()


@unittest.skipUnless(tessel.dynamo_registered, "torch.compile needs torch >= 2.0 (the GPU box)")
class TorchCompileTraining(unittest.TestCase):
    def test_torch_compile_fills_grad(self):
        # torch.compile(backend="tessel") on a module in training: dynamo lifts the parameters to graph
        # inputs that require grad, the backend compiles the graph with train=True, and loss.backward()
        # fills .grad as eager does -- also after an optimizer step changed the parameters in place.
        torch.manual_seed(9)
        m = nn.Sequential(nn.Linear(12, 32), nn.LayerNorm(32), nn.GELU(), nn.Linear(32, 4)).train()
        ref = clone_module(m)
        c = torch.compile(m, backend="tessel")
        opt, opt_r = torch.optim.SGD(m.parameters(), lr=0.1), torch.optim.SGD(ref.parameters(), lr=0.1)
        x = torch.randn(8, 12)
        tessel.dynamo_graphs.clear()
        for step in range(3):
            opt.zero_grad()
            opt_r.zero_grad()
            loss, loss_r = c(x).pow(2).mean(), ref(x).pow(2).mean()
            loss.backward()
            loss_r.backward()
            self.assertLessEqual(abs(loss.item() - loss_r.item()), 1e-5 * abs(loss_r.item()), step)
            for (n, p), q in zip(m.named_parameters(), ref.parameters()):
                self.assertIsNotNone(p.grad, n)
                self.assertLessEqual(rel(p.grad, q.grad), 1e-4, (step, n))
            opt.step()
            opt_r.step()
        self.assertTrue(any(isinstance(g, tessel._train.TrainModule) for g in tessel.dynamo_graphs),
                        [type(g).__name__ for g in tessel.dynamo_graphs])

    def test_torch_compile_dropout(self):
        # dropout under torch.compile: the first call compiles (capture leaves PyTorch's generator as it
        # was), and every call draws eager's masks under the same seed
        torch.manual_seed(10)
        m = nn.Sequential(nn.Linear(12, 32), nn.Dropout(0.3), nn.GELU(), nn.Linear(32, 4), nn.Dropout(0.1)).train()
        ref = clone_module(m)
        c = torch.compile(m, backend="tessel")
        x = torch.randn(8, 12)
        tessel.dynamo_graphs.clear()
        for step in range(3):
            torch.manual_seed(20 + step)
            y = c(x)
            torch.manual_seed(20 + step)
            yr = ref(x)
            self.assertLessEqual(rel(y.detach(), yr.detach()), 1e-5, step)
            y.pow(2).mean().backward()
            yr.pow(2).mean().backward()
            for (n, p), q in zip(m.named_parameters(), ref.parameters()):
                self.assertLessEqual(rel(p.grad, q.grad), 1e-4, (step, n))
            m.zero_grad(set_to_none=True)
            ref.zero_grad(set_to_none=True)
        self.assertTrue(any(isinstance(g, tessel._train.TrainModule) for g in tessel.dynamo_graphs),
                        [type(g).__name__ for g in tessel.dynamo_graphs])


class Wrap(nn.Module):
    """A transformers model called as f(model, *tensors): keyword arguments fixed, one tensor out."""

    def __init__(self, m, f):
        super().__init__()
        self.m, self.f = m, f

    def forward(self, *a):
        return self.f(self.m, *a)


@unittest.skipIf(transformers is None, "needs transformers (the GPU box)")
class HuggingFace(unittest.TestCase):
    def check_fn(self, m, f, inputs, seed=None):
        ref = clone_module(m)
        fast = tessel.compile(Wrap(m, f), inputs, train=True, threads=2)
        if seed is not None:      # dropout: both draw the same masks (class Dropout)
            torch.manual_seed(seed)
        y = fast(*inputs)
        w = torch.linspace(-1, 1, y.numel()).reshape(y.shape)
        (y * w).sum().backward()
        if seed is not None:
            torch.manual_seed(seed)
        yr = f(ref, *inputs)
        (yr * w).sum().backward()
        # Relative to the parameter's own gradient, and for a gradient that is zero in exact arithmetic
        # (attention's key bias: it shifts every score of a row alike, which softmax ignores) relative to
        # the largest gradient of the model: both sides are then rounding noise.
        pairs = [(n, p.grad, q.grad) for (n, p), q in zip(m.named_parameters(), ref.parameters()) if q.grad is not None]
        scale = max(float(g.norm()) for _, _, g in pairs)
        for n, got, want in pairs:
            self.assertIsNotNone(got, n)
            err = float((got - want).norm())
            self.assertLessEqual(err, 1e-4 * max(float(want.norm()), 1e-2 * scale), n)
        self.assertGreater(len(pairs), 0)

    def test_hf_bert_tiny(self):
        cfg = transformers.BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                      intermediate_size=64, max_position_embeddings=16, hidden_dropout_prob=0.0,
                                      attention_probs_dropout_prob=0.0)
        torch.manual_seed(6)
        m = transformers.BertModel(cfg).eval()
        self.check_fn(m, lambda mod, i: mod(input_ids=i, return_dict=False)[0], (torch.randint(0, 100, (2, 8)),))

    def test_hf_bert_tiny_dropout(self):
        # training mode with BERT's dropouts (hidden 0.1, attention probabilities 0.1), eager attention
        cfg = transformers.BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                      intermediate_size=64, max_position_embeddings=16, attn_implementation="eager")
        torch.manual_seed(6)
        m = transformers.BertModel(cfg).train()
        self.check_fn(m, lambda mod, i: mod(input_ids=i, return_dict=False)[0], (torch.randint(0, 100, (2, 8)),),
                      seed=11)

    def test_hf_gpt2_tiny_dropout(self):
        # GPT-2's default dropouts (embeddings, attention, residual: 0.1 each) in training mode, eager attention
        cfg = transformers.GPT2Config(vocab_size=100, n_embd=32, n_layer=2, n_head=4, n_positions=16,
                                      attn_implementation="eager")
        torch.manual_seed(7)
        m = transformers.GPT2LMHeadModel(cfg).train()
        self.check_fn(m, lambda mod, i: mod(input_ids=i, use_cache=False, return_dict=False)[0],
                      (torch.randint(0, 100, (2, 8)),), seed=12)

    # transformers' GPT-2 reads a tensor value into Python on its way to the logits: train=True guards it
    # as inference does (test_value_reads_are_guarded).
    def test_hf_gpt2_tiny(self):
        cfg = transformers.GPT2Config(vocab_size=100, n_embd=32, n_layer=2, n_head=4, n_positions=16,
                                      resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
        torch.manual_seed(7)
        m = transformers.GPT2LMHeadModel(cfg).eval()
        self.check_fn(m, lambda mod, i: mod(input_ids=i, use_cache=False, return_dict=False)[0],
                      (torch.randint(0, 100, (2, 8)),))

    def test_hf_gpt2_loss_from_labels(self):
        # transformers' labels= loss reads another tensor value into Python: guarded too.
        cfg = transformers.GPT2Config(vocab_size=100, n_embd=32, n_layer=1, n_head=4, n_positions=16,
                                      resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
        torch.manual_seed(7)
        m = transformers.GPT2LMHeadModel(cfg).eval()
        self.check_fn(m, lambda mod, x: mod(input_ids=x, labels=x, use_cache=False, return_dict=False)[0],
                      (torch.randint(0, 100, (2, 8)),))


if __name__ == "__main__":
    unittest.main()
