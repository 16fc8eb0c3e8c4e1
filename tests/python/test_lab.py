"""examples/lab/ (issue 35): each step of the course's lab runs end to end at small sizes and checks its own
figures -- outputs against PyTorch eager, the quiz's numbers against a hand computation from the formula
and the hardware file -- exiting non-zero on a mismatch."""
import os
import subprocess
import sys
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
LAB = os.path.join(os.path.dirname(os.path.dirname(HERE)), "examples", "lab")
SANITIZED = bool(os.environ.get("TESSEL_SANITIZED"))


@unittest.skipIf(SANITIZED, "the lab compiles whole blocks: slow in the sanitized build, and no code of its own")
class Lab(unittest.TestCase):

    def step(self, script, *expect):
        r = subprocess.run([sys.executable, os.path.join(LAB, script), "--small"], capture_output=True, text=True,
                           timeout=600, env=dict(os.environ))
        self.assertEqual(r.returncode, 0, f"{script}:\n{r.stdout}\n{r.stderr[-3000:]}")
        for e in expect:
            self.assertRegex(r.stdout, e, script)
        return r.stdout

    def test_1_compile_block(self):
        self.step("01_compile_block.py", r"compile \+ first call [\d.]+ s, rel err", r"break-even")

    def test_2_ablate_backends(self):
        out = self.step("02_ablate_backends.py", r"tessel eager", r"tessel graph", r"tessel compiled")
        rows = [line for line in out.splitlines() if line.startswith(("pytorch", "tessel", "torch.compile"))]
        self.assertGreaterEqual(len(rows), 4, out)

    def test_3_graph_break(self):
        self.step("03_graph_break.py", r"1 break\(s\)", r"nonzero-gather-reduce", r"with repair=True: 1 graph, 0 breaks")

    def test_4_read_kernels(self):
        self.step("04_read_kernels.py", r"matmul", r"kernel k0 ", r"functional simulation vs eager")

    def test_5_landscape(self):
        self.step("05_landscape.py", r"\nspyre ", r"\ntpu-v5e ", r"\ncpu ")

    def test_6_quiz(self):
        out = self.step("06_quiz.py", r"all four agree")
        self.assertNotIn("DISAGREE", out)
        self.assertEqual(out.count(": agree"), 8)


if __name__ == "__main__":
    unittest.main()
