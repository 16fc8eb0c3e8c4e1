#!/usr/bin/python3
"""torchvision classification models exported to ONNX (torch 1.13 exporter, opset 17), run by tessel on
every backend and functional simulator, each checked against torch eager's output.

Each model (random weights, BatchNorm statistics calibrated on a random batch, eval mode, fixed seeds)
is exported to a model-zoo folder (model.onnx + test_data_set_0/input_0.pb, output_0.pb: the input and
torch eager's output) under --out, then run by tessel on each backend (run_tessel):
  eager, graph, compiled      `tessel run --backend B --check` against torch's output, max rel 1e-4
  spyre:f32, tpu-v5e:f32      `tessel sim` (functional simulator) with f32 storage against tessel's eager,
                              max rel 1e-4: the exact check of the mapping
  spyre, tpu-v5e              `tessel sim` at the target's storage (DL16, bf16) at its tolerance (2e-2,
                              5e-2): what the storage costs; not part of "exact"
The relative error is max |tessel - reference| / max |reference|; "signal" is how much the output
moves with the input (max |y(x) - y(x')| / max |y(x)|), so a model whose output is its last bias
alone cannot pass unnoticed.

    /usr/bin/python3 bench/tv_onnx.py [MODEL ...] [--all] [--size 64] [--out /tmp/tv_onnx]
        [--backends eager,graph,compiled,spyre:f32,tpu-v5e:f32,spyre,tpu-v5e] [--tessel build/tessel]
        [--json FILE] [--no-export] [--export-only] [--f64] [--clean]

Without MODEL names it runs one model per family (DEFAULT_MODELS); --all runs every model of
torchvision.models.list_models(module=torchvision.models). Needs no onnx python package: the
TensorProto files are written by write_tensor_proto below.
"""
import argparse
import json
import os
import re
import shutil
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
MIN_SIZE = {"vgg11": 224, "vgg11_bn": 224, "vgg13": 224, "vgg13_bn": 224, "vgg16": 224, "vgg16_bn": 224,
            "vgg19": 224, "vgg19_bn": 224, "alexnet": 224,  # the exporter needs the adaptive pool's output to divide its input
            "inception_v3": 96, "googlenet": 64, "squeezenet1_0": 64, "squeezenet1_1": 64,
            "vit_b_16": 224, "vit_b_32": 224, "vit_l_16": 224, "vit_l_32": 224, "vit_h_14": 224,
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
    # Some heads start at exactly zero (vit's classifier): the output would be 0 whatever the rest
    # computes, and every backend would "match". Such weight matrices get small random values.
    for p in m.parameters():
        if p.dim() >= 2 and not p.detach().any():
            torch.nn.init.normal_(p, std=0.02)
    return m.eval()


def export_model(model, x, folder, opset=17):
    """Exports model at input x into a model-zoo folder; returns torch eager's output.

    Not under torch.no_grad(): there, torch 1.13's nn.MultiheadAttention in eval mode takes its fast
    path (aten::_native_multi_head_attention), which the ONNX exporter cannot export (vit_b_16)."""
    os.makedirs(os.path.join(folder, "test_data_set_0"), exist_ok=True)
    y = model(x).detach()
    torch.onnx.export(model, (x,), os.path.join(folder, "model.onnx"), opset_version=opset,
                      input_names=["input"], output_names=["output"], do_constant_folding=True)
    write_tensor_proto(os.path.join(folder, "test_data_set_0", "input_0.pb"), x, "input")
    write_tensor_proto(os.path.join(folder, "test_data_set_0", "output_0.pb"), y, "output")
    return y


def calibrate_batchnorm(model, size, seed):
    """Sets every BatchNorm's running statistics to those of a random batch, as a trained model's are.
    With torchvision's random init and the default statistics (mean 0, var 1) the activations of deep
    models vanish: torch.nn.init.kaiming_normal_(mode="fan_out") counts a depthwise filter's output
    channels as its fan, shrinking each depthwise block by ~sqrt(channels), and inception/googlenet
    logits end up as the classifier's bias alone; the output then hardly depends on the input and
    the values fall below f16's range. Calibrated, each normalised activation has unit variance."""
    bns = [m for m in model.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
    if not bns:
        return
    for m in bns:
        m.reset_running_stats()
        m.momentum = None  # a cumulative average over the calibration batch
    torch.manual_seed(seed + 2)
    model.train()
    with torch.no_grad():
        model(torch.randn(4, 3, size, size))
    model.eval()


def export(name, out_dir, size, seed=0):
    """Exports model `name` at 1x3xSIZExSIZE (at least MIN_SIZE) into OUT_DIR/NAME_SIZE; returns the folder
    and the signal: how much the output changes with the input (max |y(x) - y(x')| / max |y(x)|)."""
    size = max(size, MIN_SIZE.get(name, 0))
    model = build_model(name, seed)
    calibrate_batchnorm(model, size, seed)
    torch.manual_seed(seed + 1)
    x, x2 = torch.randn(1, 3, size, size), torch.randn(1, 3, size, size)
    folder = os.path.join(out_dir, f"{name}_{size}")
    y = export_model(model, x, folder)
    with torch.no_grad():
        signal = ((model(x2) - y).abs().max() / y.abs().max()).item()
    with open(os.path.join(folder, "signal.json"), "w") as f:  # for --no-export runs
        json.dump({"signal": signal}, f)
    return folder, signal


def f64_reference(name, folder, size, seed=0):
    """Torch's own fp32 error: the model of `export` (same seeds, so the same weights and input) run in
    float64, written as FOLDER/f64_reference/{input_0,output_0}.pb (the f64 output rounded to f32) for
    the eager:f64 column. Returns max |y32 - y64| / max |y64|: what fp32 arithmetic in torch's order
    costs this model, the scale against which a deep random-weight model's 1e-4 is judged."""
    size = max(size, MIN_SIZE.get(name, 0))
    model = build_model(name, seed)
    calibrate_batchnorm(model, size, seed)
    torch.manual_seed(seed + 1)
    x = torch.randn(1, 3, size, size)
    y32 = model(x).detach()  # as export_model computes it
    y64 = model.double()(x.double()).detach()
    ref = os.path.join(folder, "f64_reference")
    os.makedirs(ref, exist_ok=True)
    write_tensor_proto(os.path.join(ref, "input_0.pb"), x, "input")
    write_tensor_proto(os.path.join(ref, "output_0.pb"), y64.float(), "output")
    return ((y32.double() - y64).abs().max() / y64.abs().max()).item()


def saved_signal(folder):
    """The signal an earlier export of `folder` measured, or None."""
    try:
        with open(os.path.join(folder, "signal.json")) as f:
            return json.load(f)["signal"]
    except (OSError, ValueError, KeyError):
        return None


RUN_RE = re.compile(r"check output \d+: max abs error \S+, relative error (\S+) -> (PASS|FAIL)")
SIM_RE = re.compile(r"vs eager: relative error (\S+) \(tolerance (\S+)\) -> (PASS|FAIL)")
TOL = 1e-4  # eager, graph and compiled against torch


def _run(cmd, timeout):
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        return p.stdout + p.stderr
    except subprocess.TimeoutExpired:
        return None


def f32_hw_file(preset, out_dir):
    """The hardware preset `preset` (hw/PRESET.json) with f32 among its storage dtypes, written under
    out_dir: the functional simulator with f32 storage is an exact check of the mapping (tiles, splits,
    layouts), which f16/bf16 storage cannot be on a deep random-weight model. The matrix unit gets an
    f32 rate (1/4 of its f16 rate) only because the timing model asks for one; times are not used."""
    path = os.path.join(out_dir, f"{preset}-f32.json")
    if not os.path.exists(path):
        with open(os.path.join(SOURCE_DIR, "hw", f"{preset}.json")) as f:
            hw = json.load(f)
        if "f32" not in hw["dtypes"]:
            hw["dtypes"].append("f32")
        rate = hw["matrix_unit"]["dtype_rate"]
        rate.setdefault("f32", min(rate.values()) / 4)
        os.makedirs(out_dir, exist_ok=True)
        with open(path, "w") as f:
            json.dump(hw, f, indent=1)
    return path


def is_exact(backend):
    """Backends held to TOL: the CPU ones against torch, the simulators with f32 storage against eager."""
    return backend in ("eager", "graph", "compiled") or backend.endswith(":f32")


def run_tessel(tessel, folder, backend, timeout, hw_dir="/tmp"):
    """One backend on one model folder: eager/graph/compiled through `tessel run --check` (against torch's
    output_0.pb, max rel TOL); PRESET through `tessel sim --hw PRESET` (the functional simulator at the
    target's storage, f16 (DL16) on spyre, bf16 on tpu, checked against tessel's eager at 2e-2 / 5e-2);
    PRESET:f32 the same with f32 storage (f32_hw_file), checked at TOL. Returns a dict: rel (None when it
    did not run), ok, seconds, note ("underflow" when the simulator reported values below the storage
    range), error (the last line of the output when it failed)."""
    if backend in ("eager", "graph", "compiled"):
        cmd = [tessel, "run", folder, "--backend", backend, "--check", "--max-rel", str(TOL)]
    elif backend.endswith(":f64"):  # against torch's float64 output (f64_reference)
        cmd = [tessel, "run", folder, "--backend", backend[:-4], "--inputs", os.path.join(folder, "f64_reference"),
               "--check", "--max-rel", str(TOL)]
    elif backend.endswith(":f32"):
        cmd = [tessel, "sim", folder, "--hw", f32_hw_file(backend[:-4], hw_dir), "--dtype", "f32"]
    else:
        cmd = [tessel, "sim", folder, "--hw", backend]
    t0 = time.time()
    text = _run(cmd, timeout)
    dt = round(time.time() - t0, 1)
    if text is None:
        return {"rel": None, "ok": False, "seconds": dt, "note": "", "error": f"timeout after {timeout} s"}
    note = "underflow" if "fell below" in text else ""
    found = RUN_RE.findall(text) if cmd[1] == "run" else [(r, v) for r, _, v in SIM_RE.findall(text)]
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
    ap.add_argument("--backends", default="eager,graph,compiled,spyre:f32,tpu-v5e:f32,spyre,tpu-v5e")
    ap.add_argument("--tessel", default=os.path.join(SOURCE_DIR, "build", "tessel"))
    ap.add_argument("--timeout", type=int, default=900)
    ap.add_argument("--json")
    ap.add_argument("--no-export", action="store_true", help="reuse the exports already under --out (signal.json written)")
    ap.add_argument("--export-only", action="store_true", help="export (and measure the signal), run no backend")
    ap.add_argument("--clean", action="store_true",
                    help="delete each model's export once its columns ran (the 80 take ~20 GB otherwise)")
    ap.add_argument("--f64", action="store_true",
                    help="also run torch in float64: column torch:f64 (torch fp32 vs f64) and backend eager:f64 "
                         "(tessel eager vs torch f64); for models whose 1e-4 check fails")
    args = ap.parse_args()
    torch.set_num_threads(2)
    names = args.models or (torchvision.models.list_models(module=torchvision.models) if args.all
                            else DEFAULT_MODELS)
    backends = [] if args.export_only else args.backends.split(",")
    rows = []
    print(f"{'model':22} {'size':>4} {'export':>6} {'signal':>7} " + " ".join(f"{b:>12}" for b in backends) + "  time",
          flush=True)
    for name in names:
        row = {"model": name, "size": max(args.size, MIN_SIZE.get(name, 0))}
        folder = os.path.join(args.out, f"{name}_{row['size']}")
        t0 = time.time()
        try:
            if args.no_export and saved_signal(folder) is not None:  # a finished earlier export
                row["signal"] = saved_signal(folder)
            else:
                folder, row["signal"] = export(name, args.out, args.size)
            row["export"] = "ok"
        except Exception as e:  # noqa: BLE001 - a failed export is a row of the table, not the end
            row["export"] = f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"
        row["export_s"] = round(time.time() - t0, 1)
        row["backends"] = {}
        if row["export"] == "ok":
            if args.f64:
                row["torch_f64"] = f64_reference(name, folder, args.size)
            for b in backends:
                row["backends"][b] = run_tessel(args.tessel, folder, b, args.timeout, args.out)
        sig = f"{row['signal']:.1e}" if "signal" in row else "-"
        print(f"{name:22} {row['size']:>4} {'ok' if row['export'] == 'ok' else 'FAIL':>6} {sig:>7} "
              + " ".join(f"{cell(row['backends'].get(b)):>12}" for b in backends)
              + f"  {sum(r['seconds'] for r in row['backends'].values()) + row['export_s']:.0f} s", flush=True)
        if "torch_f64" in row:
            print(f"    torch fp32 vs torch f64: {row['torch_f64']:.1e}", flush=True)
        for b, r in row["backends"].items():
            if r["error"]:
                print(f"    {b}: {r['error']}", flush=True)
        if row["export"] != "ok":
            print(f"    export: {row['export']}", flush=True)
        rows.append(row)
        if args.clean and os.path.isdir(folder):
            shutil.rmtree(folder)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"torch": torch.__version__, "torchvision": torchvision.__version__, "size": args.size,
                       "rows": rows}, f, indent=1)
    exact = [b for b in backends if is_exact(b)]
    bad = [r["model"] for r in rows if r["export"] != "ok" or not all(r["backends"][b]["ok"] for b in exact)]
    print("* the simulator reported values below its storage's range (flushed to 0)")
    if not exact:  # only diagnostic columns (NAME:f64, DL16/bf16 storage): no exact verdict
        return 0
    print(f"{len(rows) - len(bad)}/{len(rows)} exact (<= {TOL:g} rel) on {','.join(exact)}"
          + (f"; not: {' '.join(bad)}" if bad else ""))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
