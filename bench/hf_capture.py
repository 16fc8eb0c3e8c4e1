"""tessel.compile (make_fx capture) on unmodified Hugging Face transformers models, called as a user calls
them: model(input_ids=..., attention_mask=...) (and decoder_input_ids for T5), return_dict and use_cache
at their defaults (a ModelOutput holding a DynamicCache for decoders). Per model: the output's types and
every tensor in it against eager, for an all-ones mask, a padded mask (a value guard: another
specialisation) and new ids; the value guards, recompiles, breaks, fallbacks; eager and tessel ms.
Random weights from configs (nothing downloaded). JSON out. docs/BENCHMARKS.md, "tessel.compile on
transformers models".

    PYTHONPATH=build/python python3 bench/hf_capture.py --models gpt2,llama,bart,bert,t5 --threads 8 --json out.json
"""
import argparse
import json
import statistics
import time
import traceback

import torch

import tessel
from tessel import _structure

_SMALL = dict(hidden_size=256, intermediate_size=688, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, vocab_size=4000, max_position_embeddings=256)
MODELS = {   # name: (config model_type, overrides, inputs)
    "gpt2": ("gpt2", dict(n_layer=2, n_embd=256, n_head=4, vocab_size=4000), "ids,mask"),
    "llama": ("llama", _SMALL, "ids,mask"),
    "mistral": ("mistral", _SMALL, "ids,mask"),
    "qwen2": ("qwen2", _SMALL, "ids,mask"),
    "opt": ("opt", dict(num_hidden_layers=2, hidden_size=256, ffn_dim=688, num_attention_heads=4,
                        word_embed_proj_dim=256, vocab_size=4000), "ids,mask"),
    "bart": ("bart", dict(encoder_layers=2, decoder_layers=2, d_model=256, encoder_ffn_dim=688, decoder_ffn_dim=688,
                          encoder_attention_heads=4, decoder_attention_heads=4, vocab_size=4000), "ids,mask"),
    "bert": ("bert", dict(num_hidden_layers=2, hidden_size=256, intermediate_size=688, num_attention_heads=4,
                          vocab_size=4000), "ids,mask"),
    "roberta": ("roberta", dict(num_hidden_layers=2, hidden_size=256, intermediate_size=688, num_attention_heads=4,
                                vocab_size=4000), "ids,mask"),
    "distilbert": ("distilbert", dict(n_layers=2, dim=256, hidden_dim=688, n_heads=4, vocab_size=4000), "ids,mask"),
    "t5": ("t5", dict(num_layers=2, num_decoder_layers=2, d_model=256, d_ff=688, num_heads=4, d_kv=64,
                      vocab_size=4000), "ids,mask,dec"),
}


def build(name, seq):
    import transformers
    model_type, overrides, kind = MODELS[name]
    cfg = transformers.AutoConfig.for_model(model_type, **overrides)
    model = transformers.AutoModel.from_config(cfg).eval()
    g = torch.Generator().manual_seed(0)
    vocab = cfg.vocab_size

    def inputs(pad):
        ids = torch.randint(3, vocab, (1, seq), generator=g)
        mask = torch.ones(1, seq, dtype=torch.long)
        if pad:
            mask[:, -pad:] = 0
        kw = dict(input_ids=ids, attention_mask=mask)
        if kind.endswith(",dec"):
            kw["decoder_input_ids"] = torch.randint(3, vocab, (1, seq // 2), generator=g)
        return kw
    return model, inputs


def describe(v):
    """The output's structure as text: its types, and each tensor's shape."""
    if isinstance(v, torch.Tensor):
        return f"Tensor{list(v.shape)}"
    if isinstance(v, (list, tuple)):
        return f"{type(v).__name__}[{', '.join(describe(x) for x in v)}]"
    if isinstance(v, dict):
        return f"{type(v).__name__}{{{', '.join(f'{k}: {describe(x)}' for k, x in v.items())}}}"
    if hasattr(v, "__dict__"):
        parts = [f"{k}: {describe(x)}" for k, x in vars(v).items() if _has_tensor(x)]
        return f"{type(v).__name__}({', '.join(parts)})"
    return type(v).__name__


def _has_tensor(v):
    try:
        return bool(_structure.flatten(v)[0])
    except _structure.Unsupported:
        return False


def compare(out, ref):
    """(same structure, max relative error over every tensor of the output)."""
    same = describe(out) == describe(ref)
    a, b = _structure.flatten(out)[0], _structure.flatten(ref)[0]
    if len(a) != len(b):
        return False, float("inf")
    err = 0.0
    for x, y in zip(a, b):
        if x.shape != y.shape:
            return False, float("inf")
        if x.numel():
            err = max(err, ((x.double() - y.double()).abs().max() / y.double().abs().max().clamp_min(1e-30)).item())
    return same, err


def time_ms(fn, kw, iters):
    ts = []
    with torch.no_grad():
        fn(**kw)
        for _ in range(iters):
            t0 = time.perf_counter()
            fn(**kw)
            ts.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(ts)


def run(name, a):
    rec = dict(model=name)
    model, inputs = build(name, a.seq)
    full, padded, other = inputs(0), inputs(3), inputs(0)
    t0 = time.perf_counter()
    try:
        fast = tessel.compile(model, (), example_kwargs=full, threads=a.threads)
    except Exception as e:  # noqa: BLE001 -- recorded per model
        rec.update(error=f"{type(e).__name__}: {str(e).splitlines()[0][:400]}")
        return rec
    rec["compile_s"] = round(time.perf_counter() - t0, 3)
    checks = []
    with torch.no_grad():
        for label, kw in (("full mask", full), ("padded mask", padded), ("new ids", other), ("padded again", padded)):
            try:
                out = fast(**kw)
            except Exception as e:  # noqa: BLE001
                checks.append(dict(call=label, error=f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"))
                continue
            same, err = compare(out, model(**kw))
            checks.append(dict(call=label, same_structure=same, max_rel=err))
        rec["structure"] = describe(fast(**full))
    rec["checks"] = checks
    rec["ok"] = all(c.get("same_structure") and c.get("max_rel", 1) <= 1e-4 for c in checks)
    e = fast.explanation
    rec.update(guards=e.guards, breaks=e.break_count, fallbacks=e.fallbacks, graphs=e.graph_count,
               compiles=fast.stats.compiles, recompiles=fast.stats.recompiles)
    rec["eager_ms"] = round(time_ms(model, full, a.iters), 3)
    rec["tessel_ms"] = round(time_ms(fast, full, a.iters), 3)
    return rec


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="gpt2,llama,bart,bert,t5")
    ap.add_argument("--threads", type=int, default=8)
    ap.add_argument("--seq", type=int, default=32)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--json")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    import transformers
    print(f"torch {torch.__version__} transformers {transformers.__version__} threads {a.threads}", flush=True)
    recs = []
    for name in [m.strip() for m in a.models.split(",") if m.strip()]:
        try:
            rec = run(name, a)
        except Exception as e:  # noqa: BLE001
            rec = dict(model=name, error=f"{type(e).__name__}: {e}", trace=traceback.format_exc()[-1500:])
        recs.append(rec)
        print(json.dumps(rec, default=str), flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(dict(torch=torch.__version__, transformers=transformers.__version__, threads=a.threads,
                           models=recs), f, indent=1, default=str)
    ok = sum(1 for r in recs if r.get("ok"))
    print(f"{ok} of {len(recs)} models exact (<= 1e-4 rel, same output structure) on every call")


if __name__ == "__main__":
    main()
