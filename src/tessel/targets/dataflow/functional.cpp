// The functional simulator of the tile level (see functional.h).
#include "tessel/targets/dataflow/functional.h"

#include <bit>
#include <chrono>
#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <set>
#include <unordered_map>

#include "tessel/ir/infer.h"
#include "tessel/support/error.h"
#include "tessel/support/threads.h"
#include "tessel/targets/cpu/codegen.h"
#include "tessel/targets/cpu/dnnl_ops.h"
#include "tessel/targets/cpu/library_epilogue.h"

namespace tessel::dataflow {
namespace {

using Clock = std::chrono::steady_clock;
using GeneratedFn = void(void* const*, const long*, long, long);

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// "t3 (kernel k2, node /fc1/MatMul)": how errors name a tile kernel.
std::string kernel_label(const TileKernel& k, const KernelModule& m) {
  std::string s = k.name;
  if (k.kernel >= 0 && static_cast<size_t>(k.kernel) < m.kernels.size()) s += " (kernel " + m.kernels[static_cast<size_t>(k.kernel)].name;
  else s += " (host step";
  if (!k.node.empty()) s += ", node " + k.node;
  return s + ")";
}

Error kernel_error(const TileKernel& k, const std::string& label, const std::string& reason) {
  return Error(Location{.node = k.node, .op = std::string(tile_kind_name(k.kind)), .pass = "functional-sim"},
               label + ": " + reason);
}

// Rounds a tensor's values to what the device dtype holds. Float tensors the model keeps in f32 are
// rounded in place; other floats go through their exact values; integers and bools are untouched.
struct RoundStats {
  int64_t flushed = 0, overflowed = 0;
};

void round_tensor(Tensor& t, DType device, RoundStats* st = nullptr, bool dl16 = false) {
  if (!is_float(t.dtype()) || !(device == DType::f16 || device == DType::bf16)) return;
  const bool to_dl16 = dl16 && device == DType::f16;
  if (t.dtype() == DType::f32) {
    float* d = t.data<float>();
    int64_t flushed = 0, overflowed = 0;
    for (int64_t i = 0; i < t.numel(); ++i) {
      const float x = d[i], r = to_dl16 ? round_to_dl16(x) : round_to_dtype(x, device);
      flushed += x != 0 && r == 0;
      overflowed += std::isfinite(x) && std::isinf(r);
      d[i] = r;
    }
    if (st) st->flushed += flushed, st->overflowed += overflowed;
  } else if (t.dtype() == DType::f64) {
    double* d = t.data<double>();
    for (int64_t i = 0; i < t.numel(); ++i)
      d[i] = to_dl16 ? round_to_dl16(static_cast<float>(d[i])) : decode_float_bits(device, encode_float_bits(device, d[i]));
  }
  // f16/bf16 and narrower model dtypes already hold only values the device dtype holds (for f16
  // storage of a bf16 model, the rare out-of-range value is the model's problem, not the device's).
}

struct MatmulKey {
  int64_t bt, mt, nt, kt;
};

class Simulator {
 public:
  Simulator(const TileProgram& p, const KernelModule& m, const FunctionalOptions& o) : p_(p), m_(m), o_(o) {
    if (!m.graph) fail("run_functional: the kernel module has no graph");
    const Graph& g = *m.graph;
    env_.resize(g.values().size());
    device_.assign(g.values().size(), DType::f32);
    std::unordered_map<std::string, int> globals;
    for (size_t i = 0; i < p.globals.size(); ++i) globals.emplace(p.globals[i].name, static_cast<int>(i));
    for (const auto& v : g.values()) {
      auto git = globals.find(v->name);
      const int gi = git == globals.end() ? -1 : git->second;
      device_[static_cast<size_t>(v->id)] = gi >= 0 ? p.globals[static_cast<size_t>(gi)].dtype
                                            : is_float(v->type.dtype) ? p.float_dtype : v->type.dtype;
    }
    for (const auto& n : g.nodes()) {
      if (is_kernel_node(*n)) kernel_node_[n->attr_i("kernel")] = n.get();
      else host_nodes_[n->name].push_back(n.get());
    }
  }

  FunctionalResult run(const std::vector<Tensor>& inputs) {
    const auto t0 = Clock::now();
    FunctionalResult r;
    ScopedOmpThreads threads(std::max(1, o_.threads));  // the caller's count comes back when the run ends
    build_kernels(r);
    const Graph& g = *m_.graph;
    if (inputs.size() != g.inputs.size())
      fail("run_functional: the model takes {} inputs but {} were given", g.inputs.size(), inputs.size());
    for (size_t i = 0; i < inputs.size(); ++i) {
      const Value* v = g.inputs[i];
      const Tensor& t = inputs[i];
      if (t.dtype() != v->type.dtype || t.rank() != static_cast<int>(v->type.shape.size()))
        fail("run_functional: input '{}' must be {} but got {}", v->name, v->type.str(), TensorType{t.dtype(), t.shape()}.str());
      for (int d = 0; d < t.rank(); ++d)
        if (v->type.shape[static_cast<size_t>(d)] >= 0 && v->type.shape[static_cast<size_t>(d)] != t.dim(d))
          fail("run_functional: input '{}' must be {} but got {}", v->name, v->type.str(), TensorType{t.dtype(), t.shape()}.str());
      Tensor c = t.clone();
      round_tensor(c, device_[static_cast<size_t>(v->id)], &entry_, p_.dl16);
      env_[static_cast<size_t>(v->id)] = std::move(c);
    }
    for (const TileKernel& k : p_.kernels) {
      const std::string label = kernel_label(k, m_);
      const int64_t flushed_before = stored_.flushed, overflowed_before = stored_.overflowed;
      try {
        if (k.kind == TileKind::host) {
          run_host(k, label);
          r.host_steps++;
        } else if (k.kind == TileKind::relayout) {
          // a re-layout copy moves bytes between DRAM layouts; the shadow arrays hold logical order,
          // so the values it copies are already where its consumer reads them (its tiles must still
          // cover its rows exactly once)
          (void)tile_ranges(k);
          r.relayouts++;
        } else {
          r.tiles_executed += run_kernel(k, label);
        }
      } catch (const Error& e) {
        if (e.reason().rfind(k.name + ":", 0) == 0) throw;  // already names the kernel
        throw kernel_error(k, label, e.reason());
      }
      if (r.first_flush.empty() && stored_.flushed > flushed_before) r.first_flush = label;
      if (r.first_overflow.empty() && stored_.overflowed > overflowed_before) r.first_overflow = label;
    }
    if (o_.keep_values)
      for (const auto& v : g.values())
        if (v->producer && env_[static_cast<size_t>(v->id)].valid()) r.values.emplace_back(v->name, env_[static_cast<size_t>(v->id)]);
    for (const auto& [kid, node] : kernel_node_)
      if (!ran_.count(kid))
        throw Error(Location{.node = node->name, .op = "kernel", .pass = "functional-sim"},
                    fmt::format("kernel {} of the kernel module is run by no tile kernel of {}",
                                m_.kernels.at(static_cast<size_t>(kid)).name, p_.name));
    for (const Value* v : g.outputs) {
      if (v->constant) {
        r.outputs.push_back(value(v, "the model's outputs"));
        continue;
      }
      const Tensor& t = env_[static_cast<size_t>(v->id)];
      if (!t.valid()) fail("run_functional: no tile kernel or host step produced the model output '{}'", v->name);
      r.outputs.push_back(t);
    }
    r.compile_seconds = compile_seconds_;
    r.entry_flushed = entry_.flushed, r.entry_overflowed = entry_.overflowed;
    r.flushed = stored_.flushed, r.overflowed = stored_.overflowed;
    r.seconds = seconds_since(t0);
    return r;
  }

 private:
  // The generated functions (every matmul/conv epilogue included: oneDNN computes only the fp32
  // products here, the epilogue runs over them as the target's vector engine would).
  void build_kernels(FunctionalResult&) {
    const auto t0 = Clock::now();
    if (o_.kernels && o_.kernels->built) {  // built by an earlier run of this program
      so_ = o_.kernels->so;
      fns_.clear();
      for (void* f : o_.kernels->fns) fns_.push_back(reinterpret_cast<GeneratedFn*>(f));
      return;
    }
    bool any = false;
    for (const Kernel& k : m_.kernels) any = any || cpu::has_generated_function(k, false);
    fns_.assign(m_.kernels.size(), nullptr);
    if (!any) {
      if (o_.kernels) remember();
      return;
    }
    std::vector<bool> in_library(m_.kernels.size(), false);
    const std::string src = cpu::generate_cpp(m_, p_.name.empty() ? "tile-functional" : p_.name, in_library);
    std::vector<std::string> symbols;
    for (size_t i = 0; i < m_.kernels.size(); ++i)
      if (cpu::has_generated_function(m_.kernels[i], false)) symbols.push_back(cpu::kernel_symbol(i));
    cpu::BuildResult br = cpu::build_shared_object(src, p_.name.empty() ? "tile-functional" : p_.name, o_.toolchain, symbols);
    so_ = br.so;
    for (size_t i = 0; i < m_.kernels.size(); ++i)
      if (cpu::has_generated_function(m_.kernels[i], false))
        fns_[i] = so_->function<GeneratedFn>(cpu::kernel_symbol(i));
    compile_seconds_ = seconds_since(t0);
    if (o_.kernels) remember();
  }

  void remember() {
    o_.kernels->so = so_;
    o_.kernels->fns.clear();
    for (GeneratedFn* f : fns_) o_.kernels->fns.push_back(reinterpret_cast<void*>(f));
    o_.kernels->built = true;
  }

  // A value as a kernel reads it: produced earlier, an input, or a constant (rounded on first use).
  const Tensor& value(const Value* v, const std::string& reader) {
    Tensor& t = env_[static_cast<size_t>(v->id)];
    if (t.valid()) return t;
    if (v->constant) {
      t = v->constant->clone();
      round_tensor(t, device_[static_cast<size_t>(v->id)], &entry_, p_.dl16);
      return t;
    }
    fail("reads '{}', which no earlier tile kernel or host step produced ({})", v->name, reader);
  }

  void run_host(const TileKernel& k, const std::string&) {
    auto it = host_nodes_.find(k.node);
    if (it == host_nodes_.end() || it->second.empty())
      fail("the host step names node '{}', which is not a (remaining) non-kernel node of the kernel module", k.node);
    const Node* n = it->second.front();
    it->second.erase(it->second.begin());
    std::vector<const Tensor*> ins;
    for (const Value* v : n->inputs) ins.push_back(v ? &value(v, "host step input") : nullptr);
    std::vector<Tensor> outs;
    try {
      outs = run_node(*n, ins);
    } catch (const Error& e) {
      fail("the reference kernel of {} failed: {}", n->op_name(), e.what());
    }
    for (size_t i = 0; i < outs.size() && i < n->outputs.size(); ++i) {
      const Value* v = n->outputs[i];
      if (!v) continue;
      round_tensor(outs[i], device_[static_cast<size_t>(v->id)], &stored_, p_.dl16);
      env_[static_cast<size_t>(v->id)] = std::move(outs[i]);
    }
  }

  // Returns the tiles run.
  int64_t run_kernel(const TileKernel& tk, const std::string& label) {
    if (tk.kernel < 0 || static_cast<size_t>(tk.kernel) >= m_.kernels.size())
      fail("names kernel {}, but the module has {} kernels", tk.kernel, m_.kernels.size());
    const Kernel& k = m_.kernels[static_cast<size_t>(tk.kernel)];
    if (!ran_.insert(tk.kernel).second) fail("runs kernel {} a second time", k.name);
    auto kn = kernel_node_.find(tk.kernel);
    if (kn == kernel_node_.end()) fail("no node of the kernel module runs kernel {}", k.name);
    const Node& node = *kn->second;
    // Arguments: inputs from the globals, outputs and scratch fresh (zeroed) buffers in the model's
    // dtype (f32 shadows of device-dtype values).
    std::vector<void*> args(k.args.size(), nullptr);
    std::vector<Tensor> outs, scratch;
    std::vector<const Value*> out_values;
    size_t in = 0;
    outs.reserve(k.args.size());
    scratch.reserve(k.args.size());
    for (size_t i = 0; i < k.args.size(); ++i) {
      const KArg& a = k.args[i];
      if (a.role == KArg::Role::in) {
        if (in >= node.inputs.size() || !node.inputs[in]) fail("kernel {} arg {} has no node input", k.name, i);
        args[i] = const_cast<uint8_t*>(value(node.inputs[in++], a.name).bytes());
      } else if (a.role == KArg::Role::out) {
        const size_t oi = out_values.size();
        if (oi >= node.outputs.size() || !node.outputs[oi]) fail("kernel {} arg {} has no node output", k.name, i);
        out_values.push_back(node.outputs[oi]);
        outs.emplace_back(a.type.dtype, a.type.shape);
        args[i] = outs.back().bytes();
      } else {
        scratch.emplace_back(a.type.dtype, a.type.shape);
        args[i] = scratch.back().bytes();
      }
    }
    const auto ranges = tile_ranges(tk);  // checks coverage per dim
    int64_t tiles = 0;
    if (tk.kind == TileKind::vector) tiles = run_vector(tk, k, ranges, args);
    else if (tk.kind == TileKind::matmul) tiles = run_matmul(tk, k, ranges, args);
    else if (tk.kind == TileKind::conv) tiles = run_conv(tk, k, node, ranges, args);
    else fail("unknown tile kind");
    (void)label;
    for (size_t i = 0; i < outs.size(); ++i) {
      round_tensor(outs[i], device_[static_cast<size_t>(out_values[i]->id)], &stored_, p_.dl16);
      env_[static_cast<size_t>(out_values[i]->id)] = std::move(outs[i]);
    }
    return tiles;
  }

  // Cores in row-major order over the dims (the last varies fastest), each calling `tile` for every
  // combination of its per-dim tiles in the kernel's loop order (outermost first).
  template <typename F>
  int64_t for_each_tile(const TileKernel& tk, const std::vector<std::vector<std::vector<TileRange>>>& ranges, F&& tile) {
    const size_t nd = tk.dims.size();
    std::vector<int> order = tk.order;
    if (order.empty())
      for (size_t d = 0; d < nd; ++d) order.push_back(static_cast<int>(d));
    std::vector<bool> seen(nd, false);
    if (order.size() != nd) fail("its loop order has {} dims but the kernel has {}", order.size(), nd);
    for (int d : order) {
      if (d < 0 || static_cast<size_t>(d) >= nd || seen[static_cast<size_t>(d)])
        fail("its loop order is not a permutation of its {} dims", nd);
      seen[static_cast<size_t>(d)] = true;
    }
    int64_t cores = 1;
    for (const Dim& d : tk.dims) cores *= d.split;
    if (tk.cores != cores) fail("cores = {} but its splits multiply to {}", tk.cores, cores);
    std::vector<int64_t> coord(nd, 0), step(nd, 0);
    std::vector<TileRange> cur(nd);
    int64_t count = 0;
    for (int64_t c = 0; c < cores; ++c) {
      int64_t rest = c;
      for (size_t d = nd; d-- > 0;) {
        coord[d] = rest % tk.dims[d].split;
        rest /= tk.dims[d].split;
      }
      bool empty = false;
      for (size_t d = 0; d < nd; ++d) empty = empty || ranges[d][static_cast<size_t>(coord[d])].empty();
      if (empty) continue;  // a core without work along some dim
      // Odometer over the tile steps in loop order (the last of `order` fastest).
      std::fill(step.begin(), step.end(), 0);
      while (true) {
        for (size_t d = 0; d < nd; ++d) cur[d] = ranges[d][static_cast<size_t>(coord[d])][static_cast<size_t>(step[d])];
        tile(c, cur);
        ++count;
        size_t i = nd;
        while (i-- > 0) {
          const size_t d = static_cast<size_t>(order[i]);
          if (++step[d] < static_cast<int64_t>(ranges[d][static_cast<size_t>(coord[d])].size())) break;
          step[d] = 0;
        }
        if (i == static_cast<size_t>(-1)) break;
      }
    }
    return count;
  }

  int find_dim(const TileKernel& tk, const std::string& name, int64_t size, const char* what) {
    for (size_t d = 0; d < tk.dims.size(); ++d)
      if (tk.dims[d].name == name) {
        if (tk.dims[d].size != size) fail("dim {} has size {} but the kernel's {} is {}", name, tk.dims[d].size, what, size);
        return static_cast<int>(d);
      }
    if (size == 1) return -1;  // a dim of extent 1 may be left out
    fail("has no dim '{}' (the kernel's {} is {})", name, what, size);
  }

  // Total points the executed tiles covered must be the iteration space's (with tile_ranges' per-dim
  // partition this is the exact-once check of what actually ran).
  static void check_volume(const TileKernel& tk, int64_t covered) {
    int64_t total = 1;
    for (const Dim& d : tk.dims) total *= d.size;
    if (covered != total) fail("its tiles covered {} points of an iteration space of {}", covered, total);
  }

  int64_t run_vector(const TileKernel& tk, const Kernel& k, const std::vector<std::vector<std::vector<TileRange>>>& ranges,
                     std::vector<void*>& args) {
    GeneratedFn* fn = fns_[static_cast<size_t>(tk.kernel)];
    if (!fn) fail("kernel {} has no generated function", k.name);
    const int64_t P = k.parallel_extent();
    const int dp = find_dim(tk, "p", P, "parallel extent");
    int de = -1;
    for (size_t d = 0; d < tk.dims.size(); ++d) {
      if (static_cast<int>(d) == dp) continue;
      if (tk.dims[d].name != "e") fail("vector kernels have dims p and e, not '{}'", tk.dims[d].name);
      if (tk.dims[d].split != 1) fail("dim e is split over {} cores; a vector kernel's e is not split", tk.dims[d].split);
      de = static_cast<int>(d);
    }
    // Every p point is computed exactly once: counted as the calls run.
    std::vector<uint8_t> hit(static_cast<size_t>(P), 0);
    int64_t covered = 0;
    const int64_t n = for_each_tile(tk, ranges, [&](int64_t, const std::vector<TileRange>& t) {
      const TileRange r = dp >= 0 ? t[static_cast<size_t>(dp)] : TileRange{0, P};
      const TileRange re = de >= 0 ? t[static_cast<size_t>(de)] : TileRange{0, 1};
      covered += (r.hi - r.lo) * (re.hi - re.lo);
      // The generated function computes whole p points (all their e elements): run it once per p
      // range, on the tile that starts e.
      if (re.lo != 0) return;
      for (int64_t i = r.lo; i < r.hi; ++i)
        if (hit[static_cast<size_t>(i)]++) fail("point p = {} is computed twice", i);
      fn(args.data(), nullptr, static_cast<long>(r.lo), static_cast<long>(r.hi));
    });
    for (int64_t i = 0; i < P; ++i)
      if (!hit[static_cast<size_t>(i)]) fail("point p = {} of {} is never computed", i, P);
    check_volume(tk, covered);
    return n;
  }

  int64_t run_matmul(const TileKernel& tk, const Kernel& k, const std::vector<std::vector<std::vector<TileRange>>>& ranges,
                     std::vector<void*>& args) {
    const MatmulSpec& s = k.mm;
    const int db = find_dim(tk, "b", s.batch, "batch"), dm = find_dim(tk, "m", s.m, "m"), dn = find_dim(tk, "n", s.n, "n"),
              dk = find_dim(tk, "k", s.k, "k");
    for (size_t d = 0; d < tk.dims.size(); ++d) {
      const std::string& nm = tk.dims[d].name;
      if (nm != "b" && nm != "m" && nm != "n" && nm != "k") fail("matmul kernels have dims b m n k, not '{}'", nm);
    }
    for (int a : {s.a, s.b, s.c})
      if (a < 0 || static_cast<size_t>(a) >= k.args.size() || k.args[static_cast<size_t>(a)].type.dtype != DType::f32)
        fail("matmul operands must be f32 buffers (kernel {})", k.name);
    const float* A = static_cast<const float*>(args[static_cast<size_t>(s.a)]) + s.a_offset;
    const float* B = static_cast<const float*>(args[static_cast<size_t>(s.b)]) + s.b_offset;
    float* C = static_cast<float*>(args[static_cast<size_t>(s.c)]);
    int64_t cb = s.c_batch, cm = s.c_m, cn = s.c_n;
    if (cb == 0 && cm == 0 && cn == 0) cb = s.m * s.n, cm = s.n, cn = 1;
    // C starts at zero (fresh buffer; a strided C may share its buffer with nothing else the
    // kernel writes before the call), every tile accumulates into it.
    // Exact coverage of what ran: every (b, m, n) output element receives exactly K products.
    std::vector<int32_t> kcount(static_cast<size_t>(s.batch * s.m * s.n), 0);
    auto rng = [&](const std::vector<TileRange>& t, int d, int64_t size) { return d >= 0 ? t[static_cast<size_t>(d)] : TileRange{0, size}; };
    int64_t covered = 0;
    const int64_t n = for_each_tile(tk, ranges, [&](int64_t, const std::vector<TileRange>& t) {
      const TileRange rb = rng(t, db, s.batch), rm = rng(t, dm, s.m), rn = rng(t, dn, s.n), rk = rng(t, dk, s.k);
      const MatmulKey key{rb.hi - rb.lo, rm.hi - rm.lo, rn.hi - rn.lo, rk.hi - rk.lo};
      covered += key.bt * key.mt * key.nt * key.kt;
      cpu::Matmul& mm = matmul_for(key, s, cb, cm, cn);
      mm.run(A + rb.lo * s.a_batch + rm.lo * s.a_m + rk.lo * s.a_k, B + rb.lo * s.b_batch + rk.lo * s.b_k + rn.lo * s.b_n,
             C + rb.lo * cb + rm.lo * cm + rn.lo * cn);
      for (int64_t b = rb.lo; b < rb.hi; ++b)
        for (int64_t i = rm.lo; i < rm.hi; ++i) {
          int32_t* row = kcount.data() + (b * s.m + i) * s.n;
          for (int64_t j = rn.lo; j < rn.hi; ++j) row[j] += static_cast<int32_t>(key.kt);
        }
    });
    for (size_t i = 0; i < kcount.size(); ++i)
      if (kcount[i] != s.k)
        fail("output element {} of [{}x{}x{}] accumulated {} of its {} products", i, s.batch, s.m, s.n, kcount[i], s.k);
    check_volume(tk, covered);
    // The epilogue over the fp32 result, once every K-split partial sum is in (element-wise, so the
    // same as per tile).
    if (GeneratedFn* fn = fns_[static_cast<size_t>(tk.kernel)]) fn(args.data(), nullptr, 0, static_cast<long>(k.parallel_extent()));
    return n;
  }

  // One primitive per distinct tile shape and stride set (kernels of one model share most of them).
  cpu::Matmul& matmul_for(const MatmulKey& key, const MatmulSpec& s, int64_t cb, int64_t cm, int64_t cn) {
    const std::vector<int64_t> full{key.bt, key.mt, key.nt, key.kt, s.a_batch, s.a_m, s.a_k, s.b_batch, s.b_k, s.b_n, cb, cm, cn};
    auto it = matmuls_.find(full);
    if (it != matmuls_.end()) return *it->second;
    cpu::MatmulDesc d;
    d.batch = key.bt, d.M = key.mt, d.N = key.nt, d.K = key.kt;
    d.a_batch = s.a_batch, d.a_m = s.a_m, d.a_k = s.a_k;
    d.b_batch = s.b_batch, d.b_k = s.b_k, d.b_n = s.b_n;
    d.c_batch = cb, d.c_m = cm, d.c_n = cn;
    d.epilogue.accumulate = true;  // C += A·B: fp32 accumulation over k tiles and K-split cores
    auto mm = std::make_unique<cpu::Matmul>(d);
    cpu::Matmul& ref = *mm;
    matmuls_.emplace(full, std::move(mm));
    return ref;
  }

  int64_t run_conv(const TileKernel& tk, const Kernel& k, const Node& node,
                   const std::vector<std::vector<std::vector<TileRange>>>& ranges, std::vector<void*>& args) {
    const ConvSpec& c = k.conv;
    const int dn = find_dim(tk, "n", c.n, "batch"), doc = find_dim(tk, "oc", c.oc, "output channels"),
              ds = find_dim(tk, "s", c.oh * c.ow, "output pixels"),
              dr = find_dim(tk, "r", c.c / std::max<int64_t>(1, c.groups) * c.kh * c.kw, "reduction");
    (void)dn, (void)doc, (void)ds;
    // The tiles are checked for exact coverage (tile_ranges per dim, and the volume they add up to);
    // the convolution runs as one oneDNN call per reduction tile (the whole kernel's output pixels and
    // channels, in fp32 on the rounded operands), the partial sums added into the fp32 output as the
    // target's accumulator adds them: what the tiles together compute up to the order of the fp32
    // additions within one reduction tile.
    int64_t covered = 0;
    std::set<std::pair<int64_t, int64_t>> reduction_tiles;
    const int64_t n = for_each_tile(tk, ranges, [&](int64_t, const std::vector<TileRange>& t) {
      int64_t v = 1;
      for (const TileRange& r : t) v *= r.hi - r.lo;
      covered += v;
      if (dr >= 0) reduction_tiles.emplace(t[static_cast<size_t>(dr)].lo, t[static_cast<size_t>(dr)].hi);
    });
    check_volume(tk, covered);
    // Weights: the node's input at arg w (a constant, rounded to the device dtype).
    if (c.w < 0 || static_cast<size_t>(c.w) >= k.args.size() || k.args[static_cast<size_t>(c.w)].role != KArg::Role::in)
      fail("conv weights arg {} is not an input", c.w);
    (void)node;
    const auto* x = static_cast<const float*>(args[static_cast<size_t>(c.x)]);
    const auto* w = static_cast<const float*>(args[static_cast<size_t>(c.w)]);
    auto* y = static_cast<float*>(args[static_cast<size_t>(c.y)]);
    if (reduction_tiles.size() <= 1) {
      cpu::ConvDesc d = cpu::conv_desc(c);
      d.weights = w;
      cpu::Conv2d(d).run(x, y);
    } else {
      conv_by_reduction_tiles(c, reduction_tiles, x, w, y);
    }
    if (GeneratedFn* fn = fns_[static_cast<size_t>(tk.kernel)]) fn(args.data(), nullptr, 0, static_cast<long>(k.parallel_extent()));
    return n;
  }

  // y = the sum over the reduction tiles of the convolution of those input channels: each tile a
  // oneDNN convolution of the channel slice of x and w, added into y in fp32. A tile must be whole
  // input channels (r runs over channels, then the kernel window) of an ungrouped convolution, as the
  // mapper makes them.
  static void conv_by_reduction_tiles(const ConvSpec& c, const std::set<std::pair<int64_t, int64_t>>& tiles,
                                      const float* x, const float* w, float* y) {
    const int64_t window = c.kh * c.kw, hw = c.h * c.wd;
    if (c.groups != 1) fail("a grouped convolution ({} groups) with its reduction split over {} tiles", c.groups, tiles.size());
    const int64_t ysize = c.n * c.oc * c.oh * c.ow;
    std::vector<float> partial(static_cast<size_t>(ysize));
    std::fill(y, y + ysize, 0.0f);
    for (const auto& [lo, hi] : tiles) {
      if (lo % window || hi % window)
        fail("reduction tile [{}, {}) is not whole input channels of a {}x{} kernel", lo, hi, c.kh, c.kw);
      const int64_t c0 = lo / window, tc = (hi - lo) / window;
      std::vector<float> xs(static_cast<size_t>(c.n * tc * hw)), ws(static_cast<size_t>(c.oc * tc * window));
      for (int64_t b = 0; b < c.n; ++b) {
        if (c.x_nhwc) {  // [N, H, W, C]: tc channels of every pixel
          for (int64_t p = 0; p < hw; ++p)
            std::memcpy(&xs[static_cast<size_t>((b * hw + p) * tc)], x + (b * hw + p) * c.c + c0,
                        static_cast<size_t>(tc) * sizeof(float));
        } else {  // [N, C, H, W]: tc whole planes
          std::memcpy(&xs[static_cast<size_t>(b * tc * hw)], x + (b * c.c + c0) * hw, static_cast<size_t>(tc * hw) * sizeof(float));
        }
      }
      for (int64_t o = 0; o < c.oc; ++o)  // [OC, C, KH, KW]
        std::memcpy(&ws[static_cast<size_t>(o * tc * window)], w + (o * c.c + c0) * window, static_cast<size_t>(tc * window) * sizeof(float));
      ConvSpec part = c;
      part.c = tc;
      cpu::ConvDesc d = cpu::conv_desc(part);
      d.weights = ws.data();
      cpu::Conv2d(d).run(xs.data(), partial.data());
      for (int64_t i = 0; i < ysize; ++i) y[i] += partial[static_cast<size_t>(i)];
    }
  }

  const TileProgram& p_;
  const KernelModule& m_;
  const FunctionalOptions& o_;
  std::vector<Tensor> env_;
  std::vector<DType> device_;
  std::map<int64_t, const Node*> kernel_node_;
  std::set<int64_t> ran_;
  std::unordered_map<std::string, std::vector<const Node*>> host_nodes_;
  std::shared_ptr<cpu::SharedObject> so_;
  std::vector<GeneratedFn*> fns_;
  std::map<std::vector<int64_t>, std::unique_ptr<cpu::Matmul>> matmuls_;
  double compile_seconds_ = 0;
  RoundStats entry_, stored_;  // inputs and constants; kernel and host-step results
};

}  // namespace

float round_to_dtype(float x, DType t) {
  uint32_t u = std::bit_cast<uint32_t>(x);
  if (t == DType::bf16) {
    if ((u & 0x7fffffffu) > 0x7f800000u) return x;  // NaN
    u = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
    return std::bit_cast<float>(u);
  }
  if (t != DType::f16) return x;
  const uint32_t sign = u & 0x80000000u, a = u ^ sign;
  if (a >= 0x7f800000u) return x;  // inf, NaN
  if (a < 0x38800000u) {
    // Below f16's smallest normal (2^-14): a multiple of 2^-24. Adding 0.5 (whose ulp is 2^-24)
    // rounds to nearest even in the float unit; the subtraction is exact.
    volatile float big = std::bit_cast<float>(a) + 0.5f;
    const float r = big - 0.5f;
    return std::bit_cast<float>(std::bit_cast<uint32_t>(r) | sign);
  }
  uint32_t r = (a + 0xfffu + ((a >> 13) & 1u)) & ~0x1fffu;
  if (r >= 0x47800000u) r = 0x7f800000u;  // past 65504 (ties at 65520 round to inf)
  return std::bit_cast<float>(r | sign);
}

float round_to_dl16(float x) {
  const uint32_t u = std::bit_cast<uint32_t>(x);
  const uint32_t sign = u & 0x80000000u, a = u ^ sign;
  if (a > 0x7f800000u) return x;  // NaN
  // 9 fraction bits: round the float's 23 to nearest even at bit 14
  uint32_t r = a >= 0x7f800000u ? a : (a + 0x1fffu + ((a >> 14) & 1u)) & ~0x3fffu;
  const int e = static_cast<int>(r >> 23) - 127;
  if (e < -30) {
    // no subnormals: the nearer of 0 and the smallest normal 2^-30 (0x30800000); the midpoint 2^-31
    // (0x30000000) goes to 0, whose code is even
    r = a > 0x30000000u ? 0x30800000u : 0u;
  } else if (e > 32 || (e == 32 && (r & 0x7fc000u) == 0x7fc000u)) {
    r = 0x7f800000u;  // past (2 - 2^-8) * 2^32: the all-ones code is NaN/inf
  }
  return std::bit_cast<float>(r | sign);
}

void round_to_dtype(float* data, int64_t n, DType t) {
  if (t != DType::f16 && t != DType::bf16) return;
  for (int64_t i = 0; i < n; ++i) data[i] = round_to_dtype(data[i], t);
}

std::vector<std::vector<std::vector<TileRange>>> tile_ranges(const TileKernel& k) {
  std::vector<std::vector<std::vector<TileRange>>> out;
  auto err = [&](const Dim& d, const std::string& why) {
    return Error(Location{.node = k.node, .op = std::string(tile_kind_name(k.kind)), .pass = "functional-sim"},
                 fmt::format("{}: coverage error in dim {} (size {}, split {}, slice {}, tile {}): {}", k.name, d.name, d.size,
                             d.split, d.slice, d.tile, why));
  };
  for (const Dim& d : k.dims) {
    if (d.size < 0 || d.split < 1 || d.slice < 1 || d.tile < 1) throw err(d, "size, split, slice and tile must be positive");
    std::vector<std::vector<TileRange>> per_core(static_cast<size_t>(d.split));
    std::vector<uint8_t> hits(static_cast<size_t>(d.size), 0);
    for (int64_t c = 0; c < d.split; ++c) {
      const int64_t lo = c * d.slice, hi = std::min(d.size, (c + 1) * d.slice);
      for (int64_t t = lo; t < hi; t += d.tile) {
        TileRange r{t, std::min(hi, t + d.tile)};
        per_core[static_cast<size_t>(c)].push_back(r);
        for (int64_t i = r.lo; i < r.hi; ++i)
          if (hits[static_cast<size_t>(i)]++)
            throw err(d, fmt::format("point {} is covered twice (core {})", i, c));
      }
    }
    for (int64_t i = 0; i < d.size; ++i)
      if (!hits[static_cast<size_t>(i)])
        throw err(d, fmt::format("point {} is covered by no core (the {} slices of {} end at {})", i, d.split, d.slice,
                                 std::min(d.size, d.split * d.slice)));
    out.push_back(std::move(per_core));
  }
  return out;
}

FunctionalResult run_functional(const TileProgram& p, const KernelModule& m, const std::vector<Tensor>& inputs,
                                const FunctionalOptions& o) {
  Simulator sim(p, m, o);
  return sim.run(inputs);
}

}  // namespace tessel::dataflow
