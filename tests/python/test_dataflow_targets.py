"""tessel.compile(module, inputs, target=<dataflow chip>) (issue 35; docs/python.md, "Dataflow targets"): the
graph mapped onto a simulated chip (a hardware preset or file), each call's outputs from the functional
simulator against PyTorch eager -- within 1e-4 where the chip stores f32 (a hardware file derived from the
preset with f32 storage, as bench/tv_onnx.py makes: an exact check of the mapping), within the storage
precision's tolerance on the presets themselves -- and the timed simulation as .report, .trace(),
.html() and .ktir(). Bad targets and hardware files are one-line errors. A graph break runs in PyTorch
between the partitions the chip runs (host steps in the report); one whose output size is known only
at run time is refused (the chip maps static shapes).
"""
import json
import os
import shutil
import sys
import tempfile
import unittest

import torch
import torch.nn as nn

import tessel
from tessel import _tessel

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE_DIR = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(SOURCE_DIR, "bench"))
from test_torch_frontend import NonZeroBreak, UnloweredOpInTheMiddle  # noqa: E402

try:
    import torchvision
except ImportError:  # pragma: no cover - ./dev installs python3-torchvision
    torchvision = None

SANITIZED = bool(os.environ.get("TESSEL_SANITIZED"))
# the storage's rounding at every layer, as `tessel sim` holds the functional simulation to
TOLERANCE = {"f16": 2e-2, "bf16": 5e-2, "f32": 1e-4}


def max_rel(out, ref):
    return float((out - ref).abs().max() / ref.abs().max())


def mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(64, 128), nn.GELU(), nn.Linear(128, 32), nn.LayerNorm(32)).eval()


def f32_hw_file(preset, folder):
    """The preset with f32 storage (the mapping's exact check): bench/tv_onnx.py's, imported when used
    (that module needs torchvision)."""
    from tv_onnx import f32_hw_file as make
    return make(preset, folder)


class Tmp(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="tessel-dataflow-")

    def tearDown(self):
        shutil.rmtree(self.tmp, ignore_errors=True)


class Presets(Tmp):

    def test_every_preset_runs_the_mlp(self):
        m = mlp()
        x = torch.randn(16, 64)
        with torch.no_grad():
            ref = m(x)
        for target in _tessel.hw_presets():
            fast = tessel.compile(m, (x,), target=target)
            storage = fast.storage.split()[0]
            for _ in range(2):
                out = fast(x)
                self.assertEqual(out.shape, ref.shape)
                self.assertEqual(out.dtype, torch.float32)
                self.assertLess(max_rel(out, ref), TOLERANCE[storage], f"{target} ({fast.storage})")
            run = fast.last_run
            self.assertGreater(run["tiles"], 0)
            self.assertEqual(run["overflowed"], 0)
            r = fast.report
            self.assertEqual(r["target"], target)
            self.assertGreater(r["simulated_us"], 0)
            self.assertGreater(r["roofline_us"], 0)
            self.assertGreaterEqual(len(r["kernels"]), 2)          # two matmuls at least
            self.assertEqual(fast.stats.compiles, 1)
            self.assertIn("simulated", fast.report_table())
        # a new shape compiles again for the chip, with the reason
        out = fast(torch.randn(8, 64))
        self.assertEqual(out.shape, (8, 32))
        self.assertEqual(fast.stats.compiles, 2)

    def test_the_report_is_the_cli_report(self):
        """The report's figures are the ones `tessel sim --json` gives for the same graph: its totals
        are its kernels' sums, and the FLOPs are the model's (two matmuls of 16x64x128 and 16x128x32)."""
        m = mlp()
        fast = tessel.compile(m, (torch.randn(16, 64),), target="spyre")
        r = fast.report
        matmul_flops = 2 * 16 * 64 * 128 + 2 * 16 * 128 * 32
        self.assertGreaterEqual(r["flops"], matmul_flops)
        self.assertLess(r["flops"], matmul_flops * 1.2)     # plus the elementwise and LayerNorm work
        self.assertAlmostEqual(r["flops"], sum(k["flops"] for k in r["kernels"]), delta=1)
        self.assertEqual(r["padding_waste_bytes"], r["padded_bytes"] - r["logical_bytes"])

    def test_trace_html_and_ktir(self):
        m = mlp()
        fast = tessel.compile(m, (torch.randn(16, 64),), target="spyre")
        trace = fast.trace(os.path.join(self.tmp, "t.json"))
        with open(trace) as f:
            events = json.load(f)["traceEvents"]
        self.assertTrue(any(e.get("ph") == "X" for e in events))
        page = fast.html(os.path.join(self.tmp, "r.html"))
        with open(page) as f:
            text = f.read()
        self.assertTrue(text.startswith("<!DOCTYPE html>"))
        self.assertIn("Sequential", text)
        manifest = fast.ktir(os.path.join(self.tmp, "ktir"))
        self.assertGreater(len(manifest["kernels"]), 0)
        for k in manifest["kernels"]:
            self.assertTrue(os.path.exists(os.path.join(self.tmp, "ktir", k["file"])), k)
        # nothing half written: no temporary file is left beside what was written
        self.assertEqual(sorted(os.listdir(self.tmp)), ["ktir", "r.html", "t.json"])

    def test_bad_targets_are_one_line_errors(self):
        m = mlp()
        x = torch.randn(4, 64)
        with self.assertRaisesRegex(tessel.TesselError, r"target 'sypre' is not one of cpu, cuda, spyre"):
            tessel.compile(m, (x,), target="sypre")
        with self.assertRaisesRegex(tessel.TesselError, r"not a dataflow storage dtype"):
            tessel.compile(m, (x,), target="spyre", precision="i8")
        with self.assertRaisesRegex(tessel.TesselError, r"f32"):        # spyre stores f16/bf16 only
            tessel.compile(m, (x,), target="spyre", precision="f32")
        bad = os.path.join(self.tmp, "bad.json")
        with open(os.path.join(SOURCE_DIR, "hw", "spyre.json")) as f:
            hw = json.load(f)
        hw["cores"] = -3
        with open(bad, "w") as f:
            json.dump(hw, f)
        with self.assertRaises(tessel.TesselError) as e:
            tessel.compile(m, (x,), target=bad)
        self.assertIn("bad.json", str(e.exception))
        self.assertIn("cores", str(e.exception))
        self.assertNotIn("\n", str(e.exception))
        with self.assertRaisesRegex(tessel.TesselError, r"timed simulation of a dataflow target"):
            tessel.compile(m, (x,)).report

    def test_a_data_dependent_break_is_refused(self):
        torch.manual_seed(0)
        with self.assertRaises(tessel.TesselError) as e:
            tessel.compile(NonZeroBreak().eval(), (torch.randn(32, 64),), target="spyre")
        self.assertRegex(str(e.exception), r"map partition 1.*NonZero.*known only at run time.*maps static shapes")
        self.assertNotIn("\n", str(e.exception))

    def test_graph_breaks_run_on_the_host_between_partitions(self):
        """torch.erfinv has no lowering: the chip runs the Linear before it and the one after it (two
        partitions, each mapped and simulated), PyTorch runs erfinv between them, and the report lists
        it as a host step. With f32 storage the outputs are eager's within 1e-4. One trace and one HTML
        page cover both partitions and the break."""
        torch.manual_seed(0)
        m, x = UnloweredOpInTheMiddle().eval(), torch.randn(16, 8)
        hw = f32_hw_file("tpu-v5e", self.tmp)
        fast = tessel.compile(m, (x,), target=hw, precision="f32")
        for k in range(3):
            x = torch.randn(16, 8)
            with torch.no_grad():
                self.assertLess(max_rel(fast(x), m(x)), 1e-4, f"call {k}")
        r = fast.report
        self.assertEqual(len(r["partitions"]), 2)
        self.assertEqual([b["op"] for b in r["breaks"]], ["aten.erfinv.default"])
        self.assertEqual(r["breaks"][0]["runs_on"], "host (PyTorch)")
        self.assertEqual(r["breaks"][0]["after_partition"], 0)
        self.assertAlmostEqual(r["simulated_us"], sum(p["simulated_us"] for p in r["partitions"]), places=6)
        self.assertEqual({k["partition"] for k in r["kernels"]}, {0, 1})    # tanh; the Linear and relu
        self.assertGreaterEqual(fast.last_run["host_steps"], 1)
        table = fast.report_table()
        self.assertIn("host step (PyTorch, not timed)", table)
        self.assertIn("partition 1 of 2, on the chip", table)
        self.assertEqual(len(fast.explanation.breaks), 1)
        # one trace: partition 1's events after partition 0's, the break an instant on the host track there
        fast.trace(os.path.join(self.tmp, "t.json"))
        with open(os.path.join(self.tmp, "t.json")) as f:
            t = json.load(f)
        parts = t["otherData"]["partitions"]
        self.assertEqual([p["partition"] for p in parts], [0, 1])
        self.assertAlmostEqual(sum(p["us"] for p in parts), r["simulated_us"], places=3)
        spans = [e for e in t["traceEvents"] if e.get("ph") == "X"]
        self.assertEqual({e["args"]["partition"] for e in spans}, {0, 1})
        # an event's kernel is the report's kernel of that number, in the event's partition
        for e in spans:
            if "kernel" in e["args"]:
                self.assertEqual(r["kernels"][e["args"]["kernel"]]["partition"], e["args"]["partition"], e)
        end0 = max(e["ts"] + e["dur"] for e in spans if e["args"]["partition"] == 0)
        self.assertLessEqual(end0, parts[1]["start_us"] + 1e-6)
        self.assertGreaterEqual(min(e["ts"] for e in spans if e["args"]["partition"] == 1), parts[1]["start_us"] - 1e-6)
        host = [e for e in t["traceEvents"] if e.get("cat") == "host"]
        self.assertEqual([e["name"] for e in host], ["host step: aten.erfinv.default"])
        self.assertAlmostEqual(host[0]["ts"], parts[1]["start_us"], places=6)
        # one HTML page: the break in the host-steps table
        fast.html(os.path.join(self.tmp, "r.html"))
        with open(os.path.join(self.tmp, "r.html")) as f:
            page = f.read()
        self.assertIn("aten.erfinv.default", page)
        self.assertIn("after partition 0; runs in PyTorch", page)
        with self.assertRaisesRegex(tessel.TesselError, r"\.ktir\(\) covers one graph mapped whole.*1 graph break"):
            fast.ktir(os.path.join(self.tmp, "k"))


@unittest.skipIf(torchvision is None, "torchvision is not installed")
@unittest.skipIf(SANITIZED, "torchvision models are slow in the sanitized build")
class Torchvision(Tmp):
    """torchvision models straight onto the chips: with f32 storage the mapping is exact (1e-4); on the
    presets' own storage resnet18's output stays within the storage's tolerance."""

    def check(self, model, x, target, precision, tol):
        with torch.no_grad():
            ref = model(x)
        fast = tessel.compile(model, (x,), target=target, precision=precision, threads=2)
        err = max_rel(fast(x), ref)
        self.assertLess(err, tol, f"{target} {fast.storage}: rel err {err:.2e}")
        self.assertGreater(fast.report["simulated_us"], 0)

    def test_resnet18(self):
        torch.manual_seed(0)
        m = torchvision.models.resnet18().eval()
        x = torch.randn(1, 3, 64, 64)
        self.check(m, x, f32_hw_file("spyre", self.tmp), "f32", 1e-4)
        self.check(m, x, f32_hw_file("tpu-v5e", self.tmp), "f32", 1e-4)
        self.check(m, x, "spyre", None, TOLERANCE["f16"])
        self.check(m, x, "tpu-v5e", None, TOLERANCE["bf16"])

    def test_mobilenet_v3_small(self):
        torch.manual_seed(0)
        m = torchvision.models.mobilenet_v3_small().eval()
        x = torch.randn(1, 3, 64, 64)
        self.check(m, x, f32_hw_file("spyre", self.tmp), "f32", 1e-4)
        # Spyre's DL16 storage flushes this random-weight model's small activations to zero (its output
        # is then the last bias: rel err ~1); the call says so once, naming the first kernel, and bf16
        # storage (f32's range) holds it
        fast = tessel.compile(m, (x,), target="spyre", threads=2)
        with self.assertWarnsRegex(UserWarning, r"values fell below f16 \(DL16\)'s range and became 0 \(first: t\d+ "
                                                r"\(kernel k\d+.*precision='bf16' keeps f32's range"):
            fast(x)
        self.assertGreater(fast.last_run["flushed"], 0)
        self.check(m, x, "spyre", "bf16", TOLERANCE["bf16"])


TESSEL_BINARY = os.environ.get("TESSEL_BINARY", os.path.join(SOURCE_DIR, "build", "tessel"))


class Export(Tmp):
    """tessel.export writes a model folder (model.tsl + test_data_set_0 with eager's outputs) that the
    command line takes as it takes an ONNX model-zoo folder."""

    def tessel(self, *args):
        import subprocess
        r = subprocess.run([TESSEL_BINARY, "--quiet", *args], capture_output=True, text=True, timeout=600)
        self.assertEqual(r.returncode, 0, f"tessel {' '.join(args)}:\n{r.stdout}\n{r.stderr}")
        return r.stdout

    @unittest.skipUnless(os.path.exists(TESSEL_BINARY), f"needs the tessel command ({TESSEL_BINARY}; set TESSEL_BINARY)")
    def test_every_command_takes_the_folder(self):
        m = mlp()
        folder = tessel.export(m, (torch.randn(16, 64),), os.path.join(self.tmp, "mlp"))
        self.assertEqual(sorted(os.listdir(folder)), ["model.tsl", "test_data_set_0"])
        self.assertEqual(sorted(os.listdir(os.path.join(folder, "test_data_set_0"))), ["input_0.pb", "output_0.pb"])
        self.assertIn("PASS", self.tessel("run", folder, "--check"))
        self.assertIn("PASS", self.tessel("run", folder, "--check", "--backend", "compiled"))
        self.assertIn("PASS", self.tessel("sim", folder, "--hw", "spyre"))
        self.assertIn("spyre", self.tessel("landscape", folder, "--targets", "spyre,tpu-v5e,cpu"))
        self.tessel("explain", folder, "--check")
        page = os.path.join(self.tmp, "r.html")
        self.tessel("report", folder, "--hw", "spyre", "-o", page)
        self.assertTrue(os.path.getsize(page) > 1000)

    @unittest.skipUnless(os.path.exists(TESSEL_BINARY), f"needs the tessel command ({TESSEL_BINARY}; set TESSEL_BINARY)")
    def test_landscape_rows_are_the_clis(self):
        """tessel.landscape's dataflow rows are `tessel landscape --json`'s for the exported folder (the same
        graph, the same timed simulation); its cpu row is measured and within 1e-4 of eager."""
        m = mlp()
        x = torch.randn(16, 64)
        rows = tessel.landscape(m, (x,), targets=("spyre", "tpu-v5e", "cpu"), iters=3)
        self.assertEqual([r["target"] for r in rows], ["spyre", "tpu-v5e", "cpu"])
        folder = tessel.export(m, (x,), os.path.join(self.tmp, "mlp"))
        out = os.path.join(self.tmp, "land.json")
        self.tessel("landscape", folder, "--targets", "spyre,tpu-v5e", "--json", out)
        with open(out) as f:
            cli = json.load(f)
        for mine, theirs in zip(rows, cli):
            for k in ("time_us", "utilisation", "dram_mb", "padding_mb", "scratchpad_peak_kb", "roofline_us", "cores",
                      "dtype"):
                self.assertEqual(mine[k], theirs[k], f"{mine['target']} {k}")
            self.assertLess(mine["max_rel_err"], TOLERANCE[mine["dtype"]])
        self.assertGreater(rows[2]["time_us"], 0)
        self.assertLess(rows[2]["max_rel_err"], 1e-4)

    @unittest.skipUnless(os.path.exists(TESSEL_BINARY), f"needs the tessel command ({TESSEL_BINARY}; set TESSEL_BINARY)")
    @unittest.skipIf(torchvision is None or SANITIZED, "torchvision (not in the sanitized build)")
    def test_resnet18_round_trip(self):
        torch.manual_seed(0)
        m = torchvision.models.resnet18().eval()
        folder = tessel.export(m, (torch.randn(1, 3, 32, 32),), os.path.join(self.tmp, "resnet18"))
        self.assertIn("PASS", self.tessel("run", folder, "--check", "--backend", "compiled"))

    @unittest.skipUnless(os.path.exists(TESSEL_BINARY), f"needs the tessel command ({TESSEL_BINARY}; set TESSEL_BINARY)")
    @unittest.skipIf(torchvision is None or SANITIZED, "torchvision (not in the sanitized build)")
    def test_resnet18_on_two_chips(self):
        """torchvision's resnet18 (not written for the test) sharded over a 2-chip ring both ways
        (docs/multichip.md): tensor parallel splits its convolutions by channels (half the weights a chip,
        all-reduces after the input-channel splits), data parallel its batch; every rank's outputs equal to
        the whole graph's, which `run --check` holds to PyTorch's."""
        torch.manual_seed(0)
        m = torchvision.models.resnet18().eval()
        folder = tessel.export(m, (torch.randn(2, 3, 64, 64),), os.path.join(self.tmp, "resnet18"))
        self.assertIn("PASS", self.tessel("run", folder, "--check"))
        with open(os.path.join(SOURCE_DIR, "examples", "multichip", "spyre_ring4.json")) as f:
            hw = json.load(f)
        hw["system"]["chips"] = 2
        hw_file = os.path.join(self.tmp, "ring2.json")
        with open(hw_file, "w") as f:
            json.dump(hw, f)
        runs = {}
        for shard in ("tp=2", "dp=2"):
            out = os.path.join(self.tmp, shard + ".json")
            self.tessel("sim", folder, "--hw", hw_file, "--shard", shard, "--json", out)
            with open(out) as f:
                runs[shard] = json.load(f)
            self.assertLess(runs[shard]["functional_max_rel"], 1e-5, shard)
            self.assertEqual(len(runs[shard]["chips_time"]), 2)
        tp, dp = runs["tp=2"]["sharding"], runs["dp=2"]["sharding"]
        self.assertGreater(tp["all_reduces"], 0)
        self.assertLess(tp["weight_bytes_per_chip"], 0.6 * tp["weight_bytes"])
        self.assertEqual(dp["all_reduces"], 0)
        self.assertGreaterEqual(dp["weight_bytes_per_chip"], dp["weight_bytes"])  # every weight whole (and its slice bounds)

    @unittest.skipUnless(os.path.exists(TESSEL_BINARY), f"needs the tessel command ({TESSEL_BINARY}; set TESSEL_BINARY)")
    @unittest.skipIf(torchvision is None or SANITIZED, "torchvision (not in the sanitized build)")
    def test_an_underflowing_model_fails_with_its_reason(self):
        """Random-weight mobilenet_v3_small's activations shrink below DL16's smallest normal (2^-30) by the
        last blocks (eager's own values, checked here): Spyre's storage flushes them, and `sim` fails its
        check saying how many values fell out of the range and where the first did; bf16 storage passes."""
        import subprocess
        torch.manual_seed(0)
        m = torchvision.models.mobilenet_v3_small().eval()
        x = torch.randn(1, 3, 64, 64)
        with torch.no_grad():
            feats = m.features(x)
        self.assertLess(float(feats.abs().max()), 2.0 ** -20)       # the model's own scale, not tessel's
        folder = tessel.export(m, (x,), os.path.join(self.tmp, "mnv3"))
        r = subprocess.run([TESSEL_BINARY, "--quiet", "sim", folder, "--hw", "spyre"], capture_output=True,
                           text=True, timeout=600)
        self.assertEqual(r.returncode, 1, r.stdout + r.stderr)
        self.assertIn("-> FAIL", r.stdout)
        self.assertRegex(r.stdout, r"\d+ values fell below f16 \(DL16\)'s range and became 0 \(first: t\d+ .*node .*\); "
                                   r"bf16 storage keeps f32's range: --dtype bf16")
        self.assertIn("-> PASS", self.tessel("sim", folder, "--hw", "spyre", "--dtype", "bf16"))

    @unittest.skipUnless(os.path.exists(TESSEL_BINARY), f"needs the tessel command ({TESSEL_BINARY}; set TESSEL_BINARY)")
    def test_a_working_set_that_fits_no_split(self):
        """A chip whose scratchpad is too small for any tile of a kernel: tessel.compile, `sim` and `report`
        each give one line naming the pass, the node and the bytes needed against the bytes usable, and
        `report` writes no page (issue 35's bad input)."""
        import subprocess
        with open(os.path.join(SOURCE_DIR, "hw", "spyre.json")) as f:
            hw = json.load(f)
        hw["scratchpad"].update(bytes_per_core=4096, effective_working_set_bytes=1024)
        small = os.path.join(self.tmp, "small_spad.json")
        with open(small, "w") as f:
            json.dump(hw, f)
        m, x = mlp(), torch.randn(16, 64)
        with self.assertRaises(tessel.TesselError) as e:
            tessel.compile(m, (x,), target=small)
        said = str(e.exception)
        self.assertNotIn("\n", said)
        self.assertRegex(said, r"no (split|tile) fits the scratchpad.*needs \d+ bytes.*\d+ usable")
        self.assertIn("node '", said)
        folder = tessel.export(m, (x,), os.path.join(self.tmp, "mlp"))
        page = os.path.join(self.tmp, "page.html")
        for args in (["sim", folder, "--hw", small], ["report", folder, "--hw", small, "-o", page]):
            r = subprocess.run([TESSEL_BINARY, "--quiet", *args], capture_output=True, text=True, timeout=600)
            self.assertNotEqual(r.returncode, 0, args)
            lines = [ln for ln in (r.stdout + r.stderr).splitlines() if ln.strip()]
            self.assertEqual(len(lines), 1, lines)
            self.assertRegex(lines[0], r"\[tile\] node '.*': .*no (split|tile) fits the scratchpad")
        self.assertFalse(os.path.exists(page))

    def test_refusals_write_nothing(self):
        keep = os.path.join(self.tmp, "mine")
        os.makedirs(keep)
        with open(os.path.join(keep, "notes.txt"), "w") as f:
            f.write("mine")
        with self.assertRaisesRegex(tessel.TesselError, r"exists and is not an empty folder"):
            tessel.export(mlp(), (torch.randn(4, 64),), keep)
        self.assertEqual(os.listdir(keep), ["notes.txt"])
        with self.assertRaisesRegex(tessel.TesselError, r"graph break.*NonZero"):
            tessel.export(NonZeroBreak().eval(), (torch.randn(32, 64),), os.path.join(self.tmp, "nz"))
        self.assertEqual(sorted(os.listdir(self.tmp)), ["mine"])


class TorchCompileOptions(unittest.TestCase):

    def test_unknown_option_names_the_options(self):
        with self.assertRaisesRegex(tessel.TesselError, r"options \['tagret'\] are not tessel's"):
            tessel.tessel_backend(None, [], tagret="spyre")
        with self.assertRaisesRegex(tessel.TesselError, r"options \['tagret'\] are not tessel's"):
            tessel.tessel_backend(None, [], options={"tagret": "spyre"})
        with self.assertRaisesRegex(tessel.TesselError, r"mode 'max-autotune' is Inductor's"):
            tessel.tessel_backend(None, [], mode="max-autotune")
        with self.assertRaisesRegex(tessel.TesselError, r"options \['target'\] given twice"):
            tessel.tessel_backend(None, [], options={"target": "spyre"}, target="cpu")

    def test_options_come_as_one_dict(self):
        """torch.compile(backend="tessel", options={"target": "spyre"}) calls the backend with
        options={...} as one keyword (torch 2's wrapper for backends other than Inductor: the box's
        first run of it refused 'options' as an unknown name). Called as that wrapper calls it, on an
        FX graph, the graph runs on the simulated chip."""
        m = mlp()
        x = torch.randn(16, 64)
        gm = torch.fx.symbolic_trace(m)
        tessel.dynamo_graphs.clear()
        compiled = tessel.tessel_backend(gm, [x], options={"target": "spyre"}, mode=None)
        with torch.no_grad():
            out = compiled(x)
            self.assertLess(max_rel(out, m(x)), TOLERANCE["f16"])
        self.assertEqual(tessel.dynamo_graphs[-1].target, "spyre")
        self.assertGreater(tessel.dynamo_graphs[-1].report["simulated_us"], 0)

    def test_changed_dynamo_options_compile_again(self):
        """issue 41: a graph the backend compiled is compiled again, with the new options, once
        tessel.dynamo_options change (dynamo keeps its graphs: the old compilation was reused silently).
        The backend is called as dynamo calls it, on an FX graph (torch 1.13 has no dynamo)."""
        m = mlp()
        x = torch.randn(16, 64)
        gm = torch.fx.symbolic_trace(m)
        saved = dict(tessel.dynamo_options)
        tessel.dynamo_graphs.clear()
        try:
            compiled = tessel.tessel_backend(gm, [x])
            with torch.no_grad():
                compiled(x)
                self.assertEqual(tessel.dynamo_graphs[-1].target, "cpu")
                tessel.dynamo_options.update(target="spyre")
                out = compiled(x)
                self.assertEqual(len(tessel.dynamo_graphs), 2)
                self.assertEqual(tessel.dynamo_graphs[-1].target, "spyre")
                self.assertLess(max_rel(out, m(x)), TOLERANCE["f16"])
                compiled(x)                                   # unchanged since: no third compilation
                self.assertEqual(len(tessel.dynamo_graphs), 2)
        finally:
            tessel.dynamo_options.clear()
            tessel.dynamo_options.update(saved)

    @unittest.skipUnless(tessel.dynamo_registered, "torch.compile needs torch >= 2.0 (the GPU box)")
    def test_target_option(self):
        m = mlp()
        x = torch.randn(16, 64)
        torch._dynamo.reset()
        tessel.dynamo_graphs.clear()
        fast = torch.compile(m, backend="tessel", options={"target": "spyre"})
        with torch.no_grad():
            self.assertLess(max_rel(fast(x), m(x)), TOLERANCE["f16"])
        self.assertEqual(len(tessel.dynamo_graphs), 1)
        self.assertGreater(tessel.dynamo_graphs[0].report["simulated_us"], 0)


if __name__ == "__main__":
    unittest.main()
