// The compiled backend (see compiled_backend.h).
#include "tessel/runtime/compiled_backend.h"

#include <omp.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <cctype>
#include <list>
#include <unordered_map>
#include <type_traits>
#include <map>
#include <set>
#include <thread>

#include "tessel/ir/bind.h"
#include "tessel/ir/op_registry.h"
#include "tessel/lower/cpu.h"
#include "tessel/passes/pass.h"
#include "tessel/support/error.h"
#include "tessel/support/limits.h"
#include "tessel/support/thread_team.h"
#include "tessel/support/threads.h"
#include "tessel/targets/cpu/codegen.h"
#include "tessel/targets/cpu/dnnl_ops.h"
#include "tessel/targets/cpu/exe_entry.h"
#include "tessel/targets/cpu/library_epilogue.h"

namespace tessel {
namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

using GeneratedFn = void(void* const*, const long*, long, long);

// Kernels with fewer elements than this run on one thread: waking the others costs more.
constexpr int64_t kParallelMinElements = 16384;
// Chunks per thread of a parallel generated loop on the thread team.
constexpr int kChunksPerThread = 4;

}  // namespace

// Everything one kernel node needs when it runs.
struct CompiledExecutable::Launch {
  const Kernel* kernel = nullptr;
  GeneratedFn* fn = nullptr;
  std::vector<int> value_ids;                  // per non-scratch arg: the graph value id
  std::vector<std::vector<uint8_t>> scratch;   // per scratch arg
  std::vector<int> scratch_arg;
  std::shared_ptr<cpu::Matmul> matmul;         // shared between a symbolic executable's instances
  std::shared_ptr<cpu::Conv2d> conv;
  int threads = 1;
  size_t kernel_index = 0;
  const long* sz = nullptr;                    // the size symbols' values (a symbolic module's instance)
  // The kernel's parallel range and loop points (outer x inner x phases), worked out once: a launch's
  // kernel has static sizes (an instance's are instantiated).
  int64_t extent = 0, work = 0;
  // The parallel loop runs on the thread team (support/thread_team.h), not an OpenMP region.
  bool team = false;
  // A symbolic kernel of an executable rebound per binding (CompiledBackendOptions::rebind): `kernel`
  // is `bound`, its instance for the current binding, and the fields above are redone (Builder::fill)
  // when one of `symbols` (indices into the binder's symbols, the generated code's sz[]) changes.
  const Kernel* sym_kernel = nullptr;
  Kernel bound;
  const Node* node = nullptr;
  std::vector<int> symbols;

  void operator()(KernelEnv& env) {
    const Kernel& k = *kernel;
    void* ptrs[64];
    std::vector<void*> big;
    void** args = ptrs;
    if (k.args.size() > 64) {
      big.resize(k.args.size());
      args = big.data();
    }
    for (size_t i = 0; i < value_ids.size(); ++i) args[i] = value_ids[i] >= 0 ? env.ptr[static_cast<size_t>(value_ids[i])] : nullptr;
    for (size_t s = 0; s < scratch_arg.size(); ++s) args[scratch_arg[s]] = scratch[s].data();
    static const bool profile = std::getenv("TESSEL_PROFILE") != nullptr;
    const auto tl = Clock::now();
    if (matmul) {
      const float* a = static_cast<const float*>(args[k.mm.a]) + k.mm.a_offset;
      const float* b = static_cast<const float*>(args[k.mm.b]) + k.mm.b_offset;
      matmul->run(a, b, static_cast<float*>(args[k.mm.c]));
    }
    if (conv) conv->run(static_cast<const float*>(args[k.conv.x]), static_cast<float*>(args[k.conv.y]));
    // the library call's share of the kernel's step (printed before the step's own line)
    if (profile && (matmul || conv))
      fmt::print(stderr, "profile {:>9.3f} ms    library {} ({})\n", seconds_since(tl) * 1e3,
                 matmul ? cpu::matmul_str(matmul->desc()) : cpu::conv_str(conv->desc()), matmul ? matmul->impl() : conv->impl());
    if (!fn) return;
    const int64_t n = extent;
    if (threads <= 1 || n < 2 || work < kParallelMinElements) {
      fn(args, sz, 0, static_cast<long>(n));
      return;
    }
    GeneratedFn* f = fn;
    const long* sizes = sz;
    if (team) {
      // A few chunks per thread, none under half the parallel threshold: the threads that are running
      // take the chunks of one whose core is busy (support/thread_team.h).
      const int64_t chunks = std::min<int64_t>({n, int64_t{kChunksPerThread} * threads,
                                                std::max<int64_t>(threads, 2 * work / kParallelMinElements)});
      ThreadTeam::shared(threads).run(chunks, [&](int64_t c) {
        f(args, sizes, static_cast<long>(n * c / chunks), static_cast<long>(n * (c + 1) / chunks));
      });
      return;
    }
#pragma omp parallel num_threads(threads)
    {
      const int64_t t = omp_get_thread_num(), T = omp_get_num_threads();
      const int64_t lo = n * t / T, hi = n * (t + 1) / T;
      if (lo < hi) f(args, sizes, static_cast<long>(lo), static_cast<long>(hi));
    }
  }
};

// oneDNN primitives by kernel and concrete descriptor (sizes, strides, weights, bias and epilogue),
// the most recent kLimit of each kind kept; the instances that use one keep it alive.
class PrimitiveCache {
 public:
  static constexpr size_t kLimit = 512;
  // The primitive of kernel `kid` for descriptor d (cpu::Matmul for a MatmulDesc, cpu::Conv2d for a
  // ConvDesc): the kept one, or nullptr.
  template <typename P, typename D>
  std::shared_ptr<P> find(size_t kid, const D& d) {
    Lru<P>& l = lru<P>();
    auto at = l.index.find(key(kid, d));
    if (at == l.index.end()) return nullptr;
    l.items.splice(l.items.begin(), l.items, at->second);
    ++reused;
    return l.items.front().second;
  }
  template <typename P, typename D>
  void keep(size_t kid, const D& d, std::shared_ptr<P> p) {
    Lru<P>& l = lru<P>();
    std::string k = key(kid, d);
    if (auto at = l.index.find(k); at != l.index.end()) l.items.erase(at->second);
    l.items.emplace_front(k, std::move(p));
    l.index[std::move(k)] = l.items.begin();
    if (l.items.size() > kLimit) {
      l.index.erase(l.items.back().first);
      l.items.pop_back();
    }
  }
  int reused = 0;

 private:
  // Most recent first, and an index by key (an instance per decoded token looks up every library call).
  template <typename T>
  struct Lru {
    std::list<std::pair<std::string, std::shared_ptr<T>>> items;
    std::unordered_map<std::string, typename std::list<std::pair<std::string, std::shared_ptr<T>>>::iterator> index;
  };
  Lru<cpu::Matmul> matmuls_;
  Lru<cpu::Conv2d> convs_;
  template <typename P>
  Lru<P>& lru() {
    if constexpr (std::is_same_v<P, cpu::Matmul>) return matmuls_;
    else return convs_;
  }

  static std::string epilogue_key(const cpu::Epilogue& e) {
    return fmt::format("{} {} {} {} {} {}", e.alpha, e.accumulate, static_cast<int>(e.act), e.clip_lo, e.clip_hi, e.slope);
  }
  static std::string key(size_t kid, const cpu::MatmulDesc& d) {
    return fmt::format("{} {} {} {} {} {} {} {} {} {} {} {} {} {} {} {} {} {}", kid, d.batch, d.M, d.N, d.K, d.a_batch, d.a_m, d.a_k,
                       d.b_batch, d.b_k, d.b_n, d.c_batch, d.c_m, d.c_n, static_cast<const void*>(d.constant_b),
                       static_cast<const void*>(d.bias), epilogue_key(d.epilogue), d.team);
  }
  static std::string key(size_t kid, const cpu::ConvDesc& d) {
    return fmt::format("{} {} {} {} {} {} {} {} {} {} {} {} {} {} {} {} {} {} {} {} {} {} {} {}", kid, d.N, d.C, d.H, d.W, d.OC, d.KH,
                       d.KW, d.OH, d.OW, d.stride_h, d.stride_w, d.pad_top, d.pad_left, d.pad_bottom, d.pad_right, d.dil_h,
                       d.dil_w, d.groups, static_cast<const void*>(d.weights), static_cast<const void*>(d.bias),
                       d.src_nhwc, d.dst_nhwc, epilogue_key(d.epilogue));
  }
};

// A symbolic compilation (docs/dynamic-shapes.md): the kernel module with symbolic sizes, the one
// shared object its generated code is in, and the instances built for bindings, most recent first.
// The epilogue decisions, source and shared object are the owning executable's (in_library_, library_,
// source_, so_), made once on the symbolic kernels.
struct CompiledExecutable::Symbolic {
  KernelModule module;
  CompiledBackendOptions opts;
  // The module graph's inputs: a call's values per symbol, in the order of the generated code's sz[].
  std::unique_ptr<SymbolBinder> binder;
  // Most recent first, keyed by the symbols' values in `symbols`' order.
  std::list<std::pair<std::vector<int64_t>, std::unique_ptr<CompiledExecutable>>> instances;
  std::map<std::string, cpu::PackedWeights> packings;  // weights packed once for every instance (Builder)
  PrimitiveCache primitives;                           // library calls shared by the instances (Builder)
  std::shared_ptr<ArenaPool> arenas = std::make_shared<ArenaPool>();  // one arena for every instance
  std::map<size_t, GeneratedFn*> functions;            // the shared object's kernels, looked up once (Builder)
  // CompiledBackendOptions::rebind: the one executable for every binding, the Builder its launches are
  // (re)filled by, and the binding it has (empty: none yet, or the last rebind failed).
  std::unique_ptr<CompiledExecutable> rebound;
  std::unique_ptr<Builder> builder;
  std::vector<int64_t> rebound_values;

  CompiledExecutable& instance(const std::vector<int64_t>& values, CompiledExecutable& owner);
  // The one executable, made by compile_symbolic (an "unsupported" error when a step cannot serve every binding).
  void make_rebound(CompiledExecutable& owner);
  // Gives it `values` (in binder order).
  void rebind(const std::vector<int64_t>& values);
};

namespace {

// The kernel counts of the stats, and the core nodes no kernel covers.
void count_kernels(const std::vector<Kernel>& kernels, const Graph& g, CompiledCompileStats& st) {
  for (const Kernel& k : kernels) {
    st.kernels++;
    st.loop_kernels += k.kind == KernelKind::loop;
    st.matmul_kernels += k.kind == KernelKind::matmul;
    st.conv_kernels += k.kind == KernelKind::conv;
  }
  for (const auto& n : g.nodes()) st.core_nodes_left += n->op->core.has_value();
}

}  // namespace

bool loop_writes_over_input(const Kernel& k, const std::vector<int>& ins, int out) {
  if (k.kind != KernelKind::loop || k.phases != 1 || out < 0 || out >= k.num_outputs()) return false;
  const int oarg = k.num_inputs() + out;
  std::vector<int64_t> dims = require_static(k.outer);
  for (const Dim& d : k.inner) dims.push_back(d);
  const KAccess* st = nullptr;
  size_t store_at = 0;
  for (size_t i = 0; i < k.body.size(); ++i) {
    const KInstr& in = k.body[i];
    if (!in.is(KInstrKind::store) || k.accesses.at(static_cast<size_t>(in.access)).arg != oarg) continue;
    if (st) return false;  // stored twice
    st = &k.accesses[static_cast<size_t>(in.access)];
    store_at = i;
  }
  if (!st || st->offset != 0 || st->strides.size() != dims.size() || k.body[store_at].row) return false;
  int64_t stride = 1;
  for (size_t d = dims.size(); d-- > 0;) {
    if (dims[d] != 1 && st->strides[d] != stride) return false;
    stride *= dims[d];
  }
  if (stride != shape_numel(k.args.at(static_cast<size_t>(oarg)).type.shape)) return false;
  for (size_t i = 0; i < k.body.size(); ++i) {
    const KInstr& in = k.body[i];
    if (!in.is(KInstrKind::load)) continue;
    const KAccess& a = k.accesses.at(static_cast<size_t>(in.access));
    if (std::find(ins.begin(), ins.end(), a.arg) == ins.end()) continue;
    if (i > store_at || in.row || a.offset != 0 || a.strides.size() != dims.size()) return false;
    for (size_t d = 0; d < dims.size(); ++d)
      if (dims[d] != 1 && a.strides[d] != st->strides[d]) return false;
  }
  return true;
}

CompiledExecutable::CompiledExecutable() = default;

// What compile_cpu and load_cpu share: the library objects, function pointers and scratch buffers
// of each kernel node (the graph backend's KernelNodeRunner), and the statistics after planning.
struct CompiledExecutable::Builder final : KernelNodeRunner {
  explicit Builder(CompiledExecutable& c) : ce(c) {}
  CompiledExecutable& ce;
  std::map<size_t, cpu::PackedWeights> prepacked;  // per kernel index (load_cpu)
  std::map<std::string, cpu::PackedWeights> own_packing;
  // Per weights_key: the first packing. A symbolic executable's instances share one map, keyed
  // without M: a packing is taken only where its layout is the one the primitive wants (oneDNN's
  // layout text is checked), so an M that packs otherwise gets its own.
  std::map<std::string, cpu::PackedWeights>* shared = &own_packing;
  bool key_m = true;
  // A symbolic executable's library calls by kernel and concrete descriptor, for every instance: a
  // binding that changes only some calls' sizes (a decode step's attention, not its projections)
  // builds only those (null: a primitive per launch).
  PrimitiveCache* primitives = nullptr;
  // A symbolic executable's generated functions by kernel index, looked up in the shared object once
  // for every instance (null: looked up per launch).
  std::map<size_t, GeneratedFn*>* functions = nullptr;

  // Which constant bytes a matmul's B or a convolution's weights are, and how the kernel reads them
  // (the same bytes read transposed are other weights): kernels with equal keys pack identically.
  std::string weights_key(const Node& n, const Kernel& k) const {
    if (k.kind == KernelKind::matmul) {
      const Value* v = n.inputs[static_cast<size_t>(k.mm.b)];
      if (!v->constant) return {};
      const MatmulSpec& m = k.mm;
      return fmt::format("mm {} {} {} {} {} {} {} {}", static_cast<const void*>(v->constant->data<float>() + m.b_offset),
                         m.batch, m.k, m.n, m.b_batch, m.b_k, m.b_n, key_m ? m.m.str() : std::string("any"));
    }
    if (k.kind == KernelKind::conv) {
      const Value* v = n.inputs[static_cast<size_t>(k.conv.w)];
      if (!v->constant) return {};
      const ConvSpec& c = k.conv;
      return fmt::format("conv {} {} {} {} {} {}", static_cast<const void*>(v->constant->data<float>()), c.oc, c.c,
                         c.kh, c.kw, c.groups);
    }
    return {};
  }

  // The library primitive of kernel `kid` for d: one an earlier instance built for the same descriptor,
  // else a new one (counted as prepacked or sharing another's packing when it took packed weights).
  template <typename P, typename D>
  std::shared_ptr<P> primitive(size_t kid, const D& d, bool from_shared) {
    if (primitives)
      if (std::shared_ptr<P> p = primitives->find<P>(kid, d)) return p;
    auto p = std::make_shared<P>(d);
    ce.stats_.prepacked += p->used_prepacked() && !from_shared;
    ce.stats_.shared_packings += p->used_prepacked() && from_shared;
    if (primitives) primitives->keep(kid, d, p);
    return p;
  }

  // Whether the executable's parallel steps run on the thread team: with more than one thread, unless
  // TESSEL_TEAM=0 or a kernel is a convolution (oneDNN threads those itself through OpenMP, whose
  // workers spin after each region: the two runtimes side by side would take each other's cores).
  int team_mode = -1;
  bool on_team() {
    if (team_mode < 0) {
      team_mode = thread_team_enabled() && ce.stats_.threads > 1;
      for (const Kernel& k : ce.kernels_)
        if (k.kind == KernelKind::conv) team_mode = 0;
    }
    return team_mode == 1;
  }

  // Symbolic kernels get a Launch that rebind() fills for each binding (an executable rebound per
  // binding, CompiledBackendOptions::rebind).
  bool rebinding = false;

  // The kernel level's nodes for the graph backend (KernelNodeRunner): a kernel node's loop nest
  // written over an input only where every element is read before the same position is written (and
  // never a symbolic kernel's: its sizes are not known when the plan is made).
  bool writes_over_input(const Node& n, const std::vector<int>& ins, int out) const override {
    if (!is_kernel_node(n)) return false;
    const Kernel& k = ce.kernels_.at(static_cast<size_t>(n.attr_i("kernel")));
    return !k.symbolic() && loop_writes_over_input(k, ins, out);
  }

  CoreKernel kernel(const Node& n) override {
    if (!is_kernel_node(n)) return make_channels_last_kernel(n);  // empty (a row-major core step) unless marked
    const size_t kid = static_cast<size_t>(n.attr_i("kernel"));
    const Kernel& k = ce.kernels_.at(kid);
    auto L = std::make_unique<CompiledExecutable::Launch>();
    L->threads = ce.stats_.threads;
    L->team = on_team();
    L->sz = ce.sym_values_.data();
    L->kernel_index = kid;
    if (ce.in_library_.at(kid)) ce.stats_.library_epilogues++;
    if (rebinding && k.symbolic()) {
      L->sym_kernel = &k;
      L->node = &n;
      const std::vector<std::string>& all = ce.stats_.symbols;  // sorted, as Kernel::symbols
      for (const std::string& s : k.symbols())
        L->symbols.push_back(static_cast<int>(std::lower_bound(all.begin(), all.end(), s) - all.begin()));
    } else {
      fill(*L, n, k);
    }
    CompiledExecutable::Launch* raw = L.get();
    ce.launches_.push_back(std::move(L));
    return [raw](KernelEnv& env) { (*raw)(env); };
  }

  // The launches of symbolic kernels for binding `b`: those naming a symbol whose `changed` entry is
  // set (every one when `changed` is empty) get their kernel instantiated (not verified again: the
  // verifier proved its accesses for every value of the symbols) and their library call, scratch
  // buffers and parallel range redone.
  void rebind(const Bindings& b, const std::vector<char>& changed) {
    for (const auto& L : ce.launches_) {
      if (!L->sym_kernel) continue;
      bool stale = changed.empty();
      for (size_t i = 0; !stale && i < L->symbols.size(); ++i) stale = changed[static_cast<size_t>(L->symbols[i])];
      if (!stale) continue;
      L->bound = instantiate_kernel(*L->sym_kernel, b, false);
      fill(*L, *L->node, L->bound);
    }
  }

  // Everything launch L of kernel k (static sizes) on node n needs.
  void fill(CompiledExecutable::Launch& Lr, const Node& n, const Kernel& k) {
    CompiledCompileStats& st = ce.stats_;
    CompiledExecutable::Launch* L = &Lr;
    const size_t kid = L->kernel_index;
    L->kernel = &k;
    L->extent = k.parallel_extent();
    L->work = k.outer_count() * k.inner_count() * k.phases;
    L->value_ids.clear();
    L->scratch_arg.clear();
    L->scratch.clear();
    L->matmul.reset();
    L->conv.reset();
    L->fn = nullptr;
    size_t in = 0, out = 0;
    for (size_t i = 0; i < k.args.size(); ++i) {
      const KArg& a = k.args[i];
      if (a.role == KArg::Role::scratch) {
        L->value_ids.push_back(-1);
        L->scratch_arg.push_back(static_cast<int>(i));
        checked_tensor_numel(a.type.dtype, a.type.shape, fmt::format("scratch buffer of kernel {}", kid));
        L->scratch.emplace_back(static_cast<size_t>(shape_numel(a.type.shape)) * dtype_size(a.type.dtype));
      } else {
        const Value* v = a.role == KArg::Role::in ? n.inputs[in++] : n.outputs[out++];
        L->value_ids.push_back(v->id);
      }
    }
    const bool lib = ce.in_library_.at(kid);
    const cpu::LibraryEpilogue& le = ce.library_.at(kid);
    if (cpu::has_generated_function(k, lib)) {
      GeneratedFn* fn = functions ? (*functions)[kid] : nullptr;
      if (!fn) fn = ce.so_->function<GeneratedFn>(cpu::kernel_symbol(kid));
      if (functions) (*functions)[kid] = fn;
      L->fn = fn;
    }
    const float* bias = lib && le.bias_arg >= 0 ? n.inputs[static_cast<size_t>(le.bias_arg)]->constant->data<float>() : nullptr;
    auto pre = prepacked.find(kid);
    cpu::PackedWeights packed = pre != prepacked.end() ? pre->second : cpu::PackedWeights{};
    // Kernels reading the same constant weights (ALBERT's shared layers, tied embeddings) share one
    // packing: the first primitive packs, the others take its bytes when their layout is the same.
    const std::string wkey = weights_key(n, k);
    bool from_shared = false;
    if (!packed.valid() && !wkey.empty()) {
      auto it = shared->find(wkey);
      if (it != shared->end()) packed = it->second, from_shared = true;
    }
    auto tl = Clock::now();
    try {
      if (k.kind == KernelKind::matmul) {
        cpu::MatmulDesc d = cpu::matmul_desc(k.mm);
        const Value* bv = n.inputs[static_cast<size_t>(k.mm.b)];
        if (bv->constant) d.constant_b = bv->constant->data<float>() + k.mm.b_offset, d.prepacked_b = packed;
        if (lib) d.bias = bias, d.epilogue = le.epilogue;
        if (L->team) d.team = L->threads;
        L->matmul = primitive<cpu::Matmul>(kid, d, from_shared);
      } else if (k.kind == KernelKind::conv) {
        const ConvSpec& c = k.conv;
        cpu::ConvDesc d = cpu::conv_desc(c);
        d.weights = n.inputs[static_cast<size_t>(c.w)]->constant->data<float>();
        d.prepacked = packed;
        d.bias = nullptr;
        if (lib) d.bias = bias, d.epilogue = le.epilogue;
        L->conv = primitive<cpu::Conv2d>(kid, d, from_shared);
      }
    } catch (const Error& e) {
      throw e.with_context(Location{.node = n.name, .op = std::string(kernel_kind_name(k.kind)), .pass = "compile"});
    }
    st.library_seconds += seconds_since(tl);
    if (!wkey.empty() && !shared->count(wkey)) {
      cpu::PackedWeights w = L->matmul ? L->matmul->packed_weights() : L->conv ? L->conv->packed_weights() : cpu::PackedWeights{};
      if (w.valid()) shared->emplace(wkey, std::move(w));
    }
  }

  void finish() {
    CompiledCompileStats& st = ce.stats_;
    st.graph = ce.exe_->stats();
    count_kernels(ce.kernels_, ce.exe_->graph(), st);
    for (const Kernel& k : ce.kernels_) {  // (symbolic kernels of a rebound executable: the static ones only)
      st.bytes_unfused += k.bytes_unfused.static_value().value_or(0);
      st.bytes_fused += k.bytes_fused.static_value().value_or(0);
    }
  }
};

CompiledExecutable::~CompiledExecutable() = default;  // (here: Symbolic holds a Builder)

void CompiledExecutable::Symbolic::make_rebound(CompiledExecutable& owner) {
  std::unique_ptr<CompiledExecutable> ce(new CompiledExecutable());
  CompiledCompileStats& st = ce->stats_;
  st.threads = owner.stats_.threads;
  st.model = owner.stats_.model;
  ce->kernels_ = module.kernels;  // symbolic: each launch instantiates its own per binding
  ce->in_library_ = owner.in_library_;
  ce->library_ = owner.library_;
  ce->so_ = owner.so_;
  ce->sym_values_.assign(binder->symbols().size(), 0);  // the generated code's sz[]: never reallocated
  st.symbols = binder->symbols();
  auto bld = std::make_unique<Builder>(*ce);
  bld->shared = &packings;
  bld->key_m = false;
  bld->primitives = &primitives;
  bld->functions = &functions;
  bld->rebinding = true;
  GraphBackendOptions go;
  go.pipeline = "";  // the module is already the kernel level
  go.symbolic = true;
  go.arena_pool = arenas;
  Builder* b = bld.get();  // kept as `builder` for the rebinds
  go.kernel_nodes = b;
  go.output_aliases = opts.output_aliases;
  go.optional_aliases = opts.optional_aliases;
  go.recycled_outputs = opts.recycled_outputs;
  {
    ScopedOmpThreads library_threads(st.threads);
    ce->exe_ = compile_graph(instantiate_graph(*module.graph, {}), {}, go);
  }
  b->finish();
  rebound = std::move(ce);
  builder = std::move(bld);
}

void CompiledExecutable::Symbolic::rebind(const std::vector<int64_t>& values) {
  CompiledExecutable& ce = *rebound;
  const Bindings b = binder->bindings(values);
  std::vector<char> changed;  // per symbol; empty: no binding yet (or the last rebind failed), every one
  if (!rebound_values.empty())
    for (size_t i = 0; i < values.size(); ++i) changed.push_back(rebound_values[i] != values[i]);
  rebound_values.clear();  // unbound until every piece has the new binding
  for (size_t i = 0; i < values.size(); ++i) ce.sym_values_[i] = static_cast<long>(values[i]);
  ScopedOmpThreads library_threads(ce.stats_.threads);  // library primitives for the threads they run with
  ce.exe_->rebind(b);
  builder->rebind(b, changed);
  rebound_values = values;
}

namespace {

// The shared object of the generated source (lower_cpu's cpu-codegen), compiled by the toolchain and
// loaded; none when no kernel has a generated function.
std::shared_ptr<cpu::SharedObject> build_lowered(const lower::CpuLowered& low, const std::string& model,
                                                 const cpu::ToolchainOptions& tc, CompiledCompileStats& st) {
  st.codegen_seconds = low.codegen_seconds;
  if (low.symbols.empty()) return nullptr;
  cpu::BuildResult br = cpu::build_shared_object(low.source, model, tc, low.symbols);
  st.cache_hit = br.cache_hit;
  st.cxx_seconds = br.compile_seconds;
  st.load_seconds = br.load_seconds;
  st.cache_key = br.key;
  st.source_path = br.source_path;
  st.so_path = br.so_path;
  return br.so;
}

// The host CPU's lowering with this compilation's options: dumps go to `dump_dir`.
lower::CpuOptions cpu_lowering(const CompiledBackendOptions& opts, const std::string& dump_dir, bool undecomposed_on_pass_error) {
  lower::CpuOptions lo;
  lo.pipeline = opts.pipeline;
  lo.fuse = opts.fuse;
  lo.model = opts.model_name;
  lo.stages.dump_dir = dump_dir;
  lo.undecomposed_on_pass_error = undecomposed_on_pass_error;
  return lo;
}

// The folder of this compilation's stage dumps (CompiledBackendOptions::dump_dir, else $TESSEL_DUMP_DIR):
// a numbered folder per compilation in this process, named after the model (its characters that are
// not [A-Za-z0-9._-] as '_'), or "" when no dump is asked for.
std::string dump_folder(const CompiledBackendOptions& opts) {
  std::string root = opts.dump_dir;
  if (root.empty())
    if (const char* e = std::getenv("TESSEL_DUMP_DIR")) root = e;
  if (root.empty()) return {};
  static std::atomic<int> serial{0};
  std::string name;
  for (char c : opts.model_name.substr(0, 60)) name += std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '-' || c == '_' ? c : '_';
  if (name.empty() || name == "." || name == "..") name = "model";
  return (std::filesystem::path(root) / fmt::format("{:03d}-{}", ++serial, name)).string();
}

void print_compile_profile(const CompiledCompileStats& st) {
  // Where a slow first call goes (ALBERT-xxlarge: 16 s), next to TESSEL_PROFILE's per-step lines.
  if (!std::getenv("TESSEL_PROFILE")) return;
  fmt::print(stderr,
             "profile compile {:.3f} s: passes {:.3f}, fuse {:.3f}, codegen {:.3f}, c++ {:.3f}{}, load {:.3f}, "
             "library setup and packing {:.3f} ({} kernels, {} matmul, {} conv)\n",
             st.compile_seconds, st.graph.pass_seconds, st.fuse_seconds, st.codegen_seconds, st.cxx_seconds,
             st.cache_hit ? " (cache hit)" : "", st.load_seconds, st.library_seconds, st.kernels, st.matmul_kernels,
             st.conv_kernels);
}

}  // namespace

// One compilation for every binding of the graph's size symbols: the pipeline, fusion and code
// generation run on the symbolic graph; library primitives, packed weights and the arena wait for a
// call's binding (Symbolic::instance).
std::unique_ptr<CompiledExecutable> CompiledExecutable::compile_symbolic(std::unique_ptr<Graph> g, const std::vector<Tensor>& ex,
                                                                       const CompiledBackendOptions& opts) {
  const auto t0 = Clock::now();
  std::unique_ptr<CompiledExecutable> ce(new CompiledExecutable());
  CompiledCompileStats& st = ce->stats_;
  st.threads = resolve_threads(opts.threads);
  st.model = opts.model_name;
  if (!ex.empty()) {  // example inputs only check that the compilation covers them
    std::vector<Shape> shapes;
    for (const Tensor& t : ex) shapes.push_back(t.shape());
    Bindings b;
    if (std::string why = bind_symbols(*g, shapes, b); !why.empty())
      throw Error(Location{.pass = "compile"}, "the example inputs do not fit the model's symbolic shapes: " + why);
  }
  st.dump_dir = dump_folder(opts);
  lower::CpuLowered low = lower::lower_cpu(std::move(g), cpu_lowering(opts, st.dump_dir, false));
  st.graph.pass_seconds = low.pass_seconds;
  st.fuse_seconds = low.fuse_seconds;
  ce->so_ = build_lowered(low, opts.model_name, opts.toolchain, st);
  ce->in_library_ = std::move(low.in_library);
  ce->library_ = std::move(low.library);
  ce->source_ = std::move(low.source);
  KernelModule m = std::move(low.module);
  count_kernels(m.kernels, *m.graph, st);
  auto sym = std::make_unique<CompiledExecutable::Symbolic>();
  sym->opts = opts;
  sym->binder = std::make_unique<SymbolBinder>(*m.graph);
  // The generated code reads sz[] in module_symbols' order, which is the binder's (both graph_symbols).
  st.symbols = sym->binder->symbols();
  ce->kernels_ = m.kernels;
  sym->module = std::move(m);
  if (opts.rebind) {
    try {
      sym->make_rebound(*ce);
      st.rebinding = true;
      // the one plan's output aliases (an instance's plan sets st.graph whole when it is made)
      const GraphCompileStats& rg = sym->rebound->stats_.graph;
      st.graph.outputs_in_place = rg.outputs_in_place;
      st.graph.outputs_copied_back = rg.outputs_copied_back;
      st.graph.aliases_dropped = rg.aliases_dropped;
    } catch (const Error& e) {  // (the instances below run what the one executable cannot)
      st.rebind_refused = e.what();
    }
  }
  ce->sym_ = std::move(sym);
  st.compile_seconds = seconds_since(t0);
  print_compile_profile(st);
  return ce;
}

// The static executable of binding `b`, built like a loaded cache entry (no passes, no code
// generation): the graph and kernels instantiated, the shared object's functions given b's values.
CompiledExecutable& CompiledExecutable::Symbolic::instance(const std::vector<int64_t>& values, CompiledExecutable& owner_exe) {
  for (auto it = instances.begin(); it != instances.end(); ++it)
    if (it->first == values) {
      if (it != instances.begin()) instances.splice(instances.begin(), instances, it);
      return *instances.front().second;
    }
  const Bindings b = binder->bindings(values);
  CompiledCompileStats& owner = owner_exe.stats_;
  const auto t0 = Clock::now();
  std::unique_ptr<CompiledExecutable> ce(new CompiledExecutable());
  CompiledCompileStats& st = ce->stats_;
  st.threads = owner.threads;
  st.model = owner.model;
  st.cache_hit = true;
  std::unique_ptr<Graph> g = instantiate_graph(*module.graph, b);
  ce->kernels_ = instantiate_kernels(module.kernels, b);  // each verified again with numbers
  ce->in_library_ = owner_exe.in_library_;
  ce->library_ = owner_exe.library_;
  ce->so_ = owner_exe.so_;
  ce->sym_values_.assign(values.begin(), values.end());
  CompiledExecutable::Builder bld(*ce);
  bld.shared = &packings;
  bld.key_m = false;
  bld.primitives = &primitives;
  bld.functions = &functions;
  GraphBackendOptions go;
  go.pipeline = "";  // the module is already the kernel level
  go.arena_pool = arenas;
  go.kernel_nodes = &bld;
  go.output_aliases = opts.output_aliases;
  go.optional_aliases = opts.optional_aliases;
  go.recycled_outputs = opts.recycled_outputs;
  {
    ScopedOmpThreads library_threads(st.threads);
    ce->exe_ = compile_graph(std::move(g), {}, go);
  }
  bld.finish();
  st.compile_seconds = seconds_since(t0);
  owner.instances++;
  owner.instance_seconds += st.compile_seconds;
  owner.library_reused = primitives.reused;
  owner.graph = st.graph;
  owner.library_seconds += st.library_seconds;
  owner.bytes_unfused = st.bytes_unfused, owner.bytes_fused = st.bytes_fused;
  owner.library_epilogues = st.library_epilogues;
  instances.emplace_front(values, std::move(ce));
  while (instances.size() > static_cast<size_t>(std::max(1, opts.instance_limit))) instances.pop_back();
  return *instances.front().second;
}

std::unique_ptr<CompiledExecutable> compile_cpu(std::unique_ptr<Graph> g, const std::vector<Tensor>& ex,
                                                const CompiledBackendOptions& opts) {
  if (!graph_symbols(*g).empty()) return CompiledExecutable::compile_symbolic(std::move(g), ex, opts);
  const auto t0 = Clock::now();
  std::unique_ptr<CompiledExecutable> ce(new CompiledExecutable());
  CompiledCompileStats& st = ce->stats_;
  st.threads = resolve_threads(opts.threads);
  st.model = opts.model_name;
  const std::string model = opts.model_name;
  CompiledExecutable::Builder b(*ce);

  // Inputs that decide shapes become constants first (their guards go to the executable), then the
  // host CPU's lowering (lower/cpu.h): passes, fusion, code generation; then the toolchain and the plan.
  GraphBackendOptions go;
  GraphBackendOptions::Prelowered pre;
  pre.num_inputs = g->inputs.size();
  pre.guards = specialise_inputs(*g, ex, go.max_baked_elements);
  st.dump_dir = dump_folder(opts);
  lower::CpuLowered low = lower::lower_cpu(std::move(g), cpu_lowering(opts, st.dump_dir, true));
  pre.pipeline_error = low.pipeline_error;
  pre.pass_seconds = low.pass_seconds;
  st.fuse_seconds = low.fuse_seconds;
  if (opts.keep_module) {
    std::vector<const Tensor*> blobs;
    ce->module_text_ = print_kernel_module(low.module, &blobs);
    for (const Tensor* t : blobs) ce->module_blobs_.push_back(*t);
  }
  ce->so_ = build_lowered(low, model, opts.toolchain, st);
  ce->in_library_ = std::move(low.in_library);
  ce->library_ = std::move(low.library);
  ce->source_ = std::move(low.source);
  ce->kernels_ = std::move(low.module.kernels);
  go.lowered = std::move(pre);
  go.kernel_nodes = &b;
  go.output_aliases = opts.output_aliases;
  go.optional_aliases = opts.optional_aliases;
  go.recycled_outputs = opts.recycled_outputs;
  // Library primitives are created for the threads they will run with (run() applies the same count).
  ScopedOmpThreads library_threads(st.threads);
  ce->exe_ = compile_graph(std::move(low.module.graph), ex, go);
  b.finish();
  st.compile_seconds = seconds_since(t0);
  print_compile_profile(st);
  return ce;
}

std::string CompiledExecutable::unsaveable_reason() const {
  const GraphCompileStats& g = stats_.graph;
  if (sym_) return "it has symbolic sizes (the executable cache stores static compilations)";
  if (module_text_.empty()) return "the kernel module was not kept (CompiledBackendOptions::keep_module)";
  if (!g.baked_inputs.empty()) return "it is specialised on the values of inputs";
  if (!g.pipeline_error.empty()) return "the core pipeline could not lower the model";
  return {};
}

void CompiledExecutable::stored_pieces(std::vector<BlobToStore>& blobs, std::vector<PackedToStore>& packed) const {
  for (const Tensor& t : module_blobs_) blobs.push_back({t.bytes(), t.nbytes()});
  for (const auto& L : launches_) {
    cpu::PackedWeights w = L->matmul ? L->matmul->packed_weights() : L->conv ? L->conv->packed_weights() : cpu::PackedWeights{};
    if (w.valid()) packed.push_back({L->kernel_index, w.data, w.nbytes, w.layout});
  }
}

uint64_t CompiledExecutable::saved_bytes() const {
  std::vector<BlobToStore> blobs;
  std::vector<PackedToStore> packed;
  stored_pieces(blobs, packed);
  uint64_t n = module_text_.size();
  for (const BlobToStore& b : blobs) n += b.nbytes;
  std::set<std::pair<const void*, uint64_t>> once;  // a packing kernels share is stored once (write_entry)
  for (const PackedToStore& p : packed)
    if (once.insert({p.data, p.nbytes}).second) n += p.nbytes;
  return n;
}

void CompiledExecutable::save(const std::string& dir, const std::string& key) const {
  if (std::string why = unsaveable_reason(); !why.empty())
    throw Error(Location{.file = dir, .pass = "executable cache"}, "cannot store this executable: " + why);
  std::vector<BlobToStore> blobs;
  std::vector<PackedToStore> packed;
  stored_pieces(blobs, packed);
  EntryManifest m;
  m.format = kEntryFormat;
  m.key = key;
  m.model = stats_.model;
  m.so_path = stats_.so_path;
  if (so_) m.so = so_->checksum();
  m.threads = stats_.threads;
  write_entry(dir, module_text_, blobs, packed, m);
}

namespace {

[[noreturn]] void entry_error(const std::string& file, const std::string& msg) {
  throw Error(Location{.file = file, .pass = "executable cache"}, msg);
}

// The kernel module of a read entry: parsed, each blob<N> bound to its bytes in constants.bin (the
// size the module's type declares, computed without overflow, must be the size stored), verified,
// and every packed weight naming one of its kernels.
KernelModule entry_module(const LoadedEntry& e) {
  const FileBytes& cb = e.constants;
  const BlobSource blobs = [&](int i, const TensorType& t) -> Tensor {
    if (i < 0 || static_cast<size_t>(i) >= e.manifest.blobs.size()) return {};
    const EntryBlob& b = e.manifest.blobs[static_cast<size_t>(i)];
    uint64_t n = dtype_size(t.dtype);
    for (int64_t d : t.shape)
      if (d < 0 || __builtin_mul_overflow(n, static_cast<uint64_t>(d), &n)) return {};
    if (b.nbytes != n) return {};
    return Tensor::adopt(t.dtype, t.shape, cb.owner, const_cast<uint8_t*>(cb.data + b.offset));
  };
  KernelModule m = parse_kernel_module(e.module_text, e.module_path, blobs);
  try {
    verify_kernel_module(m);
  } catch (const Error& x) {
    throw x.with_context(Location{.file = e.module_path, .pass = "executable cache"});
  }
  for (const EntryPacked& p : e.manifest.packed_weights)
    if (p.kernel >= m.kernels.size())
      entry_error(e.module_path, fmt::format("packed weights for kernel {} of {}", p.kernel, m.kernels.size()));
  return m;
}

}  // namespace

size_t check_cpu_entry(const std::string& dir, bool verify_checksums) {
  EntryReadOptions ro;
  ro.verify_checksums = verify_checksums;
  const LoadedEntry e = read_entry(dir, ro);
  return entry_module(e).kernels.size();
}

std::unique_ptr<CompiledExecutable> load_cpu(const std::string& dir, const std::vector<Tensor>& ex,
                                             const CompiledBackendOptions& opts, const std::string& key) {
  const auto t0 = Clock::now();
  EntryReadOptions ro;
  ro.key = key;
  LoadedEntry e = read_entry(dir, ro);
  std::unique_ptr<CompiledExecutable> ce(new CompiledExecutable());
  CompiledCompileStats& st = ce->stats_;
  st.entry_seconds = seconds_since(t0);
  st.threads = resolve_threads(opts.threads);
  st.loaded = true;
  st.model = e.manifest.model;
  KernelModule m = entry_module(e);
  CompiledExecutable::Builder b(*ce);
  for (const EntryPacked& p : e.manifest.packed_weights)
    b.prepacked[p.kernel] = cpu::PackedWeights{e.packed.data + p.offset, p.nbytes, p.layout, e.packed.owner};
  ce->in_library_ = cpu::library_epilogues(m, &ce->library_);
  bool any_fn = false;
  for (size_t i = 0; i < m.kernels.size(); ++i) any_fn = any_fn || cpu::has_generated_function(m.kernels[i], ce->in_library_[i]);
  if (any_fn) {
    if (e.manifest.so_path.empty())
      throw Error(Location{.file = dir, .pass = "executable cache"}, "the manifest names no shared object for the generated kernels");
    auto tl = Clock::now();
    ce->so_ = cpu::SharedObject::open_verified(e.manifest.so_path, e.manifest.so);
    st.load_seconds = seconds_since(tl);
    st.cache_hit = true;
    st.so_path = e.manifest.so_path;
    st.source_path = std::filesystem::path(e.manifest.so_path).replace_extension(".cpp").string();
  }
  ce->kernels_ = std::move(m.kernels);
  GraphBackendOptions go;
  go.pipeline = "";  // the module is already the kernel level
  go.kernel_nodes = &b;
  ScopedOmpThreads library_threads(st.threads);  // as in compile_cpu
  ce->exe_ = compile_graph(std::move(m.graph), ex, go);
  b.finish();
  st.compile_seconds = seconds_since(t0);
  return ce;
}

const Graph& CompiledExecutable::graph() const { return sym_ ? *sym_->module.graph : exe_->graph(); }

std::vector<Tensor> CompiledExecutable::run(const std::vector<Tensor>& inputs, GraphRunStats* stats) {
  if (sym_) {
    std::vector<Shape> shapes;
    shapes.reserve(inputs.size());
    for (const Tensor& t : inputs) shapes.push_back(t.shape());
    std::vector<int64_t> values;
    if (std::string why = sym_->binder->bind(shapes, values); !why.empty()) throw GuardFailure(Location{.pass = "guard"}, why);
    if (sym_->rebound) {
      if (values != sym_->rebound_values) {
        const auto t0 = Clock::now();
        try {
          sym_->rebind(values);
        } catch (const Error& e) {  // sizes this binding makes too large, a primitive it cannot have
          throw e.with_context(Location{.pass = "binding " + binding_str(sym_->binder->bindings(values))});
        }
        stats_.rebinds++;
        stats_.rebind_seconds += seconds_since(t0);
      }
      ScopedOmpThreads threads(stats_.threads);
      return sym_->rebound->exe_->run(inputs, stats);
    }
    CompiledExecutable* inst = nullptr;
    try {
      inst = &sym_->instance(values, *this);
    } catch (const Error& e) {  // sizes this binding makes too large, a primitive it cannot have
      throw e.with_context(Location{.pass = "instance for " + binding_str(sym_->binder->bindings(values))});
    }
    return inst->run(inputs, stats);
  }
  // oneDNN's OpenMP runtime follows it; the primitives were built under this count, so none rebuilds.
  ScopedOmpThreads threads(stats_.threads);
  return exe_->run(inputs, stats);
}

}  // namespace tessel
