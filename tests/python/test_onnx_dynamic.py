"""ONNX models with dim_param inputs compile once for every size (docs/dynamic-shapes.md): torch's encoder
layer (dynamic batch and sequence), the same under a causal mask built from the input's length, and
torchvision's mobilenet_v2 and resnet18 (dynamic batch), exported by torch 1.13, each run by
`tessel run --dynamic` on three data sets of different sizes: one compilation, every output within the
check's bound of torch's (bench/onnx_dynamic.py, which also times them against static compilations).

    PYTHONPATH=build/python /usr/bin/python3 -m unittest tests/python/test_onnx_dynamic.py -v
"""
import json
import os
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE_DIR = os.path.dirname(os.path.dirname(HERE))
TESSEL_BINARY = os.environ.get("TESSEL_BINARY", os.path.join(SOURCE_DIR, "build", "tessel"))
sys.path.insert(0, os.path.join(SOURCE_DIR, "bench"))

try:
    import torchvision  # noqa: F401 - python3-torchvision (./dev installs it)
    import onnx_dynamic
    HAVE_TORCHVISION = True
except ImportError:
    HAVE_TORCHVISION = False


@unittest.skipUnless(HAVE_TORCHVISION, "needs python3-torchvision")
@unittest.skipUnless(os.path.exists(TESSEL_BINARY), f"needs the tessel command ({TESSEL_BINARY}; set TESSEL_BINARY)")
@unittest.skipIf(os.environ.get("TESSEL_SANITIZED"), "whole models are too slow under the sanitizers")
class OnnxDynamic(unittest.TestCase):
    def test_one_compilation_runs_three_sizes(self):
        with tempfile.TemporaryDirectory(prefix="tessel_onnx_dynamic_") as tmp:
            for name in ("encoder_layer", "causal_block", "mobilenet_v2", "resnet18"):
                with self.subTest(model=name):
                    model, sets = onnx_dynamic.export(name, tmp)
                    r = onnx_dynamic.run_dynamic(TESSEL_BINARY, model, sets, threads=2, repeat=1)
                    self.assertTrue(r["ok"], f"{name}: {r['error']}")
                    self.assertEqual(r["compilations"], 1, name)
                    self.assertEqual(r["checks"], ["PASS"] * 3, name)

    def test_buckets_on_spyre(self):
        # The encoder layer at lengths 50, 100 and 200 on the Spyre-like preset, padded to buckets 64, 128 and
        # 256: one compilation per bucket, each length's functional run against eager, the padding reported.
        with tempfile.TemporaryDirectory(prefix="tessel_onnx_dynamic_") as tmp:
            model, sets = onnx_dynamic.export("encoder_layer_seq", tmp)
            out = os.path.join(tmp, "buckets.json")
            p = subprocess.run([TESSEL_BINARY, "sim", model, "--hw", "spyre", "--buckets", "64,128,256", "--inputs",
                                ",".join(sets), "--cpu", "--threads", "2", "--json", out], capture_output=True, text=True,
                               timeout=600)
            self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
            with open(out) as f:
                r = json.load(f)
            self.assertEqual(r["compilations"], 3)
            self.assertEqual([w["bucket"] for w in r["rows"]], [64, 128, 256])
            for w in r["rows"]:
                self.assertTrue(w["ok"], w)
                self.assertAlmostEqual(w["pad_fraction"], (w["bucket"] - w["length"]) / w["bucket"])
                self.assertGreater(w["flops_padded"], w["flops"])
                self.assertGreater(w["masks"], 0)
                # --cpu: the same lengths by one symbolic CPU compilation and by each bucket's (both checked)
                self.assertGreater(w["cpu_symbolic_ms"], 0)
                self.assertGreater(w["cpu_bucket_ms"], 0)

    def test_a_size_outside_the_compiled_facts_is_refused(self):
        # A data set whose static dim differs from the model's: a one-line guard error, not a run.
        with tempfile.TemporaryDirectory(prefix="tessel_onnx_dynamic_") as tmp:
            model, sets = onnx_dynamic.export("encoder_layer", tmp)
            bad = os.path.join(tmp, "bad")
            os.makedirs(bad)
            import numpy as np
            onnx_dynamic.tensor_pb.write(os.path.join(bad, "input_0.pb"), np.zeros((1, 5, 32), np.float32), "x")
            r = onnx_dynamic.run_dynamic(TESSEL_BINARY, model, [sets[0], bad], threads=2, repeat=1)
            self.assertFalse(r["ok"])
            self.assertIn("dim 2 is 32, the model takes 64", r["error"])


if __name__ == "__main__":
    unittest.main()
