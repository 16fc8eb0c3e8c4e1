"""LLM generation through tessel (issue 34; docs/dynamic-shapes.md): Hugging Face `generate()` (greedy, KV
cache) with the model's forward under torch.compile(backend="tessel", dynamic=True), against eager (the
same tokens; each step's logits) and against Inductor (torch.compile(dynamic=True)), in one process.
Every decoded token has a new KV length: the figure that matters first is how many compilations serve
the whole generation (dynamo gives tessel graphs with symbolic sizes; tessel compiles each once).

Models: `gpt2` and `llama` (transformers configs with random weights; torch >= 2, the GPU box). CPU,
--threads threads for tessel and PyTorch alike. JSON out.

    python bench/llm_generate.py --models gpt2,llama --new-tokens 32 --json out.json
"""
import argparse
import json
import statistics
import sys
import time

import torch

import tessel


def build(name):
    import transformers
    torch.manual_seed(0)
    if name == "gpt2":
        cfg = transformers.GPT2Config(vocab_size=1000, n_embd=128, n_layer=2, n_head=4, n_positions=512,
                                      resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=1)
        m = transformers.GPT2LMHeadModel(cfg)
    elif name == "llama":
        cfg = transformers.LlamaConfig(vocab_size=1000, hidden_size=128, intermediate_size=344, num_hidden_layers=2,
                                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                                       bos_token_id=0, eos_token_id=1)
        m = transformers.LlamaForCausalLM(cfg)
    else:
        raise SystemExit(f"unknown model {name!r} (gpt2, llama)")
    return m.eval()


def generate(model, ids, new_tokens):
    """Greedy generation of exactly new_tokens tokens: (token ids, per-step logits)."""
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                         do_sample=False, use_cache=True, return_dict_in_generate=True, output_scores=True,
                         pad_token_id=0)
    return out.sequences, torch.stack(out.scores)


def timed(fn, rounds):
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def run_model(name, prompts, new_tokens, rounds, inductor):
    model = build(name)
    eager_forward = model.forward
    row = dict(model=name, new_tokens=new_tokens, prompts=[list(p.shape) for p in prompts])
    with torch.no_grad():
        want = [generate(model, p, new_tokens) for p in prompts]

        tessel.dynamo_graphs.clear()
        tessel.dynamo_fallbacks.clear()
        torch._dynamo.reset()
        model.forward = torch.compile(eager_forward, backend="tessel", dynamic=True)
        t0 = time.perf_counter()
        got = [generate(model, p, new_tokens) for p in prompts]
        row["tessel_first_s"] = time.perf_counter() - t0
        row["tokens_equal"] = all(torch.equal(g[0], w[0]) for g, w in zip(got, want))
        row["max_rel_err_logits"] = max(float((g[1] - w[1]).abs().max() / w[1].abs().max()) for g, w in zip(got, want))
        row["tessel_graphs"] = len(tessel.dynamo_graphs)
        row["compilations"] = sum(g.stats.compiles for g in tessel.dynamo_graphs if hasattr(g, "stats"))
        row["bindings"] = sum(g.stats.bindings for g in tessel.dynamo_graphs if hasattr(g, "stats"))
        row["fallbacks"] = list(tessel.dynamo_fallbacks)
        row["recompiles"] = [r for g in tessel.dynamo_graphs if hasattr(g, "stats") for r in g.stats.recompiles]
        p = prompts[0]
        row["tessel_s"] = timed(lambda: generate(model, p, new_tokens), rounds)

        model.forward = eager_forward
        row["eager_s"] = timed(lambda: generate(model, p, new_tokens), rounds)
        if inductor:
            torch._dynamo.reset()
            model.forward = torch.compile(eager_forward, dynamic=True)
            t0 = time.perf_counter()
            ind = generate(model, p, new_tokens)
            row["inductor_first_s"] = time.perf_counter() - t0
            row["inductor_tokens_equal"] = torch.equal(ind[0], want[0][0])
            row["inductor_s"] = timed(lambda: generate(model, p, new_tokens), rounds)
            model.forward = eager_forward
    row["tessel_tokens_per_s"] = new_tokens / row["tessel_s"]
    row["eager_tokens_per_s"] = new_tokens / row["eager_s"]
    if inductor:
        row["inductor_tokens_per_s"] = new_tokens / row["inductor_s"]
    return row


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="gpt2,llama")
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--prompts", default="2x7,3x12,1x20", help="batch x length of each prompt")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=8)
    ap.add_argument("--no-inductor", action="store_true")
    ap.add_argument("--json")
    a = ap.parse_args()
    if int(torch.__version__.split(".")[0]) < 2:
        raise SystemExit("needs torch >= 2 (torch.compile); this is " + torch.__version__)
    torch.set_num_threads(a.threads)
    tessel.dynamo_options.update(threads=a.threads)
    g = torch.Generator().manual_seed(0)
    prompts = []
    for spec in a.prompts.split(","):
        b, t = (int(x) for x in spec.split("x"))
        prompts.append(torch.randint(2, 1000, (b, t), generator=g))
    rows = []
    for name in a.models.split(","):
        try:
            row = run_model(name, prompts, a.new_tokens, a.rounds, not a.no_inductor)
        except Exception as e:  # noqa: BLE001 -- one model's failure is a row, the others still run
            row = dict(model=name, error=f"{type(e).__name__}: {e}"[:2000])
        rows.append(row)
        if "error" in row:
            print(f"{name}: ERROR {row['error'][:600]}")
            continue
        print(f"{name}: tokens equal {row['tokens_equal']}, logits max rel err {row['max_rel_err_logits']:.2e}, "
              f"tessel graphs {row['tessel_graphs']}, compilations {row['compilations']} (bindings {row['bindings']}), "
              f"fallbacks {len(row['fallbacks'])}; tokens/s tessel {row['tessel_tokens_per_s']:.1f}, eager "
              f"{row['eager_tokens_per_s']:.1f}" + (f", inductor {row['inductor_tokens_per_s']:.1f}" if "inductor_s" in row
                                                   else ""))
        for f in row["fallbacks"][:6]:
            print("   fallback:", f[:400])
        for r in row["recompiles"][:6]:
            print("   recompile:", r[:300])
    if a.json:
        with open(a.json, "w") as f:
            json.dump(dict(torch=torch.__version__, threads=a.threads, rows=rows), f, indent=1)
    return 0 if all("error" not in r for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
