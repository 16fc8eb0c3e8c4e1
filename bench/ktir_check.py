#!/usr/bin/python3
"""tessel's KTIR export run by ktir-cpu (torch-spyre's reference interpreter of the ktdp dialect), unmodified,
on the model's real inputs, the kernels chained (docs/ktir.md, "Checking it on ktir-cpu"):

    python3 bench/ktir_check.py --ktir-cpu DIR MODEL [MODEL ...] [--target spyre] [--json out.json] [--bar 2e-3]

DIR is a checkout of github.com/torch-spyre/ktir-cpu (its ktir_cpu package needs only numpy); nothing of it
is copied into tessel. For each model (a model-zoo folder with test_data_set_0):
  1. `tessel compile MODEL --target T --emit ktir -o FOLDER --ktir-values`: one module per kernel, the
     constants as .npy, manifest.json (every step in program order, every global's declaration) and tessel's
     own values of every intermediate (its functional simulation on test_data_set_0);
  2. `tessel sim MODEL --hw T --no-functional --json`: tessel's simulated time per kernel;
  3. the device memory as the declarations say (each global a flat padded array in its physical order), the
     inputs and constants packed into it; every step in program order: an exported kernel runs on ktir-cpu
     (a fresh interpreter, its arguments the globals' arrays), what it writes becomes the global; a host step
     (or a kernel not exported) takes tessel's value of what it writes, and is named in the table;
  4. every kernel's results against tessel's value of them, the chained model outputs against
     test_data_set_0's reference outputs and tessel's (each as max |difference| / max |expected|: f16 storage
     keeps about three digits of every value), and ktir-cpu's latency estimate beside tessel's simulated time.
With --storage f32 (or auto, for a model whose reference outputs lie below f16's range) every float tensor is
stored as f32 on the same schedule (`--ktir-storage f32`): the kernels' logic is checked, not the f16 format,
and tessel's values are its functional simulation with the same storage.
Exit status 1 when a kernel fails on ktir-cpu or a chained output misses the reference by more than --bar.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

SOURCE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

NP_TYPES = {"f16": "float16", "f32": "float32", "f64": "float64", "i64": "int64", "i32": "int32", "i16": "int16",
            "i8": "int8", "u8": "uint8", "bool": "bool"}


def order_of(g):
    r = len(g["shape"])
    return list(g["perm"]) if len(g["perm"]) == r else list(range(r))


def np_type(np, name):
    if name not in NP_TYPES:
        raise ValueError(f"no NumPy type for device dtype {name}")
    return np.dtype(NP_TYPES[name])


def pack_dense(np, dense, g):
    """A global's padded device array (flat) from its elements in dense physical order."""
    o = order_of(g)
    phys = np.zeros([g["padded"][d] for d in o], np_type(np, g["dtype"]))
    phys[tuple(slice(0, g["shape"][d]) for d in o)] = np.asarray(dense).reshape([g["shape"][d] for d in o])
    return phys.ravel()


def pack_logical(np, logical, g):
    """The same from logical (row-major over the shape) values: transposed into the physical order."""
    o = order_of(g)
    return pack_dense(np, np.asarray(logical).reshape(g["shape"]).transpose(o), g)


def unpack_dense(np, flat, g):
    o = order_of(g)
    phys = np.asarray(flat).reshape([g["padded"][d] for d in o])
    return phys[tuple(slice(0, g["shape"][d]) for d in o)]


def unpack_logical(np, flat, g):
    return unpack_dense(np, flat, g).transpose(np.argsort(order_of(g)))


def rel_diff(np, a, b):
    """max |a - b| over max |b|: f16 storage keeps about three decimal digits of each value, so the error
    of a chain is relative to the values' size (an f16 ulp at 4 is 0.004)."""
    d = max_diff(np, a, b)
    if d == float("inf"):
        return d
    b = np.abs(np.asarray(b, dtype=np.float64))
    b = b[np.isfinite(b)]
    s = float(np.max(b)) if b.size else 0.0
    return d / s if s > 0 else d


def max_diff(np, a, b):
    a = np.asarray(a, dtype=np.float64).ravel()
    b = np.asarray(b, dtype=np.float64).ravel()
    if a.shape != b.shape:
        return float("inf")
    if a.size == 0:
        return 0.0
    both = np.isfinite(a) & np.isfinite(b)
    if not np.array_equal(np.isfinite(a), np.isfinite(b)) or not np.array_equal(a[~both], b[~both]):
        return float("inf")
    return float(np.max(np.abs(a[both] - b[both]))) if both.any() else 0.0


def execute(np, it, func, args):
    """it.execute_function(func, **args), except that ktir-cpu's execute_function allocates only f16, f32, i32
    and i64 arrays: with a bool (i1) argument the same steps run here through the interpreter's own calls
    (allocate each array in its HBM, pass the element index, run the grid, read every array back)."""
    if all(a.dtype != np.bool_ for a in args.values()):
        return it.execute_function(func, **args)
    from ktir_cpu.memory import HBMSimulator
    from ktir_cpu.ops.memory_ops import hbm_read, hbm_write
    f = it.module.get_function(func)
    it._prepare_execution(f.grid)
    addr, ptrs = {}, {}
    for n, a in args.items():
        stick = it.memory.hbm.allocate(max(1, a.nbytes))
        addr[n] = stick * HBMSimulator.STICK_BYTES
        hbm_write(it.memory.hbm, addr[n], a.view(np.uint8) if a.dtype == np.bool_ else a.ravel())
        ptrs[n] = addr[n] // a.dtype.itemsize
    for core in it.grid_executor.cores:
        core._use_counts = f.use_counts
    it.grid_executor.execute_with_communication(f.operations, ptrs, it._execute_op, transfer_backend=it.ring_backend)
    out = {}
    for n, a in args.items():
        if a.dtype == np.bool_:
            out[n] = hbm_read(it.memory.hbm, addr[n], a.size, "i1").astype(np.bool_)
        else:
            out[n] = hbm_read(it.memory.hbm, addr[n], a.size, {np.dtype(np.float16): "f16", np.dtype(np.float32): "f32",
                                                            np.dtype(np.int32): "i32", np.dtype(np.int64): "i64"}[a.dtype])
    return out


# tessel's spyre figures the reasons quote (hw/spyre.json); ktir-cpu's from its HardwareConfig defaults
TESSEL_OVERHEAD_US = 1.5


def reason(r):
    """Why ktir-cpu's estimate and tessel's simulated time differ, from the parts of both (docs/sim.md, "KTIR")."""
    t, k = r.get("tessel_us"), r.get("ktir_cpu_us")
    if not t or not k:
        return ""
    ratio = k / t
    if 1 / 1.5 <= ratio <= 1.5:
        return "within 1.5x"
    parts = []
    if ratio < 1:
        parts.append(f"tessel charges {TESSEL_OVERHEAD_US} us launch overhead per kernel, ktir-cpu none "
                     f"(tessel without it: {max(0.0, t - TESSEL_OVERHEAD_US):.2f} us)")
    if r.get("ktir_matmul_us", 0) > 0.25 * k:
        parts.append(f"ktir-cpu's systolic rate is 512 MAC/cycle (2x64x8 FLOP) against tessel's 1140 sustained: "
                     f"{r['ktir_matmul_us']:.2f} us of matmul")
    if r.get("ktir_memory_us", 0) > 0.25 * k:
        kb, tb = r.get("ktir_dram_bytes") or 0, r.get("tessel_dram_bytes") or 0
        parts.append(f"ktir-cpu adds DMA to compute (serial pipeline, no double buffering) at 128 GB/s shared by the "
                     f"active cores: {r['ktir_memory_us']:.2f} us for {kb / 1e3:.0f} kB (tessel moves {tb / 1e3:.0f} kB "
                     f"at 150 GB/s, overlapped)")
        if tb and kb > 1.5 * tb and r.get("kind") == "conv":
            parts.append("each tap's window read from DRAM (the im2col, as tessel's engine loads it; tessel's DRAM figure "
                         "is its mapper's rows-plus-halo estimate), and a pixel of fewer channels than a stick charged "
                         "a whole 128-byte stick")
        elif tb and kb > 1.5 * tb:
            parts.append("each core reads its own copy of a tile several cores share (tessel: one DRAM read broadcast "
                         "over the ring to up to 8 cores); a transposed read is charged per 128-byte stick touched")
    if ratio < 1 and r.get("ktir_compute_us", 0) - r.get("ktir_matmul_us", 0) > 0.25 * k:
        parts.append("vector work at 64 elements/cycle")
    return "; ".join(parts)


def model_dir(model):
    return model if os.path.isdir(model) else os.path.dirname(os.path.abspath(model))


def read_pbs(np, folder, prefix):
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import tensor_pb
    out, i = [], 0
    while os.path.exists(os.path.join(folder, f"{prefix}_{i}.pb")):
        out.append(tensor_pb.read(os.path.join(folder, f"{prefix}_{i}.pb")))
        i += 1
    return out


def check_model(a, model, np, KTIRInterpreter, HardwareConfig):
    name = os.path.basename(model.rstrip("/")).removesuffix(".onnx")
    rows, summary = [], dict(model=name)
    with tempfile.TemporaryDirectory(prefix="ktir_") as tmp:
        work = os.path.join(a.keep, name) if a.keep else tmp
        os.makedirs(work, exist_ok=True)
        folder = os.path.join(work, "ktir")
        data = os.path.join(model_dir(model), "test_data_set_0")
        inputs, refs = read_pbs(np, data, "input"), read_pbs(np, data, "output")
        # f32 storage (the same schedule, a check of the kernels' logic) where asked, or with "auto" where the
        # reference outputs lie below f16's smallest normal (2^-14): f16 cannot hold them, tessel's own DL16
        # values miss them too (mobilenet_v2's ~1e-9)
        small = all(r.size and float(np.max(np.abs(r.astype(np.float64)))) < 2.0 ** -14 for r in refs) if refs else False
        storage = a.storage if a.storage != "auto" else ("f32" if small else "device")
        summary["storage"] = storage
        r = subprocess.run([a.tessel, "compile", model, "--target", a.target, "--emit", "ktir", "-o", folder, "--ktir-values"] +
                           (["--ktir-storage", "f32"] if storage == "f32" else []), capture_output=True, text=True)
        if r.returncode != 0:
            summary.update(status="error", error=(r.stderr or r.stdout).strip().splitlines()[-1][:200])
            return rows, summary
        sim_json = os.path.join(work, "sim.json")
        subprocess.run([a.tessel, "sim", model, "--hw", a.target, "--no-functional", "--json", sim_json],
                       check=True, capture_output=True, text=True)
        with open(os.path.join(folder, "manifest.json")) as f:
            man = json.load(f)
        with open(sim_json) as f:
            sim = {k["name"]: k for k in json.load(f)["kernels"]}
        globals_ = {g["global"]: g for g in man["globals"]}
        values = {n: np.load(os.path.join(folder, f)) for n, f in man.get("values", {}).items()}
        # the device memory: every global as its declaration lays it out
        mem = {}
        for gname, x in zip(man["inputs"], inputs):
            mem[gname] = pack_logical(np, x, globals_[gname])
        for g in man["globals"]:
            if g["kind"] == "constant":
                mem[g["global"]] = pack_logical(np, np.load(os.path.join(folder, g["file"])), g)
        for st in man["steps"]:
            row = dict(model=name, kernel=st["kernel"], kind=st["kind"], node=st["node"],
                       tessel_us=sim.get(st["kernel"], {}).get("simulated_us"), status="ok", error="", max_diff=None)
            if not st["exported"]:
                # a host step (or a kernel with no export): its results are tessel's, named in the table
                row["status"] = "host" if st["kind"] == "host" else "not exported"
                row["error"] = st["reason"]
                for w in st["writes"]:
                    if w in values and any(d < 0 for d in globals_[w]["shape"]):
                        mem[w] = np.asarray(values[w]).ravel()  # a shape known only when it runs: host data only
                    elif w in values:
                        mem[w] = pack_dense(np, values[w], globals_[w])
                    else:
                        row["status"], row["error"] = "error", f"no tessel value of '{w}' to continue the chain with"
                rows.append(row)
                continue
            k = next(x for x in man["kernels"] if x["kernel"] == st["kernel"])
            t0 = time.time()
            try:
                it = KTIRInterpreter(latency_config=HardwareConfig())
                it.load(os.path.join(folder, k["file"]))
                args = {}
                for x in k["args"]:
                    g = globals_[x["global"]]
                    size = int(np.prod([g["padded"][d] for d in order_of(g)]))
                    if a.isolated and x["global"] in values and not x["written"]:
                        args[x["arg"]] = pack_dense(np, values[x["global"]], g)  # tessel's value, not the chain's
                    else:
                        args[x["arg"]] = mem[x["global"]].copy() if x["global"] in mem else np.zeros(size, np_type(np, g["dtype"]))
                # ktir-cpu lists the SSA pointers of its memory views as the function's tensors: only arguments
                extra = sorted(set(it.tensor_input_output_sizes(k["function"])) - set(args))
                if extra:
                    raise ValueError(f"ktir-cpu reads {', '.join(extra)} as inputs too")
                out = execute(np, it, k["function"], args)
                rep = it.get_latency_report()
                crit = rep.critical_core
                us = 1e6 / rep.config.clock_hz
                row.update(ktir_cpu_us=rep.kernel_time_us, bottleneck=rep.bottleneck,
                           ktir_compute_us=crit.compute_cycles * us, ktir_memory_us=crit.memory_cycles * us,
                           ktir_matmul_us=crit.cycles_by_category.get("compute_matmul", 0.0) * us,
                           ktir_dram_bytes=sum(c.dram_bytes for c in rep.counters.values()),
                           tessel_dram_bytes=sim.get(st["kernel"], {}).get("dram_bytes"),
                           ktir_cores=len(rep.counters))
                row["reason"] = reason(row)
                worst = 0.0
                for x in k["args"]:
                    if not x["written"]:
                        continue
                    mem[x["global"]] = np.asarray(out[x["arg"]]).ravel()
                    if a.keep:  # what ktir-cpu wrote, as tessel's values are laid out (dense, physical order)
                        os.makedirs(os.path.join(work, "ktir_cpu"), exist_ok=True)
                        np.save(os.path.join(work, "ktir_cpu", f"{st['kernel']}-{x['arg']}.npy"),
                                unpack_dense(np, mem[x["global"]], globals_[x["global"]]))
                    if x["global"] in values:
                        got = unpack_dense(np, mem[x["global"]], globals_[x["global"]])
                        want = np.asarray(values[x["global"]]).astype(got.dtype)
                        worst = max(worst, rel_diff(np, got.ravel(), want.ravel()))
                row["max_diff"] = worst
            except Exception as e:  # noqa: BLE001 -- every failure is a row of the table
                row.update(status="error", error=f"{type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}")
            row["seconds"] = round(time.time() - t0, 2)
            rows.append(row)
        # the chained outputs
        outs = []
        for i, gname in enumerate(man["outputs"]):
            g = globals_[gname]
            got = unpack_logical(np, mem[gname], g).astype(np.float32) if gname in mem else None
            ref = refs[i] if i < len(refs) else None
            tv = values.get(gname)
            tv = unpack_logical(np, pack_dense(np, tv, g), g).astype(np.float32) if tv is not None else None
            outs.append(dict(output=gname, vs_reference=rel_diff(np, got, ref) if got is not None and ref is not None else None,
                             abs_vs_reference=max_diff(np, got, ref) if got is not None and ref is not None else None,
                             vs_tessel=rel_diff(np, got, tv) if got is not None and tv is not None else None,
                             tessel_vs_reference=rel_diff(np, tv, ref) if tv is not None and ref is not None else None,
                             scale=float(np.max(np.abs(ref))) if ref is not None and ref.size else None))
        summary.update(outputs=outs, kernels=len(man["steps"]), exported=len(man["kernels"]),
                       ran=sum(r["status"] == "ok" for r in rows), host=sum(r["status"] == "host" for r in rows),
                       not_exported=sum(r["status"] == "not exported" for r in rows),
                       failed=sum(r["status"] == "error" for r in rows),
                       ktir_cpu_us=sum(r.get("ktir_cpu_us") or 0 for r in rows),
                       tessel_us=sum(r.get("tessel_us") or 0 for r in rows if r["status"] == "ok"))
        ok = summary["failed"] == 0 and all(o["vs_reference"] is not None and o["vs_reference"] <= a.bar for o in outs)
        summary["status"] = "ok" if ok else "fail"
    return rows, summary


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("models", nargs="+")
    ap.add_argument("--ktir-cpu", required=True, help="a ktir-cpu checkout")
    ap.add_argument("--target", default="spyre")
    ap.add_argument("--tessel", default=os.path.join(SOURCE, "build", "tessel"))
    ap.add_argument("--bar", type=float, default=2e-3, help="largest max|chained - reference| / max|reference| accepted")
    ap.add_argument("--json")
    ap.add_argument("--quiet", action="store_true", help="only the per-model summary")
    ap.add_argument("--reasons", action="store_true", help="under each kernel, why the two latencies differ")
    ap.add_argument("--isolated", action="store_true",
                    help="each kernel reads tessel's values of its inputs, not the chain's (a kernel's own error)")
    ap.add_argument("--storage", choices=["auto", "device", "f32"], default="auto",
                    help="float storage of the export: the device's (f16), f32 on the same schedule (a check of the kernels' "
                         "logic, not of the format), or auto: f32 only for a model whose reference outputs f16 cannot hold")
    ap.add_argument("--keep", help="keep each model's folder (the export, and what ktir-cpu wrote) under DIR/MODEL")
    a = ap.parse_args()
    sys.path.insert(0, os.path.abspath(a.ktir_cpu))
    import numpy as np
    from ktir_cpu import HardwareConfig, KTIRInterpreter
    rows, summaries = [], []
    for model in a.models:
        r, s = check_model(a, model, np, KTIRInterpreter, HardwareConfig)
        rows += r
        summaries.append(s)
    if not a.quiet:
        print(f"{'model':<12} {'kernel':<6} {'kind':<8} {'status':<12} {'tessel us':>10} {'ktir-cpu us':>12} {'ratio':>6} "
              f"{'vs tessel':>9}  node / note (vs tessel: max |diff| / max |tessel's value| of what it writes)")
        for r in rows:
            t, k = r.get("tessel_us"), r.get("ktir_cpu_us")
            ratio = f"{k / t:6.2f}" if t and k else "     -"
            d = f"{r['max_diff']:9.1e}" if r.get("max_diff") is not None else "        -"
            print(f"{r['model']:<12} {r['kernel']:<6} {r['kind']:<8} {r['status']:<12} "
                  f"{(f'{t:.2f}' if t is not None else '-'):>10} {(f'{k:.2f}' if k is not None else '-'):>12} {ratio} {d}  "
                  f"{r['error'] or r['node']}" + (f"\n{'':<52}why: {r['reason']}" if a.reasons and r.get("reason") else ""))
    bad = False
    for s in summaries:
        if s.get("status") == "error":
            print(f"{s['model']}: tessel failed: {s['error']}")
            bad = True
            continue
        outs = "; ".join(f"{o['output']}: vs reference {o['vs_reference']:.1e} (max abs {o['abs_vs_reference']:.1e}, |ref| <= {o['scale']:.2g}), vs tessel "
                         f"{o['vs_tessel']:.1e}, tessel vs reference {o['tessel_vs_reference']:.1e}"
                         if o["vs_reference"] is not None and o["vs_tessel"] is not None and o["tessel_vs_reference"] is not None
                         else f"{o['output']}: {o}" for o in s["outputs"])
        ratio = s["ktir_cpu_us"] / s["tessel_us"] if s["tessel_us"] else float("nan")
        print(f"{s['model']}{' (f32 storage)' if s.get('storage') == 'f32' else ''}: {s['ran']} of {s['kernels']} steps ran on ktir-cpu ({s['host']} host steps, {s['not_exported']} not "
              f"exported, {s['failed']} failed); ktir-cpu {s['ktir_cpu_us']:.1f} us vs tessel {s['tessel_us']:.1f} us "
              f"({ratio:.2f}x); chained {outs} -> {s['status'].upper()}")
        bad = bad or s["status"] != "ok"
    if a.json:
        with open(a.json, "w") as f:
            json.dump(dict(kernels=rows, models=summaries, bar=a.bar, target=a.target), f, indent=1)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
