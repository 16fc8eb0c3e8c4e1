"""torchvision classification models (random weights, small inputs or small configs of the same classes)
through tessel.compile, against PyTorch eager: within 1e-4 relative and no aten fallback.

The models are unmodified: their in-place ops (relu_, `out += identity`, swin's attention-mask writes)
go through functionalization (docs/python.md), so every model must be one graph with no break at all.
The graph backend
runs the partitions (the lowering is under test, not the code generator; the ONNX tests cover the
compiled backend on the same models). The whole set is a few seconds; skipped in the sanitized build
(TESSEL_SANITIZED), where the same Python runs uninstrumented and only the extension is slower.
bench/zoo.py runs every torchvision classification model at full size.
"""
import os
import unittest

import torch

import tessel

try:
    import torchvision
    import torchvision.models as M
except ImportError:  # pragma: no cover - ./dev installs python3-torchvision
    torchvision = None

SANITIZED = bool(os.environ.get("TESSEL_SANITIZED"))


def _no_zero_weights(model):
    """Random weights where the builder zeroes a layer (vit's head): an all-zero output compares
    equal to anything."""
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() >= 2 and not p.any():
                p.normal_(0, 0.02)
    return model


def _small_vit():
    from torchvision.models.vision_transformer import VisionTransformer
    return VisionTransformer(image_size=32, patch_size=8, num_layers=2, num_heads=2, hidden_dim=32, mlp_dim=64,
                             num_classes=10), 32


def _small_swin():
    # roll, constant_pad_nd, and an attention mask written in place into new_zeros (the write that
    # was once dropped silently: rel err 3e-2)
    from torchvision.models.swin_transformer import SwinTransformer
    return SwinTransformer(patch_size=[4, 4], embed_dim=16, depths=[2, 2], num_heads=[2, 2], window_size=[4, 4],
                           stochastic_depth_prob=0.0, num_classes=10), 64


def _small_maxvit():
    from torchvision.models.maxvit import MaxVit
    return MaxVit(input_size=(32, 32), stem_channels=8, partition_size=2, block_channels=[8, 16], block_layers=[1, 1],
                  head_dim=4, stochastic_depth_prob=0.0, num_classes=10), 32


# name -> builder returning (model, input resolution); full torchvision builders at 64x64 where the
# model allows it, small configs of the same classes where the full one needs 224.
MODELS = {
    "resnet18": lambda: (M.resnet18(), 64),
    "mobilenet_v3_small": lambda: (M.mobilenet_v3_small(), 64),      # hardswish, hardsigmoid, SE blocks
    "efficientnet_b0": lambda: (M.efficientnet_b0(), 64),            # silu, sigmoid gating
    "squeezenet1_1": lambda: (M.squeezenet1_1(), 64),                # ceil_mode max pooling
    "shufflenet_v2_x0_5": lambda: (M.shufflenet_v2_x0_5(), 64),      # chunk + channel shuffle
    "regnet_y_400mf": lambda: (M.regnet_y_400mf(), 64),
    "googlenet": lambda: (M.googlenet(aux_logits=False, init_weights=False), 64),
    "alexnet": lambda: (M.alexnet(), 64),                            # adaptive avg pool 1x1 -> 6x6
    "mnasnet0_5": lambda: (M.mnasnet0_5(), 64),
    "vit": _small_vit,                                               # _native_multi_head_attention
    "maxvit": _small_maxvit,
    "swin": _small_swin,
}


@unittest.skipIf(torchvision is None, "torchvision is not installed")
@unittest.skipIf(SANITIZED, "the model zoo is slow in the sanitized build and tests no sanitized code of its own")
class TorchvisionModels(unittest.TestCase):
    def check_model(self, name):
        torch.manual_seed(0)
        model, res = MODELS[name]()
        model = _no_zero_weights(model.eval())
        x = torch.randn(1, 3, res, res)
        with torch.no_grad():
            ref = model(x)
        fast = tessel.compile(model, (x,), backend="graph", threads=2)
        out = fast(x)
        breaks = [b["op"] for b in fast.explanation.breaks]
        self.assertEqual(breaks, [], f"{name}: graph breaks\n{fast.explanation}")
        err = float((out - ref).abs().max() / ref.abs().max())
        self.assertLessEqual(err, 1e-4, f"{name}: rel err {err:.2e}")


for _name in MODELS:
    setattr(TorchvisionModels, f"test_{_name}", lambda self, n=_name: self.check_model(n))


@unittest.skipIf(torchvision is None, "torchvision is not installed")
@unittest.skipIf(SANITIZED, "the model zoo is slow in the sanitized build and tests no sanitized code of its own")
class TorchvisionVideoModels(unittest.TestCase):
    """torchvision's video classifiers (Conv3d: oneDNN's 3-d convolution for constant weights, issue 42) at
    1x3x4x32x32, on the graph backend and r3d_18 on the compiled backend too."""

    def check(self, name, backend):
        torch.manual_seed(0)
        model = getattr(torchvision.models.video, name)().eval()
        x = torch.randn(1, 3, 4, 32, 32)
        with torch.no_grad():
            ref = model(x)
        fast = tessel.compile(model, (x,), backend=backend, threads=2)
        err = float((fast(x) - ref).abs().max() / ref.abs().max())
        self.assertLessEqual(err, 1e-4, f"{name} on {backend}: rel err {err:.2e}")

    def test_video_models_on_the_graph_backend(self):
        for name in ("r3d_18", "mc3_18", "r2plus1d_18"):
            self.check(name, "graph")

    def test_r3d_18_compiled(self):
        self.check("r3d_18", "compiled")


@unittest.skipIf(torchvision is None, "torchvision is not installed")
class Locations(unittest.TestCase):
    def test_nodes_point_at_torchvision_source(self):
        """A node's source line is torchvision's (models/resnet.py), not the caller's: torchvision's files
        start with torch's folder name, which made them count as torch (issue 38)."""
        torch.manual_seed(0)
        model = M.resnet18().eval()
        text = str(tessel.explain(model, (torch.randn(1, 3, 32, 32),)))
        self.assertIn("resnet.py:", text)
        self.assertNotIn("test_torchvision_models.py", text)


if __name__ == "__main__":
    unittest.main()
