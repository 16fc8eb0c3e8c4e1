// Printer for the graph-level text form. The grammar is in docs/ir/graph.md.
#include "tessel/ir/printer.h"

#include <fmt/format.h>

#include <cmath>

#include "tessel/ir/op_registry.h"
#include "tessel/support/error.h"

namespace tessel {
namespace {

bool bare_name_char(char c) {
  return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.' || c == '/' || c == '-';
}

std::string format_float(double v, DType t) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v < 0 ? "-inf" : "inf";
  return t == DType::f64 ? fmt::format("{:.17g}", v) : fmt::format("{:.9g}", v);
}

// A float attribute: always spelled with '.', 'e', or nan/inf so the parser tells it from an int.
std::string format_attr_float(double v) {
  std::string s = format_float(v, DType::f64);
  if (s.find_first_of(".eni") == std::string::npos) s += ".0";
  return s;
}

const char kB64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

std::string base64(const uint8_t* p, size_t n) {
  std::string out;
  out.reserve((n + 2) / 3 * 4);
  for (size_t i = 0; i < n; i += 3) {
    uint32_t v = p[i] << 16 | (i + 1 < n ? p[i + 1] << 8 : 0) | (i + 2 < n ? p[i + 2] : 0);
    out += kB64[v >> 18 & 63];
    out += kB64[v >> 12 & 63];
    out += i + 1 < n ? kB64[v >> 6 & 63] : '=';
    out += i + 2 < n ? kB64[v & 63] : '=';
  }
  return out;
}

std::string tensor_elements(const Tensor& t) {
  std::string s = "[";
  for (int64_t i = 0; i < t.numel(); ++i) {
    if (i) s += ", ";
    if (is_float(t.dtype())) s += format_float(t.get_f(i), t.dtype());
    else if (t.dtype() == DType::boolean) s += t.get_i(i) ? "true" : "false";
    else if (t.dtype() == DType::u64) s += std::to_string(static_cast<uint64_t>(t.get_i(i)));
    else s += std::to_string(t.get_i(i));
  }
  return s + "]";
}

struct Printer {
  const PrintOptions& opts;
  std::vector<const Tensor*> blobs;

  std::string tensor_literal(const Tensor& t) {
    if (t.numel() <= opts.inline_limit) return tensor_elements(t);
    if (opts.elide_constants) return fmt::format("blob<elided {} bytes>", t.nbytes());
    if (opts.external_blobs) {
      opts.external_blobs->push_back(&t);
      return fmt::format("blob<{}>", opts.external_blobs->size() - 1);
    }
    blobs.push_back(&t);
    return fmt::format("blob<{}>", blobs.size() - 1);
  }

  std::string attr(const Attr& a) {
    switch (static_cast<AttrKind>(a.index())) {
      case AttrKind::i: return std::to_string(std::get<int64_t>(a));
      case AttrKind::f: return format_attr_float(std::get<double>(a));
      case AttrKind::s: return quote_string(std::get<std::string>(a));
      case AttrKind::ints: {
        const auto& v = std::get<std::vector<int64_t>>(a);
        return v.empty() ? "ints[]" : fmt::format("[{}]", fmt::join(v, ", "));
      }
      case AttrKind::floats: {
        const auto& v = std::get<std::vector<double>>(a);
        if (v.empty()) return "floats[]";
        std::string s = "[";
        for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + format_attr_float(v[i]);
        return s + "]";
      }
      case AttrKind::strings: {
        const auto& v = std::get<std::vector<std::string>>(a);
        if (v.empty()) return "strings[]";
        std::string s = "[";
        for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + quote_string(v[i]);
        return s + "]";
      }
      case AttrKind::tensor: {
        const auto& t = std::get<Tensor>(a);
        return fmt::format("tensor<{}> {}", TensorType{t.dtype(), t.shape()}.str(), tensor_literal(t));
      }
      case AttrKind::dims: {
        const auto& v = std::get<Dims>(a);
        return fmt::format("dims[{}]", fmt::join(v, ", "));
      }
    }
    return "";
  }
};

}  // namespace

std::string quote_string(const std::string& s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c == '\n') {
      out += "\\n";
    } else if (c < 0x20 || c >= 0x7f) {
      out += fmt::format("\\x{:02x}", c);
    } else {
      out += static_cast<char>(c);
    }
  }
  return out + "\"";
}

namespace {

int hex_digit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

}  // namespace

std::string unquote_string(std::string_view text, size_t& pos) {
  if (pos >= text.size() || text[pos] != '"') fail("expected a string");
  ++pos;
  std::string out;
  while (true) {
    if (pos >= text.size()) fail("unterminated string");
    const char c = text[pos];
    if (c == '"') break;
    if (c == '\n' || c == '\r') fail("newline in string");
    ++pos;
    if (c != '\\') {
      out += c;
      continue;
    }
    if (pos >= text.size()) fail("unterminated string");
    const char e = text[pos];
    if (e == 'n' || e == '"' || e == '\\') {
      out += e == 'n' ? '\n' : e;
      ++pos;
    } else if (e == 'x') {
      const int hi = pos + 1 < text.size() ? hex_digit(text[pos + 1]) : -1;
      const int lo = pos + 2 < text.size() ? hex_digit(text[pos + 2]) : -1;
      if (hi < 0 || lo < 0) fail("bad escape '\\x': two hex digits must follow");
      out += static_cast<char>(hi << 4 | lo);
      pos += 3;
    } else {
      fail("unknown escape '\\{}'", e);
    }
  }
  ++pos;
  return out;
}

std::string format_value_name(const std::string& name) {
  bool bare = !name.empty();
  for (char c : name) bare = bare && bare_name_char(c);
  return "%" + (bare ? name : quote_string(name));
}

std::string print_graph(const Graph& g, const PrintOptions& opts) {
  Printer p{opts, {}};
  std::string out = "# tessel graph level\n";
  out += fmt::format("graph @{}(", format_value_name(g.name).substr(1));
  for (size_t i = 0; i < g.inputs.size(); ++i)
    out += fmt::format("{}{}: {}", i ? ", " : "", format_value_name(g.inputs[i]->name), g.inputs[i]->type.str());
  out += ")";
  if (!g.symbols.empty()) {
    out += " symbols(";
    bool first = true;
    for (const auto& [name, si] : g.symbols.all()) {
      out += (first ? "" : ", ") + si.str();
      first = false;
    }
    out += ")";
  }
  out += " {\n";
  for (const Value* c : g.constants())
    out += fmt::format("  const {}: {} = {}\n", format_value_name(c->name), c->type.str(), p.tensor_literal(*c->constant));
  for (const auto& n : g.nodes()) {
    out += "  ";
    for (size_t i = 0; i < n->outputs.size(); ++i) {
      if (i) out += ", ";
      const Value* v = n->outputs[i];
      out += v ? fmt::format("{}: {}", format_value_name(v->name), v->type.str()) : "_";
    }
    out += fmt::format(" = {}(", n->op_name());
    for (size_t i = 0; i < n->inputs.size(); ++i)
      out += fmt::format("{}{}", i ? ", " : "", n->inputs[i] ? format_value_name(n->inputs[i]->name) : "_");
    out += ")";
    if (!n->attrs.empty()) {
      out += " {";
      bool first = true;
      for (const auto& [k, a] : n->attrs) {
        out += fmt::format("{}{} = {}", first ? "" : ", ", k, p.attr(a));
        first = false;
      }
      out += "}";
    }
    out += fmt::format(" loc({})\n", quote_string(n->name));
  }
  out += "  return ";
  for (size_t i = 0; i < g.outputs.size(); ++i) out += (i ? ", " : "") + format_value_name(g.outputs[i]->name);
  out += "\n}\n";
  if (!p.blobs.empty()) {
    out += "blobs {\n";
    for (size_t i = 0; i < p.blobs.size(); ++i)
      out += fmt::format("  {}: \"{}\"\n", i, base64(p.blobs[i]->bytes(), p.blobs[i]->nbytes()));
    out += "}\n";
  }
  return out;
}

}  // namespace tessel
