"""tessel.compile / tessel.explain: capture, guards, the recompile cache and statistics."""
import json
import os
import re
import shutil
import time
import warnings
from collections import OrderedDict

import torch
from torch.utils import _pytree as pytree

from . import _tessel
from ._calls import Stats, _StateGuard, _call_builder, _const_name, _split_call, _torch_threads_kept
from ._capture import _READ, Slot, capture, capture_symbolic
from ._convert import Converted, TesselCaptureError, from_buffer, tessel_dtype, to_buffer
from ._dynamic import DynamicUnsupported, make_plan
from ._sym import SymDim
from ._train import TrainModule


class TesselRecompileLimit(_tessel.TesselError):
    """A call needed a new compilation but the callable already holds cache_limit of them."""


def _describe_change(old, new):
    if old is None:
        return "first call"
    names = [s[-1][1] if s and s[-1][0] == "kw" else () for s in (old, new)]
    if names[0] != names[1]:
        return f"keyword arguments {list(names[0])} -> {list(names[1])}"
    if len(old) != len(new):
        return f"{len(new)} inputs instead of {len(old)}"
    for i, (o, n) in enumerate(zip(old, new)):
        if o != n and "=" in (o[0], n[0]):
            return f"input {i} {o[1][1] if o[0] == '=' else 'a tensor'!r} -> {n[1][1] if n[0] == '=' else 'a tensor'!r}"
        if o[1] != n[1]:
            return f"input {i} dtype {o[1]} -> {n[1]}"
        if o[0] != n[0]:
            return f"input {i} shape {list(o[0])} -> {list(n[0])}"
    return "same signature"


class Explanation:
    """The partitioner's report: graphs (compiled partitions), breaks, repairs applied."""

    def __init__(self, report, repairs=(), lowered=0, fallbacks=0, reads=()):
        self.graphs = report["graphs"]
        self.breaks = report["breaks"]
        self.repairs = [dict(pattern=p, node=n, detail=d) for p, n, d in repairs]
        self.lowered = lowered
        self.fallbacks = fallbacks
        # The values the module read into Python while traced, which the graph is specialised to
        # (dicts with kind, value, location): each is checked on every call (docs/python.md).
        self.guards = [r.as_dict() for r in reads]

    @property
    def graph_count(self):
        return len(self.graphs)

    @property
    def break_count(self):
        return len(self.breaks)

    def as_dict(self):
        return dict(graphs=self.graphs, breaks=self.breaks, repairs=self.repairs, guards=self.guards)

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
        for i, g in enumerate(self.guards):
            lines.append(f"value guard {i + 1}: {g['kind']} read as {g['value']!r} at {g['location'] or '<unknown line>'} "
                         "(the graph is specialised to it; another value recompiles)")
        return "\n".join(lines)

    __repr__ = __str__


# What Entry.run returns when a value guard does not hold: the call needs another specialisation.
_MISS = object()


class _Entry:
    """One compilation: the converted graph (for its PyTorch breaks), the partitioned executable, where
    each of its inputs comes from (a call input or a live buffer) and which tensors it writes back."""

    symbolic = None       # a static compilation (_DynamicEntry: the symbolic capture's _dynamic.Symbolic)

    def __init__(self, captured, conv, exe, repairs, guard, report=None, aliased=()):
        self.captured = captured
        self.conv = conv
        self.exe = exe
        self.repairs = repairs
        self.guard = guard
        self.explanation = Explanation(report if report is not None else json.loads(exe.explain()), repairs,
                                       conv.lowered, len(conv.fallbacks), captured.reads)
        src = captured.sources
        self.feeds = [src[p] for p in conv.input_positions]          # int: call input; Slot: a live buffer
        self.writes = [src[p] for p in captured.mutated]
        self.runner = conv.runner if self.explanation.breaks else None
        self.structure = captured.structure
        self.reads = captured.reads
        self.values = tuple(repr(r.value) for r in captured.reads)    # this specialisation's part of its key
        self.miss = None          # what the last call's guard found (a ValueRead description)
        # The common outputs, without pytree: the graph's outputs are the output's tensors in order.
        simple = not captured.mutated and not captured.reads and not conv.out_literals
        self.single = simple and self.structure.kind == "tensor"
        self.plain = simple and self.structure.kind == "tuple"
        # outputs then guards, nothing to write back: checked and rebuilt without pytree
        self.guarded = not captured.mutated and not conv.out_literals and bool(captured.reads)
        # the feeds whose memory the executable may write a new value into (_output_aliases)
        self.aliased = list(aliased)

    def run(self, args):
        """One call: inputs adopted without copies, the executable, outputs as tensors over tessel's
        buffers, mutations written back. Kept lean: this is the per-call overhead (bench/torch_overhead.py)."""
        feeds = self.feeds
        ts = [args[f] if f.__class__ is int else f.get(args) for f in feeds]
        if self.aliased:
            _unshared(ts, self.aliased)
        outs = self.exe.run([to_buffer(t) for t in ts], self.runner)   # (keeps OpenMP's thread count: python/src/_tessel.cpp)
        return self._rebuild(args, [from_buffer(a, d) for a, d in outs])

    def _rebuild(self, args, outs):
        """The call's result from the executable's output tensors: guards checked, the output's structure
        rebuilt around its tensors, mutations written back (shared by the CPU and CUDA entries)."""
        if self.single:                  # a single tensor; no guard, nothing to write back
            return outs[0]
        if self.plain:                   # a flat tuple of tensors
            return tuple(outs)
        if self.guarded:
            n = self.structure.count
            for r, t in zip(self.reads, outs[n:]):
                if not r.holds(t):
                    self.miss = r.describe(_READ[r.kind](t))
                    return _MISS
            return self.structure.rebuild(outs[:n])
        lits = self.conv.out_literals
        flat, k = [], 0
        for i in range(len(outs) + len(lits)):
            if i in lits:
                flat.append(lits[i])
            else:
                flat.append(outs[k])
                k += 1
        (tensors, guards), new_values = pytree.tree_unflatten(flat, self.conv.out_spec)
        for r, t in zip(self.reads, guards):
            if not r.holds(t):           # this graph took another path than eager would: not its answer
                self.miss = r.describe(_READ[r.kind](t))
                return _MISS
        if new_values:
            self._write_back(args, new_values)
        return self.structure.rebuild(tensors)

    def _write_back(self, args, new_values):
        """The module's mutations of its inputs and buffers, as eager would have left them."""
        with torch.no_grad():
            for w, v in zip(self.writes, new_values):
                dst = args[w] if isinstance(w, int) else w.get(args)
                # the executable wrote it in place: over the input (output_aliases; the same address) or,
                # on CUDA, straight into it (_CudaEntry.direct)
                if v is dst or (v.data_ptr() == dst.data_ptr() and v.dtype == dst.dtype and v.shape == dst.shape
                                and dst.is_contiguous()):
                    _bump_version(dst)
                    continue
                dst.copy_(v)


def _new_value_outputs(conv, n_writes):
    """Per mutated input (the flat outputs' last n_writes), the executable output that is its new value,
    or None where the value is a literal (no executable output)."""
    lits = conv.out_literals
    n_flat = conv.out_spec.num_leaves
    return [None if i in lits else i - sum(1 for j in lits if j < i) for i in range(n_flat - n_writes, n_flat)]


def _output_aliases(captured, conv):
    """Where the executable may write a mutated input's new value over the input itself (a static KV
    cache's index_copy_ in place, no copy of the cache per call): (per executable output, the executable
    input it may be written into or -1; the feed indices so aliased). Nothing where the compilation reads
    tensor values (value guards): a guard that misses sends the call to another compilation or to
    PyTorch, which must see the inputs as they were. TESSEL_OUTPUT_ALIASES=0 (read when a compilation is
    made) keeps the copies (bench/static_cache_step.py measures both)."""
    if not captured.mutated or captured.reads or os.environ.get("TESSEL_OUTPUT_ALIASES") == "0":
        return [], []
    positions = {p: k for k, p in enumerate(conv.input_positions)}
    aliases = [-1] * (conv.out_spec.num_leaves - len(conv.out_literals))
    fed = []
    for e, p in zip(_new_value_outputs(conv, len(captured.mutated)), captured.mutated):
        k = positions.get(p)
        if e is not None and k is not None and k not in fed:
            aliases[e] = k
            fed.append(k)
    return (aliases if fed else []), fed


def _storage_of(t):
    s = t.untyped_storage() if hasattr(t, "untyped_storage") else t.storage()
    return s.data_ptr()


def _unshared(ts, aliased):
    """The call's tensors with each one the executable may write over replaced by a copy when it shares
    memory with another of them (written in place it would change what the other reads); the copy's new
    value is then copied back as without an alias."""
    # (fast path: tensors none of which is a view, at distinct addresses -- a detach() shares its
    # tensor's address -- own distinct memory)
    if all(t._base is None for t in ts) and len({t.data_ptr() for t in ts}) == len(ts):
        return
    bases = [_storage_of(t) for t in ts]
    if len(set(bases)) == len(bases):
        return
    for k in aliased:
        if bases.count(bases[k]) > 1:
            ts[k] = ts[k].clone()


def _bump_version(t):
    """The tensor's version counter moved on, as PyTorch's in-place ops do (a write through its address does
    not): what reads versions (tessel's state guard, autograd) sees the mutation."""
    inc = getattr(getattr(torch.autograd, "graph", None), "increment_version", None)
    if inc is not None:
        inc(t)
    else:  # pragma: no cover -- torch < 2.1
        t.add_(0)


class _SymbolicChecks:
    """What a symbolic compilation checks of a call in Python (shared by the CPU and CUDA entries)."""

    def _init_symbolic(self, captured):
        sym = captured.symbolic
        self.symbolic = sym
        self.seen = set()         # the signatures (shapes) it ran
        # per input tensor: its index among the call's tensors and each dim as an int (static), a str
        # (a symbol it binds) or a SymDim (an expression checked once the symbols are bound)
        self.checks = []
        for p, dims in sorted(sym.input_dims.items()):
            k = captured.sources[p]
            if isinstance(k, int):
                self.checks.append((k, [d.text if isinstance(d, SymDim) and d.text in sym.symbols else d
                                        for d in dims]))
        self.specs = list(sym.symbols.values())
        self.shape_guards = sym.guards

    def admits(self, args):
        """None when the call's tensors fit this compilation, else why not (one line)."""
        b, where, later = {}, {}, []
        for k, dims in self.checks:
            shape = args[k].shape
            if len(shape) != len(dims):
                return f"input {k} has rank {len(shape)}, compiled for {len(dims)}"
            for d, (v, n) in enumerate(zip(dims, shape)):
                if v.__class__ is int:
                    if v != n:
                        return f"input {k} dim {d} is {n}, compiled for {v}"
                elif v.__class__ is str:
                    have = b.setdefault(v, n)
                    if have != n:
                        k0, d0 = where[v]
                        return f"input {k} dim {d} is {n}, but input {k0} dim {d0} ({v}) is {have}"
                    where.setdefault(v, (k, d))
                else:
                    later.append((k, d, v, n))
        for s in self.specs:
            if s.name in b and not s.holds(b[s.name]):
                k, d = where[s.name]
                return f"input {k} dim {d} is {b[s.name]}, outside {s}"
        for k, d, v, n in later:
            try:
                want = v.eval(b)
            except _tessel.TesselError as e:          # a symbol no dim binds
                return f"input {k} dim {d} is {v}: {_one_line(e)}"
            if want != n:
                return f"input {k} dim {d} is {n}, compiled for {v} = {want}"
        for g in self.shape_guards:
            if not g.holds(b):
                return g.describe(b)
        return None

    def run(self, args):
        """The entry's call; shapes the executable's own binding check refuses are a miss (_MISS, the
        reason in self.miss), not an error."""
        try:
            return super().run(args)
        except _tessel.GuardFailure as e:
            self.miss = _one_line(e)
            return _MISS

    def describe(self):
        sym = self.symbolic
        return dict(symbols={n: s.facts() for n, s in sym.symbols.items()},
                    inputs={k: [str(d) for d in dims] for k, dims in self.checks},
                    guards=[g.as_dict() for g in sym.guards], specialised=list(sym.specialised),
                    shapes=len(self.seen))


class _DynamicEntry(_SymbolicChecks, _Entry):
    """One symbolic compilation (docs/python.md, "Dynamic shapes"): it serves every call whose tensors
    have its ranks and dtypes, its static dims, sizes that bind its symbols within their facts, and
    shapes that keep the trace's shape guards. admits() checks that in Python (a recompile's reason
    when it fails); the compiled backend checks the binding again and raises GuardFailure."""

    def __init__(self, captured, conv, exe, repairs, guard, aliased=()):
        super().__init__(captured, conv, exe, repairs, guard, aliased=aliased)
        self._init_symbolic(captured)


class _CudaEntry(_Entry):
    """One compilation for the CUDA target: the whole graph is one CUDA executable (no graph breaks), its
    weights uploaded once. A call passes the inputs' device addresses and outputs allocated with
    torch.empty on cuda:0 and runs on the caller's current stream without synchronising the host
    (docs/python.md, "CUDA")."""

    def __init__(self, captured, conv, exe, repairs, guard, report):
        super().__init__(captured, conv, exe, repairs, guard, report)
        self.in_types = [tuple(s) for _, s in exe.input_types]
        self.in_dtypes = [_TORCH_DTYPES[d] for d, _ in exe.input_types]
        self.out_types = [(_TORCH_DTYPES[d], tuple(s)) for d, s in exe.output_types]
        self.device = torch.device("cuda", 0)
        # The executable's outputs that are new values of mutated inputs (the flat outputs' tail): each is
        # copied out straight into the tensor it replaces when that tensor can take it (a static KV cache:
        # no allocation and no second copy per step). The executable reads its inputs only from its own
        # buffers, filled at the start of the call, so writing the input's memory at the end is safe.
        outs = _new_value_outputs(conv, len(self.writes))
        self.direct = [] if None in outs else list(zip(outs, self.writes))
        if len(self.feeds) != len(self.in_types):
            raise _tessel.TesselError(f"the CUDA executable takes {len(self.in_types)} inputs but the graph has "
                                      f"{len(self.feeds)}")

    def _call(self, args):
        ins = []
        for k, f in enumerate(self.feeds):
            t = args[f] if f.__class__ is int else f.get(args)
            if not t.is_cuda or t.device.index != 0:
                if t.dim() == 0 and t.device.type == "cpu":
                    # a CPU scalar beside CUDA tensors, which PyTorch's CUDA ops take (dynamo's graphs pass
                    # such a counter of transformers' caches): one value copied up
                    t = t.to(self.device)
                else:
                    raise _tessel.TesselError(f"input {f if f.__class__ is int else k} ({t.dtype} {list(t.shape)}) is on "
                                              f"{t.device}; this callable was compiled for tessel's CUDA target (cuda:0): "
                                              "pass CUDA tensors")
            if t.dtype != self.in_dtypes[k] or (self.in_types is not None and tuple(t.shape) != self.in_types[k]):
                want = list(self.in_types[k]) if self.in_types is not None else "(its sizes symbolic)"
                raise _tessel.TesselError(f"input {k} is {t.dtype} {list(t.shape)}, compiled for {self.in_dtypes[k]} {want}")
            if not t.is_contiguous():
                t = t.contiguous()
            ins.append(t)
        dev = self.device
        out_types = self._out_types(ins)
        into = {}
        for e, w in self.direct:
            dst = args[w] if w.__class__ is int else w.get(args)
            d, s = out_types[e]
            if dst.is_cuda and dst.device.index == 0 and dst.dtype == d and tuple(dst.shape) == s and dst.is_contiguous():
                into[e] = dst
        outs = [into.get(e) if e in into else torch.empty(s, dtype=d, device=dev) for e, (d, s) in enumerate(out_types)]
        self.exe.run([t.data_ptr() for t in ins], [o.data_ptr() for o in outs],
                     torch.cuda.current_stream(dev).cuda_stream)
        return outs

    def _out_types(self, ins):
        return self.out_types

    def run(self, args):
        return self._rebuild(args, self._call(args))


class _DynamicCudaEntry(_SymbolicChecks, _CudaEntry):
    """A symbolic compilation for the CUDA target (docs/dynamic-shapes.md): its CUDA code generated and
    compiled once, every kernel taking the size symbols as parameters; a call whose input shapes are a
    new binding makes that binding's steps (launch shapes, cuBLASLt plans, the arena) without compiling
    again, and a binding's second call in a row is captured as its CUDA graph."""

    def __init__(self, captured, conv, exe, repairs, guard, report):
        super().__init__(captured, conv, exe, repairs, guard, report)
        self._init_symbolic(captured)
        self.in_types = None      # (the shapes come from the call; bind() checks them against the symbols' facts)
        self._bound = None        # the input shapes the executable's steps are for

    def _out_types(self, ins):
        shapes = tuple(tuple(t.shape) for t in ins)
        if shapes != self._bound:
            self._bound = None
            self.out_types = [(_TORCH_DTYPES[d], tuple(s)) for d, s in self.exe.bind([list(s) for s in shapes])]
            self._bound = shapes
        return self.out_types


_TORCH_DTYPES = {"f64": torch.float64, "f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16,
                 "i64": torch.int64, "i32": torch.int32, "i16": torch.int16, "i8": torch.int8, "u8": torch.uint8,
                 "bool": torch.bool}


def _convert_whole(module, example_inputs, repair, caller, whole, hint, freeze_inputs=(), captured=None, call=None,
                   plan=None):
    """_convert for a consumer of whole graphs (the CUDA target, a model file): a graph break
    is a TesselError naming the first break, `whole` saying why none is allowed and `hint` what to do.
    Returns (captured, conv, repairs, frozen, report)."""
    captured, conv, repairs, frozen = _convert(module, example_inputs, repair, caller, freeze_inputs, captured, call,
                                               plan)
    report = json.loads(conv.builder.explain())
    if report["breaks"]:
        b = report["breaks"][0]
        raise _tessel.TesselError(f"{whole}, and {type(module).__name__} has {len(report['breaks'])} graph break(s) "
                                  f"(first: {b['op']}: {b['reason']}); {hint}")
    return captured, conv, repairs, frozen, report


def _build_cuda(module, example_inputs, repair, freeze_inputs, captured, call, precision, plan=None):
    """The CUDA target's compilation: static, or (a symbolic capture: `plan`, or `captured` made with one)
    one whose code takes the size symbols at run time (_DynamicCudaEntry)."""
    captured, conv, repairs, frozen, report = _convert_whole(
        module, example_inputs, repair, "tessel.compile", "target 'cuda' compiles whole graphs",
        "run it on target='cpu', or under torch.compile, where dynamo's graphs around the break compile separately",
        freeze_inputs, captured, call, plan)
    guard = _StateGuard(captured, frozen, module, conv.attr_constants)
    exe = _tessel.CudaExecutable(conv.builder, precision)
    # (a symbolic capture whose every symbol the graph tied to a number compiles statically)
    entry = _DynamicCudaEntry if exe.symbolic and captured.symbolic is not None else _CudaEntry
    return entry(captured, conv, exe, repairs, guard, report)


def _convert(module, example_inputs, repair, caller, freeze_inputs=(), captured=None, call=None, plan=None):
    """Checks the example inputs (the call's tensors; `call` rebuilds the call's arguments from them),
    captures the module (functionalized; symbolically for the dims a DynamicPlan names) and builds its
    tessel graph (repaired if asked) with its parameters and buffers -- all but the mutated ones -- as
    constants. Returns (captured, converted, repairs, frozen placeholder positions the graph uses)."""
    for i, a in enumerate(example_inputs):
        if not isinstance(a, torch.Tensor):
            raise _tessel.TesselError(f"example input {i} is a {type(a).__name__}; {caller} takes tensors")
        tessel_dtype(a.dtype, f"input {i}")
    if captured is None:
        captured = (capture_symbolic(module, example_inputs, plan, freeze_inputs, call) if plan is not None
                    else capture(module, example_inputs, freeze_inputs, call))
    mutated = set(captured.mutated)
    frozen = {p: (_const_name(src), captured.example[p]) for p, src in enumerate(captured.sources)
              if isinstance(src, Slot) and p not in mutated}
    conv = Converted(captured.gm, captured.example, name=type(module).__name__, frozen=frozen,
                     symbolic=captured.symbolic)
    return captured, conv, (conv.builder.repair() if repair else []), conv.frozen_used


def is_dataflow(target):
    """A simulated dataflow chip: a hardware preset's name or a hardware file (anything but cpu and cuda)."""
    return target not in ("cpu", "cuda")


def _write_file(path, text):
    """`text` to `path` whole or not at all: written beside it, then renamed over it."""
    path = os.fspath(path)
    tmp = f"{path}.tmp-{os.getpid()}"
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except OSError as e:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise _tessel.TesselError(f"{path}: cannot write ({e.strerror or e})") from None


def _resolve_target(target, tensors, precision):
    """(target, precision). target: 'cpu', 'cuda' (target=None picks it when an example input is a CUDA
    tensor; it needs a build with it and a usable device 0: else one line saying which is missing), or a
    dataflow chip: a hardware preset ('spyre', 'tpu-v5e', ...) or a hardware .json file. precision: f32 or
    bf16 on 'cuda', f32 on 'cpu' (None: f32); a dataflow chip's storage dtype, f16, bf16 or f32 (None: the
    chip's own)."""
    if target is None:
        target = "cuda" if any(isinstance(t, torch.Tensor) and t.is_cuda for t in tensors) else "cpu"
    if not isinstance(target, str) or not target:
        raise _tessel.TesselError(f"target must be a name or a hardware file's path, not {target!r}")
    if is_dataflow(target):
        presets = _tessel.hw_presets()
        if target not in presets and not target.endswith(".json") and not os.path.exists(target):
            raise _tessel.TesselError(f"target '{target}' is not one of cpu, cuda, {', '.join(presets)}, nor a hardware "
                                      ".json file")
        if precision not in (None, "f32", "bf16", "f16"):
            raise _tessel.TesselError(f"precision '{precision}' is not a dataflow storage dtype (f16, bf16, f32)")
        if any(isinstance(t, torch.Tensor) and t.is_cuda for t in tensors):
            raise _tessel.TesselError(f"target '{target}' is a simulated chip: its inputs are CPU tensors")
        return target, precision
    precision = "f32" if precision is None else precision
    if precision not in ("f32", "bf16"):
        raise _tessel.TesselError(f"precision '{precision}' is not one of f32, bf16")
    if target == "cpu" and precision != "f32":
        raise _tessel.TesselError("precision='bf16' is a CUDA target option (target='cuda', or CUDA tensors as inputs)")
    if target == "cuda":
        usable, why = _tessel.cuda_device()
        if not usable:
            raise _tessel.TesselError(f"target 'cuda': {why}")
        for i, t in enumerate(tensors):
            if isinstance(t, torch.Tensor) and t.is_cuda and t.device.index not in (None, 0):
                raise _tessel.TesselError(f"input {i} is on {t.device}; tessel's CUDA target runs on cuda:0")
    return target, precision


class _DataflowEntry(_Entry):
    """One compilation for a dataflow chip: the functional simulator runs each call. Values the chip's
    storage precision cannot hold (flushed to zero, overflowed to inf) are said once per compilation, in
    a warning naming the first kernel that stored one: the outputs are what the chip computes, and a
    deep model can lose its signal to DL16's range."""

    warned = False

    def run(self, args):
        out = super().run(args)
        r = self.exe.last_run
        if not self.warned and (r["flushed"] or r["overflowed"]):
            self.warned = True
            said = []
            if r["flushed"]:
                said.append(f"{r['flushed']} values fell below {self.exe.storage}'s range and became 0 (first: "
                            f"{r['first_flush'] or 'on entry'})")
            if r["overflowed"]:
                said.append(f"{r['overflowed']} values overflowed {self.exe.storage} to inf (first: "
                            f"{r['first_overflow'] or 'on entry'})")
            hint = "; precision='bf16' keeps f32's range" if "DL16" in self.exe.storage or "f16" in self.exe.storage else ""
            warnings.warn(f"tessel: functional simulation: {'; '.join(said)}{hint}", stacklevel=3)
        return out


def _build_dataflow(module, example_inputs, target, threads, repair, freeze_inputs, captured, call, precision):
    # (graph breaks run in PyTorch between the partitions the chip runs: host steps in the report)
    captured, conv, repairs, frozen = _convert(module, example_inputs, repair, "tessel.compile", freeze_inputs,
                                               captured, call)
    report = json.loads(conv.builder.explain())
    guard = _StateGuard(captured, frozen, module, conv.attr_constants)
    with _torch_threads_kept():
        exe = _tessel.DataflowExecutable(conv.builder, target, precision or "", threads)
    return _DataflowEntry(captured, conv, exe, repairs, guard, report)


def _build(module, example_inputs, target, backend, threads, repair, freeze_inputs=(), captured=None, call=None,
           precision="f32"):
    if target == "cuda":
        return _build_cuda(module, example_inputs, repair, freeze_inputs, captured, call, precision)
    if is_dataflow(target):
        return _build_dataflow(module, example_inputs, target, threads, repair, freeze_inputs, captured, call, precision)
    if target != "cpu":
        raise _tessel.TesselError(f"target '{target}' is not one of cpu, cuda")
    if backend not in ("compiled", "graph", "eager"):
        raise _tessel.TesselError(f"backend '{backend}' is not one of compiled, graph, eager")
    captured, conv, repairs, frozen = _convert(module, example_inputs, repair, "tessel.compile", freeze_inputs,
                                               captured, call)
    guard = _StateGuard(captured, frozen, module, conv.attr_constants)
    aliases, aliased = _output_aliases(captured, conv)
    with _torch_threads_kept():
        exe = _tessel.Executable(conv.builder, backend, threads, aliases)
    return _Entry(captured, conv, exe, repairs, guard, aliased=aliased)


def _build_dynamic(module, example_inputs, plan, backend, threads, freeze_inputs=(), call=None, captured=None,
                   target="cpu", precision="f32"):
    """A symbolic compilation (one for every shape its symbols cover), from a symbolic capture on the
    example call (or `captured`, one made before)."""
    if target == "cuda":
        return _build_cuda(module, example_inputs, False, freeze_inputs, captured, call, precision, plan)
    captured, conv, repairs, frozen = _convert(module, example_inputs, False, "tessel.compile", freeze_inputs,
                                               captured, call, plan)
    guard = _StateGuard(captured, frozen, module, conv.attr_constants)
    aliases, aliased = _output_aliases(captured, conv)
    with _torch_threads_kept():
        # (the whole graph: a symbolic one has no graph break to partition at)
        exe = _tessel.WholeExecutable(conv.builder, backend, threads, aliases)
    return _DynamicEntry(captured, conv, exe, repairs, guard, aliased)


def _default_threads():
    return _tessel.hardware_threads() or 1


class CompiledModule:
    """The callable tessel.compile returns: guarded by the inputs' shapes and dtypes, recompiling
    (and caching by signature) when they change, up to cache_limit compilations; guarded by the
    frozen parameters and buffers (identity, address, version, training flags), compiling afresh when
    they change; writing back what the module mutates. With dynamic shapes (dynamic=True or
    dynamic_dims), one symbolic compilation serves every shape its size symbols cover
    (docs/python.md, "Dynamic shapes")."""

    def __init__(self, module, example_inputs, target=None, backend="compiled", threads=None, repair=False,
                 cache_limit=8, on_limit="raise", freeze_inputs=(), example_kwargs=None, precision=None,
                 dynamic=None, dynamic_dims=None):
        if on_limit not in ("raise", "eager"):
            raise _tessel.TesselError(f"on_limit must be 'raise' or 'eager', not {on_limit!r}")
        self.module = module
        self.target, self.precision = _resolve_target(target, tuple(example_inputs) + tuple((example_kwargs or {}).values()),
                                                      precision)
        self.backend = backend
        self.threads = threads if threads is not None else _default_threads()
        self.repair = repair
        self.cache_limit = cache_limit
        self.on_limit = on_limit
        self.freeze_inputs = tuple(freeze_inputs)
        self.stats = Stats()
        self.stats._instances = lambda: sum(e.exe.stats.get("instances", 0) for e in self._cache.values()
                                            if e.symbolic is not None)
        self.stats._rebinds = lambda: sum(e.exe.stats.get("rebinds", 0) for e in self._cache.values()
                                          if e.symbolic is not None)
        # (signature, values of its value guards) -> _Entry; a module that reads tensor values into
        # Python has one entry per path through its Python for a signature (its specialisations).
        # A symbolic compilation's key is ("dynamic", ranks and dtypes, serial).
        self._cache = OrderedDict()
        self._current = {}        # signature -> the key of the specialisation tried first
        self._dynamic = {}        # ranks and dtypes of a signature -> keys of its symbolic compilations, newest first
        self._last_key = None
        self._last_sig = None
        tensors, sig = _split_call(tuple(example_inputs), example_kwargs or {})
        self._plan = None         # the dynamic dims (a _dynamic.DynamicPlan) while symbolic compilation is on
        if dynamic or dynamic_dims is not None:
            self._plan = make_plan(dynamic, dynamic_dims, tensors, _tensor_positions(example_inputs, example_kwargs))
            refused = self._dynamic_refused() if self._plan else None
            if refused:
                self._fall_back(refused)
        self._compile(sig, tensors)

    def _dynamic_refused(self):
        if self.target not in ("cpu", "cuda"):
            return f"target '{self.target}' compiles static shapes"
        if self.backend == "graph":
            return "the graph backend plans static shapes (backend 'compiled' or 'eager' take symbolic ones)"
        if self.repair:
            return "repair=True rewrites graph breaks, which a symbolic compilation cannot have"
        return None

    def _fall_back(self, reason):
        """Symbolic compilation is off from here on: one compilation per shape, as without dynamic."""
        self._plan = None
        self.stats.dynamic_fallback = reason
        warnings.warn(f"tessel: {type(self.module).__name__}: dynamic shapes fall back to a compilation per "
                      f"input shape: {reason}", stacklevel=_caller_level())

    @property
    def dynamic(self):
        """The newest symbolic compilation's description (symbols, each input's dims, shape guards, dims
        the module's sizes made static), or None when none was made."""
        for key in reversed(self._cache):
            e = self._cache[key]
            if getattr(e, "symbolic", None) is not None:
                return e.describe()
        return None

    def _compile(self, sig, args, reason=None, captured=None):
        t0 = time.perf_counter()
        entry = None
        call = _call_builder(sig)
        symbolic = captured.symbolic if captured is not None else None
        plan = self._plan.restricted(args) if self._plan is not None and captured is None else None
        refused = None
        if symbolic is not None:
            entry = _build_dynamic(self.module, args, None, self.backend, self.threads, self.freeze_inputs, call,
                                   captured, self.target, self.precision)
        elif plan is not None:
            entry, refused = self._build_symbolic(args, plan, call)
        if entry is None:
            entry = _build(self.module, args, self.target, self.backend, self.threads, self.repair,
                           self.freeze_inputs, captured, call, self.precision)
            if refused is not None:
                # (only once the static compilation worked: a call the module cannot take at all, such as
                # a wrong feature size, raises its error and leaves dynamic shapes on)
                self._fall_back(refused)
        dt = time.perf_counter() - t0
        if self.stats.compiles:
            self.stats.recompiles.append(reason or _describe_change(self._last_sig, sig))
        self.stats.compiles += 1
        self.stats.compile_seconds += dt
        if entry.symbolic is not None and not entry.symbolic.symbols:
            # the module's sizes made every dim static: a static compilation, and the user is told why
            tied = entry.symbolic.specialised
            entry.symbolic = None
            if plan is not None and tied and self.stats.dynamic_fallback is None:
                self._fall_back("every dynamic dim is tied to its example size: " + "; ".join(tied))
        if entry.symbolic is not None:
            dkey = _dynamic_key(sig)
            key = ("dynamic", dkey, self.stats.compiles)
            self._dynamic.setdefault(dkey, []).insert(0, key)
            entry.seen.add(sig)
            self.stats.bindings += 1
        else:
            key = (sig, entry.values)
        self._cache[key] = entry
        self._current[sig] = key
        self._last_key, self._last_sig = key, sig
        return entry

    def _build_symbolic(self, args, plan, call):
        """(entry, None) of a symbolic compilation of the call, or (None, why none could be made). A
        refusal that names some of the symbols (a convolution over a symbolic spatial dim) makes those
        static and tries again with the rest, with a warning; one that names none ends the tries."""
        static = []
        while True:
            try:
                entry = _build_dynamic(self.module, args, plan, self.backend, self.threads, self.freeze_inputs, call,
                                       target=self.target, precision=self.precision)
            except _tessel.TesselError as e:       # DynamicUnsupported, a symbolic capture or compile failure
                why = _one_line(e)
                same = _needed_equal(why, plan, args)
                if same is not None:
                    # two symbols the graph needs equal (dynamo gives each KV cache tensor its own length
                    # symbol; attention needs them equal): one symbol, when this call's sizes agree
                    plan = plan.merged(*same)
                    static.append(f"{same[1]} = {same[0]} ({_NODE_CONTEXT.sub('', why)})")
                    continue
                # (the symbols it names outside types and shapes: "Conv over f32[s0,3,s2,s3]: dim 2 is symbolic (s2)")
                prose = re.sub(r"\[[^\]]*\]", "", why)
                named = {n for n in plan.symbols if re.search(rf"(?<![A-Za-z0-9_]){re.escape(n)}(?![A-Za-z0-9_])", prose)}
                plan = plan.without(named) if named else None
                if plan is None:
                    return None, why
                # (in the warning without the node's context: "Conv over f32[s0,3,s2,s3]: dim 2 is symbolic (s2) ...")
                short = _NODE_CONTEXT.sub("", why)
                static.append(f"{', '.join(sorted(named))} static ({short})")
                continue
            if static:
                entry.symbolic.specialised.extend(static)
                warnings.warn(f"tessel: {type(self.module).__name__}: dynamic shapes: {'; '.join(static)}",
                              stacklevel=_caller_level())
            return entry, None

    # ---- dataflow targets (docs/python.md, "Dataflow targets") ----
    def _dataflow_exe(self, what):
        if not is_dataflow(self.target):
            raise _tessel.TesselError(f"{what} is the timed simulation of a dataflow target; this callable was compiled "
                                      f"for target '{self.target}'")
        return self._cache[self._last_key].exe

    @property
    def report(self):
        """The timed simulation of the newest compilation (`tessel sim --json`'s report): per kernel the
        simulated time, roofline bound and %, split, padding, scratchpad slices, fusion traffic saved."""
        return json.loads(self._dataflow_exe(".report").report_json())

    def report_table(self):
        """The report as `tessel sim` prints it."""
        return self._dataflow_exe("report_table()").table()

    @property
    def storage(self):
        """The chip's storage dtype of float tensors (with DL16 where the chip stores so)."""
        return self._dataflow_exe(".storage").storage

    @property
    def last_run(self):
        """The last call's functional simulation: tiles run, host steps, seconds, values flushed to zero or
        overflowed by the storage precision."""
        return dict(self._dataflow_exe(".last_run").last_run)

    def kernels(self):
        """The kernel level of the newest compilation on a dataflow target (docs/ir/kernel.md): each fused
        kernel with its loops, accesses, library call and the graph nodes it came from. The report's
        `kernels` list the same kernels with their tile decisions and times."""
        return self._dataflow_exe("kernels()").kernel_text()

    def trace(self, path):
        """Writes the timed simulation's trace (open in ui.perfetto.dev or chrome://tracing)."""
        _write_file(path, self._dataflow_exe("trace()").trace_json())
        return path

    def html(self, path):
        """Writes the HTML report page (`tessel report`) of this target."""
        _write_file(path, self._dataflow_exe("html()").html(type(self.module).__name__))
        return path

    def ktir(self, folder):
        """Writes the KTIR export (docs/ktir.md) into `folder`; returns its manifest."""
        return json.loads(self._dataflow_exe("ktir()").ktir(os.fspath(folder)))

    @property
    def explanation(self):
        """The graph-break report of the most recent compilation."""
        return self._cache[self._last_key].explanation

    def __call__(self, *call_args, **call_kwargs):
        self.stats.calls += 1
        args, sig = _split_call(call_args, call_kwargs)      # args: the call's tensors from here on
        key = self._current.get(sig)
        reason = None
        if key is None and self._dynamic:
            key, reason = self._admitting(sig, args)
        entry = self._cache.get(key) if key is not None else None
        if entry is not None:
            stale = entry.guard.stale(args)
            if stale is None:
                out = entry.run(args)
                if out is not _MISS:
                    self.stats.cache_hits += 1
                    self._last_key, self._last_sig = key, sig
                    return out
                if entry.symbolic is None:
                    return self._other_path(sig, args, entry, call_args, call_kwargs)
                reason = entry.miss          # the compiled backend's guard refused the shapes
            else:
                # Every cached compilation froze the same state: all are stale. When only values changed,
                # this signature's captured graph is reused (conversion and compilation only).
                reuse = entry.captured if entry.guard.same_objects(args) else None
                self._cache.clear()
                self._current.clear()
                self._dynamic.clear()
                self.stats.refreshes += 1
                return self._run_new(self._compile(sig, args, stale, reuse), sig, args, call_args, call_kwargs)
        limited = self._at_limit(sig, call_args, call_kwargs, reason or _describe_change(self._last_sig, sig))
        if limited is not None:
            return limited()
        return self._run_new(self._compile(sig, args, reason), sig, args, call_args, call_kwargs)

    def _run_new(self, entry, sig, args, call_args, call_kwargs):
        """The first run of a compilation made for this call."""
        out = entry.run(args)
        if out is not _MISS:
            return out
        if entry.symbolic is not None:
            raise _tessel.TesselError(f"{type(self.module).__name__}: a symbolic compilation made for this call "
                                      f"refuses its shapes ({entry.miss})")
        return self._other_path(sig, args, entry, call_args, call_kwargs)

    def _admitting(self, sig, args):
        """(key, None) of the newest symbolic compilation that covers the call's shapes, or (None, why the
        newest one does not) -- a recompile's reason."""
        keys = self._dynamic.get(_dynamic_key(sig))
        if not keys:
            return None, None
        why = None
        for key in keys:
            e = self._cache[key]
            miss = e.admits(args)
            if miss is None:
                if sig not in e.seen:
                    e.seen.add(sig)
                    self.stats.bindings += 1
                    if len(self._current) < _CURRENT_LIMIT:
                        self._current[sig] = key       # the same shapes again: no binding to check
                return key, None
            why = why or miss
        return None, why

    def _other_path(self, sig, args, missed, call_args, call_kwargs):
        """A value guard of `missed` failed on this call: another cached specialisation of the signature
        whose guards hold answers it, else a new capture on this call's inputs (a recompile)."""
        for key, e in list(self._cache.items()):
            if key[0] == sig and e is not missed:
                out = e.run(args)
                if out is not _MISS:
                    self.stats.cache_hits += 1
                    self._current[sig] = self._last_key = key
                    self._last_sig = sig
                    return out
        reason = f"value guard: {missed.miss}"
        limited = self._at_limit(sig, call_args, call_kwargs, reason)
        if limited is not None:
            return limited()
        entry = self._compile(sig, args, reason)
        out = entry.run(args)
        if out is _MISS:
            raise _tessel.TesselError(
                f"{type(self.module).__name__}: captured again on this call's inputs, the graph still reads another "
                f"value than the trace did ({entry.miss}); the module's Python depends on something other than its "
                "tensor inputs, parameters and buffers, so tessel cannot guarantee its result")
        return out

    def _at_limit(self, sig, call_args, call_kwargs, reason):
        """None while another compilation fits in cache_limit; else a callable giving the call's answer
        (eager, with on_limit='eager') or raising TesselRecompileLimit."""
        if len(self._cache) < self.cache_limit:
            return None
        if self.on_limit == "eager":
            def eager():
                self.stats.eager_calls += 1
                with torch.no_grad():
                    return self.module(*call_args, **call_kwargs)
            return eager
        raise TesselRecompileLimit(
            f"{type(self.module).__name__}: {reason} needs a new compilation, but cache_limit={self.cache_limit} "
            f"compilations are already cached (signatures: {[self._show_key(k) for k in self._cache]}); "
            "raise cache_limit or pass on_limit='eager'")

    def _show_key(self, key):
        if key[0] == "dynamic":
            return f"symbolic {self._cache[key].describe()['inputs']}"
        return [_show(s) for s in key[0]]


# "[infer] node 'x/conv:Conv @ f.py:3 `...`' (Conv): " before a C++ error's message
_NODE_CONTEXT = re.compile(r"\[\w+\] node .*? \(\w+\): ")

# A symbolic compilation remembers this many shapes it admitted (then looked up without a binding check).
_CURRENT_LIMIT = 4096


_SYM_PLUS = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)([+-]\d+)?")
_NEEDED_EQUAL = (re.compile(r"(\S+) and (\S+) must be equal, which the symbols do not decide"),
                 re.compile(r"only if (\S+) equals (\S+) \(or either is 1\), which the symbols do not decide"))


def _needed_equal(why, plan, args):
    """(keep, drop): two size symbols a refusal says the graph needs equal ("s53+1 and s40+1 must be
    equal", "broadcast only if s1 equals s2"), when both are the plan's, offset alike, and equal in this
    call; else None."""
    for pattern in _NEEDED_EQUAL:
        m = pattern.search(why)
        if not m:
            continue
        a, b = (_SYM_PLUS.fullmatch(x) for x in m.groups())
        if not a or not b or a.group(2) != b.group(2) or a.group(1) == b.group(1):
            return None
        keep, drop = a.group(1), b.group(1)
        if keep not in plan.symbols or drop not in plan.symbols:
            return None
        va, vb = plan.value_of(keep, args), plan.value_of(drop, args)
        return (keep, drop) if va is not None and va == vb else None
    return None


def _dynamic_key(sig):
    """What a symbolic compilation is specialised on: each tensor's rank and dtype, the literals."""
    return tuple((len(s[0]), s[1]) if s[0] not in ("=", "kw") else s for s in sig)


def _tensor_positions(example_inputs, example_kwargs):
    """{input index or keyword name: the place of that tensor among the call's tensors} (_split_call's order)."""
    out, k = {}, 0
    items = list(enumerate(example_inputs)) + [(n, example_kwargs[n]) for n in sorted(example_kwargs or {})]
    for key, a in items:
        if isinstance(a, torch.Tensor):
            out[key] = k
            k += 1
    return out


def _caller_level():
    """The warnings stacklevel of the first frame outside tessel (the user's call)."""
    import os
    import sys
    here = os.path.dirname(os.path.abspath(__file__))
    f, level = sys._getframe(1), 1
    while f is not None and os.path.dirname(os.path.abspath(f.f_code.co_filename)) == here:
        f, level = f.f_back, level + 1
    return level


def _one_line(e):
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def _show(s):
    """One signature item as the limit error prints it: a tensor's shape, a literal's value, kw names."""
    return list(s[0]) if s[0] not in ("=", "kw") else (s[1][1] if s[0] == "=" else dict(keywords=list(s[1])))


def compile(module, example_inputs, target=None, backend="compiled", threads=None, repair=False, cache_limit=8,
            on_limit="raise", example_kwargs=None, train=False, precision=None, dynamic=None, dynamic_dims=None):
    """Compile a PyTorch module (or function of tensors) for tessel; returns a guarded callable.

    example_inputs: a tuple of the module's positional arguments, example_kwargs: a dict of its keyword
    arguments, it is captured with (make_fx): tensors, or None/bool/int/float/str (specialised). backend: compiled (fused,
    generated C++), graph (core ops, planned arena) or eager (reference kernels). threads: for the compiled
    backend (default: the machine's hardware threads). repair: apply the auto-repairs of graph breaks.
    cache_limit / on_limit: how many signatures are compiled before a new one raises or runs in eager.
    target: 'cpu' or 'cuda' (default: 'cuda' when an example input is a CUDA tensor, else 'cpu'). On 'cuda' the
    whole graph runs as one CUDA executable on cuda:0: the calls take and return CUDA tensors (no host copies)
    and run on the caller's current stream without synchronising; precision='bf16' keeps weights and
    matmul and convolution activations as bf16 in device memory, the residual stream f32 as PyTorch's autocast
    (f32 arithmetic, f32 outputs).
    target: a dataflow chip -- a hardware preset ('spyre', 'tpu-v5e', 'tpu-v4', `tessel hw`) or a hardware .json
    file -- maps the whole graph onto the simulated chip: each call's outputs come from the functional
    simulator (real tensors holding what the chip's storage precision holds: precision='bf16', 'f16' or
    'f32', default the chip's), and .report, .report_table(), .trace(path), .html(path) and .ktir(folder)
    give the timed simulation (docs/python.md, "Dataflow targets").
    train: the output is differentiable -- loss.backward() runs tessel's compiled backward and fills the
    parameters' .grad (parameters are graph inputs, not frozen; docs/python.md, "Training").
    dynamic=True: every dim of every tensor input that is at least 2 in the example is a size symbol, and
    one symbolic compilation serves every size (the compiled or eager backend; dims the module ties to a
    constant stay static). dynamic_dims={input: [dims]} or {input: {dim: name or (name, lo, hi[,
    multiple_of])}} names the dynamic dims instead (input: a position or a keyword argument's name; one
    name in two places is one symbol). A call outside a compilation's shapes recompiles, with the
    reason in stats.recompiles; a module the symbolic capture cannot take compiles per shape, with a
    warning (stats.dynamic_fallback). docs/python.md, "Dynamic shapes".
    """
    if train:
        if target not in (None, "cpu") or repair or precision not in (None, "f32"):
            raise _tessel.TesselError("train=True takes target='cpu', precision='f32' and no repair")
        if dynamic or dynamic_dims is not None:
            raise _tessel.TesselError("train=True compiles static shapes (dynamic shapes are for inference)")
        return TrainModule(module, example_inputs, backend=backend, threads=threads, cache_limit=cache_limit,
                           example_kwargs=example_kwargs)
    return CompiledModule(module, example_inputs, target=target, backend=backend, threads=threads, repair=repair,
                          cache_limit=cache_limit, on_limit=on_limit, example_kwargs=example_kwargs, precision=precision,
                          dynamic=dynamic, dynamic_dims=dynamic_dims)


def export(module, example_inputs, folder, example_kwargs=None, repair=False):
    """Writes `module` as a model folder every `tessel` command takes (run --check, sim, report, landscape,
    explain, bench): folder/model.tsl -- the graph tessel.compile would compile, its parameters as
    constants -- and folder/test_data_set_0 with the call's inputs (input_N.pb) and PyTorch eager's outputs
    (output_N.pb). `folder` must not exist or be empty; it is written beside and renamed into place, so it
    is whole or absent. Returns the folder. docs/python.md, "Export"."""
    folder = os.fspath(folder)
    if os.path.exists(folder) and (not os.path.isdir(folder) or os.listdir(folder)):
        raise _tessel.TesselError(f"{folder}: exists and is not an empty folder (tessel.export writes a new one)")
    tensors, sig = _split_call(tuple(example_inputs), example_kwargs or {})
    call = _call_builder(sig)
    name = type(module).__name__
    captured, conv, _, _, _ = _convert_whole(module, tensors, repair, "tessel.export",
                                             "tessel.export writes whole graphs (a model file holds no PyTorch)",
                                             "try repair=True", call=call)
    if captured.mutated or captured.reads or conv.out_literals:
        why = ("changes its inputs or buffers" if captured.mutated else
               "reads tensor values into Python (value guards)" if captured.reads else "returns non-tensor values")
        raise _tessel.TesselError(f"tessel.export: {name} {why}; a model file holds the tensor graph only")
    feeds = [captured.sources[p] for p in conv.input_positions]
    if any(f.__class__ is not int for f in feeds):
        raise _tessel.TesselError(f"tessel.export: {name} reads a buffer it also changes; a model file holds none")
    with torch.no_grad():
        args, kwargs = call(list(tensors))
        ref = module(*args, **kwargs)
    outs, _ = pytree.tree_flatten(ref)
    outs = [o for o in outs if isinstance(o, torch.Tensor)]
    parent = os.path.dirname(os.path.abspath(folder))
    tmp = os.path.join(parent, f".{os.path.basename(os.path.abspath(folder))}.tmp-{os.getpid()}")
    try:
        os.makedirs(os.path.join(tmp, "test_data_set_0"))
        with open(os.path.join(tmp, "model.tsl"), "w", encoding="utf-8") as f:
            f.write(conv.builder.text(False))
        for k, (f_, value) in enumerate(zip(feeds, conv.input_names)):
            arr, d = to_buffer(tensors[f_])
            _tessel.write_tensor_pb(arr, d, value, os.path.join(tmp, "test_data_set_0", f"input_{k}.pb"))
        for k, o in enumerate(outs):
            arr, d = to_buffer(o.detach().contiguous())
            _tessel.write_tensor_pb(arr, d, f"output_{k}", os.path.join(tmp, "test_data_set_0", f"output_{k}.pb"))
        if os.path.isdir(folder):
            os.rmdir(folder)            # (empty: checked above)
        os.replace(tmp, folder)
    except OSError as e:
        raise _tessel.TesselError(f"{folder}: cannot write ({e.strerror or e})") from None
    finally:
        if os.path.isdir(tmp):
            shutil.rmtree(tmp, ignore_errors=True)
    return folder


def landscape(module, example_inputs, targets=("spyre", "tpu-v5e", "tpu-v4", "cpu"), threads=None, iters=20,
              example_kwargs=None):
    """The Accelerator Landscape Map's rows for `module` (`tessel landscape --json`, without an export): per
    dataflow target its timed simulation (time_us, utilisation, dram_mb, padding_mb, scratchpad_peak_kb,
    roofline_us, cores, dtype, compile_ms) and the functional simulator's max_rel_err against eager; 'cpu'
    measured here (median of `iters` calls after a warm one); 'cuda' where a usable GPU is. Returns a list
    of dicts, one per target, in order."""
    tensors, sig = _split_call(tuple(example_inputs), example_kwargs or {})
    call = _call_builder(sig)
    with torch.no_grad():
        a, kw = call(list(tensors))
        ref = module(*a, **kw)
    ref_flat = [t for t in pytree.tree_flatten(ref)[0] if isinstance(t, torch.Tensor)]

    def rel_err(out):
        outs = [t for t in pytree.tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
        return max(float((o.cpu().float() - r.float()).abs().max() / max(float(r.float().abs().max()), 1e-30))
                   for o, r in zip(outs, ref_flat))
    rows = []
    for target in targets:
        t0 = time.perf_counter()
        if is_dataflow(target):
            fast = compile(module, tensors, target=target, threads=threads, example_kwargs=example_kwargs)
            row = json.loads(fast._cache[fast._last_key].exe.landscape_row())
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")     # (a flush is in max_rel_err, and fast.last_run)
                row["max_rel_err"] = rel_err(fast(*tensors))
            rows.append(row)
            continue
        on = tensors
        if target == "cuda":
            usable, why = _tessel.cuda_device()
            if not usable:
                rows.append(dict(target="cuda", skipped=why))
                continue
            on = tuple(t.cuda() for t in tensors)
        elif target != "cpu":
            raise _tessel.TesselError(f"landscape: target '{target}' is not cpu, cuda or a dataflow chip")
        fast = compile(module, on, target=target, threads=threads, example_kwargs=example_kwargs)
        with torch.no_grad():
            out = fast(*on)
        compile_ms = (time.perf_counter() - t0) * 1e3
        times = []
        for _ in range(iters):
            if target == "cuda":
                torch.cuda.synchronize()
            t1 = time.perf_counter()
            fast(*on)
            if target == "cuda":
                torch.cuda.synchronize()
            times.append((time.perf_counter() - t1) * 1e6)
        times.sort()
        rows.append(dict(target=target, time_us=times[len(times) // 2], compile_ms=compile_ms,
                         threads=fast.threads if target == "cpu" else None, max_rel_err=rel_err(out)))
    return rows


def explain(module, example_inputs, repair=False, example_kwargs=None):
    """The graph-break report of `module` on `example_inputs` (nothing is compiled)."""
    tensors, sig = _split_call(tuple(example_inputs), example_kwargs or {})
    captured, conv, repairs, _ = _convert(module, tensors, repair, "tessel.explain", call=_call_builder(sig))
    return Explanation(json.loads(conv.builder.explain()), repairs, conv.lowered, len(conv.fallbacks),
                       captured.reads)
