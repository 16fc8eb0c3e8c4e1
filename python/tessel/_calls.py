"""What tessel.compile's callables and training steps share (python/tessel/_compile.py and _train.py):
a call's split into tensors and signature, the statistics, the guard of the frozen state, and PyTorch's
thread count kept across tessel's calls. Its own module so that neither of the two imports the other."""
import contextlib
import operator

import torch

from . import _tessel


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


# Arguments other than tensors that a call may pass: part of the signature (the graph is specialised to
# their values), like `use_cache=False` or `return_dict=True` for a transformers model.
_LITERALS = (type(None), bool, int, float, str)


def _split_call(args, kwargs):
    """(tensors, signature) of a call: its tensors (positional, then keyword arguments by name) are the
    graph's inputs; the signature holds each tensor's (shape, dtype), each literal's ("=", (type, value))
    and, with keyword arguments, a last ("kw", names) -- _call_builder rebuilds the call from it."""
    sig = []
    items = list(args)
    if kwargs:
        names = tuple(sorted(kwargs))
        items += [kwargs[k] for k in names]
    tensors = []
    for i, a in enumerate(items):
        if isinstance(a, torch.Tensor):
            if a.layout is not torch.strided:  # (a sparse input reached numpy's conversion: a TypeError)
                what = f"input {i}" if i < len(args) else f"keyword argument '{names[i - len(args)]}'"
                raise _tessel.TesselError(f"{what} is a {str(a.layout).replace('torch.', '')} tensor; tessel compiles "
                                          "dense (strided) tensors -- pass it as .to_dense()")
            sig.append((tuple(a.shape), a.dtype))
            tensors.append(a)
        elif isinstance(a, _LITERALS):
            sig.append(("=", (type(a).__name__, a)))
        else:
            what = f"input {i}" if i < len(args) else f"keyword argument '{names[i - len(args)]}'"
            raise _tessel.TesselError(
                f"{what} is a {type(a).__name__}; a tessel-compiled callable takes tensors and None/bool/int/float/str "
                "arguments (a cache or other object as an input: call the model without it, or use "
                "torch.compile(model, backend='tessel'))")
    if kwargs:
        sig.append(("kw", names))
    return (args if len(tensors) == len(args) and not kwargs else tuple(tensors)), tuple(sig)


def _call_builder(sig):
    """build(tensors) -> (args, kwargs) of the call `sig` describes, with `tensors` in its tensors' places."""
    names = sig[-1][1] if sig and sig[-1][0] == "kw" else ()
    items = sig[:-1] if names else sig
    n_pos = len(items) - len(names)

    def build(tensors):
        it = iter(tensors)
        vals = [s[1][1] if s[0] == "=" else next(it) for s in items]
        return vals[:n_pos], dict(zip(names, vals[n_pos:]))
    return build


class Stats:
    """What a compiled callable did: compilations, cache hits, compile time, recompiles and why."""

    def __init__(self):
        self.compiles = 0
        self.cache_hits = 0
        self.compile_seconds = 0.0
        self.recompiles = []      # reasons, one per compilation after the first
        self.eager_calls = 0      # calls run by PyTorch eager after the recompile limit (on_limit="eager")
        self.calls = 0
        self.refreshes = 0        # compilations because frozen parameters/buffers changed (also in recompiles)
        # Dynamic shapes: the distinct input shapes the symbolic compilations ran (each a binding of the
        # size symbols, which the compiled backend instantiates once), and why a dynamic=... request
        # compiles per shape instead (None while it does not).
        self.bindings = 0
        self.dynamic_fallback = None
        self._instances = None    # () -> the compiled backend's instance count of the cached symbolic compilations
        self._rebinds = None      # () -> the same for rebinds of their one executable

    @property
    def compilations(self):
        """compiles, by the name the dynamic-shape benches read (bench/dynamic_shapes.py)."""
        return self.compiles

    @property
    def instances(self):
        """The instances the compiled backend built for the cached symbolic compilations (one per binding
        of their size symbols, the least recently used dropped past 16 each)."""
        return self._instances() if self._instances is not None else 0

    @property
    def rebinds(self):
        """Calls that rebound the one executable of a cached symbolic compilation to new sizes (the compiled
        backend's default: docs/dynamic-shapes.md, "One executable for every binding"); instances are built
        instead where that executable was refused."""
        return self._rebinds() if self._rebinds is not None else 0

    def as_dict(self):
        return dict(compiles=self.compiles, cache_hits=self.cache_hits, compile_seconds=self.compile_seconds,
                    recompiles=list(self.recompiles), eager_calls=self.eager_calls, calls=self.calls,
                    refreshes=self.refreshes, compilations=self.compiles, bindings=self.bindings,
                    instances=self.instances, rebinds=self.rebinds, dynamic_fallback=self.dynamic_fallback)

    def __repr__(self):
        return f"Stats({self.as_dict()})"


class _StateGuard:
    """What a compilation froze: the parameters and buffers (and, under torch.compile, the parameter
    inputs) its graph holds as constants, and each module's training flag. A call checks that every
    frozen tensor is still the same object, at the same address, at the same version (an optimizer
    step, load_state_dict and any in-place write bump it) -- else the compilation is stale."""

    def __init__(self, captured, frozen, module, attrs=()):
        slots = [captured.sources[p] for p in frozen]
        # The graph's tensor attributes (make_fx keeps a tensor the module reaches other than as its own
        # parameter or buffer -- another module's weight in a function -- as the very tensor): version
        # and address only, since where they live is unknown.
        self.tensors = [captured.example[p] for p in frozen] + [t for _, t in attrs]
        self.names = [s.name for s in slots] + [f"tensor '{n}' the module uses" for n, _ in attrs]
        owned = [(s, t) for s, t in zip(slots, self.tensors) if s.index is None]
        self.tables = [s.table for s, _ in owned]
        self.keys = [s.key for s, _ in owned]
        self.table_tensors = [t for _, t in owned]
        self.table_names = [s.name for s, _ in owned]
        self.inputs = [(s.index, t) for s, t in zip(slots, self.tensors) if s.index is not None]
        self.versions = list(map(_version, self.tensors))
        self.ptrs = list(map(_data_ptr, self.tensors))
        self.modules = list(module.modules()) if isinstance(module, torch.nn.Module) else []
        self.training = list(map(_training, self.modules))

    def stale(self, args):
        """None while the frozen state is unchanged, else what changed (one line). Each check is one
        map() over the frozen tensors (C loops: ~0.1 us per tensor in all; bench/torch_overhead.py)."""
        if list(map(_version, self.tensors)) != self.versions:
            i = next(i for i, t in enumerate(self.tensors) if t._version != self.versions[i])
            return f"{self.names[i]} changed in place (version {self.versions[i]} -> {self.tensors[i]._version})"
        if list(map(_data_ptr, self.tensors)) != self.ptrs:
            i = next(i for i, t in enumerate(self.tensors) if t.data_ptr() != self.ptrs[i])
            return f"{self.names[i]} moved to other memory"
        if not all(map(operator.is_, map(dict.get, self.tables, self.keys), self.table_tensors)):
            i = next(i for i, (tbl, k) in enumerate(zip(self.tables, self.keys))
                     if tbl.get(k) is not self.table_tensors[i])
            return f"{self.table_names[i]} was replaced by another tensor"
        for i, t in self.inputs:
            if args[i] is not t:
                return f"input {i} (frozen as a constant) is another tensor"
        if list(map(_training, self.modules)) != self.training:
            return "a module's training flag changed (train()/eval())"
        return None

    def same_objects(self, args):
        """Whether only values changed (same tensor objects, same training flags): then the captured
        graph still describes the module and a refresh needs no new capture."""
        return (all(map(operator.is_, map(dict.get, self.tables, self.keys), self.table_tensors))
                and all(args[i] is t for i, t in self.inputs)
                and list(map(_training, self.modules)) == self.training)


_version = operator.attrgetter("_version")
_training = operator.attrgetter("training")
_data_ptr = torch.Tensor.data_ptr


def _const_name(slot):
    """'layer1.0.conv1.weight' of "parameter 'layer1.0.conv1.weight'"; 'input_3' of 'input 3'."""
    return slot.name.split("'")[1] if "'" in slot.name else slot.name.replace(" ", "_")
