#!/usr/bin/python3
"""tessel on a busy machine (issue 37): each model's compiled executable and ONNX Runtime, idle and with
one busy-loop process pinned to the last core, in one run.

    /usr/bin/python3 bench/under_load.py MODEL_DIR [MODEL_DIR ...] --threads 2 --turns 8 --json out.json

Three long-lived measuring processes per model (bench/paired.py's Server): tessel with its default
threading (OpenMP regions, oneDNN's own threads), tessel with TESSEL_TEAM=1 (the thread team,
docs/runtime/threads.md) and ONNX Runtime (onnxruntime-node, its own pool). The run alternates phases,
idle, busy, busy, idle, --rounds times (the busy loop started before a busy phase and killed after it), and in each
phase hands the three systems --turns turns of --calls calls, rotating which goes first. Per system: the
median call over the idle phases and over the busy ones, and busy / idle; tessel / ORT under load. The
bar (issue 37): busy / idle <= 1.6 and tessel faster than ORT under the same load.
"""
import argparse
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.path.dirname(HERE)
sys.path.insert(0, HERE)
import peers  # noqa: E402
from paired import Server, each_model, ort_server  # noqa: E402


def busy_loop(core):
    """A process spinning on `core` (what another user's job does to a shared machine)."""
    return subprocess.Popen(["taskset", "-c", str(core), "sh", "-c", "while :; do :; done"])


def measure(model, a, node_modules):
    env_team = dict(os.environ, TESSEL_TEAM="1")
    env_default = {k: v for k, v in os.environ.items() if k != "TESSEL_TEAM"}
    tessel_cmd = [a.tessel, "bench", model, "--serve", "--threads", str(a.threads)]
    servers = []
    try:
        servers.append(Server("tessel", tessel_cmd, env=env_default))
        servers.append(Server("tessel_team", tessel_cmd, env=env_team))
        servers.append(ort_server(model, a.threads, node_modules))
        times = {s.name: {"idle": [], "busy": []} for s in servers}
        core = (os.cpu_count() or 2) - 1
        for phase in ("idle", "busy", "busy", "idle") * a.rounds:
            loop = busy_loop(core) if phase == "busy" else None
            try:
                time.sleep(0.5)
                for t in range(a.turns):
                    k = t % len(servers)
                    for s in servers[k:] + servers[:k]:
                        time.sleep(a.gap)
                        times[s.name][phase] += s.calls(a.calls)
            finally:
                if loop:
                    loop.kill()
                    loop.wait()
        out = {}
        for name, ph in times.items():
            idle, busy = statistics.median(ph["idle"]), statistics.median(ph["busy"])
            out[name] = {"idle_ms": idle, "busy_ms": busy, "busy_over_idle": busy / idle}
        for name in ("tessel", "tessel_team"):
            out[name]["over_ort_busy"] = out[name]["busy_ms"] / out["ort"]["busy_ms"]
            out[name]["over_ort_idle"] = out[name]["idle_ms"] / out["ort"]["idle_ms"]
        out["tessel"]["max_rel_err"] = servers[0].ready.get("max_rel_err")
        out["tessel_team"]["max_rel_err"] = servers[1].ready.get("max_rel_err")
        return out
    finally:
        for s in servers:
            s.close()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("models", nargs="+", help="model-zoo folders (model.onnx + test_data_set_0)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--turns", type=int, default=8, help="turns of each system per phase")
    ap.add_argument("--calls", type=int, default=3, help="calls per turn")
    ap.add_argument("--rounds", type=int, default=2, help="rounds of the phases idle, busy, busy, idle (the busy loop "
                    "restarted for each busy phase: where the scheduler puts it against tessel's threads varies)")
    ap.add_argument("--gap", type=float, default=0.2, help="seconds between turns (ORT's pool spins after a run)")
    ap.add_argument("--tessel", default=os.path.join(SOURCE, "build", "tessel"))
    ap.add_argument("--ort-dir", default=os.environ.get("TESSEL_ORT_DIR", "/tmp/ort"))
    ap.add_argument("--json")
    a = ap.parse_args()
    if a.turns < 1 or a.calls < 1 or a.rounds < 1:
        ap.error("--turns, --calls and --rounds must be at least 1")
    node_modules, why = peers.ensure_ort(a.ort_dir, 900)
    if not node_modules:
        sys.exit(f"under_load: ONNX Runtime unavailable: {why}")
    out = {"threads": a.threads, "turns": a.turns, "calls": a.calls, "rounds": a.rounds, "cores": os.cpu_count(), "ort": peers.ORT_VERSION,
           "started": time.strftime("%Y-%m-%d %H:%M:%S"), "models": {}}
    print(f"{'model':16} {'system':12} {'idle ms':>8} {'busy ms':>8} {'busy/idle':>9} {'/ORT busy':>9}")
    def row(name, r):
        for system, v in r.items():
            ort = f"{v['over_ort_busy']:9.2f}" if "over_ort_busy" in v else f"{'':9}"
            print(f"{name:16} {system:12} {v['idle_ms']:8.2f} {v['busy_ms']:8.2f} {v['busy_over_idle']:9.2f} {ort}",
                  flush=True)
    each_model(a.models, lambda m: measure(m, a, node_modules), row, out, a.json, 16)

if __name__ == "__main__":
    main()
