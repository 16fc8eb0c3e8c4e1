"""tessel.optim: torch.optim-compatible optimizers whose step is a tessel-compiled graph (SGD with
momentum, AdamW with PyTorch's formulas: bias correction, decoupled weight decay). One graph per
parameter group over all its parameters, each parameter's update one fused loop (docs/training.md,
"Optimizer graphs"). The compiled step reads and writes the parameters and the state tensors in
place (the executable's outputs alias its inputs: docs/training.md, "In-place optimizer steps").

    opt = tessel.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
    loss.backward(); opt.step(); opt.zero_grad()
"""
import torch

from . import _tessel
from ._convert import from_buffer, to_buffer


class _Compiled(torch.optim.Optimizer):
    kind = None
    state_names = ()

    def __init__(self, params, defaults, threads):
        self._threads = threads if threads is not None else (_tessel.hardware_threads() or 1)
        self._steps = {}     # (group index, shapes, fixed hyperparameters) -> OptimizerStep
        super().__init__(params, defaults)

    def _hyper(self, group):
        raise NotImplementedError

    def _state_names(self, group):
        return self.state_names

    @property
    def compiled_steps(self):
        """The compiled step graphs, one per parameter group and shape set (kernels, loop_kernels)."""
        return list(self._steps.values())

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for gi, group in enumerate(self.param_groups):
            params = [p for p in group["params"] if p.grad is not None]
            if not params:
                continue
            for p in params:
                if p.dtype != torch.float32 or p.grad.is_sparse:
                    raise _tessel.TesselError(f"tessel.optim.{type(self).__name__}: parameters must be dense float32 "
                                              f"(got {p.dtype})")
            names = self._state_names(group)
            # One compiled step per set of parameters at the same step count (all of them, usually).
            by_step = {}
            for p in params:
                st = self.state[p]
                if not st:
                    st["step"] = 0
                    for n in names:
                        st[n] = torch.zeros_like(p, memory_format=torch.contiguous_format)
                by_step.setdefault(st["step"], []).append(p)
            hyper = self._hyper(group)
            for t, ps in by_step.items():
                shapes = [list(p.shape) for p in ps]
                key = (gi, tuple(map(tuple, shapes)), tuple(sorted(hyper.items())))
                opt = self._steps.get(key)
                if opt is None:
                    opt = self._steps[key] = _tessel.OptimizerStep(self.kind, shapes, hyper, self._threads)
                # The step writes p and the state over the arrays it is given: the tensors' own memory
                # (to_buffer copies only a non-contiguous tensor; that one is copied back).
                bufs, updated = [], []
                for p in ps:
                    bufs.append(to_buffer(p.detach()))
                    bufs.append(to_buffer(p.grad))
                    updated.append((p, bufs[-2]))
                    for n in names:
                        bufs.append(to_buffer(self.state[p][n]))
                        updated.append((self.state[p][n], bufs[-1]))
                opt.run(opt.scalars(group["lr"], t + 1), bufs)
                for tensor, (arr, _) in updated:
                    if arr.ctypes.data != tensor.data_ptr():
                        tensor.copy_(from_buffer(arr, "f32"))
                for p in ps:
                    self.state[p]["step"] = t + 1
        return loss


class AdamW(_Compiled):
    """torch.optim.AdamW's update (amsgrad=False, maximize=False), compiled by tessel."""
    kind = "adamw"
    state_names = ("exp_avg", "exp_avg_sq")

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2, threads=None):
        if lr < 0 or eps < 0 or not (0 <= betas[0] < 1 and 0 <= betas[1] < 1) or weight_decay < 0:
            raise ValueError(f"invalid AdamW hyperparameters lr={lr} betas={betas} eps={eps} "
                             f"weight_decay={weight_decay}")
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay), threads)

    def _hyper(self, group):
        b1, b2 = group["betas"]
        return dict(beta1=float(b1), beta2=float(b2), eps=float(group["eps"]), weight_decay=float(group["weight_decay"]))


class SGD(_Compiled):
    """torch.optim.SGD's update (momentum, dampening, Nesterov, L2 weight decay), compiled by tessel."""
    kind = "sgd"

    def __init__(self, params, lr=1e-3, momentum=0.0, dampening=0.0, weight_decay=0.0, nesterov=False, threads=None):
        if lr < 0 or momentum < 0 or weight_decay < 0:
            raise ValueError(f"invalid SGD hyperparameters lr={lr} momentum={momentum} weight_decay={weight_decay}")
        if nesterov and (momentum <= 0 or dampening != 0):
            raise ValueError("Nesterov momentum requires a momentum and zero dampening")
        super().__init__(params, dict(lr=lr, momentum=momentum, dampening=dampening, weight_decay=weight_decay,
                                      nesterov=nesterov), threads)

    def _state_names(self, group):
        return ("momentum_buffer",) if group["momentum"] != 0 else ()

    def _hyper(self, group):
        return dict(momentum=float(group["momentum"]), dampening=float(group["dampening"]),
                    weight_decay=float(group["weight_decay"]), nesterov=bool(group["nesterov"]))
