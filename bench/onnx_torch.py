#!/usr/bin/python3
"""PyTorch eager on an ONNX model: the "PyTorch" peer of bench/peers.py.

Debian's torch 1.13 cannot import ONNX, so this executes the ONNX graph eagerly with torch ops: one torch
call (sometimes two or three) per ONNX node, weights as torch tensors, under torch.inference_mode().
Nothing is fused or constant-folded beyond Constant nodes and Identity of a constant (what a hand-written
nn.Module would hold as attributes); Shape/Gather/Reshape chains run every call, as they would in eager
PyTorch code. The result is checked against the model folder's test_data_set_0/output_N.pb.

For a pre-LN transformer block (tblock_s, tblock_s_dynamo, tblock_bert) it also times a native
torch nn.Module of the same block with the weights taken from the ONNX initializers.

    /usr/bin/python3 bench/onnx_torch.py MODEL_DIR [--threads 2] [--iters 30] [--warmup 5] [--json]

Run it with OPENBLAS_CORETYPE=SkylakeX in the environment if torch's BLAS is OpenBLAS 0.3.21 (it does not
know Zen 5); peers.py sets it. It must be set before torch is imported, so it is set here too if absent.
"""
import argparse
import json
import math
import os
import sys
import time

os.environ.setdefault("OPENBLAS_CORETYPE", "SkylakeX")

try:
    import numpy as np
    import onnx
    from onnx import numpy_helper
    import torch
    import torch.nn.functional as F
except ImportError as e:  # reported by peers.py as "skipped"
    print(json.dumps({"error": f"missing python package under {sys.executable}: {e}"}))
    sys.exit(3)

# ONNX TensorProto.DataType -> torch dtype
DTYPES = {1: torch.float32, 2: torch.uint8, 3: torch.int8, 5: torch.int16, 6: torch.int32, 7: torch.int64,
          9: torch.bool, 10: torch.float16, 11: torch.float64, 16: torch.bfloat16}


def to_torch(tp):
    a = numpy_helper.to_array(tp)
    return torch.from_numpy(np.array(a, copy=True))


def attr_dict(node):
    out = {}
    for a in node.attribute:
        v = onnx.helper.get_attribute_value(a)
        if isinstance(v, bytes):
            v = v.decode()
        elif isinstance(v, onnx.TensorProto):
            v = to_torch(v)
        out[a.name] = v
    return out


class Ctx:
    """What an op factory may know when it builds its closure: attributes, opset, constant inputs."""

    def __init__(self, node, consts, opset):
        self.node, self.consts, self.opset = node, consts, opset
        self.attrs = attr_dict(node)

    def a(self, name, default=None):
        return self.attrs.get(name, default)

    def const_ints(self, i):
        """Input i as a Python int list if it is a constant (baked into the closure), else None."""
        ins = self.node.input
        if i < len(ins) and ins[i] and ins[i] in self.consts:
            return [int(v) for v in self.consts[ins[i]].reshape(-1).tolist()]
        return None

    def const_scalar(self, i):
        ins = self.node.input
        if i < len(ins) and ins[i] and ins[i] in self.consts:
            return self.consts[ins[i]].reshape(-1)[0].item()
        return None

    def has(self, i):
        return i < len(self.node.input) and self.node.input[i] != ""


def _ints(t):
    return [int(v) for v in t.reshape(-1).tolist()]


def param(ctx, i, fallback=None):
    """Returns f(ins) -> Python int list for an int-list input (shape, axes, ...), constant or not."""
    c = ctx.const_ints(i)
    if c is not None:
        return lambda ins: c
    if ctx.has(i):
        return lambda ins: _ints(ins[i])
    return lambda ins: fallback


OPS = {}


def op(*names):
    def reg(f):
        for n in names:
            OPS[n] = f
        return f
    return reg


# ---- elementwise
def _binary(fn):
    return lambda ctx: (lambda ins: fn(ins[0], ins[1]))


for _n, _f in {"Add": torch.add, "Sub": torch.sub, "Mul": torch.mul, "Equal": torch.eq, "Greater": torch.gt,
               "GreaterOrEqual": torch.ge, "Less": torch.lt, "LessOrEqual": torch.le,
               "And": torch.logical_and, "Or": torch.logical_or, "Xor": torch.logical_xor,
               "BitShift": None}.items():
    if _f is not None:
        OPS[_n] = _binary(_f)

for _n, _f in {"Relu": torch.relu, "Sigmoid": torch.sigmoid, "Tanh": torch.tanh, "Erf": torch.erf,
               "Exp": torch.exp, "Log": torch.log, "Sqrt": torch.sqrt, "Neg": torch.neg, "Abs": torch.abs,
               "Reciprocal": torch.reciprocal, "Floor": torch.floor, "Ceil": torch.ceil, "Round": torch.round,
               "Sign": torch.sign, "Sin": torch.sin, "Cos": torch.cos, "Not": torch.logical_not,
               "IsNaN": torch.isnan, "Softplus": F.softplus, "Softsign": F.softsign,
               "HardSwish": F.hardswish}.items():
    OPS[_n] = (lambda f: lambda ctx: (lambda ins: f(ins[0])))(_f)


@op("Div")
def _div(ctx):
    def f(ins):
        a, b = ins
        if a.is_floating_point() or b.is_floating_point():
            return torch.div(a, b)
        return torch.div(a, b, rounding_mode="trunc")  # ONNX integer Div truncates
    return f


@op("Mod")
def _mod(ctx):
    if ctx.a("fmod", 0):
        return lambda ins: torch.fmod(ins[0], ins[1])
    return lambda ins: torch.remainder(ins[0], ins[1])


@op("Pow")
def _pow(ctx):
    def f(ins):
        r = torch.pow(ins[0], ins[1])
        return r if r.dtype == ins[0].dtype else r.to(ins[0].dtype)  # ONNX: result has the base's type
    return f


@op("IsInf")
def _isinf(ctx):
    pos, neg = ctx.a("detect_positive", 1), ctx.a("detect_negative", 1)
    if pos and neg:
        return lambda ins: torch.isinf(ins[0])
    if pos:
        return lambda ins: torch.isposinf(ins[0])
    return lambda ins: torch.isneginf(ins[0])


@op("LeakyRelu")
def _leaky(ctx):
    a = ctx.a("alpha", 0.01)
    return lambda ins: F.leaky_relu(ins[0], a)


@op("Elu")
def _elu(ctx):
    a = ctx.a("alpha", 1.0)
    return lambda ins: F.elu(ins[0], a)


@op("HardSigmoid")
def _hsig(ctx):
    al, be = ctx.a("alpha", 0.2), ctx.a("beta", 0.5)
    return lambda ins: torch.clamp(ins[0] * al + be, 0.0, 1.0)


@op("Gelu")
def _gelu(ctx):
    ap = ctx.a("approximate", "none")
    return lambda ins: F.gelu(ins[0], approximate=ap)


@op("Clip")
def _clip(ctx):
    if ctx.opset < 11:
        lo, hi = ctx.a("min", None), ctx.a("max", None)
        return lambda ins: torch.clamp(ins[0], lo, hi)
    lo_c, hi_c = ctx.const_scalar(1), ctx.const_scalar(2)
    has_lo, has_hi = ctx.has(1), ctx.has(2)
    if (lo_c is not None or not has_lo) and (hi_c is not None or not has_hi):
        return lambda ins: torch.clamp(ins[0], lo_c, hi_c)
    return lambda ins: torch.clamp(ins[0], ins[1].item() if has_lo else None, ins[2].item() if has_hi else None)


@op("Where")
def _where(ctx):
    return lambda ins: torch.where(ins[0], ins[1], ins[2])


@op("Cast")
def _cast(ctx):
    dt = DTYPES[ctx.a("to")]
    return lambda ins: ins[0].to(dt)


@op("CastLike")
def _castlike(ctx):
    return lambda ins: ins[0].to(ins[1].dtype)


@op("Identity", "Dropout")
def _identity(ctx):
    return lambda ins: ins[0]


def _variadic(fn):
    def make(ctx):
        def f(ins):
            r = ins[0]
            for x in ins[1:]:
                r = fn(r, x)
            return r
        return f
    return make


OPS["Sum"] = _variadic(torch.add)
OPS["Max"] = _variadic(torch.maximum)
OPS["Min"] = _variadic(torch.minimum)


@op("Mean")
def _mean(ctx):
    s = _variadic(torch.add)(ctx)
    return lambda ins: s(ins) / len(ins)


# ---- shapes and data movement
@op("Shape")
def _shape(ctx):
    start, end = ctx.a("start", 0), ctx.a("end", None)
    return lambda ins: torch.tensor(ins[0].shape[start:end], dtype=torch.int64)


@op("Size")
def _size(ctx):
    return lambda ins: torch.tensor(ins[0].numel(), dtype=torch.int64)


@op("Reshape")
def _reshape(ctx):
    shape = param(ctx, 1)
    allowzero = ctx.a("allowzero", 0)
    c = ctx.const_ints(1)
    if c is not None and (allowzero or 0 not in c):
        return lambda ins: ins[0].reshape(c)

    def f(ins):
        s = shape(ins)
        if not allowzero:
            s = [ins[0].shape[i] if v == 0 else v for i, v in enumerate(s)]
        return ins[0].reshape(s)
    return f


@op("Flatten")
def _flatten(ctx):
    axis = ctx.a("axis", 1)

    def f(ins):
        x = ins[0]
        ax = axis + x.dim() if axis < 0 else axis
        return x.reshape(math.prod(x.shape[:ax]), -1)
    return f


@op("Transpose")
def _transpose(ctx):
    perm = ctx.a("perm", None)
    if perm is None:
        return lambda ins: ins[0].permute(*reversed(range(ins[0].dim())))
    return lambda ins: ins[0].permute(perm)


@op("Squeeze")
def _squeeze(ctx):
    axes = (lambda ins: ctx.a("axes", None)) if ctx.opset < 13 else param(ctx, 1)

    def f(ins):
        ax = axes(ins)
        x = ins[0]
        if ax is None:
            return x.squeeze()
        for a in sorted((a + x.dim() if a < 0 else a for a in ax), reverse=True):
            x = x.squeeze(a)
        return x
    return f


@op("Unsqueeze")
def _unsqueeze(ctx):
    axes = (lambda ins: ctx.a("axes")) if ctx.opset < 13 else param(ctx, 1)

    def f(ins):
        ax = axes(ins)
        x = ins[0]
        r = x.dim() + len(ax)
        for a in sorted(a + r if a < 0 else a for a in ax):
            x = x.unsqueeze(a)
        return x
    return f


@op("Concat")
def _concat(ctx):
    axis = ctx.a("axis")
    return lambda ins: torch.cat(ins, axis)


@op("Split")
def _split(ctx):
    axis = ctx.a("axis", 0)
    nout = len(ctx.node.output)
    if ctx.opset < 13:
        sizes = (lambda ins: ctx.a("split", None))
    else:
        sizes = param(ctx, 1)
    num_outputs = ctx.a("num_outputs", None) or nout

    def f(ins):
        x = ins[0]
        s = sizes(ins)
        if s is None:
            d = x.shape[axis]
            s = math.ceil(d / num_outputs)  # equal chunks, the last one smaller (opset 18)
        return torch.split(x, s, axis)
    return f


@op("Slice")
def _slice(ctx):
    if ctx.opset < 10:
        st, en, ax, sp = (lambda ins: ctx.a("starts")), (lambda ins: ctx.a("ends")), \
            (lambda ins: ctx.a("axes", None)), (lambda ins: None)
    else:
        st, en, ax, sp = param(ctx, 1), param(ctx, 2), param(ctx, 3), param(ctx, 4)

    def f(ins):
        x = ins[0]
        starts, ends = st(ins), en(ins)
        axes = ax(ins) or list(range(len(starts)))
        steps = sp(ins) or [1] * len(starts)
        idx = [slice(None)] * x.dim()
        flips = []
        for s, e, a, k in zip(starts, ends, axes, steps):
            a = a + x.dim() if a < 0 else a
            d = x.shape[a]
            if k > 0:
                idx[a] = slice(*slice(s, e, k).indices(d))
            else:  # torch has no negative steps: gather the indices Python's slicing gives
                flips.append((a, list(range(d))[slice(s, e, k)]))
        y = x[tuple(idx)]
        for a, ii in flips:
            y = y.index_select(a, torch.tensor(ii, dtype=torch.int64))
        return y
    return f


def _norm_idx(idx, n):
    return torch.where(idx < 0, idx + n, idx)


@op("Gather")
def _gather(ctx):
    axis = ctx.a("axis", 0)

    def f(ins):
        x, idx = ins
        a = axis + x.dim() if axis < 0 else axis
        idx = _norm_idx(idx, x.shape[a])
        if a == 0 and x.dim() == 2 and idx.dim() > 0:
            return F.embedding(idx, x)
        out = torch.index_select(x, a, idx.reshape(-1))
        return out.reshape(x.shape[:a] + idx.shape + x.shape[a + 1:])
    return f


@op("GatherElements")
def _gather_el(ctx):
    axis = ctx.a("axis", 0)
    return lambda ins: torch.gather(ins[0], axis, _norm_idx(ins[1], ins[0].shape[axis]))


@op("Expand")
def _expand(ctx):
    shape = param(ctx, 1)

    def f(ins):
        x = ins[0]
        return x.expand(torch.broadcast_shapes(x.shape, tuple(shape(ins))))
    return f


@op("Tile")
def _tile(ctx):
    reps = param(ctx, 1)
    return lambda ins: ins[0].repeat(reps(ins))


@op("ConstantOfShape")
def _cos(ctx):
    v = ctx.a("value", None)
    val, dt = (0.0, torch.float32) if v is None else (v.reshape(-1)[0].item(), v.dtype)
    shape = param(ctx, 0)
    return lambda ins: torch.full(shape(ins), val, dtype=dt)


@op("Range")
def _range(ctx):
    return lambda ins: torch.arange(ins[0].item(), ins[1].item(), ins[2].item(), dtype=ins[0].dtype)


@op("Trilu")
def _trilu(ctx):
    upper = ctx.a("upper", 1)
    k = param(ctx, 1, [0])
    fn = torch.triu if upper else torch.tril
    return lambda ins: fn(ins[0], k(ins)[0])


@op("NonZero")
def _nonzero(ctx):
    return lambda ins: torch.nonzero(ins[0]).t()


@op("Einsum")
def _einsum(ctx):
    eq = ctx.a("equation")
    return lambda ins: torch.einsum(eq, *ins)


@op("CumSum")
def _cumsum(ctx):
    excl, rev = ctx.a("exclusive", 0), ctx.a("reverse", 0)

    def f(ins):
        x, a = ins[0], int(ins[1].item())
        if rev:
            x = x.flip(a)
        y = torch.cumsum(x, a)
        if excl:
            y = y - x
        return y.flip(a) if rev else y
    return f


# ---- reductions
def _reduce(fn, attr_axes_before):
    def make(ctx):
        keep = bool(ctx.a("keepdims", 1))
        noop = ctx.a("noop_with_empty_axes", 0)
        axes = (lambda ins: ctx.a("axes", None)) if ctx.opset < attr_axes_before else param(ctx, 1)

        def f(ins):
            x, ax = ins[0], axes(ins)
            if not ax:
                if noop:
                    return x
                ax = list(range(x.dim()))
            return fn(x, ax, keep)
        return f
    return make


OPS["ReduceSum"] = _reduce(lambda x, a, k: torch.sum(x, a, keepdim=k), 13)
OPS["ReduceMean"] = _reduce(lambda x, a, k: torch.mean(x, a, keepdim=k), 18)
OPS["ReduceMax"] = _reduce(lambda x, a, k: torch.amax(x, a, keepdim=k), 18)
OPS["ReduceMin"] = _reduce(lambda x, a, k: torch.amin(x, a, keepdim=k), 18)
OPS["ReduceProd"] = _reduce(lambda x, a, k: _prod(x, a, k), 18)
OPS["ReduceL2"] = _reduce(lambda x, a, k: torch.linalg.vector_norm(x, 2, a, keepdim=k), 18)


def _prod(x, axes, keep):
    for a in sorted(axes, reverse=True):
        x = torch.prod(x, a, keepdim=keep)
    return x


@op("ArgMax", "ArgMin")
def _arg(ctx):
    fn = torch.argmax if ctx.node.op_type == "ArgMax" else torch.argmin
    axis, keep = ctx.a("axis", 0), bool(ctx.a("keepdims", 1))
    return lambda ins: fn(ins[0], axis, keep)


@op("Softmax", "LogSoftmax")
def _softmax(ctx):
    fn = torch.softmax if ctx.node.op_type == "Softmax" else torch.log_softmax
    if ctx.opset >= 13:
        axis = ctx.a("axis", -1)
        return lambda ins: fn(ins[0], axis)
    axis = ctx.a("axis", 1)

    def f(ins):  # opset < 13: softmax over the flattened trailing dims
        x = ins[0]
        a = axis + x.dim() if axis < 0 else axis
        return fn(x.reshape(math.prod(x.shape[:a]), -1), -1).reshape(x.shape)
    return f


# ---- linear algebra and NN
@op("MatMul")
def _matmul(ctx):
    return lambda ins: torch.matmul(ins[0], ins[1])


@op("Gemm")
def _gemm(ctx):
    al, be = ctx.a("alpha", 1.0), ctx.a("beta", 1.0)
    ta, tb = ctx.a("transA", 0), ctx.a("transB", 0)
    has_c = ctx.has(2)
    if al == 1.0 and be == 1.0 and not ta:
        if tb:  # nn.Linear's layout: weight [N, K]
            return lambda ins: F.linear(ins[0], ins[1], ins[2] if has_c else None)
        if has_c:
            return lambda ins: torch.addmm(ins[2], ins[0], ins[1])
        return lambda ins: torch.mm(ins[0], ins[1])

    def f(ins):
        a = ins[0].t() if ta else ins[0]
        b = ins[1].t() if tb else ins[1]
        y = torch.mm(a, b)
        if al != 1.0:
            y = y * al
        if has_c:
            y = y + (ins[2] * be if be != 1.0 else ins[2])
        return y
    return f


def _pads(ctx, nsp):
    """(symmetric padding tuple or None, F.pad list or None) for Conv/Pool attributes."""
    auto = ctx.a("auto_pad", "NOTSET")
    if auto not in ("NOTSET", "VALID"):
        raise NotImplementedError(f"{ctx.node.op_type} auto_pad={auto}")
    pads = [0] * (2 * nsp) if auto == "VALID" else list(ctx.a("pads", [0] * (2 * nsp)))
    begin, end = pads[:nsp], pads[nsp:]
    if begin == end:
        return tuple(begin), None
    fp = []
    for i in reversed(range(nsp)):
        fp += [begin[i], end[i]]
    return (0,) * nsp, fp


@op("Conv")
def _conv(ctx):
    w = ctx.consts.get(ctx.node.input[1])
    ks = ctx.a("kernel_shape", None) or list(w.shape[2:])
    nsp = len(ks)
    conv = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}[nsp]
    stride = tuple(ctx.a("strides", [1] * nsp))
    dil = tuple(ctx.a("dilations", [1] * nsp))
    groups = ctx.a("group", 1)
    pad, fpad = _pads(ctx, nsp)
    has_b = ctx.has(2)

    def f(ins):
        x = F.pad(ins[0], fpad) if fpad else ins[0]
        return conv(x, ins[1], ins[2] if has_b else None, stride, pad, dil, groups)
    return f


@op("MaxPool", "AveragePool")
def _pool(ctx):
    ks = ctx.a("kernel_shape")
    nsp = len(ks)
    stride = ctx.a("strides", [1] * nsp)
    pad, fpad = _pads(ctx, nsp)
    ceil = bool(ctx.a("ceil_mode", 0))
    if ctx.node.op_type == "MaxPool":
        if len(ctx.node.output) > 1 and ctx.node.output[1]:
            raise NotImplementedError("MaxPool with Indices output")
        pool = {1: F.max_pool1d, 2: F.max_pool2d, 3: F.max_pool3d}[nsp]
        dil = ctx.a("dilations", [1] * nsp)

        def f(ins):
            x = F.pad(ins[0], fpad, value=-math.inf) if fpad else ins[0]
            return pool(x, ks, stride, pad, dil, ceil)
        return f
    pool = {1: F.avg_pool1d, 2: F.avg_pool2d, 3: F.avg_pool3d}[nsp]
    cip = bool(ctx.a("count_include_pad", 0))
    if fpad:
        raise NotImplementedError("AveragePool with asymmetric pads")
    return lambda ins: pool(ins[0], ks, stride, pad, ceil, cip)


@op("GlobalAveragePool")
def _gap(ctx):
    def f(ins):
        x = ins[0]
        if x.dim() == 4:
            return F.adaptive_avg_pool2d(x, 1)
        return x.mean(dim=tuple(range(2, x.dim())), keepdim=True)
    return f


@op("GlobalMaxPool")
def _gmp(ctx):
    return lambda ins: torch.amax(ins[0], dim=tuple(range(2, ins[0].dim())), keepdim=True)


@op("BatchNormalization")
def _bn(ctx):
    eps = ctx.a("epsilon", 1e-5)
    return lambda ins: F.batch_norm(ins[0], ins[3], ins[4], ins[1], ins[2], False, 0.0, eps)


@op("InstanceNormalization")
def _in(ctx):
    eps = ctx.a("epsilon", 1e-5)
    return lambda ins: F.instance_norm(ins[0], weight=ins[1], bias=ins[2], eps=eps)


@op("LayerNormalization")
def _ln(ctx):
    axis, eps = ctx.a("axis", -1), ctx.a("epsilon", 1e-5)
    has_b = ctx.has(2)
    extra = len(ctx.node.output) > 1 and any(ctx.node.output[1:])

    def f(ins):
        x = ins[0]
        a = axis + x.dim() if axis < 0 else axis
        y = F.layer_norm(x, x.shape[a:], ins[1], ins[2] if has_b else None, eps)
        if not extra:
            return y
        dims = tuple(range(a, x.dim()))
        mean = x.mean(dims, keepdim=True)
        inv = torch.rsqrt(x.var(dims, unbiased=False, keepdim=True) + eps)
        return y, mean, inv
    return f


# ---- the interpreter
class OnnxTorch:
    def __init__(self, model_path):
        t0 = time.perf_counter()
        m = onnx.load(model_path)
        self.opset = next((o.version for o in m.opset_import if o.domain in ("", "ai.onnx")), 13)
        g = m.graph
        consts = {t.name: to_torch(t) for t in g.initializer}
        init_names = set(consts)
        self.inputs = [i.name for i in g.input if i.name not in init_names]
        self.outputs = [o.name for o in g.output]
        self.steps = []
        self.op_types = set()
        missing = sorted({n.op_type for n in g.node if n.domain not in ("", "ai.onnx") or
                          (n.op_type not in OPS and n.op_type != "Constant")})
        if missing:
            raise NotImplementedError("ONNX ops not covered by onnx_torch.py: " + ", ".join(missing))
        for n in g.node:
            self.op_types.add(n.op_type)
            if n.op_type == "Constant":
                at = attr_dict(n)
                if "value" in at:
                    v = at["value"]
                elif "value_float" in at:
                    v = torch.tensor(at["value_float"], dtype=torch.float32)
                elif "value_floats" in at:
                    v = torch.tensor(at["value_floats"], dtype=torch.float32)
                elif "value_int" in at:
                    v = torch.tensor(at["value_int"], dtype=torch.int64)
                elif "value_ints" in at:
                    v = torch.tensor(at["value_ints"], dtype=torch.int64)
                else:
                    raise NotImplementedError(f"Constant with {list(at)}")
                consts[n.output[0]] = v
                continue
            if n.op_type == "Identity" and n.input[0] in consts:  # weight sharing, as module attributes
                consts[n.output[0]] = consts[n.input[0]]
                continue
            fn = OPS[n.op_type](Ctx(n, consts, self.opset))
            self.steps.append((fn, list(n.input), list(n.output)))
        self.consts = consts
        # free each intermediate after its last use (what eager Python code does when names go out of scope)
        last = {}
        for k, (_, ins, _) in enumerate(self.steps):
            for i in ins:
                last[i] = k
        keep = set(self.outputs) | set(consts)
        self.frees = [[] for _ in self.steps]
        for name, k in last.items():
            if name and name not in keep:
                self.frees[k].append(name)
        self.load_s = time.perf_counter() - t0
        self.nodes = len(g.node)

    def __call__(self, feeds):
        env = dict(self.consts)
        env.update(feeds)
        for (fn, ins, outs), frees in zip(self.steps, self.frees):
            r = fn([env[i] if i else None for i in ins])
            if len(outs) == 1:
                env[outs[0]] = r
            else:
                for o, v in zip(outs, r):
                    if o:
                        env[o] = v
            for f in frees:
                del env[f]
        return [env[o] for o in self.outputs]


# ---- native nn.Module for the pre-LN transformer block models
class Block(torch.nn.Module):
    """LN -> qkv Linear -> H-head attention -> proj -> residual -> LN -> fc1 -> GELU(erf) -> fc2 -> residual."""

    def __init__(self, d, heads, mlp, eps1, eps2):
        super().__init__()
        self.h = heads
        self.ln1 = torch.nn.LayerNorm(d, eps=eps1)
        self.qkv = torch.nn.Linear(d, 3 * d)
        self.proj = torch.nn.Linear(d, d)
        self.ln2 = torch.nn.LayerNorm(d, eps=eps2)
        self.fc1 = torch.nn.Linear(d, mlp)
        self.fc2 = torch.nn.Linear(mlp, d)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, -1)
        q = q.reshape(b, t, self.h, -1).transpose(1, 2)
        k = k.reshape(b, t, self.h, -1).transpose(1, 2)
        v = v.reshape(b, t, self.h, -1).transpose(1, 2)
        att = torch.softmax((q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1]), -1)
        y = (att @ v).transpose(1, 2).reshape(b, t, d)
        x = x + self.proj(y)
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


def native_block(rt):
    """Builds Block from the ONNX graph's weights if the graph is the pre-LN block, else (None, reason)."""
    m = onnx.load(rt.model_path)
    g = m.graph
    c = rt.consts
    types = [n.op_type for n in g.node]
    if types.count("LayerNormalization") != 2 or types.count("Softmax") != 1 or types.count("Erf") != 1:
        return None, "not a pre-LN transformer block"
    consumers = {}
    for n in g.node:
        for i in n.input:
            consumers.setdefault(i, []).append(n)
    lin = []  # (weight [K,N], bias) in graph order: qkv, proj, fc1, fc2
    for n in g.node:
        if n.op_type == "MatMul" and n.input[1] in c and c[n.input[1]].dim() == 2:
            adds = [a for a in consumers.get(n.output[0], []) if a.op_type == "Add"]
            bias = [i for a in adds for i in a.input if i in c and c[i].dim() == 1]
            if len(bias) != 1:
                return None, "linear without a bias"
            lin.append((c[n.input[1]], c[bias[0]]))
    lns = [n for n in g.node if n.op_type == "LayerNormalization"]
    if len(lin) != 4:
        return None, f"{len(lin)} weight matmuls, expected 4"
    d, mlp = lin[0][0].shape[0], lin[2][0].shape[1]
    heads = None
    for n in g.node:
        if n.op_type == "Reshape" and n.input[1] in c and c[n.input[1]].numel() == 4:
            heads = int(c[n.input[1]].reshape(-1)[2])
            break
    if heads is None or heads <= 0 or d % heads:
        return None, "head count not found"
    eps = [attr_dict(n).get("epsilon", 1e-5) for n in lns]
    blk = Block(d, heads, mlp, eps[0], eps[1])
    with torch.no_grad():
        for lin_mod, (w, b) in zip([blk.qkv, blk.proj, blk.fc1, blk.fc2], lin):
            lin_mod.weight.copy_(w.t())
            lin_mod.bias.copy_(b)
        for ln_mod, n in zip([blk.ln1, blk.ln2], lns):
            ln_mod.weight.copy_(c[n.input[1]])
            ln_mod.bias.copy_(c[n.input[2]])
    blk.eval()
    return blk, f"d={d} heads={heads} mlp={mlp}"


# ---- timing and checking
def load_test_data(model_dir, rt):
    d = os.path.join(model_dir, "test_data_set_0")
    feeds, expected = {}, []
    for k in range(len(rt.inputs)):
        tp = onnx.TensorProto()
        with open(os.path.join(d, f"input_{k}.pb"), "rb") as f:
            tp.ParseFromString(f.read())
        name = tp.name if tp.name in rt.inputs else rt.inputs[k]
        feeds[name] = to_torch(tp)
    k = 0
    while os.path.exists(os.path.join(d, f"output_{k}.pb")):
        tp = onnx.TensorProto()
        with open(os.path.join(d, f"output_{k}.pb"), "rb") as f:
            tp.ParseFromString(f.read())
        expected.append(to_torch(tp))
        k += 1
    return feeds, expected


def max_abs_err(got, expected):
    err = 0.0
    for g, e in zip(got, expected):
        if tuple(g.shape) != tuple(e.shape):
            return float("inf")
        if g.numel():
            err = max(err, (g.double() - e.double()).abs().max().item())
    return err


def time_calls(fn, iters, warmup):
    with torch.inference_mode():
        for _ in range(warmup):
            fn()
        ts = []
        for _ in range(iters):
            t = time.perf_counter_ns()
            fn()
            ts.append((time.perf_counter_ns() - t) / 1e6)
    ts.sort()
    q = lambda p: ts[min(len(ts) - 1, int(p * len(ts)))]
    return {"median_ms": ts[len(ts) // 2], "p10_ms": q(0.1), "p90_ms": q(0.9), "min_ms": ts[0], "iters": iters}


def loaded_blas():
    """Shared libraries of BLAS/LAPACK/oneDNN mapped into this process (what torch's matmul really calls)."""
    libs = set()
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                p = line.split()[-1]
                b = os.path.basename(p)
                if p.startswith("/") and any(k in b for k in ("blas", "lapack", "dnnl", "mkl")):
                    libs.add(os.path.realpath(p))
    except OSError:
        pass
    return sorted(libs)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model", help="model folder (model.onnx + test_data_set_0) or .onnx file")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--no-native", action="store_true", help="skip the native nn.Module block")
    ap.add_argument("--json", action="store_true", help="print one JSON object (for peers.py)")
    a = ap.parse_args()

    torch.set_num_threads(a.threads)
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:
        pass
    model_dir = a.model if os.path.isdir(a.model) else os.path.dirname(os.path.abspath(a.model))
    model_path = os.path.join(a.model, "model.onnx") if os.path.isdir(a.model) else a.model
    res = {"model": a.model, "torch_version": torch.__version__, "threads": torch.get_num_threads(),
           "interop_threads": torch.get_num_interop_threads(),
           "OPENBLAS_CORETYPE": os.environ.get("OPENBLAS_CORETYPE")}
    try:
        rt = OnnxTorch(model_path)
    except NotImplementedError as e:
        res["error"] = str(e)
        print(json.dumps(res) if a.json else f"error: {e}")
        return 2
    rt.model_path = model_path
    feeds, expected = load_test_data(model_dir, rt)
    with torch.inference_mode():
        got = rt(feeds)
    res["onnx_eager"] = dict(time_calls(lambda: rt(feeds), a.iters, a.warmup), load_s=rt.load_s,
                             nodes=rt.nodes, torch_calls=len(rt.steps), max_abs_err=max_abs_err(got, expected))
    if not a.no_native:
        blk, why = native_block(rt)
        if blk is None:
            res["native_block"] = None
            res["native_block_skipped"] = why
        else:
            x = feeds[rt.inputs[0]]
            with torch.inference_mode():
                err = max_abs_err([blk(x)], expected)
            res["native_block"] = dict(time_calls(lambda: blk(x), a.iters, a.warmup), what=why, max_abs_err=err)
    res["blas_libs"] = loaded_blas()
    if a.json:
        print(json.dumps(res))
    else:
        print(f"{a.model}: torch {res['torch_version']}, {res['threads']} threads, BLAS {res['blas_libs']}")
        e = res["onnx_eager"]
        print(f"  ONNX graph eager ({e['nodes']} nodes, {e['torch_calls']} steps): median {e['median_ms']:.3f} ms "
              f"(p10 {e['p10_ms']:.3f}, p90 {e['p90_ms']:.3f}), max abs err {e['max_abs_err']:.2e}")
        nb = res.get("native_block")
        if nb:
            print(f"  native nn.Module block ({nb['what']}): median {nb['median_ms']:.3f} ms, "
                  f"max abs err {nb['max_abs_err']:.2e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
