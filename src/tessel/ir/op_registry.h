// The op registry: one entry per op with its operand/attribute schema, shape and dtype rule,
// reference kernel, legacy-opset upgrade, decomposition hook, fusion kind and cost.
#pragma once

#include <array>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "tessel/ir/core_ops.h"
#include "tessel/ir/graph.h"

namespace tessel {

// dims: a list of sizes with a symbolic entry; accepted wherever the schema says ints.
enum class AttrKind { i = 0, f = 1, s = 2, ints = 3, floats = 4, strings = 5, tensor = 6, dims = 7 };
std::string_view attr_kind_name(AttrKind k);

struct AttrSpec {
  std::string name;
  AttrKind kind;
  bool required = false;
};

// How the fusion pass may treat the op.
enum class FusionKind { pointwise, reduction, injective, matmul, opaque };
std::string_view fusion_kind_name(FusionKind k);

struct Cost {
  double flops = 0;
  double bytes = 0;   // bytes read + written if nothing is fused
};

// Shape and dtype inference for one node. Input types are always known; input *values* are known
// when they are constants or were folded (shape arithmetic). Rules set every output's type, and
// may set an output's value when it only depends on static facts (e.g. Shape).
//
// Symbolic sizes (docs/dynamic-shapes.md): an op whose OpDef::symbolic is set reads its inputs' dims
// through in(i).dims() and sets symbolic output types with TensorType::of; shape arithmetic reads
// sym_value(i) (an integer input whose elements are sizes) and sets set_out_sym_value. Nodes of other
// ops with a symbolic input are refused before their rule runs.
class InferCtx {
 public:
  InferCtx(const Node& node, const std::vector<const Tensor*>& known_values,
           const std::vector<const SymTensor*>* sym_values = nullptr);
  const Node& node() const { return node_; }
  int num_inputs() const { return static_cast<int>(node_.inputs.size()); }
  int num_outputs() const { return static_cast<int>(node_.outputs.size()); }
  bool has_in(int i) const { return node_.has_input(i); }
  const TensorType& in(int i) const;        // throws if the input is absent
  const Tensor* value(int i) const;         // the input's value when statically known, else null
  // The input's value as sizes: a known integer tensor (static elements) or a symbolic one; nullopt
  // when neither is known.
  std::optional<SymTensor> sym_value(int i) const;
  void set_out(int i, TensorType t);
  void set_out_value(int i, Tensor t);      // also sets the type
  // A value made of sizes: a plain value when every element is static, else a symbolic one.
  void set_out_sym_value(int i, SymTensor t);
  const std::vector<TensorType>& outs() const { return outs_; }
  const std::vector<std::optional<Tensor>>& out_values() const { return out_values_; }
  const std::vector<std::optional<SymTensor>>& out_sym_values() const { return out_sym_; }
  bool out_set(int i) const { return set_[i]; }
  // Asked by value(i) for an input whose value is computable but not computed yet (the verifier
  // evaluates small constant subgraphs only when a later rule reads them); returns it or null.
  void set_resolver(std::function<const Tensor*(int)> r) { resolve_ = std::move(r); }

 private:
  const Node& node_;
  const std::vector<const Tensor*>& known_;
  std::function<const Tensor*(int)> resolve_;
  const std::vector<const SymTensor*>* sym_;
  std::vector<std::optional<SymTensor>> out_sym_;
  std::vector<TensorType> outs_;
  std::vector<bool> set_;
  std::vector<std::optional<Tensor>> out_values_;
};

// Reference execution of one node on concrete tensors.
class KernelCtx {
 public:
  KernelCtx(const Node& node, std::vector<const Tensor*> inputs);
  const Node& node() const { return node_; }
  int num_inputs() const { return static_cast<int>(inputs_.size()); }
  int num_outputs() const { return static_cast<int>(node_.outputs.size()); }
  bool has_in(int i) const { return i < num_inputs() && inputs_[i] != nullptr; }
  // Whether output i is consumed at all (optional ONNX outputs may be omitted).
  bool wants_out(int i) const { return i < num_outputs() && node_.outputs[i] != nullptr; }
  const Tensor& in(int i) const;
  void set_out(int i, Tensor t);
  std::vector<Tensor>& outs() { return outs_; }

 private:
  const Node& node_;
  std::vector<const Tensor*> inputs_;
  std::vector<Tensor> outs_;
};

using InferFn = std::function<void(InferCtx&)>;
using KernelFn = std::function<void(KernelCtx&)>;
// Rewrites a node imported at an older opset into this entry's semantics (for example, moving an
// `axes` attribute into an input). Throws tessel::Error if the old form cannot be expressed.
using UpgradeFn = std::function<void(Graph&, Node&, int opset)>;
class CoreBuilder;
// Expresses a node in core ops (docs/ir/core.md): emits them through the builder and returns
// one value per output of the node (null for omitted outputs).
using DecomposeFn = std::function<std::vector<Value*>(CoreBuilder&, const Node&)>;
using CostFn = std::function<Cost(const Node&)>;

struct OpDef {
  std::string name;                 // ONNX op type at graph level ("MatMul", "LayerNormalization")
  std::string domain;               // ONNX domain ("" = ai.onnx)
  int min_inputs = 1, max_inputs = 1;     // max_inputs -1: variadic
  int min_outputs = 1, max_outputs = 1;
  std::vector<AttrSpec> attrs;
  int since = 1;                    // oldest ONNX opset whose semantics this entry implements as is
  UpgradeFn upgrade;                // called for opsets < since; absent: those opsets are unsupported
  InferFn infer;
  KernelFn kernel;
  DecomposeFn decompose;
  FusionKind fusion = FusionKind::opaque;
  CostFn cost;                      // default: one FLOP per output element, bytes of all operands
  bool deterministic = true;        // false for random ops: never folded at compile time
  // The shape rule (and the decomposition, when there is one) handles symbolic sizes.
  bool symbolic = false;
  // The primitive this entry is (domain tessel.core: set by OpRegistry::add from the core-op table),
  // else none: code asks a node what it is through this enum (is_core_op, core_op_of), not its name.
  std::optional<CoreOp> core;
};

class OpRegistry {
 public:
  static OpRegistry& get();          // the process-wide registry with every op family loaded
  void add(OpDef def);               // throws if the name is already registered
  const OpDef* find(const std::string& name) const;
  // The entry of a primitive (an index into the core-op table, no name lookup); null if unregistered.
  const OpDef* find(CoreOp op) const { return by_core_[static_cast<size_t>(op)]; }
  std::vector<const OpDef*> all() const;

 private:
  std::map<std::string, OpDef> ops_;  // (std::map: entries never move, so the pointers below stay)
  std::array<const OpDef*, kNumCoreOps> by_core_{};
};

Cost op_cost(const Node& node);
// A cost of `flops_per_element` FLOPs per element of input 0, bytes as the default counts them: for
// ops that read far more than they write (reductions, normalisations).
CostFn cost_per_input_element(double flops_per_element);

// ---- helpers shared by the op families -------------------------------------------------------

// An entry with the fields most ops set; the caller adds upgrade, cost, decompose as needed.
OpDef make_op(std::string name, int since, int min_inputs, int max_inputs, std::vector<AttrSpec> attrs,
              InferFn infer, KernelFn kernel, FusionKind fusion = FusionKind::opaque);

// Type rules.
void infer_same_as_input(InferCtx& ctx, int input = 0);        // output 0 = type of input
// numpy broadcasting of every input's dims (static or symbolic: broadcast_dims).
void infer_broadcast(InferCtx& ctx, std::optional<DType> out_dtype = std::nullopt);
// Reads a statically known int64 tensor input as a vector, or nullopt if unknown/absent.
std::optional<std::vector<int64_t>> known_ints(const InferCtx& ctx, int input);

// Elementwise kernels over double (float types) or int64 (integer/bool types), with numpy
// broadcasting across every input. The output dtype defaults to input 0's.
using UnaryF = std::function<double(double)>;
using UnaryI = std::function<int64_t(int64_t)>;
using BinaryF = std::function<double(double, double)>;
using BinaryI = std::function<int64_t(int64_t, int64_t)>;
Tensor map_unary(const Tensor& x, const UnaryF& f, const UnaryI& fi = nullptr,
                 std::optional<DType> out = std::nullopt);
Tensor map_binary(const Tensor& a, const Tensor& b, const BinaryF& f, const BinaryI& fi = nullptr,
                  std::optional<DType> out = std::nullopt);

// Registration of the op families (one function per file in src/tessel/ops/).
void register_elementwise_ops(OpRegistry& r);
void register_activation_ops(OpRegistry& r);
void register_reduction_ops(OpRegistry& r);
void register_normalization_ops(OpRegistry& r);
void register_matmul_ops(OpRegistry& r);
void register_conv_pool_ops(OpRegistry& r);
void register_attention_ops(OpRegistry& r);
void register_shape_ops(OpRegistry& r);
void register_index_ops(OpRegistry& r);
void register_quantize_ops(OpRegistry& r);
void register_misc_ops(OpRegistry& r);
void register_core_ops(OpRegistry& r);
void register_kernel_ops(OpRegistry& r);  // the kernel level's `kernel` node (src/tessel/kernel)
void register_ml_ops(OpRegistry& r);      // ai.onnx.ml TreeEnsemble, TfIdfVectorizer
void register_collective_ops(OpRegistry& r);  // tessel AllReduce, AllGather (sharded programs)

}  // namespace tessel
