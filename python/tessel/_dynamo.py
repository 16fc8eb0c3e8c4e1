"""`torch.compile(model, backend="tessel")` on torch >= 2.0: dynamo hands each captured FX graph (and
example inputs) to this backend, which compiles it with tessel.compile on its first call -- the
parameters and buffers dynamo passes as inputs frozen as constants, guarded. A graph called with grad
mode on and inputs that require grad (a module in training: dynamo lifts its parameters to inputs) is
compiled for training instead (tessel.compile(..., train=True)): tessel's forward and backward run
inside a torch.autograd.Function, so loss.backward() fills the parameters' .grad as PyTorch would
(docs/training.md, "torch.compile"). A graph with symbolic sizes (dynamo's dynamic shapes: a dim marked
dynamic, seen with two sizes, or dynamic=True) is compiled once symbolically: its size symbols become
tessel's, its SymInt inputs are computed from the tensor dims that carry them (and checked against
them on every call). Graphs tessel cannot take (other non-tensor inputs, capture failures,
unsupported dtypes) run as dynamo gave them, with a warning."""
import re
import warnings

import torch

from . import _tessel
from ._frames import node_source
from ._compile import CompiledModule, TesselRecompileLimit
from ._sym import Unsupported, sympy_expr
from ._train import TrainModule

# Options for the backend, set with tessel.dynamo_options.update(threads=2, backend="graph", ...). target None:
# 'cuda' for graphs whose inputs are CUDA tensors, else 'cpu'; a dataflow chip ('spyre', 'tpu-v5e', a hardware file)
# runs each graph on the functional simulator; precision: 'f32' or 'bf16' on CUDA, a chip's storage dtype (None: f32
# on cpu and cuda, the chip's own on a dataflow target).
dynamo_options = dict(backend="compiled", threads=None, repair=False, cache_limit=8, on_limit="raise", target=None,
                      precision=None)

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
    inputs may be fake tensors, and the parameters to freeze are the ones the call passes). `sizes`
    (a _Sizes) when the graph has symbolic sizes."""

    def __init__(self, gm, sizes=None, options=None):
        self.gm = gm
        self.sizes = sizes
        self.own = dict(options or {})            # torch.compile's options={...} for this graph
        self.seen = dict(dynamo_options)          # tessel.dynamo_options when compiled
        self.options = {**self.seen, **self.own}
        self.compiled = None

    def __call__(self, *args):
        if self.seen != dynamo_options:
            # tessel.dynamo_options changed since this graph compiled (precision, target, ...): dynamo keeps
            # its graphs, so the next call compiles again with the new options instead of reusing the old
            # compilation silently (issue 41)
            self.seen = dict(dynamo_options)
            self.options = {**self.seen, **self.own}
            self.compiled = None
        if self.compiled is None:
            self.compiled = self._compile(args)
        return self.compiled(*args)

    def _compile(self, args):
        if self.sizes is not None:
            return self._compile_dynamic(args)
        try:
            if torch.is_grad_enabled() and any(t.requires_grad for t in args):
                # Training: the inputs that require grad (the parameters) are differentiated, not frozen.
                o = self.options
                if any(t.is_cuda for t in args):
                    raise _tessel.TesselError("training on CUDA tensors is not supported by tessel (inference only: "
                                              "call the model under torch.no_grad())")
                compiled = TrainModule(self.gm, args, backend=o["backend"], threads=o["threads"],
                                       cache_limit=o["cache_limit"])
            else:
                compiled = CompiledModule(_Located(self.gm), args, freeze_inputs=_state_inputs(self.gm, args),
                                          **self.options)
        except _tessel.TesselError as e:
            return _fallback(self.gm, f"could not compile a graph ({e})")
        dynamo_graphs.append(compiled)
        return compiled

    def _compile_dynamic(self, args):
        sizes = self.sizes
        tensors = [args[i] for i in sizes.tensors]
        if torch.is_grad_enabled() and any(t.requires_grad for t in tensors):
            return _fallback(self.gm, "a training graph with symbolic sizes (tessel trains static shapes)")
        frozen = set(_state_inputs(self.gm, args))
        module = _TensorsOnly(self.gm, sizes)
        o = dict(self.options)
        try:
            compiled = CompiledModule(module, tensors, freeze_inputs=[k for k, i in enumerate(sizes.tensors) if i in frozen],
                                      dynamic_dims=sizes.dims_of(frozen), **o)
        except _tessel.TesselError as e:
            return _fallback(self.gm, f"could not compile a graph with symbolic sizes ({e})")
        dynamo_graphs.append(compiled)
        return _SizedCall(compiled, self.gm, sizes)


class _Sizes:
    """The symbolic sizes of a dynamo graph: `dims[i]` maps tensor input i's (placeholder position) dims
    to their symbols' names; `ints[i]` is the sympy expression of SymInt input i, computed from the
    tensor dims `where` names for each symbol."""

    def __init__(self, n, tensors, dims, ints, where, outputs=None):
        self.n, self.tensors, self.dims, self.ints, self.where = n, tensors, dims, ints, where
        self.position = {p: k for k, p in enumerate(tensors)}     # placeholder -> index among the tensors
        self.size_of = [(p, _evaluator(expr)) for p, expr in ints.items()]  # each SymInt input's function of env
        # each SymInt the graph returns (a length transformers' static cache returns beside its tensors), by
        # output position, ascending: left out of what tessel compiles and computed from the call's sizes
        self.outputs = [(i, _evaluator(expr)) for i, expr in sorted((outputs or {}).items())]

    def dims_of(self, frozen):
        """dynamic_dims for tessel.compile over the graph's tensors (frozen parameters stay static)."""
        return {self.position[p]: dict(dd) for p, dd in self.dims.items() if p not in frozen}

    def values(self, tensors):
        """{symbol: size} from the tensors (their dims that carry each symbol)."""
        return {name: tensors[self.position[p]].shape[d] for name, (p, d) in self.where.items()}

    def args(self, tensors):
        """The graph's arguments: the tensors, and each SymInt input computed from their dims."""
        env = self.values(tensors)
        args = [None] * self.n
        for k, p in enumerate(self.tensors):
            args[p] = tensors[k]
        for p, size in self.size_of:
            args[p] = size(env)
        return args


def _evaluator(expr):
    """`expr` (a sympy size expression) as a function of env ({symbol name: value}: ints, or torch SymInts
    while traced): the expression is
    walked once, so a call (every decoded token checks its SymInt inputs) costs a few closure calls, not
    sympy's type tests."""
    import sympy
    if expr.is_Integer:
        value = int(expr)
        return lambda env: value
    if expr.is_Symbol:
        name = expr.name
        return lambda env: env[name]
    parts = [_evaluator(a) for a in expr.args]

    def fold(op):
        def run(env):
            out = parts[0](env)
            for f in parts[1:]:
                out = op(out, f(env))
            return out
        return run
    if isinstance(expr, sympy.Add):
        return fold(lambda x, y: x + y)
    if isinstance(expr, sympy.Mul):
        return fold(lambda x, y: x * y)
    if isinstance(expr, sympy.Pow) and expr.exp.is_Integer and int(expr.exp) > 0:
        base, exp = parts[0], int(expr.exp)

        def power(env):
            b = base(env)
            out = b
            for _ in range(exp - 1):
                out = out * b
            return out
        return power
    name = type(expr).__name__
    if name == "FloorDiv":
        return fold(lambda x, y: x // y)
    if name in ("Mod", "PythonMod"):
        return fold(lambda x, y: x % y)
    raise Unsupported(f"size {expr} ({name}) has no form tessel computes")


class _TensorsOnly(torch.nn.Module):
    """A dynamo graph with SymInt inputs as a module of its tensors only: each SymInt is computed from the
    tensor dims that carry its symbols, which under tessel's symbolic capture are symbolic sizes."""

    def __init__(self, gm, sizes):
        super().__init__()
        self.gm = gm
        self.sizes = sizes

    def forward(self, *tensors):
        out = run_located(self.gm, self.sizes.args(tensors))
        if self.sizes.outputs:
            drop = {i for i, _ in self.sizes.outputs}
            out = tuple(v for i, v in enumerate(out) if i not in drop)
        return out


class _NodeByNode(torch.fx.Interpreter):
    def run_node(self, n):
        with node_source(n.meta.get("stack_trace")):
            return super().run_node(n)


def run_located(gm, args):
    """Runs a dynamo graph node by node under tessel's capture, so what the capture records (each node's
    source, value reads, refusals) names the model's line dynamo kept for the node, not this call."""
    return _NodeByNode(gm).run(*args)


class _Located(torch.nn.Module):
    """A dynamo graph as a module whose forward runs it with run_located (the static path's capture)."""

    def __init__(self, gm):
        super().__init__()
        self.gm = gm

    def forward(self, *args):
        return run_located(self.gm, args)


class _SizedCall:
    """Calls the compiled graph with the call's tensors, after checking that each SymInt argument dynamo
    passes is the size the tensors give it (dynamo's own guards make them agree; should one not, the
    graph runs in PyTorch instead, never on a wrong size)."""

    def __init__(self, compiled, gm, sizes):
        self.compiled, self.gm, self.sizes = compiled, gm, sizes
        self.stats = compiled.stats
        self.noted = False        # a fallback entry made for the first call PyTorch ran

    def __call__(self, *args):
        sizes = self.sizes
        tensors = [args[i] for i in sizes.tensors]
        if sizes.size_of:
            env = sizes.values(tensors)
            for p, size in sizes.size_of:
                if args[p] != size(env):
                    self.stats.eager_calls += 1
                    return self.gm(*args)
        try:
            out = self.compiled(*tensors)
        except TesselRecompileLimit:
            if not self.stats.dynamic_fallback:
                raise
            # A target that compiles static shapes (CUDA, a dataflow chip) compiles a symbolic graph once
            # per shape while cache_limit allows; past it the graph's new shapes run in PyTorch, as dynamo
            # does at its own recompile limit (with a warning and a fallback entry once), not an exception
            # in the middle of a generate() whose every token is a new KV length.
            self.stats.eager_calls += 1
            self._note(f"a graph with symbolic sizes compiles per shape ({self.stats.dynamic_fallback}) and its "
                       f"cache_limit={self.compiled.cache_limit} compilations are spent; its new shapes run in PyTorch")
            return self.gm(*args)
        return self._with_sizes(out, sizes.values(tensors)) if sizes.outputs else out

    def _with_sizes(self, out, env):
        """The graph's outputs: the compiled tensors with each SymInt output computed from the call's sizes
        at its place."""
        full = list(out)
        for i, size in self.sizes.outputs:
            full.insert(i, size(env))
        return tuple(full)

    def _note(self, why):
        if not self.noted:
            self.noted = True
            dynamo_fallbacks.append(why)
            warnings.warn(f"tessel: {dynamo_fallbacks[-1]}")


_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")


def symbolic_sizes(gm, example_inputs):
    """The _Sizes of a dynamo graph whose inputs carry symbolic sizes (placeholders' example values: fake
    tensors with SymInt dims, SymInts), or None when every size is static. Raises Unsupported (the
    reason) for a graph tessel cannot compile symbolically: a dim that is an expression of symbols
    (2*s0), a SymInt input or output of a symbol no tensor dim carries, another input that is not a
    tensor."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    if len(placeholders) != len(example_inputs):
        raise Unsupported(f"the graph has {len(placeholders)} inputs but {len(example_inputs)} example inputs")
    names, where, dims, ints, tensors = {}, {}, {}, {}, []

    def name_of(sym):
        if sym.name not in names:
            name = sym.name
            k = len(names)
            while not _NAME.fullmatch(name) or name in names.values():
                name, k = f"s{k}", k + 1
            names[sym.name] = name
        return names[sym.name]
    symbolic = False
    for p, (n, ex) in enumerate(zip(placeholders, example_inputs)):
        val = n.meta.get("example_value", n.meta.get("val", ex))
        if isinstance(ex, torch.Tensor) or isinstance(val, torch.Tensor):
            tensors.append(p)
            for d, size in enumerate(val.shape if isinstance(val, torch.Tensor) else ()):
                expr = None if isinstance(size, int) else sympy_expr(size)
                if expr is None or expr.is_Integer:
                    continue
                symbolic = True
                if not expr.is_Symbol:
                    raise Unsupported(f"input {p} ('{n.name}') dim {d} is {expr}, not a size symbol of its own")
                name = name_of(expr)
                dims.setdefault(p, {})[d] = name
                where.setdefault(name, (p, d))
            continue
        expr = sympy_expr(val) if not isinstance(val, (bool, int, float)) else None
        if expr is None:
            raise Unsupported(f"input {p} ('{n.name}') is a {type(val).__name__}")
        symbolic = True
        ints[p] = expr
    if not symbolic:
        return None
    def carried(expr, what):
        """expr over tessel's symbol names; Unsupported when a symbol is on no tensor dim."""
        expr = expr.xreplace({s: s.func(name_of(s), **s.assumptions0) for s in expr.free_symbols})
        missing = [s.name for s in expr.free_symbols if s.name not in where]
        if missing:
            raise Unsupported(f"{what} is {expr}, and no tensor dim carries {missing}")
        return expr
    for p, expr in ints.items():
        ints[p] = carried(expr, f"SymInt input {p} ('{placeholders[p].name}')")
    outputs = {}
    flat = next(n for n in gm.graph.nodes if n.op == "output").args[0]
    for i, a in enumerate(flat if isinstance(flat, (tuple, list)) else ()):
        val = a.meta.get("example_value", a.meta.get("val")) if isinstance(a, torch.fx.Node) else None
        expr = None if val is None or isinstance(val, (torch.Tensor, bool, int, float)) else sympy_expr(val)
        if expr is not None:
            outputs[i] = carried(expr, f"output {i} ('{a.name}')")
    return _Sizes(len(placeholders), tensors, dims, ints, where, outputs)


def _check_options(kwargs):
    """torch.compile's `options={...}`: names tessel.dynamo_options has."""
    unknown = sorted(set(kwargs) - set(dynamo_options))
    if unknown:
        raise _tessel.TesselError(f"torch.compile options {unknown} are not tessel's (it takes "
                                  f"{', '.join(sorted(dynamo_options))})")


def tessel_backend(gm, example_inputs, options=None, mode=None, **kwargs):
    """The "tessel" backend of torch.compile. torch.compile(backend="tessel", options={...}) calls it with
    `options` as one dict (torch >= 2: its wrapper passes options= and mode= to a backend that is not
    Inductor); kwargs are the same names given one by one (a direct call). Either way they are
    tessel.dynamo_options' names, over tessel.dynamo_options (target="spyre" runs the graphs on the
    simulated chip). `mode` is Inductor's and has no meaning here: a mode other than None or "default" is
    an error, not ignored."""
    if options is not None:
        if not isinstance(options, dict):
            raise _tessel.TesselError(f"torch.compile options must be a dict, not {type(options).__name__}")
        clash = sorted(set(options) & set(kwargs))
        if clash:
            raise _tessel.TesselError(f"torch.compile options {clash} given twice")
        kwargs = {**options, **kwargs}
    if mode not in (None, "default"):
        raise _tessel.TesselError(f"torch.compile mode {mode!r} is Inductor's; the tessel backend takes none "
                                  f"(its options: {', '.join(sorted(dynamo_options))})")
    _check_options(kwargs)
    reads = number_inputs(gm, example_inputs)
    if reads:
        return _Numbers(gm, example_inputs, reads, kwargs)
    return _backend(gm, example_inputs, kwargs)


def _backend(gm, example_inputs, options):
    if all(isinstance(t, torch.Tensor) for t in example_inputs) and not _has_symbolic_dims(gm):
        return _FirstCall(gm, options=options)
    free = free_int_inputs(gm, example_inputs)
    if free:
        return _FreeInts(gm, example_inputs, free, options)
    try:
        sizes = symbolic_sizes(gm, example_inputs)
    except Unsupported as e:
        return _fallback(gm, f"the graph takes non-tensor inputs tessel cannot compile symbolically: {e}")
    if sizes is None:
        return _fallback(gm, "the graph takes non-tensor inputs that are not sizes")
    return _FirstCall(gm, sizes, options)


def _is_number_read(n):
    return ((n.op == "call_method" and n.target == "item") or
            (n.op == "call_function" and n.target in (torch.ops.aten._local_scalar_dense.default, torch.ops.aten.item.default)))


def number_inputs(gm, example_inputs):
    """The positions of the graph's inputs that are 0-d tensors it only reads as numbers (`.item()`): under
    dynamic=True dynamo passes a module's float attributes and Python globals this way (a LayerNorm's eps,
    attention's scaling, `math.pi` in transformers' GELU), one 0-d float64 tensor each, read back as a
    SymFloat. A read is not an op tessel can compile symbolically (it is a value, not a tensor), so each
    read is folded to the number the call passes (_Numbers)."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    out = []
    for p, (n, ex) in enumerate(zip(placeholders, example_inputs)):
        val = n.meta.get("example_value", ex)
        if (isinstance(val, torch.Tensor) and val.dim() == 0 and n.users
                and all(_is_number_read(u) for u in n.users)):
            out.append(p)
    return out


def fold_numbers(gm, positions, values):
    """A copy of the graph without the inputs at `positions`, each read of one (`.item()`) replaced by its
    value (a Python number) in the nodes that use it."""
    graph = torch.fx.Graph()
    env = {}
    graph.output(graph.graph_copy(gm.graph, env))
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    for p, value in zip(positions, values):
        ph = placeholders[p]
        for read in list(ph.users):
            for user in list(read.users):
                user.args = torch.fx.node.map_arg(user.args, lambda a, r=read, v=value: v if a is r else a)
                user.kwargs = torch.fx.node.map_arg(user.kwargs, lambda a, r=read, v=value: v if a is r else a)
            graph.erase_node(read)
        graph.erase_node(ph)
    graph.lint()
    return torch.fx.GraphModule(gm, graph)


class _Folded:
    """A dynamo graph compiled with some of its inputs folded to the values of the call (subclasses say
    which inputs and how), the values checked on every call. Other values compile again (one compilation
    per set of values, as cache_limit bounds); past the limit, the graph runs in PyTorch for values not
    yet compiled."""

    what = ""                       # the inputs, for the fallback's message

    def __init__(self, gm, example_inputs, positions, options):
        self.gm, self.positions, self.options = gm, positions, options
        self.skip = set(positions)
        self.examples = [x for i, x in enumerate(example_inputs) if i not in self.skip]
        self.compiled = {}          # the call's values (as a key) -> the backend's callable for the folded graph
        self.refused = False

    def values(self, args):
        raise NotImplementedError

    def fold(self, values):
        raise NotImplementedError

    def __call__(self, *args):
        values = self.values(args)
        key = tuple(repr(v) for v in values)
        fn = self.compiled.get(key)
        if fn is None:
            limit = {**dynamo_options, **self.options}["cache_limit"]
            if len(self.compiled) >= limit:
                if not self.refused:
                    self.refused = True
                    _fallback(self.gm, f"{self.what} took {len(self.compiled) + 1} sets of values "
                                       f"(cache_limit={limit}); new ones run in PyTorch")
                return self.gm(*args)
            fn = self.compiled[key] = _backend(self.fold(values), self.examples, self.options)
        return fn(*[a for i, a in enumerate(args) if i not in self.skip])


class _Numbers(_Folded):
    """Inputs read only as numbers (number_inputs), folded to the call's values: tessel sees constants,
    so a symbolic compilation is not broken by a read."""

    what = "the numbers the graph reads from its inputs"

    def values(self, args):
        return [args[p].item() for p in self.positions]

    def fold(self, values):
        return fold_numbers(self.gm, self.positions, values)


def free_int_inputs(gm, example_inputs):
    """The positions of the graph's SymInt inputs whose symbols no tensor input's dim carries: a size the
    model keeps beside its tensors (transformers' static KV cache passes its max_cache_len so, s72). A
    symbolic compilation computes every SymInt from the tensors' dims, which these are not; each is
    folded to the value of the call instead (_FreeInts), as a number read is (_Numbers)."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    if len(placeholders) != len(example_inputs):
        return []
    carried, ints = set(), []
    for p, (n, ex) in enumerate(zip(placeholders, example_inputs)):
        val = n.meta.get("example_value", n.meta.get("val", ex))
        if isinstance(val, torch.Tensor) or isinstance(ex, torch.Tensor):
            for size in (val.shape if isinstance(val, torch.Tensor) else ()):
                expr = None if isinstance(size, int) else sympy_expr(size)
                if expr is not None:
                    carried.update(sym.name for sym in expr.free_symbols)
        elif not isinstance(val, (bool, int, float)):
            expr = sympy_expr(val)
            if expr is not None and not expr.is_Integer and n.users:
                ints.append((p, {sym.name for sym in expr.free_symbols}))
    return [p for p, syms in ints if not syms <= carried]


def fold_ints(gm, positions, values):
    """A copy of the graph without the inputs at `positions`, each use of one replaced by its value."""
    graph = torch.fx.Graph()
    graph.output(graph.graph_copy(gm.graph, {}))
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    for p, value in zip(positions, values):
        ph = placeholders[p]
        for user in list(ph.users):
            user.args = torch.fx.node.map_arg(user.args, lambda a, r=ph, v=value: v if a is r else a)
            user.kwargs = torch.fx.node.map_arg(user.kwargs, lambda a, r=ph, v=value: v if a is r else a)
        graph.erase_node(ph)
    graph.lint()
    return torch.fx.GraphModule(gm, graph)


class _FreeInts(_Folded):
    """SymInt inputs no tensor dim carries (free_int_inputs), folded to the call's values."""

    what = "the sizes the graph takes beside its tensors"

    def values(self, args):
        return [int(args[p]) for p in self.positions]

    def fold(self, values):
        return fold_ints(self.gm, self.positions, values)


def _has_symbolic_dims(gm):
    """Whether a placeholder's example value has a dim that is a symbol or an expression of symbols. A SymInt
    dim whose expression is a number is static: dynamo's default mode can mark a size dynamic and its shape
    environment then fix the symbol to a value (a dynamic KV cache's decode graph); such a graph compiles for
    its static sizes -- dynamo's guards hold them, and tessel's own guard compiles again for other shapes."""
    def symbolic(size):
        if isinstance(size, int):
            return False
        expr = sympy_expr(size)
        return expr is None or not expr.is_Integer
    vals = (n.meta.get("example_value") for n in gm.graph.nodes if n.op == "placeholder")
    return any(symbolic(s) for v in vals if isinstance(v, torch.Tensor) for s in v.shape)


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
