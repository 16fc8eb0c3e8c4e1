"""Per-kernel profile of the tblock_bert training step (bench/train_step.py's block): the compiled forward
and backward step by step (TESSEL_PROFILE's lines: each kernel's time, and a matmul's oneDNN share), the
AdamW step, and the matmul floor of each half (its fp32 matmuls alone through oneDNN at the same threads,
driver/matmul_floor.h) -- what is not matmul is what the compiled code can still cut. JSON out.

    OPENBLAS_CORETYPE=SkylakeX PYTHONPATH=build/python /usr/bin/python3 bench/train_profile.py --threads 2 \
        --steps 5 --json F
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys

LINE = re.compile(r"^profile\s+([0-9.]+) ms\s+(.*)$")


def child(a):
    import torch
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from train_step import Block
    import tessel
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    x, w = torch.randn(1, 128, 768), torch.randn(1, 128, 768)
    m = Block()
    fast = tessel.compile(m, (x,), train=True, threads=a.threads)
    opt = tessel.optim.AdamW(m.parameters(), lr=1e-4, threads=a.threads)

    def mark(s):
        os.write(2, f"mark {s}\n".encode())

    for i in range(a.steps + 1):
        opt.zero_grad(set_to_none=True)
        mark(f"forward {i}")
        loss = (fast(x) * w).sum()
        mark(f"backward {i}")
        loss.backward()
        mark(f"adamw {i}")
        opt.step()
        mark("end")
    # (a build without TrainStep.matmul_floor -- before issue 16 part 3 -- reports no floor)
    floors = ({h: fast.step.matmul_floor(h, a.threads, 20) for h in ("forward", "backward")}
              if hasattr(fast.step, "matmul_floor") else {})
    print(json.dumps(floors))


def parse(err, steps):
    """{phase: {kernel: [ms per step]}} and {phase: {kernel: [library ms per step]}} over the timed steps."""
    times, lib = {}, {}
    phase, step, pending = None, 0, 0.0
    for line in err.splitlines():
        if line.startswith("mark "):
            parts = line.split()
            phase, step = (parts[1], int(parts[2])) if len(parts) == 3 else (None, 0)
            continue
        m = LINE.match(line)
        if not m or phase is None or step == 0:  # step 0 compiles the AdamW graph: not timed
            continue
        ms, what = float(m.group(1)), m.group(2).strip()
        if what.startswith("library "):
            pending = ms
            continue
        if what.startswith("compile"):
            continue
        key = what
        times.setdefault(phase, {}).setdefault(key, []).append(ms)
        lib.setdefault(phase, {}).setdefault(key, []).append(pending)
        pending = 0.0
    return times, lib


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--top", type=int, default=12)
    ap.add_argument("--json", default="")
    ap.add_argument("--child", action="store_true")
    a = ap.parse_args()
    if a.child:
        return child(a)
    env = dict(os.environ, TESSEL_PROFILE="1")
    r = subprocess.run([sys.executable, __file__, "--child", "--threads", str(a.threads), "--steps", str(a.steps)],
                       env=env, capture_output=True, text=True)
    if r.returncode:
        sys.stderr.write(r.stderr[-4000:])
        return r.returncode
    floors = json.loads(r.stdout.strip().splitlines()[-1])
    times, lib = parse(r.stderr, a.steps)
    res = dict(threads=a.threads, steps=a.steps, floors=floors, phases={})
    for phase, ks in times.items():
        rows = []
        for k, v in ks.items():
            # a kernel name can repeat within one step (the same op on several nodes): per step, summed
            per_step = sum(v) / a.steps
            lib_ms = sum(lib[phase][k]) / a.steps
            kind = "matmul" if lib_ms > 0 else "loop"
            rows.append(dict(kernel=k, ms=per_step, library_ms=lib_ms, kind=kind))
        rows.sort(key=lambda r: -r["ms"])
        total = sum(r["ms"] for r in rows)
        mm = sum(r["library_ms"] for r in rows)
        res["phases"][phase] = dict(total_ms=total, matmul_library_ms=mm, rest_ms=total - mm, kernels=rows)
    print(f"{'phase':<9} {'kernels ms':>10} {'oneDNN ms':>10} {'rest ms':>8}  matmul floor")
    for phase, p in res["phases"].items():
        fl = floors.get(phase, {}).get("summary", "")
        print(f"{phase:<9} {p['total_ms']:>10.2f} {p['matmul_library_ms']:>10.2f} {p['rest_ms']:>8.2f}  {fl}")
    for phase, p in res["phases"].items():
        print(f"\n{phase}: top {a.top} of {len(p['kernels'])}")
        for row in p["kernels"][:a.top]:
            print(f"  {row['ms']:8.3f} ms  (oneDNN {row['library_ms']:7.3f})  {row['kernel'][:110]}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
