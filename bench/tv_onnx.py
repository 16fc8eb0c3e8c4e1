#!/usr/bin/python3
"""torchvision classification models exported to ONNX (torch 1.13 exporter, opset 17), run by tessel on
every backend and functional simulator, each checked against torch eager's output.

Each model (random weights, eval mode, a fixed seed) is exported to a model-zoo folder (model.onnx +
test_data_set_0/input_0.pb, output_0.pb: the input and torch eager's output) under --out, then
`tessel run --backend eager|graph|compiled --check` (against torch's output, max rel 1e-4) and
`tessel sim --hw spyre|tpu-v5e` (the functional simulator; it stores f16 / bf16, so it is checked against
tessel's eager interpreter at its own tolerance, 2e-2 / 5e-2) run on it. The relative error is
max |tessel - reference| / max |reference|.

    /usr/bin/python3 bench/tv_onnx.py [MODEL ...] [--all] [--size 64] [--out /tmp/tv_onnx]
        [--backends eager,graph,compiled,spyre,tpu-v5e] [--tessel build/tessel] [--json FILE]

Without MODEL names it runs one model per family (DEFAULT_MODELS); --all runs every model of
torchvision.models.list_models(module=torchvision.models). Needs no onnx python package: the
TensorProto files are written by write_tensor_proto below.
"""
import argparse
import json
import os
import re
import struct
import subprocess
import sys
import time

import torch
import torchvision

SOURCE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# One per family (the smallest member), in the order of the list.
DEFAULT_MODELS = ["resnet18", "resnet50", "mobilenet_v2", "mobilenet_v3_small", "mobilenet_v3_large",
                  "efficientnet_b0", "efficientnet_v2_s", "convnext_tiny", "regnet_y_400mf", "regnet_x_400mf",
                  "shufflenet_v2_x0_5", "squeezenet1_0", "squeezenet1_1", "densenet121", "googlenet",
                  "inception_v3", "mnasnet0_5", "vgg11", "alexnet", "resnext50_32x4d", "wide_resnet50_2",
                  "vit_b_16", "swin_t", "swin_v2_t", "maxvit_t"]

# Input sizes below --size that a model cannot take: fixed-size position embeddings or windows, or too
# many stride-2 stages for a small image.
MIN_SIZE = {"inception_v3": 96, "googlenet": 64, "alexnet": 64, "squeezenet1_0": 64, "squeezenet1_1": 64,
            "vit_b_16": 224, "vit_b_32": 224, "vit_l_16": 224, "vit_l_32": 224, "vit_h_14": 518,
            "maxvit_t": 224, "swin_t": 224, "swin_s": 224, "swin_b": 224, "swin_v2_t": 256,
            "swin_v2_s": 256, "swin_v2_b": 256}

# onnx TensorProto.DataType of a torch dtype
ONNX_DTYPE = {torch.float32: 1, torch.uint8: 2, torch.int8: 3, torch.int32: 6, torch.int64: 7, torch.bool: 9,
              torch.float16: 10, torch.float64: 11}


def _varint(n):
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def tensor_proto_bytes(t, name=""):
    """An onnx.TensorProto as bytes: dims (field 1), data_type (2), name (8), raw_data (9, little-endian)."""
    t = t.detach().contiguous().cpu()
    out = bytearray()
    for d in t.shape:
        out += b"\x08" + _varint(int(d))
    out += b"\x10" + _varint(ONNX_DTYPE[t.dtype])
    if name:
        nb = name.encode()
        out += b"\x42" + _varint(len(nb)) + nb
    raw = t.numpy().astype(t.numpy().dtype.newbyteorder("<"), copy=False).tobytes()
    out += b"\x4a" + _varint(len(raw)) + raw
    return bytes(out)


def write_tensor_proto(path, t, name=""):
    with open(path, "wb") as f:
        f.write(tensor_proto_bytes(t, name))


def build_model(name, seed=0):
    torch.manual_seed(seed)
    kwargs = {"aux_logits": False, "init_weights": False} if name in ("googlenet", "inception_v3") else {}
    m = torchvision.models.get_model(name, weights=None, **kwargs)
    return m.eval()


def export_model(model, x, folder, opset=17):
    """Exports model at input x into a model-zoo folder; returns torch eager's output."""
    os.makedirs(os.path.join(folder, "test_data_set_0"), exist_ok=True)
    with torch.no_grad():
        y = model(x)
        torch.onnx.export(model, (x,), os.path.join(folder, "model.onnx"), opset_version=opset,
                          input_names=["input"], output_names=["output"], do_constant_folding=True)
    write_tensor_proto(os.path.join(folder, "test_data_set_0", "input_0.pb"), x, "input")
    write_tensor_proto(os.path.join(folder, "test_data_set_0", "output_0.pb"), y, "output")
    return y


def export(name, out_dir, size, seed=0):
    size = max(size, MIN_SIZE.get(name, 0))
    model = build_model(name, seed)
    torch.manual_seed(seed + 1)
    x = torch.randn(1, 3, size, size)
    folder = os.path.join(out_dir, f"{name}_{size}")
    export_model(model, x, folder)
    return folder


RUN_RE = re.compile(r"check output \d+: max abs error \S+, relative error (\S+) -> (PASS|FAIL)")
SIM_RE = re.compile(r"vs eager: relative error (\S+) \(tolerance (\S+)\) -> (PASS|FAIL)")
TOL = 1e-4  # eager, graph and compiled against torch


def _run(cmd, timeout):
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        return p.stdout + p.stderr
    except subprocess.TimeoutExpired:
        return None


def run_tessel(tessel, folder, backend, timeout):
    """One backend on one model folder: eager/graph/compiled through `tessel run --check` (against torch's
    output_0.pb, max rel TOL), a hardware preset through `tessel sim` (the functional simulator stores
    f16/bf16, so it is checked against tessel's eager at its own tolerance). Returns a dict: rel (None
    when it did not run), ok, seconds, note, error (the last line of the output when it failed).

    With random weights, torchvision's init (kaiming fan_out counts a depthwise filter's output
    channels as its fan) shrinks the activations of depthwise-conv models by ~sqrt(channels) per
    block, below DL16's range (2^-30) within a few blocks; spyre's simulator then reports the values it
    flushed. Such a run is repeated with bf16 storage (Spyre has both) and noted."""
    run_backend = backend in ("eager", "graph", "compiled")
    cmd = [tessel, "run", folder, "--backend", backend, "--check", "--max-rel", str(TOL)] if run_backend \
        else [tessel, "sim", folder, "--hw", backend]
    t0 = time.time()
    text = _run(cmd, timeout)
    note = ""
    if text is not None and not run_backend and "-> FAIL" in text and "fell below" in text:
        note = "DL16 underflow reported; bf16 storage"
        text = _run(cmd + ["--dtype", "bf16"], timeout)
    dt = round(time.time() - t0, 1)
    if text is None:
        return {"rel": None, "ok": False, "seconds": dt, "note": note, "error": f"timeout after {timeout} s"}
    found = RUN_RE.findall(text) if run_backend else [(r, v) for r, _, v in SIM_RE.findall(text)]
    if not found:
        last = (text.strip().splitlines() or ["(no output)"])[-1][:240]
        return {"rel": None, "ok": False, "seconds": dt, "note": note, "error": last}
    rel = max(float(r) for r, _ in found)
    ok = all(v == "PASS" for _, v in found)
    return {"rel": rel, "ok": ok, "seconds": dt, "note": note, "error": ""}


def cell(r):
    if r is None:
        return "-"
    if r["rel"] is None:
        return "ERROR"
    return f"{r['rel']:.1e}" + ("*" if r["note"] else "") + ("" if r["ok"] else " FAIL")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("models", nargs="*")
    ap.add_argument("--all", action="store_true")
    ap.add_argument("--size", type=int, default=64)
    ap.add_argument("--out", default="/tmp/tv_onnx")
    ap.add_argument("--backends", default="eager,graph,compiled,spyre,tpu-v5e")
    ap.add_argument("--tessel", default=os.path.join(SOURCE_DIR, "build", "tessel"))
    ap.add_argument("--timeout", type=int, default=900)
    ap.add_argument("--json")
    ap.add_argument("--no-export", action="store_true", help="reuse the folders already under --out")
    args = ap.parse_args()
    torch.set_num_threads(2)
    names = args.models or (torchvision.models.list_models(module=torchvision.models) if args.all
                            else DEFAULT_MODELS)
    backends = args.backends.split(",")
    rows = []
    print(f"{'model':22} {'export':>7} " + " ".join(f"{b:>12}" for b in backends) + "  time", flush=True)
    for name in names:
        row = {"model": name, "size": max(args.size, MIN_SIZE.get(name, 0))}
        folder = os.path.join(args.out, f"{name}_{row['size']}")
        t0 = time.time()
        try:
            if not (args.no_export and os.path.isdir(folder)):
                folder = export(name, args.out, args.size)
            row["export"] = "ok"
        except Exception as e:  # noqa: BLE001 - a failed export is a row of the table, not the end
            row["export"] = f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"
        row["export_s"] = round(time.time() - t0, 1)
        row["backends"] = {}
        if row["export"] == "ok":
            for b in backends:
                row["backends"][b] = run_tessel(args.tessel, folder, b, args.timeout)
        print(f"{name:22} {'ok' if row['export'] == 'ok' else 'FAIL':>7} "
              + " ".join(f"{cell(row['backends'].get(b)):>12}" for b in backends)
              + f"  {sum(r['seconds'] for r in row['backends'].values()) + row['export_s']:.0f} s", flush=True)
        for b, r in row["backends"].items():
            if r["error"]:
                print(f"    {b}: {r['error']}", flush=True)
        if row["export"] != "ok":
            print(f"    export: {row['export']}", flush=True)
        rows.append(row)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"torch": torch.__version__, "torchvision": torchvision.__version__, "size": args.size,
                       "rows": rows}, f, indent=1)
    bad = [r["model"] for r in rows if r["export"] != "ok" or not all(v["ok"] for v in r["backends"].values())]
    print("* the simulator reported values below DL16's range; the cell is the bf16-storage run")
    print(f"{len(rows) - len(bad)}/{len(rows)} pass on {','.join(backends)}"
          + (f"; not: {' '.join(bad)}" if bad else ""))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
