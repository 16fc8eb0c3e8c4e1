"""What ran on the GPU box (torch 2.11): torch.compile(m, backend="tessel") and tessel.compile against
eager (docs/python.md, "torch 2.11 on the GPU box"). Run from the checkout's root:
    PYTHONPATH=.pybox/pkg python3 python/box/torch2_demo.py
"""
import os
import sys
import time
import warnings

import torch

import tessel

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "python"))
from test_torch_frontend import Block, ItemBreak, NonZeroBreak, max_rel  # noqa: E402

print("python", sys.version.split()[0], "torch", torch.__version__, "dynamo_registered", tessel.dynamo_registered,
      "backend listed", "tessel" in torch._dynamo.list_backends(), "torch threads", torch.get_num_threads(), flush=True)
warnings.simplefilter("always")


def show(tag, opt, m, shape, calls=3):
    errs = []
    for i in range(calls):
        torch.manual_seed(100 + i)
        x = torch.randn(*shape)
        with torch.no_grad():
            ref = m(x)
            t0 = time.perf_counter()
            out = opt(x)
            dt = time.perf_counter() - t0
        errs.append(max_rel(out, ref))
        if i == 0:
            first = dt
    print(f"{tag}: max_rel over {calls} inputs {max(errs):.2e}, first call {first:.2f}s, "
          f"torch threads {torch.get_num_threads()}", flush=True)


def graphs():
    for g in tessel.dynamo_graphs:
        e = g.explanation
        ph = [n.name for n in g.module.graph.nodes if n.op == "placeholder"]
        print(f"  tessel graph: {str(e).splitlines()[0]}; breaks {[b['op'] for b in e.breaks]}; "
              f"{len(ph)} inputs {ph[:3]}{'...' if len(ph) > 3 else ''}; stats {g.stats.as_dict()}", flush=True)
    tessel.dynamo_graphs.clear()
    torch._dynamo.reset()


torch.manual_seed(0)
m = Block(256, 4, 1024).eval()
show("torch.compile Block d=256", torch.compile(m, backend="tessel"), m, (1, 128, 256))
graphs()
fast = tessel.compile(m, (torch.randn(1, 128, 256),))
show("tessel.compile Block d=256", fast, m, (1, 128, 256))
print(f"  {str(fast.explanation).splitlines()[0]}; stats {fast.stats.as_dict()}", flush=True)

torch.manual_seed(0)
m2 = ItemBreak().eval()
show("torch.compile ItemBreak (.item())", torch.compile(m2, backend="tessel"), m2, (8, 32))
graphs()
fast2 = tessel.compile(m2, (torch.randn(8, 32),))
show("tessel.compile ItemBreak (.item())", fast2, m2, (8, 32))
print(f"  {str(fast2.explanation).splitlines()[0]}", flush=True)

torch.manual_seed(0)
m3 = NonZeroBreak().eval()
show("torch.compile NonZeroBreak", torch.compile(m3, backend="tessel"), m3, (32, 64))
graphs()
