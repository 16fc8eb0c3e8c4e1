#!/usr/bin/python3
"""Where the first call of `tessel.compile` goes, phase by phase, for zoo models (JSON out).

    PYTHONPATH=build/python /usr/bin/python3 bench/first_call.py resnet18 --threads 2 --json out.json
    PYTHONPATH=.pybox/pkg $PY bench/first_call.py transformers:albert,timm:convnext_tiny --threads 8

Models are named as in bench/zoo.py (`family:name`, random weights from their configs). Per model:
  capture   make_fx with functionalization and the value guards (tessel's _capture.capture)
  convert   the FX graph to a tessel graph, parameters as constants, constant computations folded
  compile   the C++ side: passes, fusion, code generation, the C++ compiler, oneDNN setup and weight
            packing (its own breakdown, TESSEL_PROFILE's `profile compile` line, is kept per partition)
  call 1    the first call; call 2 the second (what every later call costs)
and, for comparison, one eager call. The phases are the same functions tessel.compile runs, called one
after the other (tessel.compile itself is timed too: `total`).
"""
import argparse
import contextlib
import io
import json
import os
import re
import sys
import tempfile
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import zoo  # noqa: E402  (model builders)
import tessel  # noqa: E402
from tessel import _compile  # noqa: E402
from tessel import _tessel  # noqa: E402

COMPILE_LINE = re.compile(r"profile compile .*")


@contextlib.contextmanager
def stderr_lines(into):
    """Collects what the C++ side writes to fd 2 (the `profile compile` lines) while the block runs."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile(mode="w+b") as tmp:
        os.dup2(tmp.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            tmp.seek(0)
            into.extend(tmp.read().decode(errors="replace").splitlines())


def seconds(fn):
    t0 = time.perf_counter()
    out = fn()
    return out, round(time.perf_counter() - t0, 3)


def phases(model, ins, threads):
    r = {}
    with torch.no_grad():
        _, r["eager_call_s"] = seconds(lambda: model(*ins))
        tensors, sig = _compile._split_call(tuple(ins), {})
        call = _compile._call_builder(sig)
        captured, r["capture_s"] = seconds(lambda: _compile.capture(model, tensors, (), call))
        (captured, conv, _, _), r["convert_s"] = seconds(
            lambda: _compile._convert(model, tensors, True, "first_call", (), captured, call))
        lines = []
        os.environ["TESSEL_PROFILE"] = "1"
        try:
            with stderr_lines(lines):
                exe, r["compile_s"] = seconds(lambda: _tessel.Executable(conv.builder, "compiled", threads))
        finally:
            del os.environ["TESSEL_PROFILE"]
        r["cxx_breakdown"] = [m.group(0) for m in map(COMPILE_LINE.search, lines) if m]
        del exe
        t0 = time.perf_counter()
        fast = tessel.compile(model, ins, threads=threads)
        r["tessel_compile_s"] = round(time.perf_counter() - t0, 3)
        _, r["call1_s"] = seconds(lambda: fast(*ins))
        _, r["call2_s"] = seconds(lambda: fast(*ins))
        r["total_s"] = round(r["tessel_compile_s"] + r["call1_s"], 3)
    return r


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("models", help="comma-separated zoo names (bench/zoo.py)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--small", action="store_true", help="the zoo's small inputs")
    ap.add_argument("--json")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    recs = []
    for fam, name in zoo.resolve(a.models):
        built = zoo.build(fam, name, a.small)
        rec = dict(model=f"{fam}:{name}", threads=a.threads, torch=torch.__version__)
        if isinstance(built, zoo.Skip):
            rec["skipped"] = built.reason
        else:
            model, ins = built
            zoo.no_zero_weights(model)
            try:
                rec.update(phases(model, ins, a.threads))
            except Exception as e:  # noqa: BLE001 -- one model's failure is its record
                rec["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"
        print(json.dumps(rec), flush=True)
        recs.append(rec)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(recs, f, indent=1)


if __name__ == "__main__":
    main()
