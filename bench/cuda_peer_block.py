#!/usr/bin/env python3
"""The peers of `tessel bench --target cuda` on tblock_bert (bench/cuda_box.sh runs it on the GPU box):
a BERT-base-sized pre-LN transformer block (d=768, 12 heads, MLP 3072, GELU) in PyTorch, timed under
eager and torch.compile (Inductor, default mode) on CUDA: f32 at B=1 T=128 (tblock_bert's shape, TF32
off as tessel's cuBLASLt calls) and bf16 at B=4 T=512 (the issue's anchor), where XLA (the same block
written in JAX, jax.jit, run in a child process so that its CUDA libraries and allocator stay apart from
torch's) joins them. Times are CUDA-event medians of back-to-back calls after warm-up (JAX: wall time of
back-to-back calls ended by block_until_ready); the first call's wall time is the compile time.
Writes one JSON object to stdout (the last line) and a readable line per case to stderr."""
import json
import math
import statistics
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, d=768, heads=12, mlp=3072):
        super().__init__()
        self.h, self.dk = heads, d // heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc1, self.fc2 = nn.Linear(d, mlp), nn.Linear(mlp, d)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=-1)
        q, k, v = (z.view(b, t, self.h, self.dk).transpose(1, 2) for z in (q, k, v))
        a = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(self.dk), dim=-1) @ v
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, d))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


def init_block(m, seed=0):
    """Sets every parameter of Block `m` from numpy's PCG64 stream (the same numbers under any torch
    version, unlike torch's own initialisers): Linear weights and biases uniform in +-1/sqrt(fan_in),
    LayerNorm scale 1 +- 0.1 and shift +- 0.1. bench/cuda_bert_block.py exports the block with these
    weights, so the peers run the very weights tessel runs."""
    import numpy as np
    rng = np.random.default_rng(seed)
    with torch.no_grad():
        for name, p in sorted(m.named_parameters()):
            u = 2 * rng.random(tuple(p.shape)) - 1
            if name.startswith("ln"):
                v = 1 + 0.1 * u if name.endswith("weight") else 0.1 * u
            else:
                fan_in = p.shape[1] if p.dim() == 2 else dict(m.named_parameters())[name[:-4] + "weight"].shape[1]
                v = u / math.sqrt(fan_in)
            p.copy_(torch.from_numpy(v.astype(np.float32)))
    return m


def block_input(bsz, seq, seed=1):
    """The bar model's input: uniform with unit variance, from numpy's PCG64 stream."""
    import numpy as np
    u = 2 * np.random.default_rng(seed).random((bsz, seq, 768)) - 1
    return torch.from_numpy((u * math.sqrt(3)).astype(np.float32))


def time_fn(fn, x, iters=200, warm=20):
    for _ in range(warm):
        fn(x)
    torch.cuda.synchronize()
    times = []
    for _ in range(5):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(iters):
            fn(x)
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b) / iters)
    return statistics.median(times)


def compiled(m, x, **kw):
    """torch.compile(m, **kw): the compiled callable and its compile time (the first calls' wall time)."""
    torch._dynamo.reset()
    c = torch.compile(m, **kw)
    t0 = time.perf_counter()
    for _ in range(3 if kw.get("mode") else 1):
        c(x)
    torch.cuda.synchronize()
    return c, time.perf_counter() - t0


def rel_err(y, ref):
    return float((y.float() - ref.float()).abs().max() / ref.float().abs().max())


def case(dtype, bsz, seq, label, seeded=False, ref=None, autotune=False):
    torch.manual_seed(0)
    m = Block()
    if seeded:
        init_block(m)
    m = m.cuda().to(dtype).eval()
    x = (block_input(bsz, seq) if seeded else torch.randn(bsz, seq, 768)).cuda().to(dtype)
    out = {"case": label, "dtype": str(dtype).replace("torch.", ""), "batch": bsz, "seq": seq, "seeded_weights": seeded}
    with torch.no_grad():
        y = m(x)
        if ref is not None:
            # the data set's output (torch f32 on the CPU, written by bench/cuda_bert_block.py): the
            # same weights, and the peers' own error at this dtype
            out["max_rel_vs_f32_reference"] = rel_err(y, ref.cuda())
        out["eager_ms"] = time_fn(m, x)
        c, out["inductor_compile_s"] = compiled(m, x)
        out["inductor_ms"] = time_fn(c, x)
        # Inductor with CUDA graphs (mode="reduce-overhead"): the launch-overhead-free figure, the fair
        # peer of tessel's graph replay.
        g, out["inductor_cudagraphs_compile_s"] = compiled(m, x, mode="reduce-overhead")
        out["inductor_cudagraphs_ms"] = time_fn(g, x)
        if autotune:
            a, out["inductor_max_autotune_compile_s"] = compiled(m, x, mode="max-autotune")
            out["inductor_max_autotune_ms"] = time_fn(a, x)
        flops = 2 * bsz * seq * (768 * 3 * 768 + 768 * 768 + 2 * 768 * 3072) + 4 * bsz * seq * seq * 768
        out["gflop"] = flops / 1e9
    print(f"{label}: eager {out['eager_ms']:.3f} ms, inductor {out['inductor_ms']:.3f} ms, "
          f"inductor reduce-overhead {out['inductor_cudagraphs_ms']:.3f} ms "
          f"(compile {out['inductor_compile_s']:.1f} s)"
          + (f", max-autotune {out['inductor_max_autotune_ms']:.3f} ms (compile {out['inductor_max_autotune_compile_s']:.1f} s)" if autotune else "")
          + (f", vs f32 reference {out['max_rel_vs_f32_reference']:.2g}" if ref is not None else "")
          + f", {out['gflop']:.1f} GFLOP", file=sys.stderr)
    return out


def xla_case(bsz, seq, seeded, folder):
    """The bf16 block under XLA: JAX arrays of the very weights (init_block, cast to bf16), layer norms and
    softmax computed in f32 as PyTorch's kernels do, matmuls in bf16 with f32 accumulation (XLA's default
    for bf16 dots). Returns the fields merged into the bf16 case."""
    import os
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    import jax
    import jax.numpy as jnp
    import numpy as np
    torch.manual_seed(0)
    m = Block()
    if seeded:
        init_block(m)
    p = {k: jnp.asarray(v.detach().float().numpy(), dtype=jnp.bfloat16) for k, v in m.state_dict().items()}
    x_t = block_input(bsz, seq) if seeded else torch.randn(bsz, seq, 768)
    x = jnp.asarray(x_t.numpy(), dtype=jnp.bfloat16)

    def ln(z, w, b):
        z = z.astype(jnp.float32)
        mu = z.mean(-1, keepdims=True)
        var = ((z - mu) ** 2).mean(-1, keepdims=True)
        return ((z - mu) * jax.lax.rsqrt(var + 1e-5) * w.astype(jnp.float32) + b.astype(jnp.float32)).astype(jnp.bfloat16)

    def lin(z, name):
        return z @ p[name + ".weight"].T + p[name + ".bias"]

    def block(x):
        b, t, d = x.shape
        q, k, v = jnp.split(lin(ln(x, p["ln1.weight"], p["ln1.bias"]), "qkv"), 3, axis=-1)
        q, k, v = (z.reshape(b, t, 12, 64).transpose(0, 2, 1, 3) for z in (q, k, v))
        s = (q @ k.transpose(0, 1, 3, 2)).astype(jnp.float32) / 8.0
        a = jax.nn.softmax(s, axis=-1).astype(jnp.bfloat16) @ v
        x = x + lin(a.transpose(0, 2, 1, 3).reshape(b, t, d), "proj")
        return x + lin(jax.nn.gelu(lin(ln(x, p["ln2.weight"], p["ln2.bias"]), "fc1"), approximate=False), "fc2")

    f = jax.jit(block)
    t0 = time.perf_counter()
    y = f(x).block_until_ready()
    out = {"xla_compile_s": time.perf_counter() - t0, "jax": jax.__version__, "xla_device": str(jax.devices()[0])}
    for _ in range(20):
        y = f(x)
    y.block_until_ready()
    times = []
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(200):
            y = f(x)
        y.block_until_ready()
        times.append((time.perf_counter() - t0) * 1e3 / 200)
    out["xla_ms"] = statistics.median(times)
    ref = read_reference(folder)
    if ref is not None:
        yf = np.asarray(y.astype(jnp.float32))
        out["xla_max_rel_vs_f32_reference"] = float(np.abs(yf - ref.numpy()).max() / np.abs(ref.numpy()).max())
    return out


def xla_in_child(bsz, seq, seeded, folder):
    """xla_case in a child process (its last stdout line): a JAX that is absent or fails is a field saying so."""
    import os
    import subprocess
    cmd = [sys.executable, os.path.abspath(__file__), "--xla", str(bsz), str(seq), "1" if seeded else "0", folder or ""]
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        lines = r.stdout.strip().splitlines()
        if r.returncode == 0 and lines:
            return json.loads(lines[-1])
        return {"xla_error": (r.stderr.strip().splitlines() or ["exit %d" % r.returncode])[-1][:300]}
    except Exception as e:  # noqa: BLE001 -- the peer is optional
        return {"xla_error": f"{type(e).__name__}: {e}"[:300]}


def read_reference(folder):
    """output_0.pb of the bar model's data set (bench/tensor_pb.py's reader, beside this file), or None."""
    import os
    if not folder or not os.path.exists(os.path.join(folder, "test_data_set_0", "output_0.pb")):
        return None
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import tensor_pb
    return torch.from_numpy(tensor_pb.read(os.path.join(folder, "test_data_set_0", "output_0.pb")).copy())


def main():
    """usage: cuda_peer_block.py [BAR_MODEL_FOLDER] [--autotune] [--no-xla]: the bar model's folder (bench/cuda_bert_block.py)
    makes the B=4 T=512 cases use its seeded weights and compare with its f32 output."""
    if sys.argv[1:2] == ["--xla"]:   # the child of xla_in_child
        bsz, seq, seeded, folder = sys.argv[2:6]
        print(json.dumps(xla_case(int(bsz), int(seq), seeded == "1", folder or None)))
        return
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    ref = read_reference(args[0] if args else None)
    res = {"torch": torch.__version__, "device": torch.cuda.get_device_name(0), "cases": []}
    res["cases"].append(case(torch.float32, 1, 128, "tblock_bert f32 B=1 T=128"))
    if ref is not None:
        res["cases"].append(case(torch.float32, 4, 512, "bar block f32 B=4 T=512", seeded=True, ref=ref))
    res["cases"].append(case(torch.bfloat16, 4, 512, "bert block bf16 B=4 T=512", seeded=ref is not None, ref=ref,
                             autotune="--autotune" in sys.argv))
    if "--no-xla" not in sys.argv:
        x = xla_in_child(4, 512, ref is not None, args[0] if args and ref is not None else None)
        res["cases"][-1].update(x)
        print("bert block bf16 B=4 T=512 under XLA: " + (f"{x['xla_ms']:.3f} ms (compile {x['xla_compile_s']:.1f} s)"
              + (f", vs f32 reference {x['xla_max_rel_vs_f32_reference']:.2g}" if "xla_max_rel_vs_f32_reference" in x else "")
              if "xla_ms" in x else x.get("xla_error", "?")), file=sys.stderr)
    print(json.dumps(res))


if __name__ == "__main__":
    main()
