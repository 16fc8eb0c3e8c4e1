"""The aten -> tessel lowerings (python/tessel/aten_table.py), each against PyTorch eager on small tensors
with several attribute combinations: compiled through tessel.compile (graph backend: the lowering is
what is under test, not the code generator), no graph break, results within 1e-5 of eager."""
import math
import unittest

import torch
import torch.nn as nn
import torch.nn.functional as F

import tessel

torch.manual_seed(0)


def _flat(x):
    return list(x) if isinstance(x, (list, tuple)) else [x]


class Case(unittest.TestCase):
    backend = "graph"

    def check(self, fn, *inputs, tol=1e-5):
        """fn through tessel.compile equals fn in eager; no graph break (no aten fallback)."""
        with torch.no_grad():
            ref = fn(*inputs)
        fast = tessel.compile(fn, inputs, backend=self.backend, threads=1)
        self.assertEqual(fast.explanation.break_count, 0, str(fast.explanation))
        out = fast(*inputs)
        for o, r in zip(_flat(out), _flat(ref)):
            self.assertEqual(tuple(o.shape), tuple(r.shape))
            self.assertEqual(o.dtype, r.dtype)
            if r.numel() == 0:
                continue
            if r.is_floating_point():
                err = float((o.double() - r.double()).abs().max() / r.double().abs().max().clamp_min(1e-30))
                self.assertLessEqual(err, tol)
            else:
                self.assertTrue(torch.equal(o, r), f"{o} != {r}")


class Activations(Case):
    def test_hard_activations(self):
        x = torch.linspace(-5, 5, 64).reshape(4, 16)
        self.check(lambda x: F.hardswish(x) * 2 + F.hardsigmoid(x), x)
        self.check(lambda x: F.relu6(x) + F.hardtanh(x, -2, 3), x)

    def test_smooth_activations(self):
        x = torch.randn(3, 5, 7) * 4
        self.check(lambda x: F.mish(x) + F.silu(x), x)
        for beta, threshold in ((1, 20), (2, 5), (0.5, 1)):
            self.check(lambda x, b=beta, t=threshold: F.softplus(x * 10, b, t), x)
        self.check(lambda x: F.elu(x, 0.7) + F.selu(x) + F.celu(x, 1.3), x)
        self.check(lambda x: F.leaky_relu(x, 0.2) + F.logsigmoid(x * 20) + F.glu(x, -2)[..., :1].sum(), x[:, :4])
        self.check(lambda x: F.gelu(x) + F.gelu(x, approximate="tanh"), x)
        self.check(lambda x: F.threshold(x, 0.5, -1.0), x)

    def test_prelu(self):
        m = nn.PReLU(5).eval()
        with torch.no_grad():
            m.weight.uniform_(-1, 1)
        self.check(m, torch.randn(2, 5, 3, 3))

    def test_unary_math(self):
        x = torch.rand(4, 6) * 0.9 + 0.05
        self.check(lambda x: torch.log1p(x) + torch.expm1(x) + torch.log2(x) + torch.log10(x), x)
        self.check(lambda x: torch.asin(x) + torch.acos(x) + torch.atan(x) + torch.tan(x) + torch.sinh(x), x)
        y = torch.randn(4, 6) * 3
        self.check(lambda y: torch.trunc(y) + torch.frac(y) + torch.round(y) + torch.sgn(y), y)
        self.check(lambda y: torch.isnan(torch.log(y)) | torch.isinf(1 / (y - y)), y)


class Elementwise(Case):
    def test_division_modes(self):
        a, b = torch.randn(5, 6) * 10, torch.randn(5, 6) + 3
        self.check(lambda a, b: torch.div(a, b, rounding_mode="floor") + torch.div(a, b, rounding_mode="trunc"), a, b)
        self.check(lambda a, b: torch.remainder(a, b) + torch.fmod(a, b) + torch.remainder(a, 3.0), a, b)
        i, j = torch.randint(-20, 20, (5, 6)), torch.randint(1, 7, (5, 6))
        self.check(lambda i, j: torch.div(i, j, rounding_mode="floor") * 100 + torch.remainder(i, j) + i // 3, i, j)

    def test_logical_and_bitwise(self):
        a, b = torch.randn(4, 5) > 0, torch.randn(4, 5) > 0
        self.check(lambda a, b: torch.logical_and(a, b) ^ torch.logical_or(a, b) | torch.logical_xor(a, b), a, b)
        i, j = torch.randint(0, 64, (4, 5)), torch.randint(0, 64, (4, 5))
        self.check(lambda i, j: (i & j) + (i | j) * 3 + (i ^ j) * 7 + (i & 5), i, j)

    def test_pow_clamp_where_lerp(self):
        x, y = torch.rand(3, 4) + 0.5, torch.randn(3, 4)
        self.check(lambda x, y: x ** 3 + x ** 0.5 + 2.0 ** y + x ** y, x, y)
        self.check(lambda x, y: torch.clamp(y, min=x - 1, max=x) + torch.clamp_min(y, x) + torch.clamp_max(y, 0.3), x, y)
        self.check(lambda x, y: torch.where(y > 0, y, 0.0) + torch.where(y > 0, 1.0, y), x, y)
        self.check(lambda x, y: torch.lerp(x, y, 0.3) + torch.lerp(x, y, x) + torch.addcmul(x, x, y, value=0.5)
                   + torch.addcdiv(x, y, x, value=2), x, y)
        self.check(lambda x, y: torch.maximum(x, y) + torch.max(x, y) + torch.fmin(x, y), x, y)


class MatrixProducts(Case):
    def test_baddbmm_addmm_einsum(self):
        a, b, c = torch.randn(2, 3, 4), torch.randn(2, 4, 5), torch.randn(2, 3, 5)
        for beta, alpha in ((1, 1), (0.5, 2), (0, 1)):
            self.check(lambda a, b, c, be=beta, al=alpha: torch.baddbmm(c, a, b, beta=be, alpha=al), a, b, c)
        m, n, bias = torch.randn(3, 4), torch.randn(4, 5), torch.randn(5)
        self.check(lambda m, n, bias: torch.addmm(bias, m, n, beta=0.5, alpha=2) + torch.mv(m, n[:, 0]).sum(), m, n, bias)
        self.check(lambda a, b: torch.einsum("bij,bjk->bik", a, b) + torch.einsum("bij->bj", a).sum(), a, b)

    def test_transposed_convolution(self):
        for stride, pad, out_pad, groups in ((1, 0, 0, 1), (2, 1, 1, 1), (2, 1, 0, 2)):
            m = nn.ConvTranspose2d(4, 6, 3, stride, pad, out_pad, groups=groups).eval()
            self.check(m, torch.randn(1, 4, 5, 6))
        self.check(nn.ConvTranspose1d(3, 2, 4, 2, 1).eval(), torch.randn(1, 3, 7))


class Reductions(Case):
    def test_sum_mean_with_dims_and_dtypes(self):
        x = torch.randn(3, 4, 5)
        self.check(lambda x: x.sum((0, 2), keepdim=True) + x.mean(-1, keepdim=True).sum() + x.amax((1, 2)).sum(), x)
        self.check(lambda x: x.sum(dtype=torch.float64) + x.amin(), x)
        b = x > 0
        self.check(lambda b: b.sum(1) + b.any(1) + b.all(0).sum() + b.int().sum(), b)
        self.check(lambda x: x.prod(1).sum(-1, keepdim=True) + torch.logsumexp(x, 2), x)

    def test_arg_reductions(self):
        x = torch.randn(4, 7, 3)
        for dim, keep in ((None, False), (1, False), (-1, True)):
            self.check(lambda x, d=dim, k=keep: torch.argmax(x, d, k) * 10 + torch.argmin(x, d, k), x)
        self.check(lambda x: x.max(1), x)
        self.check(lambda x: x.min(2, keepdim=True)[0], x)

    def test_var_std(self):
        x = torch.randn(4, 6, 5)
        self.check(lambda x: x.var(1) + x.std(), x)
        self.check(lambda x: torch.var(x, (0, 2), correction=0, keepdim=True), x)
        self.check(lambda x: torch.std(x, 2, unbiased=False) + torch.var(x, -1, correction=2), x)
        self.check(lambda x: torch.var_mean(x, 1), x)
        self.check(lambda x: torch.std_mean(x, (1, 2), keepdim=True), x)

    def test_norms(self):
        x = torch.randn(3, 4, 5)
        for p in (2, 1, float("inf"), 3):
            self.check(lambda x, p=p: torch.norm(x, p, dim=-1) + x.norm(p, dim=(0, 2), keepdim=True).sum(), x)
        self.check(lambda x: F.normalize(x, dim=1), x)
        self.check(lambda x: torch.linalg.vector_norm(x, 2, (1,), dtype=torch.float64), x)

    def test_cumsum_topk_sort(self):
        x = torch.randn(3, 8)
        self.check(lambda x: x.cumsum(1) + x.cumsum(0) + torch.cumprod(x, 1), x)
        i = torch.randint(0, 5, (3, 8))
        self.check(lambda i: i.cumsum(-1) + (i > 2).cumsum(1), i)
        for k, largest in ((3, True), (2, False)):
            self.check(lambda x, k=k, largest=largest: torch.topk(x, k, 1, largest), x)
        self.check(lambda x: torch.sort(x, 1, descending=True)[0] + torch.sort(x, 0)[0], x)


class Normalization(Case):
    def test_group_norm(self):
        for groups, affine in ((2, True), (8, False), (1, True)):
            m = nn.GroupNorm(groups, 8, affine=affine).eval()
            if affine:
                with torch.no_grad():
                    m.weight.uniform_(0.5, 2)
                    m.bias.uniform_(-1, 1)
            self.check(m, torch.randn(2, 8, 3, 5))

    def test_batch_norm_without_affine_and_layer_norm(self):
        m = nn.BatchNorm2d(4, affine=False).eval()
        m.running_mean.uniform_(-1, 1)
        m.running_var.uniform_(0.5, 2)
        self.check(m, torch.randn(2, 4, 3, 3))
        self.check(nn.LayerNorm([3, 5], elementwise_affine=False).eval(), torch.randn(2, 3, 5))

    def test_eval_native_batch_norm_returned_whole(self):
        """Eval-mode native_batch_norm returned with its saved statistics (empty tensors in eval mode), with
        constant statistics (folded to a scale and shift) and with statistics given as inputs
        (BatchNormalization). It raised a TypeError (issue 41)."""
        rm, rv, w, b = torch.randn(4), torch.rand(4) + 0.5, torch.randn(4), torch.randn(4)
        x = torch.randn(2, 4, 3, 3)
        self.check(lambda x: torch.native_batch_norm(x, w, b, rm, rv, False, 0.1, 1e-5), x)
        self.check(lambda x, m, v: torch.native_batch_norm(x, w, b, m, v, False, 0.1, 1e-5), x, rm, rv)


    @unittest.skipUnless(hasattr(torch.ops.aten, "_safe_softmax"), "aten._safe_softmax is torch >= 2.5's")
    def test_safe_softmax_of_a_fully_masked_row(self):
        x = torch.randn(2, 3, 5)
        x[0, 1] = float("-inf")           # every score of one row masked: zeros, not softmax's NaNs
        x[1, 2, :2] = float("-inf")
        self.check(lambda x: torch.ops.aten._safe_softmax(x, -1), x)
        self.check(lambda x: torch.ops.aten._safe_softmax(x, 1), x)


class Losses(Case):
    def test_cross_entropy_and_nll_loss(self):
        x = torch.randn(6, 5)
        t = torch.tensor([0, 4, 2, -100, 1, 3])
        for red in ("mean", "sum", "none"):
            self.check(lambda a, b: F.cross_entropy(a, b, reduction=red), x, t)
            self.check(lambda a, b: F.nll_loss(F.log_softmax(a, -1), b, reduction=red, ignore_index=2), x, t.clamp(0))


class Shapes(Case):
    def test_pads(self):
        x = torch.randn(1, 2, 4, 5)
        for pad, value in (((1, 2), 0.0), ((1, 0, 2, 3), -1.5), ((0, 0, 0, 0, 1, 1), 2.0), ((-1, 1, 1, -1), 0.0)):
            self.check(lambda x, p=pad, v=value: F.pad(x, p, value=v), x)
        for mode in ("reflect", "replicate"):
            self.check(lambda x, m=mode: F.pad(x, (1, 2, 2, 1), mode=m), x)
            self.check(lambda x, m=mode: F.pad(x[0], (2, 1), mode=m), x)

    def test_roll_flip_repeat(self):
        x = torch.randn(2, 3, 5)
        for shifts, dims in ((1, 0), ((2, -1), (1, 2)), (-7, 2), (4, None)):
            self.check(lambda x, s=shifts, d=dims: torch.roll(x, s, d) if d is not None else torch.roll(x, s), x)
        for dims in ((0,), (1, 2), (-1,)):
            self.check(lambda x, d=dims: torch.flip(x, d), x)
        for reps in ((1, 1, 1), (2, 1, 3), (2, 1, 1, 2)):
            self.check(lambda x, r=reps: x.repeat(*r), x)

    def test_unbind_chunk_split_stack(self):
        x = torch.randn(4, 6, 3)
        self.check(lambda x: [t * (i + 1) for i, t in enumerate(x.unbind(1))], x)
        self.check(lambda x: torch.stack(x.unbind(0), 2), x)
        self.check(lambda x: [t.sum() for t in x.chunk(4, 1)], x)
        self.check(lambda x: [t + 1 for t in x.split([1, 2, 3], 1)], x)
        self.check(lambda x: list(torch.tensor_split(x, 3, dim=1)), x)

    def test_tril_triu_pixel_and_channel_shuffle(self):
        x = torch.randn(2, 5, 6)
        for k in (0, 1, -2):
            self.check(lambda x, k=k: torch.tril(x, k) + torch.triu(x, k) * 2, x)
        y = torch.randn(1, 8, 3, 4)
        self.check(lambda y: F.pixel_shuffle(y, 2), y)
        self.check(lambda y: F.pixel_unshuffle(y[:, :, :2], 2), y)
        self.check(lambda y: F.channel_shuffle(y, 4) if hasattr(F, "channel_shuffle") else y, y)
        self.check(nn.ChannelShuffle(2).eval(), y)

    def test_creation_ops(self):
        x = torch.randn(2, 3)
        self.check(lambda x: x + x.new_zeros(2, 3) + x.new_ones(3) + x.new_full((2, 1), 2.5), x)
        self.check(lambda x: x * torch.zeros_like(x) + torch.ones_like(x) + torch.full_like(x, 7.0), x)
        self.check(lambda x: x + torch.full((2, 3), 1.5) + torch.ones(3), x)

    def test_gather_scatter(self):
        x = torch.randn(3, 5)
        idx = torch.tensor([[0, 4, 2], [1, 1, 3], [4, 0, 0]])
        self.check(lambda x, i: torch.gather(x, 1, i), x, idx)
        self.check(lambda x, i: torch.gather(x, 0, i[:, :2] % 3), x, idx)
        perm = torch.tensor([[2, 0, 1, 3, 4], [4, 3, 1, 2, 0], [0, 1, 2, 3, 4]])
        self.check(lambda x, i: torch.scatter(x, 1, i, x * 2), x, perm)
        self.check(lambda x, i: torch.scatter_add(x, 1, i[:, :3], torch.ones(3, 3)), x, idx)
        self.check(lambda x, i: x.scatter(1, i[:, :2], 0.5), x, perm)
        # index_copy_ (transformers' static KV cache: the step's keys at cache_position along the length)
        cache, pos = torch.zeros(2, 3, 8, 4), torch.tensor([5, 2])
        self.check(lambda c, p, k: c.clone().index_copy_(2, p, k), cache, pos, torch.randn(2, 3, 2, 4))
        self.check(lambda c, p, k: torch.index_copy(c, -2, p, k), cache, pos, torch.randn(2, 3, 2, 4))
        self.check(lambda c, p, k: torch.index_copy(c, 0, p[1:], k), torch.randn(3, 4), pos, torch.randn(1, 4))

    def test_advanced_indexing(self):
        x = torch.randn(4, 5, 6)
        i, j = torch.tensor([0, 3, -1]), torch.tensor([[1], [4]])
        self.check(lambda x, i: x[i], x, i)
        self.check(lambda x, i, j: x[i, j], x, i, j)
        self.check(lambda x, i, j: x[:, i, j], x, i, j)
        self.check(lambda x, i, j: x[i, :, j], x, i, j)
        self.check(lambda x, i: x[:, :, i], x, i)
        self.check(lambda x, j: x[..., j.squeeze(1), j.squeeze(1)], x, j)


class Pooling(Case):
    def test_adaptive_pools_any_size(self):
        x = torch.randn(1, 3, 7, 10)
        for size in ((1, 1), (2, 5), (3, 4), (7, 10), (5, None), (14, 3)):
            self.check(lambda x, s=size: F.adaptive_avg_pool2d(x, s), x)
        for size in ((1, 1), (2, 5), (3, 4)):
            self.check(lambda x, s=size: F.adaptive_max_pool2d(x, s), x)
        self.check(lambda x: F.adaptive_avg_pool1d(x[0], 3) + F.adaptive_max_pool1d(x[0], 3), x)

    def test_avg_pool_variants(self):
        x = torch.randn(1, 2, 9, 8)
        for k, s, p, ceil, inc in ((3, 2, 1, True, True), (3, 2, 1, True, False), (2, 2, 0, True, True),
                                   (3, 1, 1, False, False), (3, 3, 0, True, True), (2, 3, 1, True, False)):
            self.check(lambda x, a=(k, s, p, ceil, inc): F.avg_pool2d(x, a[0], a[1], a[2], a[3], a[4]), x)
        self.check(lambda x: F.avg_pool2d(x, 2, divisor_override=3), x)
        self.check(lambda x: F.avg_pool1d(x[0], 3, 2, 1), x)

    def test_unread_indices_on_a_deep_graph(self):
        # Whether max pooling's indices are read is a liveness question; densenet121's functionalized
        # graph is thousands of nodes deep, and a recursive walk overflowed Python's stack there.
        def deep(x):
            y = F.max_pool2d(x, 2)
            for _ in range(1200):
                y = y * 0.999
            return y
        self.check(deep, torch.randn(1, 1, 4, 4))

    def test_max_pool_variants(self):
        x = torch.randn(1, 2, 9, 8)
        for k, s, p, d, ceil in ((3, 2, 1, 1, True), (2, 2, 0, 1, True), (3, 1, 1, 2, False), (3, 2, 1, 2, True)):
            self.check(lambda x, a=(k, s, p, d, ceil): F.max_pool2d(x, a[0], a[1], a[2], a[3], a[4]), x)
        self.check(lambda x: F.max_pool1d(x[0], 3, 2, 1), x)

    def test_upsampling(self):
        x = torch.randn(1, 2, 4, 5)
        for kw in (dict(scale_factor=2, mode="nearest"), dict(size=(7, 3), mode="nearest"),
                   dict(scale_factor=2, mode="bilinear"), dict(size=(9, 11), mode="bilinear"),
                   dict(size=(9, 11), mode="bilinear", align_corners=True), dict(scale_factor=1.5, mode="bilinear"),
                   dict(size=(1, 1), mode="bilinear"), dict(size=(3, 2), mode="bilinear"),
                   dict(scale_factor=2, mode="bicubic"), dict(size=(3, 9), mode="bicubic"),
                   dict(size=(6, 7), mode="nearest-exact")):
            self.check(lambda x, kw=kw: F.interpolate(x, **kw), x)
        self.check(lambda x: F.interpolate(x[0], scale_factor=2, mode="linear"), x)
        self.check(lambda x: F.interpolate(x[0], size=9, mode="nearest"), x)
        self.check(lambda x: F.interpolate(x[0], scale_factor=3, mode="nearest"), x)
        self.check(lambda x: F.interpolate(x[0], size=7, mode="linear", align_corners=True), x)


class Attention(Case):
    def test_native_multi_head_attention(self):
        # nn.MultiheadAttention's fast path in eval (torchvision's vit_b_16): aten._native_multi_head_attention
        for heads in (1, 4):
            m = nn.MultiheadAttention(16, heads, batch_first=True).eval()
            x = torch.randn(2, 5, 16)
            self.check(lambda x, m=m: m(x, x, x, need_weights=False)[0], x)

    def test_multi_head_attention_with_key_padding_mask(self):
        m = nn.MultiheadAttention(8, 2, batch_first=True).eval()
        x = torch.randn(2, 4, 8)
        mask = torch.tensor([[False, False, True, True], [False, False, False, True]])
        self.check(lambda x, mask: m(x, x, x, key_padding_mask=mask, need_weights=False)[0], x, mask)

    def test_transformer_encoder_layer(self):
        # torch 1.13's fast path in eval: aten._transformer_encoder_layer_fwd
        for norm_first, act in ((False, "relu"), (True, "gelu")):
            layer = nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, activation=act, batch_first=True,
                                               norm_first=norm_first).eval()
            self.check(layer, torch.randn(2, 5, 16))


if __name__ == "__main__":
    unittest.main()
