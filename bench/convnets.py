#!/usr/bin/python3
"""Convolution-heavy models: tessel compiled vs ONNX Runtime 1.30 vs torch eager, interleaved in one run.

    /usr/bin/python3 bench/export_convnets.py /tmp/convnets            # the model folders
    /usr/bin/python3 bench/convnets.py /tmp/convnets/* --threads 2 --rounds 3 --iters 10 --json out.json

Per model: first a correctness check (`tessel run --backend compiled --check` and `--backend eager
--check` against test_data_set_0/output_0.pb, torch's own output, so compiled is compared with eager
through the same reference), then --rounds rounds, each timing, one after the other: tessel compiled
(`tessel bench --backends compiled`), ORT (bench/ort_bench.js, intra-op = --threads) and torch eager (the
torchvision module itself under Debian's torch 1.13, torch.set_num_threads(--threads)). The figure of
each system is the median over rounds of its per-round medians: systems measured in the same minutes
see the same load, which on a shared 2-core machine matters more than anything else. The load average
is recorded before and after. ratio = tessel / ORT (< 1: tessel faster). --passive adds tessel under
OMP_WAIT_POLICY=passive to every round: on a loaded machine libgomp's spinning waits cost tessel far
more than ORT's own thread pool costs ORT.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import peers  # noqa: E402  (run, last_json, ensure_ort)

TORCH_WORKER = r"""
import json, sys, time, statistics
sys.path.insert(0, sys.argv[1])
import torch
import export_convnets
torch.set_num_threads(int(sys.argv[3]))
torch.manual_seed(0)
model, x = export_convnets.build(sys.argv[2])
model.eval()
iters = int(sys.argv[4])
with torch.inference_mode():
    model(x)  # warm-up
    ts = []
    for _ in range(iters):
        t0 = time.perf_counter(); model(x); ts.append((time.perf_counter() - t0) * 1e3)
print(json.dumps({"median_ms": statistics.median(ts), "min_ms": min(ts), "torch": torch.__version__,
                  "threads": torch.get_num_threads()}))
"""


def loadavg():
    return list(os.getloadavg())


def check(tessel, model, backend, threads, max_rel, timeout):
    cmd = [tessel, "run", model, "--backend", backend, "--check", "--max-rel", str(max_rel)]
    if backend == "compiled":
        cmd += ["--threads", str(threads)]
    rc, out, err = peers.run(cmd, timeout)
    lines = [l.strip() for l in (out + err).splitlines() if l.strip().startswith("check output")]
    return {"cmd": " ".join(cmd), "pass": rc == 0, "detail": lines or [peers.tail(err or out)]}


def time_tessel(tessel, model, a, env=None):
    with tempfile.TemporaryDirectory() as td:
        jf = os.path.join(td, "t.json")
        cmd = [tessel, "bench", model, "--backends", "compiled", "--threads", str(a.threads), "--iters",
               str(a.iters), "--json", jf, "--peers", "none"]
        rc, out, err = peers.run(cmd, a.timeout, env=dict(os.environ, **env) if env else None)
        if rc != 0 or not os.path.exists(jf):
            return {"error": peers.tail(err or out)}
        with open(jf) as f:
            raw = json.load(f)
        b = [x for x in raw.get("backends", []) if x.get("backend") == "compiled"][0]
        return {"median_ms": b.get("median_ms"), "cmd": " ".join(cmd)}


def time_torch(name, a):
    cmd = [a.torch_python, "-c", TORCH_WORKER, HERE, name, str(a.threads), str(a.torch_iters or a.iters)]
    env = dict(os.environ, OMP_NUM_THREADS=str(a.threads))
    rc, out, err = peers.run(cmd, a.timeout, env=env)
    res = peers.last_json(out)
    return res if rc == 0 and res else {"error": peers.tail(err or out)}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("models", nargs="+", help="model folders from bench/export_convnets.py")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--torch-iters", type=int, default=0, help="timed torch calls (default: --iters)")
    ap.add_argument("--passive", action="store_true",
                    help="also time tessel under OMP_WAIT_POLICY=passive (column tessel_passive)")
    ap.add_argument("--tessel", default=os.path.join(peers.REPO, "build", "tessel"))
    ap.add_argument("--ort-dir", default=os.environ.get("TESSEL_ORT_DIR", "/tmp/ort"))
    ap.add_argument("--torch-python", default="/usr/bin/python3")
    ap.add_argument("--max-rel", type=float, default=1e-4)
    ap.add_argument("--skip", default="", help="comma list of: check, ort, torch")
    ap.add_argument("--timeout", type=int, default=1200)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    skip = set(filter(None, a.skip.split(",")))
    node_modules, why = peers.ensure_ort(a.ort_dir, a.timeout) if "ort" not in skip else (None, "skipped")
    report = {"date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()), "threads": a.threads,
              "rounds": a.rounds, "iters": a.iters, "ort_skipped": why, "models": {}}
    for model in a.models:
        name = os.path.basename(os.path.normpath(model))
        r = {"load_before": loadavg(), "rounds": []}
        if "check" not in skip:
            r["check"] = {b: check(a.tessel, model, b, a.threads, a.max_rel, a.timeout) for b in ("compiled", "eager")}
        for _ in range(a.rounds):
            row = {"tessel": time_tessel(a.tessel, model, a)}
            if a.passive:  # libgomp's waiting threads sleep instead of spinning (docs/decisions.md)
                row["tessel_passive"] = time_tessel(a.tessel, model, a, {"OMP_WAIT_POLICY": "passive"})
            if node_modules:
                row["ort"] = peers.run_ort(node_modules, model, argparse.Namespace(threads=a.threads, iters=a.iters,
                                                                                   warmup=3, timeout=a.timeout))
            if "torch" not in skip:
                row["torch"] = time_torch(name, a)
            r["rounds"].append(row)
            peers.log(f"[convnets] {name}: " + ", ".join(f"{k} {v.get('median_ms', v.get('error'))}" for k, v in row.items()))
        r["load_after"] = loadavg()
        for sysname in ("tessel", "tessel_passive", "ort", "torch"):
            ms = [row[sysname]["median_ms"] for row in r["rounds"] if sysname in row and "median_ms" in row[sysname]]
            r[sysname + "_ms"] = statistics.median(ms) if ms else None
        if r["tessel_ms"] and r.get("ort_ms"):
            r["ratio"] = r["tessel_ms"] / r["ort_ms"]
        if r.get("tessel_passive_ms") and r.get("ort_ms"):
            r["ratio_passive"] = r["tessel_passive_ms"] / r["ort_ms"]
        report["models"][name] = r
    print(f"{'model':22} {'tessel ms':>10} {'ORT ms':>10} {'ratio':>7} {'torch ms':>10} {'passive ms':>10} {'ratio':>7}"
          f"  check  load")
    for name, r in report["models"].items():
        ok = "-" if "check" not in r else "/".join("ok" if c["pass"] else "FAIL" for c in r["check"].values())
        fmt = lambda v: f"{v:10.2f}" if v else f"{'-':>10}"
        ratio = f"{r['ratio']:7.2f}" if r.get("ratio") else f"{'-':>7}"
        ratio_p = f"{r['ratio_passive']:7.2f}" if r.get("ratio_passive") else f"{'-':>7}"
        print(f"{name:22} {fmt(r['tessel_ms'])} {fmt(r.get('ort_ms'))} {ratio} {fmt(r.get('torch_ms'))} "
              f"{fmt(r.get('tessel_passive_ms'))} {ratio_p}  {ok}  "
              f"{r['load_before'][0]:.1f}->{r['load_after'][0]:.1f}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
