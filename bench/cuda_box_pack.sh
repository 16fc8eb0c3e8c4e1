#!/bin/bash
# Packs what bench/cuda_box.sh needs on the GPU box (Ubuntu 24.04 with its own CUDA 13, no Debian dev
# packages) into REPO/.box15 of the checkout the device tool sends (git-ignored through info/exclude):
#   common/  tessel and tessel_tests of BUILD (configured -DTESSEL_CUDA=ON), stripped and xz-compressed;
#            the Debian shared libraries they link (python/box/pack.sh's list); the two scripts
#   m1/      the smaller corpus models (bert_tiny gpt2_tiny attn_s ffn_s mobilenet_v2)
#   m2/      tblock_bert (28 MB: with m1 it would pass the tool's 64 MiB, so it travels in its own call)
#   m3/      bert_block_b4t512, the bar model (bench/cuda_bert_block.py export, torch 1.13 here: 28 MB; the box
#            writes its test_data_set_0 itself, 12.6 MB that need not travel)
# tblock_s needs no copy: examples/tblock_s is in every checkout.
# usage: bench/cuda_box_pack.sh REPO [BUILD]    then carry .box15/common and .box15/m1 (or .box15/m2)
set -e
R=$(cd "$(dirname "$0")/.." && pwd)
REPO=${1:?the checkout the device tool sends}
BUILD=${2:-$R/build}
SHARED=${TESSEL_SHARED:-$R/../shared}
P=$REPO/.box15
EXCLUDE=$(git -C "$REPO" rev-parse --path-format=absolute --git-path info/exclude)
grep -qx '/.box15/' "$EXCLUDE" 2>/dev/null || echo '/.box15/' >> "$EXCLUDE"
rm -rf "$P" && mkdir -p "$P/common/stage" "$P/m1" "$P/m2" "$P/m3"
for l in libfmt.so.9 libdnnl.so.2 libxxhash.so.0 libonnx_proto.so.1 libprotobuf.so.32 libOpenCL.so.1 libgomp.so.1; do
  cp -L "/lib/x86_64-linux-gnu/$l" "$P/common/stage/" && strip --strip-debug "$P/common/stage/$l"
done
tar cJf "$P/common/libs.tar.xz" -C "$P/common/stage" . && rm -rf "$P/common/stage"
for b in tessel tests/tessel_tests; do
  strip --strip-debug -o "$P/common/$(basename $b)" "$BUILD/$b" && xz -T2 "$P/common/$(basename $b)"
done
cp "$R/bench/cuda_box.sh" "$R/bench/cuda_peer_block.py" "$R/bench/cuda_bert_block.py" "$R/bench/tensor_pb.py" "$P/common/"
echo "$R" > "$P/common/source_dir"   # tessel_tests reads its source folder (test data): the box links it to the checkout
for m in bert_tiny gpt2_tiny attn_s ffn_s mobilenet_v2; do cp -r "$SHARED/models/$m" "$P/m1/"; done
cp -r "$SHARED/models/tblock_bert" "$P/m2/"
/usr/bin/python3 "$R/bench/cuda_bert_block.py" export "$P/m3/bert_block_b4t512"
du -sh "$P"/*
