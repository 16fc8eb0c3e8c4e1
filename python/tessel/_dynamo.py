"""`torch.compile(model, backend="tessel")` on torch >= 2.0: dynamo hands each captured FX graph (and
example inputs) to this backend, which compiles it with tessel.compile on its first call -- the
parameters and buffers dynamo passes as inputs frozen as constants, guarded. A graph called with grad
mode on and inputs that require grad (a module in training: dynamo lifts its parameters to inputs) is
compiled for training instead (tessel.compile(..., train=True)): tessel's forward and backward run
inside a torch.autograd.Function, so loss.backward() fills the parameters' .grad as PyTorch would
(docs/training.md, "torch.compile"). Graphs tessel cannot take (non-tensor inputs, capture failures,
unsupported dtypes) run as dynamo gave them, with a warning."""
import warnings

import torch

from . import _tessel
from ._compile import CompiledModule
from ._train import TrainModule

# Options for the backend, set with tessel.dynamo_options.update(threads=2, backend="graph", ...). target None:
# 'cuda' for graphs whose inputs are CUDA tensors, else 'cpu'; precision: 'f32' or 'bf16' (CUDA only).
dynamo_options = dict(backend="compiled", threads=None, repair=False, cache_limit=8, on_limit="raise", target=None,
                      precision="f32")

# The CompiledModules the backend made, oldest first (their .stats and .explanation); clear() it at will.
dynamo_graphs = []

# The graphs the backend left to PyTorch, oldest first: the reason of each (also given as a warning).
dynamo_fallbacks = []


def _fallback(gm, reason):
    dynamo_fallbacks.append(reason)
    warnings.warn(f"tessel: {reason}; it runs in PyTorch")
    return gm.forward


def _state_inputs(gm, args):
    """The inputs that are the model's parameters and buffers: dynamo (torch >= 2.5) lifts them to graph
    inputs (`l_self_modules_fc1_parameters_weight_`). They are frozen: constants of the tessel graph,
    guarded by identity, address and version (docs/python.md, "Capture, functionalization, freezing")."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    out = []
    for i, (n, t) in enumerate(zip(placeholders, args)):
        source = getattr(n.meta.get("grapharg"), "source", None)
        name = source.name() if callable(getattr(source, "name", None)) else n.name
        if isinstance(t, torch.nn.Parameter) or any(k in name for k in ("_parameters", "_buffers", "parameters_",
                                                                        "buffers_")):
            out.append(i)
    return out


class _FirstCall:
    """Compiles the graph on its first call, with the real tensors of that call (dynamo's example
    inputs may be fake tensors, and the parameters to freeze are the ones the call passes)."""

    def __init__(self, gm):
        self.gm = gm
        self.compiled = None

    def __call__(self, *args):
        if self.compiled is None:
            self.compiled = self._compile(args)
        return self.compiled(*args)

    def _compile(self, args):
        try:
            if torch.is_grad_enabled() and any(t.requires_grad for t in args):
                # Training: the inputs that require grad (the parameters) are differentiated, not frozen.
                o = dynamo_options
                if any(t.is_cuda for t in args):
                    raise _tessel.TesselError("training on CUDA tensors is not supported by tessel (inference only: "
                                              "call the model under torch.no_grad())")
                compiled = TrainModule(self.gm, args, backend=o["backend"], threads=o["threads"],
                                       cache_limit=o["cache_limit"])
            else:
                compiled = CompiledModule(self.gm, args, freeze_inputs=_state_inputs(self.gm, args), **dynamo_options)
        except _tessel.TesselError as e:
            return _fallback(self.gm, f"could not compile a graph ({e})")
        dynamo_graphs.append(compiled)
        return compiled


def tessel_backend(gm, example_inputs, **kwargs):
    if not all(isinstance(t, torch.Tensor) for t in example_inputs):
        return _fallback(gm, "the graph takes non-tensor inputs (dynamic shapes?)")
    return _FirstCall(gm)


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
