"""LLM generation through tessel (issue 34; docs/dynamic-shapes.md): Hugging Face `generate()` (greedy, KV
cache) with the model's forward under torch.compile(backend="tessel", dynamic=True), against eager (the
same tokens; each step's logits) and against Inductor (torch.compile default, and dynamic=True), in one
process. Every decoded token has a new KV length: the figures that matter first are how many compilations
serve the whole generation (dynamo gives tessel graphs with symbolic sizes; tessel compiles each once) and
whether any graph was left to PyTorch; then prefill time and decode tokens/s against the peers.

Models: `gpt2`, `llama` and `qwen2` (transformers configs with random weights; torch >= 2, the GPU box).
CPU (--threads threads for tessel and PyTorch alike) or CUDA (--device cuda; --precision bf16 runs eager and
Inductor under bf16 autocast -- with --cache static a bf16 copy of the model, since autocast fails with the
static cache in eager -- and tessel with bf16 storage). --cache static uses transformers' static KV cache.
Compilations are counted per generate() as well (`compilations_per_generation`: the first prompt's includes
the graphs dynamo specialises before it marks a size dynamic). --tessel-default adds the column
`tessel_default`: torch.compile(backend="tessel") without dynamic=True, dynamo's automatic dynamic shapes
as Inductor's default column has them (each mode beside the same mode; its compilations and fallbacks in
the column). JSON out.

Every generate() passes disable_compile=True: with the static cache on CUDA transformers would otherwise
compile the model's call itself (Inductor, reduce-overhead) around eager's and tessel's forward alike. That
auto-compile is the peer `hf_compile` (CUDA, static cache, with the Inductor peers), timed from whole
generate() calls. --size small builds GPT-2 small's shape (768 wide, 12 layers) instead of the 128-wide,
2-layer configs; --device-profile appends torch.profiler's operator and kernel table of one generate().

    python bench/llm_generate.py --models gpt2,llama,qwen2 --new-tokens 128 --prompts 1x32,2x100,1x256 --json out.json
"""
import argparse
import copy
import functools
import json
import statistics
import sys
import time

import torch

import tessel


# --size: `tiny` (128 wide, 2 layers: generation is all per-call overhead) or `small` (GPT-2 small's
# shape, 768 wide, 12 layers, 12 heads; the llama and Qwen2 configs at the same width with 4 key-value heads
# and a 2048-wide MLP): (width, layers, heads, key-value heads, MLP width, vocabulary) of each model.
SIZES = {"tiny": dict(gpt2=(128, 2, 4, 4, 512, 1000), llama=(128, 2, 4, 2, 344, 1000), qwen2=(128, 2, 4, 2, 344, 1000)),
         "small": dict(gpt2=(768, 12, 12, 12, 3072, 50257), llama=(768, 12, 12, 4, 2048, 32000),
                       qwen2=(768, 12, 12, 4, 2048, 32000))}


def build(name, size="tiny"):
    import transformers
    torch.manual_seed(0)
    if name not in SIZES[size]:
        raise SystemExit(f"unknown model {name!r} (gpt2, llama, qwen2)")
    d, layers, heads, kv, mlp, vocab = SIZES[size][name]
    if name == "gpt2":
        cfg = transformers.GPT2Config(vocab_size=vocab, n_embd=d, n_layer=layers, n_head=heads, n_inner=mlp,
                                      n_positions=1024, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                                      bos_token_id=0, eos_token_id=1)
        m = transformers.GPT2LMHeadModel(cfg)
    elif name == "llama":
        cfg = transformers.LlamaConfig(vocab_size=vocab, hidden_size=d, intermediate_size=mlp, num_hidden_layers=layers,
                                       num_attention_heads=heads, num_key_value_heads=kv, max_position_embeddings=1024,
                                       bos_token_id=0, eos_token_id=1)
        m = transformers.LlamaForCausalLM(cfg)
    else:
        cfg = transformers.Qwen2Config(vocab_size=vocab, hidden_size=d, intermediate_size=mlp, num_hidden_layers=layers,
                                       num_attention_heads=heads, num_key_value_heads=kv, max_position_embeddings=1024,
                                       bos_token_id=0, eos_token_id=1, use_sliding_window=False)
        m = transformers.Qwen2ForCausalLM(cfg)
    return m.eval()


def _sync():
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


class StepTimer:
    """Wraps a forward: the wall time of each call of one generate() (the first is the prefill). It keeps
    the forward's signature (functools.update_wrapper): generate() reads it to decide which arguments
    to pass (logits_to_keep, cache_position), and a wrapper without it changed the graphs dynamo saw."""

    def __init__(self, forward):
        self.forward = forward
        self.times = []
        functools.update_wrapper(self, forward)

    def __call__(self, *args, **kwargs):
        t0 = time.perf_counter()
        out = self.forward(*args, **kwargs)
        _sync()
        self.times.append(time.perf_counter() - t0)
        return out


AUTOCAST = None      # a bf16 autocast context for eager and Inductor (--precision bf16 on CUDA)


def generate(model, ids, new_tokens, cache, autocast=False, auto_compile=False):
    """Greedy generation of exactly new_tokens tokens: (token ids, per-step logits). transformers' generate()
    compiles the model's call itself with the static cache on CUDA (Inductor, mode reduce-overhead: CUDA
    graphs), around whatever model.forward is -- eager's, tessel's -- so it is turned off
    (disable_compile) unless auto_compile asks for it, the peer `hf_compile`."""
    if autocast and AUTOCAST is not None:
        with AUTOCAST():
            return generate(model, ids, new_tokens, cache, auto_compile=auto_compile)
    extra = dict(cache_implementation="static") if cache == "static" else {}
    extra["disable_compile"] = not auto_compile
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                         do_sample=False, use_cache=True, return_dict_in_generate=True, output_scores=True,
                         pad_token_id=0, **extra)
    return out.sequences, torch.stack(out.scores)


def timed(model, forward, ids, new_tokens, cache, rounds, autocast=False):
    """Median over rounds of (whole generate s, prefill s, decode s per token)."""
    whole, prefill, decode = [], [], []
    for _ in range(rounds):
        timer = StepTimer(forward)
        model.forward = timer
        t0 = time.perf_counter()
        generate(model, ids, new_tokens, cache, autocast)
        _sync()
        whole.append(time.perf_counter() - t0)
        prefill.append(timer.times[0])
        decode.append(sum(timer.times[1:]) / max(1, len(timer.times) - 1))
    model.forward = forward
    return statistics.median(whole), statistics.median(prefill), statistics.median(decode)


def _record_whole(row, key, model, ids, new_tokens, cache, rounds, autocast=False):
    """Prefill and decode of a generate() whose forward cannot be wrapped by StepTimer (transformers' own
    compile traces the wrapper): medians over rounds of a 1-token generate() (the prefill) and of the whole
    one; decode per token = (whole - prefill) / (new_tokens - 1)."""
    one, whole = [], []
    for _ in range(rounds):
        for n, into in ((1, one), (new_tokens, whole)):
            t0 = time.perf_counter()
            generate(model, ids, n, cache, autocast, auto_compile=True)
            _sync()
            into.append(time.perf_counter() - t0)
    w, o = statistics.median(whole), statistics.median(one)
    row[key] = _figures(w, o, (w - o) / max(1, new_tokens - 1))
    row[key]["timing"] = "whole generate() calls"


def _figures(whole, prefill, decode):
    """A column's figures from seconds: the whole generate(), its prefill, a decoded token."""
    return dict(generate_s=whole, prefill_ms=prefill * 1e3, decode_ms_per_token=decode * 1e3,
                decode_tokens_per_s=1.0 / decode if decode > 0 else None)


def _record(row, key, model, forward, ids, new_tokens, cache, rounds, autocast=False):
    row[key] = _figures(*timed(model, forward, ids, new_tokens, cache, rounds, autocast))


def _rel_err(got, want):
    """Max |got - want| over max |want|, over the finite scores (generate() sets a token's score to -inf where
    min_new_tokens forbids it: equal in both)."""
    diff = torch.where(got == want, torch.zeros_like(got), got - want)
    finite = want[torch.isfinite(want)]
    return float(diff.abs().max() / finite.abs().max())


# Inductor settings tried in turn where its default code does not compile: vectorization off (cpp.simdlen 1
# picks no vector ISA), the last resort, so a figure from it says so.
INDUCTOR_RETRY = [{"cpp.simdlen": 1}]


def _profile(model, forward, ids, new_tokens, cache, path, title):
    """One generate() under cProfile, its 30 costliest functions by own time and by cumulative time appended
    to `path`: where a decoded token's time goes in Python (dynamo's guards, generate()'s own loop, the
    backend's call, the C++ run as one built-in)."""
    import cProfile
    import io
    import pstats
    model.forward = forward
    prof = cProfile.Profile()
    prof.enable()
    generate(model, ids, new_tokens, cache)
    prof.disable()
    text = io.StringIO()
    stats = pstats.Stats(prof, stream=text)
    stats.sort_stats("tottime").print_stats(30)
    stats.sort_stats("cumulative").print_stats(30)
    with open(path, "a") as f:
        f.write(f"==== {title}\n{text.getvalue()}\n")


def _device_profile(model, forward, ids, new_tokens, cache, path, title, device="cuda", autocast=False):
    """One generate() under torch.profiler, appended to `path`. On CUDA with the CPU and CUDA activities:
    the operators' and kernels' own time (self CUDA time first: what the device did, where a decoded
    token's time goes when the host is not the limit). On the CPU with the CPU activity, sorted by self CPU
    time, with the wall time of the generate() beside it (tessel's executable is one opaque call to the
    profiler: the wall time less the operators' is tessel's own and the Python around it)."""
    from torch.profiler import ProfilerActivity, profile as tprofile
    on_cuda = device == "cuda" and torch.cuda.is_available()
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if on_cuda else [])
    model.forward = forward
    _sync()
    t0 = time.perf_counter()
    with tprofile(activities=acts) as prof:
        generate(model, ids, new_tokens, cache, autocast=autocast)
        _sync()
    wall = time.perf_counter() - t0
    ev = prof.key_averages()
    key = "self_cuda_time_total" if on_cuda else "self_cpu_time_total"
    if on_cuda:
        dev = sum(getattr(e, "self_device_time_total", getattr(e, "self_cuda_time_total", 0)) for e in ev)
        head = f"device time in all kernels {dev / 1e3:.2f} ms for {new_tokens} tokens"
    else:
        head = (f"generate() {wall * 1e3:.2f} ms under the profiler for {new_tokens} tokens, operators' self CPU "
                f"time {sum(e.self_cpu_time_total for e in ev) / 1e3:.2f} ms")
    with open(path, "a") as f:
        f.write(f"==== {title}: {head}\n")
        f.write(ev.table(sort_by=key, row_limit=40, max_name_column_width=70) + "\n")


def _compilations():
    return sum(g.stats.compiles for g in tessel.dynamo_graphs if hasattr(g, "stats"))


def _tessel_column(model, eager_forward, prompts, want, new_tokens, cache, **compile_kwargs):
    """torch.compile(backend="tessel", **compile_kwargs) over the model's forward, each prompt generated once
    against eager's `want`: (the compiled forward, its figures -- first pass seconds, compilations per
    generate(), tokens equal, logits' error, graphs, compilations, bindings, fallbacks, recompiles)."""
    tessel.dynamo_graphs.clear()
    tessel.dynamo_fallbacks.clear()
    torch._dynamo.reset()
    compiled = torch.compile(eager_forward, backend="tessel", **compile_kwargs)
    model.forward = compiled
    got, per_generation = [], []
    t0 = time.perf_counter()
    for q in prompts:
        before = _compilations()
        got.append(generate(model, q, new_tokens, cache))
        per_generation.append(_compilations() - before)
    first = time.perf_counter() - t0
    graphs = [g for g in tessel.dynamo_graphs if hasattr(g, "stats")]
    return compiled, dict(
        first_s=first, compilations_per_generation=per_generation,
        tokens_equal=all(torch.equal(g[0], w[0]) for g, w in zip(got, want)),
        max_rel_err_logits=max(_rel_err(g[1], w[1]) for g, w in zip(got, want)),
        tessel_graphs=len(graphs), compilations=sum(g.stats.compiles for g in graphs),
        bindings=sum(g.stats.bindings for g in graphs), symbolic_graphs=sum(1 for g in graphs if g.dynamic is not None),
        fallbacks=list(tessel.dynamo_fallbacks), recompiles=[r for g in graphs for r in g.stats.recompiles],
        dynamic_fallbacks=[g.stats.dynamic_fallback for g in graphs if g.stats.dynamic_fallback])


def run_model(name, prompts, new_tokens, rounds, peers, cache, profile=None, device="cpu", size="tiny",
              device_profile=None, hf_compile=False, tessel_default=False):
    model = build(name, size).to(device)
    prompts = [p.to(device) for p in prompts]
    eager_forward = model.forward
    row = dict(model=name, new_tokens=new_tokens, cache=cache, prompts=[list(p.shape) for p in prompts])
    # The peers' model: under bf16 autocast transformers' static cache fails in eager itself (the cache is
    # f32, autocast's keys bf16: "index_copy_(): self and source expected to have the same dtype"), so
    # with --cache static eager and Inductor run a bf16 copy of the model, as static-cache users do.
    ref, ref_autocast = model, True
    if AUTOCAST is not None and cache == "static":
        ref, ref_autocast = copy.deepcopy(model).to(torch.bfloat16), False
        row["peers_model"] = "bf16 weights (autocast fails with the static cache in eager)"
    ref_forward = ref.forward
    with torch.no_grad():
        want = [generate(ref, p, new_tokens, cache, autocast=ref_autocast) for p in prompts]

        tessel.dynamo_graphs.clear()
        tessel.dynamo_fallbacks.clear()
        torch._dynamo.reset()
        compiled, figures = _tessel_column(model, eager_forward, prompts, want, new_tokens, cache, dynamic=True)
        row["tessel_first_s"] = figures.pop("first_s")
        row.update(figures)
        p = prompts[-1]
        _record(row, "tessel", model, compiled, p, new_tokens, cache, rounds)
        # (compilations the timed rounds made: 0 when timing saw only what the first pass compiled)
        row["compilations_while_timed"] = _compilations() - row["compilations"]
        # new sizes per decoded token: rebinds of one executable per compilation (instances where refused)
        graphs = [g for g in tessel.dynamo_graphs if hasattr(g, "stats")]
        row["rebinds"] = sum(g.stats.rebinds for g in graphs)
        row["instances"] = sum(g.stats.instances for g in graphs)
        _record(row, "eager", ref, ref_forward, p, new_tokens, cache, rounds, autocast=ref_autocast)
        if profile:
            _profile(model, compiled, p, new_tokens, cache, profile, f"{name} tessel")
            _profile(model, eager_forward, p, new_tokens, cache, profile, f"{name} eager")
        if device_profile:
            _device_profile(model, compiled, p, new_tokens, cache, device_profile, f"{name} tessel", device)
            _device_profile(ref, ref_forward, p, new_tokens, cache, device_profile, f"{name} eager", device,
                            ref_autocast)
        model.forward = eager_forward
        if tessel_default:
            # torch.compile(backend="tessel") as a user writes it, without dynamic=True: dynamo's own automatic
            # dynamic shapes (a graph static first, symbolic in the dims a later call changed; sizes 0 and 1
            # specialised), as Inductor's default column is compiled: each mode against the same mode.
            compiled, col = _tessel_column(model, eager_forward, prompts, want, new_tokens, cache)
            col.update(_figures(*timed(model, compiled, p, new_tokens, cache, rounds)))
            col["compilations_while_timed"] = _compilations() - col["compilations"]
            if device_profile:
                _device_profile(model, compiled, p, new_tokens, cache, device_profile, f"{name} tessel_default", device)
            row["tessel_default"] = col
            model.forward = eager_forward
        for key, kwargs in peers:
            # Inductor as it comes first; where its generated C++ does not compile (torch 2.11's CPU code for
            # these graphs: "'tmp2' was not declared"), again with each of INDUCTOR_RETRY's settings in turn,
            # the one that compiled recorded with its figures ("config"), every failure kept ("errors").
            errors = []
            for patch in [{}] + INDUCTOR_RETRY:
                try:
                    import torch._inductor.config as ic
                    torch._dynamo.reset()
                    with ic.patch(patch):
                        fwd = torch.compile(ref_forward, **kwargs)
                        ref.forward = fwd
                        t0 = time.perf_counter()
                        ind = [generate(ref, q, new_tokens, cache, autocast=ref_autocast) for q in prompts]
                        row[key + "_first_s"] = time.perf_counter() - t0
                        row[key + "_tokens_equal"] = all(torch.equal(g[0], w[0]) for g, w in zip(ind, want))
                        _record(row, key, ref, fwd, p, new_tokens, cache, rounds, autocast=ref_autocast)
                        if device_profile:
                            _device_profile(ref, fwd, p, new_tokens, cache, device_profile, f"{name} {key}", device,
                                            ref_autocast)
                    row[key].update(config=patch, errors=errors)
                    break
                except Exception as e:  # noqa: BLE001 -- a peer's failure is its entry, tessel's figures stand
                    text = f"{type(e).__name__}: {e}"
                    lines = [ln.strip() for ln in text.splitlines() if "error:" in ln][:4]   # (a compiler's own lines)
                    errors.append(dict(config=patch, error=text[:300] + ("\n" + "\n".join(lines) if lines else "")))
                    row[key] = dict(error=errors[-1]["error"], errors=errors)
                finally:
                    model.forward = eager_forward
                    ref.forward = ref_forward
        if hf_compile and cache == "static" and device == "cuda":
            # generate()'s own compile of the model's call (what a transformers user gets by default here)
            try:
                torch._dynamo.reset()
                t0 = time.perf_counter()
                ind = [generate(ref, q, new_tokens, cache, autocast=ref_autocast, auto_compile=True) for q in prompts]
                row["hf_compile_first_s"] = time.perf_counter() - t0
                row["hf_compile_tokens_equal"] = all(torch.equal(g[0], w[0]) for g, w in zip(ind, want))
                _record_whole(row, "hf_compile", ref, p, new_tokens, cache, rounds, autocast=ref_autocast)
            except Exception as e:  # noqa: BLE001 -- a peer's failure is its entry
                row["hf_compile"] = dict(error=f"{type(e).__name__}: {e}"[:300])
    return row


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="gpt2,llama,qwen2")
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--prompts", default="2x7,3x12,1x20", help="batch x length of each prompt (the last one is timed)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=8)
    ap.add_argument("--cache", choices=("dynamic", "static"), default="dynamic")
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--precision", choices=("f32", "bf16"), default="f32",
                    help="bf16 (CUDA): eager and Inductor under bf16 autocast, tessel with bf16 storage")
    ap.add_argument("--size", choices=sorted(SIZES), default="tiny",
                    help="tiny: 128 wide, 2 layers (per-call overhead); small: GPT-2 small's shape (768 wide, 12 layers)")
    ap.add_argument("--no-inductor", action="store_true")
    ap.add_argument("--tessel-default", action="store_true",
                    help="also time torch.compile(backend='tessel') without dynamic=True (column tessel_default)")
    ap.add_argument("--inductor-simdlen", type=int, default=0,
                    help="Inductor's cpp.simdlen (256: AVX2 code, where its AVX-512 code does not compile)")
    ap.add_argument("--profile", help="append a cProfile of one generate(), tessel's and eager's, to this file")
    ap.add_argument("--device-profile", help="append torch.profiler's operator and kernel table of one generate(), "
                    "tessel's and eager's, to this file")
    ap.add_argument("--json")
    a = ap.parse_args()
    if int(torch.__version__.split(".")[0]) < 2:
        raise SystemExit("needs torch >= 2 (torch.compile); this is " + torch.__version__)
    torch.set_num_threads(a.threads)
    tessel.dynamo_options.update(threads=a.threads)
    if a.precision == "bf16":
        if a.device != "cuda":
            raise SystemExit("--precision bf16 is a CUDA option (--device cuda)")
        global AUTOCAST
        AUTOCAST = functools.partial(torch.autocast, "cuda", dtype=torch.bfloat16)
        tessel.dynamo_options.update(precision="bf16")
    g = torch.Generator().manual_seed(0)
    prompts = []
    for spec in a.prompts.split(","):
        b, t = (int(x) for x in spec.split("x"))
        prompts.append(torch.randint(2, 1000, (b, t), generator=g))
    if a.inductor_simdlen:
        import torch._inductor.config as ic
        ic.cpp.simdlen = a.inductor_simdlen
    peers = [] if a.no_inductor else [("inductor", {}), ("inductor_dynamic", dict(dynamic=True))]
    rows = []
    for name in a.models.split(","):
        try:
            row = run_model(name, prompts, a.new_tokens, a.rounds, peers, a.cache, a.profile, a.device, a.size,
                            a.device_profile, not a.no_inductor, a.tessel_default)
        except Exception as e:  # noqa: BLE001 -- one model's failure is a row, the others still run
            row = dict(model=name, error=f"{type(e).__name__}: {e}"[:2000])
        rows.append(row)
        if a.json:       # (after each model: a run cut short keeps the rows it made)
            with open(a.json, "w") as f:
                json.dump(dict(torch=torch.__version__, size=a.size, command=" ".join(sys.argv), threads=a.threads, cache=a.cache, device=a.device,
                               precision=a.precision, rows=rows), f, indent=1)
        if "error" in row:
            print(f"{name}: ERROR {row['error'][:600]}")
            continue
        rate = {k: row[k].get("decode_tokens_per_s") for k in ["tessel", "tessel_default", "eager"] + [p for p, _ in peers] + ["hf_compile"]
                if k in row}
        print(f"{name}: tokens equal {row['tokens_equal']}, logits max rel err {row['max_rel_err_logits']:.2e}, "
              f"tessel graphs {row['tessel_graphs']} ({row['symbolic_graphs']} symbolic), compilations "
              f"{row['compilations']} (per generate() {row['compilations_per_generation']}; bindings {row['bindings']}, rebinds {row['rebinds']}, instances {row['instances']}), fallbacks {len(row['fallbacks'])}; prefill ms "
              f"tessel {row['tessel']['prefill_ms']:.2f} eager {row['eager']['prefill_ms']:.2f}; decode tokens/s "
              + ", ".join(f"{k} {v:.1f}" if v else f"{k} -" for k, v in rate.items()))
        for p, _ in peers:
            for e in row.get(p, {}).get("errors", []):
                print(f"   {p} {e['config'] or 'default'}: ERROR {e['error'][:300]}")
            if row.get(p, {}).get("config"):
                print(f"   {p} compiled with {row[p]['config']}")
        if "tessel_default" in row:
            d = row["tessel_default"]
            print(f"   tessel_default: tokens equal {d['tokens_equal']}, graphs {d['tessel_graphs']} ({d['symbolic_graphs']} "
                  f"symbolic), compilations {d['compilations']} (per generate() {d['compilations_per_generation']}), "
                  f"fallbacks {len(d['fallbacks'])}" + "".join(f"\n   fallback: {f[:300]}" for f in d["fallbacks"][:3]))
        for f in row["fallbacks"][:6]:
            print("   fallback:", f[:400])
        for r in row["recompiles"][:6]:
            print("   recompile:", r[:300])
        for r in row["dynamic_fallbacks"][:3]:
            print("   dynamic fallback:", r[:400])
    return 0 if all("error" not in r for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
