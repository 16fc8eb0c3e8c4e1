"""Where a traced op comes from: the innermost frame of the user's code (outside torch, tessel and the
standard library), of the current stack, of a traceback or of an FX node's recorded stack. Shared by
capture (_capture.py), the symbolic capture (_dynamic.py) and dynamo's graphs (_dynamo.py)."""
import contextlib
import linecache
import os
import re
import sys

import torch

_PKG_DIR = os.path.dirname(os.path.abspath(__file__))
_TORCH_DIR = os.path.dirname(os.path.abspath(torch.__file__))
# The source line of the FX node being traced when tessel traces an FX graph node by node (a dynamo
# graph: node_source), innermost last: the stack then holds only the interpreter, not the model's code.
_NODE_SOURCE = []


def _user_frame(frames=None):
    """'file.py:LINE `code`' of the innermost frame outside torch, tessel and the standard library
    (of a traceback's frames, or of the current stack -- walked directly: extract_stack reads every
    frame's source line, and this runs for every traced node -- or, while an FX graph's node is
    traced, of that node's recorded stack)."""
    if frames is None:
        if _NODE_SOURCE and _NODE_SOURCE[-1]:
            return _NODE_SOURCE[-1]
        frames = _stack_frames()
    for filename, lineno in frames:
        if _is_user_file(filename):
            code = linecache.getline(filename, lineno).strip()
            return f"{os.path.basename(filename)}:{lineno}" + (f" `{code}`" if code else "")
    return ""


def trace_frame(stack_trace):
    """_user_frame's form of the innermost user frame of an FX node's recorded stack (meta
    'stack_trace': a formatted traceback, innermost last), or ''."""
    frames = re.findall(r'File "([^"]+)", line (\d+), in [^\n]*\n([^\n]*)', stack_trace or "")
    for filename, line, code in reversed(frames):
        if _is_user_file(filename):
            code = code.strip()
            return f"{os.path.basename(filename)}:{line}" + (f" `{code}`" if code and not code.startswith("File ") else "")
    return ""


@contextlib.contextmanager
def node_source(stack_trace):
    """While an FX node runs under a trace: what tessel records as the source line is the node's own."""
    _NODE_SOURCE.append(trace_frame(stack_trace))
    try:
        yield
    finally:
        _NODE_SOURCE.pop()


def _stack_frames():
    f = sys._getframe(1)
    while f is not None:
        yield f.f_code.co_filename, f.f_lineno
        f = f.f_back


def _traceback_frames(tb_frames):
    return [(f.filename, f.lineno) for f in reversed(tb_frames)]


_USER_FILE = {}


def _is_user_file(filename):
    known = _USER_FILE.get(filename)
    if known is None:
        if filename.startswith("<"):
            known = filename == "<stdin>"
        else:
            fn = os.path.abspath(filename)
            # The standard library is not the user's code; installed packages are (a transformers model's
            # modeling_gpt2.py is where its value reads and nodes come from), except torch and tessel.
            installed = "/site-packages/" in fn or "/dist-packages/" in fn
            # (folders with their separator: torchvision's files start with torch's folder name too)
            known = not (fn.startswith(_TORCH_DIR + os.sep) or fn.startswith(_PKG_DIR + os.sep) or "/functorch/" in fn
                         or ("/lib/python3" in fn and not installed))
        _USER_FILE[filename] = known
    return known
