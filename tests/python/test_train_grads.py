"""Gradients of `tessel compile MODEL --train` (reverse-mode autodiff on the core level) against torch
autograd: a small conv / max-pool / Linear / GELU / LayerNorm / softmax model exported to ONNX by torch
1.13, its joint graph run eagerly on torch's parameters, input and seed, every gradient within 1e-4.

Run through ctest (python_frontend) or by hand:
    PYTHONPATH=build/python /usr/bin/python3 -m unittest tests/python/test_train_grads.py -v
"""
import os
import re
import subprocess
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


def varint(v):
    out = b""
    while True:
        c, v = v & 0x7F, v >> 7
        if v:
            out += bytes([c | 0x80])
        else:
            return out + bytes([c])


def write(path, data):
    with open(path, "wb") as f:
        f.write(data)


def tensor_proto(t, name):
    """An onnx.TensorProto (float, raw_data) without the onnx package: dims=1, data_type=2, name=8, raw=9."""
    t = t.detach().float().contiguous()
    raw = t.numpy().tobytes()
    b = b"".join(b"\x08" + varint(d) for d in t.shape) + b"\x10\x01"
    return b + b"\x42" + varint(len(name)) + name.encode() + b"\x4a" + varint(len(raw)) + raw


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
                write(os.path.join(data, f"input_{i}.pb"), tensor_proto(t, f"in{i}"))
            for i, t in enumerate(outs):
                write(os.path.join(data, f"output_{i}.pb"), tensor_proto(t, f"out{i}"))
            r = subprocess.run([TESSEL_BINARY, "run", joint, "--inputs", data, "--check", "--max-rel", "1e-4"],
                               capture_output=True, text=True, timeout=300)
            self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
            self.assertEqual(r.stdout.count("-> PASS"), 1 + len(order), r.stdout)


if __name__ == "__main__":
    unittest.main()
