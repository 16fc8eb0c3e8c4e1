// Shared queries and edits of the rewriting passes.
#include "tessel/passes/pass_util.h"

#include <algorithm>

#include "tessel/ir/op_registry.h"

namespace tessel {

const Node* core_producer(const Value* v, CoreOp op) {
  if (!v || !v->producer) return nullptr;
  const Node* p = v->producer;
  return is_core_op(*p, op) ? p : nullptr;
}

std::optional<double> splat_of(const Value* v) {
  if (const Node* p = core_producer(v, CoreOp::broadcast_in_dim)) return splat_of(p->inputs[0]);
  if (!v || !v->constant || v->constant->numel() == 0) return std::nullopt;
  const Tensor& t = *v->constant;
  const size_t es = static_cast<size_t>(dtype_size(t.dtype()));
  const uint8_t* b = t.bytes();
  for (int64_t i = 1; i < t.numel(); ++i)
    if (!std::equal(b, b + es, b + static_cast<size_t>(i) * es)) return std::nullopt;
  return is_float(t.dtype()) ? t.get_f(0) : static_cast<double>(t.get_i(0));
}

bool is_identity(const std::vector<int64_t>& perm) {
  for (size_t i = 0; i < perm.size(); ++i)
    if (perm[i] != static_cast<int64_t>(i)) return false;
  return true;
}

namespace {
// Mantissa digits and normal exponent range of each float format (for exact-widening checks).
struct FloatFormat {
  int digits, emin, emax;
};
std::optional<FloatFormat> float_format(DType t) {
  switch (t) {
    case DType::f64: return FloatFormat{53, -1022, 1023};
    case DType::f32: return FloatFormat{24, -126, 127};
    case DType::bf16: return FloatFormat{8, -126, 127};
    case DType::f16: return FloatFormat{11, -14, 15};
    case DType::f8e4m3fn: return FloatFormat{4, -6, 8};
    case DType::f8e4m3fnuz: return FloatFormat{4, -7, 7};
    case DType::f8e5m2: return FloatFormat{3, -14, 15};
    case DType::f8e5m2fnuz: return FloatFormat{3, -15, 15};
    case DType::f4e2m1: return FloatFormat{2, 0, 2};
    default: return std::nullopt;  // f8e8m0 has no sign and no zero: never treated as widening
  }
}
}  // namespace

bool converts_exactly(DType from, DType to) {
  if (from == to || is_bool(from)) return true;
  if (is_bool(to)) return false;
  if (is_int(from) && is_int(to)) {
    if (is_signed_int(from)) return is_signed_int(to) && dtype_bits(to) >= dtype_bits(from);
    return is_unsigned_int(to) ? dtype_bits(to) >= dtype_bits(from) : dtype_bits(to) > dtype_bits(from);
  }
  auto b = float_format(to);
  if (is_int(from)) return b && dtype_bits(from) - (is_signed_int(from) ? 1 : 0) <= b->digits;
  auto a = float_format(from);
  if (!a || !b) return false;
  // Precision, normal range, and the smallest subnormal (2^(emin - digits + 1)) must all fit.
  return a->digits <= b->digits && a->emin >= b->emin && a->emax <= b->emax &&
         a->emin - a->digits >= b->emin - b->digits;
}

bool forward_uses(Graph& g, Value* from, Value* to) {
  if (from == to) return false;
  const bool from_is_output = std::find(g.outputs.begin(), g.outputs.end(), from) != g.outputs.end();
  if (from_is_output) {
    const bool to_is_output = std::find(g.outputs.begin(), g.outputs.end(), to) != g.outputs.end();
    if (to->is_input || to->constant || to_is_output) return false;
    g.hand_name_over(from, to);
  }
  g.replace_all_uses(from, to);
  return true;
}

}  // namespace tessel
