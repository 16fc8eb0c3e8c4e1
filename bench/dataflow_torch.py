"""PyTorch models straight onto the dataflow chips (issue 35; docs/python.md, "Dataflow targets"): every model of
tests/python/test_torchvision_models.py through tessel.compile(model, (x,), target=...), no export, on each
chip twice: with f32 storage (a hardware file derived from the preset, bench/tv_onnx.py's f32_hw_file: the
mapping's exact check, held to 1e-4 against eager) and with the preset's own storage (the chip's rounding:
f16 DL16 on Spyre, bf16 on the TPUs). Per model and target: the relative error against eager, the simulated
time, the compile and first-call seconds, and values the storage flushed. JSON out.

    PYTHONPATH=build/python /usr/bin/python3 bench/dataflow_torch.py --json out.json [--models resnet18,vit]
"""
import argparse
import json
import os
import sys
import tempfile
import time
import warnings

import torch

import tessel

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests", "python"))
from test_torchvision_models import MODELS, _no_zero_weights  # noqa: E402
from tv_onnx import f32_hw_file  # noqa: E402

TOL = {"f32": 1e-4}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--targets", default="spyre,tpu-v5e")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json")
    a = ap.parse_args()
    hw_dir = tempfile.mkdtemp(prefix="tessel-hw-")
    rows, failed = [], 0
    for name in a.models.split(","):
        torch.manual_seed(0)
        model, res = MODELS[name]()
        model = _no_zero_weights(model.eval())
        x = torch.randn(1, 3, res, res)
        with torch.no_grad():
            ref = model(x)
        for chip in a.targets.split(","):
            for storage in ("f32", None):
                target = f32_hw_file(chip, hw_dir) if storage == "f32" else chip
                row = dict(model=name, target=chip, storage=storage or "preset")
                try:
                    t0 = time.perf_counter()
                    fast = tessel.compile(model, (x,), target=target, precision=storage, threads=a.threads)
                    row["compile_s"] = time.perf_counter() - t0
                    with warnings.catch_warnings():
                        warnings.simplefilter("ignore")
                        t0 = time.perf_counter()
                        out = fast(x)
                        row["first_call_s"] = time.perf_counter() - t0
                    row["storage"] = fast.storage
                    row["rel_err"] = float((out - ref).abs().max() / ref.abs().max())
                    row["simulated_us"] = fast.report["simulated_us"]
                    row["flushed"] = fast.last_run["flushed"]
                    if storage == "f32" and row["rel_err"] > TOL["f32"]:
                        failed += 1
                        row["fail"] = f"rel err {row['rel_err']:.2e} > {TOL['f32']:.0e}"
                except tessel.TesselError as e:
                    failed += 1
                    row["error"] = str(e)[:500]
                rows.append(row)
                print(f"{name:20s} {chip:8s} {row['storage']:12s} " +
                      (f"ERROR {row['error']}" if "error" in row else
                       f"rel {row['rel_err']:.2e}  sim {row['simulated_us']:8.1f} us  compile {row['compile_s']:.2f} s"
                       f"  flushed {row['flushed']}" + (f"  FAIL {row['fail']}" if "fail" in row else "")), flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(dict(torch=torch.__version__, rows=rows), f, indent=1)
    print(f"{len(rows) - failed}/{len(rows)} runs pass (f32 storage within {TOL['f32']:.0e}; preset storage reported)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
