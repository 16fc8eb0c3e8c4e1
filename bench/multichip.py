#!/usr/bin/python3
"""A BERT-base-size encoder on several simulated dataflow chips (docs/multichip.md, issue 40).

    /usr/bin/python3 bench/multichip.py --layers 12 --chips 2,4,8 --batch 1,4 --json bench/results/multichip.json

Builds PyTorch's nn.TransformerEncoder at BERT-base's configuration (d 768, 12 heads, MLP 3072, GELU; random
weights, seed 0), exports it to ONNX with a test_data_set_0 of PyTorch's outputs (a model folder, not written
by tessel), writes a system file per chip count (examples/multichip/spyre_ring4.json with `system.chips`
changed: spyre chips on a ring, 100 GB/s and 500 ns per link, assumed figures), and runs
`tessel sim MODEL --hw SYSTEM --shard auto --json` for each: tensor and data parallel are each simulated and
the faster kept, the collectives are timed on the links beside the ring formula, and every rank's graph is
run against eager on the whole graph. The JSON holds each run's figures (tessel's own JSON, unchanged) under
model, batch and chips.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def export(folder, layers, batch, seq):
    import numpy as np  # noqa: F401  (torch.onnx needs it)
    import torch
    import torch.nn as nn
    from onnx import numpy_helper
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(768, 12, 3072, activation="gelu", batch_first=True, dropout=0.0)
    m = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False).eval()
    x = torch.randn(batch, seq, 768)
    os.makedirs(os.path.join(folder, "test_data_set_0"), exist_ok=True)
    torch.onnx.export(m, (x,), os.path.join(folder, "model.onnx"), opset_version=17)
    with torch.no_grad():
        y = m(x)
    for name, t in (("input_0", x), ("output_0", y)):
        with open(os.path.join(folder, "test_data_set_0", name + ".pb"), "wb") as f:
            f.write(numpy_helper.from_array(t.numpy(), name).SerializeToString())


def system_file(folder, chips):
    with open(os.path.join(ROOT, "examples", "multichip", "spyre_ring4.json")) as f:
        hw = json.load(f)
    hw["name"] = f"spyre-ring{chips}"
    hw["system"]["chips"] = chips
    path = os.path.join(folder, f"spyre_ring{chips}.json")
    with open(path, "w") as f:
        json.dump(hw, f, indent=1)
    return path


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--batch", default="1,4", help="comma list of batch sizes")
    ap.add_argument("--chips", default="2,4,8", help="comma list of chip counts")
    ap.add_argument("--tessel", default=os.path.join(ROOT, "build", "tessel"))
    ap.add_argument("--json", help="write every run's figures here")
    a = ap.parse_args()
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        for batch in [int(b) for b in a.batch.split(",")]:
            model = os.path.join(tmp, f"bert_base_enc_b{batch}")
            export(model, a.layers, batch, a.seq)
            for chips in [int(c) for c in a.chips.split(",")]:
                out = os.path.join(tmp, f"run_{batch}_{chips}.json")
                cmd = [a.tessel, "sim", model, "--hw", system_file(tmp, chips), "--shard", "auto", "--json", out]
                p = subprocess.run(cmd, capture_output=True, text=True)
                if p.returncode != 0:
                    print(p.stdout + p.stderr, file=sys.stderr)
                    sys.exit(f"tessel sim failed for batch {batch}, {chips} chips")
                with open(out) as f:
                    r = json.load(f)
                ratios = [c["sim_us"] / c["ring_formula_us"] for c in r.get("collectives", []) if c["ring_formula_us"] > 0]
                comm = max((c["comm_us"] for c in r["chips_time"]), default=0)
                print(f"layers {a.layers} batch {batch} chips {chips}: {r['shard']} {r['sim_us']:.1f} us "
                      f"(one chip {r['one_chip_us']:.1f} us, {r['speedup']:.2f}x); {len(ratios)} collectives, "
                      f"sim/ring {min(ratios, default=0):.3f}..{max(ratios, default=0):.3f}; "
                      f"comm {100 * comm / r['sim_us']:.1f}% of the time; ranks vs eager max rel "
                      f"{r.get('functional_max_rel', -1):.2g}; tried: {'; '.join(r.get('alternatives', []))}")
                runs.append({"model": f"nn.TransformerEncoder BERT-base config, {a.layers} layers, seq {a.seq}",
                             "batch": batch, "chips": chips,
                             "command": f"tessel sim MODEL --hw spyre_ring{chips}.json --shard auto --json OUT", "result": r})
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"runs": runs}, f, indent=1)


if __name__ == "__main__":
    main()
