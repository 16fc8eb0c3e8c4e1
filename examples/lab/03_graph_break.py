"""Lab step 3: find and repair a graph break. `nonzero` has a data-dependent output shape, so the graph
breaks there (PyTorch runs it between two tessel graphs); tessel.explain says where, why, and which
repair rewrites it; repair=True applies it and the model is one graph again.

    PYTHONPATH=build/python /usr/bin/python3 examples/lab/03_graph_break.py
"""
import torch
import torch.nn as nn

import tessel


class RowSums(nn.Module):
    """Linear -> ReLU -> the rows with any positive value (nonzero) -> Linear -> their sum."""

    def __init__(self):
        super().__init__()
        self.a = nn.Linear(64, 64)
        self.b = nn.Linear(64, 16)

    def forward(self, x):
        h = torch.relu(self.a(x))
        idx = (h.sum(-1) > 0).nonzero().squeeze(-1)
        return self.b(h[idx]).sum(0)


torch.manual_seed(0)
m = RowSums().eval()
x = torch.randn(32, 64)
e = tessel.explain(m, (x,))
print(e)
assert e.break_count == 1 and e.breaks[0]["op"] == "NonZero", e
fixed = tessel.compile(m, (x,), repair=True, threads=2)
print(f"with repair=True: {fixed.explanation.graph_count} graph, {fixed.explanation.break_count} breaks")
with torch.no_grad():
    err = float((fixed(x) - m(x)).abs().max() / m(x).abs().max())
print(f"repaired output vs eager: rel err {err:.1e}")
assert fixed.explanation.break_count == 0 and err < 1e-4
