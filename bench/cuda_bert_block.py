#!/usr/bin/env python3
"""The bar model of issue 15 (docs/runtime/cuda-backend.md, docs/BENCHMARKS.md): bench/cuda_peer_block.py's
BERT-base pre-LN block (d=768, 12 heads, MLP 3072, erf GELU) at B=4, T=512, with the seeded weights of
its init_block (numpy PCG64: the same under any torch version), so tessel and the torch peers run the
same weights.

  cuda_bert_block.py export DIR   model.onnx through torch's TorchScript exporter (torch 1.13 here, opset
                                  17, f32 weights, 28 MB: not committed; bench/cuda_box_pack.sh makes it)
  cuda_bert_block.py data DIR     test_data_set_0/input_0.pb (block_input) and output_0.pb (torch f32 on
                                  the CPU); 12.6 MB, so the GPU box writes them itself (bench/tensor_pb.py: NumPy alone)
"""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cuda_peer_block import Block, block_input, init_block  # noqa: E402

B, T = 4, 512


def block():
    torch.manual_seed(0)
    return init_block(Block()).eval()


def export(folder):
    os.makedirs(folder, exist_ok=True)
    with torch.no_grad():
        torch.onnx.export(block(), (block_input(B, T),), os.path.join(folder, "model.onnx"), opset_version=17,
                          input_names=["x"], output_names=["y"], do_constant_folding=True)


def data(folder):
    import tensor_pb
    d = os.path.join(folder, "test_data_set_0")
    os.makedirs(d, exist_ok=True)
    torch.backends.cuda.matmul.allow_tf32 = False
    x = block_input(B, T)
    with torch.no_grad():
        y = block()(x)
    tensor_pb.write(os.path.join(d, "input_0.pb"), x.numpy(), "x")
    tensor_pb.write(os.path.join(d, "output_0.pb"), y.numpy(), "y")


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] not in ("export", "data"):
        sys.exit(__doc__)
    {"export": export, "data": data}[sys.argv[1]](sys.argv[2])
