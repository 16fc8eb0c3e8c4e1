"""Real models through the CUDA target's symbolic code generator (docs/dynamic-shapes.md, "On CUDA"), without
a GPU: torchvision resnet18 and mobilenet_v2 and a small VisionTransformer exported to ONNX with a dynamic
batch, and torch's nn.TransformerEncoder with a dynamic batch and sequence length. For each,
`tessel compile --target cuda --dynamic`:
- keeps the dim_params as size symbols in the kernel level;
- gives every core node outside a kernel (pooling, copies, products, concatenations) a device function,
  so no node is left to a host step that would synchronise every call;
- gives every generated function the size parameters (`long long S0, ...`) last;
- and, where the CUDA toolkit's NVRTC is installed, the source compiles for sm_90.

    PYTHONPATH=build/python /usr/bin/python3 -m unittest tests.python.test_cuda_symbolic_models -v
"""
import ctypes
import ctypes.util
import os
import re
import subprocess
import tempfile
import unittest

import torch
import torchvision
from torchvision.models.vision_transformer import VisionTransformer

SOURCE_DIR = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TESSEL_BINARY = os.environ.get("TESSEL_BINARY", os.path.join(SOURCE_DIR, "build", "tessel"))


def _nvrtc():
    for path in (ctypes.util.find_library("nvrtc"), "/usr/local/cuda/lib64/libnvrtc.so"):
        if path:
            try:
                return ctypes.CDLL(path)
            except OSError:
                pass
    return None


def nvrtc_errors(lib, source):
    """NVRTC's error lines for `source` compiled for sm_90 (empty: it compiled)."""
    prog = ctypes.c_void_p()
    if lib.nvrtcCreateProgram(ctypes.byref(prog), source.encode(), b"model.cu", 0, None, None) != 0:
        return ["nvrtcCreateProgram failed"]
    opts = (ctypes.c_char_p * 1)(b"--gpu-architecture=sm_90")
    rc = lib.nvrtcCompileProgram(prog, 1, opts)
    n = ctypes.c_size_t()
    lib.nvrtcGetProgramLogSize(prog, ctypes.byref(n))
    log = ctypes.create_string_buffer(n.value)
    lib.nvrtcGetProgramLog(prog, log)
    lib.nvrtcDestroyProgram(ctypes.byref(prog))
    errors = [line for line in log.value.decode(errors="replace").splitlines() if "error" in line]
    return errors if errors or rc == 0 else [f"nvrtcCompileProgram returned {rc}"]


MODELS = [
    ("resnet18", lambda: torchvision.models.resnet18(), (2, 3, 64, 64), {0: "batch"}),
    ("mobilenet_v2", lambda: torchvision.models.mobilenet_v2(), (2, 3, 64, 64), {0: "batch"}),
    ("vit", lambda: VisionTransformer(image_size=32, patch_size=16, num_layers=2, num_heads=4, hidden_dim=64, mlp_dim=128),
     (2, 3, 32, 32), {0: "batch"}),
    ("encoder", lambda: torch.nn.TransformerEncoder(torch.nn.TransformerEncoderLayer(64, 4, 128, batch_first=True), 2,
                                                    enable_nested_tensor=False), (2, 10, 64), {0: "batch", 1: "seq"}),
]


class CudaSymbolicModels(unittest.TestCase):
    def test_real_models_generate_with_size_parameters(self):
        lib = _nvrtc()
        torch.manual_seed(0)
        with tempfile.TemporaryDirectory() as d:
            for name, ctor, shape, axes in MODELS:
                with self.subTest(model=name):
                    path = os.path.join(d, name + ".onnx")
                    torch.onnx.export(ctor().eval(), (torch.randn(*shape),), path, input_names=["x"], output_names=["y"],
                                      dynamic_axes={"x": axes}, opset_version=17)
                    run = lambda emit: subprocess.run([TESSEL_BINARY, "compile", path, "--target", "cuda", "--dynamic", "--emit", emit],
                                                      capture_output=True, text=True, timeout=300)
                    kernel, cuda = run("kernel"), run("cuda")
                    self.assertEqual(kernel.returncode, 0, kernel.stderr)
                    self.assertEqual(cuda.returncode, 0, cuda.stderr)
                    header = next(line for line in kernel.stdout.splitlines() if line.startswith("graph @"))
                    for symbol in axes.values():
                        self.assertIn(f"{symbol} in [", header)
                    # the graph's nodes by position: kernels, reshapes (aliases), and the core nodes that each need
                    # a device function tsl_n<position>
                    body = kernel.stdout.split(header, 1)[1].split("\n}\n", 1)[0]
                    nodes = [m.group(1) for m in re.finditer(r"^  %[^=\n]*= (\w+)\(", body, re.M)]
                    core = [i for i, op in enumerate(nodes) if op not in ("kernel", "reshape")]
                    functions = re.findall(r"__global__ void (tsl_\w+)\(([^)]*)\)", cuda.stdout)
                    names = {f for f, _ in functions}
                    for i in core:
                        self.assertTrue(f"tsl_n{i}" in names or f"tsl_n{i}_mm" in names,
                                        f"{name}: node {i} ({nodes[i]}) has no device function: a host step")
                    for f, params in functions:
                        if f != "tsl_hold":
                            self.assertRegex(params, r", long long S0(, long long S\d+)*$", f)
                    if lib is not None:
                        self.assertEqual(nvrtc_errors(lib, cuda.stdout), [], name)


if __name__ == "__main__":
    unittest.main()
