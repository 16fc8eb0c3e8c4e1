"""The Python package's modules import each other without a circle (issue 36): every relative import,
at module level or inside a function, is an edge; the graph of python/tessel's modules must be acyclic.
(Shared pieces live in modules of their own: _calls.py for _compile and _train, _dtypes.py for _convert
and aten_table, _frames.py for _capture and _dynamic.)"""
import ast
import os
import unittest

PKG = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python", "tessel")


def import_graph(folder):
    """{module: set of package modules it imports (relative imports anywhere in its source)}."""
    modules = {f[:-3] for f in os.listdir(folder) if f.endswith(".py")}
    graph = {}
    for m in modules:
        with open(os.path.join(folder, m + ".py")) as f:
            tree = ast.parse(f.read(), m)
        edges = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.level == 1:
                if node.module:
                    edges.add(node.module.split(".")[0])
                else:
                    edges.update(a.name for a in node.names)
        graph[m] = {e for e in edges if e in modules and e != m}
    return graph


def find_cycle(graph):
    """One import circle as a list of modules (first repeated at the end), or None."""
    state, path = {}, []

    def visit(m):
        state[m] = 1
        path.append(m)
        for n in sorted(graph[m]):
            if state.get(n) == 1:
                return path[path.index(n):] + [n]
            if n not in state:
                c = visit(n)
                if c:
                    return c
        state[m] = 2
        path.pop()
        return None
    for m in sorted(graph):
        if m not in state:
            c = visit(m)
            if c:
                return c
    return None


class ImportGraph(unittest.TestCase):
    def test_no_circle(self):
        graph = import_graph(PKG)
        self.assertIn("_compile", graph)
        cycle = find_cycle(graph)
        self.assertIsNone(cycle, f"import circle: {' -> '.join(cycle or [])}")

    def test_finds_a_circle(self):
        # The checker itself: a circle through a function-level import is found.
        self.assertEqual(find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}), ["a", "b", "c", "a"])
        self.assertIsNone(find_cycle({"a": {"b"}, "b": set(), "c": {"a", "b"}}))


if __name__ == "__main__":
    unittest.main()
