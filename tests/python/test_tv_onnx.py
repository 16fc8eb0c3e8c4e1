"""torchvision classification models exported to ONNX by torch 1.13 (opset 17) run exactly on every tessel
backend and functional simulator, checked against torch eager (bench/tv_onnx.py runs every model; this is the
always-on subset: one of each kind of block, at a small input).

Run through ctest (python_frontend) or by hand:
    PYTHONPATH=build/python /usr/bin/python3 -m unittest tests/python/test_tv_onnx.py -v
"""
import os
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE_DIR = os.path.dirname(os.path.dirname(HERE))
TESSEL_BINARY = os.environ.get("TESSEL_BINARY", os.path.join(SOURCE_DIR, "build", "tessel"))
sys.path.insert(0, os.path.join(SOURCE_DIR, "bench"))

try:
    import torchvision  # noqa: F401 - python3-torchvision (./dev installs it)
    import tv_onnx
    HAVE_TORCHVISION = True
except ImportError:
    HAVE_TORCHVISION = False

# convnext_tiny: LayerNorm over channels-last between permutes, layer scale, a downsample conv of a
# transposed view (was wrong on compiled and the simulators); mobilenet_v3_small: depthwise convs,
# hardswish, squeeze-excitation; resnet18: residual adds, max pool; squeezenet1_1: concat of two
# branches, ceil-mode pooling.
MODELS = ["convnext_tiny", "mobilenet_v3_small", "resnet18", "squeezenet1_1"]
SIZE = 32
# The simulators with f32 storage (tv_onnx.f32_hw_file): exact, where DL16/bf16 storage on a deep random
# model is only as close as its rounding lets it be.
BACKENDS = ["eager", "graph", "compiled", "spyre:f32", "tpu-v5e:f32"]


@unittest.skipUnless(HAVE_TORCHVISION, "needs python3-torchvision")
@unittest.skipUnless(os.path.exists(TESSEL_BINARY), f"needs the tessel command ({TESSEL_BINARY}; set TESSEL_BINARY)")
@unittest.skipIf(os.environ.get("TESSEL_SANITIZED"), "whole models are too slow under the sanitizers")
class TorchvisionOnnx(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory(prefix="tessel_tv_onnx_")

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def test_exports_agree_with_torch_on_every_backend(self):
        for name in MODELS:
            folder, signal = tv_onnx.export(name, self.tmp.name, SIZE)
            self.assertGreater(signal, 1e-2, f"{name}: the output hardly depends on the input")
            for b in BACKENDS:
                with self.subTest(model=name, backend=b):
                    r = tv_onnx.run_tessel(TESSEL_BINARY, folder, b, timeout=300, hw_dir=self.tmp.name)
                    self.assertIsNotNone(r["rel"], r["error"])
                    self.assertTrue(r["ok"], f"{name} on {b}: relative error {r['rel']:.3g}")


if __name__ == "__main__":
    unittest.main()
