#!/bin/bash
# The CUDA target on the GPU box, in one device call (docs/runtime/cuda-backend.md, docs/BENCHMARKS.md):
# checks the machine (nvidia-smi, every library resolves), runs the CUDA tests of tessel_tests on the
# models present (f32 and bf16), `tessel bench --target cuda` on each at f32 and at --precision bf16, the
# PyTorch peers (bench/cuda_peer_block.py) when tblock_bert or the bar model (bert_block_b4t512, whose
# test_data_set_0 is written here by bench/cuda_bert_block.py) is present, and prints a table last.
# Logs and JSON go to $OUT (or /tmp/cuda_box).
# Packed here by bench/cuda_box_pack.sh; run from the checkout's root on the box:
#   bash .box15/common/cuda_box.sh          (models: .box15/m*/ and examples/tblock_s)
set -u
BOX=${BOX:-.box15}
OUT=${OUT:-/tmp/cuda_box}
W=/tmp/tessel_box
mkdir -p "$OUT" "$W/lib" "$W/bin" "$W/models" "$W/cache"
tar xJf "$BOX/common/libs.tar.xz" -C "$W/lib"
for b in tessel tessel_tests; do xz -dc "$BOX/common/$b.xz" > "$W/bin/$b" && chmod +x "$W/bin/$b"; done
# The box's own CUDA 13 libraries (NVRTC, cuBLASLt; the runtime is linked statically): the toolkit's,
# else the ones PyTorch's wheels carry.
CUDA_DIRS=""
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib; do
  [ -e "$d/libnvrtc.so.13" ] && CUDA_DIRS="$CUDA_DIRS:$d"
done
for py in /opt/torch/.venv/bin/python3 python3; do
  sp=$($py -c 'import torch, os; print(os.path.dirname(os.path.dirname(torch.__file__)))' 2>/dev/null) || continue
  for d in "$sp"/nvidia/*/lib "$sp"/nvidia/cu13/lib; do [ -d "$d" ] && CUDA_DIRS="$CUDA_DIRS:$d"; done
  break
done
export LD_LIBRARY_PATH="$W/lib${CUDA_DIRS}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export TESSEL_SHARED=$W TESSEL_CACHE_DIR=$W/cache
# tessel_tests lists test data under the source folder it was built in: that path, on the box, is this checkout.
SRC=$(cat "$BOX/common/source_dir" 2>/dev/null)
if [ -n "$SRC" ] && [ ! -d "$SRC/tests" ]; then mkdir -p "$(dirname "$SRC")" && ln -sfn "$PWD" "$SRC"; fi
{
  echo "== $(date -u)"; nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv
  echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
  ldd "$W/bin/tessel" | grep -E "not found|nvrtc|cublas|dnnl" || true
} 2>&1 | tee "$OUT/machine.txt"
PY=/opt/torch/.venv/bin/python3; [ -x $PY ] || PY=python3
MODELS=""
for d in "$BOX"/m*/* examples/tblock_s; do
  [ -f "$d/model.onnx" ] || continue
  n=$(basename "$d")
  if [ -d "$d/test_data_set_0" ]; then ln -sfn "$(cd "$d" && pwd)" "$W/models/$n"
  else  # the bar model: its data set (torch f32 on the CPU) is written here
    mkdir -p "$W/models/$n" && ln -sfn "$(cd "$d" && pwd)/model.onnx" "$W/models/$n/model.onnx"
    $PY "$BOX/common/cuda_bert_block.py" data "$W/models/$n" || echo "could not write $n's data set"
  fi
  MODELS="$MODELS $n"
done
echo "models:$MODELS"
# The corpus tests of the models present (the others are not here), and the device-free ones.
FILTER="CudaCodegen.*:CudaToolchain.*:CudaBackend.*:CudaBf16.*:CudaAttention.*:CudaEpilogue.*"
for n in $MODELS; do FILTER="$FILTER:Models/CudaCorpus.*/$n:Models/CudaCorpusBf16.*/$n"; done
set -o pipefail
"$W/bin/tessel_tests" --gtest_filter="$FILTER" 2>&1 | tee "$OUT/tests.log" | grep -E "^\[  (FAILED|PASSED|SKIPPED) |OK \]|FAILED|Failure|error" | tail -40
TESTS_RC=$?
for n in $MODELS; do
  for p in f32 bf16; do
    "$W/bin/tessel" bench "$W/models/$n" --target cuda --precision $p --iters 50 --json "$W/bench_${n}_$p.json" 2>&1 | tee -a "$OUT/bench.log"
    if [ -n "${ARCH_A:-}" ]; then  # ARCH_A=sm_90a: the same bench with the generated kernels built for it (docs/decisions.md)
      TESSEL_CUDA_ARCH=$ARCH_A "$W/bin/tessel" bench "$W/models/$n" --target cuda --precision $p --iters 50 \
        --json "$W/bench_${n}_${p}_$ARCH_A.json" 2>&1 | tee -a "$OUT/bench.log"
    fi
  done
done
PEER=""
if [[ "${PEERS:-}" != 0 ]] && [[ " $MODELS " == *" tblock_bert "* || " $MODELS " == *" bert_block_b4t512 "* || -n "${PEERS:-}" ]]; then
  BAR=""; [ -d "$W/models/bert_block_b4t512" ] && BAR="$W/models/bert_block_b4t512${AUTOTUNE:+ --autotune}"  # max-autotune: ~85 s more
  PYTHONUNBUFFERED=1 timeout 420 $PY "$BOX/common/cuda_peer_block.py" $BAR > "$OUT/peers.json" 2> "$OUT/peers.log"; PEER=$?
  cat "$OUT/peers.log" | grep -v Warning | tail -5
fi
python3 - "$OUT" "$W" <<'PY'
import glob, json, os, sys
out, w = sys.argv[1], sys.argv[2]
runs = {os.path.basename(f)[6:-5]: json.load(open(f)) for f in sorted(glob.glob(os.path.join(w, "bench_*.json")))}
json.dump(runs, open(os.path.join(out, "bench.json"), "w"), indent=1)  # one file back (the tool returns at most 8)
print(f"\n{'model prec arch':<32}{'match':>6}{'max rel':>10}{'compile ms':>11}{'first ms':>10}{'call ms':>9}{'device ms':>10}{'roof ms':>9}{'graph':>6}{'host':>5}")
for j in runs.values():
    print(f"{os.path.basename(j['model']) + ' ' + j.get('precision', 'f32') + ' ' + j.get('arch', ''):<32}{'yes' if j['match'] else 'NO':>6}{j['max_rel']:>10.2g}{j['compile_ms']:>11.0f}"
          f"{j['first_call_ms']:>10.2f}{j['call_ms']:>9.3f}{j['replay_ms']:>10.3f}{j['roofline_ms_sum']:>9.3f}"
          f"{'yes' if j['cuda_graph'] else 'no':>6}{j['host_steps']:>5}")
p = os.path.join(out, "peers.json")
if os.path.exists(p) and os.path.getsize(p):
    try:
        r = json.loads(open(p).read().strip().splitlines()[-1])
        for c in r["cases"]:
            print(f"peer {c['case']}: torch eager {c['eager_ms']:.3f} ms, Inductor {c['inductor_ms']:.3f} ms (compile {c['inductor_compile_s']:.1f} s), "
                  f"Inductor reduce-overhead {c.get('inductor_cudagraphs_ms', float('nan')):.3f} ms, "
                  f"max-autotune {c.get('inductor_max_autotune_ms', float('nan')):.3f} ms (compile {c.get('inductor_max_autotune_compile_s', float('nan')):.1f} s)"
                  + (f", XLA {c['xla_ms']:.3f} ms (compile {c['xla_compile_s']:.1f} s, max rel {c.get('xla_max_rel_vs_f32_reference', float('nan')):.2g})"
                     if "xla_ms" in c else (f", XLA: {c['xla_error']}" if "xla_error" in c else "")))
    except Exception as e:
        print("peers:", e)
PY
echo "tests rc=$TESTS_RC peer rc=${PEER:-none}"
