#!/bin/bash
# torchvision resnet50 (batch 8, random weights) exported to ONNX on the GPU box by its torch 2.11, then
# `tessel bench --target cuda` at f32 and bf16: per-kernel CUDA-event times against their roofline and the
# output checked against PyTorch's (docs/BENCHMARKS.md, "Ninth session"). The model (98 MB of weights) is
# made on the box because it would not fit the device tool's carry. From the checkout's root on the box,
# after `bash bench/cuda_box_pack.sh REPO build` here and with .box15/common carried:
#   OUT=$OUT bash bench/cuda_resnet50_profile.sh
set -u
OUT=${OUT:-/tmp/r50_profile}
W=/tmp/tessel_box
M=/tmp/resnet50_b8
mkdir -p "$OUT" "$W/lib" "$W/bin" "$M/test_data_set_0"
tar xJf .box15/common/libs.tar.xz -C "$W/lib"
xz -dc .box15/common/tessel.xz > "$W/bin/tessel" && chmod +x "$W/bin/tessel"
PY=${PY:-/opt/torch/.venv/bin/python3}
SP=$($PY -c 'import torch, os; print(os.path.dirname(os.path.dirname(torch.__file__)))')
L=""
for d in /usr/local/cuda/lib64 "$SP"/nvidia/*/lib "$SP"/nvidia/cu13/lib; do [ -d "$d" ] && L="$L:$d"; done
export LD_LIBRARY_PATH="$W/lib$L" TESSEL_CACHE_DIR=${TESSEL_CACHE_DIR:-$W/cache}
$PY - "$M" <<'PYEOF'
import sys
import torch
import torchvision
sys.path.insert(0, "bench")
import tensor_pb
out = sys.argv[1]
torch.manual_seed(0)
m = torchvision.models.resnet50().eval()
x = torch.randn(8, 3, 224, 224)
torch.onnx.export(m, x, f"{out}/model.onnx", dynamo=False, opset_version=17, input_names=["x"])
tensor_pb.write(f"{out}/test_data_set_0/input_0.pb", x.numpy(), "x")
with torch.no_grad():
    tensor_pb.write(f"{out}/test_data_set_0/output_0.pb", m(x).numpy(), "y")
PYEOF
for p in f32 bf16; do
  "$W/bin/tessel" bench "$M" --target cuda --precision $p --json "$OUT/resnet50_$p.json" > "$OUT/resnet50_$p.txt" 2>&1
  echo "$p rc=$?"
  head -12 "$OUT/resnet50_$p.txt"
done
