// Op family: elementwise arithmetic, math functions, comparisons, logical and bitwise ops, casts.
#include <cmath>

#include "tessel/ir/op_registry.h"
#include "tessel/support/error.h"

namespace tessel {
namespace {

// Both operands of an arithmetic binary op share one dtype (ONNX has no implicit promotion).
void infer_binary_same(InferCtx& ctx) {
  if (ctx.in(0).dtype != ctx.in(1).dtype)
    fail("operands have different dtypes {} and {}", dtype_name(ctx.in(0).dtype), dtype_name(ctx.in(1).dtype));
  infer_broadcast(ctx);
}

OpDef binary(std::string name, int since, BinaryF f, BinaryI fi) {
  OpDef d;
  d.name = std::move(name);
  d.min_inputs = d.max_inputs = 2;
  d.since = since;
  d.fusion = FusionKind::pointwise;
  d.infer = infer_binary_same;
  d.kernel = [f, fi](KernelCtx& c) { c.set_out(0, map_binary(c.in(0), c.in(1), f, fi)); };
  return d;
}

}  // namespace

void register_elementwise_ops(OpRegistry& r) {
  r.add(binary("Add", 7, [](double a, double b) { return a + b; },
               [](int64_t a, int64_t b) { return static_cast<int64_t>(static_cast<uint64_t>(a) + static_cast<uint64_t>(b)); }));
  r.add(binary("Sub", 7, [](double a, double b) { return a - b; },
               [](int64_t a, int64_t b) { return static_cast<int64_t>(static_cast<uint64_t>(a) - static_cast<uint64_t>(b)); }));
  r.add(binary("Mul", 7, [](double a, double b) { return a * b; },
               [](int64_t a, int64_t b) { return static_cast<int64_t>(static_cast<uint64_t>(a) * static_cast<uint64_t>(b)); }));
  r.add(binary("Div", 7, [](double a, double b) { return a / b; }, [](int64_t a, int64_t b) -> int64_t {
    if (b == 0) fail("integer division by zero");
    return a / b;
  }));
}

}  // namespace tessel
