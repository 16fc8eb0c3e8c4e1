# Sourced by the GPU box's one-call scripts (cuda_torch.sh, zoo_cuda.sh) after they set OUT: builds the
# extension (python/box/build_ext.sh over the carried .pybox of a CUDA build, log in $OUT/build_ext.log),
# puts it on PYTHONPATH, and puts the box's NVRTC and cuBLASLt on the library path (the toolkit's, else
# PyTorch's nvidia/*/lib, as bench/cuda_box.sh does). PY: the box's Python with torch.
export PY=${PY:-/opt/torch/.venv/bin/python3}
bash python/box/build_ext.sh > "$OUT/build_ext.log" 2>&1 || { tail -30 "$OUT/build_ext.log"; exit 1; }
export PYTHONPATH=$PWD/.pybox/pkg TESSEL_CACHE_DIR=${TESSEL_CACHE_DIR:-/tmp/tessel_cache} PYTHONUNBUFFERED=1
SP=$($PY -c 'import torch, os; print(os.path.dirname(os.path.dirname(torch.__file__)))')
L=""
for d in /usr/local/cuda/lib64 "$SP"/nvidia/*/lib "$SP"/nvidia/cu13/lib; do [ -d "$d" ] && L="$L:$d"; done
export LD_LIBRARY_PATH="${L#:}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
