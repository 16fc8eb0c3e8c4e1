"""Dynamic shapes for tessel.compile and torch.compile (issue 34; docs/python.md, "Dynamic shapes").

Which dims of a call's tensors are size symbols (`DynamicPlan`, from `dynamic=True` or `dynamic_dims`),
the symbolic trace that captures a module once for every size in the symbols' ranges (make_fx's
symbolic mode, with the dims tessel did not mark static), and the shape guards that trace leaves: each
decision the module's Python (or a PyTorch meta function) made about a symbolic size (`if t > 1:`, a
dim found equal to a weight's) is checked on every call, so a call whose sizes would take another
path recompiles instead of running a graph that does not describe it.
"""
import contextlib
import operator
import re

import torch

from . import _tessel
from ._frames import _PKG_DIR, _is_user_file, _user_frame
from ._sym import SymDim, Unsupported, from_sympy, sympy_expr

_DEFAULT_HI = 1 << 31


def torch_major():
    try:
        return int(torch.__version__.split(".")[0])
    except ValueError:
        return 0


class DynamicUnsupported(_tessel.TesselError):
    """A module (or a use of it) the symbolic capture or conversion cannot take: tessel.compile falls
    back to a static compilation per shape, with a warning giving this reason."""


class SymbolSpec:
    """One size symbol: its name and facts (every value in [lo, hi], a multiple of multiple_of). lo is 2 at
    least: PyTorch's traces assume a symbolic size is not 0 or 1 (a size 1 broadcasts; dynamo
    specialises both), so a call with a size 1 gets a compilation of its own."""

    __slots__ = ("name", "lo", "hi", "multiple_of")

    def __init__(self, name, lo=2, hi=_DEFAULT_HI, multiple_of=1):
        if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]{0,63}", name):
            raise _tessel.TesselError(f"dynamic_dims: {name!r} is not a size symbol name ([A-Za-z_][A-Za-z0-9_]*)")
        for what, v in (("lo", lo), ("hi", hi), ("multiple_of", multiple_of)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise _tessel.TesselError(f"dynamic_dims: symbol '{name}': {what} must be a positive int, not {v!r}")
        lo = max(lo, 2)
        if hi < lo:
            raise _tessel.TesselError(f"dynamic_dims: symbol '{name}': the range [{lo}, {hi}] is empty (sizes 0 and 1 "
                                      "are never symbolic)")
        if hi // multiple_of * multiple_of < lo:
            raise _tessel.TesselError(f"dynamic_dims: symbol '{name}': no multiple of {multiple_of} lies in [{lo}, {hi}]")
        self.name, self.lo, self.hi, self.multiple_of = name, lo, hi, multiple_of

    def facts(self):
        return (self.lo, self.hi, self.multiple_of)

    def holds(self, v):
        return self.lo <= v <= self.hi and v % self.multiple_of == 0

    def __str__(self):
        s = f"{self.name} in [{self.lo}, {self.hi}]"
        return s + (f" multiple_of {self.multiple_of}" if self.multiple_of != 1 else "")

    __repr__ = __str__


class DynamicPlan:
    """Which dims of a call's tensors are size symbols: `dims[k]` maps tensor k's (the call's tensors in
    order: positional, then keyword arguments by name) dims to SymbolSpecs; one name in two places is
    one symbol."""

    def __init__(self, dims):
        self.dims = {k: dict(v) for k, v in dims.items() if v}
        self.symbols = {}
        for spec in (s for d in self.dims.values() for s in d.values()):
            known = self.symbols.get(spec.name)
            if known is not None and known.facts() != spec.facts():
                raise _tessel.TesselError(f"dynamic_dims: symbol '{spec.name}' is declared with two ranges "
                                          f"({known} and {spec})")
            self.symbols[spec.name] = spec

    def __bool__(self):
        return bool(self.dims)

    def merged(self, keep, drop):
        """The plan with symbol `drop`'s dims named `keep` (the graph needs them equal)."""
        spec = self.symbols[keep]
        return DynamicPlan({k: {d: spec if s.name == drop else s for d, s in dd.items()} for k, dd in self.dims.items()})

    def value_of(self, name, tensors):
        """The size symbol `name` has in a call of these tensors (its first dim), or None."""
        for k, dd in self.dims.items():
            for d, s in dd.items():
                if s.name == name and k < len(tensors) and isinstance(tensors[k], torch.Tensor):
                    return tensors[k].shape[d]
        return None

    def without(self, names):
        """The plan with the dims of these symbols static; None when no dim stays dynamic."""
        plan = DynamicPlan({k: {d: s for d, s in dd.items() if s.name not in names} for k, dd in self.dims.items()})
        return plan if plan else None

    def restricted(self, tensors):
        """The plan for a compilation whose example call is `tensors` (a recompile): a dim whose size there
        is below 2 or outside its symbol's range is static, and so is every dim of a symbol whose dims
        differ there. None when no dim stays dynamic."""
        sizes, dims = {}, {}
        for k, dd in self.dims.items():
            t = tensors[k] if k < len(tensors) else None
            if not isinstance(t, torch.Tensor):
                continue
            keep = {d: s for d, s in dd.items() if d < t.dim() and s.holds(t.shape[d])}
            for d, s in keep.items():
                sizes.setdefault(s.name, set()).add(t.shape[d])
            dims[k] = keep
        torn = {n for n, v in sizes.items() if len(v) > 1}
        dims = {k: {d: s for d, s in dd.items() if s.name not in torn} for k, dd in dims.items()}
        plan = DynamicPlan(dims)
        return plan if plan else None


def _spec_of(value, auto_name, where):
    """A SymbolSpec from a dynamic_dims entry: None/True (an automatic name), a name, or (name, lo, hi[,
    multiple_of])."""
    if value is None or value is True:
        return SymbolSpec(auto_name())
    if isinstance(value, str):
        return SymbolSpec(value)
    if isinstance(value, tuple) and 1 <= len(value) <= 4:
        name = value[0] if value[0] is not None else auto_name()
        return SymbolSpec(name, *value[1:])
    raise _tessel.TesselError(f"dynamic_dims {where}: {value!r} is not a symbol name, None or (name, lo, hi[, multiple_of])")


def make_plan(dynamic, dynamic_dims, tensors, positions):
    """The DynamicPlan of tessel.compile's `dynamic` / `dynamic_dims` for the example call's tensors.
    `positions` maps what dynamic_dims may name (an input index, a keyword argument's name) to the
    tensor's place among the call's tensors. None when nothing is dynamic."""
    if dynamic_dims is None and not dynamic:
        return None
    named = set()           # the names dynamic_dims gives: automatic ones keep clear of them
    for spec in (dynamic_dims or {}).values():
        for v in (spec.values() if isinstance(spec, dict) else ()):
            named.add(v if isinstance(v, str) else v[0] if isinstance(v, tuple) and v else None)
    count = iter(range(1 << 30))

    def auto_name():
        name = f"s{next(count)}"
        return name if name not in named else auto_name()
    dims = {}
    if dynamic_dims is None:
        # dynamic=True: every dim of every tensor, except a dim of size 0 or 1 in the example (a size-1 dim
        # broadcasts, so PyTorch specialises it too) -- and of a 0-d tensor, which has none.
        for k, t in enumerate(tensors):
            dims[k] = {d: SymbolSpec(auto_name()) for d, n in enumerate(t.shape) if n >= 2}
        return DynamicPlan(dims)
    if not isinstance(dynamic_dims, dict):
        raise _tessel.TesselError("dynamic_dims must be a dict {input: [dims] or {dim: name or (name, lo, hi)}}")
    for key, spec in dynamic_dims.items():
        if key not in positions:
            raise _tessel.TesselError(f"dynamic_dims names input {key!r}, which is not a tensor argument of the call "
                                      f"(tensor arguments: {sorted(positions, key=str)})")
        k = positions[key]
        t = tensors[k]
        entries = {d: None for d in spec} if isinstance(spec, (list, tuple)) else spec
        if not isinstance(entries, dict):
            raise _tessel.TesselError(f"dynamic_dims[{key!r}] must be a list of dims or a dict {{dim: name}}")
        out = dims.setdefault(k, {})
        for d, v in entries.items():
            if isinstance(d, bool) or not isinstance(d, int) or not -t.dim() <= d < t.dim():
                raise _tessel.TesselError(f"dynamic_dims[{key!r}]: {d!r} is not a dim of a rank-{t.dim()} tensor")
            d = d % t.dim()
            s = _spec_of(v, auto_name, f"[{key!r}][{d}]")
            n = t.shape[d]
            if n < 2:
                raise _tessel.TesselError(f"dynamic_dims: input {key!r} dim {d} is {n} in the example; a dynamic dim needs "
                                          "an example size of at least 2 (a size 1 broadcasts: PyTorch specialises it)")
            if not s.holds(n):
                raise _tessel.TesselError(f"dynamic_dims: input {key!r} dim {d} is {n} in the example, outside {s}")
            out[d] = s
    sizes = {}
    for k, dd in dims.items():
        for d, s in dd.items():
            first = sizes.setdefault(s.name, (k, d, tensors[k].shape[d]))
            if first[2] != tensors[k].shape[d]:
                raise _tessel.TesselError(f"dynamic_dims: symbol '{s.name}' names dims of different sizes in the example "
                                          f"(tensor {first[0]} dim {first[1]} is {first[2]}, tensor {k} dim {d} is "
                                          f"{tensors[k].shape[d]})")
    return DynamicPlan(dims)


# ---- guards ---------------------------------------------------------------------------------------
def _guard_functions():
    import sympy
    funcs = {"FloorDiv": lambda a, b: a // b, "Mod": lambda a, b: a % b, "floor": lambda a: a // 1,
             "Ceil": lambda a: -((-a) // 1), "ceiling": lambda a: -((-a) // 1)}
    return funcs, sympy


class ShapeGuard:
    """One decision the trace made about symbolic sizes: `expr` (sympy, over tessel's symbol names)
    evaluated to `expected` for the example."""

    __slots__ = ("text", "expected", "where", "fn", "symbols")

    def __init__(self, expr, expected, where):
        funcs, sympy = _guard_functions()
        self.symbols = sorted(s.name for s in expr.free_symbols)
        self.text = str(expr)
        self.expected = expected
        self.where = where
        self.fn = sympy.lambdify([sympy.Symbol(s) for s in self.symbols], expr, modules=[funcs, "math"])

    def holds(self, bindings):
        try:
            got = self.fn(*(bindings[s] for s in self.symbols))
        except (ArithmeticError, ValueError, KeyError):     # (KeyError: a symbol no input dim binds)
            return False
        return (bool(got) if isinstance(self.expected, bool) else got) == self.expected

    def describe(self, bindings):
        at = f" at {self.where}" if self.where else ""
        values = ", ".join(f"{s}={bindings.get(s, '?')}" for s in self.symbols)
        return f"shape guard {self.text} was {self.expected} at capture{at}, not for {values}"

    def as_dict(self):
        return dict(guard=self.text, expected=self.expected, location=self.where)


class Symbolic:
    """What a symbolic capture gives the converter and the call: each graph input's dims (ints and
    size expressions over the symbols that remain after the trace's own specialisations), the
    symbols' facts and the shape guards."""

    def __init__(self, input_dims, symbols, guards, specialised, torch_names=None):
        self.input_dims = input_dims      # placeholder position -> [int | SymDim]
        self.torch_names = torch_names or {}  # the trace's symbol names -> the graph's (torch 2 names its own)
        self.symbols = symbols            # name -> SymbolSpec (the ones the graph still names)
        self.guards = guards              # [ShapeGuard]
        self.specialised = specialised    # ["tensor 0 dim 1 (s1) is 64: ..."]

    def declare(self, builder):
        for s in self.symbols.values():
            builder.declare_symbol(s.name, *s.facts())


# ---- symbolic tracing -----------------------------------------------------------------------------
def _stack_location(stack):
    """Where a guard was decided, from a formatted stack: the innermost user frame ('file.py:LINE
    `code`'), and the torch function that decided it when that is not the user's code."""
    frames = [(f, int(line), fn) for f, line, fn in re.findall(r'File "([^"]+)", line (\d+), in (\S+)', stack or "")
              if not f.startswith(_PKG_DIR)]
    user = _user_frame([(f, line) for f, line, _ in reversed(frames)])
    if frames and not _is_user_file(frames[-1][0]):
        f, line, fn = frames[-1]
        inner = f"{f.split('/torch/')[-1]}:{line} {fn}"
        return f"{user} (in torch: {inner})" if user else f"in torch: {inner}"
    return user


@contextlib.contextmanager
def _py_kernels(table):
    """Installs Python kernels for composite ops whose C++ decomposition reads static sizes (torch 1.13:
    `Cannot call sizes() on tensor with symbolic sizes`): PyTorch runs them under the Python dispatcher
    that symbolic tracing enables, and nowhere else. Removed afterwards."""
    key = torch._C.DispatchKey.CompositeImplicitAutograd
    added = []

    def changed(op):
        cache = getattr(op, "_dispatch_cache", None)      # torch 2 caches each key's kernel per op
        if cache is not None:
            cache.clear()
    for op, fn in table.items():
        if op is not None and key not in op.py_kernels:
            op.py_kernels[key] = fn
            changed(op)
            added.append(op)
    try:
        yield
    finally:
        for op in added:
            op.py_kernels.pop(key, None)
            changed(op)


def _linear(x, w, b=None):
    y = torch.matmul(x, w.t())
    return y if b is None else y + b


def _narrow(x, dim, start, length):
    return torch.ops.aten.slice.Tensor(x, dim, start, start + length)


def _ov(packet, name):
    p = getattr(torch.ops.aten, packet, None)
    return getattr(p, name, None) if p is not None else None


def _native_mha(q, k, v, embed_dim, num_heads, qkv_w, qkv_b, proj_w, proj_b, mask=None, need_weights=True,
                average_attn_weights=True, mask_type=None):
    """nn.MultiheadAttention's fast path ([B, T, E], batch first) in ops that trace over symbolic sizes: the
    aten table's lowering of the op (_native_mha there), written in torch."""
    import math
    b, t, s, h = q.shape[0], q.shape[1], k.shape[1], num_heads
    hd = embed_dim // h
    wq, wk, wv = qkv_w.split(embed_dim)
    bq, bk, bv = qkv_b.split(embed_dim) if qkv_b is not None else (None, None, None)

    def project(x, w, bias, n):
        return torch.nn.functional.linear(x, w, bias).view(b, n, h, hd).transpose(1, 2)
    scores = (project(q, wq, bq, t) @ project(k, wk, bk, s).transpose(-2, -1)) * (1.0 / math.sqrt(hd))
    if mask is not None:
        if mask.dtype != torch.bool:
            raise NotImplementedError("a float attention mask in the fused multi-head attention")
        scores = scores.masked_fill(mask.view(b, 1, 1, s) if mask_type == 1 else mask, float("-inf"))
    attn = scores.softmax(-1)
    o = (attn @ project(v, wv, bv, s)).transpose(1, 2).reshape(b, t, embed_dim)
    o = torch.nn.functional.linear(o, proj_w, proj_b)
    weights = (attn.mean(1) if average_attn_weights else attn) if need_weights else o.new_empty(0)
    return o, weights


def _encoder_layer(x, embed_dim, num_heads, qkv_w, qkv_b, proj_w, proj_b, use_gelu, norm_first, eps, ln1_w, ln1_b,
                   ln2_w, ln2_b, fc1_w, fc1_b, fc2_w, fc2_b, mask=None, mask_type=None):
    """nn.TransformerEncoderLayer's fast path (eval, batch first), as the aten table lowers it."""
    F = torch.nn.functional

    def attend(v):
        return _native_mha(v, v, v, embed_dim, num_heads, qkv_w, qkv_b, proj_w, proj_b, mask, False, True, mask_type)[0]

    def mlp(v):
        hidden = F.linear(v, fc1_w, fc1_b)
        return F.linear(F.gelu(hidden) if use_gelu else F.relu(hidden), fc2_w, fc2_b)

    def ln(v, w, bias):
        return F.layer_norm(v, (embed_dim,), w, bias, eps)
    if norm_first:
        x = x + attend(ln(x, ln1_w, ln1_b))
        return x + mlp(ln(x, ln2_w, ln2_b))
    x = ln(x + attend(x), ln1_w, ln1_b)
    return ln(x + mlp(x), ln2_w, ln2_b)


# (the fused attention ops have no symbolic meta function in 1.13: their Python forms trace instead)
_COMPOSITES_113 = {_ov("linear", "default"): _linear, _ov("narrow", "default"): _narrow,
                   _ov("_native_multi_head_attention", "default"): _native_mha,
                   _ov("_transformer_encoder_layer_fwd", "default"): _encoder_layer}


class _LinearInPython(torch.overrides.TorchFunctionMode if hasattr(torch.overrides, "TorchFunctionMode") else object):
    """torch 2: F.linear as matmul and add while tracing. Its C++ kernel reads a 3-d input's sizes() (the
    fused flatten), which under the Python dispatcher is aten.size and ties every dim to its example size;
    the C++ dispatch comes before any Python kernel, so the call is replaced where Python makes it."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.nn.functional.linear or func is getattr(torch._C._nn, "linear", None):
            return _linear(args[0], kwargs.get("weight", args[1] if len(args) > 1 else None),
                           args[2] if len(args) > 2 else kwargs.get("bias"))
        return func(*args, **kwargs)


class _Trace113:
    """torch 1.13: make_fx(tracing_mode="symbolic") with a ShapeEnv that gives the plan's dims their
    symbols and every other dim its number (1.13 would make every dim of every tensor a symbol, and
    give dims of equal sizes one symbol), and that records `bool(size)` as `size != 0` (1.13 records
    the size's value, a guard that only the example's size passes). Like 1.13, it decides what holds
    for every size >= 2 without a guard (SymbolSpec's ranges start at 2). No functionalization (1.13's
    functorch cannot functionalize symbolic tensors): in-place ops are made out-of-place where that is
    safe (_inplace_to_functional)."""

    def __init__(self, plan_by_arg, shapes):
        self.plan = plan_by_arg          # flat arg position -> {dim: SymbolSpec}
        self.shapes = shapes             # flat arg position -> example shape
        self.env = None

    @contextlib.contextmanager
    def active(self):
        from torch.fx.experimental import proxy_tensor, symbolic_shapes
        import sympy
        tracer = self
        base = symbolic_shapes.ShapeEnv

        class PlannedShapeEnv(base):
            def __init__(self):
                super().__init__()
                tracer.env = self
                self.tessel_sizes = {}       # arg -> [size per dim]
                self.tessel_symbols = {}     # name -> SymIntNode

            def create_symint(self, name, val):
                m = re.fullmatch(r"t(\d+)\.(size|stride|storage_offset)\((\d*)\)", name)
                if m is None:
                    raise DynamicUnsupported(f"symbolic capture: unexpected size '{name}'")
                k, kind = int(m.group(1)), m.group(2)
                shape = tracer.shapes.get(k)
                if shape is None:
                    raise DynamicUnsupported(f"symbolic capture: a tensor other than the inputs ({name}) got symbolic sizes")
                sizes = self.tessel_sizes.setdefault(k, [])
                if kind == "storage_offset":
                    return val
                if kind == "size":
                    d = int(m.group(3))
                    if d != len(sizes) or d >= len(shape) or shape[d] != val:
                        raise DynamicUnsupported(f"symbolic capture lost track of the inputs at {name} = {val}")
                    spec = tracer.plan.get(k, {}).get(d)
                    sizes.append(self._symbol(spec, val) if spec is not None else val)
                    return sizes[-1]
                d = int(m.group(3))
                if len(sizes) != len(shape):
                    raise DynamicUnsupported(f"symbolic capture: {name} before the sizes")
                stride = 1
                for s in sizes[d + 1:]:
                    stride = stride * s
                hint = 1
                for s in shape[d + 1:]:
                    hint *= s
                if hint != val:
                    raise DynamicUnsupported(f"symbolic capture: input {k} is not contiguous")
                return stride

            def _symbol(self, spec, val):
                node = self.tessel_symbols.get(spec.name)
                if node is not None:
                    if self.var_to_val[node.get_pyobj().expr] != val:
                        raise DynamicUnsupported(f"symbolic capture: symbol '{spec.name}' met two sizes")
                    return node
                expr = sympy.Symbol(spec.name, positive=True, integer=True)
                self.var_to_val[expr] = sympy.Integer(val)
                node = torch.SymIntNode.new_symint(symbolic_shapes.PySymInt(expr, self))
                self.tessel_symbols[spec.name] = node
                return node

        def sym_bool(self):
            # bool(size) asks whether it is non-zero (1.13 guards on the size's value itself)
            e = self.shape_env.replace(self.expr)
            if isinstance(e, sympy.Expr):
                e = sympy.Ne(e, 0)
            return bool(self.shape_env.evaluate_expr(e))

        saved_bool = symbolic_shapes.PySymInt.__bool__
        proxy_tensor.ShapeEnv = PlannedShapeEnv
        symbolic_shapes.PySymInt.__bool__ = sym_bool
        try:
            with _py_kernels(_COMPOSITES_113):
                yield
        finally:
            proxy_tensor.ShapeEnv = base
            symbolic_shapes.PySymInt.__bool__ = saved_bool

    def make_fx(self, fn, args):
        from torch.fx.experimental.proxy_tensor import make_fx
        with self.active():
            gm = make_fx(fn, tracing_mode="symbolic")(*args)
        _inplace_to_functional(gm)
        return gm

    def resolve(self, k, d):
        """The size tensor k's dim d has after the trace (a replacement may have made it a number)."""
        v = self.env.tessel_sizes[k][d] if self.env is not None and k in self.env.tessel_sizes else self.shapes[k][d]
        return v if isinstance(v, int) else from_sympy(self.env.replace(v.get_pyobj().expr))

    def guards(self):
        import sympy
        env = self.env
        out = []
        for expr, value, stack in env.guards:
            if env._maybe_evaluate_static(expr) is not None:
                continue
            e = env.simplify(expr)
            if e.is_Relational or isinstance(e, (sympy.logic.boolalg.BooleanFunction,)):
                expected = bool(value)
            else:
                expected = int(value)
            out.append(ShapeGuard(e, expected, _stack_location(stack)))
        return out


class _Trace2:
    """torch >= 2: fake inputs made by a ShapeEnv of our own (no duck shaping), the plan's dims dynamic
    and every other dim static, then make_fx over them with functionalization. Symbols are renamed to
    the plan's names; torch 2 assumes sizes >= 2 for dynamic dims, so the symbols' ranges start at 2 at
    least (a call with a size 1 recompiles)."""

    def __init__(self, plan_by_arg, shapes):
        self.plan = plan_by_arg
        self.shapes = shapes
        self.env = None
        self.fakes = None
        self.names = {}     # torch's symbol name -> tessel's

    def make_fx(self, fn, args):
        from torch.fx.experimental.proxy_tensor import make_fx
        from torch.fx.experimental.symbolic_shapes import DimDynamic, ShapeEnv, StatelessSymbolicContext
        from torch._subclasses.fake_tensor import FakeTensorMode
        from torch._dynamo.source import ConstantSource
        try:
            from torch._dispatch.python import enable_python_dispatcher
        except ImportError:  # pragma: no cover
            enable_python_dispatcher = contextlib.nullcontext
        try:
            self.env = ShapeEnv(duck_shape=False)
        except TypeError:  # pragma: no cover -- (DYNAMIC below allocates a fresh symbol per dim anyway)
            self.env = ShapeEnv()
        mode = FakeTensorMode(shape_env=self.env, allow_non_fake_inputs=False)
        fakes = []
        for k, a in enumerate(args):
            if not isinstance(a, torch.Tensor):
                fakes.append(a)
                continue
            dyn = self.plan.get(k, {})
            ctx = StatelessSymbolicContext(dynamic_sizes=[DimDynamic.DYNAMIC if d in dyn else DimDynamic.STATIC
                                                          for d in range(a.dim())])
            f = mode.from_tensor(a, source=ConstantSource(f"tessel_arg{k}"), symbolic_context=ctx)
            for d, spec in dyn.items():
                expr = sympy_expr(f.shape[d])
                name = getattr(expr, "name", None)
                if name is None:
                    raise DynamicUnsupported(f"symbolic capture: tensor {k} dim {d} did not get a symbol")
                self.names[name] = spec.name
                self._constrain(expr, spec)
            fakes.append(f)
        self.fakes = fakes
        # tracing_mode="real" takes the fake inputs as they are ("fake" and "symbolic" would fakeify them
        # again, with fresh symbols): the ambient fake mode runs the ops, the Python dispatcher lets
        # composite ops decompose over symbolic sizes
        with mode, enable_python_dispatcher(), _mha_fastpath_off(), _LinearInPython(), _compiling():
            return make_fx(fn)(*fakes)

    def _constrain(self, expr, spec):
        lo = max(spec.lo, 2)
        try:
            self.env.constrain_symbol_range(expr, compiler_min=lo, compiler_max=spec.hi)
        except Exception:  # noqa: BLE001 -- older torch 2: the range stays torch's default [2, inf]
            pass

    def tied_at(self, name):
        """Where the trace tied tessel's symbol `name` to a number (the guard that did), or ''."""
        torch_names = [t for t, n in self.names.items() if n == name]
        for g in self.env.guards:
            if {s.name for s in g.expr.free_symbols} & set(torch_names) and getattr(g.expr, "is_Relational", False):
                stack = getattr(g, "stack", None)
                if stack is not None and hasattr(stack, "format"):
                    return _stack_location("".join(stack.format()))
                return str(getattr(g, "sloc", "") or "")
        return ""

    def resolve(self, k, d):
        v = self.fakes[k].shape[d]
        return v if isinstance(v, int) else from_sympy(sympy_expr(v), self.names)

    def guards(self):
        import sympy
        out = []
        for g in self.env.guards:
            # with the trace's replacements: a guard that tied a symbol to a number (`Eq(s1, 64)`, a
            # Linear's input dim) is then true, and the static dim it left is checked as every static dim is
            e = g.expr
            try:
                e = self.env.simplify(e)
            except Exception:  # noqa: BLE001 -- an expression simplify cannot take is kept as it is
                pass
            if e is sympy.true or e == sympy.true:
                continue
            e = e.xreplace({s: sympy.Symbol(self.names.get(s.name, s.name), positive=True, integer=True)
                            for s in e.free_symbols})
            stack = getattr(g, "stack", None)       # torch 2.0-2.3: a CapturedTraceback; later: sloc (SLoc)
            if stack is not None and hasattr(stack, "format"):
                where = _stack_location("".join(stack.format()))
            else:
                where = str(getattr(g, "sloc", "") or "")
            out.append(ShapeGuard(e, True, where))
        return out


@contextlib.contextmanager
def _mha_fastpath_off():
    """torch >= 2.1: nn.MultiheadAttention and TransformerEncoderLayer take their composite path (the fused
    ops have no symbolic meta functions)."""
    mha = getattr(torch.backends, "mha", None)
    get, put = getattr(mha, "get_fastpath_enabled", None), getattr(mha, "set_fastpath_enabled", None)
    if get is None or put is None:
        yield
        return
    was = get()
    put(False)
    try:
        yield
    finally:
        put(was)


@contextlib.contextmanager
def _compiling():
    """torch >= 2: `torch.compiler.is_compiling()` is True while tessel traces symbolically. Libraries ask it
    to leave out what a compiler's trace cannot take: transformers' mask code checks the padding mask's
    values (`padding_mask.all()`, packed sequences in the position ids) only when it is False, a branch on
    data that would end the symbolic capture."""
    compiler = getattr(torch, "compiler", None)
    was = getattr(compiler, "is_compiling", None)
    if was is None:
        yield
        return
    compiler.is_compiling = lambda: True
    try:
        yield
    finally:
        compiler.is_compiling = was


def tracer(plan_by_arg, shapes):
    return (_Trace2 if torch_major() >= 2 else _Trace113)(plan_by_arg, shapes)


# ---- in-place ops without functionalization (torch 1.13) ----------------------------------------------
def _is_view(n):
    t = n.target
    if not isinstance(t, torch._ops.OpOverload):
        return n.target is operator.getitem and _is_view(n.args[0]) if n.op == "call_function" else False
    returns = t._schema.returns
    return bool(returns) and returns[0].alias_info is not None and not returns[0].alias_info.is_write


def _inplace_to_functional(gm):
    """Makes each in-place op (`relu_`, `add_`, `hardtanh_`) of a graph traced without functionalization
    its out-of-place form, where that changes no answer: the tensor it writes is a fresh result (not
    an input, parameter or buffer, not a view) that no view shares. make_fx already points later uses
    at the in-place node. Any other mutation is DynamicUnsupported."""
    graph = gm.graph
    for n in graph.nodes:
        t = n.target
        if n.op != "call_function" or not isinstance(t, torch._ops.OpOverload) or not t._schema.is_mutable:
            continue
        name = t._schema.name.split("::")[-1]
        args = t._schema.arguments
        writes = [a for a in args if a.alias_info is not None and a.alias_info.is_write]
        base = getattr(torch.ops.aten, name[:-1], None) if name.endswith("_") else None
        functional = getattr(base, t._overloadname, None) if base is not None else None
        target = n.args[0] if n.args else None
        why = None
        if functional is None or len(writes) != 1 or writes[0] is not args[0]:
            why = "has no out-of-place form"
        elif not isinstance(target, torch.fx.Node) or target.op != "call_function":
            why = "writes an input, parameter or buffer"
        elif _is_view(target) or any(u is not n and _is_view(u) for u in target.users):
            why = "writes a tensor a view shares"
        if why is not None:
            raise DynamicUnsupported(f"in-place {t} {why} ({n.meta.get('tessel_source', '') or n.name}); "
                                     "the symbolic capture of torch 1.13 cannot functionalize it")
        n.target = functional
    graph.lint()
    gm.recompile()


# ---- SymInt nodes in the converter --------------------------------------------------------------------
def _sym_ops():
    aten = torch.ops.aten
    ops = {}
    for packet in ("sym_size", "sym_stride", "sym_numel", "sym_storage_offset"):
        p = getattr(aten, packet, None)
        if p is None:
            continue
        ops[p] = packet
        for o in p.overloads():
            ops[getattr(p, o)] = packet
    return ops


SYM_QUERIES = _sym_ops()
SYM_ARITH = {operator.add, operator.sub, operator.mul, operator.floordiv, operator.mod, operator.neg,
             operator.pos, operator.truediv}
for _f in ("sym_float", "sym_int", "sym_max", "sym_min", "sym_sum"):
    if hasattr(torch, _f):
        SYM_ARITH.add(getattr(torch, _f))
try:
    from torch.fx.experimental.symbolic_shapes import sym_float as _sym_float113
    SYM_ARITH.add(_sym_float113)
except ImportError:  # pragma: no cover
    pass


def is_sym_node(n):
    """Whether an FX node computes a size (torch's SymInt) rather than a tensor."""
    if n.op != "call_function":
        return False
    if n.target in SYM_QUERIES:
        return True
    if n.target in SYM_ARITH:
        val = n.meta.get("val")
        return not isinstance(val, torch.Tensor)
    return False


def sym_value(n, args, shape_of):
    """The size an FX SymInt node computes: `shape_of(value)` gives a tessel value's dims."""
    kind = SYM_QUERIES.get(n.target)
    if kind == "sym_size":
        x, d = args[0], args[1]
        dims = shape_of(x)
        return dims[d]
    if kind == "sym_numel":
        p = 1
        for s in shape_of(args[0]):
            p = p * s
        return p
    if kind is not None:
        # strides and offsets: the trace's own value (a view's strides are not the contiguous ones)
        val = n.meta.get("val")
        if val is None:
            raise Unsupported(f"{kind} without a traced value")
        from ._sym import from_torch
        return from_torch(val, None)
    name = getattr(n.target, "__name__", str(n.target))
    if name in ("sym_float",):
        v = args[0]
        if isinstance(v, SymDim):
            raise Unsupported(f"size {v} as a float (sym_float)")
        return float(v)
    if name == "sym_int":
        return args[0] if isinstance(args[0], (int, SymDim)) else int(args[0])
    if name == "sym_sum":           # (torch >= 2.4: a sum of sizes, `torch.sym_sum([a, b, c])`)
        total = 0
        for a in args[0]:
            total = a + total if isinstance(a, SymDim) else total + a
        return total
    if name in ("sym_max", "sym_min"):
        a, b = args
        return (max if name == "sym_max" else min)(a, b)
    if n.target is operator.truediv and any(isinstance(a, SymDim) for a in args):
        raise Unsupported(f"size {args[0]} / {args[1]} as a float")
    return n.target(*args)
