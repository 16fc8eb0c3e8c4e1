"""tessel.compile(..., train=True): a callable whose output PyTorch's autograd differentiates, the forward
and the backward both compiled by tessel (the joint graph cut by the remat partition). docs/python.md,
"Training"; docs/training.md."""
import time

import torch

from . import _tessel
from ._capture import _READ, Slot, capture
from ._calls import Stats, _call_builder, _const_name, _split_call, _StateGuard, _torch_threads_kept
from ._convert import Converted, from_buffer, tessel_dtype, to_buffer
from .aten_table import RandomMask


class _Step:
    """One compilation of a training step: the tessel TrainStep, where each of its inputs comes from (a
    call input index or a live parameter Slot) and which of them get gradients."""

    def __init__(self, module, tensors, sig, backend, threads):
        for i, a in enumerate(tensors):
            tessel_dtype(a.dtype, f"input {i}")
        captured = capture(module, tensors, (), _call_builder(sig))
        what = type(module).__name__
        # Buffers the module writes (BatchNorm's running statistics in training mode) are graph inputs
        # read live, and their new values are forward outputs written back after each forward, as
        # PyTorch's forward updates them.
        self.writes = [captured.sources[p] for p in captured.mutated]
        # Values the module reads into Python (value guards): the graph is specialised to them as for
        # inference; the forward also returns each read tensor, checked on every call (_GuardMiss).
        self.reads = captured.reads
        self.values = tuple(repr(r.value) for r in captured.reads)
        if captured.structure.count != 1:
            raise _tessel.TesselError(f"{what}: train=True differentiates one output tensor; the module returns "
                                      f"{captured.structure.count} (return the loss, or the output alone)")
        # Buffers and frozen parameters (requires_grad=False) are constants, guarded as tessel.compile
        # guards them; trainable parameters are graph inputs (they change every step).
        mutated = set(captured.mutated)
        frozen = {p: (_const_name(src), captured.example[p]) for p, src in enumerate(captured.sources)
                  if isinstance(src, Slot) and not captured.example[p].requires_grad and p not in mutated}
        conv = Converted(captured.gm, captured.example, name=what, frozen=frozen, masks=True)
        if conv.out_literals:
            raise _tessel.TesselError(f"{what}: train=True differentiates one output tensor; the module's output "
                                      "holds Python values besides it")
        if conv.fallbacks:
            raise _tessel.TesselError(f"{what}: train=True needs the whole module in tessel; "
                                      f"{len(conv.fallbacks)} aten op(s) fall back to PyTorch "
                                      f"(tessel.explain(module, inputs) names them)")
        self.feeds = [captured.sources[p] for p in conv.input_positions]
        # Gradients for the trainable parameters and the float call inputs that require them -- those
        # the graph uses: PyTorch leaves the .grad of a parameter the loss does not reach at None.
        placeholders = [n for n in captured.gm.graph.nodes if n.op == "placeholder"]
        grad_of = []
        for f, name, pos in zip(self.feeds, conv.input_names, conv.input_positions):
            t = tensors[f] if f.__class__ is int else f.get(tensors)
            if t.requires_grad and t.is_floating_point() and placeholders[pos].users:
                grad_of.append(name)
        if not grad_of:
            raise _tessel.TesselError(f"{what}: train=True found nothing to differentiate (no parameter or input "
                                      "requires grad)")
        # Dropout's masks: graph inputs after the placeholders', drawn by PyTorch on every call in graph
        # order (eager's order), so a step under a seed makes eager's masks (docs/training.md, "Dropout").
        self.masks = conv.masks
        self.feeds += conv.masks
        self.guard = _StateGuard(captured, conv.frozen_used, module, conv.attr_constants)
        self.structure = captured.structure
        with _torch_threads_kept():
            self.step = _tessel.TrainStep(conv.builder, grad_of, backend, threads)
        names = self.step.input_names
        where = {n: i for i, n in enumerate(names)}
        self.grad_slots = [where[n] for n in self.step.parameters]   # gradient k -> feed index
        self.requires = tuple(self._flags(tensors))

    def _flags(self, tensors):
        # (a mask is never differentiated, and drawing it here would advance PyTorch's generator)
        return (f.__class__ is not RandomMask and (tensors[f] if f.__class__ is int else f.get(tensors)).requires_grad
                for f in self.feeds)

    def inputs(self, tensors):
        return [tensors[f] if f.__class__ is int else f.get(tensors) for f in self.feeds]


class _GuardMiss(Exception):
    """A value guard of the compiled forward failed: the module's Python would take another path on this
    call (the message says which read); TrainModule tries another specialisation or recompiles."""


class _Function(torch.autograd.Function):
    """forward: the compiled forward (outputs + the tensors the partition saves, kept in tessel);
    backward: the compiled backward on them and the output's cotangent."""

    @staticmethod
    def forward(ctx, step, *inputs):
        bufs = [to_buffer(t.detach()) for t in inputs]
        with _torch_threads_kept():
            outs, saved = step.step.forward(bufs)
        for r, (a, d) in zip(step.reads, outs[1:]):   # the value guards, after the output
            t = from_buffer(a, d)
            if not r.holds(t):
                raise _GuardMiss(r.describe(_READ[r.kind](t)))
        if step.writes:                                 # then the buffers' new values (running statistics)
            for w, (a, d) in zip(step.writes, outs[1 + len(step.reads):]):
                (step.call_args[w] if isinstance(w, int) else w.get(step.call_args)).copy_(from_buffer(a, d))
        ctx.step, ctx.bufs, ctx.saved = step, bufs, saved
        ctx.versions = [t._version for t in inputs]      # (after the write-back: it bumps the buffers')
        ctx.inputs = inputs
        return from_buffer(*outs[0])

    @staticmethod
    def backward(ctx, g):
        step = ctx.step
        for t, v in zip(ctx.inputs, ctx.versions):
            if t._version != v:
                raise RuntimeError("one of the variables needed for tessel's compiled backward has been modified "
                                   "by an inplace operation (an optimizer step before backward())")
        with _torch_threads_kept():
            grads = step.step.backward(ctx.saved, ctx.bufs, to_buffer(g.contiguous()))
        out = [None] * (1 + len(ctx.bufs))
        for k, slot in enumerate(step.grad_slots):
            if ctx.needs_input_grad[1 + slot]:
                out[1 + slot] = from_buffer(*grads[k])
        ctx.saved = ctx.bufs = ctx.inputs = None   # backward runs once, as PyTorch's without retain_graph
        return tuple(out)


class TrainModule:
    """The callable tessel.compile(..., train=True) returns: each call runs the compiled forward inside a
    torch.autograd.Function whose backward runs the compiled backward, so loss.backward() fills the
    parameters' .grad as PyTorch's autograd would. Recompiles when the call's signature, the frozen
    state (buffers, training flags) or which tensors require grad change."""

    def __init__(self, module, example_inputs, backend="compiled", threads=None, cache_limit=8, example_kwargs=None):
        if backend not in ("compiled", "graph", "eager"):
            raise _tessel.TesselError(f"backend '{backend}' is not one of compiled, graph, eager")
        self.module = module
        self.backend = backend
        self.threads = threads if threads is not None else (_tessel.hardware_threads() or 1)
        self.cache_limit = cache_limit
        self.stats = Stats()
        self._cache = {}
        tensors, sig = _split_call(tuple(example_inputs), example_kwargs or {})
        self._compile(sig, tensors)

    def _compile(self, sig, tensors, reason=None):
        if len(self._cache) >= self.cache_limit:
            raise _tessel.TesselError(f"{type(self.module).__name__}: {reason or 'a new signature'} needs a new "
                                      f"training compilation, but cache_limit={self.cache_limit} are cached")
        t0 = time.perf_counter()
        step = _Step(self.module, tensors, sig, self.backend, self.threads)
        self.stats.compile_seconds += time.perf_counter() - t0
        if self.stats.compiles:
            self.stats.recompiles.append(reason or "new signature")
        self.stats.compiles += 1
        self._cache[(sig, step.requires, step.values)] = step
        self._last = step
        return step

    @property
    def step(self):
        """The most recent compilation's tessel TrainStep (summary, saved_bytes, text('forward'), ...)."""
        return self._last.step

    def __call__(self, *call_args, **call_kwargs):
        self.stats.calls += 1
        tensors, sig = _split_call(call_args, call_kwargs)
        # The compilations of this signature and requires_grad flags: one per path through the module's
        # Python (value guards), tried in turn.
        found = [s for key, s in self._cache.items() if key[0] == sig and tuple(s._flags(tensors)) == key[1]]
        reason = None
        if found:
            reason = found[0].guard.stale(tensors)
            if reason is not None:
                self._cache.clear()
                self.stats.refreshes += 1
                found = []
        for step in found:
            try:
                out = self._run(step, tensors)
            except _GuardMiss as miss:
                reason = f"value guard: {miss}"
                continue
            self.stats.cache_hits += 1
            return out
        step = self._compile(sig, tensors, reason)
        try:
            return self._run(step, tensors)
        except _GuardMiss as miss:
            raise _tessel.TesselError(
                f"{type(self.module).__name__}: captured again on this call's inputs, the graph still reads another "
                f"value than the trace did ({miss}); the module's Python depends on something other than its "
                "tensor inputs, parameters and buffers") from None

    def _run(self, step, tensors):
        self._last = step
        step.call_args = tensors        # where the forward writes the buffers back
        try:
            out = _Function.apply(step, *step.inputs(tensors))
        finally:
            step.call_args = None
        return step.structure.rebuild([out])
