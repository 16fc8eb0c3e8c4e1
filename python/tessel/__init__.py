"""tessel: a compiler for dataflow ML accelerators -- the Python package.

    import tessel
    fast = tessel.compile(module, (x,))          # a guarded, recompiling callable
    y = fast(x)
    print(fast.stats, fast.explanation)
    print(tessel.explain(module, (x,)))           # graph breaks, reasons, locations, repairs

and, on torch >= 2.0, torch.compile(module, backend="tessel"). docs/python.md.
"""
# torch before the extension: where torch bundles its own protobuf (pip wheels), loading tessel's
# libprotobuf first made torch's import abort ("free(): invalid pointer", the GPU box's torch 2.11).
import torch  # noqa: F401
from ._tessel import TesselError, GuardFailure, GraphBuilder, Executable, ops  # noqa: F401
from ._tessel import __version__  # noqa: F401  (the text of `tessel --version`: release + build)
from ._convert import TesselCaptureError  # noqa: F401
from ._capture import capture  # noqa: F401
from ._compile import CompiledModule, Explanation, Stats, TesselRecompileLimit, compile, explain, export, landscape  # noqa: F401
from . import aten_table  # noqa: F401
from . import optim  # noqa: F401
from ._dynamo import dynamo_fallbacks, dynamo_graphs, dynamo_options, tessel_backend  # noqa: F401
from ._dynamo import register as _register_dynamo

dynamo_registered = _register_dynamo()

__all__ = ["compile", "explain", "export", "landscape", "CompiledModule", "Explanation", "Stats", "TesselError", "TesselCaptureError",
           "TesselRecompileLimit", "GuardFailure", "dynamo_options", "dynamo_graphs", "tessel_backend", "dynamo_registered"]
