"""The aten -> tessel op table: one entry per aten overload, lowering it to graph-level (ONNX-style) ops.

A lowering is `fn(L, node, *args, **kwargs)` where tensor arguments arrive as tessel value names and
everything else as captured Python values; it returns the value name (or a tuple of names for ops with
several results). Raising `Unsupported(reason)` turns the node into a graph break that runs in PyTorch
(so does an aten op with no entry). docs/python.md lists what is covered.
"""
import math

import torch

from ._dtypes import TORCH_TO_TESSEL, tessel_dtype
from ._sym import SymDim, Unsupported, any_sym, broadcast_shapes, from_torch, product, same

aten = torch.ops.aten
LOWERINGS = {}

# aten ops whose output shape depends on the data: when they run in PyTorch, their results' dims are
# unknown to tessel (the partitions after them see `?` dims).
DATA_DEPENDENT = {aten.nonzero.default, aten.masked_select.default, aten._local_scalar_dense.default}
for _name in ("_unique2", "unique_dim", "unique_consecutive"):
    if hasattr(aten, _name):
        DATA_DEPENDENT.add(getattr(aten, _name).default)


def bernoulli_mask(shape, p, dtype):
    """A tensor of `shape` whose elements are 1 with probability p, else 0: what capture puts in place of
    `empty_like(x).bernoulli_(p)` (how PyTorch's CPU dropout draws its noise). Called in PyTorch, it draws
    from PyTorch's generator exactly as that eager code does, so a compiled call that draws its masks in
    the graph's order makes the same masks as eager under the same seed (docs/training.md, "Dropout")."""
    return torch.empty(shape, dtype=dtype).bernoulli_(p)


def lowers(*overloads):
    def deco(fn):
        for o in overloads:
            if o is not None:
                LOWERINGS[o] = fn
        return fn
    return deco


def _ov(packet, name):
    """An overload if this torch has it (torch 1.13 and 2.x differ)."""
    p = getattr(aten, packet, None)
    return getattr(p, name, None) if p is not None else None


def _norm(d, rank):
    return d + rank if d < 0 else d


def _is_value(L, a):
    return isinstance(a, str)


def _scalar(L, a, like):
    """A tensor operand: a value name as is, a Python number (or a symbolic size) as a 0-d value of
    `like`'s dtype."""
    if isinstance(a, str):
        return a
    if isinstance(a, (bool, int, float, SymDim)):
        return _number(L, a, L.dtype(like))
    raise Unsupported(f"operand {a!r} is not a tensor or a number")


def _number(L, a, dtype):
    """A Python number as a 0-d constant of dtype; a symbolic size (a SymInt operand under a symbolic
    trace: `torch.arange(q) + past_length` in transformers' masks) as a 0-d size value cast to dtype."""
    if isinstance(a, SymDim):
        return _cast(L, L.scalar_size(a), dtype)
    return L.const(a, dtype)


def _operand(L, a, dtype):
    """An operand in dtype: a value name cast to it, a number or a symbolic size as a 0-d value of it."""
    return _cast(L, a, dtype) if isinstance(a, str) else _number(L, a, dtype)


def _out_dtype(node):
    tm = node.meta.get("tensor_meta")
    if not hasattr(tm, "dtype"):
        return None
    return TORCH_TO_TESSEL.get(tm.dtype)


def _cast(L, v, d):
    if L.dtype(v) == d:
        return v
    return L.op("Cast", [v], {"to": _ONNX_DTYPE[d]})


_ONNX_DTYPE = {"f32": 1, "u8": 2, "i8": 3, "i16": 5, "i32": 6, "i64": 7, "bool": 9, "f16": 10, "f64": 11, "bf16": 16}


def _binary(op):
    def lower(L, node, a, b, alpha=1):
        ref = a if isinstance(a, str) else b
        out = _out_dtype(node) or L.dtype(ref)
        a = _operand(L, a, out)
        b = _operand(L, b, out)
        if alpha != 1:
            b = L.op("Mul", [b, _number(L, alpha, out)])
        return L.op(op, [a, b])
    return lower


for _op, _names in (("Add", ("add",)), ("Sub", ("sub",)), ("Mul", ("mul",)), ("Div", ("div",))):
    for _n in _names:
        lowers(_ov(_n, "Tensor"), _ov(_n, "Scalar"))(_binary(_op))

lowers(_ov("maximum", "default"))(_binary("Max"))
lowers(_ov("minimum", "default"))(_binary("Min"))


@lowers(_ov("rsub", "Scalar"), _ov("rsub", "Tensor"))
def _rsub(L, node, a, b, alpha=1):
    """rsub(a, b, alpha) = b - alpha * a."""
    if alpha != 1:
        raise Unsupported("rsub with alpha != 1")
    return _binary("Sub")(L, node, b, a)


def _compare(op, negate=False):
    def lower(L, node, a, b):
        ref = a if isinstance(a, str) else b
        a, b = _scalar(L, a, ref), _scalar(L, b, ref)
        da, db = L.dtype(a), L.dtype(b)
        if da != db:
            common = "f32" if "f" in (da[0], db[0]) else "i64"
            a, b = _cast(L, a, common), _cast(L, b, common)
        r = L.op(op, [a, b])
        return L.op("Not", [r]) if negate else r
    return lower


for _name, _op, _neg in (("eq", "Equal", False), ("ne", "Equal", True), ("gt", "Greater", False),
                         ("ge", "GreaterOrEqual", False), ("lt", "Less", False), ("le", "LessOrEqual", False)):
    lowers(_ov(_name, "Tensor"), _ov(_name, "Scalar"))(_compare(_op, _neg))


def _unary(op, **attrs):
    def lower(L, node, x):
        return L.op(op, [x], attrs)
    return lower


for _name, _op in (("relu", "Relu"), ("sigmoid", "Sigmoid"), ("tanh", "Tanh"), ("exp", "Exp"), ("log", "Log"),
                   ("sqrt", "Sqrt"), ("neg", "Neg"), ("abs", "Abs"), ("erf", "Erf"), ("sin", "Sin"), ("cos", "Cos"),
                   ("reciprocal", "Reciprocal"), ("floor", "Floor"), ("ceil", "Ceil"), ("sign", "Sign"),
                   ("logical_not", "Not"), ("bitwise_not", "Not")):
    lowers(_ov(_name, "default"))(_unary(_op))


@lowers(_ov("rsqrt", "default"))
def _rsqrt(L, node, x):
    return L.op("Reciprocal", [L.op("Sqrt", [x])])


@lowers(_ov("silu", "default"))
def _silu(L, node, x):
    return L.op("Mul", [x, L.op("Sigmoid", [x])])


@lowers(_ov("gelu", "default"))
def _gelu(L, node, x, approximate="none"):
    return L.op("Gelu", [x], {"approximate": approximate})


@lowers(_ov("clamp", "default"), _ov("clamp_min", "default"), _ov("clamp_max", "default"), _ov("hardtanh", "default"))
def _clamp(L, node, x, lo=None, hi=None):
    if node.target is _ov("clamp_max", "default"):
        lo, hi = None, lo
    if node.target is _ov("hardtanh", "default"):
        lo = -1.0 if lo is None else lo
        hi = 1.0 if hi is None else hi
    ins = [x, L.const(lo, L.dtype(x)) if lo is not None else None, L.const(hi, L.dtype(x)) if hi is not None else None]
    return L.op("Clip", ins)


@lowers(_ov("where", "self"))
def _where(L, node, c, a, b):
    ref = a if isinstance(a, str) else b
    out = _out_dtype(node) or L.dtype(ref)
    a = _operand(L, a, out)
    b = _operand(L, b, out)
    return L.op("Where", [c, a, b])


@lowers(_ov("masked_fill", "Scalar"), _ov("masked_fill", "Tensor"))
def _masked_fill(L, node, x, mask, value):
    v = _operand(L, value, L.dtype(x))
    return L.op("Where", [mask, v, x])


# ---- matrix products -----------------------------------------------------------------------------
@lowers(_ov("mm", "default"), _ov("bmm", "default"), _ov("matmul", "default"))
def _matmul(L, node, a, b):
    return L.op("MatMul", [a, b])


@lowers(_ov("linear", "default"))
def _linear(L, node, x, w, bias=None):
    if L.rank(x) == 2 and bias is not None:
        return L.op("Gemm", [x, w, bias], {"transB": 1})
    y = L.op("MatMul", [x, L.op("Transpose", [w], {"perm": [1, 0]})])
    return L.op("Add", [y, bias]) if bias is not None else y


# ---- normalisation, softmax ----------------------------------------------------------------------
@lowers(_ov("native_layer_norm", "default"))
def _native_layer_norm(L, node, x, normalized_shape, w, b, eps):
    return tuple(_layer_norm(L, node, x, normalized_shape, w, b, eps, outputs=3))


@lowers(_ov("layer_norm", "default"))
def _layer_norm(L, node, x, normalized_shape, w=None, b=None, eps=1e-5, cudnn_enable=True, outputs=1):
    k = len(normalized_shape)
    d = L.dtype(x)
    if w is None:
        w = L.const(torch.ones(normalized_shape), d)
    ins = [x, w] + ([b] if b is not None else [])
    return L.op("LayerNormalization", ins, {"axis": -k, "epsilon": float(eps)}, outputs=outputs)


@lowers(_ov("_softmax", "default"), _ov("softmax", "int"))
def _softmax(L, node, x, dim, half_to_float=False):
    return L.op("Softmax", [x], {"axis": dim})


@lowers(_ov("_safe_softmax", "default"))
def _safe_softmax(L, node, x, dim, dtype=None):
    """PyTorch's softmax for attention (SDPA's math path on CUDA since torch 2.5): a row whose every score
    is -inf (a fully masked query) gives zeros instead of softmax's NaNs."""
    if dtype is not None:
        x = _cast(L, x, _out_dtype(node) or L.dtype(x))
    d = L.dtype(x)
    top = L.op("ReduceMax", [x, L.ints([dim])], {"keepdims": 1})
    masked = L.op("Equal", [top, L.const(float("-inf"), d)])
    return L.op("Where", [masked, L.const(0.0, d), L.op("Softmax", [x], {"axis": dim})])


@lowers(_ov("nll_loss_forward", "default"))
def _nll_loss(L, node, x, target, weight, reduction, ignore_index):
    """(loss, total_weight) of nll_loss over [N, C] log-probabilities: -x[n, target[n]], the targets equal
    to ignore_index left out (and out of the mean's count); cross_entropy = log_softmax + this."""
    if weight is not None:
        raise Unsupported("nll_loss with class weights")
    if L.rank(x) != 2 or L.rank(target) != 1:
        raise Unsupported("nll_loss over other than [N, C] scores and [N] targets")
    d = L.dtype(x)
    target = _cast(L, target, "i64")
    keep = L.op("Not", [L.op("Equal", [target, L.const(ignore_index, "i64")])])
    safe = L.op("Where", [keep, target, L.const(0, "i64")])
    picked = L.op("GatherElements", [x, L.op("Unsqueeze", [safe, L.ints([1])])], {"axis": 1})
    w = _cast(L, keep, d)
    loss = L.op("Neg", [L.op("Mul", [L.op("Squeeze", [picked, L.ints([1])]), w])])
    total = L.op("ReduceSum", [w, L.ints([0])], {"keepdims": 0})
    if reduction == 0:
        return (loss, total)
    s = L.op("ReduceSum", [loss, L.ints([0])], {"keepdims": 0})
    return (L.op("Div", [s, total]) if reduction == 1 else s, total)


@lowers(_ov("_log_softmax", "default"), _ov("log_softmax", "int"))
def _log_softmax(L, node, x, dim, half_to_float=False):
    return L.op("LogSoftmax", [x], {"axis": dim})


def _batch_norm_batch_stats(L, x, w, b, eps):
    """Training-mode batch norm: the batch's per-channel mean and biased variance over every dim but
    1, y = (x - mean) / sqrt(var + eps) * w + b; also the mean and 1 / sqrt(var + eps) as [C] (aten's
    save_mean / save_invstd, from which the capture computes the running-statistics update)."""
    r = L.rank(x)
    if r < 2:
        raise Unsupported("batch norm of a rank < 2 input")
    d = L.dtype(x)
    ch = L.shape(x)[1]
    axes = [0] + list(range(2, r))
    mean = L.op("ReduceMean", [x, L.ints(axes)], {"keepdims": 1})
    centered = L.op("Sub", [x, mean])
    var = L.op("ReduceMean", [L.op("Mul", [centered, centered]), L.ints(axes)], {"keepdims": 1})
    invstd = L.op("Div", [L.const(torch.tensor(1.0), d),
                          L.op("Sqrt", [L.op("Add", [var, L.const(torch.tensor(float(eps)), d)])])])
    shape = L.ints([ch] + [1] * (r - 2))
    y = L.op("Mul", [centered, invstd])
    y = L.op("Mul", [y, L.op("Reshape", [w, shape])]) if w is not None else y
    y = L.op("Add", [y, L.op("Reshape", [b, shape])]) if b is not None else y
    flat = L.ints([ch])
    return (y, L.op("Reshape", [mean, flat]), L.op("Reshape", [invstd, flat]))


def _batch_norm(L, node, x, w, b, mean, var, *rest):
    if node.target is _ov("native_batch_norm", "default"):
        training, momentum, eps = rest
        if training:
            return _batch_norm_batch_stats(L, x, w, b, eps)
    else:
        momentum, eps = rest
    # Eval mode saves no statistics: eager gives two empty tensors (a graph may return them)
    empty = (L.const(torch.zeros(0), L.dtype(x)), L.const(torch.zeros(0), L.dtype(x)))
    consts = [L.b.known(v) if isinstance(v, str) else None for v in (w, b, mean, var)]
    if all(c is not None for c in consts) and L.rank(x) >= 2:
        # Eval-mode statistics are constants: one per-channel scale and shift (y = x * scale + shift).
        w_, b_, m_, v_ = (torch.from_numpy(c[0].copy()).double() for c in consts)
        scale = w_ / torch.sqrt(v_ + eps)
        shift = b_ - m_ * scale
        shape = [-1] + [1] * (L.rank(x) - 2)
        d = L.dtype(x)
        y = L.op("Mul", [x, L.const(scale.reshape(shape), d)])
        return (L.op("Add", [y, L.const(shift.reshape(shape), d)]),) + empty
    return (L.op("BatchNormalization", [x, w, b, mean, var], {"epsilon": float(eps)}),) + empty


# ---- reductions -----------------------------------------------------------------------------------
def _reduce(op):
    def lower(L, node, x, dims=None, keepdim=False, dtype=None):
        if dtype is not None:
            raise Unsupported("a reduction with a dtype")
        ins = [x] if not dims else [x, L.ints(dims if isinstance(dims, (list, tuple)) else [dims])]
        return L.op(op, ins, {"keepdims": int(bool(keepdim))})
    return lower


lowers(_ov("max", "default"))(_reduce("ReduceMax"))   # x.max(): over every element
lowers(_ov("min", "default"))(_reduce("ReduceMin"))


# ---- shapes and data movement ---------------------------------------------------------------------
def _reshape(L, node, x, size, *rest):
    size = list(size)
    shape = L.shape(x)
    if any_sym(size) or any_sym(shape):
        return L.op("Reshape", [x, L.ints(_inferred_size(shape, size))])
    if any(d < 0 for d in shape):
        # Downstream of a data-dependent op: the traced size of the unknown dim is not a constant.
        tm = node.meta.get("tensor_meta")
        known = [d for d in L.shape(x) if d >= 0]
        if tm is not None and size.count(-1) == 0 and len(size) > 0:
            prod = 1
            for d in known:
                prod *= d
            fixed = [i for i, s in enumerate(size) if prod % max(s, 1) == 0 and s != 1]
            if fixed:
                size[fixed[0]] = -1
    return L.op("Reshape", [x, L.ints(size)])


def _inferred_size(shape, size):
    """A view's sizes with its -1 computed (symbolic sizes: exact division, else Unsupported)."""
    holes = [i for i, s in enumerate(size) if isinstance(s, int) and s == -1]
    if not holes:
        return size
    if len(holes) > 1:
        raise Unsupported(f"view sizes {size} with more than one -1")
    size = list(size)
    size[holes[0]] = 1
    size[holes[0]] = product(shape) // product(size)
    return size


for _o in (_ov("view", "default"), _ov("_unsafe_view", "default"), _ov("reshape", "default"),
           _ov("_reshape_alias", "default")):
    lowers(_o)(_reshape)


@lowers(_ov("t", "default"))
def _t(L, node, x):
    return x if L.rank(x) < 2 else L.op("Transpose", [x], {"perm": [1, 0]})


@lowers(_ov("transpose", "int"))
def _transpose(L, node, x, d0, d1):
    r = L.rank(x)
    perm = list(range(r))
    d0, d1 = _norm(d0, r), _norm(d1, r)
    perm[d0], perm[d1] = perm[d1], perm[d0]
    return L.op("Transpose", [x], {"perm": perm})


@lowers(_ov("permute", "default"))
def _permute(L, node, x, dims):
    r = L.rank(x)
    return L.op("Transpose", [x], {"perm": [_norm(d, r) for d in dims]})


@lowers(_ov("expand", "default"))
def _expand(L, node, x, size, implicit=False):
    shape = L.shape(x)
    size = list(size)
    off = len(size) - len(shape)
    for i, s in enumerate(size):
        if isinstance(s, int) and s == -1:
            size[i] = shape[i - off]
    if same(size, shape):
        return x
    return L.op("Expand", [x, L.ints(size)])


@lowers(_ov("clone", "default"), _ov("alias", "default"), _ov("detach", "default"), _ov("contiguous", "default"),
        _ov("lift_fresh_copy", "default"), _ov("dropout", "default"))
def _identity(L, node, x, *args, **kwargs):
    if node.target is _ov("dropout", "default") and len(args) > 1 and args[1]:
        raise Unsupported("dropout in training mode")
    return x


@lowers(_ov("_to_copy", "default"), _ov("to", "dtype"))
def _to_copy(L, node, x, dtype=None, *args, **kwargs):
    dtype = kwargs.get("dtype", dtype)
    if dtype is None or not isinstance(dtype, torch.dtype):
        return x
    return _cast(L, x, tessel_dtype(dtype, "a cast"))


@lowers(_ov("unsqueeze", "default"))
def _unsqueeze(L, node, x, dim):
    return L.op("Unsqueeze", [x, L.ints([_norm(dim, L.rank(x) + 1)])])


@lowers(_ov("squeeze", "dim"), _ov("squeeze", "default"), _ov("squeeze", "dims"))
def _squeeze(L, node, x, dim=None):
    shape = L.shape(x)
    # (a symbolic dim is never squeezed: the trace assumed, and guarded, that it is not 1)
    dims = [dim] if isinstance(dim, int) else list(dim) if dim is not None else [i for i, s in enumerate(shape)
                                                                                if same(s, 1)]
    dims = [_norm(d, len(shape)) for d in dims if same(shape[_norm(d, len(shape))], 1)]
    if not dims:
        return x
    return L.op("Squeeze", [x, L.ints(dims)])


@lowers(_ov("cat", "default"))
def _cat(L, node, xs, dim=0):
    xs = [x for x in xs if not (L.rank(x) == 1 and L.shape(x)[0] == 0)]
    return L.op("Concat", xs, {"axis": dim})


@lowers(_ov("stack", "default"))
def _stack(L, node, xs, dim=0):
    r = L.rank(xs[0]) + 1
    return L.op("Concat", [L.op("Unsqueeze", [x, L.ints([_norm(dim, r)])]) for x in xs], {"axis": _norm(dim, r)})


@lowers(_ov("select", "int"))
def _select(L, node, x, dim, index):
    return L.op("Gather", [x, L.const(index, "i64")], {"axis": dim})


@lowers(_ov("slice", "Tensor"))
def _slice(L, node, x, dim=0, start=None, end=None, step=1):
    n = L.shape(x)[_norm(dim, L.rank(x))]
    start = 0 if start is None else start
    end = (1 << 62) if end is None else end
    to_end = same(end, n) or (isinstance(end, int) and not isinstance(n, SymDim) and n >= 0 and end >= n) or \
        (isinstance(end, int) and end >= 1 << 62)
    if same(start, 0) and step == 1 and to_end:
        return x
    end = end if isinstance(end, SymDim) else min(end, 1 << 62)
    if isinstance(end, SymDim) and isinstance(n, int) and same(start, 0) and step == 1:
        # a static axis cut to a symbolic length (transformers' sdpa_attention: a static cache's mask cut
        # to the keys' length): the compilation covers lengths up to the axis, where the cut is the length
        L.narrow_symbol(end, n, _size_hint(node.args[3] if len(node.args) > 3 else node.kwargs.get("end")))
    return L.op("Slice", [x, L.ints([start]), L.ints([end]), L.ints([dim]), L.ints([step])])


def _size_hint(arg):
    """The example's value of a size argument of a captured node: an int, or the hint of the SymInt a
    symbolic trace recorded for it (None where there is none)."""
    if isinstance(arg, int) and not isinstance(arg, bool):
        return arg
    val = arg.meta.get("val") if hasattr(arg, "meta") else None
    if isinstance(val, int) and not isinstance(val, bool):
        return val
    hint = getattr(getattr(val, "node", None), "hint", None)
    return hint if isinstance(hint, int) else None


@lowers(_ov("embedding", "default"))
def _embedding(L, node, w, idx, padding_idx=-1, scale_grad_by_freq=False, sparse=False):
    return L.op("Gather", [w, idx], {"axis": 0})


@lowers(_ov("index_select", "default"))
def _index_select(L, node, x, dim, idx):
    return L.op("Gather", [x, idx], {"axis": dim})


def _index(L, node, x, indices):
    if len(indices) != 1 or indices[0] is None:
        raise Unsupported("indexing with more than one index tensor")
    idx = indices[0]
    if L.dtype(idx) == "bool":
        mshape, xshape = L.shape(idx), L.shape(x)
        if len(mshape) == 1:
            # x[mask] on the first dim: the rows where mask is true.
            nz = L.op("NonZero", [idx])
            rows = L.op("Squeeze", [nz, L.ints([0])])
            return L.op("Gather", [x, rows], {"axis": 0})
        if same(mshape, xshape):
            return _masked_select(L, node, x, idx)
        raise Unsupported("boolean indexing with a mask of another shape")
    if L.dtype(idx) not in ("i64", "i32"):
        raise Unsupported(f"indexing with {L.dtype(idx)} indices")
    return L.op("Gather", [x, idx], {"axis": 0})


@lowers(_ov("nonzero", "default"))
def _nonzero(L, node, x):
    return L.op("Transpose", [L.op("NonZero", [x])], {"perm": [1, 0]})


@lowers(_ov("masked_select", "default"))
def _masked_select(L, node, x, mask):
    xs, ms = L.shape(x), L.shape(mask)
    if not same(xs, ms):
        if any_sym(xs + ms):
            raise Unsupported("masked_select of symbolic shapes that differ")
        shape = list(torch.broadcast_shapes(tuple(xs), tuple(ms)))
        x = L.op("Expand", [x, L.ints(shape)]) if xs != shape else x
        mask = L.op("Expand", [mask, L.ints(shape)]) if ms != shape else mask
    flat = L.ints([-1])
    return L.op("Compress", [L.op("Reshape", [x, flat]), L.op("Reshape", [mask, flat])])


# ---- attention (torch 2.x) ------------------------------------------------------------------------
def _sdpa(L, node, q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, *rest, scale=None, **kwargs):
    if dropout_p:
        raise Unsupported("attention dropout")
    d = L.shape(q)[-1]
    scale = scale if scale is not None else 1.0 / math.sqrt(d)
    r = L.rank(k)
    perm = list(range(r))
    perm[-1], perm[-2] = perm[-2], perm[-1]
    s = L.op("MatMul", [q, L.op("Transpose", [k], {"perm": perm})])
    s = L.op("Mul", [s, L.const(scale, L.dtype(q))])
    if is_causal:
        s = L.op("Where", [_causal_mask(L, L.shape(q)[-2], L.shape(k)[-2]), s, L.const(float("-inf"), L.dtype(q))])
    if attn_mask is not None:
        if L.dtype(attn_mask) == "bool":
            s = L.op("Where", [attn_mask, s, L.const(float("-inf"), L.dtype(q))])
        else:
            s = L.op("Add", [s, attn_mask])
    return L.op("MatMul", [L.op("Softmax", [s], {"axis": -1}), v])


def _causal_mask(L, tq, tk):
    """The [tq, tk] lower-triangular boolean mask of causal attention (the diagonal kept): a constant, or
    for symbolic sizes a Trilu of trues expanded to them."""
    if not any_sym([tq, tk]):
        return L.const(torch.ones(tq, tk, dtype=torch.bool).tril(), "bool")
    ones = L.op("Expand", [L.const(True, "bool"), L.ints([tq, tk])])
    return L.op("Trilu", [ones, L.const(0, "i64")], {"upper": 0})


def _sdpa_tuple(L, node, q, k, v, dropout_p=0.0, is_causal=False, *rest, attn_mask=None, scale=None, **kwargs):
    # (the CPU flash kernel takes fewer key/value heads than query heads: grouped-query attention, as
    # scaled_dot_product_attention(enable_gqa=True) of a transformers llama decomposes to on torch 2.11)
    return (_sdpa_gqa(L, node, q, k, v, attn_mask, dropout_p, is_causal, scale=scale, enable_gqa=True), None)


lowers(_ov("_scaled_dot_product_flash_attention_for_cpu", "default"))(_sdpa_tuple)


# ---- what functionalization leaves of in-place ops and views (torchfront) --------------------------
# An in-place write into a view becomes `X_scatter(base, new values, view args)`, a fill becomes
# `fill`/`zero`, `t[idx] = v` becomes `index_put`; views become `X_copy` (lowered as X, _convert.py).
def _shape_of(L, x):
    """The shape of x as an i64 value: a constant when static, Shape(x) otherwise."""
    s = L.shape(x)
    return L.ints(s) if all(d >= 0 for d in s) else L.op("Shape", [x])


def _filled(L, x, v):
    """A tensor of x's shape and dtype filled with v (a number or a 0-d value)."""
    v = _operand(L, v, L.dtype(x))
    return L.op("Expand", [v, _shape_of(L, x)])


@lowers(_ov("fill", "Scalar"), _ov("fill", "Tensor"))
def _fill(L, node, x, v):
    return _filled(L, x, v)


@lowers(_ov("zero", "default"))
def _zero(L, node, x):
    return _filled(L, x, 0)


@lowers(_ov("copy", "default"))
def _copy(L, node, x, src, non_blocking=False):
    """copy(x, src): src (cast, broadcast) in x's shape and dtype."""
    return L.op("Expand", [_cast(L, src, L.dtype(x)), _shape_of(L, x)])


def _static_dim(L, x, dim):
    d = _norm(dim, L.rank(x))
    n = L.shape(x)[d]
    if isinstance(n, SymDim) or n < 0:
        raise Unsupported(f"a scatter along a {'symbolic' if isinstance(n, SymDim) else 'dynamic'} dim")
    return d, n


def _slice_range(n, start, end):
    start = 0 if start is None else start + n if start < 0 else start
    end = n if end is None else end + n if end < 0 else end
    return max(0, min(start, n)), max(0, min(end, n))


def _piece(L, x, d, start, end):
    return L.op("Slice", [x, L.ints([start]), L.ints([end]), L.ints([d]), L.ints([1])])


@lowers(_ov("slice_scatter", "default"))
def _slice_scatter(L, node, x, src, dim=0, start=None, end=None, step=1):
    """x with x[start:end:step] along dim replaced by src: the kept pieces around src, concatenated
    (step 1); ScatterElements with constant indices otherwise."""
    d, n = _static_dim(L, x, dim)
    start, end = _slice_range(n, start, end)
    src = _cast(L, src, L.dtype(x))
    if step == 1:
        parts = ([_piece(L, x, d, 0, start)] if start > 0 else []) + [src] + \
                ([_piece(L, x, d, end, n)] if end < n else [])
        return parts[0] if len(parts) == 1 else L.op("Concat", parts, {"axis": d})
    shape = _static_shape(L, src, "a strided slice_scatter")
    pos = torch.arange(start, end, step, dtype=torch.int64)
    view = [1] * len(shape)
    view[d] = -1
    idx = pos.reshape(view).expand(shape).contiguous()
    return L.op("ScatterElements", [x, L.const(idx, "i64"), src], {"axis": d})


@lowers(_ov("select_scatter", "default"))
def _select_scatter(L, node, x, src, dim, index):
    """x with x.select(dim, index) replaced by src."""
    d, n = _static_dim(L, x, dim)
    index = index + n if index < 0 else index
    row = L.op("Unsqueeze", [_cast(L, src, L.dtype(x)), L.ints([d])])
    return _slice_scatter(L, node, x, row, d, index, index + 1, 1)


def _strided_index(L, x, size, stride, offset):
    """The flat positions in x's (contiguous) storage of as_strided(x, size, stride, offset)."""
    numel = product(_static_shape(L, x, "as_strided"))
    offset = offset or 0
    idx = torch.full(list(size), offset, dtype=torch.int64)
    for k, (n, st) in enumerate(zip(size, stride)):
        view = [1] * len(size)
        view[k] = n
        idx = idx + (torch.arange(n, dtype=torch.int64) * st).reshape(view)
    if idx.numel() and (int(idx.min()) < 0 or int(idx.max()) >= numel):
        raise Unsupported(f"as_strided reads outside the tensor's {numel} elements")
    return idx


@lowers(_ov("as_strided", "default"))
def _as_strided(L, node, x, size, stride, storage_offset=None):
    """as_strided of a (contiguous, fresh) tensor: a Gather of its flat elements at constant positions."""
    idx = _strided_index(L, x, size, stride, storage_offset)
    return L.op("Gather", [L.op("Reshape", [x, L.ints([-1])]), L.const(idx, "i64")], {"axis": 0})


@lowers(_ov("as_strided_scatter", "default"))
def _as_strided_scatter(L, node, x, src, size, stride, storage_offset=None):
    idx = _strided_index(L, x, size, stride, storage_offset)
    flat = L.op("Reshape", [x, L.ints([-1])])
    upd = L.op("Reshape", [_cast(L, src, L.dtype(x)), L.ints([-1])])
    out = L.op("ScatterElements", [flat, L.const(idx.reshape(-1), "i64"), upd], {"axis": 0})
    return L.op("Reshape", [out, L.ints(L.shape(x))])


@lowers(_ov("index_put", "default"))
def _index_put(L, node, x, indices, values, accumulate=False):
    """x[idx] = values (or += with accumulate) for one index tensor: a boolean mask of x's shape is a
    Where; integer indices on the first dim are a ScatterND of whole rows."""
    if len(indices) != 1 or indices[0] is None:
        raise Unsupported("index_put with more than one index tensor")
    idx = indices[0]
    values = _cast(L, values, L.dtype(x))
    if L.dtype(idx) in ("bool", "u8"):
        if not same(L.shape(idx), L.shape(x)):
            raise Unsupported("index_put with a mask of another shape")
        mask = _cast(L, idx, "bool")
        if accumulate:
            return L.op("Add", [x, L.op("Where", [mask, values, L.const(0, L.dtype(x))])])
        return L.op("Where", [mask, values, x])
    if L.dtype(idx) not in ("i64", "i32"):
        raise Unsupported(f"index_put with {L.dtype(idx)} indices")
    xs, js = _static_shape(L, x, "index_put"), _static_shape(L, idx, "index_put")
    idx = _cast(L, idx, "i64")
    # Negative indices count from the end, as in PyTorch.
    idx = L.op("Where", [L.op("Less", [idx, L.const(0, "i64")]), L.op("Add", [idx, L.const(xs[0], "i64")]), idx])
    rows = L.op("Expand", [values, L.ints(list(js) + list(xs[1:]))])
    return L.op("ScatterND", [x, L.op("Unsqueeze", [idx, L.ints([-1])]), rows],
                {"reduction": "add" if accumulate else "none"})
# =================================================================================================
# Coverage for real model families (issue 13): torchvision, timm and transformers emit these. Each
# lowering is checked against PyTorch eager in tests/python/test_aten_lowerings.py.
# =================================================================================================
def _live_nodes(graph):
    """The nodes the graph's output depends on (make_fx keeps results nothing reads); computed once
    per graph, by a walk from the output (iterative: densenet's chains are thousands deep)."""
    live = getattr(graph, "_tessel_live", None)
    if live is None:
        live, stack = set(), [n for n in graph.nodes if n.op == "output"]
        while stack:
            n = stack.pop()
            if n not in live:
                live.add(n)
                stack.extend(n.all_input_nodes)
        graph._tessel_live = live
    return live


def _used_outputs(node):
    """Which results of a multi-output node the output depends on (getitem indices of its users)."""
    used, live = set(), _live_nodes(node.graph)
    for u in node.users:
        if u not in live:
            continue
        if u.op == "call_function" and len(u.args) == 2 and isinstance(u.args[1], int):
            used.add(u.args[1])
        else:
            return None          # used as a whole (a tuple): every result
    return used


def _only_first_used(node, what):
    used = _used_outputs(node)
    if used is None or used - {0}:
        raise Unsupported(f"{what} is used")


def _static_shape(L, x, what):
    s = L.shape(x)
    if any_sym(s):
        raise Unsupported(f"{what} of a tensor with a symbolic shape {s}")
    if any(d < 0 for d in s):
        raise Unsupported(f"{what} of a tensor with a data-dependent shape")
    return s


def _static_tail(L, x, k, what):
    """The last k dims of x, which must be static (pooling windows): the dims before them may be symbolic."""
    s = L.shape(x)[-k:]
    if any_sym(s):
        raise Unsupported(f"{what} over symbolic spatial dims {s}")
    if any(d < 0 for d in s):
        raise Unsupported(f"{what} of a tensor with a data-dependent shape")
    return s


def _meta_shape(node, L=None):
    """The traced shape of a node's result (ints, and SymDims under a symbolic trace), or None."""
    tm = node.meta.get("tensor_meta")
    if hasattr(tm, "shape"):
        shape = tm.shape
    else:
        val = node.meta.get("val")
        if not isinstance(val, torch.Tensor):
            return None
        shape = val.shape
    return [d if isinstance(d, int) else from_torch(d, L.sym_names if L is not None else None) for d in shape]


def _meta_torch_dtype(node):
    tm = node.meta.get("tensor_meta")
    if hasattr(tm, "dtype"):
        return tm.dtype
    val = node.meta.get("val")
    return val.dtype if isinstance(val, torch.Tensor) else None


def _created(L, node, value):
    """A constant with the node's traced shape and dtype, every element `value` (creation ops: their
    result depends only on shapes, which are static here)."""
    shape, dt = _meta_shape(node, L), _meta_torch_dtype(node)
    if shape is None or dt is None:
        raise Unsupported("output type unknown")
    d = tessel_dtype(dt, "a created tensor")
    if any_sym(shape):
        return L.op("Expand", [_number(L, value, d), L.ints(shape)])
    return L.const(torch.full(shape, value, dtype=dt), d)


def _dims(dims, rank):
    if dims is None:
        return list(range(rank))
    dims = [dims] if isinstance(dims, int) else list(dims)
    return [_norm(d, rank) for d in dims] if dims else list(range(rank))


# ---- creation: new_* / *_like / empty ----------------------------------------------
for _o in (_ov("new_zeros", "default"), _ov("zeros_like", "default"), _ov("new_empty", "default"),
           _ov("empty_like", "default"), _ov("empty", "memory_format"), _ov("new_empty_strided", "default"),
           _ov("empty_strided", "default"), _ov("zeros", "default")):
    lowers(_o)(lambda L, node, *a, **k: _created(L, node, 0))
for _o in (_ov("new_ones", "default"), _ov("ones_like", "default"), _ov("ones", "default")):
    lowers(_o)(lambda L, node, *a, **k: _created(L, node, 1))


@lowers(_ov("new_full", "default"), _ov("full_like", "default"), _ov("full", "default"))
def _full(L, node, x, *args, **kwargs):
    # new_full(self, size, fill_value), full_like(self, fill_value), full(size, fill_value)
    value = args[1] if node.target is _ov("new_full", "default") else args[0]
    if isinstance(value, str):
        raise Unsupported("a fill value that is a tensor")
    return _created(L, node, value)


@lowers(_ov("arange", "default"), _ov("arange", "start"), _ov("arange", "start_step"))
def _arange(L, node, *args, **kwargs):
    """arange(end), arange(start, end), arange(start, end, step) with a symbolic size among them (static
    ones are folded to constants before lowering): a Range over Sizes scalars."""
    start, end, step = (0, args[0], 1) if len(args) == 1 else (args[0], args[1], 1) if len(args) == 2 else args[:3]
    integral = all(isinstance(v, (int, SymDim)) for v in (start, end, step))
    # (torch 1.13's symbolic trace types arange of a SymInt as float; eager gives int64 for integers)
    dt = kwargs.get("dtype") or (torch.int64 if integral else _meta_torch_dtype(node))
    d = tessel_dtype(dt, "arange")
    if not any_sym([start, end, step]):
        return L.const(torch.arange(start, end, step, dtype=dt), d)
    if not all(isinstance(v, (int, SymDim)) and not isinstance(v, bool) for v in (start, end, step)):
        raise Unsupported(f"arange({start}, {end}, {step}) mixing a symbolic size with floats")
    r = L.op("Range", [L.scalar_size(start), L.scalar_size(end), L.scalar_size(step)])
    return _cast(L, r, d)


# ---- activations ---------------------------------------------------------------------------------
lowers(_ov("hardswish", "default"))(_unary("HardSwish"))
lowers(_ov("hardsigmoid", "default"))(_unary("HardSigmoid", alpha=1.0 / 6, beta=0.5))
lowers(_ov("mish", "default"))(_unary("Mish"))
for _name, _op in (("log1p", None), ("expm1", None), ("trunc", None), ("round", "Round"), ("tan", "Tan"),
                   ("asin", "Asin"), ("acos", "Acos"), ("atan", "Atan"), ("sinh", "Sinh"), ("cosh", "Cosh"),
                   ("asinh", "Asinh"), ("acosh", "Acosh"), ("atanh", "Atanh"), ("isnan", "IsNaN"),
                   ("sgn", "Sign")):
    if _op:
        lowers(_ov(_name, "default"))(_unary(_op))


@lowers(_ov("isinf", "default"))
def _isinf(L, node, x):
    return L.op("IsInf", [x])


@lowers(_ov("log1p", "default"))
def _log1p(L, node, x):
    return L.op("Log", [L.op("Add", [x, L.const(1, L.dtype(x))])])


@lowers(_ov("expm1", "default"))
def _expm1(L, node, x):
    return L.op("Sub", [L.op("Exp", [x]), L.const(1, L.dtype(x))])


@lowers(_ov("log2", "default"), _ov("log10", "default"))
def _log_base(L, node, x):
    base = 2.0 if node.target is _ov("log2", "default") else 10.0
    return L.op("Mul", [L.op("Log", [x]), L.const(1.0 / math.log(base), L.dtype(x))])


@lowers(_ov("trunc", "default"))
def _trunc(L, node, x):
    # toward zero: floor of |x|, with x's sign
    return L.op("Mul", [L.op("Sign", [x]), L.op("Floor", [L.op("Abs", [x])])])


@lowers(_ov("frac", "default"))
def _frac(L, node, x):
    return L.op("Sub", [x, _trunc(L, node, x)])


@lowers(_ov("softplus", "default"))
def _softplus(L, node, x, beta=1, threshold=20):
    """torch: x where beta*x > threshold (linear), else log(1 + exp(beta*x)) / beta."""
    d = L.dtype(x)
    bx = x if beta == 1 else L.op("Mul", [x, L.const(beta, d)])
    sp = L.op("Softplus", [bx])
    if beta != 1:
        sp = L.op("Div", [sp, L.const(beta, d)])
    return L.op("Where", [L.op("Greater", [bx, L.const(threshold, d)]), x, sp])


@lowers(_ov("elu", "default"))
def _elu(L, node, x, alpha=1.0, scale=1.0, input_scale=1.0):
    d = L.dtype(x)
    xi = x if input_scale == 1 else L.op("Mul", [x, L.const(input_scale, d)])
    neg = L.op("Mul", [L.op("Sub", [L.op("Exp", [L.op("Min", [xi, L.const(0, d)])]), L.const(1, d)]), L.const(alpha, d)])
    y = L.op("Where", [L.op("Greater", [x, L.const(0, d)]), x, neg])
    return y if scale == 1 else L.op("Mul", [y, L.const(scale, d)])


@lowers(_ov("celu", "default"))
def _celu(L, node, x, alpha=1.0):
    return L.op("Celu", [x], {"alpha": float(alpha)})


@lowers(_ov("selu", "default"))
def _selu(L, node, x):
    return L.op("Selu", [x], {"alpha": 1.6732632423543772, "gamma": 1.0507009873554805})


@lowers(_ov("leaky_relu", "default"))
def _leaky_relu(L, node, x, slope=0.01):
    return L.op("LeakyRelu", [x], {"alpha": float(slope)})


@lowers(_ov("prelu", "default"), _ov("_prelu_kernel", "default"))
def _prelu(L, node, x, w):
    r = L.rank(x)
    if L.rank(w) == 1 and r >= 2 and L.shape(w)[0] != 1:
        w = L.op("Reshape", [w, L.ints([-1] + [1] * (r - 2))])
    return L.op("PRelu", [x, w])


@lowers(_ov("threshold", "default"))
def _threshold(L, node, x, threshold, value):
    d = L.dtype(x)
    return L.op("Where", [L.op("Greater", [x, L.const(threshold, d)]), x, L.const(value, d)])


@lowers(_ov("log_sigmoid_forward", "default"))
def _log_sigmoid_forward(L, node, x):
    _only_first_used(node, "log_sigmoid's buffer")
    d = L.dtype(x)
    # log(sigmoid(x)) = min(x, 0) - log1p(exp(-|x|)), stable for large |x|
    t = L.op("Log", [L.op("Add", [L.op("Exp", [L.op("Neg", [L.op("Abs", [x])])]), L.const(1, d)])])
    return (L.op("Sub", [L.op("Min", [x, L.const(0, d)]), t]), None)


@lowers(_ov("glu", "default"))
def _glu(L, node, x, dim=-1):
    a, b = _halves(L, x, dim)
    return L.op("Mul", [a, L.op("Sigmoid", [b])])


def _halves(L, x, dim):
    n = L.shape(x)[_norm(dim, L.rank(x))]
    return L.op("Split", [x, L.ints([n // 2, n // 2])], {"axis": dim}, outputs=2)


# ---- elementwise binary and ternary --------------------------------------------------------------
lowers(_ov("max", "other"))(_binary("Max"))
lowers(_ov("min", "other"))(_binary("Min"))
lowers(_ov("fmax", "default"))(_binary("Max"))
lowers(_ov("fmin", "default"))(_binary("Min"))


def _logical(op):
    def lower(L, node, a, b):
        ref = a if isinstance(a, str) else b
        a, b = _scalar(L, a, ref), _scalar(L, b, ref)
        return L.op(op, [_bool(L, a), _bool(L, b)])
    return lower


def _bool(L, v):
    if L.dtype(v) == "bool":
        return v
    return L.op("Not", [L.op("Equal", [v, L.const(0, L.dtype(v))])])


for _name, _op in (("logical_and", "And"), ("logical_or", "Or"), ("logical_xor", "Xor")):
    lowers(_ov(_name, "default"))(_logical(_op))


def _bitwise(bool_op, int_op):
    def lower(L, node, a, b):
        ref = a if isinstance(a, str) else b
        a, b = _scalar(L, a, ref), _scalar(L, b, ref)
        if L.dtype(a) == "bool" and L.dtype(b) == "bool":
            return L.op(bool_op, [a, b])
        out = _out_dtype(node) or L.dtype(ref)
        return L.op(int_op, [_cast(L, a, out), _cast(L, b, out)])
    return lower


for _name, _bop, _iop in (("bitwise_and", "And", "BitwiseAnd"), ("bitwise_or", "Or", "BitwiseOr"),
                          ("bitwise_xor", "Xor", "BitwiseXor")):
    lowers(_ov(_name, "Tensor"), _ov(_name, "Scalar"))(_bitwise(_bop, _iop))


@lowers(_ov("div", "Tensor_mode"), _ov("div", "Scalar_mode"), _ov("floor_divide", "default"),
        _ov("floor_divide", "Scalar"))
def _div_mode(L, node, a, b, rounding_mode="floor"):
    if node.target in (_ov("floor_divide", "default"), _ov("floor_divide", "Scalar")):
        rounding_mode = "floor"
    out = _out_dtype(node)
    ref = a if isinstance(a, str) else b
    if rounding_mode is None:
        return _binary("Div")(L, node, a, b)
    # integer or float: divide in f64 (exact for the i32 range, and for i64 quotients below 2**53), round
    a = _cast(L, _scalar(L, a, ref), "f64")
    b = _cast(L, _scalar(L, b, ref), "f64")
    q = L.op("Div", [a, b])
    q = L.op("Floor", [q]) if rounding_mode == "floor" else _trunc(L, node, q)
    return _cast(L, q, out or L.dtype(ref))


@lowers(_ov("remainder", "Tensor"), _ov("remainder", "Scalar"), _ov("fmod", "Tensor"), _ov("fmod", "Scalar"))
def _remainder(L, node, a, b):
    ref = a if isinstance(a, str) else b
    out = _out_dtype(node) or L.dtype(ref)
    a, b = _cast(L, _scalar(L, a, ref), out), _cast(L, _scalar(L, b, ref), out)
    if node.target in (_ov("fmod", "Tensor"), _ov("fmod", "Scalar")):
        return L.op("Mod", [a, b], {"fmod": 1})         # C's fmod: the dividend's sign
    if out[0] != "f":
        return L.op("Mod", [a, b], {"fmod": 0})         # Python's %: the divisor's sign
    return L.op("Sub", [a, L.op("Mul", [L.op("Floor", [L.op("Div", [a, b])]), b])])


@lowers(_ov("pow", "Scalar"))
def _pow_scalar(L, node, base, e):
    out = _out_dtype(node) or L.dtype(e)
    return L.op("Pow", [L.const(base, out), _cast(L, e, out)])


@lowers(_ov("pow", "Tensor_Scalar"), _ov("pow", "Tensor_Tensor"))
def _pow(L, node, x, e):
    out = _out_dtype(node) or L.dtype(x)
    x = _cast(L, x, out)
    if e == 2:
        return L.op("Mul", [x, x])
    if e == 0.5:
        return L.op("Sqrt", [x])
    if e == 1:
        return x
    return L.op("Pow", [x, _operand(L, e, out)])


@lowers(_ov("clamp", "Tensor"), _ov("clamp_min", "Tensor"), _ov("clamp_max", "Tensor"))
def _clamp_tensor(L, node, x, lo=None, hi=None):
    if node.target is _ov("clamp_max", "Tensor"):
        lo, hi = None, lo
    d = _out_dtype(node) or L.dtype(x)
    x = _cast(L, x, d)
    if lo is not None:
        x = L.op("Max", [x, _operand(L, lo, d)])
    if hi is not None:
        x = L.op("Min", [x, _operand(L, hi, d)])
    return x


@lowers(_ov("where", "ScalarOther"), _ov("where", "ScalarSelf"), _ov("where", "Scalar"))
def _where_scalars(L, node, c, a, b):
    return _where(L, node, c, a, b)


@lowers(_ov("addcmul", "default"), _ov("addcdiv", "default"))
def _addc(L, node, x, t1, t2, value=1):
    op = "Mul" if node.target is _ov("addcmul", "default") else "Div"
    p = L.op(op, [t1, t2])
    if value != 1:
        p = L.op("Mul", [p, L.const(value, L.dtype(x))])
    return L.op("Add", [x, p])


@lowers(_ov("lerp", "Scalar"), _ov("lerp", "Tensor"))
def _lerp(L, node, a, b, w):
    w = _operand(L, w, L.dtype(a))
    return L.op("Add", [a, L.op("Mul", [w, L.op("Sub", [b, a])])])


# ---- matrix products -----------------------------------------------------------------------------
@lowers(_ov("baddbmm", "default"))
def _baddbmm(L, node, x, a, b, beta=1, alpha=1):
    d = L.dtype(x)
    p = L.op("MatMul", [a, b])
    if alpha != 1:
        p = L.op("Mul", [p, L.const(alpha, d)])
    if beta == 0:
        return p
    x = x if beta == 1 else L.op("Mul", [x, L.const(beta, d)])
    return L.op("Add", [x, p])


@lowers(_ov("addmm", "default"))
def _addmm(L, node, bias, a, b, beta=1, alpha=1):
    if L.rank(bias) <= 2 and beta != 0:
        return L.op("Gemm", [a, b, bias], {"alpha": float(alpha), "beta": float(beta)})
    return _baddbmm(L, node, bias, a, b, beta, alpha)


@lowers(_ov("mv", "default"), _ov("dot", "default"))
def _mv(L, node, a, b):
    return L.op("MatMul", [a, b])


@lowers(_ov("einsum", "default"))
def _einsum(L, node, equation, operands, path=None):
    return L.op("Einsum", list(operands), {"equation": equation.replace(" ", "")})


@lowers(_ov("convolution", "default"))
def _convolution(L, node, x, w, b, stride, padding, dilation, transposed, output_padding, groups):
    pads = list(padding) + list(padding)
    ins = [x, w] + ([b] if b is not None else [])
    attrs = {"strides": list(stride), "pads": pads, "dilations": list(dilation), "group": groups}
    if transposed:
        attrs["output_padding"] = list(output_padding)
        return L.op("ConvTranspose", ins, attrs)
    return L.op("Conv", ins, attrs)


# ---- reductions ----------------------------------------------------------------------------------
def _reduce_typed(op):
    def lower(L, node, x, dims=None, keepdim=False, dtype=None):
        if dtype is not None:
            x = _cast(L, x, tessel_dtype(dtype, "a reduction's dtype"))
        elif L.dtype(x) in ("bool", "u8", "i8", "i16", "i32") and op in ("ReduceSum", "ReduceProd"):
            x = _cast(L, x, "i64")          # torch sums integers and bools in i64
        if isinstance(dims, (list, tuple)) and len(dims) == 0:
            dims = None
        ins = [x] if dims is None else [x, L.ints(dims if isinstance(dims, (list, tuple)) else [dims])]
        return L.op(op, ins, {"keepdims": int(bool(keepdim))})
    return lower


lowers(_ov("sum", "dim_IntList"), _ov("sum", "default"))(_reduce_typed("ReduceSum"))
lowers(_ov("mean", "dim"), _ov("mean", "default"))(_reduce_typed("ReduceMean"))
lowers(_ov("prod", "dim_int"), _ov("prod", "default"))(_reduce_typed("ReduceProd"))
lowers(_ov("logsumexp", "default"))(_reduce_typed("ReduceLogSumExp"))


@lowers(_ov("amax", "default"), _ov("amin", "default"))
def _amax(L, node, x, dims=(), keepdim=False):
    op = "ReduceMax" if node.target is _ov("amax", "default") else "ReduceMin"
    return _reduce_typed(op)(L, node, x, list(dims) or None, keepdim)


@lowers(_ov("any", "default"), _ov("any", "dim"), _ov("any", "dims"), _ov("all", "default"), _ov("all", "dim"),
        _ov("all", "dims"))
def _any_all(L, node, x, dims=None, keepdim=False):
    op = "ReduceMax" if node.target in (_ov("any", "default"), _ov("any", "dim"), _ov("any", "dims")) else "ReduceMin"
    f = _cast(L, _bool(L, x), "f32")
    r = _reduce_typed(op)(L, node, f, dims, keepdim)
    return _cast(L, r, "bool")


def _arg_reduce(op):
    def lower(L, node, x, dim=None, keepdim=False):
        if dim is None:
            x = L.op("Reshape", [x, L.ints([-1])])
            r = L.op(op, [x], {"axis": 0, "keepdims": 0})
            return L.op("Reshape", [r, L.ints([1] * len(_meta_shape(node, L) or []))]) if keepdim else r
        return L.op(op, [x], {"axis": dim, "keepdims": int(bool(keepdim))})
    return lower


lowers(_ov("argmax", "default"))(_arg_reduce("ArgMax"))
lowers(_ov("argmin", "default"))(_arg_reduce("ArgMin"))


@lowers(_ov("max", "dim"), _ov("min", "dim"))
def _max_dim(L, node, x, dim, keepdim=False):
    big = node.target is _ov("max", "dim")
    v = L.op("ReduceMax" if big else "ReduceMin", [x, L.ints([dim])], {"keepdims": int(bool(keepdim))})
    used = _used_outputs(node)
    i = None
    if used is None or 1 in used:
        i = L.op("ArgMax" if big else "ArgMin", [x], {"axis": dim, "keepdims": int(bool(keepdim))})
    return (v, i)


def _var_parts(L, node, x, dims, correction, keepdim):
    shape = _static_shape(L, x, "var/std")
    ds = _dims(dims, len(shape))
    n = 1
    for d in ds:
        n *= shape[d]
    m = L.op("ReduceMean", [x, L.ints(ds)], {"keepdims": 1})
    dev = L.op("Sub", [x, m])
    ss = L.op("ReduceSum", [L.op("Mul", [dev, dev]), L.ints(ds)], {"keepdims": int(bool(keepdim))})
    c = 1 if correction is None else correction
    var = L.op("Div", [ss, L.const(max(n - c, 0), L.dtype(x))])
    mean = m if keepdim else L.op("Squeeze", [m, L.ints(ds)])
    return var, mean


def _var_args(node, args, kwargs):
    """(dims, correction, keepdim) of var/std overloads: .correction(x, dim, *, correction, keepdim),
    .dim(x, dim, unbiased, keepdim), .default(x, unbiased)."""
    name = node.target._overloadname
    if name == "correction":
        dims = args[0] if args else kwargs.get("dim")
        correction = kwargs.get("correction", args[1] if len(args) > 1 else None)
        keepdim = kwargs.get("keepdim", args[2] if len(args) > 2 else False)
    elif name == "dim":
        dims = args[0] if args else kwargs.get("dim")
        unbiased = args[1] if len(args) > 1 else kwargs.get("unbiased", True)
        correction = 1 if unbiased else 0
        keepdim = args[2] if len(args) > 2 else kwargs.get("keepdim", False)
    else:
        dims, keepdim = None, False
        correction = 1 if (args[0] if args else kwargs.get("unbiased", True)) else 0
    return dims, correction, keepdim


def _variance(kind):
    def lower(L, node, x, *args, **kwargs):
        dims, correction, keepdim = _var_args(node, args, kwargs)
        var, mean = _var_parts(L, node, x, dims, correction, keepdim)
        out = L.op("Sqrt", [var]) if kind.startswith("std") else var
        return (out, mean) if kind.endswith("_mean") else out
    return lower


for _kind in ("var", "std", "var_mean", "std_mean"):
    for _o in ("correction", "dim", "default"):
        lowers(_ov(_kind, _o))(_variance(_kind))


@lowers(_ov("norm", "ScalarOpt_dim"), _ov("norm", "Scalar"), _ov("linalg_vector_norm", "default"),
        _ov("norm", "ScalarOpt_dim_dtype"))
def _vector_norm(L, node, x, p=2, dims=None, keepdim=False, *rest, dtype=None):
    p = 2 if p is None else p
    if dtype is not None:
        x = _cast(L, x, tessel_dtype(dtype, "a norm's dtype"))
    if isinstance(dims, (list, tuple)) and not dims:
        dims = None
    ins = [x] if dims is None else [x, L.ints(dims if isinstance(dims, (list, tuple)) else [dims])]
    attrs = {"keepdims": int(bool(keepdim))}
    if p == 2:
        return L.op("ReduceL2", ins, attrs)
    if p == 1:
        return L.op("ReduceL1", ins, attrs)
    a = L.op("Abs", [x])
    if p == float("inf"):
        return L.op("ReduceMax", [a] + ins[1:], attrs)
    if p == float("-inf"):
        return L.op("ReduceMin", [a] + ins[1:], attrs)
    if p == 0:
        nz = _cast(L, _bool(L, x), L.dtype(x))
        return L.op("ReduceSum", [nz] + ins[1:], attrs)
    d = L.dtype(x)
    s = L.op("ReduceSum", [L.op("Pow", [a, L.const(p, d)])] + ins[1:], attrs)
    return L.op("Pow", [s, L.const(1.0 / p, d)])


@lowers(_ov("cumsum", "default"), _ov("cumprod", "default"))
def _cumsum(L, node, x, dim, dtype=None):
    if dtype is not None:
        x = _cast(L, x, tessel_dtype(dtype, "cumsum's dtype"))
    elif L.dtype(x) in ("bool", "u8", "i8", "i16", "i32"):
        x = _cast(L, x, "i64")
    op = "CumSum" if node.target is _ov("cumsum", "default") else "CumProd"
    return L.op(op, [x, L.const(_norm(dim, L.rank(x)), "i64")])


@lowers(_ov("topk", "default"))
def _topk(L, node, x, k, dim=-1, largest=True, sorted=True):
    if not sorted:
        raise Unsupported("topk with sorted=False (the order is unspecified in PyTorch)")
    v, i = L.op("TopK", [x, L.ints([k])], {"axis": dim, "largest": int(bool(largest)), "sorted": 1}, outputs=2)
    return (v, i)


@lowers(_ov("sort", "default"), _ov("sort", "stable"))
def _sort(L, node, x, *args, **kwargs):
    if node.target is _ov("sort", "stable"):
        dim, descending = kwargs.get("dim", -1), kwargs.get("descending", False)
    else:
        dim = args[0] if args else kwargs.get("dim", -1)
        descending = args[1] if len(args) > 1 else kwargs.get("descending", False)
    n = _static_shape(L, x, "sort")[_norm(dim, L.rank(x))]
    v, i = L.op("TopK", [x, L.ints([n])], {"axis": dim, "largest": int(bool(descending)), "sorted": 1}, outputs=2)
    return (v, i)


# ---- normalisation -------------------------------------------------------------------------------
@lowers(_ov("native_group_norm", "default"))
def _native_group_norm(L, node, x, w, b, n, c, hw, groups, eps):
    _only_first_used(node, "group norm's mean/rstd")
    return (_group_norm(L, node, x, groups, w, b, eps), None, None)


@lowers(_ov("group_norm", "default"))
def _group_norm(L, node, x, groups, w=None, b=None, eps=1e-5, cudnn=True):
    ch = L.shape(x)[1]
    d = L.dtype(x)
    w = w if w is not None else L.const(torch.ones(ch), d)
    b = b if b is not None else L.const(torch.zeros(ch), d)
    return L.op("GroupNormalization", [x, w, b], {"num_groups": int(groups), "epsilon": float(eps)})


@lowers(_ov("_native_batch_norm_legit", "default"), _ov("_native_batch_norm_legit", "no_stats"))
def _batch_norm_legit(L, node, x, w, b, *rest):
    if node.target is _ov("_native_batch_norm_legit", "no_stats"):
        _, _, eps = rest
        return _batch_norm_batch_stats(L, x, w, b, eps)
    mean, var, training, momentum, eps = rest
    if training:
        return _batch_norm_batch_stats(L, x, w, b, eps)
    return _batch_norm_eval(L, node, x, w, b, mean, var, momentum, eps)


@lowers(_ov("_native_batch_norm_legit_functional", "default"))
def _batch_norm_functional(L, node, x, w, b, rm, rv, training, momentum, eps):
    """torch 2's functional training-mode batch norm: batch statistics, and the new running statistics
    as results (PyTorch's update: momentum, unbiased variance)."""
    if not training:
        raise Unsupported("functional batch norm in eval mode")
    y, mean, invstd = _batch_norm_batch_stats(L, x, w, b, eps)
    d = L.dtype(x)
    count = 1
    for i, s in enumerate(L.shape(x)):
        count *= s if i != 1 else 1
    k = lambda v: L.const(torch.tensor(float(v)), d)
    var = L.op("Sub", [L.op("Div", [k(1.0), L.op("Mul", [invstd, invstd])]), k(eps)])
    new_rm = L.op("Add", [L.op("Mul", [rm, k(1.0 - momentum)]), L.op("Mul", [mean, k(momentum)])])
    new_rv = L.op("Add", [L.op("Mul", [rv, k(1.0 - momentum)]),
                          L.op("Mul", [var, k(momentum * count / max(count - 1, 1))])])
    return (y, mean, invstd, new_rm, new_rv)


@lowers(_ov("native_batch_norm", "default"), _ov("_native_batch_norm_legit_no_training", "default"))
def _batch_norm_eval(L, node, x, w, b, mean, var, *rest):
    """Eval-mode batch norm; a missing weight or bias (affine=False) is ones / zeros."""
    ch = L.shape(x)[1]
    d = L.dtype(x)
    w = w if w is not None else L.const(torch.ones(ch), d)
    b = b if b is not None else L.const(torch.zeros(ch), d)
    if node.target is _ov("native_batch_norm", "default") and rest and rest[0]:
        return _batch_norm(L, node, x, w, b, mean, var, *rest)      # training: batch statistics
    if mean is None or var is None:
        raise Unsupported("batch norm without running statistics")
    return _batch_norm(L, node, x, w, b, mean, var, *rest)


@lowers(_ov("_fused_rms_norm", "default"), _ov("rms_norm", "default"))
def _rms_norm(L, node, x, normalized_shape, w=None, eps=None):
    if node.target is _ov("_fused_rms_norm", "default"):
        _only_first_used(node, "rms norm's rstd")
    d = L.dtype(x)
    if eps is None:
        eps = torch.finfo(_meta_torch_dtype(node.all_input_nodes[0]) or torch.float32).eps
    k = len(normalized_shape)
    ms = L.op("ReduceMean", [L.op("Mul", [x, x]), L.ints(list(range(-k, 0)))], {"keepdims": 1})
    y = L.op("Mul", [x, L.op("Reciprocal", [L.op("Sqrt", [L.op("Add", [ms, L.const(eps, d)])])])])
    if w is not None:
        y = L.op("Mul", [y, w])
    return (y, None) if node.target is _ov("_fused_rms_norm", "default") else y


# ---- shapes and data movement --------------------------------------------------------------------
@lowers(_ov("constant_pad_nd", "default"))
def _constant_pad_nd(L, node, x, pad, value=0):
    return _pad(L, x, pad, "constant", value)


def _pad(L, x, pad, mode, value=0):
    """torch's pad list runs from the last dim backwards (before, after) pairs; ONNX's is all begins
    then all ends over every dim."""
    r = L.rank(x)
    pad = list(pad)
    begins, ends = [0] * r, [0] * r
    for i in range(len(pad) // 2):
        begins[r - 1 - i], ends[r - 1 - i] = pad[2 * i], pad[2 * i + 1]
    if not any(begins) and not any(ends):
        return x
    ins = [x, L.ints(begins + ends)]
    if mode == "constant":
        ins.append(L.const(value, L.dtype(x)))
    return L.op("Pad", ins, {"mode": mode})


for _o, _mode in ((_ov("reflection_pad1d", "default"), "reflect"), (_ov("reflection_pad2d", "default"), "reflect"),
                  (_ov("reflection_pad3d", "default"), "reflect"), (_ov("replication_pad1d", "default"), "edge"),
                  (_ov("replication_pad2d", "default"), "edge"), (_ov("replication_pad3d", "default"), "edge")):
    lowers(_o)(lambda L, node, x, pad, _mode=_mode: _pad(L, x, pad, _mode))


@lowers(_ov("roll", "default"))
def _roll(L, node, x, shifts, dims=()):
    shifts = [shifts] if isinstance(shifts, int) else list(shifts)
    dims = [dims] if isinstance(dims, int) else list(dims)
    shape = _static_shape(L, x, "roll")
    if not dims:
        flat = L.op("Reshape", [x, L.ints([-1])])
        return L.op("Reshape", [_roll_dim(L, flat, shifts[0], 0, _numel(shape)), L.ints(shape)])
    for s, d in zip(shifts, dims):
        d = _norm(d, len(shape))
        x = _roll_dim(L, x, s, d, shape[d])
    return x


def _numel(shape):
    n = 1
    for s in shape:
        n *= s
    return n


def _roll_dim(L, x, shift, dim, n):
    s = shift % n if n else 0
    if s == 0:
        return x
    tail = L.op("Slice", [x, L.ints([n - s]), L.ints([n]), L.ints([dim])])
    head = L.op("Slice", [x, L.ints([0]), L.ints([n - s]), L.ints([dim])])
    return L.op("Concat", [tail, head], {"axis": dim})


@lowers(_ov("flip", "default"))
def _flip(L, node, x, dims):
    shape = _static_shape(L, x, "flip")
    ds = [_norm(d, len(shape)) for d in dims]
    if not ds:
        return x
    return L.op("Slice", [x, L.ints([shape[d] - 1 for d in ds]), L.ints([-(1 << 62)] * len(ds)), L.ints(ds),
                          L.ints([-1] * len(ds))])


@lowers(_ov("repeat", "default"))
def _repeat(L, node, x, repeats):
    repeats = list(repeats)
    r = L.rank(x)
    if len(repeats) > r:
        x = L.op("Reshape", [x, L.ints([1] * (len(repeats) - r) + _static_shape(L, x, "repeat"))])
    if all(k == 1 for k in repeats):
        return x
    return L.op("Tile", [x, L.ints(repeats)])


@lowers(_ov("unbind", "int"))
def _unbind(L, node, x, dim=0):
    r = L.rank(x)
    dim = _norm(dim, r)
    n = _static_shape(L, x, "unbind")[dim]
    if n == 1:
        return (L.op("Squeeze", [x, L.ints([dim])]),)
    parts = L.op("Split", [x, L.ints([1] * n)], {"axis": dim}, outputs=n)
    return tuple(L.op("Squeeze", [p, L.ints([dim])]) for p in parts)


@lowers(_ov("split", "Tensor"), _ov("split_with_sizes", "default"), _ov("unsafe_split", "Tensor"),
        _ov("unsafe_split_with_sizes", "default"))
def _split(L, node, x, size, dim=0):
    n = L.shape(x)[_norm(dim, L.rank(x))]
    if isinstance(size, (list, tuple)):
        sizes = list(size)
    else:
        sizes = [size] * (n // size) + ([n % size] if n % size else []) if size else [n]
    if len(sizes) == 1:
        return (x,)
    return tuple(L.op("Split", [x, L.ints(sizes)], {"axis": dim}, outputs=len(sizes)))


@lowers(_ov("tril", "default"), _ov("triu", "default"))
def _trilu(L, node, x, diagonal=0):
    return L.op("Trilu", [x, L.const(diagonal, "i64")], {"upper": int(node.target is _ov("triu", "default"))})


@lowers(_ov("pixel_shuffle", "default"))
def _pixel_shuffle(L, node, x, r):
    if L.rank(x) != 4:
        raise Unsupported("pixel_shuffle of a tensor that is not 4-D")
    n, c, h, w = _static_shape(L, x, "pixel_shuffle")
    y = L.op("Reshape", [x, L.ints([n, c // (r * r), r, r, h, w])])
    y = L.op("Transpose", [y], {"perm": [0, 1, 4, 2, 5, 3]})
    return L.op("Reshape", [y, L.ints([n, c // (r * r), h * r, w * r])])


@lowers(_ov("pixel_unshuffle", "default"))
def _pixel_unshuffle(L, node, x, r):
    if L.rank(x) != 4:
        raise Unsupported("pixel_unshuffle of a tensor that is not 4-D")
    n, c, h, w = _static_shape(L, x, "pixel_unshuffle")
    y = L.op("Reshape", [x, L.ints([n, c, h // r, r, w // r, r])])
    y = L.op("Transpose", [y], {"perm": [0, 1, 3, 5, 2, 4]})
    return L.op("Reshape", [y, L.ints([n, c * r * r, h // r, w // r])])


@lowers(_ov("channel_shuffle", "default"), _ov("native_channel_shuffle", "default"))
def _channel_shuffle(L, node, x, groups):
    shape = _static_shape(L, x, "channel_shuffle")
    n, c, rest = shape[0], shape[1], shape[2:]
    y = L.op("Reshape", [x, L.ints([n, groups, c // groups] + rest)])
    perm = [0, 2, 1] + list(range(3, 3 + len(rest)))
    y = L.op("Transpose", [y], {"perm": perm})
    return L.op("Reshape", [y, L.ints(shape)])


@lowers(_ov("gather", "default"))
def _gather(L, node, x, dim, index, sparse_grad=False):
    return L.op("GatherElements", [x, index], {"axis": dim})


@lowers(_ov("scatter", "src"), _ov("scatter", "value"), _ov("scatter_add", "default"), _ov("scatter", "reduce"),
        _ov("scatter", "value_reduce"), _ov("scatter_reduce", "two"))
def _scatter(L, node, x, dim, index, src, reduce=None, include_self=True):
    if not isinstance(src, str):
        src = L.op("Expand", [L.const(src, L.dtype(x)), L.ints(L.shape(index))])
    elif not same(L.shape(src), L.shape(index)):
        # torch reads src at the index's positions only (src may be larger)
        src = L.op("Slice", [src, L.ints([0] * L.rank(index)), L.ints(L.shape(index)), L.ints(list(range(L.rank(index))))])
    if node.target is _ov("scatter_add", "default"):
        reduce = "add"
    red = {None: "none", "add": "add", "sum": "add", "multiply": "mul", "prod": "mul", "amax": "max", "amin": "min"}
    if reduce not in red or not include_self:
        raise Unsupported(f"scatter with reduce={reduce!r}, include_self={include_self}")
    return L.op("ScatterElements", [x, index, _cast(L, src, L.dtype(x))], {"axis": dim, "reduction": red[reduce]})


@lowers(_ov("index_copy", "default"))
def _index_copy(L, node, x, dim, index, source):
    """x with source's slices along dim written at index's positions (what functionalization leaves of
    index_copy_: transformers' static KV cache writes each step's keys at cache_position this way): a
    ScatterElements whose indices are `index` broadcast over source's shape along dim."""
    r = L.rank(x)
    if r == 0 or L.rank(index) != 1:
        raise Unsupported(f"index_copy of a rank-{r} tensor with a rank-{L.rank(index)} index")
    d = dim % r
    along = [1] * r
    along[d] = -1
    idx = L.op("Reshape", [_cast(L, index, "i64"), L.ints(along)])
    idx = L.op("Expand", [idx, _shape_of(L, source)])
    return L.op("ScatterElements", [x, idx, _cast(L, source, L.dtype(x))], {"axis": d})


def _nonneg_index(L, idx, n):
    """An index tensor as i64; negative indices count from the end in torch, and Gather and GatherND
    take them so (as ONNX specifies), so nothing else is needed (and the NonZero -> Gather -> reduce
    repair pattern stays recognisable)."""
    return _cast(L, idx, "i64")


@lowers(_ov("index", "Tensor"), _ov("_unsafe_index", "Tensor"))
def _index_tensors(L, node, x, indices):
    """Advanced indexing with integer index tensors (None = a full dim): the indexed dims gather
    together through GatherND over their broadcast indices; the result's broadcast dims go where
    torch puts them (in place when the indexed dims are adjacent, else first)."""
    indices = list(indices)
    pos = [i for i, t in enumerate(indices) if t is not None]
    if len(pos) == 1 and L.dtype(indices[pos[0]]) == "bool" and pos[0] == 0:
        return _index(L, node, x, indices)
    if any(L.dtype(indices[i]) == "bool" for i in pos):
        raise Unsupported("boolean mask indexing together with other indices or after a full dim")
    r = L.rank(x)
    idx = [_nonneg_index(L, indices[i], None) for i in pos]
    if len(pos) == 1:
        return L.op("Gather", [x, idx[0]], {"axis": pos[0]})
    bshape = broadcast_shapes(*[L.shape(i) for i in idx])
    idx = [i if same(L.shape(i), bshape) else L.op("Expand", [i, L.ints(bshape)]) for i in idx]
    stacked = L.op("Concat", [L.op("Unsqueeze", [i, L.ints([len(bshape)])]) for i in idx], {"axis": len(bshape)})
    rest = [d for d in range(r) if d not in pos]
    front = x
    if pos != list(range(len(pos))):
        front = L.op("Transpose", [x], {"perm": pos + rest})
    y = L.op("GatherND", [front, stacked])          # [bshape..., rest dims...]
    adjacent = pos == list(range(pos[0], pos[0] + len(pos)))
    if adjacent and pos[0] > 0:
        nb = len(bshape)
        lead = list(range(nb, nb + pos[0]))      # the rest dims that were before the indexed ones
        perm = lead + list(range(nb)) + list(range(nb + pos[0], nb + len(rest)))
        y = L.op("Transpose", [y], {"perm": perm})
    return y


# ---- pooling and resampling ----------------------------------------------------------------------
def _adaptive_matrix(n_in, n_out):
    """[n_out, n_in]: row i averages torch's adaptive window floor(i*in/out) .. ceil((i+1)*in/out)."""
    m = torch.zeros(n_out, n_in, dtype=torch.float64)
    for i in range(n_out):
        s, e = (i * n_in) // n_out, -((-(i + 1) * n_in) // n_out)
        m[i, s:e] = 1.0 / (e - s)
    return m


def _adaptive_windows(n_in, n_out):
    return [((i * n_in) // n_out, -((-(i + 1) * n_in) // n_out)) for i in range(n_out)]


@lowers(_ov("_adaptive_avg_pool2d", "default"), _ov("adaptive_avg_pool2d", "default"),
        _ov("adaptive_avg_pool1d", "default"), _ov("_adaptive_avg_pool3d", "default"))
def _adaptive_avg_pool(L, node, x, size):
    size = [size] if isinstance(size, int) else list(size)
    k = len(size)
    ins = _static_tail(L, x, k, "adaptive pooling")
    r = L.rank(x)
    size = [i if o is None else o for i, o in zip(ins, size)]
    if all(o == 1 for o in size) and r >= 3 and r == k + 2:
        return L.op("GlobalAveragePool", [x])
    if all(i % o == 0 for i, o in zip(ins, size)) and r == k + 2:
        kern = [i // o for i, o in zip(ins, size)]
        return L.op("AveragePool", [x], {"kernel_shape": kern, "strides": kern})
    # separable: each spatial dim is averaged by a [out, in] matrix
    d = L.dtype(x)
    for j in range(k):
        ax = r - k + j
        m = L.const(_adaptive_matrix(ins[j], size[j]).t().contiguous(), d)      # [in, out]
        perm = list(range(r))
        perm[ax], perm[-1] = perm[-1], perm[ax]
        t = L.op("Transpose", [x], {"perm": perm}) if ax != r - 1 else x
        t = L.op("MatMul", [t, m])
        x = L.op("Transpose", [t], {"perm": perm}) if ax != r - 1 else t
    return x


@lowers(_ov("adaptive_max_pool2d", "default"), _ov("adaptive_max_pool1d", "default"))
def _adaptive_max_pool(L, node, x, size):
    _only_first_used(node, "adaptive max pooling's indices")
    size = [size] if isinstance(size, int) else list(size)
    k = len(size)
    ins = _static_tail(L, x, k, "adaptive pooling")
    if all(i % o == 0 for i, o in zip(ins, size)):
        kern = [i // o for i, o in zip(ins, size)]
        return (L.op("MaxPool", [x], {"kernel_shape": kern, "strides": kern}), None)
    r = L.rank(x)
    for j in range(k):
        ax = r - k + j
        cells = [L.op("ReduceMax", [L.op("Slice", [x, L.ints([s]), L.ints([e]), L.ints([ax])]), L.ints([ax])],
                      {"keepdims": 1}) for s, e in _adaptive_windows(ins[j], size[j])]
        x = cells[0] if len(cells) == 1 else L.op("Concat", cells, {"axis": ax})
    return (x, None)


def _pair(v, n=2):
    return list(v) * (n if len(v) == 1 else 1) if isinstance(v, (list, tuple)) else [v] * n


@lowers(_ov("avg_pool2d", "default"), _ov("avg_pool1d", "default"), _ov("avg_pool3d", "default"))
def _avg_pool(L, node, x, kernel, stride=(), padding=0, ceil_mode=False, count_include_pad=True,
              divisor_override=None):
    n = {_ov("avg_pool1d", "default"): 1, _ov("avg_pool3d", "default"): 3}.get(node.target, 2)
    kernel = _pair(kernel, n)
    stride = _pair(stride, n) if stride not in ((), [], None) else kernel
    padding = _pair(padding, n)
    attrs = {"kernel_shape": kernel, "strides": stride, "pads": padding + padding, "ceil_mode": int(ceil_mode),
             "count_include_pad": int(count_include_pad)}
    if divisor_override:
        if ceil_mode:
            raise Unsupported("divisor_override with ceil_mode")
        attrs["count_include_pad"] = 1
        y = L.op("AveragePool", [x], attrs)
        return L.op("Mul", [y, L.const(_numel(kernel) / divisor_override, L.dtype(x))])
    if ceil_mode:
        return _avg_pool_ceil(L, node, x, kernel, stride, padding, count_include_pad)
    return L.op("AveragePool", [x], attrs)


def _avg_pool_ceil(L, node, x, kernel, stride, padding, count_include_pad):
    """ceil_mode: torch drops a last window that would start in the right padding, and divides a
    window that runs past the padded input by its part inside input+padding (or, without
    count_include_pad, inside the input). A sum pool (zero padding) divided by a constant count map
    gives exactly that."""
    n = len(kernel)
    ins = _static_tail(L, x, n, "avg_pool")
    outs = []
    for i, k, s, p in zip(ins, kernel, stride, padding):
        o = -(-(i + 2 * p - k) // s) + 1
        if (o - 1) * s >= i + p:
            o -= 1
        outs.append(o)
    counts = torch.ones(1)
    for i, k, s, p, o in zip(ins, kernel, stride, padding, outs):
        c = []
        for j in range(o):
            a = j * s - p
            e = min(a + k, i + p)
            c.append(e - a if count_include_pad else min(e, i) - max(a, 0))
        counts = counts.reshape(counts.shape + (1,)) * torch.tensor(c, dtype=torch.float64)
    counts = counts.reshape(outs)
    # right padding enough to cover every window, zeros
    extra = [max(0, (o - 1) * s + k - (i + 2 * p)) for i, k, s, p, o in zip(ins, kernel, stride, padding, outs)]
    r = L.rank(x)
    zeros = [0] * (r - n)
    padded = L.op("Pad", [x, L.ints(zeros + padding + zeros + [p + e for p, e in zip(padding, extra)]),
                          L.const(0, L.dtype(x))], {"mode": "constant"})
    y = L.op("AveragePool", [padded], {"kernel_shape": kernel, "strides": stride, "count_include_pad": 1})
    scale = float(_numel(kernel)) / counts
    return L.op("Mul", [y, L.const(scale, L.dtype(x))])


@lowers(_ov("max_pool2d_with_indices", "default"), _ov("max_pool2d", "default"), _ov("max_pool1d", "default"),
        _ov("max_pool3d_with_indices", "default"), _ov("max_pool1d_with_indices", "default"))
def _max_pool(L, node, x, kernel, stride=(), padding=0, dilation=1, ceil_mode=False):
    with_indices = node.target in (_ov("max_pool2d_with_indices", "default"), _ov("max_pool3d_with_indices", "default"),
                                   _ov("max_pool1d_with_indices", "default"))
    if with_indices:
        _only_first_used(node, "max pooling's indices")
    n = {_ov("max_pool1d", "default"): 1, _ov("max_pool1d_with_indices", "default"): 1,
         _ov("max_pool3d_with_indices", "default"): 3}.get(node.target, 2)
    kernel = _pair(kernel, n)
    stride = _pair(stride, n) if stride not in ((), [], None) else kernel
    padding = _pair(padding, n)
    dilation = _pair(dilation, n)
    y = L.op("MaxPool", [x], {"kernel_shape": kernel, "strides": stride, "pads": padding + padding,
                              "dilations": dilation, "ceil_mode": int(ceil_mode)})
    return (y, None) if with_indices else y


def _resize(L, node, x, sizes, scales, mode, coord, nearest_mode="floor", **extra):
    r = L.rank(x)
    attrs = {"mode": mode, "coordinate_transformation_mode": coord, **extra}
    if mode == "nearest":
        attrs["nearest_mode"] = nearest_mode
    if scales is not None and all(s is not None for s in scales):
        sc = L.const([1.0, 1.0] + [float(s) for s in scales], "f32")
        return L.op("Resize", [x, None, sc], attrs)
    return L.op("Resize", [x, None, None, L.ints(L.shape(x)[:r - len(sizes)] + list(sizes))], attrs)


def _upsample(mode, nd, nearest_coord="asymmetric", nearest_mode="floor"):
    """upsample_*.default (x, output_size, [align_corners], scales...) and .vec (x, output_size or None,
    [align_corners], scale_factors or None). Scales given to torch decide its source coordinates (it
    uses 1/scale, as ONNX does with a scales input); otherwise the sizes do."""
    def lower(L, node, x, output_size, *rest):
        linear = mode in ("linear", "cubic")
        align = False
        if linear:
            align, rest = bool(rest[0]), rest[1:]
        if node.target._overloadname == "vec":
            scales = rest[0] if rest else None
        else:
            scales = list(rest) if rest else None
        if scales is not None and (len(scales) != nd or any(v is None for v in scales)):
            scales = None
        out = _meta_shape(node, L)[-nd:]
        extra = {"cubic_coeff_a": -0.75} if mode == "cubic" else {}
        if linear:
            # torch clamps a negative source coordinate to 0: the same as ONNX's edge padding under
            # half_pixel (pytorch_half_pixel differs at an output size of 1)
            coord = "align_corners" if align else "half_pixel"
            return _resize(L, node, x, out, None if align else scales, mode, coord, **extra)
        return _resize(L, node, x, out, scales, mode, nearest_coord, nearest_mode)
    return lower


for _name, _mode, _nd in (("upsample_nearest1d", "nearest", 1), ("upsample_nearest2d", "nearest", 2),
                          ("upsample_nearest3d", "nearest", 3), ("upsample_linear1d", "linear", 1),
                          ("upsample_bilinear2d", "linear", 2), ("upsample_trilinear3d", "linear", 3),
                          ("upsample_bicubic2d", "cubic", 2)):
    for _o in ("default", "vec"):
        lowers(_ov(_name, _o))(_upsample(_mode, _nd))
for _name, _nd in (("_upsample_nearest_exact1d", 1), ("_upsample_nearest_exact2d", 2), ("_upsample_nearest_exact3d", 3)):
    for _o in ("default", "vec"):
        lowers(_ov(_name, _o))(_upsample("nearest", _nd, "half_pixel", "round_prefer_ceil"))


# ---- attention -----------------------------------------------------------------------------------
@lowers(_ov("_native_multi_head_attention", "default"))
def _native_mha(L, node, q, k, v, embed_dim, num_heads, qkv_w, qkv_b, proj_w, proj_b, mask=None,
                need_weights=True, average_attn_weights=True, mask_type=None):
    """nn.MultiheadAttention's fast path (batch first [B, T, E]): packed in-projection, per-head
    scaled dot-product attention, out-projection; a boolean mask marks positions to leave out."""
    if L.rank(q) != 3:
        raise Unsupported("multi-head attention of an input that is not [B, T, E]")
    b, t, e = _static_shape(L, q, "attention")
    s = L.shape(k)[1]
    h = num_heads
    hd = embed_dim // h
    wq, wk, wv = L.op("Split", [qkv_w, L.ints([embed_dim] * 3)], {"axis": 0}, outputs=3)
    bq, bk, bv = L.op("Split", [qkv_b, L.ints([embed_dim] * 3)], {"axis": 0}, outputs=3) if qkv_b is not None \
        else (None, None, None)

    def project(x, w, bias, n):
        y = L.op("MatMul", [x, L.op("Transpose", [w], {"perm": [1, 0]})])
        y = L.op("Add", [y, bias]) if bias is not None else y
        return L.op("Transpose", [L.op("Reshape", [y, L.ints([b, n, h, hd])])], {"perm": [0, 2, 1, 3]})
    qh, kh, vh = project(q, wq, bq, t), project(k, wk, bk, s), project(v, wv, bv, s)
    d = L.dtype(q)
    scores = L.op("Mul", [L.op("MatMul", [qh, L.op("Transpose", [kh], {"perm": [0, 1, 3, 2]})]),
                          L.const(1.0 / math.sqrt(hd), d)])
    if mask is not None:
        if L.dtype(mask) != "bool":
            raise Unsupported("a float attention mask in the fused multi-head attention")
        if mask_type == 1:      # key padding mask [B, S]
            mask = L.op("Reshape", [mask, L.ints([b, 1, 1, s])])
        scores = L.op("Where", [mask, L.const(float("-inf"), d), scores])
    attn = L.op("Softmax", [scores], {"axis": -1})
    o = L.op("MatMul", [attn, vh])
    o = L.op("Reshape", [L.op("Transpose", [o], {"perm": [0, 2, 1, 3]}), L.ints([b, t, embed_dim])])
    o = L.op("MatMul", [o, L.op("Transpose", [proj_w], {"perm": [1, 0]})])
    if proj_b is not None:
        o = L.op("Add", [o, proj_b])
    w = None
    if need_weights:
        w = L.op("ReduceMean", [attn, L.ints([1])], {"keepdims": 0}) if average_attn_weights else attn
    return (o, w)


def _sdpa_gqa(L, node, q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, *rest, scale=None, enable_gqa=False,
              **kwargs):
    """scaled_dot_product_attention; with enable_gqa, each group of query heads shares a key/value head."""
    if enable_gqa and L.rank(k) >= 3 and L.shape(q)[-3] != L.shape(k)[-3]:
        rep = L.shape(q)[-3] // L.shape(k)[-3]

        def widen(t):
            # the sequence and batch dims may be symbolic (a KV length); the head count is static
            s = L.shape(t)
            if any(isinstance(d, int) and d < 0 for d in s):
                raise Unsupported("grouped attention of a tensor with a data-dependent shape")
            if isinstance(s[-3], SymDim):
                raise Unsupported(f"grouped attention over a symbolic head count {s[-3]}")
            y = L.op("Unsqueeze", [t, L.ints([len(s) - 2])])
            y = L.op("Expand", [y, L.ints(s[:-2] + [rep] + s[-2:])])
            return L.op("Reshape", [y, L.ints(s[:-3] + [s[-3] * rep] + s[-2:])])
        k, v = widen(k), widen(v)
    return _sdpa(L, node, q, k, v, attn_mask, dropout_p, is_causal, scale=scale)


lowers(_ov("scaled_dot_product_attention", "default"))(_sdpa_gqa)


@lowers(_ov("_transformer_encoder_layer_fwd", "default"))
def _transformer_encoder_layer(L, node, x, embed_dim, num_heads, qkv_w, qkv_b, proj_w, proj_b, use_gelu, norm_first,
                               eps, ln1_w, ln1_b, ln2_w, ln2_b, fc1_w, fc1_b, fc2_w, fc2_b, mask=None, mask_type=None):
    """nn.TransformerEncoderLayer's fast path (eval, batch first): attention and MLP blocks with
    post- or pre-layer-norm residuals."""
    def ln(v, w, b):
        return L.op("LayerNormalization", [v, w, b], {"axis": -1, "epsilon": float(eps)})

    def attend(v):
        return _native_mha(L, node, v, v, v, embed_dim, num_heads, qkv_w, qkv_b, proj_w, proj_b, mask, False,
                           True, mask_type)[0]

    def mlp(v):
        h = L.op("Add", [L.op("MatMul", [v, L.op("Transpose", [fc1_w], {"perm": [1, 0]})]), fc1_b])
        h = L.op("Gelu", [h]) if use_gelu else L.op("Relu", [h])
        return L.op("Add", [L.op("MatMul", [h, L.op("Transpose", [fc2_w], {"perm": [1, 0]})]), fc2_b])
    if norm_first:
        x = L.op("Add", [x, attend(ln(x, ln1_w, ln1_b))])
        return L.op("Add", [x, mlp(ln(x, ln2_w, ln2_b))])
    x = ln(L.op("Add", [x, attend(x)]), ln1_w, ln1_b)
    return ln(L.op("Add", [x, mlp(x)]), ln2_w, ln2_b)


@lowers(bernoulli_mask)
def _bernoulli_mask(L, node, shape, p, dtype):
    # Under train=True the mask is an input of the graph, drawn by PyTorch before each forward (in graph
    # order) and read again by the backward; elsewhere the draw runs in PyTorch (a graph break).
    if L.masks is None:
        raise Unsupported("a random mask outside tessel.compile(train=True)")
    name = L.b.input(node.name, tessel_dtype(dtype, f"dropout mask '{node.name}'"), [int(d) for d in shape])
    L.masks.append(RandomMask(name, tuple(int(d) for d in shape), float(p), dtype))
    return name


class RandomMask:
    """A graph input drawn per call: bernoulli_mask(shape, p, dtype)."""
    __slots__ = ("name", "shape", "p", "dtype")

    def __init__(self, name, shape, p, dtype):
        self.name, self.shape, self.p, self.dtype = name, shape, p, dtype

    def get(self, tensors):
        return bernoulli_mask(self.shape, self.p, self.dtype)


@lowers(_ov("native_dropout", "default"))
def _native_dropout(L, node, x, p, train):
    if train and p > 0:
        raise Unsupported("dropout in training mode")
    _only_first_used(node, "dropout's mask")
    return (x, None)
