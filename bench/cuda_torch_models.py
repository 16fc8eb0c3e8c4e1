#!/usr/bin/env python3
"""torch.compile(backend="tessel") on CUDA against Inductor (default mode) and eager, in one run on one GPU:
torchvision resnet50 and transformers BERT-base and GPT-2-small built from their default configs (random
weights, nothing downloaded). f32 with TF32 off everywhere (tessel's cuBLASLt calls use none), and bf16:
tessel's precision="bf16" (bf16 storage, f32 arithmetic, f32 outputs) against eager and Inductor on the
model cast to bf16. Per model and path: `first_call_s` (compile included), `ms` (CUDA-event time of back-to-
back calls after warm-up: the median of --reps groups of --iters calls, host overhead included), `max_rel`
against eager f32, `graphs` and `breaks` (dynamo's graphs tessel compiled; graphs tessel could not take run in
PyTorch with a warning, counted in `tessel_fallbacks`). For tessel also `replay_ms` (its graph replay alone,
summed over its graphs) and `recapture_ms` (what re-capturing each call would cost instead of the copies).
docs/BENCHMARKS.md, "Eighth session: CUDA from PyTorch".

    PYTHONPATH=.pybox/pkg python3 bench/cuda_torch_models.py [--models resnet50,bert,gpt2] [--batch 8]
        [--seq 128] [--iters 20] [--reps 5] [--paths eager,inductor,tessel] [--precisions f32,bf16] [--json F]
"""
import argparse
import json
import statistics
import sys
import time
import traceback

import torch
import torch._dynamo

import tessel


def rel(a, b):
    return float((a.float() - b.float()).abs().max() / b.float().abs().max())


def build(name, batch, seq):
    g = torch.Generator().manual_seed(0)
    if name == "resnet50":
        import torchvision
        m = torchvision.models.resnet50().eval()
        return m, (torch.randn(batch, 3, 224, 224, generator=g),), {}, lambda out: out
    import transformers
    cfg = transformers.AutoConfig.for_model("bert" if name == "bert" else "gpt2")
    m = transformers.AutoModel.from_config(cfg).eval()
    ids = torch.randint(3, cfg.vocab_size, (batch, seq), generator=g)
    kw = dict(input_ids=ids, attention_mask=torch.ones(batch, seq, dtype=torch.long))
    if name == "gpt2":
        kw["use_cache"] = False
    return m, (), kw, lambda out: out.last_hidden_state


def time_ms(fn, iters, reps):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    groups = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(iters):
            fn()
        b.record()
        b.synchronize()
        groups.append(a.elapsed_time(b) / iters)
    return statistics.median(groups)


def prepare(name, path, precision, a, ref_cache):
    """The model on cuda:0 compiled for `path` (eager, inductor or tessel at `precision`; the peers run
    the model cast to bf16), its inputs, the output picker and eager f32's output (cached per model)."""
    torch.manual_seed(0)
    m, args, kw, pick = build(name, a.batch, a.seq)
    dev = torch.device("cuda", 0)
    m = m.to(dev)
    args = tuple(x.to(dev) for x in args)
    kw = {k: (v.to(dev) if isinstance(v, torch.Tensor) else v) for k, v in kw.items()}
    if name not in ref_cache:
        with torch.no_grad():
            ref_cache[name] = pick(m(*args, **kw)).float()
    if precision == "bf16" and path != "tessel":
        m = m.to(torch.bfloat16)
        args = tuple(x.to(torch.bfloat16) for x in args)
    torch._dynamo.reset()
    tessel.dynamo_graphs.clear()
    tessel.dynamo_fallbacks.clear()
    if path == "eager":
        fn = m
    elif path == "inductor":
        fn = torch.compile(m)
    else:
        tessel.dynamo_options.update(precision=precision)
        fn = torch.compile(m, backend="tessel")
    return fn, args, kw, pick, ref_cache[name]


def run_path(name, path, precision, a, ref_cache):
    fn, args, kw, pick, ref = prepare(name, path, precision, a, ref_cache)
    r = dict(model=name, path=path, precision=precision)
    with torch.no_grad():
        t0 = time.perf_counter()
        out = pick(fn(*args, **kw))
        torch.cuda.synchronize()
        r["first_call_s"] = time.perf_counter() - t0
        r["max_rel"] = rel(out, ref)
        r["ms"] = time_ms(lambda: fn(*args, **kw), a.iters, a.reps)
    if path == "tessel":
        graphs = list(tessel.dynamo_graphs)
        r["graphs"] = len(graphs)
        r["targets"] = sorted({g.target for g in graphs})
        r["tessel_fallbacks"] = len(tessel.dynamo_fallbacks)
        r["fallback_reasons"] = [f[:300] for f in tessel.dynamo_fallbacks[:3]]
        replay = recap = 0.0
        kernels = 0
        for g in graphs:
            for e in g._cache.values():
                if hasattr(e.exe, "replay_ms"):
                    replay += e.exe.replay_ms(20)
                    recap += e.exe.recapture_ms(3)
                    kernels += e.exe.stats["kernels"]
        r["replay_ms"], r["recapture_ms"], r["kernels"] = replay, recap, kernels
    torch.cuda.synchronize()
    return r


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--models", default="resnet50,bert,gpt2")
    p.add_argument("--paths", default="eager,inductor,tessel")
    p.add_argument("--precisions", default="f32,bf16")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--json")
    a = p.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    runs, refs = [], {}
    for name in a.models.split(","):
        for precision in a.precisions.split(","):
            for path in a.paths.split(","):
                try:
                    r = run_path(name, path, precision, a, refs)
                except Exception as e:  # noqa: BLE001 -- one failing path must not hide the others
                    r = dict(model=name, path=path, precision=precision, error=f"{type(e).__name__}: {e}"[:500])
                    traceback.print_exc()
                runs.append(r)
                print(json.dumps(r), file=sys.stderr, flush=True)
    doc = dict(device=torch.cuda.get_device_name(0), torch=torch.__version__, batch=a.batch, seq=a.seq,
               iters=a.iters, reps=a.reps, runs=runs)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(doc, f, indent=1)
    print(f"\n{'model':<10}{'prec':<6}{'path':<10}{'first s':>9}{'ms':>9}{'max rel':>10}  notes", file=sys.stderr)
    for r in runs:
        note = r.get("error", "") or (f"graphs {r['graphs']} fallbacks {r['tessel_fallbacks']} replay {r['replay_ms']:.3f} "
                                       f"recapture {r['recapture_ms']:.3f}" if r["path"] == "tessel" else "")
        print(f"{r['model']:<10}{r['precision']:<6}{r['path']:<10}{r.get('first_call_s', float('nan')):>9.2f}"
              f"{r.get('ms', float('nan')):>9.3f}{r.get('max_rel', float('nan')):>10.2e}  {note}", file=sys.stderr)
    print(json.dumps(doc))


if __name__ == "__main__":
    main()
