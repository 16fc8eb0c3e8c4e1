#!/bin/bash
# Packs what python/box/build_ext.sh needs on a machine without Debian's dev packages (the GPU box:
# Ubuntu 24.04, Python 3.12, torch 2.11) into the git-ignored folder .pybox of the checkout: the
# tessel_core static library of BUILD (default build), the fmt and nlohmann-json headers and the
# shared libraries it links (oneDNN, onnx_proto, protobuf, fmt, xxhash, OpenCL; libgomp in extra/),
# stripped of debug info and xz-compressed (~10 MB). Name .pybox in the device tool's `carry`.
set -e
R=$(cd "$(dirname "$0")/../.." && pwd)
BUILD=${1:-$R/build}
P=$R/.pybox
EXCLUDE=$(git -C "$R" rev-parse --path-format=absolute --git-path info/exclude)   # (a worktree's .git is a file)
mkdir -p "$(dirname "$EXCLUDE")"
grep -qx '/.pybox/' "$EXCLUDE" 2>/dev/null || echo '/.pybox/' >> "$EXCLUDE"
rm -rf "$P" && mkdir -p "$P/include" "$P/stage/extra"
cp -r /usr/include/nlohmann /usr/include/fmt "$P/include/"
for l in libfmt.so.9 libdnnl.so.2 libxxhash.so.0 libonnx_proto.so.1 libprotobuf.so.32 libOpenCL.so.1; do
  cp -L "/lib/x86_64-linux-gnu/$l" "$P/stage/" && strip --strip-debug "$P/stage/$l"
done
cp -L /lib/x86_64-linux-gnu/libgomp.so.1 "$P/stage/extra/"
tar cJf "$P/libs.tar.xz" -C "$P/stage" . && rm -rf "$P/stage"
# A build with the CUDA target (TESSEL_CUDA) links the CUDA runtime statically: its archive travels too
# (NVRTC and cuBLASLt are opened at run time, not linked).
if nm -A "$BUILD/libtessel_core.a" 2>/dev/null | grep -q ' U cudaMalloc$'; then
  cp "$(sed -n 's/^CUDA_cudart_static_LIBRARY:FILEPATH=//p' "$BUILD/CMakeCache.txt")" "$P/"
fi
cp "$BUILD/libtessel_core.a" "$P/" && strip --strip-debug "$P/libtessel_core.a" && xz -T2 "$P/libtessel_core.a"
du -sh "$P"
