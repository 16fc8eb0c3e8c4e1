"""One definition per figure (issue 38) on a model tessel's authors did not write: torchvision's resnet18
(random weights) exported with tessel.export, then the C++ check ReportFigures.* (tests/report_figures_test.cpp)
run on it: every kernel's intensity, achieved intensity, fusion saving, padding waste and scratchpad peak
recomputed from the tile IR equals what the sim table, the JSON, the HTML report and the landscape row show,
on spyre and tpu-v5e. The test binary sits beside the tessel command (build/tests/tessel_tests).
"""
import os
import shutil
import subprocess
import tempfile
import unittest

import torch

import tessel

try:
    import torchvision
except ImportError:  # pragma: no cover - ./dev installs python3-torchvision
    torchvision = None

TESSEL_BINARY = os.environ.get("TESSEL_BINARY", "")
TESTS_BINARY = os.path.join(os.path.dirname(TESSEL_BINARY), "tests", "tessel_tests") if TESSEL_BINARY else ""


@unittest.skipUnless(torchvision is not None, "needs torchvision")
@unittest.skipUnless(os.path.exists(TESTS_BINARY), f"needs the C++ test binary beside the tessel command ({TESTS_BINARY})")
class ReportFigures(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="tessel-figures-")

    def tearDown(self):
        shutil.rmtree(self.tmp, ignore_errors=True)

    def test_resnet18_figures_agree_in_every_view(self):
        torch.manual_seed(0)
        model = torchvision.models.resnet18().eval()
        folder = os.path.join(self.tmp, "resnet18")
        tessel.export(model, (torch.randn(1, 3, 224, 224),), folder)
        env = dict(os.environ, TESSEL_FIGURES_MODELS=folder)
        env.pop("LD_PRELOAD", None)  # (a sanitized binary links its own ASan runtime)
        r = subprocess.run([TESTS_BINARY, "--gtest_filter=ReportFigures.EveryViewShowsTheFiguresTheTileIrGives"],
                           env=env, capture_output=True, text=True, timeout=600)
        self.assertEqual(r.returncode, 0, r.stdout[-4000:] + r.stderr[-2000:])
        self.assertIn("1 test", r.stdout)
        self.assertIn("[  PASSED  ] 1 test", r.stdout)


if __name__ == "__main__":
    unittest.main()
