#!/usr/bin/python3
"""torchvision's video and segmentation models exported to ONNX for the paired harness (issue 42).

Each model (random weights, BatchNorm statistics calibrated on a random batch, eval mode, fixed seeds) is
exported by torch's exporter at opset 17 into OUT/NAME (model.onnx + test_data_set_0 with eager's output),
the layout bench/paired.py and every tessel command take. Segmentation models return a dict: the export
keeps its "out" entry (the auxiliary classifier is off).

    /usr/bin/python3 bench/export_tasks.py [NAME ...] [--out /tmp/tasks]
        video: r3d_18 mc3_18 r2plus1d_18 (1x3x8x112x112)
        segmentation: fcn_resnet50 deeplabv3_mobilenet_v3_large lraspp_mobilenet_v3_large (1x3x224x224)
"""
import argparse
import os
import sys

import torch
import torchvision

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tv_onnx import export_model  # noqa: E402

VIDEO = ("r3d_18", "mc3_18", "r2plus1d_18")
SEGMENTATION = ("fcn_resnet50", "deeplabv3_mobilenet_v3_large", "lraspp_mobilenet_v3_large")


class Out(torch.nn.Module):
    """A segmentation model's "out" entry as the one output."""

    def __init__(self, m):
        super().__init__()
        self.m = m

    def forward(self, x):
        return self.m(x)["out"]


def build(name, seed=0):
    torch.manual_seed(seed)
    if name in VIDEO:
        m = getattr(torchvision.models.video, name)()
        shape = (1, 3, 8, 112, 112)
    elif name in SEGMENTATION:
        kwargs = {"aux_loss": False} if name != "lraspp_mobilenet_v3_large" else {}
        m = getattr(torchvision.models.segmentation, name)(weights=None, weights_backbone=None, **kwargs)
        shape = (1, 3, 224, 224)
    else:
        raise SystemExit(f"{name}: not one of {', '.join(VIDEO + SEGMENTATION)}")
    bns = [b for b in m.modules() if isinstance(b, torch.nn.modules.batchnorm._BatchNorm)]
    for b in bns:
        b.reset_running_stats()
        b.momentum = None
    torch.manual_seed(seed + 2)
    m.train()
    with torch.no_grad():
        m(torch.randn(2, *shape[1:]))
    m.eval()
    if name in SEGMENTATION:
        m = Out(m).eval()
    torch.manual_seed(seed + 1)
    return m, torch.randn(*shape)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("names", nargs="*")
    ap.add_argument("--out", default="/tmp/tasks")
    a = ap.parse_args()
    for name in a.names or VIDEO + SEGMENTATION:
        m, x = build(name)
        folder = os.path.join(a.out, name)
        export_model(m, x, folder)
        print(folder, flush=True)


if __name__ == "__main__":
    main()
