#!/bin/bash
# The PyTorch CUDA path on the GPU box in one device call (docs/python.md, "CUDA tensors"): builds the
# extension and puts the box's NVRTC and cuBLASLt on the library path (python/box/cuda_env.sh), runs
# tests/python/test_cuda_target.py and then bench/cuda_torch_models.py (skipped with BENCH=0). Logs and JSON
# go to $OUT (or /tmp/cuda_torch). From the checkout's root on the box:
#   bash python/box/cuda_torch.sh          (carry .pybox, made here by `bash python/box/pack.sh build`)
set -u
OUT=${OUT:-/tmp/cuda_torch}
mkdir -p "$OUT"
. python/box/cuda_env.sh   # the extension built, the box's CUDA libraries on the path
timeout "${TEST_TIMEOUT:-300}" $PY -m unittest tests/python/test_cuda_target.py -v > "$OUT/test_cuda_target.log" 2>&1
echo "test_cuda_target rc=$?"
grep -E " \.\.\. |^Ran |^OK|^FAILED|Error|rel err" "$OUT/test_cuda_target.log" | cut -c1-300 | tail -40
if [ "${BENCH:-1}" != 0 ]; then
  timeout "${BENCH_TIMEOUT:-420}" $PY bench/cuda_torch_models.py --json "$OUT/cuda_torch_models.json" \
    > "$OUT/bench.out" 2> "$OUT/bench.err"
  echo "bench rc=$?"
  grep -v -i warn "$OUT/bench.err" | cut -c1-400 | tail -25
fi
