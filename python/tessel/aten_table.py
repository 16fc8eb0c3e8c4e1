"""The aten -> tessel op table: one entry per aten overload, lowering it to graph-level (ONNX-style) ops.

A lowering is `fn(L, node, *args, **kwargs)` where tensor arguments arrive as tessel value names and
everything else as captured Python values; it returns the value name (or a tuple of names for ops with
several results). Raising `Unsupported(reason)` turns the node into a graph break that runs in PyTorch
(so does an aten op with no entry). docs/python.md lists what is covered.
"""
import math

import torch

aten = torch.ops.aten
LOWERINGS = {}

# aten ops whose output shape depends on the data: when they run in PyTorch, their results' dims are
# unknown to tessel (the partitions after them see `?` dims).
DATA_DEPENDENT = {aten.nonzero.default, aten.masked_select.default, aten._local_scalar_dense.default}
for _name in ("_unique2", "unique_dim", "unique_consecutive"):
    if hasattr(aten, _name):
        DATA_DEPENDENT.add(getattr(aten, _name).default)


class Unsupported(Exception):
    """This use of the op has no lowering (it runs in PyTorch as a graph break)."""


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
    """A tensor operand: a value name as is, a Python number as a constant of `like`'s dtype."""
    if isinstance(a, str):
        return a
    if isinstance(a, bool) or isinstance(a, (int, float)):
        return L.const(a, L.dtype(like))
    raise Unsupported(f"operand {a!r} is not a tensor or a number")


def _out_dtype(node):
    tm = node.meta.get("tensor_meta")
    if not hasattr(tm, "dtype"):
        return None
    from ._convert import TORCH_TO_TESSEL
    return TORCH_TO_TESSEL.get(tm.dtype)


def _cast(L, v, d):
    from ._convert import TESSEL_TO_TORCH  # noqa: F401  (dtype names are shared)
    if L.dtype(v) == d:
        return v
    return L.op("Cast", [v], {"to": _ONNX_DTYPE[d]})


_ONNX_DTYPE = {"f32": 1, "u8": 2, "i8": 3, "i16": 5, "i32": 6, "i64": 7, "bool": 9, "f16": 10, "f64": 11, "bf16": 16}


def _binary(op):
    def lower(L, node, a, b, alpha=1):
        ref = a if isinstance(a, str) else b
        out = _out_dtype(node) or L.dtype(ref)
        a = _cast(L, _scalar(L, a, ref), out) if isinstance(a, str) else L.const(a, out)
        b = _cast(L, _scalar(L, b, ref), out) if isinstance(b, str) else L.const(b, out)
        if alpha != 1:
            b = L.op("Mul", [b, L.const(alpha, out)])
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


@lowers(_ov("pow", "Tensor_Scalar"), _ov("pow", "Tensor_Tensor"))
def _pow(L, node, x, e):
    if e == 2:
        return L.op("Mul", [x, x])
    return L.op("Pow", [x, _scalar(L, e, x)])


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
    a = _cast(L, a, out) if isinstance(a, str) else L.const(a, out)
    b = _cast(L, b, out) if isinstance(b, str) else L.const(b, out)
    return L.op("Where", [c, a, b])


@lowers(_ov("masked_fill", "Scalar"), _ov("masked_fill", "Tensor"))
def _masked_fill(L, node, x, mask, value):
    v = _cast(L, value, L.dtype(x)) if isinstance(value, str) else L.const(value, L.dtype(x))
    return L.op("Where", [mask, v, x])


# ---- matrix products -----------------------------------------------------------------------------
@lowers(_ov("mm", "default"), _ov("bmm", "default"), _ov("matmul", "default"))
def _matmul(L, node, a, b):
    return L.op("MatMul", [a, b])


@lowers(_ov("addmm", "default"))
def _addmm(L, node, bias, a, b, beta=1, alpha=1):
    return L.op("Gemm", [a, b, bias], {"alpha": float(alpha), "beta": float(beta)})


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


@lowers(_ov("_log_softmax", "default"), _ov("log_softmax", "int"))
def _log_softmax(L, node, x, dim, half_to_float=False):
    return L.op("LogSoftmax", [x], {"axis": dim})


@lowers(_ov("native_batch_norm", "default"), _ov("_native_batch_norm_legit_no_training", "default"))
def _batch_norm(L, node, x, w, b, mean, var, *rest):
    if node.target is _ov("native_batch_norm", "default"):
        training, momentum, eps = rest
        if training:
            raise Unsupported("training-mode batch norm")
    else:
        momentum, eps = rest
    consts = [L.b.known(v) if isinstance(v, str) else None for v in (w, b, mean, var)]
    if all(c is not None for c in consts) and L.rank(x) >= 2:
        # Eval-mode statistics are constants: one per-channel scale and shift (y = x * scale + shift).
        w_, b_, m_, v_ = (torch.from_numpy(c[0].copy()).double() for c in consts)
        scale = w_ / torch.sqrt(v_ + eps)
        shift = b_ - m_ * scale
        shape = [-1] + [1] * (L.rank(x) - 2)
        d = L.dtype(x)
        y = L.op("Mul", [x, L.const(scale.reshape(shape), d)])
        return (L.op("Add", [y, L.const(shift.reshape(shape), d)]), None, None)
    return (L.op("BatchNormalization", [x, w, b, mean, var], {"epsilon": float(eps)}), None, None)


# ---- reductions -----------------------------------------------------------------------------------
def _reduce(op):
    def lower(L, node, x, dims=None, keepdim=False, dtype=None):
        if dtype is not None:
            raise Unsupported("a reduction with a dtype")
        ins = [x] if not dims else [x, L.ints(dims if isinstance(dims, (list, tuple)) else [dims])]
        return L.op(op, ins, {"keepdims": int(bool(keepdim))})
    return lower


lowers(_ov("sum", "dim_IntList"), _ov("sum", "default"))(_reduce("ReduceSum"))
lowers(_ov("mean", "dim"), _ov("mean", "default"))(_reduce("ReduceMean"))
lowers(_ov("amax", "default"))(_reduce("ReduceMax"))
lowers(_ov("amin", "default"))(_reduce("ReduceMin"))
lowers(_ov("max", "default"))(_reduce("ReduceMax"))   # x.max(): over every element
lowers(_ov("min", "default"))(_reduce("ReduceMin"))


# ---- shapes and data movement ---------------------------------------------------------------------
def _reshape(L, node, x, size, *rest):
    size = list(size)
    if any(d < 0 for d in L.shape(x)):
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
        if s == -1:
            size[i] = shape[i - off]
    if [s for s in size] == shape:
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
    from ._convert import tessel_dtype
    return _cast(L, x, tessel_dtype(dtype, "a cast"))


@lowers(_ov("unsqueeze", "default"))
def _unsqueeze(L, node, x, dim):
    return L.op("Unsqueeze", [x, L.ints([_norm(dim, L.rank(x) + 1)])])


@lowers(_ov("squeeze", "dim"), _ov("squeeze", "default"), _ov("squeeze", "dims"))
def _squeeze(L, node, x, dim=None):
    shape = L.shape(x)
    dims = [dim] if isinstance(dim, int) else list(dim) if dim is not None else [i for i, s in enumerate(shape) if s == 1]
    dims = [_norm(d, len(shape)) for d in dims if shape[_norm(d, len(shape))] == 1]
    if not dims:
        return x
    return L.op("Squeeze", [x, L.ints(dims)])


@lowers(_ov("split", "Tensor"), _ov("split_with_sizes", "default"))
def _split(L, node, x, size, dim=0):
    n = L.shape(x)[_norm(dim, L.rank(x))]
    sizes = list(size) if isinstance(size, (list, tuple)) else [size] * (n // size) + ([n % size] if n % size else [])
    return tuple(L.op("Split", [x, L.ints(sizes)], {"axis": dim}, outputs=len(sizes)))


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
    if start == 0 and step == 1 and n >= 0 and end >= n:
        return x
    return L.op("Slice", [x, L.ints([start]), L.ints([min(end, 1 << 62)]), L.ints([dim]), L.ints([step])])


@lowers(_ov("embedding", "default"))
def _embedding(L, node, w, idx, padding_idx=-1, scale_grad_by_freq=False, sparse=False):
    return L.op("Gather", [w, idx], {"axis": 0})


@lowers(_ov("index_select", "default"))
def _index_select(L, node, x, dim, idx):
    return L.op("Gather", [x, idx], {"axis": dim})


@lowers(_ov("index", "Tensor"))
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
        if mshape == xshape:
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
    if xs != ms:
        shape = list(torch.broadcast_shapes(tuple(xs), tuple(ms)))
        x = L.op("Expand", [x, L.ints(shape)]) if xs != shape else x
        mask = L.op("Expand", [mask, L.ints(shape)]) if ms != shape else mask
    flat = L.ints([-1])
    return L.op("Compress", [L.op("Reshape", [x, flat]), L.op("Reshape", [mask, flat])])


# ---- convolution and pooling ----------------------------------------------------------------------
@lowers(_ov("convolution", "default"))
def _convolution(L, node, x, w, b, stride, padding, dilation, transposed, output_padding, groups):
    if transposed:
        raise Unsupported("transposed convolution")
    pads = list(padding) + list(padding)
    ins = [x, w] + ([b] if b is not None else [])
    return L.op("Conv", ins, {"strides": list(stride), "pads": pads, "dilations": list(dilation), "group": groups})


@lowers(_ov("avg_pool2d", "default"))
def _avg_pool2d(L, node, x, kernel, stride=(), padding=0, ceil_mode=False, count_include_pad=True, divisor_override=None):
    if divisor_override:
        raise Unsupported("divisor_override")
    kernel = list(kernel)
    stride = list(stride) or kernel
    padding = list(padding) if isinstance(padding, (list, tuple)) else [padding, padding]
    return L.op("AveragePool", [x], {"kernel_shape": kernel, "strides": stride, "pads": padding + padding,
                                     "ceil_mode": int(ceil_mode), "count_include_pad": int(count_include_pad)})


@lowers(_ov("_adaptive_avg_pool2d", "default"), _ov("adaptive_avg_pool2d", "default"))
def _adaptive_avg_pool2d(L, node, x, size):
    if list(size) != [1, 1]:
        raise Unsupported("adaptive average pooling to a size other than 1x1")
    return L.op("GlobalAveragePool", [x])


@lowers(_ov("max_pool2d_with_indices", "default"))
def _max_pool2d(L, node, x, kernel, stride=(), padding=0, dilation=1, ceil_mode=False):
    kernel = list(kernel)
    stride = list(stride) or kernel
    padding = list(padding) if isinstance(padding, (list, tuple)) else [padding, padding]
    dilation = list(dilation) if isinstance(dilation, (list, tuple)) else [dilation, dilation]
    y = L.op("MaxPool", [x], {"kernel_shape": kernel, "strides": stride, "pads": padding + padding,
                              "dilations": dilation, "ceil_mode": int(ceil_mode)})
    return (y, None)


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
        tq, tk = L.shape(q)[-2], L.shape(k)[-2]
        mask = torch.ones(tq, tk, dtype=torch.bool).tril()
        s = L.op("Where", [L.const(mask, "bool"), s, L.const(float("-inf"), L.dtype(q))])
    if attn_mask is not None:
        if L.dtype(attn_mask) == "bool":
            s = L.op("Where", [attn_mask, s, L.const(float("-inf"), L.dtype(q))])
        else:
            s = L.op("Add", [s, attn_mask])
    return L.op("MatMul", [L.op("Softmax", [s], {"axis": -1}), v])


lowers(_ov("scaled_dot_product_attention", "default"))(_sdpa)


def _sdpa_tuple(L, node, q, k, v, dropout_p=0.0, is_causal=False, *rest, attn_mask=None, scale=None, **kwargs):
    return (_sdpa(L, node, q, k, v, attn_mask, dropout_p, is_causal, scale=scale), None)


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
    v = _cast(L, v, L.dtype(x)) if isinstance(v, str) else L.const(v, L.dtype(x))
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
    if n < 0:
        raise Unsupported("a scatter along a dynamic dim")
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
    shape = L.shape(src)
    if any(s < 0 for s in shape):
        raise Unsupported("a strided slice_scatter of a dynamic shape")
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
    numel = 1
    for s in L.shape(x):
        if s < 0:
            raise Unsupported("as_strided of a dynamic shape")
        numel *= s
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
        if L.shape(idx) != L.shape(x):
            raise Unsupported("index_put with a mask of another shape")
        mask = _cast(L, idx, "bool")
        if accumulate:
            return L.op("Add", [x, L.op("Where", [mask, values, L.const(0, L.dtype(x))])])
        return L.op("Where", [mask, values, x])
    if L.dtype(idx) not in ("i64", "i32"):
        raise Unsupported(f"index_put with {L.dtype(idx)} indices")
    xs, js = L.shape(x), L.shape(idx)
    if xs[0] < 0 or any(s < 0 for s in js + xs[1:]):
        raise Unsupported("index_put with dynamic shapes")
    idx = _cast(L, idx, "i64")
    # Negative indices count from the end, as in PyTorch.
    idx = L.op("Where", [L.op("Less", [idx, L.const(0, "i64")]), L.op("Add", [idx, L.const(xs[0], "i64")]), idx])
    rows = L.op("Expand", [values, L.ints(list(js) + list(xs[1:]))])
    return L.op("ScatterND", [x, L.op("Unsqueeze", [idx, L.ints([-1])]), rows],
                {"reduction": "add" if accumulate else "none"})
