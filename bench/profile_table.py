#!/usr/bin/python3
"""Per-kernel timing table of one model on the compiled backend, from TESSEL_PROFILE's step lines.

    TESSEL_PROFILE=1 build/tessel bench MODEL --backends compiled --threads 2 --iters 10 2> prof.txt
    python3 bench/profile_table.py prof.txt [--top 30]

Every `profile <ms> ms  <op> <node>` line is one step of one call (a kernel's `library` line is the
oneDNN call's share of the step that follows it). Per (op, node): the median over calls, its share of
the sum of medians, and the number of calls seen; then the sum per op.
"""
import argparse
import collections
import re
import statistics

LINE = re.compile(r"profile\s+([\d.]+) ms\s+(\S+) (.*)")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("file")
    ap.add_argument("--top", type=int, default=30)
    a = ap.parse_args()
    times = collections.defaultdict(list)
    with open(a.file) as f:
        for line in f:
            m = LINE.match(line)
            if m:
                times[(m.group(2), m.group(3))].append(float(m.group(1)))
    rows = sorted(((statistics.median(v), k, len(v)) for k, v in times.items()), reverse=True)
    steps = [r for r in rows if r[1][0] != "library"]  # library lines are part of their kernel's step
    total = sum(r[0] for r in steps) or 1.0
    print(f"sum of step medians: {total:.3f} ms")
    per_op = collections.defaultdict(float)
    for med, (op, _), _ in rows:
        per_op[op] += med
    print("per op: " + ", ".join(f"{op} {ms:.3f}" for op, ms in sorted(per_op.items(), key=lambda x: -x[1])))
    for med, (op, name), n in rows[: a.top]:
        print(f"{med:10.3f} ms {100 * med / total:5.1f}%  {op:14} {name}  ({n} calls)")


if __name__ == "__main__":
    main()
