"""PyTorch models straight onto the dataflow chips (issue 35; docs/python.md, "Dataflow targets"): every model of
tests/python/test_torchvision_models.py through tessel.compile(model, (x,), target=...), no export, on each
chip twice: with f32 storage (a hardware file derived from the preset, bench/tv_onnx.py's f32_hw_file: the
mapping's exact check, held to 1e-4 against eager) and with the preset's own storage (the chip's rounding:
f16 DL16 on Spyre, bf16 on the TPUs). Per model and target: the relative error against eager, the simulated
time, the compile and first-call seconds, and values the storage flushed. JSON out.

    PYTHONPATH=build/python /usr/bin/python3 bench/dataflow_torch.py --json out.json [--models resnet18,vit]

--hf bert,gpt2,llama adds transformers models (configs with random weights, 32 token ids; torch >= 2 with
transformers: the GPU box); --models "" runs those alone. --dynamo also runs each model once through
torch.compile(backend="tessel", options={"target": chip}) with the preset's storage. --export FOLDER also
writes each model with tessel.export(model, (x,), FOLDER/name) and runs every command of issue 35's bar on
the folder with the tessel binary (--tessel, default build/tessel): `run --check` (graph and compiled
backends), `sim --hw` each target (its own check against the folder's eager outputs), `report --hw`,
`landscape --targets <targets>,cpu` and `explain --check`; a command's row fails on a non-zero exit or a
check that does not say PASS (a `sim` check that fails because the model's values leave the storage's range,
which the command says, is recorded with the same check under bf16 storage). --no-cli writes the folders
only (the GPU box has transformers but not the binary); --cli-only runs the commands on folders already
there (written so elsewhere), named as the models are (hf:bert -> FOLDER/hf_bert).
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import warnings

import torch

import tessel

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests", "python"))
from test_torchvision_models import MODELS, _no_zero_weights  # noqa: E402
from tv_onnx import f32_hw_file  # noqa: E402

TOL = {"f32": 1e-4}


class _Logits(torch.nn.Module):
    """A transformers model as a module of token ids to its first output (logits or the last hidden state).
    With `for_export` a causal model takes its causal mask as a 4-D additive mask built from the ids' length:
    transformers uses such a mask as given, where from a 2-D mask (or none) it reads the mask's values while
    tracing (is it all ones? packed sequences?), which tessel.compile keeps as guards but a model file cannot."""

    def __init__(self, m, causal, for_export=False):
        super().__init__()
        self.m, self.causal, self.for_export = m, causal, for_export

    def forward(self, ids):
        if self.causal and self.for_export:
            t = ids.shape[1]
            mask = torch.full((t, t), torch.finfo(torch.float32).min).triu(1)[None, None]
            return self.m(input_ids=ids, attention_mask=mask, use_cache=False, return_dict=False)[0]
        if self.causal:   # (a mask, as generate() passes one: without it transformers looks for packed sequences)
            return self.m(input_ids=ids, attention_mask=torch.ones_like(ids), use_cache=False, return_dict=False)[0]
        return self.m(input_ids=ids, return_dict=False)[0]


def hf_model(name):
    """(module, example input) of a small transformers config with random weights: bert, gpt2 or llama."""
    import transformers
    torch.manual_seed(0)
    if name == "bert":
        cfg = transformers.BertConfig(vocab_size=1000, hidden_size=128, num_hidden_layers=2, num_attention_heads=2,
                                      intermediate_size=512, max_position_embeddings=512, hidden_dropout_prob=0.0,
                                      attention_probs_dropout_prob=0.0)
        m, causal = transformers.BertModel(cfg), False
    elif name == "gpt2":
        cfg = transformers.GPT2Config(vocab_size=1000, n_embd=128, n_layer=2, n_head=2, n_positions=512,
                                      resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
        m, causal = transformers.GPT2LMHeadModel(cfg), True
    elif name == "llama":
        cfg = transformers.LlamaConfig(vocab_size=1000, hidden_size=128, intermediate_size=344, num_hidden_layers=2,
                                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512)
        m, causal = transformers.LlamaForCausalLM(cfg), True
    else:
        raise SystemExit(f"unknown transformers model {name!r} (bert, gpt2, llama)")
    ids = torch.randint(2, 1000, (1, 32), generator=torch.Generator().manual_seed(0))
    return _Logits(m.eval(), causal).eval(), ids


def dynamo_row(name, model, x, ref, chip):
    """The model through torch.compile(backend="tessel", options={"target": chip}): its error against eager,
    the simulated time of its tessel graphs, and dynamo's fallbacks."""
    row = dict(model=name, target=chip, storage="preset", front="torch.compile")
    tessel.dynamo_graphs.clear()
    tessel.dynamo_fallbacks.clear()
    torch._dynamo.reset()
    try:
        fast = torch.compile(model, backend="tessel", options={"target": chip})
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with torch.no_grad():
                out = fast(x)
        row["rel_err"] = float((out - ref).abs().max() / ref.abs().max())
        graphs = [g for g in tessel.dynamo_graphs if hasattr(g, "report")]
        row["graphs"] = len(graphs)
        row["simulated_us"] = sum(g.report["simulated_us"] for g in graphs)
        row["fallbacks"] = list(tessel.dynamo_fallbacks)
    except Exception as e:  # noqa: BLE001 -- one front door's failure is its row
        row["error"] = f"{type(e).__name__}: {e}"[:500]
    return row


def export_rows(name, model, x, folder, targets, binary, timeout):
    """tessel.export of the model into folder/name, then each CLI command of issue 35's bar on it: a row per
    command with its exit status, seconds and the line that says PASS (or the error's last line). With
    model None the folder is already there (--cli-only: written by tessel.export elsewhere, e.g. the GPU box,
    where transformers is)."""
    rows = []
    path = os.path.join(folder, name.replace(":", "_"))
    if model is not None:
        shutil.rmtree(path, ignore_errors=True)
        t0 = time.perf_counter()
        if isinstance(model, _Logits):
            model = _Logits(model.m, model.causal, for_export=True).eval()
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                tessel.export(model, (x,), path)
        except tessel.TesselError as e:
            return [dict(model=name, command="export", error=str(e)[:500])]
        rows.append(dict(model=name, command="export", seconds=time.perf_counter() - t0))
        if binary is None:
            return rows
    page = os.path.join(path + ".html")
    commands = [("run --check", ["run", path, "--check"], True),
                ("run --check compiled", ["run", path, "--check", "--backend", "compiled"], True)]
    commands += [(f"sim {t}", ["sim", path, "--hw", t], True) for t in targets]
    commands += [(f"report {targets[0]}", ["report", path, "--hw", targets[0], "-o", page], False),
                 ("landscape", ["landscape", path, "--targets", ",".join(targets + ["cpu"])], False),
                 ("explain --check", ["explain", path, "--check"], False)]
    for label, args, wants_pass in commands:
        row = dict(model=name, command=label)
        t0 = time.perf_counter()
        try:
            r = subprocess.run([binary, "--quiet", *args], capture_output=True, text=True, timeout=timeout)
            row["seconds"] = time.perf_counter() - t0
            row["rc"] = r.returncode
            lines = [ln for ln in (r.stdout + r.stderr).splitlines() if ln.strip()]
            said = [ln for ln in lines if "PASS" in ln or "FAIL" in ln]
            row["said"] = (said or lines or [""])[-1][:300]
            under = [ln.strip() for ln in lines if "fell below" in ln]
            if label.startswith("sim ") and under and any("FAIL" in ln for ln in said):
                # The model's values leave the storage's range (random-weight mobilenet_v3 and efficientnet
                # shrink below DL16's smallest normal, 2^-30): the check fails as the chip would, and says
                # why. Recorded with the check under bf16 storage, which keeps f32's range.
                row["underflow"] = under[0][:300]
                r2 = subprocess.run([binary, "--quiet", *args, "--dtype", "bf16"], capture_output=True, text=True,
                                    timeout=timeout)
                said2 = [ln for ln in (r2.stdout + r2.stderr).splitlines() if "PASS" in ln or "FAIL" in ln]
                row["said_bf16"] = (said2 or [""])[-1][:300]
                if r2.returncode != 0 or not any("PASS" in ln for ln in said2):
                    row["error"] = row["said_bf16"] or row["said"]
            elif r.returncode != 0 or (wants_pass and not any("PASS" in ln for ln in said)) or \
                    any("FAIL" in ln for ln in said):
                row["error"] = row["said"]
        except subprocess.TimeoutExpired:
            row["error"] = f"timed out after {timeout} s"
        rows.append(row)
    return rows


def print_export_row(name, row):
    print(f"{name:20s} {row['command']:22s} " + (f"ERROR {row['error']}" if "error" in row else
          f"{row['seconds']:6.2f} s  {row.get('said', '')}" +
          (f"\n{'':43s}{row['underflow']}; with --dtype bf16: {row['said_bf16']}" if "underflow" in row else "")),
          flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--targets", default="spyre,tpu-v5e")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--hf", default="", help="transformers models too: bert,gpt2,llama (torch >= 2)")
    ap.add_argument("--dynamo", action="store_true", help="each model also through torch.compile (torch >= 2)")
    ap.add_argument("--export", metavar="FOLDER", help="tessel.export each model there and run the CLI on it")
    ap.add_argument("--export-only", action="store_true", help="with --export: skip tessel.compile(target=...)")
    ap.add_argument("--cli-only", action="store_true",
                    help="with --export: run the CLI on the folders already in FOLDER (one per model named by --models/--hf)")
    ap.add_argument("--no-cli", action="store_true", help="with --export: write the folders only (a machine without the binary)")
    ap.add_argument("--tessel", default=os.path.join(os.path.dirname(HERE), "build", "tessel"))
    ap.add_argument("--timeout", type=int, default=600, help="seconds per CLI command")
    ap.add_argument("--json")
    a = ap.parse_args()
    hw_dir = tempfile.mkdtemp(prefix="tessel-hw-")
    rows, failed = [], 0
    names = [n for n in a.models.split(",") if n] + ["hf:" + n for n in a.hf.split(",") if n]
    for name in names:
        if a.export and a.cli_only:
            for row in export_rows(name, None, None, a.export, a.targets.split(","), a.tessel, a.timeout):
                rows.append(row)
                failed += "error" in row
                print_export_row(name, row)
            continue
        if name.startswith("hf:"):
            model, x = hf_model(name[3:])
        else:
            torch.manual_seed(0)
            model, res = MODELS[name]()
            model = _no_zero_weights(model.eval())
            x = torch.randn(1, 3, res, res)
        with torch.no_grad():
            ref = model(x)
        if a.export:
            for row in export_rows(name, model, x, a.export, a.targets.split(","), None if a.no_cli else a.tessel,
                                   a.timeout):
                rows.append(row)
                failed += "error" in row
                print_export_row(name, row)
            if a.export_only:
                continue
        for chip in a.targets.split(","):
            if a.dynamo:
                row = dynamo_row(name, model, x, ref, chip)
                rows.append(row)
                failed += "error" in row or bool(row.get("fallbacks"))
                print(f"{name:20s} {chip:8s} torch.compile " + (f"ERROR {row['error']}" if "error" in row else
                      f"rel {row['rel_err']:.2e}  sim {row['simulated_us']:8.1f} us  graphs {row['graphs']}"
                      f"  fallbacks {len(row['fallbacks'])}"), flush=True)
            for storage in ("f32", None):
                target = f32_hw_file(chip, hw_dir) if storage == "f32" else chip
                row = dict(model=name, target=chip, storage=storage or "preset")
                try:
                    t0 = time.perf_counter()
                    fast = tessel.compile(model, (x,), target=target, precision=storage, threads=a.threads)
                    row["compile_s"] = time.perf_counter() - t0
                    with warnings.catch_warnings():
                        warnings.simplefilter("ignore")
                        t0 = time.perf_counter()
                        out = fast(x)
                        row["first_call_s"] = time.perf_counter() - t0
                    row["storage"] = fast.storage
                    row["rel_err"] = float((out - ref).abs().max() / ref.abs().max())
                    row["simulated_us"] = fast.report["simulated_us"]
                    row["flushed"] = fast.last_run["flushed"]
                    if storage == "f32" and row["rel_err"] > TOL["f32"]:
                        failed += 1
                        row["fail"] = f"rel err {row['rel_err']:.2e} > {TOL['f32']:.0e}"
                except tessel.TesselError as e:
                    failed += 1
                    row["error"] = str(e)[:500]
                rows.append(row)
                print(f"{name:20s} {chip:8s} {row['storage']:12s} " +
                      (f"ERROR {row['error']}" if "error" in row else
                       f"rel {row['rel_err']:.2e}  sim {row['simulated_us']:8.1f} us  compile {row['compile_s']:.2f} s"
                       f"  flushed {row['flushed']}" + (f"  FAIL {row['fail']}" if "fail" in row else "")), flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(dict(torch=torch.__version__, rows=rows), f, indent=1)
    print(f"{len(rows) - failed}/{len(rows)} runs pass (f32 storage within {TOL['f32']:.0e}; preset storage reported"
          + ("; exported folders through the CLI" if a.export else "") + ")")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
