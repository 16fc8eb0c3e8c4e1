// The core-op table as C++: CoreOp, its properties and the lookups from names (rows in core_ops.def).
#pragma once

#include <array>
#include <cstddef>
#include <limits>
#include <optional>
#include <string_view>

namespace tessel {

class Node;

// What a primitive is (docs/ir/core.md, "The primitives").
enum class CoreKind { unary, binary, compare, select, convert, bitcast, reduce, window, contraction, movement, sort };

// The vector-unit class one element of a primitive costs in a loop body (mirrors hw::VectorOp,
// which targets/dataflow/map.cpp maps it to); none: the primitive never sits in a loop body.
enum class VectorCost { add, mul, compare, convert, reduce, divide, transcendental, none };

// The operand dtypes the fused-loop code generators accept (kernel/fuse_groups.cpp, pointwise_ok, decides with it).
// floats: f32/f64; numeric: not bool; ints_bools: not float; all: any loop dtype; by_target: decided
// by the result dtype (convert); none: never generated.
enum class LoopTypes { floats, numeric, ints_bools, all, by_target, none };

// How the CPU code generator writes a primitive (targets/cpu/codegen.cpp).
// negate: `c x` for floats, `0 c x` through unsigned for integers; call: tsl_<c>(args...); infix: `a c b`;
// wrapping_infix: infix for floats, through unsigned for integers, c_bool for bool; min_max: tsl_<c>
// for floats, `a c_int b ? a : b` for integers, c_bool for bool; bitwise: `(a c_int b)` / c_bool;
// compare, select, cast: their own forms (direction attribute, ternary, C cast); reduction: an
// accumulator statement; none: not generated.
enum class CForm { negate, call, infix, wrapping_infix, min_max, bitwise, compare, select, cast, reduction, none };

// The reverse-mode derivative of a primitive (passes/autodiff_rules.cpp, docs/passes/autodiff.md).
// rule: a vector-Jacobian rule there; zero: the derivative is zero wherever it exists (floor,
// round_even) or the result is never a float (compare, and/or/xor, iota), so no cotangent flows back;
// none: not differentiable (bitcast_convert) — a cotangent that must pass it is an error.
enum class Vjp { rule, zero, none };

inline constexpr double kInfinity = std::numeric_limits<double>::infinity();
inline constexpr double kNoIdentity = std::numeric_limits<double>::quiet_NaN();

enum class CoreOp {
#define TESSEL_CORE_OP(id, ...) id,
#include "tessel/ir/core_ops.def"
#undef TESSEL_CORE_OP
};

struct CoreOpInfo {
  CoreOp op;
  std::string_view name;
  int arity;  // -1: variadic
  CoreKind kind;
  VectorCost cost;
  LoopTypes loop;
  CForm c_form;
  std::string_view c, c_int, c_bool;
  std::string_view ktir_f, ktir_i, ktir_b;
  std::string_view reduce_kind;  // "" when the op is no reduction's combiner
  double identity;               // kNoIdentity when reduce_kind is ""
  Vjp vjp;

  bool elementwise() const {
    return kind == CoreKind::unary || kind == CoreKind::binary || kind == CoreKind::compare || kind == CoreKind::select ||
           kind == CoreKind::convert || kind == CoreKind::bitcast;
  }
};

inline constexpr std::array kCoreOps = {
#define TESSEL_CORE_OP(id, name, arity, kind, cost, loop, c_form, c, c_int, c_bool, kf, ki, kb, red, ident, vjp) \
  CoreOpInfo{CoreOp::id, name, arity, CoreKind::kind, VectorCost::cost, LoopTypes::loop, CForm::c_form, c, c_int, c_bool, \
             kf, ki, kb, red, ident, Vjp::vjp},
#include "tessel/ir/core_ops.def"
#undef TESSEL_CORE_OP
};
inline constexpr size_t kNumCoreOps = kCoreOps.size();

// Rows are in enum order, so an op's row is its index.
constexpr const CoreOpInfo& core_op_info(CoreOp op) { return kCoreOps[static_cast<size_t>(op)]; }
constexpr std::string_view core_op_name(CoreOp op) { return core_op_info(op).name; }

// The primitive a name (text form, KInstr::op) spells; nullopt for anything else ("load", "Add", ...).
std::optional<CoreOp> core_op_named(std::string_view name);
// The primitive a node runs; nullopt unless its op is in the domain tessel.core.
std::optional<CoreOp> core_op_of(const Node& n);
// Whether `n` runs primitive `op` (its op is `op`'s name in the domain tessel.core): how code asks what a
// core node is, without spelling the name.
bool is_core_op(const Node& n, CoreOp op);
// The binary primitive that combines a `reduce`/`reduce_window` kind ("sum" -> add); nullopt if unknown.
std::optional<CoreOp> reduction_combiner(std::string_view kind);

// A reduction's kind (the `kind` attribute of reduce and reduce_window, a kernel's reduce instruction),
// named through the table's combiners: sum (add), max, min, prod (mul). nullopt for any other text.
enum class ReduceKind { sum, max, min, prod };
std::optional<ReduceKind> reduce_kind_named(std::string_view kind);
// The one definition of a floating-point reduction step, which every evaluator shares (the reference
// kernels, the typed core kernels): the identity, and a combine where NaN propagates through max and
// min (an accumulator that is NaN stays NaN; a NaN operand becomes the accumulator). Integer
// reductions differ by representation (a dtype's order, wrapping) and stay with their kernels.
constexpr double reduce_identity(ReduceKind k) {
  switch (k) {
    case ReduceKind::sum: return 0;
    case ReduceKind::prod: return 1;
    case ReduceKind::max: return -kInfinity;
    case ReduceKind::min: return kInfinity;
  }
  return 0;
}
constexpr void reduce_combine(ReduceKind k, double& acc, double v) {
  switch (k) {
    case ReduceKind::sum: acc += v; break;
    case ReduceKind::prod: acc *= v; break;
    case ReduceKind::max:
      if (acc == acc && (v != v || v > acc)) acc = v;  // (x != x: NaN, constexpr where std::isnan is not)
      break;
    case ReduceKind::min:
      if (acc == acc && (v != v || v < acc)) acc = v;
      break;
  }
}

std::string_view core_kind_name(CoreKind k);
std::string_view vector_cost_name(VectorCost c);
std::string_view vjp_name(Vjp v);

}  // namespace tessel
