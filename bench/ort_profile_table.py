#!/usr/bin/python3
"""Per-node time of ONNX Runtime on one model, side by side with tessel's per-kernel time.

    NODE_PATH=/tmp/ort/node_modules node bench/ort_bench.js MODEL --threads 2 --iters 20 --profile /tmp/ortprof
    TESSEL_PROFILE=1 build/tessel bench MODEL --backends compiled --threads 2 --iters 20 2> /tmp/tprof.txt
    python3 bench/ort_profile_table.py /tmp/ortprof_<date>.json [--tessel /tmp/tprof.txt] [--top 30]

ORT's profile (a Chrome trace) has one `Node` event per node and run; the first run is dropped (warm-up)
and each node's figure is its median over the others. Convolutions (and Gemm/MatMul) are keyed by their
operand shapes, "[1x16x112x112]*[64x16x1x1]", the form of tessel's TESSEL_PROFILE `library` lines, so
--tessel pairs ORT's fused Conv(+activation) with tessel's whole kernel (library call + epilogue) of the
same place in the model (the k-th convolution of each, when both have as many; else by shape, summed
over occurrences): the rows where one runtime's convolution loses to the other's.
"""
import argparse
import collections
import json
import re
import statistics


def shape_key(args):
    shapes = [next(iter(s.values())) for s in args.get("input_type_shape", [])]
    if len(shapes) < 2:
        return None
    x, w = shapes[0], shapes[1]
    return "[" + "x".join(map(str, x)) + "]*[" + "x".join(map(str, w)) + "]"


def ort_nodes(path):
    """{node: (op, key, [dur ms per run])} in execution order."""
    events = json.load(open(path))
    nodes = collections.OrderedDict()
    for e in events:
        if e.get("cat") != "Node" or not e["name"].endswith("_kernel_time"):
            continue
        name = e["name"][: -len("_kernel_time")]
        op = e["args"].get("op_name", "?")
        key = shape_key(e["args"]) if op in ("Conv", "FusedConv", "Gemm", "MatMul", "FusedGemm") else None
        nodes.setdefault(name, (op, key, []))[2].append(e["dur"] / 1000.0)
    return nodes


def tessel_kernels(path):
    """{node: (op, key, [ms per call])}: key from the `library` line before a kernel's step line."""
    line = re.compile(r"profile\s+([\d.]+) ms\s+(\S+) (.*)")
    out = collections.OrderedDict()
    lib = None
    for text in open(path):
        m = line.match(text)
        if not m:
            continue
        ms, op, rest = float(m.group(1)), m.group(2), m.group(3).strip()
        if op == "library":
            lib = rest.split(" ")[0]
            continue
        out.setdefault(rest, (op, lib if op == "kernel" else None, []))[2].append(ms)
        lib = None
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("ort_profile")
    ap.add_argument("--tessel", help="TESSEL_PROFILE=1 stderr of `tessel bench` on the same model")
    ap.add_argument("--top", type=int, default=30)
    a = ap.parse_args()
    ort = ort_nodes(a.ort_profile)
    med = {n: statistics.median(v[2][1:] or v[2]) for n, v in ort.items()}
    per_op = collections.Counter()
    for n, (op, _, _) in ort.items():
        per_op[op] += med[n]
    print(f"ORT: sum of node medians {sum(med.values()):.3f} ms over {len(ort)} nodes")
    print("per op: " + ", ".join(f"{op} {t:.3f}" for op, t in per_op.most_common()))
    if not a.tessel:
        for n in sorted(med, key=med.get, reverse=True)[: a.top]:
            print(f"  {med[n]:8.3f} ms  {ort[n][0]:10s} {ort[n][1] or ''} {n}")
        return
    tk = tessel_kernels(a.tessel)
    tmed = {n: statistics.median(v[2][1:] or v[2]) for n, v in tk.items()}
    print(f"tessel: sum of step medians {sum(tmed.values()):.3f} ms over {len(tk)} steps")
    # ORT pads channels to its NCHWc block (24 -> 32), so shapes do not always agree: pair the k-th
    # convolution of each runtime (both run them in the model's order) when the counts agree.
    oconv = [n for n, v in ort.items() if v[1]]
    tconv = [n for n, v in tk.items() if v[1]]
    rows = []
    if len(oconv) == len(tconv):
        for o, t in zip(oconv, tconv):
            rows.append((tk[t][1], med[o], tmed[t], t))
    else:
        print(f"(ORT has {len(oconv)} convolution/gemm nodes, tessel {len(tconv)}: paired by shape)")
        by_key = collections.defaultdict(lambda: [0.0, 0.0, ""])
        for n in oconv:
            by_key[ort[n][1]][0] += med[n]
        for n in tconv:
            by_key[tk[n][1]][1] += tmed[n]
            by_key[tk[n][1]][2] = n
        rows = [(k, o, t, n) for k, (o, t, n) in by_key.items()]
    other_ort = sum(med[n] for n, v in ort.items() if not v[1])
    other_tessel = sum(tmed[n] for n, v in tk.items() if not v[1])
    rows.sort(key=lambda r: r[2] - r[1], reverse=True)
    print(f"{'shape (tessel)':44s} {'ORT ms':>8s} {'tessel ms':>9s} {'diff':>7s}  tessel node")
    for k, o, t, n in rows[: a.top]:
        print(f"{k:44s} {o:8.3f} {t:9.3f} {t - o:7.3f}  {n}")
    print(f"{'sum of the pairs':44s} {sum(r[1] for r in rows):8.3f} {sum(r[2] for r in rows):9.3f}")
    print(f"{'everything else (pools, elementwise, ...)':44s} {other_ort:8.3f} {other_tessel:9.3f} {other_tessel - other_ort:7.3f}")


if __name__ == "__main__":
    main()
