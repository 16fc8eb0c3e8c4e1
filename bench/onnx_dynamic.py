"""ONNX models with dim_param inputs (dynamic axes) compiled once for every size (docs/dynamic-shapes.md):
torch's own modules and torchvision models exported by torch 1.13 with dynamic batch (and sequence) axes,
three data sets of different sizes each with torch's outputs, run by `tessel run --dynamic --backend compiled`
(one compilation, every data set checked), and per data set the same shapes compiled statically
(`tessel run` without --dynamic) for the time of a call either way (best of --repeat, same process
order, same threads). JSON out.

    PYTHONPATH=build/python /usr/bin/python3 bench/onnx_dynamic.py --tessel build/tessel --json out.json
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import tensor_pb  # noqa: E402


class CausalBlock(torch.nn.Module):
    """A decoder-style block: torch's encoder layer under a causal mask built from the input's length
    (torch.nn.Transformer.generate_square_subsequent_mask's -inf above the diagonal)."""

    def __init__(self, d=64, heads=4):
        super().__init__()
        self.layer = torch.nn.TransformerEncoderLayer(d, heads, 2 * d, dropout=0.0, batch_first=True, norm_first=True)

    def forward(self, x):
        t = x.shape[1]
        mask = torch.triu(torch.full((t, t), float("-inf")), diagonal=1)
        return self.layer(x, src_mask=mask)


def _models():
    import torchvision
    torch.manual_seed(0)
    enc = torch.nn.TransformerEncoderLayer(64, 4, 128, dropout=0.0, batch_first=True, norm_first=True)
    seq_axes = {0: "batch", 1: "seq"}
    return {   # name: (module, example, dynamic axes, the shapes of the three data sets)
        "encoder_layer": (enc, (2, 10, 64), seq_axes, [(1, 50, 64), (2, 100, 64), (3, 7, 64)]),
        "causal_block": (CausalBlock(), (2, 10, 64), seq_axes, [(1, 33, 64), (2, 64, 64), (1, 5, 64)]),
        # the sequence alone dynamic: the bucketed dataflow runs (tessel sim --buckets 64,128,256)
        "encoder_layer_seq": (enc, (1, 10, 64), {1: "seq"}, [(1, 50, 64), (1, 100, 64), (1, 200, 64)]),
        "mobilenet_v2": (torchvision.models.mobilenet_v2(), (1, 3, 64, 64), {0: "batch"},
                         [(1, 3, 64, 64), (3, 3, 64, 64), (2, 3, 64, 64)]),
        "resnet18": (torchvision.models.resnet18(), (1, 3, 64, 64), {0: "batch"},
                     [(1, 3, 64, 64), (4, 3, 64, 64), (2, 3, 64, 64)]),
    }


def export(name, folder):
    """Exports model `name` to folder/name/model.onnx with its data sets set0..set2; returns their folders."""
    m, example, axes, shapes = _models()[name]
    m = m.eval()
    d = os.path.join(folder, name)
    os.makedirs(d, exist_ok=True)
    # (under no_grad torch's encoder layer takes its fused fast path, which the exporter does not know)
    torch.onnx.export(m, torch.randn(*example), os.path.join(d, "model.onnx"), opset_version=17,
                      input_names=["x"], output_names=["y"], dynamic_axes={"x": axes, "y": axes})
    sets = []
    g = torch.Generator().manual_seed(1)
    for k, shape in enumerate(shapes):
        x = torch.randn(*shape, generator=g)
        with torch.no_grad():
            y = m(x)
        s = os.path.join(d, f"set{k}")
        os.makedirs(s, exist_ok=True)
        tensor_pb.write(os.path.join(s, "input_0.pb"), x.numpy(), "x")
        tensor_pb.write(os.path.join(s, "output_0.pb"), y.numpy(), "y")
        sets.append(s)
    return os.path.join(d, "model.onnx"), sets


def run_dynamic(tessel, model, sets, threads, repeat, timeout=600):
    """`tessel run --dynamic` over every data set: compilations, per-set check and best time (ms)."""
    cmd = [tessel, "run", model, "--dynamic", "--backend", "compiled", "--threads", str(threads), "--check",
           "--repeat", str(repeat), "--inputs", ",".join(sets)]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    out = p.stdout + p.stderr
    times = [float(t) for t in re.findall(r"ran compiled in ([0-9.]+) ms", out)]
    checks = re.findall(r"-> (PASS|FAIL)", out)
    compiled = len(re.findall(r"compiled once for every size", out))
    return dict(ok=p.returncode == 0, compilations=compiled, ms=times, checks=checks,
                error=None if p.returncode == 0 else out.strip().splitlines()[-1] if out.strip() else "failed")


def run_static(tessel, model, data_set, threads, repeat, timeout=600):
    """`tessel run` of one data set, compiled for its shapes: the best time (ms)."""
    cmd = [tessel, "run", model, "--backend", "compiled", "--threads", str(threads), "--check", "--repeat",
           str(repeat), "--inputs", data_set]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    m = re.search(r"ran compiled in ([0-9.]+) ms", p.stdout)
    return float(m.group(1)) if p.returncode == 0 and m else None


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tessel", default=os.path.join(os.path.dirname(HERE), "build", "tessel"))
    ap.add_argument("--models", default="encoder_layer,causal_block,mobilenet_v2,resnet18")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--json")
    a = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="tessel_onnx_dynamic_") as tmp:
        for name in a.models.split(","):
            model, sets = export(name, tmp)
            r = run_dynamic(a.tessel, model, sets, a.threads, a.repeat)
            r["static_ms"] = [run_static(a.tessel, model, s, a.threads, a.repeat) for s in sets]
            r["model"] = name
            ratios = [d / s for d, s in zip(r["ms"], r["static_ms"]) if s]
            r["dynamic_over_static"] = ratios
            print(f"{name}: {'ok' if r['ok'] else 'FAILED'} compilations {r['compilations']} checks {r['checks']} "
                  f"dynamic ms {r['ms']} static ms {r['static_ms']} ratio {[round(x, 3) for x in ratios]}"
                  + (f" error {r['error']}" if r["error"] else ""))
            rows.append(r)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(dict(threads=a.threads, repeat=a.repeat, rows=rows), f, indent=1)
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
