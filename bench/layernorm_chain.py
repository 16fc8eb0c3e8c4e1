"""The simplify pipeline on a long chain (issue 41, case 3): N LayerNormalizations in a row as .tsl, run
through `tessel compile --passes core --time-passes`; the per-pass times (ms) as JSON. The algebraic pass
once forwarded each rewrite's uses over the whole graph (8000 rewrites over 92 000 core nodes: 11 s).

    python3 bench/layernorm_chain.py --tessel build/tessel --sizes 4000,8000 --json out.json
"""
import argparse
import json
import os
import re
import subprocess
import tempfile
import time


def chain(n):
    ones, zeros = ",".join(["1"] * 16), ",".join(["0"] * 16)
    lines = ["graph @chain(%x: f32[4,16]) {", f"  const %s: f32[16] = [{ones}]", f"  const %b: f32[16] = [{zeros}]"]
    prev = "%x"
    for i in range(n):
        lines.append(f'  %y{i}: f32[4,16] = LayerNormalization({prev}, %s, %b) {{axis = -1}} loc("ln{i}")')
        prev = f"%y{i}"
    return "\n".join(lines) + f"\n  return {prev}\n}}\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tessel", default="build/tessel")
    ap.add_argument("--sizes", default="4000,8000")
    ap.add_argument("--json")
    a = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as d:
        for n in (int(s) for s in a.sizes.split(",")):
            path = os.path.join(d, f"ln{n}.tsl")
            with open(path, "w") as f:
                f.write(chain(n))
            t0 = time.perf_counter()
            r = subprocess.run([a.tessel, "compile", path, "--emit", "graph", "--passes", "core", "--time-passes", "-o",
                                os.devnull], capture_output=True, text=True, check=True)
            total = time.perf_counter() - t0
            passes = {m.group(1): float(m.group(2)) for m in re.finditer(r"pass (\S+)\s+([\d.]+) ms", r.stderr)}
            row = dict(layernorms=n, total_s=total, algebraic_ms=passes.get("algebraic"))
            rows.append(row)
            print(f"{n} LayerNorms: {total:.2f} s in all, algebraic {row['algebraic_ms']} ms")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
