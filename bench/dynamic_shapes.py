"""tessel.compile(..., dynamic=True) over 20 random input shapes per model (docs/dynamic-shapes.md, issue 34):
one compilation serves them all; each shape's output against eager; and each shape's steady call time
against a static compilation of that very shape, the two alternated call by call (ABBA) in this process so
that a busy machine slows both alike. The figure per model is the median over the shapes of
(dynamic median / static median). JSON out.

Models: `bert` and `gpt2` (Hugging Face configs with random weights: needs transformers, the GPU box),
`encoder` (torch's nn.TransformerEncoder, two pre-LN layers: on torch 1.13 its fused fast path, taken under
no_grad, has no symbolic meta function, so it compiles per shape there), `resnet18` and `mobilenet_v2`
(torchvision, varying batch at 64x64).

    PYTHONPATH=build/python /usr/bin/python3 bench/dynamic_shapes.py --models resnet18,mobilenet_v2 --json out.json
"""
import argparse
import json
import random
import statistics
import sys
import time

import torch

import tessel


def _hf(kind):
    import transformers
    if kind == "bert":
        cfg = transformers.BertConfig(vocab_size=1000, hidden_size=128, num_hidden_layers=2, num_attention_heads=2,
                                      intermediate_size=512, max_position_embeddings=512, hidden_dropout_prob=0.0,
                                      attention_probs_dropout_prob=0.0)
        m = transformers.BertModel(cfg).eval()
        return lambda ids: m(input_ids=ids, return_dict=False)[0], m
    cfg = transformers.GPT2Config(vocab_size=1000, n_embd=128, n_layer=2, n_head=2, n_positions=512, resid_pdrop=0.0,
                                  embd_pdrop=0.0, attn_pdrop=0.0)
    m = transformers.GPT2LMHeadModel(cfg).eval()
    # (an attention mask, as generate() passes one: without it transformers looks for packed sequences in the
    # position ids, a data-dependent branch a trace cannot take)
    return lambda ids: m(input_ids=ids, attention_mask=torch.ones_like(ids), use_cache=False, return_dict=False)[0], m


class Wrap(torch.nn.Module):
    def __init__(self, fn, owner):
        super().__init__()
        self.owner = owner
        self.fn = fn

    def forward(self, *args):
        return self.fn(*args)


def build(name):
    """(module, make_inputs(rng) -> tuple of tensors, description of the varied dims). The varied dims are
    the ones tessel.compile is told are dynamic (DIMS)."""
    torch.manual_seed(0)
    if name in ("bert", "gpt2"):
        fn, owner = _hf(name)
        return Wrap(fn, owner), lambda r: (torch.randint(0, 1000, (r.randint(2, 4), r.randint(8, 128)),
                                                         generator=torch.Generator().manual_seed(r.randint(0, 1 << 30))),), \
            "batch 2-4, seq 8-128"
    if name == "encoder":
        # (SiLU: with ReLU or GELU, eval under no_grad takes torch's fused encoder fast path, which has no
        # symbolic meta function on torch 1.13)
        layer = torch.nn.TransformerEncoderLayer(128, 4, 512, dropout=0.0, activation=torch.nn.functional.silu,
                                                 batch_first=True, norm_first=True)
        m = torch.nn.TransformerEncoder(layer, 2, enable_nested_tensor=False).eval()
        return m, lambda r: (torch.randn(r.randint(2, 4), r.randint(8, 128), 128,
                                         generator=torch.Generator().manual_seed(r.randint(0, 1 << 30))),), \
            "batch 2-4, seq 8-128"
    import torchvision
    m = getattr(torchvision.models, name)().eval()
    return m, lambda r: (torch.randn(r.randint(2, 8), 3, 64, 64,
                                     generator=torch.Generator().manual_seed(r.randint(0, 1 << 30))),), "batch 2-8"


# tessel.compile's dynamic_dims per model: the dims the bench varies (a convolution's spatial dims stay
# static: only its batch may be symbolic).
DIMS = {"bert": {0: [0, 1]}, "gpt2": {0: [0, 1]}, "encoder": {0: [0, 1]}}


def rel_err(a, b):
    return float((a - b).abs().max() / max(float(b.abs().max()), 1e-30))


def paired(f, g, args, rounds):
    """Median call times (ms) of f and g, alternated ABBA for `rounds` pairs."""
    tf, tg = [], []
    for k in range(rounds):
        for fn, acc in ((f, tf), (g, tg)) if k % 2 == 0 else ((g, tg), (f, tf)):
            t0 = time.perf_counter()
            fn(*args)
            acc.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(tf), statistics.median(tg)


def run_model(name, shapes, threads, rounds, static):
    module, draw, varied = build(name)
    r = random.Random(7)
    sets = [draw(r) for _ in range(shapes)]
    row = dict(model=name, varied=varied, shapes=[], threads=threads)
    with torch.no_grad():
        t0 = time.perf_counter()
        dyn = tessel.compile(module, sets[0], dynamic_dims=DIMS.get(name, {0: [0]}), threads=threads)
        dyn(*sets[0])
        row["first_call_s"] = time.perf_counter() - t0
        for args in sets:
            want = module(*args)
            got = dyn(*args)
            s = dict(shape=[list(a.shape) for a in args], rel_err=rel_err(got, want))
            if static:
                st = tessel.compile(module, args, threads=threads)
                st(*args)
                s["dynamic_ms"], s["static_ms"] = paired(dyn, st, args, rounds)
                s["ratio"] = s["dynamic_ms"] / s["static_ms"]
            row["shapes"].append(s)
        row["stats"] = dyn.stats.as_dict()
    row["compilations"] = row["stats"].get("compiles")
    row["instances"] = row["stats"].get("instances")
    row["rebinds"] = row["stats"].get("rebinds")
    row["max_rel_err"] = max(s["rel_err"] for s in row["shapes"])
    if static:
        row["median_ratio"] = statistics.median(s["ratio"] for s in row["shapes"])
    return row


def run_dynamo(name, shapes):
    """torch.compile(module, backend="tessel", dynamic=True) over the same shapes (torch >= 2): outputs
    against eager, the graphs tessel compiled and those it left to PyTorch."""
    module, draw, varied = build(name)
    r = random.Random(7)
    sets = [draw(r) for _ in range(shapes)]
    tessel.dynamo_graphs.clear()
    tessel.dynamo_fallbacks.clear()
    torch._dynamo.reset()
    fast = torch.compile(module, backend="tessel", dynamic=True)
    errs = []
    with torch.no_grad():
        for args in sets:
            errs.append(rel_err(fast(*args), module(*args)))
    return dict(model=name, varied=varied, mode="torch.compile(dynamic=True)", max_rel_err=max(errs),
                tessel_graphs=len(tessel.dynamo_graphs), fallbacks=list(tessel.dynamo_fallbacks),
                compilations=sum(g.stats.compiles for g in tessel.dynamo_graphs if hasattr(g, "stats")))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default="resnet18,mobilenet_v2")
    ap.add_argument("--shapes", type=int, default=20)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=10, help="ABBA pairs per shape")
    ap.add_argument("--no-static", action="store_true", help="skip the static compilations (correctness only)")
    ap.add_argument("--dynamo", action="store_true", help="also torch.compile(backend='tessel', dynamic=True) (torch >= 2)")
    ap.add_argument("--json")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    rows = []
    for name in a.models.split(","):
        try:
            row = run_model(name, a.shapes, a.threads, a.rounds, not a.no_static)
        except Exception as e:  # noqa: BLE001 -- one model's failure is its row
            row = dict(model=name, error=f"{type(e).__name__}: {e}")
        rows.append(row)
        if "error" in row:
            print(f"{name}: ERROR {row['error']}")
            continue
        print(f"{name} ({row['varied']}): compilations {row['compilations']} (instances {row['instances']}, "
              f"rebinds {row['rebinds']}), "
              f"max rel err {row['max_rel_err']:.2e}, "
              f"first call {row['first_call_s']:.2f} s"
              + (f", dynamic/static median {row['median_ratio']:.3f}" if "median_ratio" in row else ""))
    if a.dynamo:
        for name in a.models.split(","):
            try:
                row = run_dynamo(name, a.shapes)
                print(f"{name} torch.compile(dynamic=True): tessel graphs {row['tessel_graphs']}, compilations "
                      f"{row['compilations']}, fallbacks {len(row['fallbacks'])}, max rel err {row['max_rel_err']:.2e}")
            except Exception as e:  # noqa: BLE001
                row = dict(model=name, mode="torch.compile(dynamic=True)", error=f"{type(e).__name__}: {e}")
                print(f"{name} torch.compile(dynamic=True): ERROR {row['error']}")
            rows.append(row)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(dict(torch=torch.__version__, rows=rows), f, indent=1)
    return 0 if all("error" not in r for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
