#!/usr/bin/python3
"""torchvision's video and segmentation models exported to ONNX for the paired harness (issue 42).

Each model (random weights, BatchNorm statistics calibrated on a random batch, eval mode, fixed seeds) is
exported by torch's exporter at opset 17 into OUT/NAME (model.onnx + test_data_set_0 with eager's output),
the layout bench/paired.py and every tessel command take. Segmentation models return a dict: the export
keeps its "out" entry (the auxiliary classifier is off).

    /usr/bin/python3 bench/export_tasks.py [NAME ...] [--out /tmp/tasks]
        video: r3d_18 mc3_18 r2plus1d_18 (1x3x8x112x112)
        segmentation: fcn_resnet50 deeplabv3_mobilenet_v3_large lraspp_mobilenet_v3_large (1x3x224x224)
        detection: ssdlite320_mobilenet_v3_large fasterrcnn_mobilenet_v3_large_320_fpn retinanet_resnet50_fpn
            (one 3xSxS image, S = --size, default 320; outputs boxes, scores, labels)

Detection models keep every detection above a score of 1e-4 (their thresholds lowered so that random
weights keep detections), and their heads get random weights (normal, std 0.05 or 0.005 where the features are large; biases std 0.5): with
torchvision's initialisation every class score of SSDlite is the same 1/91, so any order of the
detections would be right and none could be checked.
"""
import argparse
import os
import sys

import torch
import torchvision

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tv_onnx import export_model, write_tensor_proto  # noqa: E402

VIDEO = ("r3d_18", "mc3_18", "r2plus1d_18")
SEGMENTATION = ("fcn_resnet50", "deeplabv3_mobilenet_v3_large", "lraspp_mobilenet_v3_large")
DETECTION = ("ssdlite320_mobilenet_v3_large", "fasterrcnn_mobilenet_v3_large_320_fpn", "retinanet_resnet50_fpn")
# Detections kept per image. Random weights give many detections of nearly equal score: past rank ~45
# (Faster R-CNN) or ~180 (SSDlite) torch's own output changes when the input moves by one part in 10^6
# (a near tie at a top-k cut or an IoU threshold), so no f32 implementation can be held to it there.
DETECTIONS = 20


class Out(torch.nn.Module):
    """A segmentation model's "out" entry as the one output."""

    def __init__(self, m):
        super().__init__()
        self.m = m

    def forward(self, x):
        return self.m(x)["out"]


class Detections(torch.nn.Module):
    """A detection model on one image, its boxes, scores and labels as three outputs."""

    def __init__(self, m):
        super().__init__()
        self.m = m

    def forward(self, image):
        d = self.m([image])[0]
        return d["boxes"], d["scores"], d["labels"]


def build_detection(name, size, seed=0):
    torch.manual_seed(seed)
    kw = dict(weights=None, weights_backbone=None)
    if name.startswith("ssdlite"):
        kw.update(score_thresh=1e-4, detections_per_img=DETECTIONS)
    elif name.startswith("fasterrcnn"):
        kw.update(box_score_thresh=1e-4, min_size=size, max_size=size, box_detections_per_img=DETECTIONS)
    else:
        kw.update(score_thresh=1e-4, min_size=size, max_size=size, detections_per_img=DETECTIONS)
    m = getattr(torchvision.models.detection, name)(**kw)
    for b in m.modules():
        if isinstance(b, torch.nn.modules.batchnorm._BatchNorm):
            b.reset_running_stats()
            b.momentum = None
    torch.manual_seed(seed + 2)
    m.train()
    with torch.no_grad():
        m.backbone(torch.rand(2, 3, size, size))
    # (head, weight std): the FPN models' features are large, so their heads' weights are small enough
    # that sigmoids do not saturate and box deltas stay inside the image
    if name.startswith("ssdlite"):
        heads = [(m.head, 0.05)]
    elif name.startswith("retinanet"):
        heads = [(m.head, 0.005)]
    else:
        heads = [(m.rpn.head, 0.001), (m.roi_heads.box_predictor, 0.0002)]
    with torch.no_grad():
        for h, std in heads:
            for pname, p in h.named_parameters():
                p.normal_(0, 0.5 if pname.endswith("bias") else std)
    torch.manual_seed(seed + 1)
    return Detections(m.eval()).eval(), torch.rand(3, size, size)


def build(name, seed=0, size=320):
    if name in DETECTION:
        return build_detection(name, size, seed)
    torch.manual_seed(seed)
    if name in VIDEO:
        m = getattr(torchvision.models.video, name)()
        shape = (1, 3, 8, 112, 112)
    elif name in SEGMENTATION:
        kwargs = {"aux_loss": False} if name != "lraspp_mobilenet_v3_large" else {}
        m = getattr(torchvision.models.segmentation, name)(weights=None, weights_backbone=None, **kwargs)
        shape = (1, 3, 224, 224)
    else:
        raise SystemExit(f"{name}: not one of {', '.join(VIDEO + SEGMENTATION + DETECTION)}")
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
    ap.add_argument("--size", type=int, default=320, help="detection models' image size")
    a = ap.parse_args()
    for name in a.names or VIDEO + SEGMENTATION + DETECTION:
        m, x = build(name, size=a.size)
        folder = os.path.join(a.out, name)
        if name in DETECTION:
            export_detection(m, x, folder)
        else:
            export_model(m, x, folder)
        print(folder, flush=True)


def export_detection(m, x, folder):
    """Exports a Detections module at image x: model.onnx with outputs boxes, scores, labels, and
    test_data_set_0 with eager's three outputs."""
    os.makedirs(os.path.join(folder, "test_data_set_0"), exist_ok=True)
    with torch.no_grad():
        ys = m(x)
    torch.onnx.export(m, (x,), os.path.join(folder, "model.onnx"), opset_version=17, input_names=["image"],
                      output_names=["boxes", "scores", "labels"], do_constant_folding=True)
    write_tensor_proto(os.path.join(folder, "test_data_set_0", "input_0.pb"), x, "image")
    for i, (y, n) in enumerate(zip(ys, ("boxes", "scores", "labels"))):
        write_tensor_proto(os.path.join(folder, "test_data_set_0", f"output_{i}.pb"), y, n)
    return ys


if __name__ == "__main__":
    main()
