"""tessel.compile / tessel.explain: capture, guards, the recompile cache and statistics."""
import contextlib
import json
import os
import time
import traceback
from collections import OrderedDict

import torch
from torch.utils import _pytree as pytree

from . import _tessel
from ._convert import Converted, TesselCaptureError, from_buffer, tessel_dtype, to_buffer

_PKG_DIR = os.path.dirname(os.path.abspath(__file__))
_TORCH_DIR = os.path.dirname(os.path.abspath(torch.__file__))


class TesselRecompileLimit(_tessel.TesselError):
    """A call needed a new compilation but the callable already holds cache_limit of them."""


def _user_frame(frames=None):
    """'file.py:LINE `code`' of the innermost frame outside torch, tessel and the standard library."""
    frames = frames if frames is not None else traceback.extract_stack()
    for f in reversed(frames):
        if f.filename.startswith("<") and f.filename != "<stdin>":
            continue
        fn = os.path.abspath(f.filename)
        if fn.startswith(_TORCH_DIR) or fn.startswith(_PKG_DIR) or "/lib/python3" in fn or fn.startswith("<"):
            continue
        code = (f.line or "").strip()
        return f"{os.path.basename(fn)}:{f.lineno}" + (f" `{code}`" if code else "")
    return ""


@contextlib.contextmanager
def _torch_threads_kept():
    """tessel's compiled backend sets OpenMP's thread count, which is PyTorch's intra-op thread count
    too when both use the same libgomp (Debian's torch 1.13; the torch 2.11 wheels): put PyTorch's back,
    so compiling or running never changes torch.get_num_threads() (dynamo guards on it)."""
    n = torch.get_num_threads()
    try:
        yield
    finally:
        if torch.get_num_threads() != n:
            torch.set_num_threads(n)


def _pop(stack):
    if stack:
        stack.pop()
    # (a forward hook that returns a value replaces the module's output: return nothing)


@contextlib.contextmanager
def _provenance(module):
    """Stamps every FX node created while tracing with the module path and the user's source line."""
    stack = []
    hooks = []
    if isinstance(module, torch.nn.Module):
        for name, m in module.named_modules():
            hooks.append(m.register_forward_pre_hook(lambda m, i, name=name: stack.append(name)))
            hooks.append(m.register_forward_hook(lambda m, i, o: _pop(stack)))
    original = torch.fx.Graph.create_node

    def create_node(self, *args, **kwargs):
        n = original(self, *args, **kwargs)
        n.meta["tessel_module"] = stack[-1] if stack else ""
        n.meta["tessel_source"] = _user_frame()
        return n
    torch.fx.Graph.create_node = create_node
    try:
        yield
    finally:
        torch.fx.Graph.create_node = original
        for h in hooks:
            h.remove()


def _tracing_read(e):
    return "value out of a tracing tensor" in str(e) or "data-dependent" in str(e)


@contextlib.contextmanager
def _items_as_tensors():
    """While make_fx traces, `t.item()` on a traced one-element tensor gives `t` as a 0-d tensor
    instead of failing: the value stays in the graph, so `x / x.max().item()` is captured whole (torch
    1.13 has no data-dependent scalars in make_fx; dynamo's graphs on torch 2 call .item() on 0-d
    inputs too). A Python use of that value (`if`, int(), a size) still reads it and fails there.
    Items of constants are plain numbers as before."""
    original = torch.Tensor.item
    made = []      # the 0-d tensors handed out (kept alive: identity marks them)

    def item(self):
        if any(self is t for t in made):   # reading one of ours as a number (Tensor.__format__, ...)
            return original(self)
        try:
            return original(self)
        except RuntimeError as e:
            if not _tracing_read(e) or self.numel() != 1:
                raise
        t = self.reshape(())
        made.append(t)
        return t
    torch.Tensor.item = item
    try:
        yield
    finally:
        torch.Tensor.item = original


def capture(module, example_inputs):
    """An aten-level FX graph of `module` on `example_inputs` (make_fx, parameters as constants)."""
    from torch.fx.experimental.proxy_tensor import make_fx
    if not callable(module):
        raise _tessel.TesselError(f"tessel.compile takes a torch.nn.Module or a function, not {type(module).__name__}")

    def fn(*args):
        return module(*args)
    try:
        with _provenance(module), _items_as_tensors(), torch.no_grad():
            return make_fx(fn)(*example_inputs)
    except _tessel.TesselError:
        raise
    except Exception as e:  # noqa: BLE001 -- every tracing failure becomes one clear error
        where = _user_frame(traceback.extract_tb(e.__traceback__))
        msg = str(e).splitlines()[0] if str(e) else type(e).__name__
        hint = ""
        if _tracing_read(msg):
            hint = (" -- the module uses a tensor's value in Python (`if tensor:`, int(tensor), a .item() value in an "
                    "`if` or as a size); keep it a tensor (e.g. torch.where instead of an if; a .item() value is "
                    "captured when it is only used in tensor arithmetic)")
        name = type(module).__name__
        raise TesselCaptureError(f"cannot capture {name}: {msg}" + (f" at {where}" if where else "") + hint) from e


def _signature(args):
    sig = []
    for i, a in enumerate(args):
        if isinstance(a, torch.Tensor):
            sig.append((tuple(a.shape), a.dtype))
        else:
            raise _tessel.TesselError(f"input {i} is a {type(a).__name__}; a tessel-compiled callable takes tensors")
    return tuple(sig)


def _describe_change(old, new):
    if old is None:
        return "first call"
    if len(old) != len(new):
        return f"{len(new)} inputs instead of {len(old)}"
    for i, (o, n) in enumerate(zip(old, new)):
        if o[1] != n[1]:
            return f"input {i} dtype {o[1]} -> {n[1]}"
        if o[0] != n[0]:
            return f"input {i} shape {list(o[0])} -> {list(n[0])}"
    return "same signature"


class Stats:
    """What a compiled callable did: compilations, cache hits, compile time, recompiles and why."""

    def __init__(self):
        self.compiles = 0
        self.cache_hits = 0
        self.compile_seconds = 0.0
        self.recompiles = []      # reasons, one per compilation after the first
        self.eager_calls = 0      # calls run by PyTorch eager after the recompile limit (on_limit="eager")
        self.calls = 0

    def as_dict(self):
        return dict(compiles=self.compiles, cache_hits=self.cache_hits, compile_seconds=self.compile_seconds,
                    recompiles=list(self.recompiles), eager_calls=self.eager_calls, calls=self.calls)

    def __repr__(self):
        return f"Stats({self.as_dict()})"


class Explanation:
    """The partitioner's report: graphs (compiled partitions), breaks, repairs applied."""

    def __init__(self, report, repairs=(), lowered=0, fallbacks=0):
        self.graphs = report["graphs"]
        self.breaks = report["breaks"]
        self.repairs = [dict(pattern=p, node=n, detail=d) for p, n, d in repairs]
        self.lowered = lowered
        self.fallbacks = fallbacks

    @property
    def graph_count(self):
        return len(self.graphs)

    @property
    def break_count(self):
        return len(self.breaks)

    def as_dict(self):
        return dict(graphs=self.graphs, breaks=self.breaks, repairs=self.repairs)

    def __str__(self):
        lines = [f"repaired {r['pattern']} at '{r['node']}': {r['detail']}" for r in self.repairs]
        nodes = sum(g["nodes"] for g in self.graphs)
        lines.append(f"{len(self.graphs)} graph(s), {len(self.breaks)} break(s), {nodes} compiled node(s)")
        for i, g in enumerate(self.graphs):
            lines.append(f"graph {i}: {g['nodes']} node(s), {g['inputs']} input(s), {g['outputs']} output(s), "
                         f"from '{g['first']}' to '{g['last']}'")
        for i, b in enumerate(self.breaks):
            lines.append(f"break {i + 1}: {b['op']} ({b['kind']}), after graph {b['after_graph']}")
            lines.append(f"  reason:   {b['reason']}")
            lines.append(f"  location: {b['location']}")
            lines.append(f"  repair:   {b['repair'] or '(no known pattern)'}")
        return "\n".join(lines)

    __repr__ = __str__


class _Entry:
    """One compilation: the converted graph (for its PyTorch breaks) and the partitioned executable."""

    def __init__(self, conv, exe, repairs):
        self.conv = conv
        self.exe = exe
        self.repairs = repairs
        self.explanation = Explanation(json.loads(exe.explain()), repairs, conv.lowered, len(conv.fallbacks))

    def run(self, args):
        ins = []
        for i, (a, d) in enumerate(zip(args, self.conv.input_dtypes)):
            if a.requires_grad:
                a = a.detach()
            ins.append(to_buffer(a))
        with _torch_threads_kept():
            outs = self.exe.run(ins, self.conv.runner if self.explanation.breaks else None)
        flat = []
        k = 0
        n = len(outs) + len(self.conv.out_literals)
        for i in range(n):
            if i in self.conv.out_literals:
                flat.append(self.conv.out_literals[i])
            else:
                arr, d = outs[k]
                k += 1
                flat.append(from_buffer(arr, d))
        return pytree.tree_unflatten(flat, self.conv.out_spec)


def _convert(module, example_inputs, repair, caller):
    """Checks the example inputs, captures the module and builds its tessel graph (repaired if asked)."""
    for i, a in enumerate(example_inputs):
        if not isinstance(a, torch.Tensor):
            raise _tessel.TesselError(f"example input {i} is a {type(a).__name__}; {caller} takes tensors")
        tessel_dtype(a.dtype, f"input {i}")
    gm = capture(module, example_inputs)
    conv = Converted(gm, example_inputs, name=type(module).__name__)
    return conv, (conv.builder.repair() if repair else [])


def _build(module, example_inputs, target, backend, threads, repair):
    if target != "cpu":
        raise _tessel.TesselError(f"target '{target}' is not supported by tessel.compile yet (only 'cpu')")
    if backend not in ("compiled", "graph", "eager"):
        raise _tessel.TesselError(f"backend '{backend}' is not one of compiled, graph, eager")
    conv, repairs = _convert(module, example_inputs, repair, "tessel.compile")
    with _torch_threads_kept():
        exe = _tessel.Executable(conv.builder, backend, threads)
    return _Entry(conv, exe, repairs)


def _default_threads():
    return _tessel.hardware_threads() or 1


class CompiledModule:
    """The callable tessel.compile returns: guarded by the inputs' shapes and dtypes, recompiling
    (and caching by signature) when they change, up to cache_limit compilations."""

    def __init__(self, module, example_inputs, target="cpu", backend="compiled", threads=None, repair=False,
                 cache_limit=8, on_limit="raise"):
        if on_limit not in ("raise", "eager"):
            raise _tessel.TesselError(f"on_limit must be 'raise' or 'eager', not {on_limit!r}")
        self.module = module
        self.target = target
        self.backend = backend
        self.threads = threads if threads is not None else _default_threads()
        self.repair = repair
        self.cache_limit = cache_limit
        self.on_limit = on_limit
        self.stats = Stats()
        self._cache = OrderedDict()
        self._last_sig = None
        example_inputs = tuple(example_inputs)
        self._compile(_signature(example_inputs), example_inputs)

    def _compile(self, sig, args):
        t0 = time.perf_counter()
        entry = _build(self.module, args, self.target, self.backend, self.threads, self.repair)
        dt = time.perf_counter() - t0
        if self.stats.compiles:
            self.stats.recompiles.append(_describe_change(self._last_sig, sig))
        self.stats.compiles += 1
        self.stats.compile_seconds += dt
        self._cache[sig] = entry
        self._last_sig = sig
        return entry

    @property
    def explanation(self):
        """The graph-break report of the most recent compilation."""
        return self._cache[self._last_sig].explanation

    def __call__(self, *args):
        self.stats.calls += 1
        sig = _signature(args)
        entry = self._cache.get(sig)
        if entry is not None:
            self.stats.cache_hits += 1
        else:
            if len(self._cache) >= self.cache_limit:
                if self.on_limit == "eager":
                    self.stats.eager_calls += 1
                    with torch.no_grad():
                        return self.module(*args)
                raise TesselRecompileLimit(
                    f"{type(self.module).__name__}: {_describe_change(self._last_sig, sig)} needs a new compilation, "
                    f"but cache_limit={self.cache_limit} compilations are already cached (signatures: "
                    f"{[[list(s[0]) for s in k] for k in self._cache]}); raise cache_limit or pass on_limit='eager'")
            entry = self._compile(sig, args)
        self._last_sig = sig
        return entry.run(args)


def compile(module, example_inputs, target="cpu", backend="compiled", threads=None, repair=False, cache_limit=8,
            on_limit="raise"):
    """Compile a PyTorch module (or function of tensors) for tessel; returns a guarded callable.

    example_inputs: a tuple of tensors the module is captured with (make_fx). backend: compiled (fused,
    generated C++), graph (core ops, planned arena) or eager (reference kernels). threads: for the compiled
    backend (default: the machine's hardware threads). repair: apply the auto-repairs of graph breaks.
    cache_limit / on_limit: how many signatures are compiled before a new one raises or runs in eager.
    """
    return CompiledModule(module, example_inputs, target=target, backend=backend, threads=threads, repair=repair,
                          cache_limit=cache_limit, on_limit=on_limit)


def explain(module, example_inputs, repair=False):
    """The graph-break report of `module` on `example_inputs` (nothing is compiled)."""
    conv, repairs = _convert(module, tuple(example_inputs), repair, "tessel.explain")
    return Explanation(json.loads(conv.builder.explain()), repairs, conv.lowered, len(conv.fallbacks))
