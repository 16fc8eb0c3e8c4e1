"""What a module returns, taken apart into its tensors and put back together on every call.

A captured graph returns tensors only; the module may return anything holding them: a tensor, tuples,
lists, dicts, a Hugging Face `ModelOutput` (an OrderedDict subclass and a dataclass), or an object
holding tensors in its attributes (transformers' `DynamicCache`: a list of layers, each with `keys` and
`values`). `flatten` walks the value once, at capture, and returns its tensors and a `Structure`;
`Structure.rebuild(tensors)` makes a new value of the same types with the new tensors in place, on every
call, so the caller gets what eager returns (never the objects of the trace, whose tensors are tracing
tensors). A value tessel cannot take apart and put back (an object without `__dict__` that may hold
tensors) is a TesselCaptureError at capture.
"""
import copy
import enum

import torch

# Leaves kept as they are: immutable values that cannot hold a tensor.
_ATOMS = (type(None), bool, int, float, complex, str, bytes, torch.dtype, torch.device, torch.Size, torch.layout,
          torch.memory_format, enum.Enum, type(Ellipsis), slice, range, type)


class Unsupported(Exception):
    """A part of the value that flatten cannot rebuild (the message says which)."""


class Structure:
    """How to rebuild a value from its tensors: `kind` is 'tensor', 'tuple' (a plain tuple of tensors:
    the fast paths of a call), or 'other'."""

    __slots__ = ("build", "count", "kind")

    def __init__(self, build, count, kind):
        self.build, self.count, self.kind = build, count, kind

    def rebuild(self, tensors):
        it = iter(tensors)
        return self.build(it)


def flatten(value, what="the output"):
    """(tensors, Structure) of `value` (tensors in depth-first order)."""
    tensors = []
    build = _walk(value, tensors, what, set())
    kind = "other"
    if isinstance(value, torch.Tensor):
        kind = "tensor"
    elif type(value) is tuple and all(isinstance(v, torch.Tensor) for v in value):
        kind = "tuple"
    return tensors, Structure(build, len(tensors), kind)


def _walk(v, tensors, what, active):
    if isinstance(v, torch.Tensor):
        tensors.append(v)
        return next
    if isinstance(v, _ATOMS) or isinstance(v, torch.nn.Module):     # (a module: returned as is, not copied)
        return lambda it, v=v: v
    if id(v) in active:
        raise Unsupported(f"{what} refers to itself (a {type(v).__name__} inside itself)")
    active.add(id(v))
    try:
        return _walk_container(v, tensors, what, active)
    finally:
        active.discard(id(v))


def _walk_container(v, tensors, what, active):
    n0 = len(tensors)
    if isinstance(v, (list, tuple)):
        parts = [_walk(x, tensors, f"{what}[{i}]", active) for i, x in enumerate(v)]
        if len(tensors) == n0:
            return lambda it, v=v: v
        t = type(v)
        if hasattr(v, "_fields"):
            return lambda it: t(*(p(it) for p in parts))      # a namedtuple
        return lambda it: t([p(it) for p in parts])           # list, tuple, torch.return_types (structseq)
    if isinstance(v, dict):
        # dict, OrderedDict and their subclasses (ModelOutput): a shallow copy with the entries
        # replaced, so the type and its other attributes stay; ModelOutput's __setitem__ keeps its
        # attributes in step with its entries.
        parts = [(k, _walk(x, tensors, f"{what}[{k!r}]", active)) for k, x in v.items()]
        attrs = _attr_parts(v, tensors, what, active, skip=set(k for k in v if isinstance(k, str)))
        if len(tensors) == n0:
            return lambda it, v=v: v

        def build_dict(it):
            new = copy.copy(v)
            for k, p in parts:
                new[k] = p(it)
            _set_attrs(new, attrs, it)
            return new
        return build_dict
    if hasattr(v, "__dict__") or hasattr(type(v), "__slots__"):
        attrs = _attr_parts(v, tensors, what, active)
        if len(tensors) == n0:
            return lambda it, v=v: v

        def build_object(it):
            new = copy.copy(v)
            _set_attrs(new, attrs, it)
            return new
        return build_object
    if callable(v):
        return lambda it, v=v: v          # a function or method: returned as is (holds no output tensor)
    raise Unsupported(f"{what} is a {type(v).__name__}, which tessel cannot take apart into tensors and rebuild")


def _attr_parts(v, tensors, what, active, skip=()):
    """[(name, builder)] for the attributes of `v` (its __dict__ and __slots__) that hold tensors."""
    names = [k for k in getattr(v, "__dict__", {}) if k not in skip]
    for cls in type(v).__mro__:
        slots = getattr(cls, "__slots__", ())
        for s in (slots,) if isinstance(slots, str) else slots:
            if s not in ("__dict__", "__weakref__") and hasattr(v, s) and s not in names:
                names.append(s)
    out = []
    for k in names:
        n0 = len(tensors)
        p = _walk(getattr(v, k), tensors, f"{what}.{k}", active)
        if len(tensors) > n0:
            out.append((k, p))
    return out


def _set_attrs(new, attrs, it):
    for k, p in attrs:
        object.__setattr__(new, k, p(it))
