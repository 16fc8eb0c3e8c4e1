#!/usr/bin/env bash
# The install paths of README's "Install", taken as a user takes them, into fresh temporary folders:
#  1. `cmake --install` of the built tree; an outside CMake project (tests/install/consumer) finds the
#     package with find_package(tessel), links tessel::core, runs; the installed CLI runs.
#  2. a venv with the system site packages and `pip install --no-build-isolation` of this checkout;
#     `import tessel` and `tessel --version` from another folder, which agree with the build's CLI.
# pip reuses the already built tree ($TESSEL_PIP_BUILD_DIR, and TESSEL_PIP_SKIP_BUILD: ctest runs other
# tests on that tree meanwhile) instead of configuring a fresh one. usage: check.sh SOURCE_DIR BUILD_DIR [PYTHON]
set -euo pipefail
src=$(cd "$1" && pwd) build=$(cd "$2" && pwd) python=${3:-}
tmp=$(mktemp -d "${TMPDIR:-/tmp}/tessel-install-XXXXXX")
trap 'rm -rf "$tmp"' EXIT
want=$("$build/tessel" --version)
step() { echo "== [${SECONDS} s] $*"; }

step "cmake --install $build --prefix $tmp/prefix"
cmake --install "$build" --prefix "$tmp/prefix" >"$tmp/install.log"
got=$("$tmp/prefix/bin/tessel" --version)
[ "$got" = "$want" ] || { echo "installed CLI says '$got', the build '$want'"; exit 1; }
ls "$tmp/prefix/lib/cmake/tessel/tesselConfig.cmake" "$tmp/prefix/include/tessel/ir/graph.h" >/dev/null

step "an outside CMake project: find_package(tessel), link tessel::core"
generator=()
command -v ninja >/dev/null && generator=(-G Ninja)
cmake -S "$src/tests/install/consumer" -B "$tmp/consumer" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$tmp/prefix" >"$tmp/consumer.log" || { cat "$tmp/consumer.log"; exit 1; }
cmake --build "$tmp/consumer" >>"$tmp/consumer.log" || { cat "$tmp/consumer.log"; exit 1; }
out=$("$tmp/consumer/consumer")
echo "$out"
[ "$out" = "$want: relu(x + x) = [3, 0]" ] || { echo "unexpected: $out"; exit 1; }

if [ -z "$python" ]; then
  echo "no Python package in this build: the pip install is not checked"
  exit 0
fi
step "python3 -m venv --system-site-packages; pip install --no-build-isolation $src"
"$python" -m venv --system-site-packages "$tmp/venv"
TESSEL_PIP_BUILD_DIR=$build TESSEL_PIP_SKIP_BUILD=1 "$tmp/venv/bin/pip" install --no-build-isolation --no-deps --no-index \
  -q "$src" >"$tmp/pip.log" 2>&1 || { cat "$tmp/pip.log"; exit 1; }
cd "$tmp"  # not the checkout: the installed package, not python/tessel
py=$("$tmp/venv/bin/python" -c "import tessel, sys; print('tessel', tessel.__version__); print(tessel.__file__, file=sys.stderr)" 2>"$tmp/where")
cli=$("$tmp/venv/bin/tessel" --version)
echo "import tessel: $py (from $(cat "$tmp/where")); tessel --version: $cli"
case "$(cat "$tmp/where")" in "$tmp/venv/"*) ;; *) echo "tessel was imported from outside the venv"; exit 1 ;; esac
[ "$py" = "$want" ] && [ "$cli" = "$want" ] || { echo "versions differ: python '$py', installed CLI '$cli', build '$want'"; exit 1; }
"$tmp/venv/bin/tessel" run "$src/examples/tblock_s" --check | tail -1
"$tmp/venv/bin/pip" uninstall -y -q tessel
[ ! -e "$tmp/venv/bin/tessel" ] || { echo "pip uninstall left bin/tessel"; exit 1; }
echo "install check: PASS (${SECONDS} s)"
