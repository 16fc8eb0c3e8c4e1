"""Fusion of a model with repeated refinement steps (issue 42): torchvision's RAFT (raft_small, random
weights) exported by torch.onnx at 4, 8 and 16 flow updates, then `tessel compile --emit fusion`. Fusing
it took 28.5 s at 4 updates and more than 30 minutes at 12 (the vertical merges' reachability walks,
rescanned from the first group after each merge); each compile here runs under a timeout that the old
fuser could not meet at 16 updates, and the kernels grow by the same number per update (the fused
module has one more copy of the update block per step, not a different fusion at larger sizes).
"""
import os
import re
import shutil
import subprocess
import tempfile
import unittest
import warnings

import torch

try:
    import torchvision
    from torchvision.models.optical_flow import raft_small
except ImportError:  # pragma: no cover - ./dev installs python3-torchvision
    torchvision = None

TESSEL_BINARY = os.environ.get("TESSEL_BINARY", "")


class Updates(torch.nn.Module):
    def __init__(self, model, updates):
        super().__init__()
        self.model, self.updates = model, updates

    def forward(self, a, b):
        return self.model(a, b, num_flow_updates=self.updates)[-1]


@unittest.skipUnless(torchvision is not None, "needs torchvision")
@unittest.skipIf(os.environ.get("TESSEL_SANITIZED"), "the timeout is an optimized build's (the sanitized suite runs "
                 "the fuser on every other model)")
@unittest.skipUnless(os.path.exists(TESSEL_BINARY), f"needs the tessel command ({TESSEL_BINARY}; set TESSEL_BINARY)")
class FuseScaling(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="tessel-raft-")

    def tearDown(self):
        shutil.rmtree(self.tmp, ignore_errors=True)

    def kernels(self, model, updates):
        path = os.path.join(self.tmp, f"raft{updates}.onnx")
        a, b = torch.randn(1, 3, 128, 128), torch.randn(1, 3, 128, 128)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.onnx.export(Updates(model, updates), (a, b), path, opset_version=17)
        r = subprocess.run([TESSEL_BINARY, "compile", path, "--emit", "fusion"], capture_output=True, text=True,
                           timeout=300)
        self.assertEqual(r.returncode, 0, r.stdout[-2000:] + r.stderr[-2000:])
        self.assertRegex(r.stdout, r"\ntotal +\d+ +\d+ +\d+")
        return len(re.findall(r"^k\d+ ", r.stdout, re.M))

    def test_raft_updates_fuse_in_linear_size(self):
        torch.manual_seed(0)
        model = raft_small().eval()
        k4, k8, k16 = (self.kernels(model, n) for n in (4, 8, 16))
        per_update = (k8 - k4) / 4
        self.assertGreater(per_update, 1)
        self.assertEqual(k16 - k8, 8 * per_update, (k4, k8, k16))


if __name__ == "__main__":
    unittest.main()
