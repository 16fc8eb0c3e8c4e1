#!/usr/bin/env python3
# Prints the folder-level include graph of src/tessel and checks it against the declared layer order
# (docs/ARCHITECTURE.md, "Layers"): a folder may include itself and folders before it, never one after.
"""Usage: tools/include_graph.py [--check] [--root DIR] [--link BUILD_DIR] | --self-test

Prints every edge `from -> to  N` (N = #include lines of tessel/<to>/ in files of <from>/), the
declared order, and every include that runs back up the order. With --check it exits 1 when there is
an upward include not in EXCEPTIONS, an exception that no longer matches an include (so the list stays
true), a folder of src/tessel missing from the order, or an order that docs/ARCHITECTURE.md or
CMakeLists.txt (TESSEL_LAYERS, one library per folder) spells differently. ctest runs it (include_graph).

With --link BUILD_DIR it also checks the layer libraries CMake built (BUILD_DIR/libtessel_<folder>.a):
a symbol a layer uses but does not define must come from a layer before it (or from outside tessel);
one defined only in a later layer is a link-time upward reference, the same fault as an upward include
(it fails to link against the layer chain). Known ones are in LINK_EXCEPTIONS.

--self-test runs the check on a small made-up tree: clean it passes, with one upward include it fails
naming that include (ctest include_graph_self_test: the check itself is checked).
"""
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

# The pipeline order, lowest first: what each folder may include is itself and everything to its left.
# support: utilities; ir: graph level + the op registry type; ops: the op table; frontend: ONNX -> graph;
# passes: graph->graph; kernel: fusion into kernels; hw: the dataflow hardware description (HwSpec, hw
# files, presets) the tile IR carries; tile: the tile IR (dataflow level: data structure, text form,
# verifier); export: exporters of the IR levels (KTIR); targets: cpu codegen/toolchain and dataflow
# mapping (kernel -> tile), cost model and simulators; lower: each target's pipeline of stages, assembled
# once (the cross-level Lowering, lower_cpu); runtime: backends that execute what lower/ produced;
# driver: the commands of the CLI and Python.
ORDER = ["support", "ir", "ops", "frontend", "passes", "kernel", "hw", "tile", "export", "targets", "lower", "runtime",
         "driver"]

# Known upward includes still present: (including file relative to src/tessel, included path) -> why.
# Each one is a debt with a reason; a stale entry (include gone) is an error too. None today.
EXCEPTIONS = {}

# Known link-time upward references: (layer, layer defining the symbol, demangled name or the object
# file using it) -> why.
_REGISTRY = ("the process-wide registry (ir/op_registry.cpp, OpRegistry::get) loads every op family "
             "by name; the executables link the one tessel_core archive, where that resolves")
LINK_EXCEPTIONS = {
    ("ir", "ops", f"tessel::register_{family}_ops(tessel::OpRegistry&)"): _REGISTRY
    for family in ["elementwise", "activation", "reduction", "normalization", "matmul", "conv_pool", "attention",
                   "shape", "index", "quantize", "misc", "core", "ml", "collective"]
}
LINK_EXCEPTIONS[("ir", "kernel", "tessel::register_kernel_ops(tessel::OpRegistry&)")] = _REGISTRY

INCLUDE = re.compile(r'^\s*#\s*include\s+"tessel/([a-z_]+)/([^"]+)"')


def scan(src):
    """Yields (folder, file, line number, included folder, included path) for every tessel include."""
    for path in sorted(src.rglob("*")):
        if not path.is_file() or path.suffix not in (".h", ".cpp", ".def", ".inc"):
            continue
        rel = path.relative_to(src).as_posix()
        for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            m = INCLUDE.match(line)
            if m:
                yield rel.split("/")[0], rel, n, m.group(1), f"{m.group(1)}/{m.group(2)}"


def nm(archive, *flags):
    """(member, symbol) pairs nm prints for an archive (mangled names): `lib.a:member.o:ADDR T sym`."""
    out = subprocess.run(["nm", "-A", *flags, str(archive)], capture_output=True, text=True, check=True).stdout
    for line in out.splitlines():
        parts = line.split()
        if len(parts) >= 2 and parts[0].count(":") >= 2:
            yield parts[0].split(":")[1], parts[-1]


def link_check(build, problems):
    """Prints and checks the symbol references between the layer archives, lowest layer first."""
    defined = {}
    for layer in ORDER:
        lib = build / f"libtessel_{layer}.a"
        if not lib.exists():
            problems.append(f"{lib} is missing: build the layer libraries first")
            return
        defined[layer] = {sym for _, sym in nm(lib, "-g", "--defined-only")}
    seen, used = Counter(), set()
    for i, layer in enumerate(ORDER):
        below = set().union(*(defined[l] for l in ORDER[: i + 1]))
        for member, sym in set(nm(build / f"libtessel_{layer}.a", "-u")):
            if sym in below:
                continue
            for above in ORDER[i + 1:]:
                if sym in defined[above]:
                    name = subprocess.run(["c++filt", sym], capture_output=True, text=True).stdout.strip()
                    key = next((k for k in [(layer, above, name), (layer, above, member)] if k in LINK_EXCEPTIONS), None)
                    if key:
                        used.add(key)
                        seen[f"  allowed  {layer} -> {above}: {name} ({member})"] += 1
                    else:
                        seen[f"  UPWARD   {layer} -> {above}: {name} ({member})"] += 1
                        problems.append(f"link-time upward reference: {layer} ({member}) uses {name}, defined in {above}")
                    break
    print(f"link-time upward references between layer libraries: {len(seen)}")
    for line in sorted(seen):
        print(line)
    for key in sorted(set(LINK_EXCEPTIONS) - used):
        problems.append(f"stale link exception: {key[0]} no longer uses {key[2]} from {key[1]}")


def main(argv):
    check = "--check" in argv
    root = Path(argv[argv.index("--root") + 1]) if "--root" in argv else Path(__file__).resolve().parent.parent
    src = root / "src" / "tessel"
    rank = {f: i for i, f in enumerate(ORDER)}
    problems = []

    folders = sorted(p.name for p in src.iterdir() if p.is_dir())
    for f in folders:
        if f not in rank:
            problems.append(f"folder src/tessel/{f} is not in the declared order (tools/include_graph.py ORDER)")

    edges = Counter()
    upward, used = [], set()
    for frm, rel, n, to, inc in scan(src):
        edges[(frm, to)] += 1
        if frm in rank and to in rank and rank[to] > rank[frm]:
            if (rel, inc) in EXCEPTIONS:
                used.add((rel, inc))
                upward.append(f"  allowed  {rel}:{n}: {inc}  ({EXCEPTIONS[(rel, inc)]})")
            else:
                upward.append(f"  UPWARD   {rel}:{n}: {inc}")
                problems.append(f"upward include: src/tessel/{rel}:{n} includes tessel/{inc} ({frm} is below {to})")
    for key in sorted(set(EXCEPTIONS) - used):
        problems.append(f"stale exception: {key[0]} no longer includes {key[1]}; remove it from EXCEPTIONS")

    # The command line is thin (issue 36): tools/*.cpp parse options and call driver/ (driver/commands.h),
    # so they include tessel headers of the driver layer only.
    for path in sorted((root / "tools").glob("*.cpp")) if (root / "tools").is_dir() else []:
        for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            m = INCLUDE.match(line)
            if m and m.group(1) != "driver":
                problems.append(f"tools/{path.name}:{n} includes tessel/{m.group(1)}/{m.group(2)}: the command line "
                                f"includes driver/ only (the commands live in driver/commands.cpp)")

    # The order is written in two more places that must agree: the docs and the per-folder libraries.
    arrow = " → ".join(ORDER)
    arch = (root / "docs" / "ARCHITECTURE.md").read_text()
    if arrow not in arch:
        problems.append(f"docs/ARCHITECTURE.md does not state the order `{arrow}`")
    m = re.search(r"set\(TESSEL_LAYERS ([a-z_ ]+)\)", (root / "CMakeLists.txt").read_text())
    if not m or m.group(1).split() != ORDER:
        problems.append("CMakeLists.txt's set(TESSEL_LAYERS ...) differs from ORDER")

    print("layers (lowest first): " + arrow)
    print("include edges (from -> to: #include lines):")
    for frm in sorted(rank.keys() & {a for a, _ in edges}, key=rank.get):
        tos = sorted((t for a, t in edges if a == frm), key=lambda t: rank.get(t, 99))
        print(f"  {frm:9} -> " + ", ".join(
            f"{t} {edges[(frm, t)]}" + ("  (UP)" if rank.get(t, 99) > rank[frm] else "") if t != frm else f"{t} {edges[(frm, t)]}"
            for t in tos))
    print(f"upward includes: {len(upward)} ({len(used)} allowed exceptions)")
    for u in upward:
        print(u)
    if "--link" in argv:
        link_check(Path(argv[argv.index("--link") + 1]), problems)
    for p in problems:
        print("error: " + p, file=sys.stderr)
    return 1 if check and problems else 0


def self_test():
    """The check passes on a clean made-up tree and fails on the same tree with one upward include."""
    import contextlib
    import io
    import tempfile
    global EXCEPTIONS
    EXCEPTIONS = {}  # the real list names real files
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        (root / "docs").mkdir()
        (root / "docs" / "ARCHITECTURE.md").write_text(" → ".join(ORDER) + "\n")
        (root / "CMakeLists.txt").write_text(f"set(TESSEL_LAYERS {' '.join(ORDER)})\n")
        for i, layer in enumerate(ORDER):
            (root / "src" / "tessel" / layer).mkdir(parents=True)
            below = f'#include "tessel/{ORDER[i - 1]}/a.h"\n' if i else ""
            (root / "src" / "tessel" / layer / "a.h").write_text(below)

        def run():
            err = io.StringIO()
            with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
                rc = main(["--check", "--root", tmp])
            return rc, err.getvalue()

        (root / "tools").mkdir()
        (root / "tools" / "main.cpp").write_text('#include "tessel/driver/a.h"\n')
        clean = run()
        (root / "src" / "tessel" / "ir" / "b.cpp").write_text('#include "tessel/runtime/a.h"\n')
        upward = run()
        (root / "src" / "tessel" / "ir" / "b.cpp").unlink()
        (root / "tools" / "main.cpp").write_text('#include "tessel/driver/a.h"\n#include "tessel/runtime/a.h"\n')
        fat = run()
    ok = (clean[0] == 0 and upward[0] == 1 and "src/tessel/ir/b.cpp:1 includes tessel/runtime/a.h" in upward[1]
          and fat[0] == 1 and "tools/main.cpp:2 includes tessel/runtime/a.h" in fat[1])
    print(f"self-test: clean tree rc={clean[0]}, tree with ir -> runtime rc={upward[0]}, a command line including "
          f"runtime/ rc={fat[0]}: {'ok' if ok else 'FAILED'}")
    if not ok:
        print(clean[1] + upward[1] + fat[1], file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(self_test() if "--self-test" in sys.argv else main(sys.argv[1:]))
