"""Symbolic sizes in the PyTorch front door (issue 34; docs/dynamic-shapes.md, docs/python.md "Dynamic shapes").

A size in the converter is an int or a `SymDim`: an expression over size symbols (`s0`, `64*s0`, `seq+1`)
whose arithmetic is tessel's `Dim` (src/tessel/support/sym.h, through the extension's dim_* functions).
A question a symbolic size cannot answer for every value of its symbols (`s0 == 1`, `s0 // 3`, `int(s0)`)
raises `Unsupported` naming it, so a lowering written for static shapes either computes symbolically or
refuses; it never computes with a wrong number.
"""
from . import _tessel


class Unsupported(Exception):
    """This use of the op has no lowering (it runs in PyTorch as a graph break; under dynamic shapes
    the symbolic compilation is refused with this reason)."""


def _text(v):
    """A size as the extension takes it: an int, or an expression's text."""
    return v.text if isinstance(v, SymDim) else v


def size(v):
    """The converter's size of an extension size (an int, or an expression's text)."""
    return SymDim(v) if isinstance(v, str) else v


def is_sym(v):
    return isinstance(v, SymDim)


def any_sym(values):
    return any(isinstance(v, SymDim) for v in values)


def _is_size(v):
    return isinstance(v, (int, SymDim)) and not isinstance(v, bool)


class SymDim:
    """A symbolic size: Python's int arithmetic (+, -, *, exact //, % when exact) and comparisons that
    hold for every value of the symbols (each >= 1); anything else raises Unsupported."""

    __slots__ = ("text",)

    def __init__(self, text):
        self.text = text

    def __repr__(self):
        return self.text

    __str__ = __repr__

    def __hash__(self):
        return hash(("SymDim", self.text))

    def _binary(self, op, other, reflected=False):
        if not _is_size(other):
            return NotImplemented
        a, b = (other, self) if reflected else (self, other)
        return size(_tessel.dim_binary(op, _text(a), _text(b)))

    def __add__(self, o):
        return self._binary("add", o)

    def __radd__(self, o):
        return self._binary("add", o, True)

    def __sub__(self, o):
        return self._binary("sub", o)

    def __rsub__(self, o):
        return self._binary("sub", o, True)

    def __mul__(self, o):
        return self._binary("mul", o)

    def __rmul__(self, o):
        return self._binary("mul", o, True)

    def __neg__(self):
        return size(_tessel.dim_binary("sub", 0, self.text))

    def __pos__(self):
        return self

    def _div(self, o, reflected=False):
        q = self._binary("div", o, reflected)
        if q is None:
            a, b = (o, self) if reflected else (self, o)
            raise Unsupported(f"size {a} // {b} is not exact for every value of the symbols")
        return q

    def __floordiv__(self, o):
        return self._div(o)

    def __rfloordiv__(self, o):
        return self._div(o, True)

    def __mod__(self, o):
        q = self._binary("div", o)
        if q is NotImplemented:
            return q
        if q is None:
            raise Unsupported(f"size {self} % {o} depends on the value of the symbols")
        return 0

    def __truediv__(self, o):
        raise Unsupported(f"size {self} / {o}: a symbolic size as a float")

    __rtruediv__ = __truediv__

    def _decide(self, other, op, holds, fails):
        """Whether `self op other` holds for every value of the symbols: True when holds(d) is provably
        >= 0 (d = self - other), False when one of fails(d) is, else Unsupported. (A symbolic d is never
        provably 0: equal sizes are the same expression, which == tests first.)"""
        if not _is_size(other):
            return NotImplemented
        d = self - other
        if not isinstance(d, SymDim):
            return {"==": d == 0, "!=": d != 0, "<": d < 0, "<=": d <= 0, ">": d > 0, ">=": d >= 0}[op]
        if holds is not None and _tessel.dim_nonneg(_text(holds(d))):
            return True
        if any(_tessel.dim_nonneg(_text(f(d))) for f in fails):
            return False
        raise Unsupported(f"{self} {op} {other} depends on the value of the symbols")

    def __eq__(self, o):
        if isinstance(o, SymDim) and o.text == self.text:
            return True
        return self._decide(o, "==", None, (lambda d: d - 1, lambda d: -d - 1))

    def __ne__(self, o):
        eq = self.__eq__(o)
        return eq if eq is NotImplemented else not eq

    def __lt__(self, o):
        return self._decide(o, "<", lambda d: -d - 1, (lambda d: d,))

    def __le__(self, o):
        return self._decide(o, "<=", lambda d: -d, (lambda d: d - 1,))

    def __gt__(self, o):
        return self._decide(o, ">", lambda d: d - 1, (lambda d: -d,))

    def __ge__(self, o):
        return self._decide(o, ">=", lambda d: d, (lambda d: -d - 1,))

    def __bool__(self):
        return self != 0

    def _number(self, *args):
        raise Unsupported(f"size {self} is symbolic, and this use needs a number")

    __int__ = __index__ = __float__ = _number

    def symbols(self):
        return _tessel.dim_symbols(self.text)

    def eval(self, bindings):
        return _tessel.dim_eval(self.text, bindings)


def same(a, b):
    """Whether two sizes (or lists of them) are equal for every value of the symbols: identical
    expressions, or equal numbers. Never raises: a symbolic size is not the same as any number (the
    test for a no-op: an Expand to the same sizes, a squeeze of a dim that is 1)."""
    if isinstance(a, (list, tuple)) or isinstance(b, (list, tuple)):
        return (isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)) and len(a) == len(b)
                and all(same(x, y) for x, y in zip(a, b)))
    if isinstance(a, SymDim) or isinstance(b, SymDim):
        return isinstance(a, SymDim) and isinstance(b, SymDim) and a.text == b.text
    return a == b


def broadcast_shapes(*shapes):
    """numpy's broadcast of shapes whose sizes may be symbolic: a size 1 takes the other's, equal sizes
    stay; a symbolic size against another size raises Unsupported (the symbol would have to be 1 or
    that size, a fact the trace did not give)."""
    r = max((len(s) for s in shapes), default=0)
    out = [1] * r
    for s in shapes:
        for i, d in enumerate(s, r - len(s)):
            if same(d, 1) or same(d, out[i]):
                continue
            if same(out[i], 1):
                out[i] = d
                continue
            raise Unsupported(f"shapes {[list(x) for x in shapes]} broadcast only for some sizes of the symbols")
    return out


def evaluate(v, bindings):
    """The value of a size under `bindings` ({symbol: int})."""
    return v.eval(bindings) if isinstance(v, SymDim) else v


def product(values):
    p = 1
    for v in values:
        p = p * v
    return p


# ---- torch's symbolic ints ------------------------------------------------------------------------
def sympy_expr(v):
    """The sympy expression under a torch SymInt (torch 1.13's SymIntNode, torch 2's SymInt), or None
    for anything else."""
    get_pyobj = getattr(v, "get_pyobj", None)
    if get_pyobj is not None:                   # torch 1.13: SymIntNode over a PySymInt
        obj = get_pyobj()
        env = getattr(obj, "shape_env", None)
        return env.replace(obj.expr) if env is not None else obj.expr
    node = getattr(v, "node", None)
    expr = getattr(node, "expr", None)
    if expr is not None:                        # torch 2: SymInt over a SymNode
        env = getattr(node, "shape_env", None)
        return env.replace(expr) if env is not None and hasattr(env, "replace") else expr
    expr = getattr(v, "expr", None)             # a PySymInt
    return expr


def from_sympy(expr, names=None):
    """A sympy polynomial with integer coefficients over size symbols as a size (int or SymDim); `names`
    renames symbols ({torch's name: tessel's}). Raises Unsupported for anything else (FloorDiv, Mod, a
    rational coefficient...)."""
    import sympy
    expr = sympy.expand(expr)
    if expr.is_Integer:
        return int(expr)
    syms = sorted(expr.free_symbols, key=lambda s: s.name)
    try:
        poly = sympy.Poly(expr, *syms)
    except sympy.PolynomialError:
        poly = None
    if poly is None or poly.domain != sympy.ZZ:
        raise Unsupported(f"size {expr} is not a polynomial with integer coefficients of the size symbols")
    total = 0
    for powers, coef in poly.terms():
        term = int(coef)
        for s, k in zip(syms, powers):
            name = (names or {}).get(s.name, s.name)
            for _ in range(k):
                term = term * SymDim(name)
        total = total + term
    return total


def from_torch(v, names=None):
    """A size of a traced graph (an int, or a torch SymInt over size symbols) as the converter's."""
    if isinstance(v, bool):
        raise Unsupported(f"{v!r} is not a size")
    if isinstance(v, int):
        return v
    if isinstance(v, SymDim):
        return v
    expr = sympy_expr(v)
    if expr is None:
        raise Unsupported(f"{v!r} is not a size")
    return from_sympy(expr, names)
