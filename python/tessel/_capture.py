"""Capture: a module's functionalized aten graph, with its parameters and buffers as explicit state.

`make_fx(functionalize(fn))` traces the module with every parameter and buffer passed in as an input
(torch.nn.utils.stateless.functional_call), so the captured graph has no in-place op and no view: a
mutation of an input or of a buffer becomes a functional op whose result the graph returns, and the
caller writes it back (docs/python.md, "Capture, functionalization, freezing, guards"). Tracing runs on
clones, so capturing never changes the module's tensors or the example inputs.
"""
import contextlib
import operator
import traceback

import torch
from . import _structure, _tessel
from ._convert import TesselCaptureError
from ._frames import _traceback_frames, _user_frame

aten = torch.ops.aten


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
    return any(s in str(e) for s in ("value out of a tracing tensor", "data-dependent", "unallocated storage"))


class ValueRead:
    """A tensor's value that the module read into Python while it was traced (`if mask.any():`,
    `int(n)`, an integer `.item()` deciding a size or a branch): the graph is specialised to `value`
    and returns the tensor as a guard output; a call whose value differs is not answered by that graph
    (docs/python.md, "Data-dependent Python: value guards")."""

    __slots__ = ("kind", "value", "where")

    def __init__(self, kind, value, where):
        self.kind, self.value, self.where = kind, value, where

    def holds(self, t):
        """Whether the tensor `t` (the guard output of a call) reads as this value."""
        now = _READ[self.kind](t)
        if self.kind == "float" or (self.kind == "item" and isinstance(self.value, float)):
            return now == self.value or abs(now - self.value) <= 1e-6 * max(abs(now), abs(self.value))
        return now == self.value

    def describe(self, now=None):
        what = f"{self.kind} read at {self.where or '<unknown line>'}"
        return f"{what}: {self.value!r}" if now is None else f"{what} was {self.value!r} at capture, now {now!r}"

    def as_dict(self):
        return dict(kind=self.kind, value=self.value, location=self.where)


def _sync(t):
    """Brings a functionalized tensor up to date with pending writes to its base while tracing is on, so
    that the ops doing it are in the graph (the read itself runs with tracing off)."""
    is_functional = getattr(torch, "_is_functional_tensor", None)
    if is_functional is not None and hasattr(torch, "_sync") and is_functional(t):
        torch._sync(t)


def _tolist(t):
    """t.tolist() by elements (tolist itself reads storage, which a functionalized tensor has none of)."""
    return t.item() if t.dim() == 0 else [_tolist(t[i]) for i in range(t.shape[0])]


_READ_METHODS = {"__bool__": "bool", "__int__": "int", "__float__": "float", "__index__": "index", "item": "item",
                 "tolist": "tolist"}
# kind -> how a call reads its guard output (torch's own methods, taken before any capture patches them)
_READ = {kind: getattr(torch.Tensor, name) for name, kind in _READ_METHODS.items()}


def _untraced():
    """A context in which make_fx's tracing mode is off, so a traced tensor's value can be read."""
    try:
        from torch.fx.experimental.proxy_tensor import disable_proxy_modes_tracing
        return disable_proxy_modes_tracing()
    except ImportError:  # pragma: no cover -- both torch 1.13 and 2.x have it
        from torch.utils._python_dispatch import _disable_current_modes
        return _disable_current_modes()


@contextlib.contextmanager
def _value_reads(reads):
    """While make_fx traces: a Python read of a traced tensor's value (`bool`, `int`, `float`,
    `operator.index`, `.tolist()`, `.item()` of an integer or bool tensor) reads the real value (the
    trace runs on real tensors) and records (tensor, ValueRead) in `reads`; the capture returns those
    tensors as guard outputs. `.item()` of a floating-point tensor instead gives the tensor as a 0-d
    tensor: the value stays in the graph, so `x / x.max().item()` is captured whole, not specialised
    (a Python use of that 0-d tensor is then a read). Reads of constants are plain numbers as before."""
    made = []      # the 0-d tensors .item() handed out (identity marks them)
    originals = {name: getattr(torch.Tensor, name) for name in _READ_METHODS}

    def reader(kind, original):
        def read(self, *args):
            try:
                return original(self, *args)
            except Exception as e:  # noqa: BLE001 -- only make_fx's "value of a tracing tensor" is ours
                if not _tracing_read(e):
                    raise
            if (kind == "item" and self.is_floating_point() and self.numel() == 1
                    and not any(self is t for t in made)):
                t = self.reshape(())
                made.append(t)
                return t
            _sync(self)
            with _untraced():
                value = _tolist(self) if kind == "tolist" else original(self, *args)
            reads.append((self, ValueRead(kind, value, _user_frame())))
            return value
        return read
    for name, kind in _READ_METHODS.items():
        setattr(torch.Tensor, name, reader(kind, originals[name]))
    # Comparisons that return a Python bool read the values inside PyTorch's C++: as the bool of a
    # tensor expression with the same answer they become a `bool` read above.
    replaced = []
    for owner, name, same in _BOOL_OPS:
        original = getattr(owner, name)
        replaced.append((owner, name, original))
        setattr(owner, name, _as_bool_read(original, same))
    try:
        yield
    finally:
        for name, f in originals.items():
            setattr(torch.Tensor, name, f)
        for owner, name, original in replaced:
            setattr(owner, name, original)


def _as_bool_read(original, same):
    def compare(*args, **kwargs):
        try:
            return original(*args, **kwargs)
        except Exception as e:  # noqa: BLE001 -- only make_fx's "value of a tracing tensor" is ours
            if not _tracing_read(e):
                raise
        return same(*args, **kwargs)
    return compare


def _equal(a, b):
    return a.shape == b.shape and bool((a == b).all())


def _allclose(a, b, rtol=1e-05, atol=1e-08, equal_nan=False):
    # isclose's definition (equal values, infinities included, or |a - b| <= atol + rtol |b|), spelled
    # with ops tessel lowers
    close = (a == b) | ((a - b).abs() <= atol + rtol * b.abs())
    if equal_nan:
        close = close | (a.isnan() & b.isnan())
    return bool(close.all())


_BOOL_OPS = [(torch, "equal", _equal), (torch.Tensor, "equal", _equal), (torch, "allclose", _allclose),
             (torch.Tensor, "allclose", _allclose), (torch.Tensor, "is_nonzero", lambda t: bool(t))]


def _functionalize():
    """torch.func.functionalize (torch >= 2.0) or functorch's (torch 1.13)."""
    func = getattr(torch, "func", None)
    if func is not None and hasattr(func, "functionalize"):
        return func.functionalize
    from functorch import functionalize
    return functionalize


class Slot:
    """Where a tensor the graph reads but the caller does not pass comes from: a parameter or buffer
    of the module (`owner._parameters[key]` / `owner._buffers[key]`, read again on every call, so a
    replaced tensor is seen), or the call's input `index` (torch.compile hands parameters as inputs)."""

    __slots__ = ("name", "table", "key", "index")

    def __init__(self, name, table=None, key=None, index=None):
        self.name, self.table, self.key, self.index = name, table, key, index

    def get(self, args):
        return args[self.index] if self.index is not None else self.table[self.key]


def module_state(module):
    """[(Slot, tensor, names)] for every distinct parameter and buffer of `module`: a tensor shared by
    several modules (tied weights) once, under its first name, with all its names (each must get it);
    a module under several paths contributes one name per slot."""
    if not isinstance(module, torch.nn.Module):
        return []
    state, seen, slots = [], {}, set()
    for path, m in module.named_modules(remove_duplicate=False):
        for kind, table in (("parameter", m._parameters), ("buffer", m._buffers)):
            for key, t in table.items():
                if t is None or (id(table), key) in slots:
                    # A module reachable under several paths (timm's CoaT shares its position encoders
                    # between blocks) is one slot: named once (see _functional_call).
                    continue
                slots.add((id(table), key))
                name = f"{path}.{key}" if path else key
                if id(t) not in seen:
                    seen[id(t)] = len(state)
                    state.append((Slot(f"{kind} '{name}'", table, key), t, []))
                state[seen[id(t)]][2].append(name)
    return state


class Captured:
    """The functionalized graph and what its placeholders are.

    gm's placeholders are the module's state tensors (`state`, one per distinct tensor) then the call's
    inputs; its output is `(module output, (new values of the mutated placeholders...))`. `sources[p]`
    is placeholder p's Slot (state, or an input named in freeze_inputs) or its input index; `mutated`
    lists the placeholders written back, in output order. The module output part is itself
    `((output tensors...), (guard tensors...))`: `structure` rebuilds the module's value from the first,
    `reads[i]` says what value the i-th guard tensor must read as."""

    def __init__(self, gm, sources, mutated, example, structure, reads):
        self.gm = gm
        self.sources = sources
        self.mutated = mutated
        self.example = example      # state: the real tensor; a plain input: a meta tensor of its type
        self.structure = structure  # rebuilds the module's output from the graph's output tensors
        self.reads = reads          # the ValueReads the graph is specialised to, one guard output each
        self.symbolic = None        # a symbolic capture's _dynamic.Symbolic (input dims, symbols, shape guards)


def _functional_call():
    func = getattr(torch, "func", None)
    if func is not None and hasattr(func, "functional_call"):
        # tie_weights=False: every slot is named once in the mapping (module_state), tied tensors under
        # all their names. With tie_weights=True torch 2.x widens each name to every path of its
        # tensor, swaps a slot reachable under several paths (a shared module) once per path and
        # restores in order, so the module keeps the trace's tensor afterwards.
        return lambda module, mapping, args, kwargs: func.functional_call(module, mapping, args, kwargs,
                                                                          tie_weights=False)
    from torch.nn.utils import stateless
    return stateless.functional_call


def _state_fn(module, state, call_of):
    """fn(*state_tensors, *inputs) calling `module` with its parameters and buffers replaced; `call_of`
    makes the call's (args, kwargs) from its input tensors (None: they are the positional arguments)."""
    k = len(state)

    def arguments(flat):
        if call_of is None:
            return tuple(flat[k:]), {}
        args, kwargs = call_of(flat[k:])
        return tuple(args), kwargs
    if not state:
        def plain(*flat):
            args, kwargs = arguments(flat)
            return module(*args, **kwargs)
        return plain
    call = _functional_call()
    names = [names for _, _, names in state]

    def fn(*flat):
        mapping = {n: flat[i] for i, ns in enumerate(names) for n in ns}
        args, kwargs = arguments(flat)
        return call(module, mapping, args, kwargs)
    return fn


@contextlib.contextmanager
def _functorch_stack_restored():
    """Leaves functorch's interpreter stack as deep as it was, whatever the trace raised: a failure deep
    inside torch's functionalization (timm's coat_lite_tiny on torch 2.11: an internal assert in
    FunctionalStorageImpl) can leave a layer behind, and every later torch.compile in the process then
    fails (`maybe_layer.has_value()`). dynamo restores the stack the same way around its frames."""
    functorch = getattr(torch._C, "_functorch", None)
    depth_of = getattr(functorch, "get_dynamic_layer_stack_depth", None)
    undo_to = getattr(functorch, "pop_dynamic_layer_stack_and_undo_to_depth", None)
    depth = depth_of() if depth_of and undo_to else None
    try:
        yield
    finally:
        if depth is not None and depth_of() != depth:
            undo_to(depth)


@contextlib.contextmanager
def _portable_kernels(tensors):
    """On CUDA tensors, composite ops pick a device library's kernel as they are traced (batch norm becomes
    cudnn_batch_norm, scaled_dot_product_attention a fused flash/efficient/cuDNN kernel): with cuDNN off
    and SDPA's math backend the trace records the portable aten ops the CPU trace does (for the CUDA
    target, docs/python.md, "CUDA tensors"). CPU traces are unchanged."""
    if not any(isinstance(t, torch.Tensor) and t.is_cuda for t in tensors):
        yield
        return
    with contextlib.ExitStack() as stack:
        stack.enter_context(torch.backends.cudnn.flags(enabled=False))
        try:
            from torch.nn.attention import SDPBackend, sdpa_kernel
            stack.enter_context(sdpa_kernel([SDPBackend.MATH]))
        except ImportError:  # pragma: no cover -- torch < 2.3 (torch 1.13 has no fused SDPA forms)
            pass
        yield


def capture(module, example_inputs, freeze_inputs=(), call=None):
    """The functionalized aten graph of `module` on `example_inputs` (a Captured): the call's tensors;
    `call(tensors) -> (args, kwargs)` places them among its other arguments (default: positional)."""
    from torch.fx.experimental.proxy_tensor import make_fx
    state, fn, example = _prepare(module, example_inputs, call)
    # Tracing runs the module on real tensors: clones, so that its mutations (written back by
    # functionalize at the end of the trace) do not reach the module or the caller's inputs.
    clones = _clones(example)
    reads = []          # (tensor, ValueRead) of the trace, in order
    structure = []      # the Structure of the module's output
    traced = _traced(module, fn, structure, reads)
    with _tracing_errors(module):
        # (fork_rng: tracing runs the module's random ops; the caller's generator is left as it was, so
        # a compile inside a call -- torch.compile's first -- draws what eager would: class Dropout's tests)
        with _functorch_stack_restored(), _provenance(module), _value_reads(reads), torch.no_grad(), \
                torch.random.fork_rng(devices=[]), _portable_kernels(clones):
            gm = make_fx(_functionalize()(traced, remove="mutations"))(*clones)
    del clones
    return _captured(gm, module, state, example_inputs, example, structure[0], freeze_inputs,
                     [r for _, r in reads])


def capture_symbolic(module, example_inputs, plan, freeze_inputs=(), call=None):
    """The aten graph of `module` traced once for every size of the plan's symbols (docs/python.md,
    "Dynamic shapes"): a Captured whose `symbolic` (a _dynamic.Symbolic) gives each input's dims, the
    symbols and the shape guards. Raises DynamicUnsupported or TesselCaptureError when the module cannot
    be captured so (tessel.compile then compiles per shape)."""
    from . import _dynamic
    state, fn, example = _prepare(module, example_inputs, call)
    k0 = len(state)
    clones = _clones(example)
    shapes = {k: list(t.shape) for k, t in enumerate(clones) if isinstance(t, torch.Tensor)}
    by_arg = {k0 + i: dims for i, dims in plan.dims.items()}
    trace = _dynamic.tracer(by_arg, shapes)
    structure = []
    traced = _traced(module, fn, structure, [])
    functional = _dynamic.torch_major() >= 2
    with _tracing_errors(module, "symbolic capture"):
        with _functorch_stack_restored(), _provenance(module), torch.no_grad(), torch.random.fork_rng(devices=[]):
            f = _functionalize()(traced, remove="mutations") if functional else traced
            gm = trace.make_fx(f, clones)
    del clones
    if not functional:
        out = next(n for n in gm.graph.nodes if n.op == "output")
        out.args = ((out.args[0], ()),)       # the (module output, (written-back values)) of functionalize
        gm.recompile()
    captured = _captured(gm, module, state, example_inputs, example, structure[0], freeze_inputs, [])
    # torch >= 2 functionalizes the symbolic trace as the static one: a mutated input or buffer (a static
    # KV cache written with index_copy_) is an extra output written back after each call, whatever the
    # binding. torch 1.13's symbolic trace is not functionalized, so a mutation there stays a refusal.
    if captured.mutated and not functional:
        raise _dynamic.DynamicUnsupported("the module changes an input or a buffer in place")
    input_dims, specialised, names = {}, [], {}
    for k, t in shapes.items():
        if k < k0:
            continue
        dims = [trace.resolve(k, d) for d in range(len(t))]
        input_dims[k] = dims
        for d, spec in by_arg.get(k, {}).items():
            if not isinstance(dims[d], _dynamic.SymDim) or dims[d].text != spec.name:
                at = trace.tied_at(spec.name) if hasattr(trace, "tied_at") else ""
                specialised.append(f"input {k - k0} dim {d} ({spec.name}) is {dims[d]}: the module's sizes tie it"
                                   + (f" (at {at})" if at else ""))
    for dims in input_dims.values():
        for v in dims:
            if isinstance(v, _dynamic.SymDim):
                for s in v.symbols():
                    names[s] = plan.symbols[s]
    captured.symbolic = _dynamic.Symbolic(input_dims, names, trace.guards(), specialised,
                                          getattr(trace, "names", None))
    return captured


def _prepare(module, example_inputs, call):
    """(state, fn, example): the module's parameters and buffers, fn(*state, *inputs) calling it, and
    the flat example (state tensors then the call's inputs)."""
    if not callable(module):
        raise _tessel.TesselError(f"tessel.compile takes a torch.nn.Module or a function, not {type(module).__name__}")
    state = module_state(module)
    fn = _state_fn(module, state, call)
    return state, fn, [t for _, t, _ in state] + list(example_inputs)


def _clones(example):
    with torch.no_grad():
        return [t.detach().clone(memory_format=torch.contiguous_format) if isinstance(t, torch.Tensor) else t
                for t in example]


def _traced(module, fn, structure, reads):
    """The function make_fx traces: it returns (the output's tensors, the tensors whose values were
    read); the output's other parts are rebuilt around its tensors on every call (`structure` gets
    its Structure); the read tensors are the value guards."""
    def traced(*flat):
        del reads[:]
        try:
            tensors, st = _structure.flatten(fn(*flat), "the module's output")
        except _structure.Unsupported as e:
            raise TesselCaptureError(f"cannot capture {type(module).__name__}: {e}") from None
        structure[:] = [st]
        return tuple(tensors), tuple(t for t, _ in reads)
    return traced


@contextlib.contextmanager
def _tracing_errors(module, what="capture"):
    """Every tracing failure becomes one TesselCaptureError naming the module, the user's line and a hint."""
    try:
        yield
    except _tessel.TesselError:
        raise
    except Exception as e:  # noqa: BLE001 -- every tracing failure becomes one clear error
        where = _user_frame(_traceback_frames(traceback.extract_tb(e.__traceback__)))
        msg = str(e).splitlines()[0] if str(e) else type(e).__name__
        hint = ""
        if _tracing_read(msg):
            hint = (" -- PyTorch read a traced tensor's value inside its C++ (a tensor passed where a number is "
                    "expected: a size, a dim, arange's end); pass int(tensor) instead, which tessel captures as a "
                    "value guard, or keep the computation in tensors")
            if hasattr(torch, "compile"):
                hint += "; or use torch.compile(module, backend='tessel'), where dynamo splits the graph there"
        name = type(module).__name__
        verb = "capture" if what == "capture" else f"{what} of"
        raise TesselCaptureError(f"cannot {verb} {name}: {msg}" + (f" at {where}" if where else "") + hint) from e


def _captured(gm, module, state, example_inputs, example, structure, freeze_inputs, reads):
    _check_rebuild(structure, module)
    sources = [slot for slot, _, _ in state] + list(range(len(example_inputs)))
    for i in freeze_inputs:
        sources[len(state) + i] = Slot(f"input {i}", index=i)
    mutated = _mutations_to_outputs(gm)
    # Plain call inputs matter for their shape and dtype only: keep no reference to the caller's data.
    example = [t if isinstance(src, Slot) or not isinstance(t, torch.Tensor)
               else torch.empty(t.shape, dtype=t.dtype, device="meta") for t, src in zip(example, sources)]
    return Captured(gm, sources, mutated, example, structure, reads)


def _check_rebuild(structure, module):
    """Rebuilds the output once now, with stand-in tensors, so that an output type whose copy fails is a
    capture error, not an error on every call."""
    try:
        structure.rebuild([torch.empty(0)] * structure.count)
    except Exception as e:  # noqa: BLE001 -- any failure of a user type's copy
        raise TesselCaptureError(f"cannot capture {type(module).__name__}: its output cannot be rebuilt around new "
                                 f"tensors ({type(e).__name__}: {e})") from e


def _batch_norm_stats_are_hidden():
    """torch 1.13's native_batch_norm updates running_mean/var in place without saying so in its schema,
    so functionalization does not see it (torch 2 has _native_batch_norm_legit_functional)."""
    args = aten.native_batch_norm.default._schema.arguments
    return args[3].alias_info is None or not args[3].alias_info.is_write


def _functional_batch_norm(graph, n, placeholders):
    """A training-mode native_batch_norm(x, w, b, running_mean, running_var, True, momentum, eps) that
    updates the running statistics in place (torch 1.13): the node without them, and the new statistics
    computed from its batch mean and inverse std (PyTorch's update: unbiased variance, momentum) as a
    mutation of the buffers. Returns [(placeholder, new value node)]."""
    x, w, b, rm, rv, training, momentum, eps = n.args
    if not training or rm is None:
        return []
    for s in (rm, rv):
        if s not in placeholders:
            raise TesselCaptureError(f"a training-mode batch norm updates running statistics that are not a buffer "
                                     f"of the module ('{s}'); tessel cannot write them back")
    count = 1
    for i, s in enumerate(_shape(x)):
        if i != 1:
            count *= s
    n.args = (x, w, b, None, None, True, momentum, eps)
    before = set(graph.nodes)
    call = graph.call_function
    out = next(u for u in graph.nodes if u.op == "output")
    with graph.inserting_before(out):      # new nodes in creation order, after everything (only outputs use them)
        mean, invstd = (_getitem(graph, n, k) for k in (1, 2))
        # var_biased = 1 / invstd^2 - eps; running_var <- (1-m) rv + m var_biased n / (n-1)
        var = call(aten.sub.Tensor, (call(aten.reciprocal.default, (call(aten.mul.Tensor, (invstd, invstd)),)), eps))
        new_rv = call(aten.add.Tensor, (call(aten.mul.Tensor, (rv, 1.0 - momentum)),
                                        call(aten.mul.Tensor, (var, momentum * count / max(count - 1, 1)))))
        new_rm = call(aten.add.Tensor, (call(aten.mul.Tensor, (rm, 1.0 - momentum)),
                                        call(aten.mul.Tensor, (mean, momentum))))
    for v in graph.nodes:
        if v not in before:
            v.meta.update(tessel_module=n.meta.get("tessel_module", ""), tessel_source=n.meta.get("tessel_source", ""))
    return [(rm, new_rm), (rv, new_rv)]


def _getitem(graph, n, k):
    """n's existing `n[k]` node (it carries the traced type), or a new one."""
    for u in n.users:
        if u.target is operator.getitem and u.args[1] == k:
            return u
    return graph.call_function(operator.getitem, (n, k))


def _shape(node):
    meta = node.meta.get("tensor_meta")
    if meta is None:
        meta = node.meta.get("val")
    return list(meta.shape)


_METADATA_OPS = {"as_strided_", "transpose_", "t_", "squeeze_", "unsqueeze_", "swapdims_", "swapaxes_", "detach_"}


def _metadata_only(n):
    t = n.target
    return (isinstance(t, torch._ops.OpOverload) and t._schema.name.split("::")[-1] in _METADATA_OPS
            and _out_of_place(t) is not None)


def _out_of_place(op):
    """aten.as_strided.default of aten.as_strided_.default (None if there is no such overload)."""
    name = op._schema.name.split("::")[-1][:-1]
    packet = getattr(aten, name, None)
    if packet is None:
        return None
    # transpose_.default's out-of-place form is transpose.int
    return getattr(packet, op._overloadname, None) or getattr(packet, "int", None)


def _random_mask(graph, n):
    """`bernoulli_(t, p)` on a tensor made for it (PyTorch's CPU dropout: `empty_like(x).bernoulli_(1 - p)`,
    which functionalization leaves in place on torch 1.13) and `bernoulli.p(t, p)`: their result depends
    only on t's shape and dtype, so the node becomes aten_table.bernoulli_mask(shape, p, dtype), which has
    no tensor input (what made t is then dead). True when n was rewritten."""
    if n.target not in _BERNOULLI or not 1 <= len(n.args) <= 2 or set(n.kwargs) - {"p", "generator"} \
            or n.kwargs.get("generator") is not None:
        return False
    t = n.args[0]
    p = n.args[1] if len(n.args) == 2 else n.kwargs.get("p", 0.5)   # (bernoulli_.float's default p: make_fx omits it)
    if not isinstance(t, torch.fx.Node) or not isinstance(p, (int, float)):
        return False
    if n.target is aten.bernoulli_.float and (len(t.users) != 1 or t.op == "placeholder"):
        return False          # the in-place draw overwrites a tensor something else reads
    meta = t.meta.get("val", t.meta.get("tensor_meta"))
    if meta is None or not all(isinstance(d, int) for d in meta.shape):
        return False
    from .aten_table import bernoulli_mask
    n.target, n.args, n.kwargs = bernoulli_mask, (list(meta.shape), float(p), meta.dtype), {}
    return True


_BERNOULLI = {o for o in (getattr(aten.bernoulli_, "float", None), getattr(aten.bernoulli, "p", None)) if o is not None}


def _mutations_to_outputs(gm):
    """Turns functionalize's trailing `copy_(placeholder, value)` nodes (the write-back of mutated inputs)
    into extra graph outputs: the output becomes (module output, (values...)). Returns the placeholder
    positions in that order. Any other in-place op left in the graph (a mutation of a tensor that is not
    an input, parameter or buffer) is a capture error: tessel could not write it back."""
    graph = gm.graph
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    position = {n: i for i, n in enumerate(placeholders)}
    writes = {}      # placeholder -> its final value node
    for n in list(graph.nodes):
        if n.op != "call_function":
            continue
        if n.target is aten.copy_.default and n.args[0] in position:
            writes[n.args[0]] = n.args[1]
            graph.erase_node(n)
        elif n.target is aten.native_batch_norm.default and _batch_norm_stats_are_hidden():
            for p, v in _functional_batch_norm(graph, n, position):
                writes[p] = v
        elif _random_mask(graph, n):
            pass
        elif _metadata_only(n) and n.args[0] not in position:
            # An in-place view op (as_strided_, transpose_, ...) changes a tensor's sizes and strides, not
            # its data; make_fx points later uses at this node, so its out-of-place view is the same value.
            n.target = _out_of_place(n.target)
        elif isinstance(n.target, torch._ops.OpOverload) and n.target._schema.is_mutable:
            raise TesselCaptureError(
                f"cannot capture: {n.target} mutates a tensor that is not an input, parameter or buffer "
                f"({n.meta.get('tessel_source', '')}); register it as a buffer so tessel can write it back")
    order = sorted(writes, key=lambda p: position[p])
    out = next(n for n in graph.nodes if n.op == "output")
    out.args = ((out.args[0], tuple(writes[p] for p in order)),)
    graph.lint()
    gm.recompile()
    return [position[p] for p in order]
