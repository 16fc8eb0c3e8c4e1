// Parser for the graph-level text form (.tsl). Errors carry line:column.
#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstring>

#include "tessel/ir/op_registry.h"
#include "tessel/ir/printer.h"
#include "tessel/support/error.h"
#include "tessel/support/limits.h"

namespace tessel {
namespace {

int b64_digit(char c) {
  if (c >= 'A' && c <= 'Z') return c - 'A';
  if (c >= 'a' && c <= 'z') return c - 'a' + 26;
  if (c >= '0' && c <= '9') return c - '0' + 52;
  if (c == '+') return 62;
  if (c == '/') return 63;
  return -1;
}

class Parser {
 public:
  Parser(const std::string& text, const std::string& file, const BlobSource& source)
      : s_(text), file_(file), source_(source) {}

  std::unique_ptr<Graph> parse() {
    g_ = std::make_unique<Graph>();
    skip_ws();
    expect_word("graph");
    expect('@');
    g_->name = name_token();
    expect('(');
    if (!peek(')')) {
      do {
        std::string n = value_name();
        expect(':');
        TensorType t = type();
        if (values_.count(n)) error("value '" + n + "' is defined twice");
        values_[n] = g_->add_input(n, t);
      } while (accept(','));
    }
    expect(')');
    if (peek_word("symbols")) symbols();
    expect('{');
    while (true) {
      skip_ws();
      if (peek_word("return")) break;
      if (peek_word("const")) constant();
      else node();
    }
    expect_word("return");
    do {
      g_->outputs.push_back(use(value_name()));
    } while (accept(','));
    expect('}');
    skip_ws();
    if (peek_word("blobs")) blobs();
    skip_ws();
    if (pos_ < s_.size()) error("unexpected text after the graph");
    for (auto& p : pending_) {
      if (!p.filled && source_) fill_from_source(p);
      if (!p.filled) error_at(p.line, p.col, fmt::format("blob<{}> is not defined in the blobs section", p.index));
    }
    return std::move(g_);
  }

 private:
  struct PendingBlob {
    int index;
    TensorType type;
    Value* value = nullptr;   // a constant
    Node* node = nullptr;     // or a tensor attribute of a node
    std::string attr;
    int line, col;
    bool filled = false;
  };

  [[noreturn]] void error(const std::string& msg) {
    auto [l, c] = line_col(pos_);
    error_at(l, c, msg);
  }
  [[noreturn]] void error_at(int line, int col, const std::string& msg) {
    throw Error(Location{.file = file_, .pass = "parse", .line = line, .column = col}, msg);
  }
  // Line and column of offset p. Scans on from the last offset asked for (the parser asks in
  // increasing order), so a whole file costs one pass: scanning from the start every time made a
  // 20000-node file take 15 s.
  std::pair<int, int> line_col(size_t p) const {
    p = std::min(p, s_.size());
    if (p < lc_pos_) lc_pos_ = 0, lc_line_ = 1, lc_col_ = 1;
    for (; lc_pos_ < p; ++lc_pos_) {
      if (s_[lc_pos_] == '\n') {
        ++lc_line_;
        lc_col_ = 1;
      } else {
        ++lc_col_;
      }
    }
    return {lc_line_, lc_col_};
  }
  mutable size_t lc_pos_ = 0;
  mutable int lc_line_ = 1, lc_col_ = 1;

  void skip_ws() {
    while (pos_ < s_.size()) {
      char c = s_[pos_];
      if (c == '#') {
        while (pos_ < s_.size() && s_[pos_] != '\n') ++pos_;
      } else if (std::isspace(static_cast<unsigned char>(c))) {
        ++pos_;
      } else {
        break;
      }
    }
  }
  bool peek(char c) {
    skip_ws();
    return pos_ < s_.size() && s_[pos_] == c;
  }
  bool accept(char c) {
    if (!peek(c)) return false;
    ++pos_;
    return true;
  }
  void expect(char c) {
    if (!accept(c)) {
      std::string got = pos_ < s_.size() ? std::string("'") + s_[pos_] + "'" : std::string("end of input");
      error(fmt::format("expected '{}' but found {}", c, got));
    }
  }
  static bool word_char(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; }
  bool peek_word(const char* w) {
    skip_ws();
    size_t n = std::strlen(w);
    return s_.compare(pos_, n, w) == 0 && (pos_ + n >= s_.size() || !word_char(s_[pos_ + n]));
  }
  void expect_word(const char* w) {
    if (!peek_word(w)) error(fmt::format("expected '{}'", w));
    pos_ += std::strlen(w);
  }
  std::string word() {
    skip_ws();
    size_t b = pos_;
    while (pos_ < s_.size() && word_char(s_[pos_])) ++pos_;
    if (b == pos_) error("expected a name");
    return s_.substr(b, pos_ - b);
  }
  std::string string_literal() {
    skip_ws();
    try {
      return unquote_string(s_, pos_);
    } catch (const Error& e) {
      error(e.reason());
    }
  }
  // Names after '%' or '@': bare characters or a quoted string.
  std::string name_token() {
    if (pos_ < s_.size() && s_[pos_] == '"') return string_literal();
    size_t b = pos_;
    while (pos_ < s_.size() && (word_char(s_[pos_]) || s_[pos_] == '.' || s_[pos_] == '/' || s_[pos_] == '-')) ++pos_;
    if (b == pos_) error("expected a name");
    return s_.substr(b, pos_ - b);
  }
  std::string value_name() {
    expect('%');
    return name_token();
  }
  Value* use(const std::string& n) {
    auto it = values_.find(n);
    if (it == values_.end()) error("use of undefined value '%" + n + "'");
    return it->second;
  }

  TensorType type() {
    skip_ws();
    auto [l, c] = line_col(pos_);
    std::string dt = word();
    auto d = dtype_from_name(dt);
    if (!d) error_at(l, c, "unknown dtype '" + dt + "'");
    TensorType t{*d, {}};
    expect('[');
    Dims dims;
    if (!peek(']')) {
      do {
        if (accept('?')) dims.push_back(kUnknownDim);
        else dims.push_back(dim());
        if (dims.size() > kMaxRank) error_at(l, c, fmt::format("a type of more than {} dims (tessel's rank limit)", kMaxRank));
      } while (accept(','));
    }
    expect(']');
    t.set_dims(dims);
    return t;
  }

  Dim signed_dim() {
    skip_ws();
    std::optional<Dim> d;
    try {
      d = parse_dim(s_, pos_);
    } catch (const Error& e) {
      error(e.reason());
    }
    if (!d) error("expected a size");
    return *d;
  }

  // A size: an integer >= 0 or a symbolic expression (sym.h's text form).
  Dim dim() {
    skip_ws();
    const size_t b = pos_;
    std::optional<Dim> d;
    try {
      d = parse_dim(s_, pos_);
    } catch (const Error& e) {
      error(e.reason());
    }
    if (!d) error("expected a size");
    if (d->is_static() && d->constant_term() < 0) {
      pos_ = b;
      error("a size must not be negative");
    }
    return *d;
  }

  // symbols '(' NAME 'in' '[' INT ',' INT ']' ['multiple_of' INT] {',' ...} ')'
  void symbols() {
    expect_word("symbols");
    expect('(');
    do {
      skip_ws();
      auto [l, c] = line_col(pos_);
      SymbolInfo si;
      si.name = word();
      expect_word("in");
      expect('[');
      si.lo = integer();
      expect(',');
      si.hi = integer();
      expect(']');
      if (peek_word("multiple_of")) {
        expect_word("multiple_of");
        si.multiple_of = integer();
      }
      if (g_->symbols.find(si.name)) error_at(l, c, fmt::format("size symbol '{}' is declared twice", si.name));
      try {
        g_->symbols.declare(si);
      } catch (const Error& e) {
        error_at(l, c, e.reason());
      }
    } while (accept(','));
    expect(')');
  }

  int64_t integer() {
    skip_ws();
    size_t b = pos_;
    if (pos_ < s_.size() && (s_[pos_] == '-' || s_[pos_] == '+')) ++pos_;
    while (pos_ < s_.size() && std::isdigit(static_cast<unsigned char>(s_[pos_]))) ++pos_;
    if (b == pos_ || (pos_ == b + 1 && !std::isdigit(static_cast<unsigned char>(s_[b])))) error("expected an integer");
    return to_int64(s_.substr(b, pos_ - b), b);
  }

  // An integer token (sign and digits) as int64, or a located error when it does not fit; `at` is
  // where the token starts. from_chars never throws (std::stoll's out_of_range was an internal error).
  // The values an integer dtype holds (i64: all of int64).
  static std::pair<int64_t, int64_t> integer_range(DType t) {
    switch (t) {
      case DType::i32: return {INT32_MIN, INT32_MAX};
      case DType::i16: return {INT16_MIN, INT16_MAX};
      case DType::i8: return {INT8_MIN, INT8_MAX};
      case DType::i4: return {-8, 7};
      case DType::i2: return {-2, 1};
      case DType::u32: return {0, UINT32_MAX};
      case DType::u16: return {0, UINT16_MAX};
      case DType::u8: return {0, UINT8_MAX};
      case DType::u4: return {0, 15};
      case DType::u2: return {0, 3};
      default: return {INT64_MIN, INT64_MAX};
    }
  }
  int64_t to_int64(const std::string& tok, size_t at) { return to_integer<int64_t>(tok, at, "int64", "an integer"); }
  uint64_t to_uint64(const std::string& tok, size_t at) { return to_integer<uint64_t>(tok, at, "u64", "an unsigned integer"); }
  template <typename T>
  T to_integer(const std::string& tok, size_t at, const char* type, const char* expected) {
    const char* b = tok.data() + (!tok.empty() && tok[0] == '+');
    T v = 0;
    const auto [end, ec] = std::from_chars(b, tok.data() + tok.size(), v);
    if (ec == std::errc::result_out_of_range) error_at_pos(at, fmt::format("integer {} is out of range for {}", tok, type));
    if (ec != std::errc() || end != tok.data() + tok.size()) error_at_pos(at, fmt::format("expected {}, found '{}'", expected, tok));
    return v;
  }
  [[noreturn]] void error_at_pos(size_t p, const std::string& msg) {
    auto [l, c] = line_col(p);
    error_at(l, c, msg);
  }

  // A number token: returns its text; is_float tells whether it was spelled as a float.
  std::string number(bool* is_float) {
    skip_ws();
    size_t b = pos_;
    token_start_ = b;
    if (pos_ < s_.size() && (s_[pos_] == '-' || s_[pos_] == '+')) ++pos_;
    if (s_.compare(pos_, 3, "nan") == 0 || s_.compare(pos_, 3, "inf") == 0) {
      pos_ += 3;
      *is_float = true;
      return s_.substr(b, pos_ - b);
    }
    *is_float = false;
    size_t digits = pos_;
    while (pos_ < s_.size()) {
      char c = s_[pos_];
      if (std::isdigit(static_cast<unsigned char>(c))) {
        ++pos_;
      } else if (c == '.' || c == 'e' || c == 'E') {
        *is_float = true;
        ++pos_;
        if ((c == 'e' || c == 'E') && pos_ < s_.size() && (s_[pos_] == '-' || s_[pos_] == '+')) ++pos_;
      } else {
        break;
      }
    }
    if (pos_ == digits) error("expected a number");
    return s_.substr(b, pos_ - b);
  }
  // A float token; strtod rounds subnormals and overflow (to inf) as a float literal would.
  double to_double(const std::string& t, size_t at) {
    if (t == "nan" || t == "+nan" || t == "-nan") return std::nan("");
    if (t == "inf" || t == "+inf") return INFINITY;
    if (t == "-inf") return -INFINITY;
    char* end = nullptr;
    const double v = std::strtod(t.c_str(), &end);
    if (t.empty() || end != t.c_str() + t.size()) error_at_pos(at, "bad number '" + t + "'");
    return v;
  }

  // A literal's declared size is checked against the text before its Tensor (zero-filled at that
  // size) is made: n elements take at least 2n-1 characters, so dims of 2^31 over a few characters
  // fail here. A blob's tensor is made only once its bytes are in hand (blobs()).
  int64_t declared_numel(const TensorType& t) {
    try {
      return checked_tensor_numel(t.dtype, t.shape, "constant");
    } catch (const Error& e) {
      error(e.reason());
    }
  }
  void check_literal_fits(const TensorType& t) {
    const uint64_t n = static_cast<uint64_t>(declared_numel(t)), left = s_.size() - pos_;
    if (n > (left + 1) / 2)
      error(fmt::format("{} declares {} elements but the rest of the text holds at most {}", t.str(), n, (left + 1) / 2));
  }
  // '[' elements ']' for a tensor of type t, or blob<N> (resolved after the blobs section).
  std::optional<Tensor> literal(const TensorType& t, PendingBlob* blob_ref) {
    if (!shape_known(t.shape)) error("a constant needs a fully known shape");
    skip_ws();
    if (peek_word("blob")) {
      auto [l, c] = line_col(pos_);
      expect_word("blob");
      expect('<');
      if (peek_word("elided")) error("constant data was elided when printed (--elide-constants); the text cannot be parsed");
      blob_ref->index = static_cast<int>(integer());
      blob_ref->type = t;
      blob_ref->line = l;
      blob_ref->col = c;
      expect('>');
      return std::nullopt;
    }
    check_literal_fits(t);
    Tensor out(t.dtype, t.shape);
    expect('[');
    int64_t i = 0;
    if (!peek(']')) {
      do {
        if (i >= out.numel()) error(fmt::format("too many elements for {}", t.str()));
        if (t.dtype == DType::boolean) {
          if (peek_word("true")) {
            expect_word("true");
            out.set_i(i, 1);
          } else {
            expect_word("false");
            out.set_i(i, 0);
          }
        } else {
          bool isf = false;
          std::string tok = number(&isf);
          if (is_float(t.dtype)) out.set_f(i, to_double(tok, token_start_));
          else if (isf) error("expected an integer element for " + t.str());
          else if (t.dtype == DType::u64) out.set_i(i, static_cast<int64_t>(to_uint64(tok, token_start_)));
          else {
            const int64_t v = to_int64(tok, token_start_);
            const auto [lo, hi] = integer_range(t.dtype);
            // (stored as is, 300 in an i8 would wrap to 44: a different constant, silently)
            if (v < lo || v > hi)
              error_at_pos(token_start_, fmt::format("integer {} is out of range for {} ([{}, {}])", tok, dtype_name(t.dtype), lo, hi));
            out.set_i(i, v);
          }
        }
        ++i;
      } while (accept(','));
    }
    expect(']');
    if (i != out.numel()) error(fmt::format("{} elements given for {}", i, t.str()));
    return out;
  }

  void constant() {
    expect_word("const");
    std::string n = value_name();
    expect(':');
    TensorType t = type();
    expect('=');
    PendingBlob pb{};
    auto lit = literal(t, &pb);
    if (values_.count(n)) error("value '%" + n + "' is defined twice");
    // A blob stored outside the text is bound right away (no zero-filled placeholder to replace).
    Tensor external = !lit && source_ ? external_blob(pb) : Tensor();
    const bool bound = external.valid();
    // An unbound blob's value gets no placeholder data (its declared size is not allocated before its
    // bytes are seen): its type is the declared one, its constant is set by blobs().
    Value* v = g_->add_constant(n, lit ? std::move(*lit) : bound ? std::move(external) : Tensor());
    if (!lit && !bound) v->type = t;
    values_[n] = v;
    if (!lit) {
      pb.value = v;
      pb.filled = bound;
      pending_.push_back(pb);
    }
  }

  Attr attr_value(Node* n, const std::string& name) {
    skip_ws();
    if (peek_word("ints")) {
      expect_word("ints"); expect('['); expect(']');
      return std::vector<int64_t>{};
    }
    if (peek_word("floats")) {
      expect_word("floats"); expect('['); expect(']');
      return std::vector<double>{};
    }
    if (peek_word("strings")) {
      expect_word("strings"); expect('['); expect(']');
      return std::vector<std::string>{};
    }
    if (peek_word("dims")) {  // a list of sizes with a symbolic entry
      expect_word("dims");
      expect('[');
      Dims v;
      do v.push_back(signed_dim());
      while (accept(','));
      expect(']');
      if (dims_static(v)) error("a dims[] list needs a symbolic entry (write a static list as [..])");
      return v;
    }
    if (peek_word("tensor")) {
      expect_word("tensor");
      expect('<');
      TensorType t = type();
      expect('>');
      PendingBlob pb{};
      auto lit = literal(t, &pb);
      if (lit) return std::move(*lit);
      pb.node = n;
      pb.attr = name;
      pending_.push_back(pb);
      return Tensor();  // set by blobs() or fill_from_source(); no allocation of the declared size
    }
    if (peek('"')) return string_literal();
    if (accept('[')) {
      skip_ws();
      if (peek('"')) {
        std::vector<std::string> v;
        do v.push_back(string_literal());
        while (accept(','));
        expect(']');
        return v;
      }
      std::vector<std::string> toks;
      std::vector<size_t> starts;
      bool any_float = false;
      do {
        bool f = false;
        toks.push_back(number(&f));
        starts.push_back(token_start_);
        any_float = any_float || f;
      } while (accept(','));
      expect(']');
      if (any_float) {
        std::vector<double> v;
        for (size_t i = 0; i < toks.size(); ++i) v.push_back(to_double(toks[i], starts[i]));
        return v;
      }
      std::vector<int64_t> v;
      for (size_t i = 0; i < toks.size(); ++i) v.push_back(to_int64(toks[i], starts[i]));
      return v;
    }
    bool f = false;
    std::string tok = number(&f);
    if (f) return to_double(tok, token_start_);
    return to_int64(tok, token_start_);
  }

  void node() {
    struct Result {
      std::string name;
      TensorType type;
      bool omitted;
    };
    std::vector<Result> results;
    do {
      skip_ws();
      if (accept('_')) {
        results.push_back({"", {}, true});
        continue;
      }
      std::string n = value_name();
      expect(':');
      results.push_back({n, type(), false});
    } while (accept(','));
    expect('=');
    skip_ws();
    auto [ol, oc] = line_col(pos_);
    std::string opname = word();
    const OpDef* op = OpRegistry::get().find(opname);
    if (!op) error_at(ol, oc, "unknown op '" + opname + "'");
    expect('(');
    std::vector<Value*> ins;
    if (!peek(')')) {
      do {
        skip_ws();
        if (pos_ < s_.size() && s_[pos_] == '_' ) {
          ++pos_;
          ins.push_back(nullptr);
        } else {
          ins.push_back(use(value_name()));
        }
      } while (accept(','));
    }
    expect(')');
    std::vector<std::string> names;
    for (const auto& r : results) {
      if (!r.omitted && values_.count(r.name)) error("value '%" + r.name + "' is defined twice");
      names.push_back(r.omitted ? "" : r.name);
    }
    Node* n = g_->add_node(op, "", std::move(ins), names);
    if (accept('{')) {
      do {
        std::string an = word();
        expect('=');
        if (n->attrs.count(an)) error("attribute '" + an + "' is given twice");
        n->attrs[an] = attr_value(n, an);
      } while (accept(','));
      expect('}');
    }
    expect_word("loc");
    expect('(');
    n->name = string_literal();
    expect(')');
    for (size_t i = 0; i < results.size(); ++i) {
      if (results[i].omitted) continue;
      n->outputs[i]->type = results[i].type;
      values_[results[i].name] = n->outputs[i];
    }
  }

  void blobs() {
    expect_word("blobs");
    expect('{');
    while (!accept('}')) {
      int idx = static_cast<int>(integer());
      expect(':');
      skip_ws();
      auto [l, c] = line_col(pos_);
      std::string text = string_literal();
      std::vector<uint8_t> bytes;
      uint32_t acc = 0;
      int bits = 0;
      for (char ch : text) {
        if (ch == '=') break;
        int d = b64_digit(ch);
        if (d < 0) error_at(l, c, "bad base64 data");
        acc = acc << 6 | static_cast<uint32_t>(d);
        bits += 6;
        if (bits >= 8) {
          bits -= 8;
          bytes.push_back(static_cast<uint8_t>(acc >> bits));
        }
      }
      bool used = false;
      for (auto& p : pending_) {
        if (p.index != idx) continue;
        used = true;
        // Checked before the tensor is made: its declared size is allocated only when the bytes are there.
        const auto want = tensor_bytes(p.type.dtype, p.type.shape);
        if (!want || bytes.size() != *want)
          error_at(l, c, fmt::format("blob {} has {} bytes but {} needs {}", idx, bytes.size(), p.type.str(),
                                     want ? std::to_string(*want) : std::string("more than 2^64")));
        Tensor t(p.type.dtype, p.type.shape);
        if (!bytes.empty()) std::memcpy(t.bytes(), bytes.data(), bytes.size());
        if (p.value) p.value->constant = std::move(t);
        else p.node->attrs[p.attr] = std::move(t);
        p.filled = true;
      }
      if (!used) error_at(l, c, fmt::format("blob {} is not used", idx));
    }
  }

  // A blob stored outside the text (PrintOptions::external_blobs).
  // The source's tensor for a blob (invalid when it has none); one of another type is an error.
  Tensor external_blob(const PendingBlob& p) {
    Tensor t = source_(p.index, p.type);
    if (t.valid() && (t.dtype() != p.type.dtype || t.shape() != p.type.shape))
      error_at(p.line, p.col, fmt::format("blob<{}> holds {} but {} is needed", p.index,
                                          TensorType{t.dtype(), t.shape()}.str(), p.type.str()));
    return t;
  }

  void fill_from_source(PendingBlob& p) {
    Tensor t = external_blob(p);
    if (!t.valid()) return;
    if (p.value) p.value->constant = std::move(t);
    else p.node->attrs[p.attr] = std::move(t);
    p.filled = true;
  }

  const std::string& s_;
  std::string file_;
  const BlobSource& source_;
  size_t pos_ = 0;
  size_t token_start_ = 0;  // where the last number() token starts, for errors about its value
  std::unique_ptr<Graph> g_;
  std::map<std::string, Value*> values_;
  std::vector<PendingBlob> pending_;
};

}  // namespace

std::unique_ptr<Graph> parse_graph(const std::string& text, const std::string& file, const BlobSource& blobs) {
  return Parser(text, file, blobs).parse();
}

}  // namespace tessel
