"""Building a tessel graph from an aten FX graph, and running its graph breaks in PyTorch.

The FX graph comes from capture (make_fx). Every call_function node is looked up in the aten table
(aten_table.py); a node whose inputs are all constants is evaluated by PyTorch once and becomes a
constant; a node with no lowering becomes a TorchFallback node that the partitioner reports as a graph
break and that runs in PyTorch eager when the executable runs.
"""
import operator
import os

import numpy as np
import torch
import torch.fx
from torch.utils import _pytree as pytree

from . import _tessel
from ._dtypes import TESSEL_TO_TORCH, TORCH_TO_TESSEL, tessel_dtype  # noqa: F401  (also imported from here)
from ._dynamic import DynamicUnsupported, is_sym_node, sym_value
from ._sym import SymDim, size
from .aten_table import LOWERINGS, DATA_DEPENDENT, Unsupported



class TesselCaptureError(_tessel.TesselError):
    """The module could not be captured into an aten graph (data-dependent control flow, .item(), ...)."""


_FAST_DTYPES = {k: v for k, v in TORCH_TO_TESSEL.items() if k != torch.bfloat16}   # (bf16 goes through int16)


def to_buffer(t):
    """A (numpy array, tessel dtype) pair over a CPU tensor's memory (copied only if not contiguous)."""
    d = _FAST_DTYPES.get(t.dtype)
    if d is not None and not t.requires_grad and t.is_contiguous():
        try:                # the common case first: this runs for every input and break result per call
            return t.numpy(), d
        except (TypeError, RuntimeError):   # not on the CPU, or a conjugate/negative view
            pass
    t = t.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    t = t.contiguous()
    d = tessel_dtype(t.dtype, "a tensor")
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy(), d
    return t.numpy(), d


def from_buffer(arr, d):
    if d == "bf16":
        # (not np.ascontiguousarray: it makes a 0-d array 1-d, and a 0-d bf16 output came back as [1])
        arr = arr if arr.flags.c_contiguous else arr.copy(order="C")
        return torch.from_numpy(arr.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(arr)


def _meta_list(node):
    """The traced output types of an FX node: [(torch dtype, shape)], one per tensor output."""
    tm = node.meta.get("tensor_meta")
    if tm is None:
        val = node.meta.get("val")
        if isinstance(val, torch.Tensor):
            return [(val.dtype, list(val.shape))]
        if isinstance(val, (list, tuple)):
            return [(v.dtype, list(v.shape)) for v in val if isinstance(v, torch.Tensor)]
        return None
    if hasattr(tm, "dtype"):  # one TensorMetadata (a NamedTuple, so test it before sequences)
        return [(tm.dtype, list(tm.shape))]
    return [(m.dtype, list(m.shape)) for m in tm if hasattr(m, "dtype")]


def _meta_of_items(node):
    """The output types of a tuple-valued node from its getitem users (make_fx on torch 1.13 records
    types on the items only)."""
    items = {u.args[1]: _meta_list(u) for u in node.users if u.target is operator.getitem}
    if not items or any(v is None or len(v) != 1 for v in items.values()) or sorted(items) != list(range(len(items))):
        return None
    return [items[k][0] for k in range(len(items))]


class _Lowerer:
    """What a lowering sees: the builder, helpers to add constants and nodes, and value types."""

    def __init__(self, builder, name, masks=None, sym_names=None, symbolic=None):
        self.b = builder
        self.name = name
        self.masks = masks      # train=True: random masks become graph inputs, appended here (else None)
        self.sym_names = sym_names  # a symbolic trace's symbol names -> the graph's (torch 2), or None
        self.symbolic = symbolic    # the capture's Symbolic (its symbols' facts), or None
        self._k = 0

    def narrow_symbol(self, dim, hi, hint):
        """Narrows the range of the size symbol `dim` (a SymDim that is one symbol alone) to at most `hi`
        where the example's value `hint` lies within it: the compilation then covers those values only,
        its guard (Python's admits, the C++ binder) sending any other to a recompile with the reason, and
        the shape rules decide with the narrowed range (a slice up to the symbol of an axis of size hi
        takes the symbol as is). False, changing nothing, where that does not apply."""
        spec = self.symbolic.symbols.get(dim.text) if self.symbolic is not None and isinstance(dim, SymDim) else None
        if spec is None or not isinstance(hint, int) or spec.hi <= hi:
            return spec is not None and spec.hi <= hi
        if not spec.lo <= hint <= hi or hi // spec.multiple_of * spec.multiple_of < spec.lo:
            return False
        spec.hi = hi
        self.b.declare_symbol(spec.name, *spec.facts())
        return True

    def _n(self, suffix=""):
        # "module/fx_name:Op[#k] @ file:line `code`": the module path and source line reach the reports.
        self._k += 1
        base, sep, src = self.name.partition(" @ ")
        tag = f":{suffix}" if suffix else ""
        return f"{base}{tag}{'#' + str(self._k) if self._k > 1 else ''}{sep}{src}"

    def type(self, v):
        d, dims = self.b.type(v)
        return d, [size(x) for x in dims]

    def dtype(self, v):
        return self.b.type(v)[0]

    def shape(self, v):
        """The dims of a value: ints, and SymDims where the size is symbolic (docs/dynamic-shapes.md)."""
        return [size(x) for x in self.b.type(v)[1]]

    def rank(self, v):
        return len(self.b.type(v)[1])

    def const(self, value, dtype):
        if not isinstance(value, torch.Tensor) and any(isinstance(v, SymDim) for v in pytree.tree_flatten(value)[0]):
            raise Unsupported(f"a constant holding symbolic sizes ({value})")
        t = torch.as_tensor(value, dtype=TESSEL_TO_TORCH[dtype])
        arr, d = to_buffer(t)
        return self.b.constant(self.name + ".c", arr, d)

    def ints(self, values):
        """An i64 list: a constant, or a Sizes node when an entry is symbolic (a shape operand)."""
        values = list(values)
        if any(isinstance(v, SymDim) for v in values):
            return self.sizes(values)
        return self.const(values, "i64")

    def sizes(self, values, scalar=False):
        """A Sizes node (domain tessel) holding sizes, some symbolic: the shape operand of Reshape,
        Expand, ConstantOfShape or Range. scalar: one size as a 0-d value."""
        dims = [v.text if isinstance(v, SymDim) else int(v) for v in values]
        return self.op("Sizes", [], {"dims": dims, "shape": [] if scalar else [len(dims)], "dtype": "i64"})

    def scalar_size(self, v):
        """A 0-d i64 value of a size: a constant, or a Sizes node when it is symbolic."""
        return self.sizes([v], scalar=True) if isinstance(v, SymDim) else self.const(v, "i64")

    def op(self, op, inputs, attrs=None, outputs=1, suffix=""):
        outs = self.b.node(op, self._n(suffix or op), list(inputs), outputs, attrs or {})
        return outs[0] if outputs == 1 else outs


def _source_of(node):
    src = node.meta.get("tessel_source")
    mod = node.meta.get("tessel_module")
    path = mod if mod else "<root>"
    return f"{path}/{node.name}" + (f" @ {src}" if src else "")


class Converted:
    """A tessel graph builder made from an FX graph, plus the PyTorch side of its graph breaks."""

    def __init__(self, gm, example_inputs, name="torch", frozen=None, masks=False, symbolic=None):
        self.gm = gm
        # symbolic (a _dynamic.Symbolic): the graph's inputs get its dims, SymInt nodes compute sizes,
        # and anything that would be a graph break is DynamicUnsupported instead (docs/python.md).
        self.symbolic = symbolic
        # masks=True (train=True): each bernoulli_mask node becomes a graph input after the placeholders'
        # (aten_table.RandomMask, drawn per call in this order); otherwise it runs in PyTorch.
        self.masks = [] if masks else None
        self.builder = _tessel.GraphBuilder(name)
        self.fallbacks = {}          # tessel node name -> callable(list of torch tensors) -> list of tensors
        self.input_dtypes = []
        self.input_positions = []    # the placeholders that are tessel graph inputs, in order
        self.input_names = []        # their tessel value names
        self.frozen = frozen or {}   # placeholder position -> (name, tensor): a constant of the graph
        self.frozen_used = []        # the frozen positions the outputs depend on
        self.attr_constants = []     # (name, tensor) of the graph's own tensor attributes the outputs use
        self.lowered = 0
        self._build(example_inputs)

    def _build(self, example_inputs):
        gm, b = self.gm, self.builder
        graph = gm.graph
        out_node = next(n for n in graph.nodes if n.op == "output")
        # Nodes the outputs depend on (others, e.g. unused detach/getitem results, are skipped).
        live = set()
        stack = [out_node]
        while stack:
            n = stack.pop()
            if n in live:
                continue
            live.add(n)
            stack.extend(n.all_input_nodes)
        env = {}        # fx node -> tessel value name (or tuple of names), or ("const", tensor)
        consts = {}     # fx node -> torch value for nodes that depend only on constants
        syms = {}       # fx node -> the size (int or SymDim) of a node that computes one (symbolic traces)
        symbolic = self.symbolic
        if symbolic is not None:
            symbolic.declare(b)
        placeholders = [n for n in graph.nodes if n.op == "placeholder"]
        if len(placeholders) != len(example_inputs):
            raise _tessel.TesselError(f"captured graph takes {len(placeholders)} inputs but {len(example_inputs)} "
                                      "example inputs were given")
        const_names = {}
        for i, (n, t) in enumerate(zip(placeholders, example_inputs)):
            if i in self.frozen:
                # A frozen parameter or buffer: a constant over its memory, folded where it can be.
                const_names[n], consts[n] = self.frozen[i]
                if n in live:
                    self.frozen_used.append(i)
                continue
            if not isinstance(t, torch.Tensor):
                raise _tessel.TesselError(f"example input {i} is a {type(t).__name__}; tessel.compile takes tensors")
            d = tessel_dtype(t.dtype, f"input {i} ('{n.name}')")
            self.input_dtypes.append(d)
            self.input_positions.append(i)
            dims = symbolic.input_dims.get(i) if symbolic is not None else None
            shape = list(t.shape) if dims is None else [x.text if isinstance(x, SymDim) else x for x in dims]
            env[n] = b.input(n.name, d, shape)
            self.input_names.append(env[n])

        # One tessel constant per distinct folded tensor, and one fold per distinct computation: a
        # shared layer's weight (ALBERT) is transposed by every call of the layer (`t_copy` after
        # functionalization), and without these each call would be its own materialised copy, packed
        # again by the compiled backend (12 x 805 MB for ALBERT-xxlarge).
        const_values = {}   # id(folded tensor) -> tessel value
        folds = {}          # (target, arguments with constants by identity) -> folded tensor

        def fold_key(n):
            def part(a):
                if isinstance(a, torch.fx.Node):
                    # a constant by identity, or a size the trace fixed (a SymInt node that is a number)
                    return ("const", id(consts[a])) if a in consts else ("size", syms[a])
                if isinstance(a, (list, tuple)):
                    return (type(a).__name__,) + tuple(part(x) for x in a)
                if isinstance(a, dict):
                    return ("dict",) + tuple(sorted((k, part(v)) for k, v in a.items()))
                if a is None or isinstance(a, (bool, int, float, str, torch.dtype, torch.device, torch.layout,
                                               torch.memory_format)):
                    return (type(a).__name__, a)
                raise TypeError("not a plain argument")
            try:
                key = (n.target, part(n.args), part(n.kwargs))
                hash(key)
                return key
            except TypeError:
                return None

        def tensor_value(n):
            """The tessel value of an FX argument that is a tensor."""
            if n in env:
                if env[n] is None:  # (a result a lowering does not give: eval-mode statistics once were)
                    raise _tessel.TesselError(f"value '{n.name}' ({_source_of(n)}) has no tessel value: the lowering of "
                                              f"its op gives none for it")
                return env[n]
            if n in consts:
                v = consts[n]
                if isinstance(v, torch.Tensor) and id(v) in const_values:
                    env[n] = const_values[id(v)]
                    return env[n]
                arr, d = to_buffer(v)
                env[n] = b.constant(const_names.get(n, n.name), arr, d)
                if isinstance(v, torch.Tensor):
                    const_values[id(v)] = env[n]
                return env[n]
            raise _tessel.TesselError(f"value '{n.name}' is used before it is defined")

        for n in graph.nodes:
            if n.op in ("placeholder", "output") or n not in live:
                continue
            if n.op == "get_attr":
                consts[n] = getattr(gm, n.target)
                if isinstance(consts[n], torch.Tensor):
                    self.attr_constants.append((n.target, consts[n]))
                continue
            if n.op != "call_function":
                raise _tessel.TesselError(f"unsupported FX node {n.op} '{n.name}' ({_source_of(n)})")
            ins = n.all_input_nodes
            if symbolic is not None and is_sym_node(n):
                args = pytree.tree_map(lambda a: (syms[a] if a in syms else tensor_value(a))
                                       if isinstance(a, torch.fx.Node) else a, n.args)
                try:
                    syms[n] = sym_value(n, args, lambda v: [size(x) for x in b.type(v)[1]])
                except Unsupported as e:
                    raise DynamicUnsupported(f"{_source_of(n)}: {e}") from None
                continue

            def known(a):
                return consts[a] if a in consts else syms[a]
            if all(i in consts or isinstance(syms.get(i), int) for i in ins) and n.target not in DATA_DEPENDENT \
                    and _deterministic(n.target):
                key = fold_key(n)
                if key is not None and key in folds:
                    consts[n] = folds[key]
                    continue
                args, kwargs = pytree.tree_map(lambda a: known(a) if isinstance(a, torch.fx.Node) else a, (n.args, n.kwargs))
                with torch.no_grad():
                    consts[n] = n.target(*args, **kwargs)
                if key is not None:
                    folds[key] = consts[n]
                continue
            if n.target is operator.getitem:
                src, idx = n.args
                if src in consts:
                    consts[n] = consts[src][idx]
                    continue
                val = env[src]
                if not isinstance(val, (list, tuple)):
                    raise _tessel.TesselError(f"getitem on a single value at '{n.name}' ({_source_of(n)})")
                env[n] = val[idx]
                continue
            # Tensor arguments become tessel value names; constants are added on first use.
            def arg(a):
                if isinstance(a, torch.fx.Node):
                    return syms[a] if a in syms else tensor_value(a)
                return a
            args, kwargs = pytree.tree_map(arg, (n.args, n.kwargs))
            name = _source_of(n)
            lower = _lowering(n.target)
            result = None
            reason = None
            if lower is not None:
                try:
                    result = lower(_Lowerer(b, name, self.masks, symbolic and symbolic.torch_names, symbolic), n,
                                   *args, **kwargs)
                except Unsupported as e:
                    reason = f"aten op {_op_name(n.target)}: {e}"
                except (_tessel.TesselError, TypeError, ValueError, IndexError) as e:
                    if symbolic is None or isinstance(e, DynamicUnsupported):
                        raise
                    # (a shape rule without symbolic sizes, a lowering that met a symbolic size it does not take)
                    msg = str(e).splitlines()[0] if str(e) else type(e).__name__
                    where = "" if name.split(" @ ")[0] in msg else f"{name}: "
                    raise DynamicUnsupported(f"{where}aten op {_op_name(n.target)}: {msg}") from None
            else:
                reason = f"unsupported aten op {_op_name(n.target)}: no tessel lowering"
            if result is None:
                result = self._fallback(n, name, args, kwargs, reason)
            else:
                self.lowered += 1
            env[n] = result

        outs, self.out_spec = pytree.tree_flatten(out_node.args[0])
        names = []
        self.out_literals = {}
        for i, o in enumerate(outs):
            if isinstance(o, torch.fx.Node) and o in syms:
                raise DynamicUnsupported(f"output {i} is a size ({syms[o]}), not a tensor")
            if isinstance(o, torch.fx.Node):
                v = tensor_value(o)
                if isinstance(v, (list, tuple)):
                    raise _tessel.TesselError(f"output {i} is a tuple value")
                names.append(v)
            else:
                self.out_literals[i] = o
        b.set_outputs(names)
        b.infer()

    def _fallback(self, n, name, args, kwargs, reason):
        """A TorchFallback node: the aten op runs in PyTorch eager on the tensors it gets."""
        if self.symbolic is not None:
            raise DynamicUnsupported(f"{reason} ({name}): a graph break has no symbolic form")
        metas = _meta_list(n)
        if metas is None:
            metas = _meta_of_items(n)
        if metas is None:
            raise _tessel.TesselError(f"{reason}, and its output types are unknown ({name})")
        tensor_args = []

        def collect(a):
            if isinstance(a, str) and self._is_value(a):
                tensor_args.append(a)
                return _Arg(len(tensor_args) - 1)
            return a
        template = pytree.tree_map(collect, (args, kwargs))
        dynamic = n.target in DATA_DEPENDENT or any(d < 0 for a in tensor_args for d in self.builder.type(a)[1])
        out_types = []
        for dt, shape in metas:
            out_types.append((tessel_dtype(dt, f"output of {name}"), [-1] * len(shape) if dynamic else shape))
        target = n.target
        single = hasattr(n.meta.get("tensor_meta"), "dtype") or isinstance(n.meta.get("val"), torch.Tensor)

        run = _fallback_call(target, template, single)
        outs = self.builder.fallback(name, _op_name(target), reason, tensor_args, out_types)
        self.fallbacks[name] = run
        return outs[0] if single else outs

    def _is_value(self, s):
        try:
            self.builder.type(s)
            return True
        except _tessel.TesselError:
            return False

    # ---- running breaks in PyTorch --------------------------------------------------------------
    def runner(self, node_name, op, inputs):
        ts = [None if a is None else from_buffer(a, d) for a, d in inputs]
        # (no torch.no_grad(): these tensors are over tessel's buffers and never require grad)
        fallback = self.fallbacks.get(node_name)
        if fallback is not None:
            outs = fallback(ts)
        else:
            if op == "NonZero":
                outs = [torch.nonzero(ts[0]).t().contiguous()]
            elif op == "Compress" and ts[1].dtype == torch.bool and ts[0].dim() == 1:
                outs = [torch.masked_select(ts[0], ts[1])]
            else:
                return None  # tessel's reference kernel runs it
        return [to_buffer(t) for t in outs]


def _fallback_call(target, template, single):
    """run(tensors) -> [tensors]: the aten op on the captured arguments with the break's inputs put in.
    Flat positional arguments (the usual case) are filled by position; anything nested by tree_map."""
    args, kwargs = template
    def nested(a):
        return isinstance(a, (list, tuple, dict)) and any(isinstance(b, _Arg) for b in pytree.tree_flatten(a)[0])
    flat = not any(isinstance(a, _Arg) for a in pytree.tree_flatten(kwargs)[0]) and not any(map(nested, args))
    if flat:
        base = list(args)
        places = [(i, a.index) for i, a in enumerate(args) if isinstance(a, _Arg)]

        def fill(tensors):
            a = base[:]
            for i, k in places:
                a[i] = tensors[k]
            return a, kwargs
    else:
        def fill(tensors):
            return pytree.tree_map(lambda a: tensors[a.index] if isinstance(a, _Arg) else a, template)

    def run(tensors):
        a, k = fill(tensors)
        r = target(*a, **k)
        return [r] if single else [x for x in r if isinstance(x, torch.Tensor)]
    return run


class _Arg:
    """The place of the i-th tensor argument in a TorchFallback node's captured arguments."""

    def __init__(self, index):
        self.index = index


_COPY_OF_VIEW = {}


def _lowering(target):
    """The aten table's lowering of `target`; functionalization's `X_copy` of a view op X (view_copy,
    slice_copy, t_copy, ...) is X: tessel values never alias, so the copy and the view are the same."""
    lower = LOWERINGS.get(target)
    if lower is not None or not isinstance(target, torch._ops.OpOverload):
        return lower
    if target not in _COPY_OF_VIEW:
        _COPY_OF_VIEW[target] = _view_of_copy(target)
    base = _COPY_OF_VIEW[target]
    return LOWERINGS.get(base) if base is not None else None


def _view_of_copy(target):
    name = target._schema.name.split("::")[-1]
    if not name.endswith("_copy"):
        return None
    packet = getattr(torch.ops.aten, name[:-len("_copy")], None)
    base = getattr(packet, target._overloadname, None) if packet is not None else None
    if base is None or not base._schema.returns or base._schema.returns[0].alias_info is None:
        return None        # not the copy of a view (_to_copy, lift_fresh_copy, ...)
    return base


def _deterministic(target):
    name = _op_name(target)
    return not any(s in name for s in ("rand", "uniform", "normal", "bernoulli", "dropout", "empty"))


def _op_name(target):
    if isinstance(target, torch._ops.OpOverload):
        return str(target)
    return getattr(target, "__name__", None) or str(target)
