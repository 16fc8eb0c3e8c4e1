// Lookups into the core-op table (core_ops.def): name -> CoreOp, node -> CoreOp, reduce kind -> combiner.
#include "tessel/ir/core_ops.h"

#include "tessel/ir/graph.h"
#include "tessel/ir/op_registry.h"

namespace tessel {
namespace {

// core_op_info indexes the array by the enumerator: the rows must stay in enum order.
constexpr bool rows_in_enum_order() {
  for (size_t i = 0; i < kNumCoreOps; ++i)
    if (static_cast<size_t>(kCoreOps[i].op) != i) return false;
  return true;
}
static_assert(rows_in_enum_order(), "kCoreOps rows must be in CoreOp order");

}  // namespace

std::optional<CoreOp> core_op_named(std::string_view name) {
  for (const CoreOpInfo& i : kCoreOps)
    if (i.name == name) return i.op;
  return std::nullopt;
}

std::optional<CoreOp> core_op_of(const Node& n) { return n.op ? n.op->core : std::nullopt; }

bool is_core_op(const Node& n, CoreOp op) { return n.op && n.op->core == op; }

std::optional<CoreOp> reduction_combiner(std::string_view kind) {
  if (kind.empty()) return std::nullopt;
  for (const CoreOpInfo& i : kCoreOps)
    if (i.reduce_kind == kind) return i.op;
  return std::nullopt;
}

std::optional<ReduceKind> reduce_kind_named(std::string_view kind) {
  switch (reduction_combiner(kind).value_or(CoreOp::neg)) {
    case CoreOp::add: return ReduceKind::sum;
    case CoreOp::max: return ReduceKind::max;
    case CoreOp::min: return ReduceKind::min;
    case CoreOp::mul: return ReduceKind::prod;
    default: return std::nullopt;
  }
}

std::string_view core_kind_name(CoreKind k) {
  switch (k) {
    case CoreKind::unary: return "unary";
    case CoreKind::binary: return "binary";
    case CoreKind::compare: return "compare";
    case CoreKind::select: return "select";
    case CoreKind::convert: return "convert";
    case CoreKind::bitcast: return "bitcast";
    case CoreKind::reduce: return "reduce";
    case CoreKind::window: return "window";
    case CoreKind::contraction: return "contraction";
    case CoreKind::movement: return "movement";
    case CoreKind::sort: return "sort";
  }
  return "?";
}

std::string_view vector_cost_name(VectorCost c) {
  switch (c) {
    case VectorCost::add: return "add";
    case VectorCost::mul: return "mul";
    case VectorCost::compare: return "compare";
    case VectorCost::convert: return "convert";
    case VectorCost::reduce: return "reduce";
    case VectorCost::divide: return "divide";
    case VectorCost::transcendental: return "transcendental";
    case VectorCost::none: return "none";
  }
  return "?";
}

std::string_view vjp_name(Vjp v) {
  switch (v) {
    case Vjp::rule: return "rule";
    case Vjp::zero: return "zero";
    case Vjp::none: return "none";
  }
  return "?";
}

}  // namespace tessel
