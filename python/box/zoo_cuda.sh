#!/bin/bash
# The model zoo on the GPU box's CUDA target in one device call (docs/BENCHMARKS.md): builds the extension
# and sets the paths (python/box/cuda_env.sh), and runs bench/zoo.py --device cuda as concurrent shards
# (bench/zoo_shards.sh: torchvision's tv-core, timm's and transformers' lists, two cores each) with
# torch.compile(backend="tessel") against f32 eager on the same GPU. The shards share one GPU, so the times
# are a coverage pass, not a benchmark; the errors and the graphs left in PyTorch are the result.
#   bash python/box/zoo_cuda.sh            (ZOO_ARGS: more zoo.py arguments; LIMIT: seconds per shard; NSHARDS: 8)
set -u
OUT=${OUT:-/tmp/zoo_cuda}
mkdir -p "$OUT"
. python/box/cuda_env.sh   # the extension built, the box's CUDA libraries on the path
lists() {  # a family's names split into N comma-joined lists
  $PY - "$1" "$2" <<'PY'
import sys; sys.path.insert(0, "bench")
import zoo
names = [f"{f}:{n}" for f, n in zoo.resolve(sys.argv[1])]
k = int(sys.argv[2])
for i in range(k):
    print(",".join(names[i::k]))
PY
}
mapfile -t SHARDS < <(lists "${FAMILIES:-tv-core,transformers,timm}" "${NSHARDS:-8}")
SH=$(mktemp -d)   # the shards' files (the device tool returns few files: one JSON and one log come back)
PY=$PY bash bench/zoo_shards.sh "$SH" 2 "${LIMIT:-480}" "${SHARDS[@]}" -- --device cuda --modes dynamo \
  --threads 2 --rounds 1 --iters 3 ${ZOO_ARGS:-}
for f in "$SH"/zoo_*.log; do echo "== $f"; grep -v -i "warn" "$f"; done > "$OUT/zoo_shards.log"
$PY - "$SH" "$OUT" <<'PY'
import glob, json, os, sys
sys.path.insert(0, "bench")
import zoo
recs, env = [], None
for f in sorted(glob.glob(os.path.join(sys.argv[1], "zoo_*.json"))):
    d = json.load(open(f))
    env = env or d["env"]
    recs += d["models"]
json.dump(dict(env=env, models=recs), open(os.path.join(sys.argv[2], "zoo_cuda.json"), "w"), indent=1)
for r in recs:
    print(zoo.row(r, ["dynamo"]))
for line in zoo.summary(recs, ["dynamo"]):
    print(line)
PY
