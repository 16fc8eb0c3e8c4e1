#!/usr/bin/python3
"""tessel against its peers on the same models, same threads, in one run.

    /usr/bin/python3 bench/peers.py MODEL_DIR [MODEL_DIR...] --threads 2 --iters 30 \
        --tessel build/tessel --json out.json

For each model folder (model.onnx + test_data_set_0/input_N.pb, output_N.pb), one after the other:
  tessel  `tessel bench MODEL --backends ... --iters N --json F` (every backend its --help lists;
          --threads T when it has that flag)
  ORT     ONNX Runtime 1.30 (npm onnxruntime-node, CPU) through bench/ort_bench.js: intra-op T, inter-op 1
  torch   PyTorch eager through bench/onnx_torch.py under --torch-python (Debian's torch 1.13):
          torch.set_num_threads(T); the ONNX graph run op by op with torch, plus a native nn.Module
          for the transformer-block models
ORT and torch check their outputs against output_N.pb (max abs error in the table). A peer that cannot
run (no node/npm, no torch, no tessel) is reported as skipped with the reason. This script itself
needs only the Python standard library.
"""
import argparse
import datetime
import glob
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
ORT_VERSION = "1.30.0"
CACHE = os.path.join(os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "tessel", "peers")
OPENBLAS_PKG = "libopenblas0-openmp"  # shares torch's OpenMP pool, so set_num_threads governs both


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def tail(s, n=400):
    s = (s or "").strip()
    return s if len(s) <= n else "..." + s[-n:]


def run(cmd, timeout, env=None, cwd=None):
    """(returncode, stdout, stderr); returncode None when the command could not run or timed out."""
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, cwd=cwd)
        return p.returncode, p.stdout, p.stderr
    except subprocess.TimeoutExpired as e:
        return None, e.stdout or "", f"timed out after {timeout} s"
    except OSError as e:
        return None, "", str(e)


def last_json(text):
    for line in reversed((text or "").strip().splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                return json.loads(line)
            except ValueError:
                pass
    return None


# ---------------------------------------------------------------- tessel
def tessel_caps(tessel):
    rc, out, err = run([tessel, "bench", "--help"], 60)
    if rc is None or rc != 0:
        return None, f"`{tessel} bench --help` failed: {tail(err or out)}"
    text = out + err
    m = re.search(r"--backends\s+\S+\s+(.*)", text)
    backends = []
    if m and ":" in m.group(1):  # "comma list of backends: eager, graph, compiled (...)"
        for part in m.group(1).split(":", 1)[1].split(","):
            w = re.match(r"\s*([A-Za-z][\w-]*)", part)
            if w:
                backends.append(w.group(1))
    if not backends:
        backends = ["eager", "graph"]
    return {"backends": backends, "threads_flag": "--threads" in text, "peers_flag": "--peers" in text, "help": text}, None


def tessel_once(tessel, caps, model, backends, a):
    with tempfile.TemporaryDirectory() as td:
        jf = os.path.join(td, "tessel.json")
        cmd = [tessel, "bench", model, "--backends", ",".join(backends), "--iters", str(a.iters), "--json", jf]
        if caps["threads_flag"] and "compiled" in backends:  # tessel refuses --threads without a backend using it
            cmd += ["--threads", str(a.threads)]
        if caps.get("peers_flag"):    # this script runs the peers itself
            cmd += ["--peers", "none"]
        rc, out, err = run(cmd, a.timeout)
        if rc != 0 or not os.path.exists(jf):
            return " ".join(cmd), None, f"exit {rc}: {tail(err or out)}"
        with open(jf) as f:
            return " ".join(cmd), json.load(f), None


def run_tessel(tessel, caps, model, a):
    """All backends in one `tessel bench`; if that fails, each backend alone, so one broken backend
    does not hide the others (its error is kept in backend_errors)."""
    backends = a.tessel_backends.split(",") if a.tessel_backends else caps["backends"]
    cmd, raw, err = tessel_once(tessel, caps, model, backends, a)
    res = {"cmd": cmd, "threads": a.threads if caps["threads_flag"] else None, "backends": {}}
    if raw is not None:
        res["raw"] = [raw]
        res["backends"] = {b["backend"]: b for b in raw.get("backends", [])}
        return res
    if len(backends) == 1:
        res["backend_errors"] = {backends[0]: err}
        res["error"] = err
        return res
    res["raw"], res["backend_errors"] = [], {}
    for b in backends:
        cmd, raw, err = tessel_once(tessel, caps, model, [b], a)
        if raw is None:
            res["backend_errors"][b] = err
        else:
            res["raw"].append(raw)
            res["backends"].update({r["backend"]: r for r in raw.get("backends", [])})
    if not res["backends"]:
        res["error"] = "; ".join(f"{b}: {e}" for b, e in res["backend_errors"].items())
    return res


# ---------------------------------------------------------------- ONNX Runtime
def ensure_ort(ort_dir, timeout):
    """(node_modules dir, None) or (None, why skipped). Installs onnxruntime-node into ort_dir if missing."""
    pkg = os.path.join(ort_dir, "node_modules", "onnxruntime-node", "package.json")
    have = None
    if os.path.exists(pkg):
        with open(pkg) as f:
            have = json.load(f).get("version")
    if not shutil.which("node"):
        return None, "node not found on PATH (install nodejs)"
    if have == ORT_VERSION:
        return os.path.join(ort_dir, "node_modules"), None
    if not shutil.which("npm"):
        return None, (f"npm not found on PATH and {ort_dir} has no onnxruntime-node {ORT_VERSION} "
                      f"(install npm, or point --ort-dir / TESSEL_ORT_DIR at a folder that has it)")
    log(f"[peers] installing onnxruntime-node@{ORT_VERSION} into {ort_dir} (npm, --ignore-scripts)")
    os.makedirs(ort_dir, exist_ok=True)
    if not os.path.exists(os.path.join(ort_dir, "package.json")):
        with open(os.path.join(ort_dir, "package.json"), "w") as f:
            json.dump({"name": "tessel-peers-ort", "version": "1.0.0", "private": True}, f)
    rc, out, err = run(["npm", "install", "--ignore-scripts", "--no-audit", "--no-fund",
                        f"onnxruntime-node@{ORT_VERSION}"], timeout, cwd=ort_dir)
    if rc != 0 or not os.path.exists(pkg):
        return None, f"npm install onnxruntime-node@{ORT_VERSION} failed (exit {rc}): {tail(err or out)}"
    return os.path.join(ort_dir, "node_modules"), None


def run_ort(node_modules, model, a):
    env = dict(os.environ, NODE_PATH=node_modules)
    cmd = ["node", os.path.join(HERE, "ort_bench.js"), model, "--threads", str(a.threads),
           "--iters", str(a.iters), "--warmup", str(a.warmup)]
    rc, out, err = run(cmd, a.timeout, env=env)
    res = last_json(out)
    if rc != 0 or not res or "error" in res:
        return {"error": (res or {}).get("error") or f"exit {rc}: {tail(err or out)}"}
    return res


# ---------------------------------------------------------------- PyTorch
PROBE = r"""
import json, os, sys
try:
    import torch, onnx
except ImportError as e:
    print(json.dumps({"error": "%s: %s" % (sys.executable, e)})); sys.exit(0)
torch.set_num_threads(2)
a = torch.ones(64, 64); (a @ a).sum().item()
libs = set()
for line in open("/proc/self/maps"):
    p = line.split()[-1]
    if p.startswith("/") and ("blas" in os.path.basename(p) or "lapack" in os.path.basename(p)):
        libs.add(os.path.realpath(p))
print(json.dumps({"torch": torch.__version__, "onnx": onnx.__version__, "blas": sorted(libs)}))
"""


def torch_env(a, blas_dir):
    env = dict(os.environ)
    env.setdefault("OPENBLAS_CORETYPE", "SkylakeX")  # OpenBLAS 0.3.21 misdetects Zen 5
    env["OMP_NUM_THREADS"] = str(a.threads)
    env["OPENBLAS_NUM_THREADS"] = str(a.threads)
    if blas_dir:
        env["LD_LIBRARY_PATH"] = blas_dir + (":" + env["LD_LIBRARY_PATH"] if env.get("LD_LIBRARY_PATH") else "")
    return env


def probe_torch(a, blas_dir):
    rc, out, err = run([a.torch_python, "-c", PROBE], 300, env=torch_env(a, blas_dir))
    res = last_json(out)
    if rc is None or res is None:
        return {"error": f"{a.torch_python}: {tail(err or out) or 'no output'}"}
    return res


def is_reference_blas(libs):
    return any(os.path.basename(p).startswith("libblas.so") and "openblas" not in p and "/blas/" in p for p in libs)


def openblas_dir(root):
    hits = glob.glob(os.path.join(root, "usr", "lib", "*", "openblas-*", "libblas.so.3"))
    return os.path.dirname(hits[0]) if hits else None


def ensure_openblas(root, timeout):
    """Unpacks Debian's OpenBLAS into root (no system change; used through LD_LIBRARY_PATH by the torch run)."""
    d = openblas_dir(root)
    if d:
        return d, None
    if not (shutil.which("apt-get") and shutil.which("dpkg-deb")):
        return None, "apt-get/dpkg-deb not found"
    log(f"[peers] torch links the reference (netlib) BLAS; fetching {OPENBLAS_PKG} into {root} (apt-get download)")
    os.makedirs(root, exist_ok=True)
    rc, out, err = run(["apt-get", "download", OPENBLAS_PKG], timeout, cwd=root)
    debs = glob.glob(os.path.join(root, OPENBLAS_PKG + "_*.deb"))
    if not debs:
        return None, f"apt-get download {OPENBLAS_PKG} failed (exit {rc}): {tail(err or out)}"
    rc, out, err = run(["dpkg-deb", "-x", debs[0], root], timeout)
    d = openblas_dir(root)
    if not d:
        return None, f"dpkg-deb -x {debs[0]} failed: {tail(err or out)}"
    return d, None


def setup_torch(a):
    """(blas_dir or None, probe info, skip reason or None)."""
    if not os.path.exists(a.torch_python):
        return None, {}, f"{a.torch_python} not found"
    info = probe_torch(a, None)
    if "error" in info:
        return None, info, f"torch/onnx not importable under {a.torch_python} ({info['error']}; " \
                           f"apt-get install python3-torch python3-onnx)"
    info["system_blas"] = info["blas"]
    blas_dir = None
    if a.torch_blas == "system":
        return None, info, None
    if a.torch_blas != "auto":
        blas_dir = a.torch_blas
    elif is_reference_blas(info["blas"]):
        blas_dir, why = ensure_openblas(os.path.join(a.cache, "openblas"), a.timeout)
        if not blas_dir:
            info["blas_note"] = f"OpenBLAS unavailable ({why}); torch runs on the reference BLAS"
            return None, info, None
    else:
        return None, info, None
    probe = probe_torch(a, blas_dir)
    if "error" in probe or not any("openblas" in p for p in probe.get("blas", [])):
        info["blas_note"] = f"{blas_dir} did not load ({probe}); torch runs on the system BLAS"
        return None, info, None
    info["blas"] = probe["blas"]
    info["blas_note"] = f"system libblas is the netlib reference; torch run with OpenBLAS from {blas_dir}"
    return blas_dir, info, None


def run_torch(a, blas_dir, model):
    cmd = [a.torch_python, os.path.join(HERE, "onnx_torch.py"), model, "--threads", str(a.threads),
           "--iters", str(a.iters), "--warmup", str(a.warmup), "--json"]
    rc, out, err = run(cmd, a.timeout, env=torch_env(a, blas_dir))
    res = last_json(out)
    if rc != 0 or not res or "error" in res:
        return {"error": (res or {}).get("error") or f"exit {rc}: {tail(err or out)}"}
    return res


# ---------------------------------------------------------------- report
def merge_rounds(rs):
    """One result from several rounds of the same peer: the median of each figure, the worst error."""
    ok = [r for r in rs if "error" not in r and "skipped" not in r]
    if not ok:
        return rs[0]
    if len(ok) == 1:
        return ok[0]

    def merge(vals):
        first = vals[0]
        if isinstance(first, dict):
            return {k: merge([v[k] for v in vals if isinstance(v, dict) and k in v]) for k in first}
        if isinstance(first, (int, float)) and not isinstance(first, bool):
            nums = sorted(v for v in vals if isinstance(v, (int, float)) and v is not None)
            return nums[(len(nums) - 1) // 2]  # the lower median for an even count: interference only adds time
        return first
    out = merge(ok)
    for r in ok:  # max_abs_err: the worst round, not the median
        for key in ("max_abs_err",):
            if key in r and r[key] is not None:
                out[key] = max(out.get(key) or 0.0, r[key])
    return out


def fmt(v, w=8, p=2):
    if v is None:
        return "-".rjust(w)
    if isinstance(v, str):
        return v.rjust(w)
    return f"{v:.{p}f}".rjust(w) if v < 1000 else f"{v:.0f}".rjust(w)


def fmt_err(v):
    return "-" if v is None else f"{v:.0e}"


def loadavg():
    try:
        return list(os.getloadavg())
    except OSError:
        return None


def cpu_name():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("models", nargs="+", help="model folders (model.onnx + test_data_set_0)")
    ap.add_argument("--threads", type=int, default=2, help="intra-op threads for every system (default 2)")
    ap.add_argument("--iters", type=int, default=30, help="timed calls per system and model (default 30)")
    ap.add_argument("--warmup", type=int, default=5, help="untimed calls before timing, ORT and torch (default 5)")
    ap.add_argument("--tessel", default=os.path.join(REPO, "build", "tessel"), help="the tessel binary")
    ap.add_argument("--tessel-backends", default=None,
                    help="comma list passed to tessel bench --backends (default: every backend its --help lists)")
    ap.add_argument("--json", default=None, help="write all figures to this JSON file")
    ap.add_argument("--cache", default=os.environ.get("TESSEL_PEERS_CACHE", CACHE),
                    help=f"where peers are installed (default $TESSEL_PEERS_CACHE or {CACHE})")
    ap.add_argument("--ort-dir", default=None,
                    help="folder holding node_modules/onnxruntime-node (default $TESSEL_ORT_DIR or CACHE/ort)")
    ap.add_argument("--torch-python", default="/usr/bin/python3", help="a python with torch (default /usr/bin/python3)")
    ap.add_argument("--torch-blas", default="auto",
                    help="auto: if torch links the netlib reference BLAS, run it with Debian's OpenBLAS unpacked "
                         "into CACHE/openblas; system: as installed; or a folder holding libblas.so.3")
    ap.add_argument("--rounds", type=int, default=1,
                    help="run the peers of each model this many times, interleaved, and report the median of "
                         "the rounds' medians (for noisy shared machines; default 1)")
    ap.add_argument("--skip", default="", help="comma list of peers to leave out: tessel, ort, torch")
    ap.add_argument("--timeout", type=int, default=1200, help="seconds per peer and model (default 1200)")
    a = ap.parse_args()
    a.ort_dir = a.ort_dir or os.environ.get("TESSEL_ORT_DIR") or os.path.join(a.cache, "ort")
    skip = {s.strip() for s in a.skip.split(",") if s.strip()}

    models = []
    for m in a.models:
        m = m.rstrip("/")
        if not os.path.exists(os.path.join(m, "model.onnx")):
            sys.exit(f"peers.py: {m} has no model.onnx")
        models.append(m)

    report = {"date": datetime.datetime.now().isoformat(timespec="seconds"), "host": platform.node(),
              "cpu": cpu_name(), "cpus": os.cpu_count(), "threads": a.threads, "iters": a.iters,
              "warmup": a.warmup, "rounds": a.rounds, "loadavg_start": loadavg(), "peers": {}, "models": []}

    # --- set up each peer once
    tessel = None
    if "tessel" in skip:
        report["peers"]["tessel"] = {"skipped": "--skip"}
    else:
        t = a.tessel if os.path.exists(a.tessel) else shutil.which(a.tessel)
        if not t or not os.access(t, os.X_OK):
            report["peers"]["tessel"] = {"skipped": f"tessel binary {a.tessel} not found (build it: ./dev build)"}
        else:
            caps, why = tessel_caps(t)
            if caps is None:
                report["peers"]["tessel"] = {"skipped": why}
            else:
                tessel = t
                report["peers"]["tessel"] = {"binary": os.path.abspath(t), "backends": caps["backends"],
                                             "threads_flag": caps["threads_flag"],
                                             "binary_mtime": datetime.datetime.fromtimestamp(
                                                 os.path.getmtime(t)).isoformat(timespec="seconds")}
                if not caps["threads_flag"]:
                    report["peers"]["tessel"]["note"] = "tessel bench has no --threads: its own default is used"
    node_modules = None
    if "ort" in skip:
        report["peers"]["ort"] = {"skipped": "--skip"}
    else:
        node_modules, why = ensure_ort(a.ort_dir, a.timeout)
        report["peers"]["ort"] = {"skipped": why} if why else {"version": ORT_VERSION, "node_modules": node_modules}
    blas_dir, torch_ok = None, False
    if "torch" in skip:
        report["peers"]["torch"] = {"skipped": "--skip"}
    else:
        blas_dir, info, why = setup_torch(a)
        report["peers"]["torch"] = dict(info, python=a.torch_python, **({"skipped": why} if why else {}))
        torch_ok = why is None
    for k, v in report["peers"].items():
        log(f"[peers] {k}: " + (f"SKIPPED: {v['skipped']}" if "skipped" in v else json.dumps(v)[:300]))

    # --- every peer on each model, back to back
    for m in models:
        name = os.path.basename(m)
        row = {"model": name, "path": os.path.abspath(m)}
        rounds = {"tessel": [], "ort": [], "torch": []}
        for k in range(a.rounds):
            rn = f" (round {k + 1}/{a.rounds})" if a.rounds > 1 else ""
            log(f"[peers] {name}: tessel{rn}")
            rounds["tessel"].append(run_tessel(tessel, caps, m, a) if tessel
                                    else {"skipped": report["peers"]["tessel"]["skipped"]})
            log(f"[peers] {name}: onnxruntime{rn}")
            rounds["ort"].append(run_ort(node_modules, m, a) if node_modules
                                 else {"skipped": report["peers"]["ort"]["skipped"]})
            log(f"[peers] {name}: torch{rn}")
            rounds["torch"].append(run_torch(a, blas_dir, m) if torch_ok
                                   else {"skipped": report["peers"]["torch"]["skipped"]})
        for k, rs in rounds.items():
            row[k] = dict(merge_rounds(rs))
            if a.rounds > 1:
                row[k]["rounds"] = rs

        tb = row["tessel"].get("backends", {})
        best = next((b for b in ("compiled", "graph") if b in tb), None)
        ort_ms = row["ort"].get("median_ms")
        te = row["torch"].get("onnx_eager") or {}
        tn = row["torch"].get("native_block") or {}
        torch_ms = min([v for v in (te.get("median_ms"), tn.get("median_ms")) if v is not None], default=None)
        row["headline_backend"] = best
        row["ratios"] = {}
        for b, r in tb.items():
            ms = r.get("median_ms")
            if ms:
                row["ratios"][b] = {"vs_ort": ms / ort_ms if ort_ms else None,
                                    "vs_torch": ms / torch_ms if torch_ms else None}
        report["models"].append(row)
    report["loadavg_end"] = loadavg()
    if tessel:
        end = datetime.datetime.fromtimestamp(os.path.getmtime(tessel)).isoformat(timespec="seconds")
        if end != report["peers"]["tessel"]["binary_mtime"]:
            report["peers"]["tessel"]["warning"] = f"{tessel} was rebuilt during the run (now {end}): " \
                                                   "its figures mix two binaries"

    print_table(report)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(report, f, indent=1)
        print(f"\nwrote {a.json}")
    return 0


def print_table(report):
    rows = report["models"]
    backends = []
    for r in rows:
        for b in list(r["tessel"].get("backends", {})) + list(r["tessel"].get("backend_errors", {})):
            if b not in backends:
                backends.append(b)
    order = {"eager": 0, "graph": 1, "compiled": 2}
    backends.sort(key=lambda b: order.get(b, 3))
    p = report["peers"]
    print(f"\n{report['date']}  {report['cpu']} ({report['cpus']} cpus)  threads={report['threads']}  "
          f"iters={report['iters']} rounds={report['rounds']}  loadavg start {fmt_load(report['loadavg_start'])} end {fmt_load(report['loadavg_end'])}")
    for k in ("tessel", "ort", "torch"):
        v = p.get(k, {})
        if "skipped" in v:
            print(f"  {k}: SKIPPED ({v['skipped']})")
    t = p.get("tessel", {})
    if "binary" in t:
        print(f"  tessel {t['binary']} (built {t['binary_mtime']})" + (f"  WARNING: {t['warning']}" if t.get("warning") else "") +
              (f"  note: {t['note']}" if t.get("note") else ""))
    if "torch" in p and "torch" in p["torch"]:
        blas = [os.path.basename(x) for x in p["torch"].get("blas", [])]
        print(f"  torch {p['torch']['torch']} BLAS {', '.join(blas)}" +
              (f" -- {p['torch']['blas_note']}" if p["torch"].get("blas_note") else ""))
    print("  medians in ms; ratio = tessel / peer (< 1: tessel faster); torch = the faster of ONNX-eager and native")
    head = f"{'model':<16}" + "".join(f"{'t.' + b:>11}" for b in backends) + \
        f"{'ORT':>9}{'create':>8}{'torch':>9}{'native':>9}{'/ORT':>7}{'/torch':>8}  {'err ORT':>7} {'torch':>6}"
    print(head)
    print("-" * len(head))
    for r in rows:
        tb = r["tessel"].get("backends", {})
        be = r["tessel"].get("backend_errors", {})
        line = f"{r['model']:<16}" + "".join(
            "FAIL".rjust(11) if b in be and b not in tb else fmt((tb.get(b) or {}).get("median_ms"), 11)
            for b in backends)
        o, t = r["ort"], r["torch"]
        te, tn = t.get("onnx_eager") or {}, t.get("native_block") or {}
        line += fmt(o.get("median_ms"), 9) + fmt(o.get("create_ms"), 8, 0)
        line += fmt(te.get("median_ms"), 9) + fmt(tn.get("median_ms"), 9)
        rt = r["ratios"].get(r["headline_backend"] or "", {})
        line += fmt(rt.get("vs_ort"), 7) + fmt(rt.get("vs_torch"), 8)
        line += f"  {fmt_err(o.get('max_abs_err')):>7} {fmt_err(max([v for v in (te.get('max_abs_err'), tn.get('max_abs_err')) if v is not None], default=None)):>6}"
        print(line)
        for b, e in r["tessel"].get("backend_errors", {}).items():
            if b not in tb:
                print(f"    tessel {b} failed: {first_error(e)}")
        for k in ("ort", "torch"):
            if "error" in r[k]:
                print(f"    {k} failed: {first_error(r[k]['error'])}")
    hb = {r["headline_backend"] for r in rows if r["headline_backend"]}
    if hb:
        print(f"  ratios use tessel backend: {', '.join(sorted(hb))}")


def first_error(e):
    """The most telling line of an error text, short enough for the table."""
    lines = [x.strip() for x in (e or "").splitlines() if x.strip()]
    pick = next((x for x in lines if "error" in x.lower()), lines[0] if lines else "")
    return pick[:160]


def fmt_load(l):
    return "-" if not l else "/".join(f"{x:.1f}" for x in l)


if __name__ == "__main__":
    sys.exit(main())
