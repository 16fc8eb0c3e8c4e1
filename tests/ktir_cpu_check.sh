#!/bin/sh
# ctest ktir_cpu_chain: every exported kernel run on ktir-cpu (torch-spyre's reference interpreter), chained from
# the models' real inputs and compared with tessel and the reference outputs (bench/ktir_check.py, docs/ktir.md).
# Skipped (exit 77) unless TESSEL_KTIR_CPU names a ktir-cpu checkout (CI has none; tessel never vendors it).
# Usage: ktir_cpu_check.sh SOURCE_DIR TESSEL_BINARY SHARED_DIR
src=$1 tessel=$2 shared=$3
if [ -z "${TESSEL_KTIR_CPU:-}" ] || [ ! -d "$TESSEL_KTIR_CPU/ktir_cpu" ]; then
  echo "skipped: set TESSEL_KTIR_CPU to a checkout of github.com/torch-spyre/ktir-cpu"
  exit 77
fi
# a Python with NumPy (ktir-cpu needs nothing else)
py=
for p in ${TESSEL_KTIR_PYTHON:-} /usr/bin/python3 python3; do
  if "$p" -c "import numpy" 2>/dev/null; then py=$p; break; fi
done
[ -n "$py" ] || { echo "skipped: no python3 with numpy"; exit 77; }
models="$src/examples/tblock_s $src/examples/vit_tiny $src/examples/llama_tiny $src/examples/ksplit_linear"
models="$models $src/examples/ksplit_uneven $src/examples/conv_kinds"
# the corpus models where the shared folder is present (mobilenet_v2's reference outputs, around 1e-9, are
# below f16's range: ktir_check.py's default --storage auto checks it with f32 storage on the same schedule)
for m in ffn_s attn_s tblock_bert bert_tiny gpt2_tiny nonzero_break mobilenet_v2; do
  [ -d "$shared/models/$m" ] && models="$models $shared/models/$m"
done
exec "$py" "$src/bench/ktir_check.py" --quiet --ktir-cpu "$TESSEL_KTIR_CPU" --tessel "$tessel" $models
