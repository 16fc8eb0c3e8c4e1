// C spellings of scalar instructions (see c_expr.h).
#include "tessel/targets/c_expr.h"

#include <cmath>
#include <cstdlib>
#include <map>

#include "tessel/ir/core_ops.h"
#include "tessel/support/error.h"
#include "tessel/support/escape.h"

namespace tessel {
namespace {

std::string unsigned_of(DType t) { return t == DType::i32 ? "uint32_t" : "uint64_t"; }

}  // namespace

std::string c_type(DType t) {
  switch (t) {
    case DType::f32: return "float";
    case DType::f64: return "double";
    case DType::i32: return "int32_t";
    case DType::i64: return "int64_t";
    case DType::boolean: return "bool";
    default: break;
  }
  fail("the C code generators have no type for {}", dtype_name(t));
}

std::string c_storage_type(DType t) { return t == DType::boolean ? "uint8_t" : c_type(t); }

std::string c_literal(DType t, double v, CDialect d) {
  if (t == DType::boolean) return v != 0 ? "true" : "false";
  if (t == DType::i32 || t == DType::i64) {
    const int64_t i = static_cast<int64_t>(v);
    // CUDA's int64_t is long long (the prelude's typedef): the LL suffix is right for both.
    const char* suffix = d == CDialect::cuda ? "LL" : "L";
    if (t == DType::i64 && i == INT64_MIN) return fmt::format("(-9223372036854775807{} - 1)", suffix);
    if (t == DType::i32 && i == INT32_MIN) return "(-2147483647 - 1)";
    return t == DType::i64 ? std::to_string(i) + suffix : std::to_string(i);
  }
  const bool f = t == DType::f32;
  const bool cuda = d == CDialect::cuda;
  if (std::isnan(v)) return cuda ? (f ? "tsl_nanf()" : "tsl_nan()") : (f ? "__builtin_nanf(\"\")" : "__builtin_nan(\"\")");
  if (std::isinf(v)) {
    const std::string inf = cuda ? (f ? "tsl_inff()" : "tsl_inf()") : (f ? "__builtin_inff()" : "__builtin_inf()");
    return std::string(v < 0 ? "-" : "") + inf;
  }
  // shortest decimal that reads back exactly, else a hex float
  for (int prec = 1; prec <= 17; ++prec) {
    std::string s = fmt::format("{:.{}g}", v, prec);
    const double back = std::strtod(s.c_str(), nullptr);
    if (f ? static_cast<float>(back) == static_cast<float>(v) : back == v) {
      if (s.find_first_of(".e") == std::string::npos) s += ".0";
      return f ? s + "f" : s;
    }
  }
  return fmt::format("{:a}{}", v, f ? "f" : "");
}

std::string c_math_fn(const std::string& name, DType t) { return "tsl_" + name + (t == DType::f64 ? "_f64" : ""); }

std::string c_scalar_expr(const KInstr& in, DType operand0, const std::vector<std::string>& ops, CDialect) {
  auto a = [&](size_t j) -> const std::string& {
    if (j >= ops.size()) fail("'{}' has {} operands, its C form needs {}", in.name(), ops.size(), j + 1);
    return ops[j];
  };
  const DType t = in.dtype;
  const bool fl = t == DType::f32 || t == DType::f64;
  const std::string_view op = in.name();
  if (!in.is(KInstrKind::core)) fail("no C form for '{}'", op);
  const CoreOpInfo& p = core_op_info(in.core);
  switch (p.c_form) {  // the spellings are the table's (core_ops.def)
    case CForm::negate:
      return fl ? std::string(p.c) + a(0) : fmt::format("({})(0 {} ({}){})", c_type(t), p.c, unsigned_of(t), a(0));
    case CForm::call: {
      std::string args;
      for (size_t j = 0; j < ops.size(); ++j) args += (j ? ", " : "") + ops[j];
      return fmt::format("{}({})", c_math_fn(std::string(p.c), t), args);
    }
    case CForm::infix: return fmt::format("{} {} {}", a(0), p.c, a(1));
    case CForm::wrapping_infix:
      if (fl) return fmt::format("{} {} {}", a(0), p.c, a(1));
      if (t == DType::boolean) return fmt::format("({} {} {})", a(0), p.c_bool, a(1));
      return fmt::format("({})(({}){} {} ({}){})", c_type(t), unsigned_of(t), a(0), p.c_int, unsigned_of(t), a(1));
    case CForm::min_max:
      if (fl) return fmt::format("{}({}, {})", c_math_fn(std::string(p.c), t), a(0), a(1));
      if (t == DType::boolean) return fmt::format("({} {} {})", a(0), p.c_bool, a(1));
      return fmt::format("({0} {2} {1} ? {0} : {1})", a(0), a(1), p.c_int);
    case CForm::bitwise: return fmt::format("({} {} {})", a(0), t == DType::boolean ? p.c_bool : p.c_int, a(1));
    case CForm::compare: {
      static const std::map<std::string, std::string> dirs = {{"eq", "=="}, {"ne", "!="}, {"lt", "<"},
                                                               {"le", "<="}, {"gt", ">"}, {"ge", ">="}};
      auto it = dirs.find(in.attr);
      if (it == dirs.end()) fail("compare direction '{}'", in.attr);
      return fmt::format("({} {} {})", a(0), it->second, a(1));
    }
    case CForm::select: return fmt::format("({} ? {} : {})", a(0), a(1), a(2));
    case CForm::cast:
      if (t == DType::boolean) return fmt::format("({} != 0)", a(0));
      if (operand0 == t) return a(0);
      return fmt::format("({}){}", c_type(t), a(0));
    case CForm::reduction:  // an accumulator statement (the generators emit it), never an expression
    case CForm::none: break;
  }
  fail("no C form for '{}'", op);
}

std::vector<std::string> c_reduce_step(const std::string& attr, const std::string& acc, const std::string& x) {
  if (attr == "sum") return {fmt::format("{} += {};", acc, x)};
  if (attr == "prod") return {fmt::format("{} *= {};", acc, x)};
  return {fmt::format("{0} = {1} {2} {0} ? {1} : {0};", acc, x, reduction_combiner(attr) == CoreOp::max ? ">" : "<"),
          fmt::format("{0}_nan |= {1} != {1};", acc, x)};
}

std::string kernel_provenance_comment(const Kernel& k) {
  std::string s = fmt::format("// fuses {} core nodes; traffic {} bytes unfused -> {} fused\n", k.fused_nodes,
                              cpp_comment_text(k.bytes_unfused.str()), cpp_comment_text(k.bytes_fused.str()));
  std::string src;
  for (size_t i = 0; i < k.sources.size(); ++i) {
    if (i == 8) {
      src += fmt::format(", ... ({} more)", k.sources.size() - 8);
      break;
    }
    src += (i ? ", " : "") + cpp_comment_text(k.sources[i]);
  }
  s += "// from: " + src + "\n";
  for (size_t i = 0; i < k.args.size(); ++i) {
    const KArg& a = k.args[i];
    const char* role = a.role == KArg::Role::in ? "in" : a.role == KArg::Role::out ? "out" : "scratch";
    s += fmt::format("//   a{} {} %{}: {}\n", i, role, cpp_comment_text(a.name), cpp_comment_text(a.type.str()));
  }
  return s;
}

std::string c_size_expr(const Dim& d, const std::vector<std::string>& symbols, const std::string& prefix) {
  if (d.is_static()) return std::to_string(d.constant_term());
  auto name = [&](const std::string& s) {
    for (size_t i = 0; i < symbols.size(); ++i)
      if (symbols[i] == s) return prefix + std::to_string(i);
    fail("the size {} names the symbol {}, which the module does not declare", d.str(), s);
  };
  std::string e;
  for (const Dim::Term& t : d.terms()) {
    std::string f;
    for (const std::string& s : t.syms) f += (f.empty() ? "" : "*") + name(s);
    const int64_t c = t.coef < 0 ? -t.coef : t.coef;
    if (c != 1) f = std::to_string(c) + "L*" + f;
    e += e.empty() ? (t.coef < 0 ? "-" + f : f) : (t.coef < 0 ? " - " : " + ") + f;
  }
  if (d.constant_term() != 0) e += fmt::format(" {} {}L", d.constant_term() < 0 ? "-" : "+", d.constant_term() < 0 ? -d.constant_term() : d.constant_term());
  const bool alone = d.constant_term() == 0 && d.terms().size() == 1 && d.terms()[0].coef == 1 && d.terms()[0].syms.size() == 1;
  return alone ? e : "(" + e + ")";
}

}  // namespace tessel
