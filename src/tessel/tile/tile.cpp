// The tile level's text form and verifier (see tile.h).
#include "tessel/tile/tile.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <map>

#include "tessel/ir/printer.h"
#include "tessel/support/error.h"
#include "tessel/support/escape.h"

namespace tessel::tile {

int64_t Global::bytes() const {
  if (!shape_known(padded)) return 0;
  return shape_numel(padded) * static_cast<int64_t>(dtype_size(dtype));
}

int64_t Global::logical_bytes() const {
  if (!shape_known(shape)) return 0;
  return shape_numel(shape) * static_cast<int64_t>(dtype_size(dtype));
}

int TileProgram::find_global(const std::string& n) const {
  for (size_t i = 0; i < globals.size(); ++i)
    if (globals[i].name == n) return static_cast<int>(i);
  return -1;
}

const hw::HwSpec& TileProgram::hw_spec() const {
  if (!hw)
    throw Error(Location{.node = name, .pass = "tile"},
                fmt::format("tile program for target '{}' carries no hardware description (parse it with one)", target));
  return *hw;
}

// ---- layout --------------------------------------------------------------------------------------

Shape padded_shape(const Shape& shape, DType t, const hw::HwSpec& hw, const std::vector<int64_t>& perm) {
  Shape s = shape;
  if (s.empty()) return s;
  for (int64_t d : s)
    if (d < 0) return s;  // dynamic: not planned
  const size_t r = s.size();
  const bool tiled = hw.layout.kind == hw::LayoutKind::tiled;
  auto round_up = [](int64_t a, int64_t b) { return (a + b - 1) / b * b; };
  auto phys = [&](size_t i) { return perm.size() == r ? static_cast<size_t>(perm[i]) : i; };
  // the innermost physical dim to whole sticks (or tile lanes), for tiled layouts the one before it to whole tile rows
  s[phys(r - 1)] = round_up(std::max<int64_t>(1, s[phys(r - 1)]), tiled ? hw.layout.tile_lanes : hw.layout.elements_per_stick(t));
  if (tiled && r >= 2) s[phys(r - 2)] = round_up(std::max<int64_t>(1, s[phys(r - 2)]), hw.layout.tile_rows_for(t));
  return s;
}

std::vector<int> kernel_globals(const TileKernel& t) {
  std::vector<int> out;
  auto add = [&](int g) {
    if (g >= 0 && std::find(out.begin(), out.end(), g) == out.end()) out.push_back(g);
  };
  for (const Operand& op : t.operands) add(op.global);
  for (int g : t.host_inputs) add(g);
  for (int g : t.host_outputs) add(g);
  return out;
}

const TileKernel* relayout_writing(const TileProgram& p, int g) {
  for (const TileKernel& t : p.kernels)
    if (t.kind == TileKind::relayout)
      for (const Operand& op : t.operands)
        if (op.out && op.global == g) return &t;
  return nullptr;
}

std::string_view tile_kind_name(TileKind k) {
  switch (k) {
    case TileKind::matmul: return "matmul";
    case TileKind::conv: return "conv";
    case TileKind::vector: return "vector";
    case TileKind::relayout: return "relayout";
    case TileKind::host: return "host";
  }
  return "?";
}

namespace {

const char* kind_word(Global::Kind k) {
  switch (k) {
    case Global::Kind::input: return "input";
    case Global::Kind::output: return "output";
    case Global::Kind::constant: return "const";
    case Global::Kind::temp: return "temp";
  }
  return "temp";
}

std::string dims_text(const Shape& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? "," : "") + (s[i] < 0 ? std::string("?") : std::to_string(s[i]));
  return out + "]";
}

std::string num(double v) { return fmt::format("{:.17g}", v); }

}  // namespace

std::string print_tile_program(const TileProgram& p) {
  std::string s = "# tessel tile level\n";
  s += fmt::format("tile_program {} target {} cores {} spad {} float {}{} dram {} {{\n", quote_string(p.name),
                   quote_string(p.target), p.cores, p.usable_spad, dtype_name(p.float_dtype), p.dl16 ? " format dl16" : "",
                   p.dram_peak);
  auto gname = [&](int gi) { return gi < 0 ? std::string("-") : format_value_name(p.globals[static_cast<size_t>(gi)].name); };
  for (const Global& g : p.globals)
    s += fmt::format("  global {}: {}{} from {} padded {}{} {} dram {}\n", format_value_name(g.name), dtype_name(g.dtype),
                     dims_text(g.shape), dtype_name(g.logical), dims_text(g.padded),
                     g.perm.empty() ? "" : " layout " + dims_text(g.perm), kind_word(g.kind), g.offset);
  auto list = [&](const std::vector<int>& v) {
    std::string out;
    for (size_t i = 0; i < v.size(); ++i) out += (i ? ", " : "") + gname(v[i]);
    return out;
  };
  s += "  inputs " + list(p.inputs) + "\n";
  s += "  outputs " + list(p.outputs) + "\n";
  for (const TileKernel& t : p.kernels) {
    s += fmt::format("  kernel @{} {} k{} node {} {}cores {} spad {} flops {} dram_bytes {} fusion {} {} estimate {} {{\n",
                     t.name, tile_kind_name(t.kind), t.kernel, quote_string(t.node),
                     t.on_vector_unit && t.kind != TileKind::vector && t.kind != TileKind::relayout ? "vector_unit " : "", t.cores, t.spad_peak, num(t.flops),
                     t.dram_bytes, t.bytes_unfused, t.bytes_fused, num(t.estimate_cycles));
    if (!t.sources.empty()) {
      s += "    sources";
      for (size_t i = 0; i < t.sources.size(); ++i) s += (i ? ", " : " ") + quote_string(t.sources[i]);
      s += "\n";
    }
    if (!t.vector_ops.empty()) {
      s += "    vector_ops";
      for (double v : t.vector_ops) s += " " + num(v);
      s += "\n";
    }
    for (const Dim& d : t.dims)
      s += fmt::format("    dim {} size {} split {} slice {} tile {} align {}{}\n", d.name, d.size, d.split, d.slice, d.tile,
                       d.align, d.reduction ? " reduction" : "");
    if (!t.order.empty()) {
      s += "    order";
      for (int i : t.order) s += " " + t.dims[static_cast<size_t>(i)].name;
      s += "\n";
    }
    for (const Operand& op : t.operands) {
      std::string dl;
      for (size_t i = 0; i < op.dims.size(); ++i) dl += (i ? "," : "") + t.dims[static_cast<size_t>(op.dims[i])].name;
      s += fmt::format("    operand {} {} {} dims [{}] {} x{} tile {} spad {} fanout {}\n", op.role, gname(op.global),
                       op.out ? "out" : "in", dl, dtype_name(op.spad_dtype), op.copies, op.tile_bytes, op.spad_offset,
                       op.fanout);
    }
    if (!t.host_inputs.empty() || t.kind == TileKind::host) s += "    host_in " + list(t.host_inputs) + "\n";
    if (!t.host_outputs.empty() || t.kind == TileKind::host) s += "    host_out " + list(t.host_outputs) + "\n";
    s += "    decision " + quote_string(t.decision) + "\n";
    s += "  }\n";
  }
  return s + "}\n";
}

// ---- parsing ---------------------------------------------------------------------------------------

namespace {

// Line-oriented: every record is one line of words, %names and "strings".
class TileParser {
 public:
  TileParser(const std::string& text, std::string file) : text_(text), file_(std::move(file)) {}

  TileProgram parse() {
    TileProgram p;
    next_line();
    if (!is_word("tile_program")) fail_here("expected 'tile_program'");
    take();
    p.name = string_tok();
    expect("target");
    p.target = string_tok();
    expect("cores");
    p.cores = integer();
    expect("spad");
    p.usable_spad = integer();
    expect("float");
    p.float_dtype = dtype_tok();
    if (at_word("format")) {
      take();
      if (word() != "dl16") fail_here("the only float format besides IEEE is dl16");
      p.dl16 = true;
    }
    expect("dram");
    p.dram_peak = integer();
    expect("{");
    end_line();
    std::map<std::string, int> globals;
    while (next_line()) {
      if (is_word("}")) {
        take();
        end_line();
        if (next_line()) fail_here("text after the program");
        return p;
      }
      if (is_word("global")) {
        take();
        Global g;
        g.name = value_name();
        expect(":");
        g.dtype = dtype_tok();
        g.shape = dims_tok();
        expect("from");
        g.logical = dtype_tok();
        expect("padded");
        g.padded = dims_tok();
        if (at_word("layout")) {
          take();
          g.perm = dims_tok();
        }
        const std::string k = word();
        if (k == "input") g.kind = Global::Kind::input;
        else if (k == "output") g.kind = Global::Kind::output;
        else if (k == "const") g.kind = Global::Kind::constant;
        else if (k == "temp") g.kind = Global::Kind::temp;
        else fail_here("unknown global kind '" + k + "'");
        expect("dram");
        g.offset = integer();
        end_line();
        if (globals.count(g.name)) fail_here("global %" + g.name + " is defined twice");
        globals[g.name] = static_cast<int>(p.globals.size());
        p.globals.push_back(g);
      } else if (is_word("inputs") || is_word("outputs")) {
        const bool in = word() == "inputs";
        (in ? p.inputs : p.outputs) = global_list(globals);
      } else if (is_word("kernel")) {
        take();
        p.kernels.push_back(kernel(globals));
      } else {
        fail_here("expected 'global', 'inputs', 'outputs', 'kernel' or '}'");
      }
    }
    fail_here("missing '}' at the end of the program");
  }

 private:
  TileKernel kernel(const std::map<std::string, int>& globals) {
    TileKernel t;
    expect("@");
    t.name = identifier("tile kernel name");
    const std::string kind = word();
    if (kind == "matmul") t.kind = TileKind::matmul;
    else if (kind == "conv") t.kind = TileKind::conv;
    else if (kind == "vector") t.kind = TileKind::vector;
    else if (kind == "host") t.kind = TileKind::host;
    else if (kind == "relayout") t.kind = TileKind::relayout;
    else fail_here("unknown kernel kind '" + kind + "'");
    const std::string kref = word();
    if (kref.size() < 2 || kref[0] != 'k') fail_here("expected k<index>");
    t.kernel = small_int(kref.substr(1), -1);  // host steps have no kernel: k-1
    expect("node");
    t.node = string_tok();
    t.on_vector_unit = t.kind == TileKind::vector || t.kind == TileKind::relayout;
    if (at_word("vector_unit")) {
      take();
      t.on_vector_unit = true;
    }
    expect("cores");
    t.cores = static_cast<int>(integer());
    expect("spad");
    t.spad_peak = integer();
    expect("flops");
    t.flops = real();
    expect("dram_bytes");
    t.dram_bytes = integer();
    expect("fusion");
    t.bytes_unfused = integer();
    t.bytes_fused = integer();
    expect("estimate");
    t.estimate_cycles = real();
    expect("{");
    end_line();
    auto dim_index = [&](const std::string& n) {
      for (size_t i = 0; i < t.dims.size(); ++i)
        if (t.dims[i].name == n) return static_cast<int>(i);
      fail_here("kernel @" + t.name + " has no dim '" + n + "'");
    };
    while (next_line()) {
      const std::string w = word();
      if (w == "}") {
        end_line();
        return t;
      }
      if (w == "vector_ops") {
        while (!at_end()) t.vector_ops.push_back(real());
      } else if (w == "sources") {
        do t.sources.push_back(string_tok());
        while (accept(","));
      } else if (w == "dim") {
        Dim d;
        d.name = identifier("dim name");
        expect("size");
        d.size = integer();
        expect("split");
        d.split = integer();
        expect("slice");
        d.slice = integer();
        expect("tile");
        d.tile = integer();
        expect("align");
        d.align = integer();
        if (at_word("reduction")) {
          take();
          d.reduction = true;
        }
        t.dims.push_back(d);
      } else if (w == "order") {
        while (!at_end()) t.order.push_back(dim_index(word()));
      } else if (w == "operand") {
        Operand op;
        op.role = word();
        if (at_word("-")) {
          take();
          op.global = -1;
        } else {
          op.global = global_ref(globals);
        }
        const std::string io = word();
        if (io != "in" && io != "out") fail_here("expected 'in' or 'out'");
        op.out = io == "out";
        expect("dims");
        expect("[");
        if (!at_word("]")) {
          do op.dims.push_back(dim_index(word()));
          while (accept(","));
        }
        expect("]");
        op.spad_dtype = dtype_tok();
        const std::string x = word();
        if (x.size() < 2 || x[0] != 'x') fail_here("expected x<copies>");
        op.copies = small_int(x.substr(1), 0);
        expect("tile");
        op.tile_bytes = integer();
        expect("spad");
        op.spad_offset = integer();
        expect("fanout");
        op.fanout = static_cast<int>(integer());
        t.operands.push_back(op);
      } else if (w == "host_in") {
        t.host_inputs = global_list(globals, false);
        continue;
      } else if (w == "host_out") {
        t.host_outputs = global_list(globals, false);
        continue;
      } else if (w == "decision") {
        t.decision = string_tok();
      } else {
        fail_here("unknown kernel record '" + w + "'");
      }
      end_line();
    }
    fail_here("missing '}' at the end of kernel @" + t.name);
  }

  // ---- lexing one line ----
  bool next_line() {
    while (pos_ < text_.size()) {
      const size_t e = text_.find('\n', pos_);
      line_ = text_.substr(pos_, e == std::string::npos ? std::string::npos : e - pos_);
      pos_ = e == std::string::npos ? text_.size() : e + 1;
      ++lineno_;
      col_ = 0;
      skip_ws();
      if (col_ < line_.size() && line_[col_] != '#') return true;
    }
    return false;
  }
  void skip_ws() {
    while (col_ < line_.size() && std::isspace(static_cast<unsigned char>(line_[col_]))) ++col_;
  }
  bool at_end() {
    skip_ws();
    return col_ >= line_.size();
  }
  // The next token without consuming it: a word, one punctuation character, or a quoted string.
  std::string peek() {
    skip_ws();
    if (col_ >= line_.size()) return "";
    const char c = line_[col_];
    if (std::string("{}[]:,@").find(c) != std::string::npos) return std::string(1, c);
    size_t e = col_;
    while (e < line_.size() && !std::isspace(static_cast<unsigned char>(line_[e])) &&
           std::string("{}[]:,@").find(line_[e]) == std::string::npos)
      ++e;
    return line_.substr(col_, e - col_);
  }
  bool is_word(const std::string& w) { return peek() == w; }
  bool at_word(const std::string& w) { return peek() == w; }
  void take() { col_ += peek().size(); }
  std::string word() {
    std::string w = peek();
    if (w.empty()) fail_here("unexpected end of line");
    take();
    return w;
  }
  void expect(const std::string& w) {
    if (peek() != w) fail_here("expected '" + w + "', found '" + peek() + "'");
    take();
  }
  bool accept(const std::string& w) {
    if (peek() != w) return false;
    take();
    return true;
  }
  void end_line() {
    if (!at_end()) fail_here("unexpected '" + line_.substr(col_) + "'");
  }
  // Names that exports such as KTIR use in symbols (@t0, %tid_m): plain identifiers only.
  std::string identifier(const char* what) {
    const std::string w = word();
    if (!is_plain_identifier(w)) fail_here(fmt::format("{} '{}' is not an identifier", what, w));
    return w;
  }
  int64_t integer() { return to_int64(word()); }
  int64_t to_int64(const std::string& w) {
    try {
      size_t used = 0;
      const int64_t v = std::stoll(w, &used);
      if (used == w.size()) return v;
    } catch (const std::exception&) {
    }
    fail_here("expected an integer (int64), found '" + w + "'");
  }
  // The number after k or x (a kernel index, a copy count): an int of at least `min`.
  int small_int(const std::string& w, int min) {
    const int64_t v = to_int64(w);
    if (v < min || v > INT32_MAX) fail_here(fmt::format("expected an int in [{}, {}], found '{}'", min, INT32_MAX, w));
    return static_cast<int>(v);
  }
  double real() {
    const std::string w = word();
    try {
      size_t used = 0;
      const double v = std::stod(w, &used);
      if (used == w.size()) return v;
    } catch (const std::exception&) {
    }
    fail_here("expected a number, found '" + w + "'");
  }
  // "..." as quote_string writes it.
  std::string string_tok() {
    skip_ws();
    try {
      return unquote_string(line_, col_);
    } catch (const Error& e) {
      fail_here(e.reason());
    }
  }
  std::string value_name() {
    skip_ws();
    if (col_ >= line_.size() || line_[col_] != '%') fail_here("expected a %name");
    ++col_;
    if (col_ < line_.size() && line_[col_] == '"') return string_tok();
    return word();
  }
  int global_ref(const std::map<std::string, int>& globals) {
    const std::string n = value_name();
    auto it = globals.find(n);
    if (it == globals.end()) fail_here("unknown global %" + n);
    return it->second;
  }
  std::vector<int> global_list(const std::map<std::string, int>& globals, bool end = true) {
    std::vector<int> v;
    if (!at_end()) {
      do v.push_back(global_ref(globals));
      while (accept(","));
    }
    if (end) end_line();
    else end_line();
    return v;
  }
  DType dtype_tok() {
    skip_ws();
    size_t e = col_;
    while (e < line_.size() && std::isalnum(static_cast<unsigned char>(line_[e]))) ++e;
    const std::string w = line_.substr(col_, e - col_);
    auto t = dtype_from_name(w);
    if (!t) fail_here("unknown dtype '" + w + "'");
    col_ = e;
    return *t;
  }
  Shape dims_tok() {
    Shape s;
    expect("[");
    if (!at_word("]")) {
      do {
        const std::string w = word();
        s.push_back(w == "?" ? -1 : to_int64(w));
      } while (accept(","));
    }
    expect("]");
    return s;
  }
  [[noreturn]] void fail_here(const std::string& msg) {
    throw Error(Location{.file = file_, .pass = "parse", .line = lineno_, .column = static_cast<int>(col_) + 1}, msg);
  }

  const std::string& text_;
  std::string file_;
  size_t pos_ = 0;
  std::string line_;
  size_t col_ = 0;
  int lineno_ = 0;
};

}  // namespace

TileProgram parse_tile_program(const std::string& text, const std::string& file, std::shared_ptr<const hw::HwSpec> hw) {
  TileProgram p = TileParser(text, file).parse();
  if (hw && hw->name != p.target)
    throw Error(Location{.file = file, .pass = "parse"},
                fmt::format("the program is mapped for target '{}', not for the hardware description '{}' given with it",
                            p.target, hw->name));
  p.hw = std::move(hw);
  return p;
}

// ---- verification ----------------------------------------------------------------------------------

void verify_tile_program(const TileProgram& p, bool allocated) {
  const hw::HwSpec& hw = p.hw_spec();
  for (const Global& g : p.globals) {
    if (!shape_known(g.shape)) continue;
    const Shape want = padded_shape(g.shape, g.dtype, hw, g.perm);
    if (g.padded != want)
      throw Error(Location{.node = g.name, .pass = "tile verify"},
                  fmt::format("global %{} is padded to {} but {}'s layout needs {}", g.name, dims_text(g.padded), hw.name,
                              dims_text(want)));
  }
  const int64_t align = std::max<int64_t>(1, hw.layout.alignment_bytes);
  for (const TileKernel& t : p.kernels) {
    auto bad = [&](const std::string& msg) {
      throw Error(Location{.node = t.node, .op = t.name, .pass = "tile verify"}, msg);
    };
    if (t.kind == TileKind::host) {
      if (!t.dims.empty() || !t.operands.empty()) bad("a host step has no dims or operands");
      continue;
    }
    int64_t cores = 1;
    for (const Dim& d : t.dims) {
      if (d.size < 1 || d.split < 1 || d.tile < 1 || d.align < 1) bad("dim " + d.name + ": sizes must be positive");
      if (d.slice % d.align != 0 && d.slice != d.size)
        bad(fmt::format("dim {}: the slice {} is not whole units of {}", d.name, d.slice, d.align));
      if (d.slice * d.split < d.size) bad(fmt::format("dim {}: {} slices of {} do not cover {}", d.name, d.split, d.slice, d.size));
      if ((d.split - 1) * d.slice >= d.size) bad(fmt::format("dim {}: the last of {} cores gets no work", d.name, d.split));
      if (d.tile > d.slice) bad(fmt::format("dim {}: the tile {} is larger than the slice {}", d.name, d.tile, d.slice));
      cores *= d.split;
    }
    if (cores != t.cores) bad(fmt::format("the splits use {} cores but the kernel says {}", cores, t.cores));
    if (cores > hw.cores) bad(fmt::format("{} cores used, {} has {}", cores, hw.name, hw.cores));
    for (size_t i = 0; i < t.order.size(); ++i)
      if (t.order[i] < 0 || t.order[i] >= static_cast<int>(t.dims.size())) bad("the loop order names a missing dim");
    std::vector<std::pair<int64_t, int64_t>> spans;
    for (const Operand& op : t.operands) {
      if (op.global >= static_cast<int>(p.globals.size())) bad("an operand names a missing global");
      for (int d : op.dims)
        if (d < 0 || d >= static_cast<int>(t.dims.size())) bad("operand " + op.role + " names a missing dim");
      if (!allocated) continue;
      if (op.spad_offset % align) bad(fmt::format("operand {}: scratchpad offset {} is not {}-byte aligned", op.role, op.spad_offset, align));
      const int64_t end = op.spad_offset + op.copies * op.tile_bytes;
      if (end > p.usable_spad)
        bad(fmt::format("operand {}: its buffers end at byte {} of the scratchpad, {} usable", op.role, end, p.usable_spad));
      for (const auto& [b, e] : spans)
        if (op.spad_offset < e && b < end) bad("operand " + op.role + "'s scratchpad buffers overlap another's");
      spans.emplace_back(op.spad_offset, end);
    }
  }
}

}  // namespace tessel::tile
