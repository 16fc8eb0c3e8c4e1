#!/bin/bash
# The CUDA target's size symbols on the GPU box in one device call (docs/dynamic-shapes.md, "On CUDA";
# issue 34): tessel_tests' CudaDynamic and CudaBackend tests (tessel_tests of a CUDA build, packed into
# .box15/common by bench/cuda_box_pack.sh), then, with the extension built over the carried .pybox
# (python/box/pack.sh), generate() on CUDA with transformers' dynamic KV cache (bench/llm_generate.py
# --device cuda --cache dynamic; LLM_MODELS, NEW_TOKENS, PROMPTS, LLM_ROUNDS, PRECISIONS default f32) and
# tests/python/test_cuda_target.py. Logs and JSON go to $OUT. From the checkout's root on the box, carrying
# .pybox and .box15/common:
#   bash python/box/cuda_dynamic.sh
set -u
OUT=${OUT:-/tmp/cuda_dynamic}
mkdir -p "$OUT"
BOX=.box15
W=/tmp/tessel_box
mkdir -p "$W/lib" "$W/bin" "$W/cache"
tar xJf "$BOX/common/libs.tar.xz" -C "$W/lib"
xz -dc "$BOX/common/tessel_tests.xz" > "$W/bin/tessel_tests" && chmod +x "$W/bin/tessel_tests"
CUDA_DIRS=""
[ -e /usr/local/cuda/lib64/libnvrtc.so.13 ] && CUDA_DIRS=":/usr/local/cuda/lib64"
sp=$(/opt/torch/.venv/bin/python3 -c 'import torch, os; print(os.path.dirname(os.path.dirname(torch.__file__)))' 2>/dev/null)
for d in "$sp"/nvidia/*/lib "$sp"/nvidia/cu13/lib; do [ -d "$d" ] && CUDA_DIRS="$CUDA_DIRS:$d"; done
# tessel_tests lists test data under the source folder it was built in: that path, on the box, is this checkout.
SRC=$(cat "$BOX/common/source_dir" 2>/dev/null)
if [ -n "$SRC" ] && [ ! -d "$SRC/tests" ]; then mkdir -p "$(dirname "$SRC")" && ln -sfn "$PWD" "$SRC"; fi
( export LD_LIBRARY_PATH="$W/lib${CUDA_DIRS}" TESSEL_CACHE_DIR=$W/cache
  timeout "${TEST_TIMEOUT:-120}" "$W/bin/tessel_tests" --gtest_filter="${FILTER:-CudaDynamic.*:CudaBackend.*}" > "$OUT/tests.log" 2>&1
  echo "tessel_tests rc=$?"
  grep -E "^\[  (FAILED|PASSED|SKIPPED) |FAILED|Failure|error|Expected|Which is|actual" "$OUT/tests.log" | cut -c1-300 | head -40 )
. python/box/cuda_env.sh
for prec in ${PRECISIONS:-f32}; do
  timeout "${LLM_TIMEOUT:-200}" $PY bench/llm_generate.py --device cuda --precision $prec --models "${LLM_MODELS:-gpt2,llama,qwen2}" \
    --new-tokens "${NEW_TOKENS:-32}" --prompts "${PROMPTS:-2x7,3x12,1x20}" --rounds "${LLM_ROUNDS:-2}" --cache dynamic \
    --json "$OUT/llm_cuda_dynamic_$prec.json" > "$OUT/cuda_dynamic_$prec.out" 2> "$OUT/cuda_dynamic_$prec.err"
  echo "llm_generate cuda dynamic $prec rc=$?"
  cat "$OUT/cuda_dynamic_$prec.out"
  grep -v -i warn "$OUT/cuda_dynamic_$prec.err" | cut -c1-300 | tail -12
  grep -o "tessel: .*" "$OUT/cuda_dynamic_$prec.err" | cut -c1-300 | sort | uniq -c | head -8
done
timeout "${PY_TIMEOUT:-150}" $PY -m unittest tests/python/test_cuda_target.py -v > "$OUT/test_cuda_target.log" 2>&1
echo "test_cuda_target rc=$?"
grep -E " \.\.\. |^Ran |^OK|^FAILED|Error|Traceback|line [0-9]+" "$OUT/test_cuda_target.log" | cut -c1-300 | tail -40
