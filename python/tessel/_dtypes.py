"""PyTorch's dtypes and tessel's dtype names, both ways (what _convert.py and aten_table.py share)."""
import torch

from . import _tessel

TORCH_TO_TESSEL = {
    torch.float32: "f32", torch.float64: "f64", torch.float16: "f16", torch.bfloat16: "bf16",
    torch.int64: "i64", torch.int32: "i32", torch.int16: "i16", torch.int8: "i8", torch.uint8: "u8",
    torch.bool: "bool",
}
TESSEL_TO_TORCH = {v: k for k, v in TORCH_TO_TESSEL.items()}


def tessel_dtype(dt, what):
    if dt not in TORCH_TO_TESSEL:
        raise _tessel.TesselError(f"{what} has dtype {dt}, which tessel does not support "
                                  f"(supported: {', '.join(str(d) for d in TORCH_TO_TESSEL)})")
    return TORCH_TO_TESSEL[dt]
