#!/bin/bash
# Dynamic shapes on the GPU box in one device call (docs/dynamic-shapes.md, issue 34): builds the extension
# (python/box/cuda_env.sh over the carried .pybox), runs tests/python/test_dynamo_dynamic.py and
# test_dynamic_shapes.py on torch 2.11, then bench/dynamic_shapes.py on Hugging Face BERT and GPT-2 configs,
# torch's encoder and resnet18 (CPU, THREADS threads; --dynamo adds torch.compile(dynamic=True)). Logs and
# JSON go to $OUT. From the checkout's root on the box:
#   bash python/box/dynamic.sh          (carry .pybox, made here by `bash python/box/pack.sh build`)
set -u
OUT=${OUT:-/tmp/dynamic}
mkdir -p "$OUT"
. python/box/cuda_env.sh
for t in test_dynamo_dynamic test_dynamic_shapes; do
  timeout "${TEST_TIMEOUT:-240}" $PY -m unittest tests/python/$t.py -v > "$OUT/$t.log" 2>&1
  echo "$t rc=$?"
  grep -E " \.\.\. |^Ran |^OK|^FAILED|Error" "$OUT/$t.log" | cut -c1-300 | tail -30
done
timeout "${BENCH_TIMEOUT:-360}" $PY bench/dynamic_shapes.py --models "${MODELS:-bert,gpt2,encoder,resnet18}" \
  --threads "${THREADS:-8}" --shapes "${SHAPES:-20}" --dynamo --json "$OUT/dynamic_shapes.json" > "$OUT/bench.out" 2> "$OUT/bench.err"
echo "bench rc=$?"
cat "$OUT/bench.out"
grep -v -i warn "$OUT/bench.err" | cut -c1-300 | tail -15
