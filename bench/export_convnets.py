#!/usr/bin/python3
"""Export convolution-heavy models to ONNX model folders for bench/convnets.py and bench/peers.py.

    /usr/bin/python3 bench/export_convnets.py OUT_DIR [--models resnet50,convnext_tiny,...]

Each model becomes OUT_DIR/NAME/model.onnx + test_data_set_0/{input_0,output_0}.pb (the ONNX model-zoo
layout of /work/shared/models), exported with the installed torch (Debian's 1.13: torch.onnx.export,
opset 17), random weights (seed 0), eval mode, input 1x3x224x224 (torchvision) or 1x80x3000 (the
Whisper-style encoder front: conv1d 80->384 k3, GELU, conv1d 384->384 k3 stride 2, GELU). The reference
output is torch's own. The .pb files are written by bench/tv_onnx.py's TensorProto writer, so the onnx python package
is not needed.
"""
import argparse
import os
import torch

from tv_onnx import write_tensor_proto   # the one hand-written TensorProto writer of bench/


class WhisperFront(torch.nn.Module):
    """The convolutional front of Whisper's audio encoder (tiny/base widths: 384 channels)."""

    def __init__(self, n_mels=80, width=384):
        super().__init__()
        self.conv1 = torch.nn.Conv1d(n_mels, width, kernel_size=3, padding=1)
        self.conv2 = torch.nn.Conv1d(width, width, kernel_size=3, stride=2, padding=1)

    def forward(self, x):
        x = torch.nn.functional.gelu(self.conv1(x))
        return torch.nn.functional.gelu(self.conv2(x))


def build(name):
    if name == "whisper_front":
        return WhisperFront(), torch.randn(1, 80, 3000)
    import torchvision
    return getattr(torchvision.models, name)(), torch.randn(1, 3, 224, 224)


def export(name, out_dir):
    torch.manual_seed(0)
    model, x = build(name)
    model.eval()
    folder = os.path.join(out_dir, name)
    os.makedirs(os.path.join(folder, "test_data_set_0"), exist_ok=True)
    with torch.no_grad():
        y = model(x)
        torch.onnx.export(model, (x,), os.path.join(folder, "model.onnx"), opset_version=17,
                          input_names=["input"], output_names=["output"])
    write_tensor_proto(os.path.join(folder, "test_data_set_0", "input_0.pb"), x, "input")
    write_tensor_proto(os.path.join(folder, "test_data_set_0", "output_0.pb"), y, "output")
    print(f"{name}: {folder} input {tuple(x.shape)} output {tuple(y.shape)}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out_dir")
    ap.add_argument("--models", default="resnet50,convnext_tiny,efficientnet_b0,mobilenet_v3_large,whisper_front")
    a = ap.parse_args()
    for name in a.models.split(","):
        export(name, a.out_dir)


if __name__ == "__main__":
    main()
