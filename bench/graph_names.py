"""Graph construction at scale (issue 41, case 3): N nodes with one name through the Python builder, as an
unrolled Scan or a long LSTM gives the importer. Graph::unique_name probed base_1, base_2, ... from 1 on every
call (quadratic: 40 000 nodes took 237 s); it now resumes where the last probe for that base stopped.
JSON out.

    PYTHONPATH=build/python /usr/bin/python3 bench/graph_names.py --sizes 5000,20000,40000,200000 --json out.json
"""
import argparse
import json
import time

from tessel import _tessel


def build(n):
    b = _tessel.GraphBuilder("g")
    v = b.input("x", "f32", [4])
    t0 = time.perf_counter()
    for _ in range(n):
        v = b.node("Relu", "r", [v], 1, {})[0]
    return time.perf_counter() - t0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="5000,20000,40000,200000")
    ap.add_argument("--json")
    a = ap.parse_args()
    rows = []
    for n in (int(s) for s in a.sizes.split(",")):
        s = build(n)
        rows.append(dict(nodes=n, seconds=s, us_per_node=s / n * 1e6))
        print(f"{n:>8} nodes: {s:.3f} s ({s / n * 1e6:.1f} us per node)")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
