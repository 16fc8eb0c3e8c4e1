// The kernel level's data structure: the kernel op, text form (print and parse) and verifier.
#include "tessel/kernel/kernel.h"

#include <cerrno>
#include <cstdlib>
#include <set>
#include <sstream>

#include "tessel/ir/core_ops.h"
#include "tessel/ir/op_registry.h"
#include "tessel/ir/printer.h"
#include "tessel/support/error.h"
#include "tessel/support/escape.h"

namespace tessel {

std::string_view kernel_kind_name(KernelKind k) {
  switch (k) {
    case KernelKind::loop: return "loop";
    case KernelKind::matmul: return "matmul";
    case KernelKind::conv: return "conv";
  }
  return "?";
}

int Kernel::num_inputs() const {
  int n = 0;
  for (const KArg& a : args) n += a.role == KArg::Role::in;
  return n;
}
int Kernel::num_outputs() const {
  int n = 0;
  for (const KArg& a : args) n += a.role == KArg::Role::out;
  return n;
}
Dim Kernel::outer_count() const { return dims_numel(outer); }
Dim Kernel::inner_count() const { return dims_numel(inner); }
namespace {

// Calls f on every size of kernel k that may be symbolic (loop dims, traffic, access maps, the library
// call's sizes and strides); a kernel arg's type is f's too, through `on_type`.
template <typename K, typename F, typename T>
void each_size(K& k, F f, T on_type) {
  for (auto& d : k.outer) f(d);
  for (auto& d : k.inner) f(d);
  f(k.bytes_unfused);
  f(k.bytes_fused);
  for (auto& a : k.accesses) {
    f(a.offset);
    for (auto& d : a.strides) f(d);
  }
  for (auto& a : k.args) on_type(a.type);
  auto& m = k.mm;
  for (auto* d : {&m.batch, &m.m, &m.n, &m.k, &m.a_offset, &m.a_batch, &m.a_m, &m.a_k, &m.b_offset, &m.b_batch, &m.b_k, &m.b_n,
                  &m.c_batch, &m.c_m, &m.c_n})
    f(*d);
  f(k.conv.n);
}

}  // namespace

bool Kernel::symbolic() const {
  bool any = false;
  each_size(*this, [&](const Dim& d) { any = any || d.is_symbolic(); },
            [&](const TensorType& t) { any = any || t.symbolic(); });
  return any;
}
std::vector<std::string> Kernel::symbols() const {
  std::set<std::string> names;
  auto add = [&](const Dim& d) {
    for (const std::string& s : d.symbols()) names.insert(s);
  };
  each_size(*this, add, [&](const TensorType& t) {
    for (const Dim& d : t.sym) add(d);
  });
  return {names.begin(), names.end()};
}
bool Kernel::splits_inner() const {
  if (!outer.empty() || phases != 1 || inner.size() != 1) return false;
  for (const KInstr& in : body)
    if ((in.row && !in.is(KInstrKind::constant)) || in.is(CoreOp::reduce)) return false;
  return true;
}
std::string_view KInstr::name() const {
  switch (kind) {
    case KInstrKind::load: return "load";
    case KInstrKind::store: return "store";
    case KInstrKind::constant: return "const";
    case KInstrKind::core: break;
  }
  return core_op_name(core);
}

std::optional<KInstr> kinstr_named(std::string_view name) {
  KInstr in;
  if (name == "load") in.kind = KInstrKind::load;
  else if (name == "store") in.kind = KInstrKind::store;
  else if (name == "const") in.kind = KInstrKind::constant;
  else if (const auto op = core_op_named(name)) in.core = *op;
  else return std::nullopt;
  return in;
}

Dim Kernel::parallel_extent() const { return splits_inner() ? inner[0] : outer_count(); }

void register_kernel_ops(OpRegistry& r) {
  OpDef d;
  d.name = "kernel";
  d.domain = "tessel.kernel";
  d.min_inputs = 0;
  d.max_inputs = -1;
  d.min_outputs = 0;
  d.max_outputs = -1;
  d.attrs = {{"kernel", AttrKind::i, true}};
  d.infer = [](InferCtx& ctx) {
    // The kernel's body defines its results; the node records their types.
    for (int i = 0; i < ctx.num_outputs(); ++i) ctx.set_out(i, ctx.node().outputs[static_cast<size_t>(i)]->type);
  };
  d.kernel = [](KernelCtx& c) {
    fail("kernel node {} has no reference kernel: it runs in the compiled backend only", c.node().attr_i("kernel"));
  };
  r.add(std::move(d));
}

const OpDef& kernel_op() {
  static const OpDef* op = OpRegistry::get().find("kernel");
  return *op;
}

bool is_kernel_node(const Node& n) { return n.op->domain == "tessel.kernel"; }

bool can_run_channels_last(const Node& n) {
  if (!n.op->core || n.outputs.size() != 1 || !n.outputs[0] || n.inputs.empty()) return false;
  auto f32_4d = [](const Value* v) {
    return v && v->type.dtype == DType::f32 && v->type.shape.size() == 4 && shape_known(v->type.shape);
  };
  if (!f32_4d(n.outputs[0])) return false;
  for (const Value* v : n.inputs)
    if (!f32_4d(v)) return false;
  if (is_core_op(n, CoreOp::concatenate)) return n.attr_i("axis") == 1;
  if (!is_core_op(n, CoreOp::reduce_window) || n.inputs.size() != 1) return false;
  // a window over H and W only: the leading dims are plane indices
  const std::vector<int64_t> window = n.attr_ints("window");
  const std::vector<int64_t> strides = n.attr_ints("strides", std::vector<int64_t>(4, 1));
  const std::vector<int64_t> dil = n.attr_ints("dilations", std::vector<int64_t>(4, 1));
  const std::vector<int64_t> pad = n.attr_ints("padding", std::vector<int64_t>(8, 0));
  if (window.size() != 4 || strides.size() != 4 || dil.size() != 4 || pad.size() != 8) return false;
  for (size_t d = 0; d < 2; ++d)
    if (window[d] != 1 || strides[d] != 1 || dil[d] != 1 || pad[2 * d] != 0 || pad[2 * d + 1] != 0) return false;
  return true;
}

bool runs_channels_last(const Node& n) {
  if (!n.has_attr("layout")) return false;
  const Attr& a = n.attrs.at("layout");
  return std::holds_alternative<std::string>(a) && std::get<std::string>(a) == "nhwc";
}

// ---- printing ------------------------------------------------------------------------------------

namespace {

std::string ints(const Dims& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + v[i].str();
  return s + "]";
}

std::string role_name(KArg::Role r) {
  switch (r) {
    case KArg::Role::in: return "in";
    case KArg::Role::out: return "out";
    case KArg::Role::scratch: return "scratch";
  }
  return "?";
}

}  // namespace

std::string print_kernel(const Kernel& k) {
  std::string s = fmt::format("kernel {} {} outer {} inner {} phases {} {{\n", k.name, kernel_kind_name(k.kind), ints(k.outer),
                              ints(k.inner), k.phases);
  s += "  from";
  for (size_t i = 0; i < k.sources.size(); ++i) s += (i ? ", " : " ") + quote_string(k.sources[i]);
  s += "\n";
  s += fmt::format("  fused {} nodes, traffic {} -> {} bytes\n", k.fused_nodes, k.bytes_unfused, k.bytes_fused);
  for (size_t i = 0; i < k.args.size(); ++i)
    s += fmt::format("  arg {} {} {}: {}\n", i, role_name(k.args[i].role), format_value_name(k.args[i].name),
                     k.args[i].type.str());
  if (k.kind == KernelKind::matmul) {
    const MatmulSpec& m = k.mm;
    s += fmt::format("  matmul a {} b {} c {} batch {} m {} n {} k {} a_map {} {} b_map {} {}", m.a, m.b, m.c, m.batch, m.m,
                     m.n, m.k, m.a_offset, ints({m.a_batch, m.a_m, m.a_k}), m.b_offset, ints({m.b_batch, m.b_k, m.b_n}));
    if (m.c_batch || m.c_m || m.c_n) s += " c_map " + ints({m.c_batch, m.c_m, m.c_n});
    s += "\n";
  } else if (k.kind == KernelKind::conv) {
    const ConvSpec& c = k.conv;
    s += fmt::format("  conv x {} w {} y {} layout {} -> {} input {} output {} kernel {} stride {} pad {} dilation {} groups {}\n",
                     c.x, c.w, c.y, c.x_nhwc ? "nhwc" : "nchw", c.y_nhwc ? "nhwc" : "nchw", ints({c.n, c.c, c.h, c.wd}), ints({c.oc, c.oh, c.ow}), ints({c.kh, c.kw}),
                     ints({c.stride_h, c.stride_w}), ints({c.pad_top, c.pad_left, c.pad_bottom, c.pad_right}),
                     ints({c.dil_h, c.dil_w}), c.groups);
  }
  for (size_t i = 0; i < k.accesses.size(); ++i)
    s += fmt::format("  access #{} arg {} offset {} strides {}\n", i, k.accesses[i].arg, k.accesses[i].offset,
                     ints(k.accesses[i].strides));
  for (size_t i = 0; i < k.body.size(); ++i) {
    const KInstr& in = k.body[i];
    std::string args;
    for (size_t j = 0; j < in.args.size(); ++j) args += (j ? ", %" : "%") + std::to_string(in.args[j]);
    s += fmt::format("  %{} = {}{} {} ({})", i, in.name(), in.attr.empty() ? "" : "." + in.attr, dtype_name(in.dtype), args);
    if (in.access >= 0) s += fmt::format(" #{}", in.access);
    if (in.is(KInstrKind::constant)) s += fmt::format(" = {:.17g}", in.value);
    s += fmt::format(" {}@{}\n", in.row ? "row" : "", in.phase);
  }
  return s + "}\n";
}

namespace {

std::string print_module(const KernelModule& m, const PrintOptions& po) {
  std::string s = "# tessel kernel level\n" + print_graph(*m.graph, po);
  s += "# kernels\n";
  for (const Kernel& k : m.kernels) s += print_kernel(k);
  return s;
}

}  // namespace

std::string print_kernel_module(const KernelModule& m, bool elide_constants) {
  PrintOptions po;
  po.elide_constants = elide_constants;
  return print_module(m, po);
}

std::string print_kernel_module(const KernelModule& m, std::vector<const Tensor*>* external_blobs) {
  PrintOptions po;
  po.external_blobs = external_blobs;
  return print_module(m, po);
}

// ---- parsing -------------------------------------------------------------------------------------

namespace {

class KernelParser {
 public:
  KernelParser(const std::string& text, std::string file, int first_line)
      : text_(text), file_(std::move(file)), line_(first_line) {}

  std::vector<Kernel> parse_all() {
    std::vector<Kernel> ks;
    skip_space();
    while (pos_ < text_.size()) {
      ks.push_back(parse_kernel());
      skip_space();
    }
    return ks;
  }

 private:
  const std::string& text_;
  std::string file_;
  size_t pos_ = 0;
  int line_;

  [[noreturn]] void error(const std::string& msg) {
    const size_t nl = text_.rfind('\n', pos_ == 0 ? 0 : pos_ - 1);
    const size_t col = nl == std::string::npos || nl >= pos_ ? pos_ + 1 : pos_ - nl;
    throw Error(Location{.file = file_, .pass = "parse", .line = line_, .column = static_cast<int>(col)}, msg);
  }
  void skip_space() {
    while (pos_ < text_.size() && std::isspace(static_cast<unsigned char>(text_[pos_]))) {
      if (text_[pos_] == '\n') ++line_;
      ++pos_;
    }
  }
  // Spaces and tabs only (instructions end at the end of their line).
  void skip_blank() {
    while (pos_ < text_.size() && (text_[pos_] == ' ' || text_[pos_] == '\t')) ++pos_;
  }
  bool peek(char c) {
    skip_blank();
    return pos_ < text_.size() && text_[pos_] == c;
  }
  void expect(const std::string& tok) {
    skip_blank();
    if (text_.compare(pos_, tok.size(), tok) != 0)
      error(fmt::format("expected '{}' but found '{}'", tok, text_.substr(pos_, std::min<size_t>(20, text_.size() - pos_))));
    pos_ += tok.size();
  }
  bool accept(const std::string& tok) {
    skip_blank();
    if (text_.compare(pos_, tok.size(), tok) != 0) return false;
    pos_ += tok.size();
    return true;
  }
  std::string word() {
    skip_blank();
    size_t b = pos_;
    while (pos_ < text_.size() && (std::isalnum(static_cast<unsigned char>(text_[pos_])) || text_[pos_] == '_')) ++pos_;
    if (b == pos_) error("expected a name");
    return text_.substr(b, pos_ - b);
  }
  int64_t integer() {
    skip_blank();
    const char* b = text_.c_str() + pos_;
    char* e = nullptr;
    errno = 0;
    long long v = std::strtoll(b, &e, 10);
    if (e == b) error("expected an integer");
    if (errno == ERANGE) error(fmt::format("integer {} is out of range for int64", std::string_view(b, static_cast<size_t>(e - b))));
    pos_ += static_cast<size_t>(e - b);
    return v;
  }
  double number() {
    skip_blank();
    const char* b = text_.c_str() + pos_;
    char* e = nullptr;
    double v = std::strtod(b, &e);
    if (e == b) error("expected a number");
    pos_ += static_cast<size_t>(e - b);
    return v;
  }
  std::vector<int64_t> int_list() {
    expect("[");
    std::vector<int64_t> v;
    if (accept("]")) return v;
    do v.push_back(integer());
    while (accept(","));
    expect("]");
    return v;
  }
  // A size: an integer or a symbolic expression (sym.h's text form).
  Dim dim() {
    skip_blank();
    std::optional<Dim> d;
    try {
      d = parse_dim(text_, pos_);
    } catch (const Error& e) {
      error(e.reason());
    }
    if (!d) error("expected a size");
    return *d;
  }
  Dims dim_list() {
    expect("[");
    Dims v;
    if (accept("]")) return v;
    do v.push_back(dim());
    while (accept(","));
    expect("]");
    return v;
  }
  std::string quoted() {
    skip_blank();
    try {
      return unquote_string(text_, pos_);
    } catch (const Error& e) {
      error(e.reason());
    }
  }
  std::string value_name() {
    expect("%");
    if (peek('"')) return quoted();
    skip_blank();
    size_t b = pos_;
    while (pos_ < text_.size() && !std::isspace(static_cast<unsigned char>(text_[pos_])) && text_[pos_] != ':' &&
           text_[pos_] != ',' && text_[pos_] != ')')
      ++pos_;
    return text_.substr(b, pos_ - b);
  }
  DType dtype() {
    std::string w = word();
    auto t = dtype_from_name(w);
    if (!t) error(fmt::format("unknown dtype '{}'", w));
    return *t;
  }
  TensorType type() {
    const DType dt = dtype();
    Dims ds = dim_list();
    for (const Dim& d : ds)
      if (d.is_static() && d.constant_term() < 0) error("a size must not be negative");
    return TensorType::of(dt, ds);
  }
  void end_line() {
    skip_blank();
    if (pos_ < text_.size() && text_[pos_] != '\n') error("unexpected text at the end of the line");
    skip_space();
  }

  Kernel parse_kernel() {
    Kernel k;
    expect("kernel");
    k.name = word();
    // The text may come from the executable cache (untrusted): a kernel name is an identifier, and
    // generated code never uses it anyway (symbols come from the kernel's index).
    if (!is_plain_identifier(k.name)) error(fmt::format("kernel name '{}' is not an identifier", k.name));
    std::string kind = word();
    if (kind == "loop") k.kind = KernelKind::loop;
    else if (kind == "matmul") k.kind = KernelKind::matmul;
    else if (kind == "conv") k.kind = KernelKind::conv;
    else error(fmt::format("unknown kernel kind '{}'", kind));
    expect("outer");
    k.outer = dim_list();
    expect("inner");
    k.inner = dim_list();
    expect("phases");
    k.phases = static_cast<int>(integer());
    expect("{");
    end_line();
    expect("from");
    if (peek('"')) {
      do k.sources.push_back(quoted());
      while (accept(","));
    }
    end_line();
    expect("fused");
    k.fused_nodes = static_cast<int>(integer());
    expect("nodes, traffic");
    k.bytes_unfused = dim();
    expect("->");
    k.bytes_fused = dim();
    expect("bytes");
    end_line();
    while (accept("arg")) {
      if (integer() != static_cast<int64_t>(k.args.size())) error("args must be numbered in order");
      KArg a;
      std::string role = word();
      if (role == "in") a.role = KArg::Role::in;
      else if (role == "out") a.role = KArg::Role::out;
      else if (role == "scratch") a.role = KArg::Role::scratch;
      else error(fmt::format("unknown arg role '{}'", role));
      a.name = value_name();
      expect(":");
      a.type = type();
      k.args.push_back(a);
      end_line();
    }
    if (accept("matmul")) {
      MatmulSpec& m = k.mm;
      expect("a"); m.a = static_cast<int>(integer());
      expect("b"); m.b = static_cast<int>(integer());
      expect("c"); m.c = static_cast<int>(integer());
      expect("batch"); m.batch = dim();
      expect("m"); m.m = dim();
      expect("n"); m.n = dim();
      expect("k"); m.k = dim();
      expect("a_map"); m.a_offset = dim();
      auto as = dim_list();
      expect("b_map"); m.b_offset = dim();
      auto bs = dim_list();
      if (as.size() != 3 || bs.size() != 3) error("matmul maps take 3 strides");
      m.a_batch = as[0], m.a_m = as[1], m.a_k = as[2];
      m.b_batch = bs[0], m.b_k = bs[1], m.b_n = bs[2];
      if (accept("c_map")) {
        auto cs = dim_list();
        if (cs.size() != 3) error("matmul maps take 3 strides");
        m.c_batch = cs[0], m.c_m = cs[1], m.c_n = cs[2];
      }
      end_line();
    } else if (accept("conv")) {
      ConvSpec& c = k.conv;
      expect("x"); c.x = static_cast<int>(integer());
      expect("w"); c.w = static_cast<int>(integer());
      expect("y"); c.y = static_cast<int>(integer());
      expect("layout");
      auto layout = [&] {
        std::string l = word();
        if (l != "nchw" && l != "nhwc") error(fmt::format("unknown layout '{}'", l));
        return l == "nhwc";
      };
      c.x_nhwc = layout();
      expect("->");
      c.y_nhwc = layout();
      expect("input"); auto in = dim_list();
      expect("output"); auto out = int_list();
      expect("kernel"); auto ks = int_list();
      expect("stride"); auto st = int_list();
      expect("pad"); auto pd = int_list();
      expect("dilation"); auto dl = int_list();
      expect("groups"); c.groups = integer();
      if (in.size() != 4 || out.size() != 3 || ks.size() != 2 || st.size() != 2 || pd.size() != 4 || dl.size() != 2)
        error("conv: wrong number of values in a list");
      c.n = in[0], c.c = in[1], c.h = in[2], c.wd = in[3];  // c, h, w: static (a symbolic one is an error)
      c.oc = out[0], c.oh = out[1], c.ow = out[2];
      c.kh = ks[0], c.kw = ks[1];
      c.stride_h = st[0], c.stride_w = st[1];
      c.pad_top = pd[0], c.pad_left = pd[1], c.pad_bottom = pd[2], c.pad_right = pd[3];
      c.dil_h = dl[0], c.dil_w = dl[1];
      end_line();
    }
    while (accept("access")) {
      expect("#");
      if (integer() != static_cast<int64_t>(k.accesses.size())) error("accesses must be numbered in order");
      KAccess a;
      expect("arg");
      a.arg = static_cast<int>(integer());
      expect("offset");
      a.offset = dim();
      expect("strides");
      a.strides = dim_list();
      k.accesses.push_back(a);
      end_line();
    }
    while (accept("%")) {
      if (integer() != static_cast<int64_t>(k.body.size())) error("instructions must be numbered in order");
      expect("=");
      const std::string op = word();
      const std::optional<KInstr> named = kinstr_named(op);
      if (!named) error(fmt::format("'{}' is no instruction (load, store, const or a core primitive)", op));
      KInstr in = *named;
      if (accept(".")) in.attr = word();
      in.dtype = dtype();
      expect("(");
      if (!accept(")")) {
        do {
          expect("%");
          in.args.push_back(static_cast<int>(integer()));
        } while (accept(","));
        expect(")");
      }
      if (accept("#")) in.access = static_cast<int>(integer());
      if (accept("=")) in.value = number();
      if (accept("row")) in.row = true;
      expect("@");
      in.phase = static_cast<int>(integer());
      k.body.push_back(in);
      end_line();
    }
    expect("}");
    return k;
  }
};

}  // namespace

KernelModule parse_kernel_module(const std::string& text, const std::string& file) {
  return parse_kernel_module(text, file, BlobSource{});
}

KernelModule parse_kernel_module(const std::string& text, const std::string& file, const BlobSource& blobs) {
  const std::string marker = "# kernels\n";
  const size_t at = text.find(marker);
  if (at == std::string::npos)
    throw Error(Location{.file = file, .pass = "parse"}, "no '# kernels' section: not the kernel level's text form");
  KernelModule m;
  m.graph = parse_graph(text.substr(0, at), file, blobs);
  int line = 1;
  for (size_t i = 0; i < at + marker.size(); ++i) line += text[i] == '\n';
  const std::string rest = text.substr(at + marker.size());
  m.kernels = KernelParser(rest, file, line).parse_all();
  verify_kernel_module(m);
  return m;
}

// ---- verification --------------------------------------------------------------------------------

namespace {

bool is_float_t(DType t) { return t == DType::f32 || t == DType::f64; }

}  // namespace

void verify_kernel(const Kernel& k) {
  auto bad = [&](const std::string& msg) { throw Error(Location{.node = k.name, .op = "kernel", .pass = "verify"}, msg); };
  if (k.phases < 1) bad("a kernel has at least one phase");
  // Symbolic sizes are checked for every value of the symbols (each >= 1) by the provers; what they
  // cannot show is an error here, and instantiate_kernel checks the numbers of each binding again.
  for (const Dims* ds : {&k.outer, &k.inner})
    for (const Dim& d : *ds)
      if (!provably_positive(d)) bad(fmt::format("loop dims must be positive (got {})", d.str()));
  const int rank = k.loop_rank();
  auto check_arg = [&](int a, const char* what) {
    if (a < 0 || a >= static_cast<int>(k.args.size())) bad(fmt::format("{} refers to arg {} of {}", what, a, k.args.size()));
  };
  // every access stays inside its buffer
  for (size_t i = 0; i < k.accesses.size(); ++i) {
    const KAccess& a = k.accesses[i];
    check_arg(a.arg, "an access");
    if (static_cast<int>(a.strides.size()) != rank)
      bad(fmt::format("access #{} has {} strides for a loop space of rank {}", i, a.strides.size(), rank));
    Dim lo = a.offset, hi = a.offset;
    for (int d = 0; d < rank; ++d) {
      const Dim& ext = d < static_cast<int>(k.outer.size()) ? k.outer[static_cast<size_t>(d)]
                                                              : k.inner[static_cast<size_t>(d) - k.outer.size()];
      const Dim span = a.strides[static_cast<size_t>(d)] * (ext - 1);
      if (provably_nonneg(span)) hi += span;
      else if (provably_nonneg(-span)) lo += span;
      else bad(fmt::format("access #{}: the sign of stride {} is not known", i, a.strides[static_cast<size_t>(d)].str()));
    }
    const KArg& arg = k.args[static_cast<size_t>(a.arg)];
    if (!arg.type.dims_defined()) bad(fmt::format("arg {} has an unknown dim", a.arg));
    const Dim n = dims_numel(arg.type.dims());
    // hi < max(n, 1): an empty buffer is only touched by an empty loop, which the dims above exclude
    const Dim room = n.is_static() && n.constant_term() < 1 ? Dim(1) : n;
    if (!provably_nonneg(lo) || !provably_positive(room - hi))
      bad(fmt::format("access #{} reaches elements [{}, {}] of arg {} which has {}", i, lo, hi, a.arg, n));
  }
  for (size_t i = 0; i < k.body.size(); ++i) {
    const KInstr& in = k.body[i];
    auto where = [&](const std::string& msg) { bad(fmt::format("%{} ({}): {}", i, in.name(), msg)); };
    for (int a : in.args) {
      if (a < 0 || a >= static_cast<int>(i)) where("uses a value that is not defined before it");
      const KInstr& src = k.body[static_cast<size_t>(a)];
      const bool src_row = src.row || src.is(CoreOp::reduce);
      const int avail = src.is(CoreOp::reduce) ? src.phase + 1 : src.phase;
      if (src_row && avail > in.phase) where(fmt::format("uses row value %{} before it is available", a));
      if (!src_row && !in.row && src.phase != in.phase) where(fmt::format("uses %{} of another phase", a));
      if (!src_row && in.row && !in.is(CoreOp::reduce)) where(fmt::format("a row instruction uses element value %{}", a));
    }
    if (in.phase < 0 || in.phase > k.phases || (!in.row && in.phase >= k.phases)) where("phase out of range");
    if (in.is(KInstrKind::load) || in.is(KInstrKind::store)) {
      if (in.access < 0 || in.access >= static_cast<int>(k.accesses.size())) where("needs an access");
      const KArg& a = k.args[static_cast<size_t>(k.accesses[static_cast<size_t>(in.access)].arg)];
      if (a.type.dtype != in.dtype) where(fmt::format("dtype {} but its buffer holds {}", dtype_name(in.dtype), dtype_name(a.type.dtype)));
      if (in.is(KInstrKind::store) && a.role == KArg::Role::in) where("stores into an input");
      if (in.is(KInstrKind::store) && in.args.size() != 1) where("store takes one value");
      if (in.is(KInstrKind::store) && !in.attr.empty() && (in.attr != "ftz" || !is_float_t(in.dtype)))
        where(fmt::format("a store's attribute is ftz on a float value, not '{}'", in.attr));
      if (in.is(KInstrKind::load) && !in.attr.empty()) where("a load takes no attribute");
    } else if (in.is(CoreOp::reduce)) {
      if (in.row) where("a reduce accumulates inside a loop (not a row instruction)");
      if (in.args.size() != 1 || !is_float_t(in.dtype)) where("reduce takes one float value");
      // The kind is spelled into generated code (an OpenMP reduction clause): only the kinds of the
      // core-op table (sum prod max min).
      if (!reduction_combiner(in.attr))
        where(fmt::format("unknown reduction '{}'", in.attr));
    } else if (in.is(CoreOp::compare)) {
      if (in.dtype != DType::boolean || in.args.size() != 2) where("compare takes two values and gives bool");
    } else if (in.is(CoreOp::select)) {
      if (in.args.size() != 3 || k.body[static_cast<size_t>(in.args[0])].dtype != DType::boolean) where("select takes a bool and two values");
    } else if (!in.is(KInstrKind::constant)) {
      // Any other instruction is an elementwise primitive with the table's operand count.
      const CoreOpInfo& prim = core_op_info(in.core);
      if (!prim.elementwise()) {
        where("not an elementwise core primitive");
      } else if (const int arity = prim.arity; static_cast<int>(in.args.size()) != arity) {
        where(fmt::format("takes {} operands, not {}", arity, in.args.size()));
      } else if (prim.kind != CoreKind::convert) {
        for (int a : in.args)
          if (k.body[static_cast<size_t>(a)].dtype != in.dtype) where("operand dtype differs from the result dtype");
      }
    }
  }
  if (k.kind == KernelKind::matmul) {
    check_arg(k.mm.a, "matmul a");
    check_arg(k.mm.b, "matmul b");
    check_arg(k.mm.c, "matmul c");
    if (dims_numel(k.args[static_cast<size_t>(k.mm.c)].type.dims()) != k.mm.batch * k.mm.m * k.mm.n)
      bad("matmul result buffer does not hold batch x m x n elements");
  } else if (k.kind == KernelKind::conv) {
    check_arg(k.conv.x, "conv x");
    check_arg(k.conv.w, "conv w");
    check_arg(k.conv.y, "conv y");
  }
}

Kernel instantiate_kernel(const Kernel& k, const Bindings& b, bool verify) {
  Kernel c = k;
  each_size(c, [&](Dim& d) { d = d.substitute(b); },
            [&](TensorType& t) { t = TensorType::of(t.dtype, substitute_dims(t.dims(), b)); });
  if (c.symbolic()) throw Error(Location{.node = k.name, .op = "kernel", .pass = "instantiate"}, "a size symbol has no value");
  if (verify) verify_kernel(c);
  return c;
}

std::vector<Kernel> instantiate_kernels(const std::vector<Kernel>& ks, const Bindings& b) {
  std::vector<Kernel> out;
  out.reserve(ks.size());
  for (const Kernel& k : ks) out.push_back(instantiate_kernel(k, b));
  return out;
}

void verify_kernel_module(const KernelModule& m) {
  if (!m.graph) fail("kernel module without a graph");
  const ScopedSymbolFacts facts(&m.graph->symbols);  // accesses checked within the graph's ranges
  std::set<int64_t> used;
  for (const auto& n : m.graph->nodes()) {
    if (!is_kernel_node(*n)) continue;
    const int64_t id = n->attr_i("kernel");
    const Location loc{.node = n->name, .op = "kernel", .pass = "verify"};
    if (id < 0 || id >= static_cast<int64_t>(m.kernels.size()))
      throw Error(loc, fmt::format("kernel index {} out of range ({} kernels)", id, m.kernels.size()));
    if (!used.insert(id).second) throw Error(loc, fmt::format("kernel {} is launched twice", id));
    const Kernel& k = m.kernels[static_cast<size_t>(id)];
    size_t in = 0, out = 0;
    for (const KArg& a : k.args) {
      const Value* v = nullptr;
      if (a.role == KArg::Role::in) v = in < n->inputs.size() ? n->inputs[in++] : nullptr;
      if (a.role == KArg::Role::out) v = out < n->outputs.size() ? n->outputs[out++] : nullptr;
      if (a.role == KArg::Role::scratch) continue;
      if (!v) throw Error(loc, fmt::format("{} has more args than its node has values", k.name));
      if (v->name != a.name || !(v->type == a.type))
        throw Error(loc, fmt::format("{} arg %{}: {} does not match node value %{}: {}", k.name, a.name, a.type.str(),
                                     v->name, v->type.str()));
    }
    if (in != n->inputs.size() || out != n->outputs.size())
      throw Error(loc, fmt::format("{} has fewer args than its node has values", k.name));
    verify_kernel(k);
  }
}

}  // namespace tessel
