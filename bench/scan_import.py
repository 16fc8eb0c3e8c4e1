"""Importing a Scan that unrolls to the 2^20-node bound (issue 41, case 3): a few hundred bytes of ONNX whose
Scan-16 body of K Adds runs 2^20 / K steps, the most the importer unrolls (frontend/onnx/expand.cpp). Each model
is written as protobuf by hand (no onnx module here), then `tessel compile --emit graph -o /dev/null` imports,
unrolls, verifies and prints it; wall seconds and peak memory as JSON. Before issue 41's unique_name fix a Scan of
8192 steps took over 120 s.

    python3 bench/scan_import.py --tessel build/tessel --bodies 1,16,128 --json out.json
"""
import argparse
import json
import os
import re
import struct
import subprocess
import tempfile
import time


def varint(n):
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def field(num, wire, payload):
    key = varint(num << 3 | wire)
    if wire == 0:
        return key + varint(payload)
    data = payload.encode() if isinstance(payload, str) else payload
    return key + varint(len(data)) + data


def value_info(name, dims):
    shape = b"".join(field(1, 2, field(1, 0, d)) for d in dims)       # TensorShapeProto.dim.dim_value
    tensor = field(1, 0, 1) + field(2, 2, shape)                      # elem_type FLOAT, shape
    return field(1, 2, name) + field(2, 2, field(1, 2, tensor))        # name, TypeProto.tensor_type


def node(op, ins, outs, name, attrs=b""):
    return b"".join(field(1, 2, i) for i in ins) + b"".join(field(2, 2, o) for o in outs) + field(3, 2, name) + \
        field(4, 2, op) + attrs


def scan_model(body_nodes, steps):
    # body: state s[1], element e[1] -> s + e + e + ... (body_nodes Adds) as the new state
    nodes, prev = [], "s"
    for k in range(body_nodes):
        out = "s2" if k == body_nodes - 1 else f"t{k}"
        nodes.append(field(1, 2, node("Add", [prev, "e"], [out], f"add{k}")))
        prev = out
    body = b"".join(nodes) + field(2, 2, "body") + field(11, 2, value_info("s", [1])) + \
        field(11, 2, value_info("e", [1])) + field(12, 2, value_info("s2", [1]))
    attrs = field(5, 2, field(1, 2, "num_scan_inputs") + field(3, 0, 1) + field(20, 0, 2)) + \
        field(5, 2, field(1, 2, "body") + field(6, 2, body) + field(20, 0, 5))
    graph = field(1, 2, node("Scan", ["init", "xs"], ["final"], "scan", attrs)) + field(2, 2, "g") + \
        field(11, 2, value_info("init", [1])) + field(11, 2, value_info("xs", [steps, 1])) + \
        field(12, 2, value_info("final", [1]))
    return model(graph)


def tensor(name, dims, values):
    raw = struct.pack(f"<{len(values)}f", *values)
    return b"".join(field(1, 0, d) for d in dims) + field(2, 0, 1) + field(8, 2, name) + field(9, 2, raw)


def model(graph, opset=16):
    return field(1, 0, 8) + field(8, 2, field(1, 2, "") + field(2, 0, opset)) + field(7, 2, graph)


def lstm_model(seq, hidden=16, inp=8):
    """One LSTM over `seq` steps (the importer expands it step by step)."""
    w = tensor("W", [1, 4 * hidden, inp], [0.01] * (4 * hidden * inp))
    r = tensor("R", [1, 4 * hidden, hidden], [0.01] * (4 * hidden * hidden))
    attrs = field(5, 2, field(1, 2, "hidden_size") + field(3, 0, hidden) + field(20, 0, 2))
    graph = field(1, 2, node("LSTM", ["X", "W", "R"], ["Y", "Y_h"], "lstm", attrs)) + field(2, 2, "g") + \
        field(5, 2, w) + field(5, 2, r) + field(11, 2, value_info("X", [seq, 1, inp])) + \
        field(12, 2, value_info("Y_h", [1, 1, hidden]))
    return model(graph)


def nested_if_model(depth, width):
    """If inside If, `depth` deep, each branch a chain of `width` Adds of x (both branches are expanded)."""
    def branch(level, then):
        nodes, prev = [], "x"
        for k in range(width):
            out = f"b{level}{'t' if then else 'e'}{k}"
            nodes.append(field(1, 2, node("Add" if then else "Sub", [prev, "x"], [out], out)))
            prev = out
        if level + 1 < depth and then:
            inner = f"if{level + 1}"
            attrs = field(5, 2, field(1, 2, "then_branch") + field(6, 2, branch(level + 1, True)) + field(20, 0, 5)) + \
                field(5, 2, field(1, 2, "else_branch") + field(6, 2, branch(level + 1, False)) + field(20, 0, 5))
            nodes.append(field(1, 2, node("If", ["c"], [inner], inner, attrs)))
            out = f"r{level}"
            nodes.append(field(1, 2, node("Add", [prev, inner], [out], out)))
            prev = out
        return b"".join(nodes) + field(2, 2, f"branch{level}") + field(12, 2, value_info(prev, [4]))
    attrs = field(5, 2, field(1, 2, "then_branch") + field(6, 2, branch(0, True)) + field(20, 0, 5)) + \
        field(5, 2, field(1, 2, "else_branch") + field(6, 2, branch(0, False)) + field(20, 0, 5))
    cond = field(1, 2, "c") + field(2, 2, field(1, 2, field(1, 0, 9) + field(2, 2, b"")))  # bool scalar
    graph = field(1, 2, node("If", ["c"], ["y"], "if0", attrs)) + field(2, 2, "g") + field(11, 2, cond) + \
        field(11, 2, value_info("x", [4])) + field(12, 2, value_info("y", [4]))
    return model(graph)


def nested_scan_model(outer, inner):
    """A Scan of `outer` steps whose body is a Scan of `inner` steps (the running sum of a row): over the
    2^20-node bound, refused at import."""
    inner_body = field(1, 2, node("Add", ["s", "e"], ["s2"], "add")) + field(2, 2, "inner") + \
        field(11, 2, value_info("s", [1])) + field(11, 2, value_info("e", [1])) + field(12, 2, value_info("s2", [1]))
    inner_attrs = field(5, 2, field(1, 2, "num_scan_inputs") + field(3, 0, 1) + field(20, 0, 2)) + \
        field(5, 2, field(1, 2, "body") + field(6, 2, inner_body) + field(20, 0, 5))
    outer_body = field(1, 2, node("Unsqueeze", ["row", "ax"], ["row2"], "unsq")) + \
        field(1, 2, node("Scan", ["s", "row2"], ["s2"], "inner_scan", inner_attrs)) + field(2, 2, "outer") + \
        field(5, 2, b"".join(field(1, 0, d) for d in [1]) + field(2, 0, 7) + field(8, 2, "ax") + field(9, 2, struct.pack("<q", 1))) + \
        field(11, 2, value_info("s", [1])) + field(11, 2, value_info("row", [inner])) + field(12, 2, value_info("s2", [1]))
    attrs = field(5, 2, field(1, 2, "num_scan_inputs") + field(3, 0, 1) + field(20, 0, 2)) + \
        field(5, 2, field(1, 2, "body") + field(6, 2, outer_body) + field(20, 0, 5))
    graph = field(1, 2, node("Scan", ["init", "xs"], ["final"], "scan", attrs)) + field(2, 2, "g") + \
        field(11, 2, value_info("init", [1])) + field(11, 2, value_info("xs", [outer, inner])) + \
        field(12, 2, value_info("final", [1]))
    return model(graph)


def run_case(a, d, name, data, extra):
    path = os.path.join(d, f"{name}.onnx")
    with open(path, "wb") as f:
        f.write(data)
    t0 = time.perf_counter()
    r = subprocess.run(["/usr/bin/time", "-f", "maxrss_kb=%M", a.tessel, "compile", path, "--emit", "graph", "-o",
                        os.devnull], capture_output=True, text=True)
    sec = time.perf_counter() - t0
    rss = re.search(r"maxrss_kb=(\d+)", r.stderr)
    row = dict(case=name, **extra, model_bytes=os.path.getsize(path), seconds=round(sec, 3),
               max_rss_mb=round(int(rss.group(1)) / 1024, 1) if rss else None, rc=r.returncode)
    if r.returncode:
        lines = [ln for ln in r.stderr.strip().splitlines() if not ln.startswith("maxrss_kb=")]
        row["error"] = lines[0] if lines else ""
    print(json.dumps(row))
    return row


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tessel", default="build/tessel")
    ap.add_argument("--bodies", default="1,16,128", help="Adds per step; steps = 2^20 / (this + 2)")
    ap.add_argument("--others", action="store_true", help="also the other long imports of issue 41: an LSTM of "
                    "2000 steps, If nested 30 deep, a Scan of Scans 1024 x 1024")
    ap.add_argument("--json")
    a = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as d:
        for k in (int(s) for s in a.bodies.split(",")):
            steps = (1 << 20) // (k + 2)  # the importer counts each step as the body plus its two slices
            rows.append(run_case(a, d, f"scan_body{k}", scan_model(k, steps),
                                 dict(body_nodes=k, steps=steps, unrolled_nodes=(k + 2) * steps)))
        if a.others:
            rows.append(run_case(a, d, "lstm_seq2000", lstm_model(2000), dict(steps=2000)))
            rows.append(run_case(a, d, "nested_if_30x3000", nested_if_model(30, 3000), dict(depth=30, width=3000)))
            rows.append(run_case(a, d, "nested_scan_1024x1024", nested_scan_model(1024, 1024), dict(steps=1024 * 1024)))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
