// The outside project's program: parses a two-node graph, runs it with tessel's eager interpreter and
// prints the result and tessel's version (tests/install/check.sh compares both).
#include <cstdio>

#include "tessel/ir/printer.h"
#include "tessel/runtime/interpreter.h"
#include "tessel/support/version.h"

int main() {
  auto g = tessel::parse_graph(R"(graph @g(%x: f32[2]) {
  %y: f32[2] = Add(%x, %x) loc("add")
  %z: f32[2] = Relu(%y) loc("relu")
  return %z
})");
  tessel::Tensor x(tessel::DType::f32, {2});
  x.set_f(0, 1.5);
  x.set_f(1, -2.0);
  const auto out = tessel::run_eager(*g, {x});
  std::printf("tessel %s: relu(x + x) = [%g, %g]\n", tessel::version_text().c_str(), out.at(0).get_f(0), out.at(0).get_f(1));
  return out.at(0).get_f(0) == 3.0 && out.at(0).get_f(1) == 0.0 ? 0 : 1;
}
