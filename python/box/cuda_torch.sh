#!/bin/bash
# The PyTorch CUDA path on the GPU box in one device call (docs/python.md, "CUDA tensors"): builds the
# extension (python/box/build_ext.sh over the carried .pybox of a CUDA build), puts the box's NVRTC and
# cuBLASLt on the library path (the toolkit's, else PyTorch's nvidia/*/lib, as bench/cuda_box.sh does), runs
# tests/python/test_cuda_target.py and then bench/cuda_torch_models.py (skipped with BENCH=0). Logs and JSON
# go to $OUT (or /tmp/cuda_torch). From the checkout's root on the box:
#   bash python/box/cuda_torch.sh          (carry .pybox, made here by `bash python/box/pack.sh build`)
set -u
OUT=${OUT:-/tmp/cuda_torch}
mkdir -p "$OUT"
export PY=${PY:-/opt/torch/.venv/bin/python3}
bash python/box/build_ext.sh > "$OUT/build_ext.log" 2>&1 || { tail -30 "$OUT/build_ext.log"; exit 1; }
export PYTHONPATH=$PWD/.pybox/pkg TESSEL_CACHE_DIR=${TESSEL_CACHE_DIR:-/tmp/tessel_cache} PYTHONUNBUFFERED=1
SP=$($PY -c 'import torch, os; print(os.path.dirname(os.path.dirname(torch.__file__)))')
L=""
for d in /usr/local/cuda/lib64 "$SP"/nvidia/*/lib "$SP"/nvidia/cu13/lib; do [ -d "$d" ] && L="$L:$d"; done
export LD_LIBRARY_PATH="${L#:}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
timeout "${TEST_TIMEOUT:-300}" $PY -m unittest tests/python/test_cuda_target.py -v > "$OUT/test_cuda_target.log" 2>&1
echo "test_cuda_target rc=$?"
grep -E " \.\.\. |^Ran |^OK|^FAILED|Error|rel err" "$OUT/test_cuda_target.log" | cut -c1-300 | tail -40
if [ "${BENCH:-1}" != 0 ]; then
  timeout "${BENCH_TIMEOUT:-420}" $PY bench/cuda_torch_models.py --json "$OUT/cuda_torch_models.json" \
    > "$OUT/bench.out" 2> "$OUT/bench.err"
  echo "bench rc=$?"
  grep -v -i warn "$OUT/bench.err" | cut -c1-400 | tail -25
fi
