// The C spelling of the kernel level's scalar instructions, shared by the code generators that emit
// C-family source (targets/cpu: C++ for the host; targets/cuda: CUDA C++ for NVRTC). One place turns a
// KInstr into an expression, from the spellings of the core-op table (core_ops.def).
#pragma once

#include <string>
#include <vector>

#include "tessel/kernel/kernel.h"

namespace tessel {

// The dialect differs only where a C++ compiler builtin has no CUDA spelling (NaN and infinity
// literals: CUDA code gets the prelude's tsl_nanf()/tsl_inff()/tsl_nan()/tsl_inf()).
enum class CDialect { cpp, cuda };

std::string c_type(DType t);          // float, double, int32_t, int64_t, bool; fails for others
std::string c_storage_type(DType t);  // the element type of a buffer (bool is stored as uint8_t)
std::string c_literal(DType t, double v, CDialect d);
// tsl_<name> for f32 (and integers), tsl_<name>_f64 for f64: the runtime header's math functions.
std::string c_math_fn(const std::string& name, DType t);

// The expression of a scalar instruction that is neither load, store, const nor reduce: a core op
// applied to `operands` (the C expressions of in.args). `operand0` is the dtype of its first operand
// (a convert's source). Throws tessel::Error for ops the table gives no C form.
std::string c_scalar_expr(const KInstr& in, DType operand0, const std::vector<std::string>& operands, CDialect d);

// The statements that fold element `x` into the running reduction `acc` of kind `attr` (sum, prod, max,
// min). max/min keep NaN apart: `acc`_nan records whether a NaN was seen (the reduction's NaN rule).
std::vector<std::string> c_reduce_step(const std::string& attr, const std::string& acc, const std::string& x);

// The provenance lines every generated kernel starts with, after its own first line: what it fuses and
// the traffic saved, the source nodes it came from (8 at most), and each argument's role, value and type.
// Names come from the model (or a cached kernel-module text): each goes through cpp_comment_text, so none
// can end the comment, splice a line or leave plain ASCII.
std::string kernel_provenance_comment(const Kernel& k);

// A size as a C expression (long arithmetic): its number when static; else its polynomial over the
// symbols, symbol `symbols[i]` spelled <prefix><i> (identifiers from positions, never from names),
// parenthesised unless it is one symbol alone. Fails for a symbol not in `symbols`.
std::string c_size_expr(const Dim& d, const std::vector<std::string>& symbols, const std::string& prefix);

}  // namespace tessel
