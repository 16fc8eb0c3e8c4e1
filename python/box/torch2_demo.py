"""What ran on the GPU box (torch 2.11): torch.compile(m, backend="tessel") and tessel.compile against
eager (docs/python.md, "torch 2.11 on the GPU box"). Run from the checkout's root:
    PYTHONPATH=.pybox/pkg python3 python/box/torch2_demo.py
"""
import os, sys, time, warnings
import torch, torch.nn as nn, torch.nn.functional as F
import tessel
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "python"))
from test_torch_frontend import Block, ItemBreak, NonZeroBreak, max_rel

print("python", sys.version.split()[0], "torch", torch.__version__, "dynamo_registered", tessel.dynamo_registered,
      "backend listed", "tessel" in torch._dynamo.list_backends(), flush=True)
warnings.simplefilter("always")

def show(tag, opt, m, x):
    with torch.no_grad():
        ref = m(*x)
        t0 = time.perf_counter(); out = opt(*x); dt = time.perf_counter() - t0
        out2 = opt(*x)
    print(f"{tag}: max_rel {max_rel(out, ref):.2e} (2nd call {max_rel(out2, ref):.2e}), first call {dt:.2f}s", flush=True)

torch.manual_seed(0)
m = Block(256, 4, 1024).eval()
x = torch.randn(1, 128, 256)
opt = torch.compile(m, backend="tessel")
show("torch.compile Block d=256", opt, m, (x,))
for g in getattr(tessel, "dynamo_graphs", []):
    ph = [n.name for n in g.module.graph.nodes if n.op == "placeholder"]
    print("  graph:", g.stats, "|", str(g.explanation).splitlines()[0], "| placeholders", ph, flush=True)

fast = tessel.compile(m, (x,))
show("tessel.compile Block d=256", fast, m, (x,))
print("  stats:", fast.stats, flush=True)
print("  " + str(fast.explanation).splitlines()[0], flush=True)

torch._dynamo.reset()
if hasattr(tessel, "dynamo_graphs"): tessel.dynamo_graphs.clear()
m2 = ItemBreak().eval()
opt2 = torch.compile(m2, backend="tessel")
show("torch.compile ItemBreak (.item())", opt2, m2, (torch.randn(8, 32),))
print("  torch threads after:", torch.get_num_threads(), flush=True)
for g in getattr(tessel, "dynamo_graphs", []):
    ph = [n.name for n in g.module.graph.nodes if n.op == "placeholder"]
    print("  graph:", g.stats, "|", str(g.explanation).splitlines()[0], "| placeholders", ph, flush=True)

torch._dynamo.reset()
m3 = NonZeroBreak().eval()
opt3 = torch.compile(m3, backend="tessel")
show("torch.compile NonZeroBreak", opt3, m3, (torch.randn(32, 64),))
