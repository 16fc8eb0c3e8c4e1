"""`torch.compile(model, backend="tessel")` on torch >= 2.0: dynamo hands each captured FX graph (and
example inputs) to this backend, which compiles it with tessel.compile. Graphs tessel cannot take
(non-tensor inputs, capture failures, unsupported dtypes) run as dynamo gave them, with a warning."""
import warnings

import torch

from . import _tessel
from ._compile import CompiledModule

# Options for the backend, set with tessel.dynamo_options.update(threads=2, backend="graph", ...).
dynamo_options = dict(backend="compiled", threads=None, repair=False, cache_limit=8, on_limit="raise")

# The CompiledModules the backend made, oldest first (their .stats and .explanation); clear() it at will.
dynamo_graphs = []


def _real(t):
    """A real tensor with the example's shape and dtype (dynamo may hand over fake tensors)."""
    fake_cls = getattr(getattr(torch, "_subclasses", None), "FakeTensor", None)
    if fake_cls is not None and isinstance(t, fake_cls):
        with torch._subclasses.fake_tensor.unset_fake_temporarily() if hasattr(torch._subclasses.fake_tensor, "unset_fake_temporarily") else _null():
            if t.dtype.is_floating_point:
                return torch.randn(tuple(int(d) for d in t.shape), dtype=t.dtype)
            return torch.zeros(tuple(int(d) for d in t.shape), dtype=t.dtype)
    return t


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False


def tessel_backend(gm, example_inputs, **kwargs):
    if not all(isinstance(t, torch.Tensor) for t in example_inputs):
        warnings.warn("tessel: the graph takes non-tensor inputs (dynamic shapes?); it runs in PyTorch")
        return gm.forward
    try:
        compiled = CompiledModule(gm, tuple(_real(t) for t in example_inputs), **dynamo_options)
    except _tessel.TesselError as e:
        warnings.warn(f"tessel: could not compile a graph ({e}); it runs in PyTorch")
        return gm.forward
    dynamo_graphs.append(compiled)
    return compiled


def register():
    """Registers "tessel" with torch._dynamo (torch >= 2.0). Returns whether it did."""
    try:
        major = int(torch.__version__.split(".")[0])
    except ValueError:
        return False
    if major < 2:
        return False
    try:
        from torch._dynamo import register_backend
        from torch._dynamo.backends.registry import list_backends  # noqa: F401
    except Exception:  # noqa: BLE001
        return False
    try:
        register_backend(name="tessel")(tessel_backend)
    except Exception:  # noqa: BLE001  -- already registered (module reloaded)
        pass
    return True
