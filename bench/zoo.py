#!/usr/bin/python3
"""The model zoo: real models (random weights) through tessel's PyTorch front doors against eager.

Per model: graphs, graph breaks, aten fallbacks (which ops; in-place ones counted apart), compile
seconds (capture + compile + first call), eager ms / tessel ms (/ inductor ms where torch >= 2) at one
thread count, and the relative error against eager. Families: torchvision classification (always),
timm and transformers (when they import; models are built from configs, nothing is downloaded).

    PYTHONPATH=build/python /usr/bin/python3 bench/zoo.py [--models LIST] [--modes LIST] [--threads 2]
        [--iters 10] [--rounds 3] [--small] [--no-inplace] [--backend compiled] [--json out.json] [--list]
        [--markdown] [--from-json saved.json] [--device cuda] [--precision bf16]

--models: comma-separated model names and/or families (`torchvision`, `tv-core` (one per torchvision
family), `timm`, `transformers`, `all`); default `tv-core`. --modes: `tessel` (tessel.compile: make_fx,
parameters as constants), `dynamo` (torch.compile(backend="tessel"), torch >= 2), `inductor`
(torch.compile's default backend, torch >= 2, as the peer), `inductor-frozen` (Inductor as its CPU
dashboards run inference: options freezing=True and cpp_wrapper=True, recorded per row; not in the
default); default: those this torch has.
--small: small inputs where the model allows (64x64 images, 32 tokens) for a quick coverage pass.
--no-inplace: set `inplace=False` on every module that has the flag (shows the fallbacks that
remain once in-place ops are functionalized). A model or mode that cannot run here is listed as
skipped with the reason; an error is recorded and the run goes on.
--device cuda: models and inputs on cuda:0, so tessel compiles for its CUDA target (docs/python.md, "CUDA
tensors"); times are taken after torch.cuda.synchronize(). Under torch.compile a graph tessel cannot compile
runs in PyTorch with a warning: those graphs are counted per model (`tessel_fallbacks`), with the first
reasons. --precision bf16 (CUDA only): tessel computes in bf16 storage; eager and Inductor stay f32, so the
error column is against f32 eager; two yardsticks are printed beside it, each against f32 eager: the model
cast to bf16 (`eager bf16 err`) and the f32 model under torch.autocast(bf16) (`autocast bf16 err`).
"""
import argparse
import collections
import gc
import inspect
import json
import platform
import re
import statistics
import sys
import time
import traceback

import torch

try:
    import tessel
except ImportError as e:   # pragma: no cover - the bench needs the package
    sys.exit(f"zoo.py: cannot import tessel ({e}); run with PYTHONPATH=build/python")

TORCH2 = int(torch.__version__.split(".")[0]) >= 2

# ---- model families ------------------------------------------------------------------------------
# torchvision: every classification builder; input resolution per model (vit/swin/maxvit need 224,
# inception 299 (75 at least)).
TV_CORE = ["alexnet", "convnext_tiny", "densenet121", "efficientnet_b0", "efficientnet_v2_s", "googlenet",
           "inception_v3", "maxvit_t", "mnasnet0_5", "mobilenet_v2", "mobilenet_v3_large", "mobilenet_v3_small",
           "regnet_x_400mf", "regnet_y_400mf", "resnet18", "resnet50", "resnext50_32x4d", "shufflenet_v2_x1_0",
           "squeezenet1_1", "swin_t", "swin_v2_t", "vgg11", "vit_b_16", "wide_resnet50_2"]

TIMM = ["resnet50", "efficientnet_b0", "convnext_tiny", "vit_base_patch16_224", "deit_small_patch16_224",
        "swin_tiny_patch4_window7_224", "mobilenetv3_large_100", "regnety_008", "densenet121", "cspresnet50",
        "ghostnet_100", "mixer_b16_224", "beit_base_patch16_224", "poolformer_s12", "levit_128", "rexnet_100",
        "dla34", "efficientformer_l1", "convmixer_768_32", "xcit_tiny_12_p16_224", "coat_lite_tiny", "maxvit_tiny_tf_224"]

# transformers: (config model_type, config overrides, input kind); llama-style ones get small sizes
# (their default configs are 7B).
_SMALL_DEC = dict(hidden_size=512, intermediate_size=1376, num_hidden_layers=4, num_attention_heads=8,
                  num_key_value_heads=4, vocab_size=8000, max_position_embeddings=512)
TRANSFORMERS = {
    "bert": ("bert", {}, "text"),
    "roberta": ("roberta", {}, "text"),
    "distilbert": ("distilbert", {}, "text"),
    "albert": ("albert", {}, "text"),
    "electra": ("electra", {}, "text"),
    "deberta_v2": ("deberta-v2", dict(num_hidden_layers=4), "text"),
    "gpt2": ("gpt2", {}, "text"),
    "gpt_neo": ("gpt_neo", dict(num_layers=4, attention_types=[[["global", "local"], 2]]), "text"),
    "opt": ("opt", dict(num_hidden_layers=4), "text"),
    "bart": ("bart", {}, "seq2seq"),
    "t5": ("t5", {}, "seq2seq"),
    "vit": ("vit", {}, "image"),
    "whisper_encoder": ("whisper", {}, "audio"),
    "llama": ("llama", _SMALL_DEC, "text"),
    "mistral": ("mistral", _SMALL_DEC, "text"),
    "qwen2": ("qwen2", _SMALL_DEC, "text"),
    "phi": ("phi", dict(hidden_size=512, intermediate_size=1376, num_hidden_layers=4, num_attention_heads=8,
                        vocab_size=8000), "text"),
}

Skip = collections.namedtuple("Skip", "reason")


def _tv_names():
    import torchvision.models as M
    if hasattr(M, "list_models"):
        return sorted(M.list_models(module=M))
    return sorted(n for n in dir(M) if n[0].islower() and not n.startswith("_") and callable(getattr(M, n))
                  and n not in ("get_model", "get_model_builder", "get_model_weights", "get_weight", "list_models"))


def build_torchvision(name, small):
    import torchvision.models as M
    kwargs = {}
    if name in ("inception_v3", "googlenet"):
        kwargs = dict(aux_logits=False, init_weights=False)    # eval-mode outputs are the logits only
    m = getattr(M, name)(weights=None, **kwargs)
    res = 299 if name == "inception_v3" else 224
    if small and not name.startswith(("vit_", "swin_", "maxvit")):
        res = 96 if name == "inception_v3" else 64
    return m, (torch.randn(1, 3, res, res),)


def build_timm(name, small):
    import timm
    m = timm.create_model(name, pretrained=False)
    cfg = getattr(m, "pretrained_cfg", None) or getattr(m, "default_cfg", {}) or {}
    shape = tuple(cfg.get("input_size", (3, 224, 224)))
    return m, (torch.randn(1, *shape),)


class _FirstTensor(torch.nn.Module):
    """A transformers model returning its first output tensor (last_hidden_state / logits)."""

    def __init__(self, model, kind):
        super().__init__()
        self.model = model
        self.kind = kind

    def forward(self, *xs):
        if self.kind == "seq2seq":
            out = self.model(input_ids=xs[0], decoder_input_ids=xs[1], use_cache=False, return_dict=False)
        elif self.kind == "image":
            out = self.model(pixel_values=xs[0], return_dict=False)
        elif self.kind == "audio":
            out = self.model(input_features=xs[0], return_dict=False)
        else:
            kw = {"use_cache": False} if "use_cache" in inspect.signature(self.model.forward).parameters else {}
            out = self.model(input_ids=xs[0], return_dict=False, **kw)
        return out[0]


def build_transformers(name, small):
    import transformers
    model_type, overrides, kind = TRANSFORMERS[name]
    cfg = transformers.AutoConfig.for_model(model_type, **overrides)
    if kind == "audio":
        model = transformers.AutoModel.from_config(cfg).get_encoder()
    else:
        model = transformers.AutoModel.from_config(cfg)
    seq = 32 if small else 128
    vocab = getattr(cfg, "vocab_size", 1000)
    g = torch.Generator().manual_seed(0)
    if kind == "image":
        size = getattr(cfg, "image_size", 224)
        ins = (torch.randn(1, getattr(cfg, "num_channels", 3), size, size),)
    elif kind == "audio":
        ins = (torch.randn(1, cfg.num_mel_bins, 2 * cfg.max_source_positions),)
    elif kind == "seq2seq":
        ins = (torch.randint(0, vocab, (1, seq), generator=g), torch.randint(0, vocab, (1, seq), generator=g))
    else:
        ins = (torch.randint(0, vocab, (1, seq), generator=g),)
    return _FirstTensor(model, kind), ins


def resolve(spec):
    """[(family, name)] for a --models spec."""
    out = []
    for item in [s.strip() for s in spec.split(",") if s.strip()]:
        if item == "all":
            out += resolve("torchvision,timm,transformers")
        elif item == "torchvision":
            out += [("torchvision", n) for n in _tv_names()]
        elif item == "tv-core":
            out += [("torchvision", n) for n in TV_CORE]
        elif item == "timm":
            out += [("timm", n) for n in TIMM]
        elif item == "transformers":
            out += [("transformers", n) for n in TRANSFORMERS]
        elif ":" in item:
            fam, n = item.split(":", 1)
            out.append((fam, n))
        elif item in TRANSFORMERS:
            out.append(("transformers", item))
        else:
            out.append(("torchvision", item))
    seen, uniq = set(), []
    for x in out:
        if x not in seen:
            seen.add(x)
            uniq.append(x)
    return uniq


BUILDERS = {"torchvision": ("torchvision", build_torchvision), "timm": ("timm", build_timm),
            "transformers": ("transformers", build_transformers)}


def build(family, name, small):
    if family not in BUILDERS:
        return Skip(f"unknown family {family!r}")
    pkg, fn = BUILDERS[family]
    try:
        __import__(pkg)
    except Exception as e:  # noqa: BLE001 -- an absent package is a skip, whatever it raises
        return Skip(f"{pkg} does not import here ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})")
    try:
        m, ins = fn(name, small)
    except Exception as e:  # noqa: BLE001
        return Skip(f"cannot build {family}:{name}: {one_line(e)}")
    return m.eval(), ins


def no_zero_weights(model):
    """Random weights where a builder zeroes a layer (torchvision's vit heads): an all-zero output
    would compare equal to anything."""
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() >= 2 and not p.any():
                p.normal_(0, 0.02)


def no_inplace(model):
    for mod in model.modules():
        if getattr(mod, "inplace", None) is True:
            mod.inplace = False


# ---- measuring -----------------------------------------------------------------------------------
def rel_err(out, ref):
    a, b = _first_tensor(out), _first_tensor(ref)
    if a is None or b is None or a.shape != b.shape:
        return float("inf")
    a, b = a.double(), b.double()
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-30))


def one_line(e, n=200):
    """An exception as one line: its type and the first line of its text, cut at n characters."""
    return f"{type(e).__name__}: {str(e).splitlines()[0][:n] if str(e) else ''}"


def _cast_bf16(model, ins, device):
    """The model cast to bf16 (`model.to(torch.bfloat16)`), its floating inputs too."""
    import copy
    return copy.deepcopy(model).to(torch.bfloat16)(*[t.to(torch.bfloat16) if t.is_floating_point() else t for t in ins])


def _autocast_bf16(model, ins, device):
    """The f32 model under torch.autocast(bf16): PyTorch's own way to run an f32 model in bf16 (bf16 where
    matmuls and convolutions read and write, f32 elsewhere; docs/decisions.md)."""
    with torch.autocast(device, dtype=torch.bfloat16):
        return model(*ins)


# --precision bf16's yardsticks: (record key, label, run).
YARDSTICKS = (("eager_bf16_rel_err", "eager bf16", _cast_bf16), ("autocast_bf16_rel_err", "autocast bf16", _autocast_bf16))


def _first_tensor(x):
    if isinstance(x, torch.Tensor):
        return x
    if isinstance(x, (list, tuple)):
        for v in x:
            t = _first_tensor(v)
            if t is not None:
                return t
    if isinstance(x, dict):
        return _first_tensor(list(x.values()))
    return None


def _sync():
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


def time_ms(fn, ins, iters, warmup=2):
    with torch.no_grad():
        for _ in range(warmup):
            fn(*ins)
        ts = []
        for _ in range(iters):
            _sync()
            t0 = time.perf_counter()
            fn(*ins)
            _sync()
            ts.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(ts)


_ATEN_RE = re.compile(r"aten[. ]op (aten\.[A-Za-z0-9_]+(?:\.[A-Za-z0-9_]+)?)|unsupported aten op (aten\.[\w.]+)")


def classify_breaks(breaks):
    """(aten fallbacks {op: count}, in-place fallbacks {op: count}, other breaks {op: count})."""
    fb, inplace, other = collections.Counter(), collections.Counter(), collections.Counter()
    for b in breaks:
        m = _ATEN_RE.search(b.get("reason", ""))
        if m:
            op = m.group(1) or m.group(2)
            packet = op.split(".")[1]
            (inplace if packet.endswith("_") and not packet.endswith("__") else fb)[op] += 1
        else:
            other[b.get("op", "?")] += 1
    return dict(fb), dict(inplace), dict(other)


def compile_tessel(model, ins, a, ref):
    t0 = time.perf_counter()
    fast = tessel.compile(model, ins, backend=a.backend, threads=a.threads, precision=a.precision)
    with torch.no_grad():
        out = fast(*ins)
    _sync()
    compile_s = time.perf_counter() - t0
    ex = fast.explanation
    fb, inplace, other = classify_breaks(ex.breaks)
    r = dict(graphs=ex.graph_count, breaks=ex.break_count, aten_fallbacks=fb, inplace_fallbacks=inplace,
             other_breaks=other, compile_s=round(compile_s, 3), rel_err=rel_err(out, ref))
    return fast, r


# Inductor in the form its own CPU dashboards run inference (issue 37): the parameters frozen into the graph
# as constants (weights prepacked, constant folding) and the C++ wrapper instead of the Python one.
INDUCTOR_FROZEN = {"freezing": True, "cpp_wrapper": True}


def compile_dynamo(model, ins, a, ref, backend):
    import torch._dynamo
    torch._dynamo.reset()
    options = None
    if backend == "inductor-frozen":
        backend, options = "inductor", dict(INDUCTOR_FROZEN)
    if backend == "tessel":
        tessel.dynamo_options.update(dict(backend=a.backend, threads=a.threads, precision=a.precision))
        del tessel.dynamo_graphs[:]
        del tessel.dynamo_fallbacks[:]
    t0 = time.perf_counter()
    fn = torch.compile(model, backend=backend, options=options) if options else torch.compile(model, backend=backend)
    with torch.no_grad():
        out = fn(*ins)
    _sync()
    compile_s = time.perf_counter() - t0
    r = dict(compile_s=round(compile_s, 3), rel_err=rel_err(out, ref))
    if options:
        r["settings"] = options
    if backend == "tessel":
        r["tessel_fallbacks"] = len(tessel.dynamo_fallbacks)
        r["fallback_reasons"] = [f[:300] for f in tessel.dynamo_fallbacks[:3]]
        r["targets"] = sorted({g.target for g in tessel.dynamo_graphs})
        breaks = [b for g in tessel.dynamo_graphs for b in g.explanation.breaks]
        fb, inplace, other = classify_breaks(breaks)
        r.update(graphs=sum(g.explanation.graph_count for g in tessel.dynamo_graphs),
                 dynamo_graphs=len(tessel.dynamo_graphs), breaks=len(breaks), aten_fallbacks=fb,
                 inplace_fallbacks=inplace, other_breaks=other)
    return fn, r


def run_model(family, name, a):
    rec = dict(family=family, model=name, device=a.device, precision=a.precision)
    built = build(family, name, a.small)
    if isinstance(built, Skip):
        rec["skipped"] = built.reason
        return rec
    model, ins = built
    if a.device != "cpu":
        model = model.to(a.device)
        ins = tuple(t.to(a.device) for t in ins)
    if a.no_inplace:
        no_inplace(model)
    no_zero_weights(model)
    rec["inputs"] = [list(t.shape) for t in ins]
    torch.manual_seed(0)
    with torch.no_grad():
        ref = model(*ins)
    if a.precision == "bf16":   # PyTorch's bf16 runs of the same model, each against f32 eager (YARDSTICKS)
        for key, _, run16 in YARDSTICKS:
            try:
                with torch.no_grad():
                    rec[key] = rel_err(run16(model, ins, a.device), ref)
            except Exception as e:  # noqa: BLE001
                rec[key] = one_line(e)
    timed = [("eager", model)]
    for mode in a.modes:
        try:
            if mode == "tessel":
                fn, rec[mode] = compile_tessel(model, ins, a, ref)
            elif not TORCH2:
                rec[mode] = dict(skipped=f"torch.compile needs torch >= 2 (this is {torch.__version__})")
                continue
            else:
                fn, rec[mode] = compile_dynamo(model, ins, a, ref, "tessel" if mode == "dynamo" else mode)
            timed.append((mode, fn))
        except Exception as e:  # noqa: BLE001 -- one model's failure is a row, not the end of the run
            msg = str(e).splitlines()[0][:300] if str(e) else ""
            rec[mode] = dict(error=f"{type(e).__name__}: {msg}")
            if a.verbose:
                traceback.print_exc()
    # Rounds interleave the systems (eager, tessel, ...), so load from other processes hits all of
    # them; each figure is the median over rounds of the per-round medians.
    rounds = collections.defaultdict(list)
    for _ in range(a.rounds):
        for label, fn in timed:
            try:
                rounds[label].append(time_ms(fn, ins, a.iters))
            except Exception as e:  # noqa: BLE001
                rec[label] = dict(error=f"while timing: {type(e).__name__}: {str(e).splitlines()[0][:300]}")
                timed = [t for t in timed if t[0] != label]
                break
    for label, ts in rounds.items():
        if label == "eager":
            rec["eager_ms"] = statistics.median(ts)
        elif "error" not in rec[label]:
            rec[label]["ms"] = statistics.median(ts)
            rec[label]["round_ms"] = ts
    del model, timed
    gc.collect()
    return rec


# ---- report --------------------------------------------------------------------------------------
def _fmt_ops(d):
    return ",".join(f"{k.replace('aten.', '')}x{v}" for k, v in sorted(d.items())) or "-"


def row(rec, modes):
    if "skipped" in rec:
        return f"{rec['family']}:{rec['model']:<24} skipped: {rec['skipped']}"
    cells = [f"{rec['family']}:{rec['model']:<24}", f"eager {rec.get('eager_ms', float('nan')):8.2f} ms"]
    for key, label, _ in YARDSTICKS:
        e = rec.get(key)
        if e is not None:
            cells.append(f"{label} err {e:.1e}" if isinstance(e, float) else f"{label}: {e}")
    for m in modes:
        r = rec.get(m, {})
        if "skipped" in r:
            cells.append(f"{m}: skipped ({r['skipped']})")
        elif "error" in r:
            cells.append(f"{m}: ERROR {r['error']}")
        elif "rel_err" in r:
            c = f"{m} {r['ms']:8.2f} ms x{rec['eager_ms'] / r['ms']:.2f}" if "ms" in r else m
            c += f" err {r['rel_err']:.1e} compile {r['compile_s']:.1f}s"
            if "breaks" in r:
                c += (f" graphs {r['graphs']} breaks {r['breaks']} fallbacks {_fmt_ops(r['aten_fallbacks'])}"
                      f" inplace {sum(r['inplace_fallbacks'].values())}")
            if r.get("tessel_fallbacks"):
                c += f" GRAPHS IN PYTORCH {r['tessel_fallbacks']} ({r['fallback_reasons'][0][:120]})"
            cells.append(c)
    return " | ".join(cells)


def a_precision(recs):
    return next((r.get("precision") for r in recs if r.get("precision")), "f32")


def summary(recs, modes):
    lines = []
    for m in modes:
        done = [r for r in recs if isinstance(r.get(m), dict) and "rel_err" in r[m]]
        if not done:
            continue
        zero_fb = [r for r in done if not r[m].get("aten_fallbacks") and not r[m].get("tessel_fallbacks")]
        speed = [r["eager_ms"] / r[m]["ms"] for r in done if "ms" in r[m] and "eager_ms" in r]
        bar = 2e-2 if a_precision(recs) == "bf16" and not m.startswith("inductor") else 1e-4
        ok = [r for r in done if r[m]["rel_err"] <= bar]
        for key, label, _ in YARDSTICKS:
            ys = [r for r in done if isinstance(r.get(key), float)]
            if ys:
                lines.append(f"{label}: {sum(r[key] <= bar for r in ys)} of {len(ys)} within {bar:g} of f32 eager; "
                             f"{m} no worse than {label} (or within {bar:g}) on {sum(r[m]['rel_err'] <= max(bar, r[key]) for r in ys)}")
        lines.append(f"{m}: {len(done)} ran, {len(ok)} within {bar:g} of eager, {len(zero_fb)} with 0 aten fallbacks "
                     f"(in-place excluded)" + (" and every graph in tessel" if not m.startswith("inductor") else "") + (f", median speed-up vs eager x{statistics.median(speed):.2f}" if speed else ""))
    return lines


def markdown(recs, modes):
    """The run as a markdown table (docs/BENCHMARKS.md)."""
    head = ["model", "eager ms"]
    for m in modes:
        head += [f"{m} ms", f"{m} ×", f"{m} err", f"{m} compile s", f"{m} breaks (in-place)", f"{m} aten fallbacks"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for rec in recs:
        if "skipped" in rec:
            lines.append(f"| {rec['family']}:{rec['model']} | skipped: {rec['skipped']} |")
            continue
        eager = rec.get("eager_ms")
        cells = [f"{rec['family']}:{rec['model']}", f"{eager:.1f}" if eager else "-"]
        for m in modes:
            r = rec.get(m, {})
            if "rel_err" not in r:
                cells += [r.get("skipped") or r.get("error", "-")] + [""] * 5
                continue
            ms = r.get("ms")
            cells += [f"{ms:.1f}" if ms else "-", f"{eager / ms:.2f}" if ms and eager else "-", f"{r['rel_err']:.1e}",
                      f"{r['compile_s']:.1f}",
                      f"{r.get('breaks', '-')} ({sum(r.get('inplace_fallbacks', {}).values())})" if "breaks" in r else "-",
                      _fmt_ops(r.get("aten_fallbacks", {}))]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="tv-core")
    ap.add_argument("--modes", default=None)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=1,
                    help="timing rounds, interleaving eager and the modes (0: no timing, a coverage and accuracy pass)")
    ap.add_argument("--backend", default="compiled")
    ap.add_argument("--small", action="store_true")
    ap.add_argument("--no-inplace", action="store_true")
    ap.add_argument("--json")
    ap.add_argument("--list", action="store_true", help="print the resolved model list and exit")
    ap.add_argument("--verbose", action="store_true")
    ap.add_argument("--markdown", action="store_true", help="also print the run as a markdown table")
    ap.add_argument("--from-json", help="print the summary (and --markdown table) of a saved run and exit")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--precision", default="f32", choices=["f32", "bf16"])
    a = ap.parse_args()
    if a.precision != "f32" and a.device != "cuda":
        ap.error("--precision bf16 needs --device cuda")
    a.modes = [m.strip() for m in (a.modes or ("tessel,dynamo,inductor" if TORCH2 else "tessel")).split(",") if m.strip()]
    for m in a.modes:
        if m not in ("tessel", "dynamo", "inductor", "inductor-frozen"):
            ap.error(f"unknown mode {m!r} (tessel, dynamo, inductor, inductor-frozen)")
    if a.from_json:
        with open(a.from_json) as f:
            saved = json.load(f)
        modes = saved["env"]["modes"]
        for line in summary(saved["models"], modes):
            print(line)
        if a.markdown:
            print(markdown(saved["models"], modes))
        return
    models = resolve(a.models)
    if a.list:
        print("\n".join(f"{f}:{n}" for f, n in models))
        return
    torch.set_num_threads(a.threads)
    if a.device == "cuda":   # eager's and Inductor's f32 as tessel's: no TF32 (cuDNN's convolutions default to it)
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    env = dict(python=platform.python_version(), torch=torch.__version__, threads=a.threads, backend=a.backend,
               small=a.small, no_inplace=a.no_inplace, modes=a.modes, device=a.device, precision=a.precision, machine=platform.machine(),
               cpus=__import__("os").cpu_count(), cores_usable=len(__import__("os").sched_getaffinity(0)),
               load=[round(x, 2) for x in __import__("os").getloadavg()])
    for pkg in ("torchvision", "timm", "transformers"):
        try:
            env[pkg] = __import__(pkg).__version__
        except Exception as e:  # noqa: BLE001
            env[pkg] = f"absent ({type(e).__name__})"
    print(json.dumps(env), flush=True)
    recs = []
    for fam, name in models:
        rec = run_model(fam, name, a)
        recs.append(rec)
        print(row(rec, a.modes), flush=True)
        if a.json:   # written after every model, so a long run that is stopped keeps what it did
            with open(a.json, "w") as f:
                json.dump(dict(env=env, models=recs), f, indent=1)
    for line in summary(recs, a.modes):
        print(line)
    if a.markdown:
        print(markdown(recs, a.modes))


if __name__ == "__main__":
    main()
