// Collectives (domain tessel): the communication between the ranks of a sharded program
// (passes/shard.h, docs/multichip.md). Each rank runs its own graph; these nodes are where the ranks'
// graphs meet. The shape rule is a rank's view: AllReduce returns its input's shape, AllGather
// multiplies the gathered axis by the group's size. One rank alone has nothing to exchange, so the
// reference kernel runs a group of one (the identity); a larger group runs through run_spmd
// (runtime/spmd.h), which gives the node every rank's input at once.
#include "tessel/ir/op_registry.h"
#include "tessel/support/error.h"

namespace tessel {

namespace {

int64_t group_size(const Node& n) {
  const int64_t ranks = n.attr_i("ranks");
  if (ranks < 1 || ranks > 1024) fail("{}: ranks = {} is not in 1..1024", n.op_name(), ranks);
  return ranks;
}

void all_reduce_infer(InferCtx& ctx) {
  group_size(ctx.node());
  const std::string op = ctx.node().attr_s("reduce", "sum");
  if (op != "sum") fail("AllReduce: reduce '{}' is not sum (the only reduction tessel's collectives do)", op);
  if (!is_float(ctx.in(0).dtype)) fail("AllReduce of {}: only float tensors are summed", dtype_name(ctx.in(0).dtype));
  infer_same_as_input(ctx);
}

void all_gather_infer(InferCtx& ctx) {
  const int64_t ranks = group_size(ctx.node());
  const TensorType& t = ctx.in(0);
  if (t.symbolic()) fail("AllGather of {}: symbolic sizes are not sharded", t.str());
  const int rank = static_cast<int>(t.shape.size());
  int64_t axis = ctx.node().attr_i("axis");
  if (axis < -rank || axis >= rank) fail("AllGather: axis {} is out of range for rank {}", axis, rank);
  if (axis < 0) axis += rank;
  Shape s = t.shape;
  s[static_cast<size_t>(axis)] *= ranks;
  ctx.set_out(0, TensorType{t.dtype, s});
}

void one_rank_kernel(KernelCtx& c) {
  if (group_size(c.node()) != 1)
    fail("{} over {} ranks needs every rank's input: run the ranks' graphs together (run_spmd)", c.node().op_name(),
         c.node().attr_i("ranks"));
  c.set_out(0, c.in(0));
}

}  // namespace

void register_collective_ops(OpRegistry& r) {
  {
    OpDef d = make_op("AllReduce", 0, 1, 1, {{"ranks", AttrKind::i, true}, {"reduce", AttrKind::s}}, all_reduce_infer,
                      one_rank_kernel);
    d.domain = "tessel";
    // no FLOPs, and its bytes are the links', priced by the system simulation (targets/dataflow/multichip.h)
    d.cost = [](const Node&) { return Cost{}; };
    r.add(std::move(d));
  }
  {
    OpDef d = make_op("AllGather", 0, 1, 1, {{"ranks", AttrKind::i, true}, {"axis", AttrKind::i, true}}, all_gather_infer,
                      one_rank_kernel);
    d.domain = "tessel";
    d.cost = [](const Node&) { return Cost{}; };
    r.add(std::move(d));
  }
}

}  // namespace tessel
