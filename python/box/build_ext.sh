#!/bin/bash
# Builds tessel._tessel on the GPU box against its Python + pybind11 (docs/python.md, "torch 2.11 on the
# GPU box"), linking what python/box/pack.sh put in .pybox (libtessel_core.a, Debian 12 shared libraries).
# The package lands in .pybox/pkg: PYTHONPATH=.pybox/pkg python3 ...
set -e
R=$(cd "$(dirname "$0")/../.." && pwd)
B=$R/.pybox
PY=${PY:-python3}
cd "$B"
mkdir -p lib pkg/tessel
tar xJf libs.tar.xz -C lib
xz -dkf libtessel_core.a.xz
PYINC=$($PY -c 'import sysconfig;print(sysconfig.get_paths()["include"])')
[ -f "$PYINC/Python.h" ] || { echo "no $PYINC/Python.h"; exit 1; }
PBINC=${PBINC:-$($PY -c "import pybind11;print(pybind11.get_include())")}
EXT=$($PY -c 'import sysconfig;print(sysconfig.get_config_var("EXT_SUFFIX"))')
CXX=${CXX:-g++}
echo "cxx=$(command -v $CXX) pyinc=$PYINC pybind11=$PBINC ext=$EXT"
cp "$R"/python/tessel/*.py pkg/tessel/
time $CXX -O2 -DNDEBUG -DFMT_SHARED -fPIC -fvisibility=hidden -std=c++20 -fopenmp -Wall -Wextra \
  -Wno-missing-field-initializers -I"$R/src" -isystem "$B/include" -isystem "$PYINC" -isystem "$PBINC" \
  -c "$R/python/src/_tessel.cpp" -o _tessel.o
CUDART=""; [ -f libcudart_static.a ] && CUDART="libcudart_static.a -lrt -lpthread"  # a build with the CUDA target
$CXX -shared -fopenmp -o "pkg/tessel/_tessel$EXT" _tessel.o libtessel_core.a $CUDART lib/libfmt.so.9 lib/libdnnl.so.2 \
  lib/libxxhash.so.0 lib/libonnx_proto.so.1 lib/libprotobuf.so.32 -ldl -Wl,--disable-new-dtags -Wl,-rpath,'$ORIGIN/../../lib:$ORIGIN/../../lib/extra' -Wl,-rpath-link,"$B/lib"
ldd "pkg/tessel/_tessel$EXT" | grep -i "not found" || echo "ldd: all found"
echo built "pkg/tessel/_tessel$EXT"
