"""Gradients of `tessel compile MODEL --train` (reverse-mode autodiff on the core level) against torch
autograd: a small conv / max-pool / Linear / GELU / LayerNorm / softmax model exported to ONNX by torch
1.13, its joint graph run eagerly on torch's parameters, input and seed, every gradient within 1e-4.

Run through ctest (python_frontend) or by hand:
    PYTHONPATH=build/python /usr/bin/python3 -m unittest tests/python/test_train_grads.py -v
"""
import os
import re
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE_DIR = os.path.dirname(os.path.dirname(HERE))
TESSEL_BINARY = os.environ.get("TESSEL_BINARY", os.path.join(SOURCE_DIR, "build", "tessel"))

try:
    import torch
    HAVE_TORCH = True
except ImportError:
    HAVE_TORCH = False


sys.path.insert(0, os.path.join(SOURCE_DIR, "bench"))
import tensor_pb  # noqa: E402  (TensorProto files with NumPy alone)


def write_tensor(path, t, name):
    tensor_pb.write(path, t.detach().float().contiguous().numpy(), name)


if HAVE_TORCH:
    class Small(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = torch.nn.Conv2d(3, 4, 3, stride=2, padding=1)
            self.fc1 = torch.nn.Linear(4 * 4 * 4, 16)
            self.ln = torch.nn.LayerNorm(16)
            self.fc2 = torch.nn.Linear(16, 5)

        def forward(self, x):
            h = torch.nn.functional.max_pool2d(torch.tanh(self.conv(x)), 2, 1, padding=1)[:, :, :4, :4]
            h = self.ln(torch.nn.functional.gelu(self.fc1(h.flatten(1))))
            return torch.softmax(self.fc2(h), -1) * 3 + torch.sigmoid(h).sum(-1, keepdim=True)


@unittest.skipUnless(HAVE_TORCH, "needs torch")
@unittest.skipUnless(os.path.exists(TESSEL_BINARY), f"needs the tessel command ({TESSEL_BINARY}; set TESSEL_BINARY)")
class TrainGradients(unittest.TestCase):
    def test_gradients_match_torch_autograd(self):
        torch.manual_seed(0)
        m = Small()
        x = torch.randn(2, 3, 8, 8)
        with tempfile.TemporaryDirectory() as tmp:
            model = os.path.join(tmp, "model.onnx")
            torch.onnx.export(m, (x,), model, opset_version=17, do_constant_folding=False)
            joint = os.path.join(tmp, "joint.tsl")
            r = subprocess.run([TESSEL_BINARY, "compile", model, "--train", "-o", joint], capture_output=True,
                               text=True, timeout=300)
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertRegex(r.stdout, r"train: 8 parameters \(1269 elements\), 8 gradient outputs")
            # Gradients in f64 by torch; the joint graph's inputs: x, the parameters (in the order it
            # lifted them: the initializers'), the seed.
            md = Small().double()
            md.load_state_dict({k: v.double() for k, v in m.state_dict().items()})
            y = md(x.double())
            seed = torch.randn_like(y)
            y.backward(seed)
            with open(joint) as f:
                header = f.read().split("{", 1)[0]
            names = re.findall(r"%([\w.]+):", header)
            params = dict(md.named_parameters())
            order = names[1:-1]
            self.assertEqual(sorted(order), sorted(params))
            data = os.path.join(tmp, "data")
            os.makedirs(data)
            ins = [x] + [params[n] for n in order] + [seed]
            outs = [y] + [params[n].grad for n in order]
            for i, t in enumerate(ins):
                write_tensor(os.path.join(data, f"input_{i}.pb"), t, f"in{i}")
            for i, t in enumerate(outs):
                write_tensor(os.path.join(data, f"output_{i}.pb"), t, f"out{i}")
            r = subprocess.run([TESSEL_BINARY, "run", joint, "--inputs", data, "--check", "--max-rel", "1e-4"],
                               capture_output=True, text=True, timeout=300)
            self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
            self.assertEqual(r.stdout.count("-> PASS"), 1 + len(order), r.stdout)


SHARED_DIR = os.environ.get("TESSEL_SHARED_DIR", os.path.join(SOURCE_DIR, "..", "shared"))
TBLOCK_BERT = os.path.join(SHARED_DIR, "models", "tblock_bert")


def _varint_at(b, i):
    r = s = 0
    while True:
        c = b[i]
        i += 1
        r |= (c & 0x7F) << s
        s += 7
        if c < 0x80:
            return r, i


def _fields(b):
    """(field, value) of a protobuf message: varints as ints, length-delimited as bytes."""
    i = 0
    while i < len(b):
        k, i = _varint_at(b, i)
        f, w = k >> 3, k & 7
        if w == 0:
            v, i = _varint_at(b, i)
        elif w == 1:
            v, i = b[i:i + 8], i + 8
        elif w == 5:
            v, i = b[i:i + 4], i + 4
        elif w == 2:
            n, i = _varint_at(b, i)
            v, i = b[i:i + n], i + n
        else:
            raise ValueError(f"wire type {w}")
        yield f, v


def _tensor(b):
    """(name, float32 tensor) of an onnx.TensorProto with raw_data (the exporter's form)."""
    dims, name, raw = [], "", None
    for f, v in _fields(b):
        if f == 1:
            dims.append(v)
        elif f == 8:
            name = v.decode()
        elif f == 9:
            raw = v
    return name, torch.frombuffer(bytearray(raw), dtype=torch.float32).reshape(dims).clone()


def _initializers(path):
    with open(path, "rb") as f:
        model = f.read()
    graph = next(v for f, v in _fields(model) if f == 7)
    return dict(_tensor(v) for f, v in _fields(graph) if f == 5)


if HAVE_TORCH:
    import math

    class Block(torch.nn.Module):
        """tblock_bert's computation (its ONNX graph: pre-LN, one qkv MatMul, 12 heads, exact GELU)."""

        def __init__(self, d=768, heads=12, mlp=3072):
            super().__init__()
            self.heads = heads
            self.ln1, self.ln2 = torch.nn.LayerNorm(d), torch.nn.LayerNorm(d)
            self.qkv, self.proj = torch.nn.Linear(d, 3 * d), torch.nn.Linear(d, d)
            self.fc1, self.fc2 = torch.nn.Linear(d, mlp), torch.nn.Linear(mlp, d)

        def forward(self, x):
            b, t, c = x.shape
            h = self.heads
            q, k, v = self.qkv(self.ln1(x)).split(c, dim=-1)
            q, k, v = (z.view(b, t, h, c // h).transpose(1, 2) for z in (q, k, v))
            a = ((q @ k.transpose(-2, -1)) / math.sqrt(c // h)).softmax(-1)
            x = x + self.proj((a @ v).transpose(1, 2).reshape(b, t, c))
            return x + self.fc2(torch.nn.functional.gelu(self.fc1(self.ln2(x))))


@unittest.skipUnless(HAVE_TORCH, "needs torch")
@unittest.skipUnless(os.path.exists(TESSEL_BINARY), f"needs the tessel command ({TESSEL_BINARY}; set TESSEL_BINARY)")
@unittest.skipUnless(os.path.isdir(TBLOCK_BERT), "needs ../shared/models/tblock_bert")
class TblockBert(unittest.TestCase):
    def test_onnx_gradients_match_torch_autograd(self):
        """tblock_bert's ONNX graph through `tessel compile --train` against torch autograd on the same
        computation rebuilt from its initializers (ln2 shares ln1's initializers through Identity in the
        export, so their gradients add up; the MatMul weights are the Linear weights transposed). The
        rebuild reproduces the model's reference output first."""
        model = os.path.join(TBLOCK_BERT, "model.onnx")
        init = _initializers(model)
        with open(os.path.join(TBLOCK_BERT, "test_data_set_0", "input_0.pb"), "rb") as f:
            x = _tensor(f.read())[1]
        with open(os.path.join(TBLOCK_BERT, "test_data_set_0", "output_0.pb"), "rb") as f:
            want = _tensor(f.read())[1]
        m = Block().double()
        mats = {tuple(t.shape): n for n, t in init.items() if n.startswith("onnx::MatMul")}
        linear = {"qkv": (768, 2304), "proj": (768, 768), "fc1": (768, 3072), "fc2": (3072, 768)}
        source = {}     # torch parameter -> (initializer, transposed)
        for lin, shape in linear.items():
            source[f"{lin}.weight"] = (mats[shape], True)
            source[f"{lin}.bias"] = (f"{lin}.bias", False)
        for ln in ("ln1", "ln2"):
            for k in ("weight", "bias"):
                source[f"{ln}.{k}"] = (f"ln1.{k}", False)
        with torch.no_grad():
            for n, p in m.named_parameters():
                src, tr = source[n]
                p.copy_((init[src].t() if tr else init[src]).double())
        y = m(x.double())
        self.assertLess(((y.float() - want).abs().max() / want.abs().max()).item(), 1e-5)
        torch.manual_seed(0)
        seed = torch.randn_like(y)
        y.backward(seed)
        grads = {}      # initializer -> gradient (summed over the parameters it feeds)
        for n, p in m.named_parameters():
            src, tr = source[n]
            g = p.grad.t() if tr else p.grad
            grads[src] = grads[src] + g if src in grads else g
        with tempfile.TemporaryDirectory() as tmp:
            joint = os.path.join(tmp, "joint.tsl")
            r = subprocess.run([TESSEL_BINARY, "compile", model, "--train", "-o", joint], capture_output=True,
                               text=True, timeout=600)
            self.assertEqual(r.returncode, 0, r.stderr)
            with open(joint) as f:
                header = f.read(100000).split("{", 1)[0]
            names = [a or b for a, b in re.findall(r'%(?:"([^"]+)"|([\w.]+)):', header)]
            order = names[1:-1]
            self.assertEqual(sorted(order), sorted(grads))
            data = os.path.join(tmp, "data")
            os.makedirs(data)
            ins = [x] + [init[n] for n in order] + [seed]
            outs = [y] + [grads[n] for n in order]
            for i, t in enumerate(ins):
                write_tensor(os.path.join(data, f"input_{i}.pb"), t, f"in{i}")
            for i, t in enumerate(outs):
                write_tensor(os.path.join(data, f"output_{i}.pb"), t, f"out{i}")
            r = subprocess.run([TESSEL_BINARY, "run", joint, "--inputs", data, "--check", "--max-rel", "1e-4"],
                               capture_output=True, text=True, timeout=600)
            self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
            self.assertEqual(r.stdout.count("-> PASS"), 1 + len(order), r.stdout)


if __name__ == "__main__":
    unittest.main()
