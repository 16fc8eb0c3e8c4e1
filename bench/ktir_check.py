#!/usr/bin/python3
"""tessel's KTIR export run by ktir-cpu (torch-spyre's reference interpreter of the ktdp dialect), unmodified:
every exported kernel of a model is loaded from its own module file and executed on random data of the
argument shapes ktir-cpu derives from the kernel, with ktir-cpu's latency estimate beside tessel's
simulated time for the same kernel.

    python3 bench/ktir_check.py --ktir-cpu DIR MODEL [MODEL ...] [--target spyre] [--json out.json]

DIR is a checkout of github.com/torch-spyre/ktir-cpu (its ktir_cpu package needs only numpy); nothing of it
is copied into tessel. tessel's side: `tessel compile MODEL --target T --emit ktir -o FOLDER` (one module per
kernel and manifest.json) and `tessel sim MODEL --hw T --no-functional --json` (per-kernel simulated time).
What this does not yet check: values chained through the kernels against tessel's own results (that needs
the constants exported beside the modules; docs/ktir.md, "Limits").
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

SOURCE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("models", nargs="+")
    ap.add_argument("--ktir-cpu", required=True, help="a ktir-cpu checkout")
    ap.add_argument("--target", default="spyre")
    ap.add_argument("--tessel", default=os.path.join(SOURCE, "build", "tessel"))
    ap.add_argument("--json")
    a = ap.parse_args()
    sys.path.insert(0, os.path.abspath(a.ktir_cpu))
    import numpy as np
    from ktir_cpu import HardwareConfig, KTIRInterpreter
    rows = []
    for model in a.models:
        with tempfile.TemporaryDirectory(prefix="ktir_") as work:
            folder = os.path.join(work, "ktir")
            subprocess.run([a.tessel, "compile", model, "--target", a.target, "--emit", "ktir", "-o", folder],
                           check=True, capture_output=True, text=True)
            sim_json = os.path.join(work, "sim.json")
            subprocess.run([a.tessel, "sim", model, "--hw", a.target, "--no-functional", "--json", sim_json],
                           check=True, capture_output=True, text=True)
            with open(os.path.join(folder, "manifest.json")) as f:
                manifest = json.load(f)
            with open(sim_json) as f:
                sim = {k["name"]: k for k in json.load(f)["kernels"]}
            for k in manifest["kernels"]:
                row = dict(model=os.path.basename(model.rstrip("/")), kernel=k["kernel"], node=k["node"],
                           tessel_us=sim.get(k["kernel"], {}).get("simulated_us"), status="ok", error="")
                t0 = time.time()
                try:
                    it = KTIRInterpreter(latency_config=HardwareConfig())
                    it.load(os.path.join(folder, k["file"]))
                    sizes = it.tensor_input_output_sizes(k["function"])
                    rng = np.random.default_rng(0)
                    args = {n: rng.standard_normal(v["shape"]).astype(np.float16 if v["dtype"] == "f16" else np.float32)
                            for n, v in sizes.items()}
                    it.execute_function(k["function"], **args)
                    rep = it.get_latency_report()
                    row.update(ktir_cpu_us=rep.kernel_time_us, bottleneck=rep.bottleneck,
                               extra_args=sorted(set(sizes) - {x["arg"] for x in k["args"]}))
                except Exception as e:  # noqa: BLE001 -- every failure is a row of the table
                    row.update(status="error", error=f"{type(e).__name__}: {str(e).splitlines()[0][:160]}")
                row["seconds"] = round(time.time() - t0, 2)
                rows.append(row)
            for s in manifest["skipped"]:
                rows.append(dict(model=os.path.basename(model.rstrip("/")), kernel=s.split(":")[0], node="", status="skipped",
                                 error=s))
    print(f"{'model':<12} {'kernel':<6} {'status':<8} {'tessel us':>10} {'ktir-cpu us':>12} {'ratio':>6}  node / note")
    for r in rows:
        t, k = r.get("tessel_us"), r.get("ktir_cpu_us")
        ratio = f"{k / t:6.2f}" if t and k else "     -"
        note = r["error"] or r["node"]
        if r.get("extra_args"):
            note += f"  (ktir-cpu also asks for {', '.join(r['extra_args'])})"
        print(f"{r['model']:<12} {r['kernel']:<6} {r['status']:<8} {t if t is not None else '-':>10} "
              f"{(f'{k:.2f}' if k is not None else '-'):>12} {ratio}  {note}")
    ran = [r for r in rows if r["status"] == "ok"]
    print(f"{len(ran)} kernels ran unmodified on ktir-cpu, {sum(r['status'] == 'error' for r in rows)} failed, "
          f"{sum(r['status'] == 'skipped' for r in rows)} not exported")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
