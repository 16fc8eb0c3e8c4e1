# Builds and installs the tessel Python package and the `tessel` command with pip (README, "Install"):
#   python3 -m venv --system-site-packages v && v/bin/pip install --no-build-isolation .
# setuptools drives the CMake build of this checkout (Debian 12's setuptools 66 and wheel, no network):
# it configures a RelWithDebInfo tree in build-pip/ (or uses the tree $TESSEL_PIP_BUILD_DIR names, e.g. an
# already built `build`), builds only the CLI and the extension, and installs
#   tessel/            python/tessel/*.py and the extension tessel._tessel   (site-packages)
#   bin/tessel         the C++ command line itself, as a data file         (the venv's or ~/.local's bin)
# docs/decisions.md, "Packaging", says why the command is the C++ binary and not a Python entry point.
import os
import re
import shutil
import subprocess
import sys
import sysconfig

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = os.path.dirname(os.path.abspath(__file__))
BUILD = os.path.abspath(os.environ.get("TESSEL_PIP_BUILD_DIR") or os.path.join(ROOT, "build-pip"))
STAGE = os.path.join(BUILD, "pip-stage")  # the CLI, copied (and stripped) here for install_data


def release_number():
    text = open(os.path.join(ROOT, "CMakeLists.txt"), encoding="utf-8").read()
    return re.search(r"project\(tessel VERSION ([0-9.]+)", text).group(1)


def run(cmd):
    print("tessel setup.py:", " ".join(cmd), flush=True)
    subprocess.check_call(cmd, cwd=ROOT)


def copy_stripped(src, dst):
    """Copies a built binary without its debug information (a RelWithDebInfo tree's is most of its size)."""
    os.makedirs(os.path.dirname(dst), exist_ok=True)
    shutil.copyfile(src, dst)
    shutil.copymode(src, dst)
    if shutil.which("strip"):
        subprocess.check_call(["strip", "--strip-debug", dst])


class CMakeBuild(build_ext):
    """The extension and the CLI come from CMake, not from setuptools' compiler."""

    def build_extension(self, ext):
        if not os.path.exists(os.path.join(BUILD, "CMakeCache.txt")):
            # RelWithDebInfo (-O2), the configuration ./dev builds and tests: GCC 12 at -O3 warns falsely
            # (-Werror=restrict in libstdc++'s char_traits) where -O2 does not. The debug information
            # is stripped from the installed copies.
            cmd = ["cmake", "-S", ROOT, "-B", BUILD, "-DCMAKE_BUILD_TYPE=RelWithDebInfo", "-DPython_EXECUTABLE=" + sys.executable]
            if shutil.which("ninja"):
                cmd += ["-G", "Ninja"]
            if shutil.which("ccache"):
                cmd += ["-DCMAKE_CXX_COMPILER_LAUNCHER=ccache"]
            run(cmd)
        # $CMAKE_BUILD_PARALLEL_LEVEL, which cmake --build reads, limits the jobs (e.g. 2 on a shared machine).
        # TESSEL_PIP_SKIP_BUILD=1: take the tree as it is (tests/install/check.sh: ctest uses it meanwhile).
        if not os.environ.get("TESSEL_PIP_SKIP_BUILD"):
            run(["cmake", "--build", BUILD, "--target", "tessel", "tessel_python"])
        suffix = sysconfig.get_config_var("EXT_SUFFIX")
        built = os.path.join(BUILD, "python", "tessel", "_tessel" + suffix)
        if not os.path.exists(built):
            raise SystemExit(f"tessel setup.py: {built} was not built: the tree {BUILD} was configured for another "
                             f"Python than {sys.executable} (or without pybind11-dev); remove it or set TESSEL_PIP_BUILD_DIR")
        copy_stripped(built, self.get_ext_fullpath(ext.name))
        copy_stripped(os.path.join(BUILD, "tessel"), os.path.join(STAGE, "tessel"))


setup(
    name="tessel",
    version=release_number(),
    description="A compiler for dataflow ML accelerators: ONNX and PyTorch models to CPU code and simulated chips",
    python_requires=">=3.11",
    package_dir={"": "python"},
    packages=["tessel"],
    ext_modules=[Extension("tessel._tessel", sources=[])],
    cmdclass={"build_ext": CMakeBuild},
    # install_data runs after build_ext has staged the CLI (a path relative to this folder, as setuptools wants).
    data_files=[("bin", [os.path.relpath(os.path.join(STAGE, "tessel"), ROOT)])],
    # setuptools' own build folders go inside the CMake tree, not into ./build (the developer's CMake tree).
    options={"build": {"build_base": os.path.join(BUILD, "setuptools")},
             "egg_info": {"egg_base": os.path.relpath(BUILD, ROOT)}},
    zip_safe=False,
)
