#!/usr/bin/python3
"""tessel compiled vs ONNX Runtime, alternated call by call: a paired comparison that a shared machine's
changing speed cannot tilt.

    /usr/bin/python3 bench/paired.py MODEL_DIR [MODEL_DIR ...] --threads 2 --pairs 20 --calls 3 --json out.json

On this 2-core machine the speed of the same binary moves by up to 2x from minute to minute (a slow mode
that lasts seconds; docs/BENCHMARKS.md, "Fifth session"), so two systems timed one after the other, each
for a while, can swap places by chance. Here both stay loaded in their own processes for the whole run
(`tessel bench MODEL --serve`, `node bench/ort_bench.js MODEL --serve`), each checked against the model's
reference outputs first, and the harness hands them turns of --calls calls each, alternating which goes
first (ABBA), --pairs times. A pair's ratio is tessel's median over ORT's median in that pair: both saw the
machine within the same few tens of milliseconds. The figure per model is the median of the pair ratios
(< 1: tessel faster) with the share of pairs tessel won, beside each system's overall median and minimum.
Both use --threads intra-op threads. --gap (default 0.2 s) sleeps between turns: ORT's pool spins for tens
of milliseconds after a run, and with 20 ms the next turn (tessel's) lost up to half its CPU for its first
calls (docs/BENCHMARKS.md, "Sixth session").
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.path.dirname(HERE)
sys.path.insert(0, HERE)
import peers  # noqa: E402  (ensure_ort)


class Server:
    """A long-lived measuring process: answers each count N on stdin with one JSON line of N call times."""

    def __init__(self, name, cmd, env=None, timeout=600):
        self.name = name
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True, env=env)
        self.ready = self._answer(timeout)
        if "ready" not in self.ready:
            raise RuntimeError(f"{name}: {self.ready.get('error') or self.ready}")

    def _answer(self, timeout):
        line = self.proc.stdout.readline()
        if not line:
            err = self.proc.stderr.read()
            return {"error": f"exited ({self.proc.wait()}): {err.strip()[-400:]}"}
        return json.loads(line)

    def calls(self, n):
        self.proc.stdin.write(f"{n}\n")
        self.proc.stdin.flush()
        r = self._answer(600)
        if "ms" not in r:
            raise RuntimeError(f"{self.name}: {r}")
        return r["ms"]

    def close(self):
        try:
            self.proc.stdin.close()
            self.proc.wait(timeout=30)
        except Exception:
            self.proc.kill()


def ort_server(model, threads, node_modules, name="ort"):
    """ONNX Runtime (onnxruntime-node) serving `model` with `threads` intra-op threads."""
    return Server(name, ["node", os.path.join(HERE, "ort_bench.js"), model, "--serve", "--threads", str(threads),
                         "--warmup", "5"], env=dict(os.environ, NODE_PATH=node_modules))


def compare(model, a, node_modules):
    tessel = Server("tessel", [a.tessel, "bench", model, "--serve", "--threads", str(a.threads)])
    try:
        ort = ort_server(model, a.threads, node_modules)
    except Exception:
        tessel.close()
        raise
    try:
        pairs, t_all, o_all = [], [], []
        load0 = list(os.getloadavg())
        for p in range(a.pairs):
            order = (tessel, ort) if p % 2 == 0 else (ort, tessel)
            got = {}
            for s in order:
                time.sleep(a.gap)
                got[s.name] = s.calls(a.calls)
            tm, om = statistics.median(got["tessel"]), statistics.median(got["ort"])
            t_all += got["tessel"]
            o_all += got["ort"]
            pairs.append(tm / om)
        return {
            "ratio_median": statistics.median(pairs),
            "tessel_won_share": sum(r < 1 for r in pairs) / len(pairs),
            "ratio_quartiles": statistics.quantiles(pairs, n=4) if len(pairs) > 1 else pairs,
            "tessel": {"median_ms": statistics.median(t_all), "min_ms": min(t_all), "max_rel_err": tessel.ready["max_rel_err"],
                       "threads": tessel.ready["threads"]},
            "ort": {"median_ms": statistics.median(o_all), "min_ms": min(o_all), "max_abs_err": ort.ready.get("max_abs_err"),
                    "threads": ort.ready.get("threads")},
            "pairs": pairs, "load_before": load0, "load_after": list(os.getloadavg()),
        }
    finally:
        tessel.close()
        ort.close()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("models", nargs="+", help="model-zoo folders (model.onnx + test_data_set_0)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--pairs", type=int, default=40)
    ap.add_argument("--calls", type=int, default=3, help="calls per turn")
    ap.add_argument("--gap", type=float, default=0.2, help="seconds between turns (ORT's pool spins for tens of ms after a run)")
    ap.add_argument("--tessel", default=os.path.join(SOURCE, "build", "tessel"))
    ap.add_argument("--ort-dir", default=os.environ.get("TESSEL_ORT_DIR", "/tmp/ort"))
    ap.add_argument("--json")
    a = ap.parse_args()
    if a.pairs < 1 or a.calls < 1:
        ap.error("--pairs and --calls must be at least 1")
    node_modules, why = peers.ensure_ort(a.ort_dir, 900)
    if not node_modules:
        sys.exit(f"paired: ONNX Runtime unavailable: {why}")
    out = {"threads": a.threads, "pairs": a.pairs, "calls": a.calls, "tessel": a.tessel, "ort": peers.ORT_VERSION,
           "started": time.strftime("%Y-%m-%d %H:%M:%S"), "models": {}}
    print(f"{'model':22} {'tessel ms':>10} {'ORT ms':>10} {'ratio':>7} {'won':>5}  (ratio: median of pair ratios, tessel/ORT)")
    def row(name, r):
        print(f"{name:22} {r['tessel']['median_ms']:10.2f} {r['ort']['median_ms']:10.2f} {r['ratio_median']:7.3f} "
              f"{r['tessel_won_share']:5.0%}", flush=True)
    each_model(a.models, lambda m: compare(m, a, node_modules), row, out, a.json, 22)
    done = [r for r in out["models"].values() if "ratio_median" in r]
    print(f"tessel faster (median pair ratio < 1) on {sum(r['ratio_median'] < 1 for r in done)} of {len(out['models'])}")


def each_model(models, measure, row, out, json_path, width):
    """measure(model folder) for each model into out["models"][name], printing row(name, result) or the
    error (one model's failure is reported, the rest still run); out is written to json_path after each
    model, so a run cut short keeps what it measured."""
    for m in models:
        name = os.path.basename(os.path.normpath(m))
        try:
            r = measure(m)
        except Exception as e:  # noqa: BLE001 -- the failure is the model's entry
            r = {"error": str(e)}
            print(f"{name:{width}} error: {e}", flush=True)
        else:
            row(name, r)
        out["models"][name] = r
        if json_path:
            with open(json_path, "w") as f:
                json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
