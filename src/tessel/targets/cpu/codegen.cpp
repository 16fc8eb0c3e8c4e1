// Kernel level -> C++ (see codegen.h).
#include "tessel/targets/cpu/codegen.h"

#include <cmath>
#include <cstring>
#include <map>
#include <set>

#include "tessel/ir/bind.h"
#include "tessel/ir/core_ops.h"
#include "tessel/support/error.h"
#include "tessel/support/escape.h"
#include "tessel/targets/c_expr.h"

namespace tessel::cpu {
namespace {

// A max or min reduction: its accumulator keeps a NaN flag (the loop's compares drop NaN).
bool is_min_max_reduction(const std::string& kind) {
  const std::optional<CoreOp> c = reduction_combiner(kind);
  return c == CoreOp::max || c == CoreOp::min;
}

// The C spellings are shared with the CUDA generator (targets/c_expr.h).
std::string ctype(DType t) { return c_type(t); }
std::string storage_type(DType t) { return c_storage_type(t); }
std::string literal(DType t, double v) { return c_literal(t, v, CDialect::cpp); }

struct Emitter {
  const Kernel& k;
  size_t kernel_index;           // the kernel's position in its module: its symbol
  const std::vector<std::string>& symbols;  // the module's size symbols: S<i> reads sz[i]
  std::string out;
  std::vector<std::string> val;  // C++ expression / variable of each instruction

  Emitter(const Kernel& kk, size_t i, const std::vector<std::string>& syms) : k(kk), kernel_index(i), symbols(syms), val(kk.body.size()) {
    flat = flat_form();
    column = column_form();
  }
  bool flat = false, column = false;  // the loop forms below, decided once per kernel

  void line(int indent, const std::string& s) { out += std::string(static_cast<size_t>(indent) * 2, ' ') + s + "\n"; }

  // A size as a C++ expression of type long: its number, or (for a symbolic size) a polynomial in the
  // S<i> locals generate() declares from sz[] (parenthesised unless it is one symbol alone).
  std::string cdim(const Dim& d) const {
    for (const std::string& s : d.symbols()) used_symbols.insert(s);
    return c_size_expr(d, symbols, "S");
  }
  mutable std::set<std::string> used_symbols;  // the symbols cdim printed: declared at the top
  // `x * d` for an index x, simplified for strides 0 and 1 (empty for 0).
  std::string scaled(const std::string& x, const Dim& d) const {
    if (d == 0) return {};
    if (d == 1) return x;
    return fmt::format("{} * {}", x, cdim(d));
  }
  static void plus(std::string& s, const std::string& term) {
    if (!term.empty()) s += (s.empty() ? "" : " + ") + term;
  }

  std::string v(int i) const { return "v" + std::to_string(i); }

  // The element index of access a at the current loop point.
  // One outer and one inner loop that every access walks contiguously (outer stride = inner stride ·
  // inner extent), one phase, no row values but constants: a conv or matmul epilogue over channels-last
  // rows (outer [12544] inner [32] for efficientnet's first depthwise convolution). Emitted as one flat
  // vector loop over the call's [lo, hi) rows, not a loop of 32-element loops (half the loop overhead
  // and remainder code per row).
  bool flat_form() const {
    if (k.splits_inner() || k.outer.size() != 1 || k.inner.size() != 1 || k.phases != 1) return false;
    for (const KInstr& in : k.body)
      if (in.row && !in.is(KInstrKind::constant)) return false;
    for (const KAccess& a : k.accesses)
      if (a.strides.size() != 2 || a.strides[0] != a.strides[1] * k.inner[0]) return false;
    return true;
  }

  // One outer dim, one phase whose loop body reads and writes only through accesses that are
  // contiguous across the outer points (outer stride 1), and no row instruction before the loop but
  // constants: a reduction over the spatial dims of a channels-last value (a global average pool:
  // outer [C] inner [H·W] with stride C). Emitted with the loops interchanged: a block of outer points
  // side by side, each step of the inner loops one vector pass across the block, one accumulator per
  // point in an array (row by row, those reads were a gather per element). Each point still reduces its
  // elements in inner-loop order, alone, so results do not depend on the thread count.
  static constexpr int64_t kColumnBlock = 256;
  bool column_form() const {
    if (k.splits_inner() || flat || k.outer.size() != 1 || k.phases != 1 || k.inner.empty()) return false;
    bool reduces = false, strided = false;
    for (const KInstr& in : k.body) {
      if (in.row) {
        if (in.phase == 0 && !in.is(KInstrKind::constant)) return false;
        continue;
      }
      reduces = reduces || in.is(CoreOp::reduce);
      if (in.access < 0) continue;
      const KAccess& a = k.accesses[static_cast<size_t>(in.access)];
      if (a.strides[0] != 1) return false;
      strided = strided || a.strides.back() != 1;
    }
    return reduces && strided;
  }

  std::string index(int a) const {
    const KAccess& acc = k.accesses[static_cast<size_t>(a)];
    std::string s;
    if (column) {
      if (!(acc.offset == 0)) s = cdim(acc.offset);
      plus(s, scaled("o0", acc.strides[0]));
      if (s.empty()) s = "0";
      for (size_t d = 0; d < k.inner.size(); ++d) plus(s, scaled(fmt::format("i{}", d), acc.strides[1 + d]));
      return s;
    }
    if (k.splits_inner() || flat) {
      if (!(acc.offset == 0)) s = cdim(acc.offset);
      plus(s, scaled("i0", acc.strides[flat ? 1 : 0]));
      return s.empty() ? "0" : s;
    }
    s = "b" + std::to_string(a);
    for (size_t d = 0; d < k.inner.size(); ++d) plus(s, scaled(fmt::format("i{}", d), acc.strides[k.outer.size() + d]));
    return s;
  }

  std::string load(const KInstr& in) const {
    const std::string e = fmt::format("a{}[{}]", k.accesses[static_cast<size_t>(in.access)].arg, index(in.access));
    return in.dtype == DType::boolean ? "(" + e + " != 0)" : e;
  }

  std::string expr(const KInstr& in) const {
    if (in.is(KInstrKind::load)) return load(in);
    if (in.is(KInstrKind::constant)) return literal(in.dtype, in.value);
    std::vector<std::string> ops;
    for (int j : in.args) ops.push_back(v(j));
    const DType from = in.args.empty() ? in.dtype : k.body[static_cast<size_t>(in.args[0])].dtype;
    return c_scalar_expr(in, from, ops, CDialect::cpp);
  }

  // Statement(s) for instruction i inside a loop or at row level.
  void emit(int indent, int i) {
    const KInstr& in = k.body[static_cast<size_t>(i)];
    if (in.is(KInstrKind::store)) {
      const KAccess& acc = k.accesses[static_cast<size_t>(in.access)];
      const std::string x = v(in.args[0]);
      const std::string stored = in.dtype == DType::boolean ? "(uint8_t)" + x
                                 : in.attr == "ftz"         ? fmt::format("tsl_ftz{}({})", in.dtype == DType::f64 ? "_f64" : "", x)
                                                            : x;
      line(indent, fmt::format("a{}[{}] = {};", acc.arg, index(in.access), stored));
      return;
    }
    if (in.is(CoreOp::reduce) && column) {  // accumulators per point of the block (column_loop)
      const std::string x = v(in.args[0]), acc = v(i) + "_acc[j]";
      if (in.attr == "sum") line(indent, fmt::format("{} += {};", acc, x));
      else if (in.attr == "prod") line(indent, fmt::format("{} *= {};", acc, x));
      else {
        line(indent, fmt::format("{0} = {1} {2} {0} ? {1} : {0};", acc, x, reduction_combiner(in.attr) == CoreOp::max ? ">" : "<"));
        line(indent, fmt::format("{}_nan[j] |= {} != {};", v(i), x, x));
      }
      return;
    }
    if (in.is(CoreOp::reduce)) {
      for (const std::string& st : c_reduce_step(in.attr, v(i), v(in.args[0]))) line(indent, st);
      return;
    }
    line(indent, fmt::format("const {} {} = {};", ctype(in.dtype), v(i), expr(in)));
  }

  std::string reduction_clause(const std::vector<int>& reduces) const {
    std::string s;
    for (int r : reduces) {
      const KInstr& in = k.body[static_cast<size_t>(r)];
      const std::string op = in.attr == "sum" ? "+" : in.attr == "prod" ? "*" : in.attr;
      s += fmt::format(" reduction({}:{})", op, v(r));
      if (is_min_max_reduction(in.attr)) s += fmt::format(" reduction(|:{}_nan)", v(r));
    }
    return s;
  }

  void phase_loop(int indent, int p) {
    std::vector<int> reduces, body;
    for (size_t i = 0; i < k.body.size(); ++i) {
      const KInstr& in = k.body[i];
      if (in.row || in.phase != p) continue;
      body.push_back(static_cast<int>(i));
      if (in.is(CoreOp::reduce)) reduces.push_back(static_cast<int>(i));
    }
    if (body.empty()) return;
    line(indent, fmt::format("// phase {}", p));
    for (int r : reduces) {
      const KInstr& in = k.body[static_cast<size_t>(r)];
      line(indent, fmt::format("{} {} = {};", ctype(in.dtype), v(r), literal(in.dtype, identity(in))));
      if (is_min_max_reduction(in.attr)) line(indent, fmt::format("int {}_nan = 0;", v(r)));
    }
    const int n = static_cast<int>(k.inner.size());
    for (int d = 0; d < n; ++d) {
      if (d == n - 1) line(indent + d, "#pragma omp simd" + reduction_clause(reduces));
      line(indent + d, fmt::format("for (long i{0} = 0; i{0} < {1}; ++i{0}) {{", d, cdim(k.inner[static_cast<size_t>(d)])));
    }
    for (int i : body) emit(indent + n, i);
    for (int d = n; d-- > 0;) line(indent + d, "}");
    for (int r : reduces) {
      const KInstr& in = k.body[static_cast<size_t>(r)];
      if (is_min_max_reduction(in.attr))
        line(indent, fmt::format("{0} = {0}_nan ? {1} : {0};", v(r), literal(in.dtype, NAN)));
    }
  }

  // The reduce kind's identity, from its combiner's row of the core-op table (the kernel verifier
  // has rejected unknown kinds).
  double identity(const KInstr& in) const {
    const auto combiner = reduction_combiner(in.attr);
    if (!combiner) fail("reduce kind '{}'", in.attr);
    return core_op_info(*combiner).identity;
  }

  // A column sum or product of f32 accumulates in f64: each point adds its elements one by one (the
  // row form's vector reduction keeps 16 partial sums), and the pass is bound by memory, not by the adds.
  std::string acc_type(const KInstr& in) const {
    return in.dtype == DType::f32 && (in.attr == "sum" || in.attr == "prod") ? "double" : ctype(in.dtype);
  }

  // column_form(): the outer points [lo, hi) in blocks of kColumnBlock.
  void column_loop() {
    std::vector<int> reduces, body;
    for (size_t i = 0; i < k.body.size(); ++i) {
      if (k.body[i].row) continue;
      body.push_back(static_cast<int>(i));
      if (k.body[i].is(CoreOp::reduce)) reduces.push_back(static_cast<int>(i));
    }
    row_instrs(1, 0);  // constants
    line(1, fmt::format("for (long ob = lo; ob < hi; ob += {}) {{", kColumnBlock));
    line(2, fmt::format("const long ne = hi - ob < {0} ? hi - ob : {0};", kColumnBlock));
    for (int r : reduces) {
      const KInstr& in = k.body[static_cast<size_t>(r)];
      line(2, fmt::format("{} {}_acc[{}];", acc_type(in), v(r), kColumnBlock));
      line(2, fmt::format("for (long j = 0; j < ne; ++j) {}_acc[j] = {};", v(r),
                          literal(acc_type(in) == "double" ? DType::f64 : in.dtype, identity(in))));
      if (is_min_max_reduction(in.attr)) line(2, fmt::format("int {0}_nan[{1}] = {{0}};", v(r), kColumnBlock));
    }
    const int n = static_cast<int>(k.inner.size());
    for (int d = 0; d < n; ++d)
      line(2 + d, fmt::format("for (long i{0} = 0; i{0} < {1}; ++i{0}) {{", d, cdim(k.inner[static_cast<size_t>(d)])));
    line(2 + n, "#pragma omp simd");
    line(2 + n, "for (long j = 0; j < ne; ++j) {");
    line(3 + n, "const long o0 = ob + j;");
    for (int i : body) emit(3 + n, i);
    line(2 + n, "}");
    for (int d = n; d-- > 0;) line(2 + d, "}");
    line(2, "for (long j = 0; j < ne; ++j) {");
    line(3, "const long o0 = ob + j;");
    for (int r : reduces) {
      const KInstr& in = k.body[static_cast<size_t>(r)];
      if (is_min_max_reduction(in.attr))
        line(3, fmt::format("const {0} {1} = {1}_nan[j] ? {2} : {1}_acc[j];", ctype(in.dtype), v(r), literal(in.dtype, NAN)));
      else
        line(3, fmt::format("const {0} {1} = ({0}){1}_acc[j];", ctype(in.dtype), v(r)));
    }
    row_instrs(3, 1);
    line(2, "}");
    line(1, "}");
  }

  void row_instrs(int indent, int p) {
    for (size_t i = 0; i < k.body.size(); ++i)
      if (k.body[i].row && k.body[i].phase == p) emit(indent, static_cast<int>(i));
  }

  // Where the S<i> locals go (after the signature): the symbols the body printed, S<i> = sz[i] (i:
  // the symbol's position in the module's sorted list); `(void)sz;` when it printed none.
  size_t symbols_at = 0;
  std::string symbol_locals() const {
    if (used_symbols.empty()) return "  (void)sz;\n";
    std::string d;
    for (size_t i = 0; i < symbols.size(); ++i)
      if (used_symbols.count(symbols[i])) d += fmt::format("  const long S{0} = sz[{0}];  // {1}\n", i, cpp_comment_text(symbols[i]));
    return d;
  }

  // Names come from the model (or from a cached kernel-module text): each goes through
  // cpp_comment_text, so none can end the comment, splice a line or leave plain ASCII; so do sizes,
  // which name size symbols.
  std::string header_comment() const {
    std::string s = fmt::format("// kernel {}: {}, outer {} inner {}, {} phase{}\n", cpp_comment_text(k.name), kernel_kind_name(k.kind),
                                cpp_comment_text(fmt::format("[{}]", fmt::join(k.outer, ", "))),
                                cpp_comment_text(fmt::format("[{}]", fmt::join(k.inner, ", "))),
                                k.phases, k.phases == 1 ? "" : "s");
    s += kernel_provenance_comment(k);
    if (k.kind == KernelKind::matmul)
      s += fmt::format("// the runtime first computes a{} = a{} . a{} ({} x [{} x {}] . [{} x {}]) through oneDNN; this is the epilogue\n",
                       k.mm.c, k.mm.a, k.mm.b, k.mm.batch, k.mm.m, k.mm.k, k.mm.k, k.mm.n);
    if (k.kind == KernelKind::conv)
      s += fmt::format("// the runtime first computes a{} = conv(a{}, a{}) through oneDNN; this is the epilogue\n", k.conv.y,
                       k.conv.x, k.conv.w);
    return s;
  }

  std::string generate() {
    body();
    out.insert(symbols_at, symbol_locals());
    return out;
  }

  void body() {
    out = header_comment();
    line(0, fmt::format("extern \"C\" void {}(void* const* args, const long* sz, long lo, long hi) {{", kernel_symbol(kernel_index)));
    symbols_at = out.size();
    // which args are touched
    std::set<int> loaded, stored;
    for (const KInstr& in : k.body) {
      if (in.is(KInstrKind::load)) loaded.insert(k.accesses[static_cast<size_t>(in.access)].arg);
      if (in.is(KInstrKind::store)) stored.insert(k.accesses[static_cast<size_t>(in.access)].arg);
    }
    for (size_t i = 0; i < k.args.size(); ++i) {
      const int a = static_cast<int>(i);
      if (!loaded.count(a) && !stored.count(a)) continue;
      const std::string t = storage_type(k.args[i].type.dtype);
      if (stored.count(a))
        line(1, fmt::format("{0}* a{1} = ({0}*)args[{1}];", t, a));
      else
        line(1, fmt::format("const {0}* __restrict a{1} = (const {0}*)args[{1}];", t, a));
    }
    if (k.splits_inner()) {
      line(1, "#pragma omp simd");
      line(1, "for (long i0 = lo; i0 < hi; ++i0) {");
      for (size_t i = 0; i < k.body.size(); ++i) emit(2, static_cast<int>(i));
      line(1, "}");
      line(0, "}");
      return;
    }
    if (flat) {
      row_instrs(1, 0);
      line(1, "// phase 0: rows [lo, hi) as one contiguous run");
      line(1, "#pragma omp simd");
      line(1, fmt::format("for (long i0 = lo * {0}; i0 < hi * {0}; ++i0) {{", cdim(k.inner[0])));
      for (size_t i = 0; i < k.body.size(); ++i)
        if (!k.body[i].row) emit(2, static_cast<int>(i));
      line(1, "}");
      line(0, "}");
      return;
    }
    if (column) {
      line(1, "// the outer points side by side (column reduction)");
      column_loop();
      line(0, "}");
      return;
    }
    line(1, "for (long o = lo; o < hi; ++o) {");
    // outer indices
    const size_t no = k.outer.size();
    if (no == 0) {
      line(2, "(void)o;");
    } else if (no == 1) {
      line(2, "const long o0 = o;");
    } else {
      line(2, "long r = o;");
      for (size_t d = no; d-- > 0;) {
        if (d == 0)
          line(2, "const long o0 = r;");
        else
          line(2, fmt::format("const long o{0} = r % {1}; r /= {1};", d, cdim(k.outer[d])));
      }
    }
    // row base of every access
    for (size_t a = 0; a < k.accesses.size(); ++a) {
      const KAccess& acc = k.accesses[a];
      std::string s = acc.offset == 0 ? std::string() : cdim(acc.offset);
      for (size_t d = 0; d < no; ++d) plus(s, scaled(fmt::format("o{}", d), acc.strides[d]));
      if (s.empty()) s = "0";
      bool used = false;
      for (const KInstr& in : k.body) used = used || in.access == static_cast<int>(a);
      if (used) line(2, fmt::format("const long b{} = {};", a, s));
    }
    for (size_t d = 0; d < no; ++d) line(2, fmt::format("(void)o{};", d));
    for (int p = 0; p < k.phases; ++p) {
      row_instrs(2, p);
      phase_loop(2, p);
    }
    row_instrs(2, k.phases);
    line(1, "}");
    line(0, "}");
  }
};

}  // namespace

// Derived from the index alone: a kernel's name may come from an untrusted cached text.
std::string kernel_symbol(size_t index) { return fmt::format("tsl_k{}", index); }

std::vector<std::string> module_symbols(const KernelModule& m) { return m.graph ? graph_symbols(*m.graph) : std::vector<std::string>{}; }

bool has_generated_function(const Kernel& k, bool epilogue_in_library) { return !k.body.empty() && !epilogue_in_library; }

std::string generate_kernel(const Kernel& k, size_t index, const std::vector<std::string>& symbols) {
  try {
    return Emitter(k, index, symbols).generate();
  } catch (const Error& e) {
    throw e.with_context(Location{.node = k.name, .op = "kernel", .pass = "codegen-cpu"});
  }
}

std::string generate_cpp(const KernelModule& m, const std::string& model_name, const std::vector<bool>& in_library) {
  std::string s = fmt::format("// Generated by tessel from {} (kernel level -> C++ for the host CPU).\n",
                              cpp_comment_text(model_name));
  s += "// One function per kernel; comments name the source nodes each kernel fuses.\n";
  const std::vector<std::string> symbols = module_symbols(m);
  if (!symbols.empty()) {
    s += "// Sizes read at run time (docs/dynamic-shapes.md): sz[i] is the value of symbol i:";
    for (size_t i = 0; i < symbols.size(); ++i) s += fmt::format("{} {}", i ? "," : "", cpp_comment_text(symbols[i]));
    s += ".\n";
  }
  s += "#include \"tessel_rt.h\"\n";
  for (size_t i = 0; i < m.kernels.size(); ++i)
    if (has_generated_function(m.kernels[i], i < in_library.size() && in_library[i]))
      s += "\n" + generate_kernel(m.kernels[i], i, symbols);
  return s;
}

}  // namespace tessel::cpu
