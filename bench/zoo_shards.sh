#!/bin/bash
# Runs bench/zoo.py as concurrent shards, each pinned (taskset) to its own block of cores, so a many-core
# machine measures many models in the time of a few: shard i gets cores [i*CORES, (i+1)*CORES) and its
# own model list; every process (and the compile workers it starts) stays on its cores. Within a shard
# the modes of one model are interleaved as usual, so each ratio compares systems on the same cores at
# the same time; shards share the machine's memory bandwidth (recorded: the load and core count).
#
#   bench/zoo_shards.sh OUT_DIR CORES TIMEOUT_S "models of shard 0" "models of shard 1" ... -- ZOO_ARGS...
#
# e.g. on the GPU box (4 shards of 8 cores, 9 minutes each, torch.compile(backend="tessel") vs eager and
# Inductor at 8 threads):
#   bench/zoo_shards.sh $OUT 8 540 "resnet50,convnext_tiny" "timm:vit_base_patch16_224" ... -- \
#       --threads 8 --rounds 3 --iters 5 --modes tessel,dynamo,inductor
# Writes OUT_DIR/zoo_<i>.json and OUT_DIR/zoo_<i>.log per shard; a shard cut by its timeout keeps the
# models it finished (zoo.py writes its JSON after every model).
set -u
OUT=$1 CORES=$2 LIMIT=$3
shift 3
LISTS=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do LISTS+=("$1"); shift; done
[ $# -gt 0 ] && shift
PY=${PY:-python3}
HERE=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$OUT"
echo "zoo_shards: ${#LISTS[@]} shards x $CORES cores on $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"
pids=()
for i in "${!LISTS[@]}"; do
  lo=$((i * CORES)) hi=$((i * CORES + CORES - 1))
  taskset -c "$lo-$hi" timeout "$LIMIT" "$PY" "$HERE/zoo.py" --models "${LISTS[$i]}" --json "$OUT/zoo_$i.json" "$@" \
    > "$OUT/zoo_$i.log" 2>&1 &
  pids+=($!)
done
rc=0
for i in "${!pids[@]}"; do
  wait "${pids[$i]}" || { echo "shard $i: exit $?"; rc=1; }
done
echo "zoo_shards: done, load $(cut -d' ' -f1-3 /proc/loadavg)"
exit $rc
