#!/usr/bin/python3
"""tessel's matrix-unit cycles against SCALE-Sim v2 itself, side by side: one R x C array, no memory
bottleneck (SCALE-Sim's InterfaceBandwidth CALC: the bandwidth that never stalls), the 16 GEMMs of
tests/dataflow_cost_test.cpp, arrays 32x32 and 128x128, dataflows ws, os and is.

    python3 bench/scalesim_compare.py --scalesim DIR [--tessel build/tessel] [--json out.json]

DIR is a checkout of github.com/scalesim-project/scale-sim-v2 (its scalesim/ package; it needs numpy,
absl-py, tqdm and pandas: Debian's python3-numpy, python3-absl, python3-tqdm, python3-pandas). Nothing
of it is copied into tessel: this script runs it and reads its COMPUTE_REPORT.csv. tessel's side is
`tessel hw FILE --matmul M,K,N` on a hardware file with that one array (fill and drain derived from the
array and the dataflow, docs/dataflow-cost.md).
"""
import argparse
import csv
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.path.dirname(HERE)
GEMMS = [(64, 64, 64), (128, 128, 128), (256, 512, 128), (512, 1024, 512), (1, 768, 768), (8, 128, 1000),
         (100, 130, 129), (33, 65, 97), (1024, 64, 64), (64, 1024, 64), (64, 64, 1024), (197, 768, 2304),
         (49, 512, 512), (3136, 64, 256), (12, 4096, 1024), (300, 300, 300)]   # (M, K, N)
ARRAYS = [(32, 32), (128, 128)]
DATAFLOWS = {"ws": "weight_stationary", "os": "output_stationary", "is": "input_stationary"}


def scalesim_cycles(scalesim_dir, R, C, df, work):
    cfg = os.path.join(work, f"{df}_{R}x{C}.cfg")
    with open(cfg, "w") as f:
        f.write(f"""[general]
run_name = tessel_{df}_{R}x{C}

[architecture_presets]
ArrayHeight: {R}
ArrayWidth: {C}
IfmapSramSzkB: 65536
FilterSramSzkB: 65536
OfmapSramSzkB: 65536
IfmapOffset: 0
FilterOffset: 100000000
OfmapOffset: 200000000
Bandwidth : 100000
Dataflow : {df}
MemoryBanks: 1

[run_presets]
InterfaceBandwidth: CALC
""")
    topo = os.path.join(work, "gemms.csv")
    with open(topo, "w") as f:
        f.write("Layer Name, M, N, K,\n")
        for i, (M, K, N) in enumerate(GEMMS):
            f.write(f"g{i}, {M}, {N}, {K},\n")
    logdir = os.path.join(work, "logs")
    env = dict(os.environ, PYTHONPATH=scalesim_dir)
    r = subprocess.run([sys.executable, "-m", "scalesim.scale", "-c", cfg, "-t", topo, "-p", logdir, "-i", "gemm"],
                       cwd=work, env=env, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"SCALE-Sim failed ({df} {R}x{C}):\n{r.stdout[-2000:]}{r.stderr[-2000:]}")
    report = os.path.join(logdir, f"tessel_{df}_{R}x{C}", "COMPUTE_REPORT.csv")
    out = []
    with open(report) as f:
        rows = list(csv.reader(f))
    head = [h.strip() for h in rows[0]]
    total, stall = head.index("Total Cycles"), head.index("Stall Cycles")
    for row in rows[1:]:
        if len(row) > total:
            out.append((float(row[total]), float(row[stall])))
    return out


def tessel_cycles(tessel, R, C, df, work):
    with open(os.path.join(SOURCE, "hw", "tpu-v5e.json")) as f:
        hw = json.load(f)
    m = hw["matrix_unit"]
    m.update(rows=R, cols=C, count=1, macs_per_cycle=R * C, pass_rows=1, dataflow=DATAFLOWS[df])
    m.pop("fill_cycles", None)
    m.pop("drain_cycles", None)
    hw["name"] = f"array-{df}-{R}x{C}"
    path = os.path.join(work, f"{hw['name']}.json")
    with open(path, "w") as f:
        json.dump(hw, f)
    out = []
    for M, K, N in GEMMS:
        r = subprocess.run([tessel, "hw", path, "--matmul", f"{M},{K},{N}"], capture_output=True, text=True, check=True)
        out.append(json.loads(r.stdout)["cycles"])
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scalesim", required=True, help="a scale-sim-v2 checkout")
    ap.add_argument("--tessel", default=os.path.join(SOURCE, "build", "tessel"))
    ap.add_argument("--json")
    a = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="scalesim_") as work:
        for R, C in ARRAYS:
            for df in DATAFLOWS:
                ss = scalesim_cycles(os.path.abspath(a.scalesim), R, C, df, work)
                ts = tessel_cycles(a.tessel, R, C, df, work)
                for (M, K, N), (s, stall), t in zip(GEMMS, ss, ts):
                    rows.append(dict(array=f"{R}x{C}", dataflow=df, M=M, K=K, N=N, scalesim=s, scalesim_stall=stall,
                                     tessel=t, diff=t - s, rel=(t - s) / s))
    print(f"{'array':>8} {'df':>3} {'M':>5} {'K':>5} {'N':>5} {'SCALE-Sim':>11} {'stall':>6} {'tessel':>11} {'diff':>7} {'rel %':>8}")
    for r in rows:
        print(f"{r['array']:>8} {r['dataflow']:>3} {r['M']:>5} {r['K']:>5} {r['N']:>5} {r['scalesim']:>11.0f} "
              f"{r['scalesim_stall']:>6.0f} {r['tessel']:>11.0f} {r['diff']:>7.0f} {100 * r['rel']:>8.3f}")
    for df in DATAFLOWS:
        sel = [r for r in rows if r["dataflow"] == df]
        worst = max(sel, key=lambda r: abs(r["rel"]))
        print(f"{df}: {len(sel)} cases, largest difference {worst['diff']:+.0f} cycles ({100 * worst['rel']:+.3f} %), "
              f"{sum(abs(r['diff']) <= 1 for r in sel)} within one cycle")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
