#!/bin/bash
# Dynamic shapes on the GPU box in one device call (docs/dynamic-shapes.md, issue 34): builds the extension
# (python/box/cuda_env.sh over the carried .pybox) and runs, on torch 2.11 (CPU, THREADS threads):
#   tests/python/test_dynamo_dynamic.py;
#   bench/dynamic_shapes.py on MODELS (default Hugging Face BERT and GPT-2 configs and resnet18), with
#     --dynamo adding torch.compile(dynamic=True);
#   tests/python/test_dynamic_shapes.py;
#   bench/llm_generate.py (generate() on LLM_MODELS, default GPT-2, Llama and Qwen2 configs, through torch.compile; PROMPTS, NEW_TOKENS, CACHE);
#   static: the same with transformers' static cache, without Inductor (llm_generate_static.json);
#   dataflow: bench/dataflow_torch.py on DF_MODELS (torchvision) and DF_HF (transformers) for the dataflow
#     targets, through tessel.compile and torch.compile(options={"target": ...}) (issue 35).
#   cuda: generate() on CUDA (f32, then bf16) with the static cache (CUDA_CACHES, default static,dynamic:
#     the dynamic cache's decode graphs compile per shape on CUDA, then run in PyTorch), JSON
#     llm_generate_cuda_<cache>_<precision>.json;
#   profile: one generate() of GPT-2 under cProfile, tessel's and eager's (llm_profile.txt), and
#     bench/decode_step.py at THREADS threads and at 1 (where a decoded token's time goes);
#   staticstep: bench/static_cache_step.py (a static KV cache's decode step, written in place or copied);
#   export: tessel.export of the transformers models (DF_HF) into export.tgz, for the CLI here;
#   cpuprofile: torch.profiler's operator table of one generate() on the CPU (static cache, PROFILE_MODEL), for
#     tessel, eager and Inductor's two modes (llm_cpu_ops.txt: where Inductor's decoded token goes beside tessel's;
#     LLM_FLAGS=--tessel-default adds tessel's default mode);
#   cudaprofile: the same cProfile of PROFILE_MODEL (default GPT-2) on CUDA with the static cache (llm_cuda_profile.txt), and
#     torch.profiler's kernel table of one generate(), tessel's and eager's (llm_cuda_kernels.txt).
#   stepprofile: TESSEL_PROFILE's table of tessel's own steps in generate() of PROFILE_MODEL on the CPU (static cache, both
#     tessel modes, THREADS threads; llm_steps.txt: per step its median, library calls named with their oneDNN kernel).
# LLM_SIZE (tiny, the default: 128 wide, 2 layers; small: GPT-2 small's shape) for llm, static and cuda.
# STEPS (default dynamo,bench,tests,llm; static, dataflow, cuda, staticstep, export, profile, cpuprofile, cudaprofile and stepprofile when named) picks which run. Logs and JSON go to $OUT. From the checkout's root on the box:
#   bash python/box/dynamic.sh          (carry .pybox, made here by `bash python/box/pack.sh build`)
set -u
OUT=${OUT:-/tmp/dynamic}
mkdir -p "$OUT"
. python/box/cuda_env.sh
run_tests() {
  timeout "${TEST_TIMEOUT:-150}" $PY -m unittest tests/python/$1.py -v > "$OUT/$1.log" 2>&1
  echo "$1 rc=$?"
  grep -E " \.\.\. |^Ran |^OK|^FAILED|Error" "$OUT/$1.log" | cut -c1-300 | tail -30
}
STEPS=${STEPS:-dynamo,bench,tests,llm}     # which of the four run (a comma list)
step() { [[ ",$STEPS," == *",$1,"* ]]; }
step dynamo && for t in ${DYNAMO_TESTS:-test_dynamo_dynamic}; do run_tests $t; done   # (DYNAMO_TESTS: more test files)
step bench && {
timeout "${BENCH_TIMEOUT:-300}" $PY bench/dynamic_shapes.py --models "${MODELS:-bert,gpt2,resnet18}" \
  --threads "${THREADS:-8}" --shapes "${SHAPES:-20}" --rounds "${ROUNDS:-6}" --dynamo --json "$OUT/dynamic_shapes.json" \
  > "$OUT/bench.out" 2> "$OUT/bench.err"
echo "bench rc=$?"
cat "$OUT/bench.out"
grep -v -i warn "$OUT/bench.err" | cut -c1-300 | tail -15
grep -o "tessel: .*" "$OUT/bench.err" | cut -c1-400 | sort | uniq -c | head -12
}
step tests && run_tests test_dynamic_shapes
step llm && {
timeout "${LLM_TIMEOUT:-300}" $PY bench/llm_generate.py --models "${LLM_MODELS:-gpt2,llama,qwen2}" --threads "${THREADS:-8}" \
  --new-tokens "${NEW_TOKENS:-32}" --prompts "${PROMPTS:-2x7,3x12,1x20}" --rounds "${LLM_ROUNDS:-3}" --size "${LLM_SIZE:-tiny}" --cache "${CACHE:-dynamic}" \
  ${LLM_FLAGS:-} --json "$OUT/llm_generate.json" > "$OUT/llm.out" 2> "$OUT/llm.err"
echo "llm_generate rc=$?"
cat "$OUT/llm.out"
grep -v -i warn "$OUT/llm.err" | cut -c1-300 | tail -15
grep -o "tessel: .*" "$OUT/llm.err" | cut -c1-400 | sort | uniq -c | head -12     # tessel's warnings, once each
}
step static && {
timeout "${STATIC_TIMEOUT:-200}" $PY bench/llm_generate.py --models "${LLM_MODELS:-gpt2,llama,qwen2}" --threads "${THREADS:-8}" \
  --new-tokens "${NEW_TOKENS:-32}" --prompts "${PROMPTS:-2x7,3x12,1x20}" --rounds "${LLM_ROUNDS:-3}" --size "${LLM_SIZE:-tiny}" --cache static \
  --no-inductor --json "$OUT/llm_generate_static.json" > "$OUT/static.out" 2> "$OUT/static.err"
echo "llm_generate static rc=$?"
cat "$OUT/static.out"
grep -v -i warn "$OUT/static.err" | cut -c1-300 | tail -10
}
step cuda && {
CUDA_CACHES=${CUDA_CACHES:-static,dynamic}
for cache in ${CUDA_CACHES//,/ }; do
  for prec in ${CUDA_PRECISIONS:-f32 bf16}; do
    timeout "${CUDA_TIMEOUT:-200}" $PY bench/llm_generate.py --device cuda --precision $prec --models "${LLM_MODELS:-gpt2,llama,qwen2}" \
      --new-tokens "${NEW_TOKENS:-32}" --prompts "${PROMPTS:-2x7,3x12,1x20}" --rounds "${LLM_ROUNDS:-3}" --size "${LLM_SIZE:-tiny}" --cache $cache \
      ${CUDA_FLAGS:-} --json "$OUT/llm_generate_cuda_${cache}_$prec.json" > "$OUT/cuda_${cache}_$prec.out" 2> "$OUT/cuda_${cache}_$prec.err"
    echo "llm_generate cuda $cache $prec rc=$?"
    cat "$OUT/cuda_${cache}_$prec.out"
    grep -v -i warn "$OUT/cuda_${cache}_$prec.err" | cut -c1-300 | tail -8
    grep -o "tessel: .*" "$OUT/cuda_${cache}_$prec.err" | cut -c1-300 | sort | uniq -c | head -6
  done
done
}
step dataflow && {
timeout "${DF_TIMEOUT:-200}" $PY bench/dataflow_torch.py --models "${DF_MODELS:-resnet18}" --hf "${DF_HF:-bert,gpt2,llama}" \
  --dynamo --threads "${THREADS:-8}" --json "$OUT/dataflow_torch.json" > "$OUT/dataflow.out" 2> "$OUT/dataflow.err"
echo "dataflow_torch rc=$?"
cat "$OUT/dataflow.out"
grep -v -i warn "$OUT/dataflow.err" | cut -c1-300 | tail -10
}
step staticstep && {
timeout "${STEP_TIMEOUT:-150}" $PY bench/static_cache_step.py --cache-len 384 1024 4096 --tokens 64 --pairs 4 \
  --threads "${THREADS:-8}" --json "$OUT/static_cache_step.json" > "$OUT/staticstep.out" 2>&1
echo "static_cache_step rc=$?"; tail -5 "$OUT/staticstep.out"
}
step export && {
rm -rf "$OUT/export"
timeout "${EXPORT_TIMEOUT:-120}" $PY bench/dataflow_torch.py --models "" --hf "${DF_HF:-bert,gpt2,llama}" --export "$OUT/export" \
  --export-only --no-cli --json "$OUT/export.json" > "$OUT/export.out" 2> "$OUT/export.err"
echo "export rc=$?"
cat "$OUT/export.out"
grep -v -i warn "$OUT/export.err" | cut -c1-300 | tail -6
tar czf "$OUT/export.tgz" -C "$OUT" export && rm -rf "$OUT/export"   # one file back (the folders are too deep)
}
step profile && {
timeout "${PROFILE_TIMEOUT:-150}" $PY bench/llm_generate.py --models gpt2 --threads "${THREADS:-8}" --new-tokens 128 \
  --prompts 1x32,1x256 --rounds 3 --cache "${PROFILE_CACHE:-dynamic}" --no-inductor --profile "$OUT/llm_profile.txt" \
  --json "$OUT/llm_profile.json" > "$OUT/profile.out" 2> "$OUT/profile.err"
echo "llm_generate profile rc=$?"
cat "$OUT/profile.out"
grep -E "tottime|_tessel|tessel/|guard|generate|forward" "$OUT/llm_profile.txt" | head -60
# the C++ run's steps (TESSEL_PROFILE: each step's time per call), one round of the same generate()
TESSEL_PROFILE=1 timeout "${PROFILE_TIMEOUT:-150}" $PY bench/llm_generate.py --models gpt2 --threads "${THREADS:-8}" \
  --new-tokens 128 --prompts 1x256 --rounds 1 --cache "${PROFILE_CACHE:-dynamic}" --no-inductor > /dev/null 2> "$OUT/steps.err"
echo "TESSEL_PROFILE generate rc=$?"
$PY bench/profile_table.py --top 40 "$OUT/steps.err" > "$OUT/steps_table.txt" 2>&1; head -50 "$OUT/steps_table.txt"
[ "${DECODE_STEP:-1}" = 1 ] && for t in "${THREADS:-8}" 1; do
  timeout 120 $PY bench/decode_step.py --threads $t --pairs 3 --json "$OUT/decode_step_t$t.json" > "$OUT/decode_t$t.out" 2>&1
  echo "decode_step threads $t rc=$?"; tail -6 "$OUT/decode_t$t.out"
done
}
step cpuprofile && {
timeout "${PROFILE_TIMEOUT:-200}" $PY bench/llm_generate.py --models "${PROFILE_MODEL:-gpt2}" --threads "${THREADS:-8}" --new-tokens "${NEW_TOKENS:-64}" \
  --prompts "${PROMPTS:-1x32}" --rounds "${LLM_ROUNDS:-1}" --cache static --size "${LLM_SIZE:-tiny}" ${LLM_FLAGS:-} --device-profile "$OUT/llm_cpu_ops.txt" \
  --json "$OUT/llm_cpu_profile.json" > "$OUT/cpuprofile.out" 2> "$OUT/cpuprofile.err"
echo "llm_generate cpu profile rc=$?"
cat "$OUT/cpuprofile.out"
grep -v -i warn "$OUT/cpuprofile.err" | cut -c1-300 | tail -6
grep -A22 "^====" "$OUT/llm_cpu_ops.txt" | cut -c1-180
}
step cudaprofile && {
timeout "${PROFILE_TIMEOUT:-150}" $PY bench/llm_generate.py --device cuda --precision f32 --models "${PROFILE_MODEL:-gpt2}" --new-tokens "${NEW_TOKENS:-128}" \
  --prompts "${PROMPTS:-1x32,1x256}" --rounds "${LLM_ROUNDS:-3}" --cache static --no-inductor --profile "$OUT/llm_cuda_profile.txt" --device-profile "$OUT/llm_cuda_kernels.txt" --size "${LLM_SIZE:-tiny}" \
  --json "$OUT/llm_cuda_profile.json" > "$OUT/cudaprofile.out" 2> "$OUT/cudaprofile.err"
echo "llm_generate cuda profile rc=$?"
cat "$OUT/cudaprofile.out"
grep -v -i warn "$OUT/cudaprofile.err" | cut -c1-300 | tail -8
grep -A14 "^====" "$OUT/llm_cuda_kernels.txt" | cut -c1-200
}
step stepprofile && {
TESSEL_PROFILE=1 timeout "${PROFILE_TIMEOUT:-150}" $PY bench/llm_generate.py --models "${PROFILE_MODEL:-gpt2}" --threads "${THREADS:-8}" \
  --new-tokens "${NEW_TOKENS:-32}" --prompts "${PROMPTS:-1x32}" --rounds 1 --cache static --size "${LLM_SIZE:-tiny}" --tessel-default \
  --no-inductor > "$OUT/stepprofile.out" 2> /tmp/llm_steps_raw.txt
echo "llm_generate step profile rc=$?"
grep "decode tokens" "$OUT/stepprofile.out"
$PY bench/profile_table.py --top 40 /tmp/llm_steps_raw.txt | cut -c1-200 > "$OUT/llm_steps.txt"
head -45 "$OUT/llm_steps.txt"
rm -f /tmp/llm_steps_raw.txt
}
