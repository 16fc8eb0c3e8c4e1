// Which matmul epilogues cuBLASLt computes itself (docs/runtime/cuda-backend.md, "Epilogues"): a matmul
// kernel's generated epilogue is folded into the cuBLASLt call when it is, element for element, one of
//   C + bias[n]            CUBLASLT_EPILOGUE_BIAS
//   gelu_tanh(C + bias[n]) CUBLASLT_EPILOGUE_GELU_BIAS   (cuBLASLt's GELU is the tanh approximation:
//   gelu_tanh(C)           CUBLASLT_EPILOGUE_GELU         an erf GELU, ONNX's Gelu/Erf form, is not it and
//   relu(C + bias[n]), relu(C)   ..._RELU_BIAS, _RELU     keeps the generated epilogue)
// each optionally plus a residual r[m, n] read in C's own layout (cuBLASLt's C with beta = 1).
// The decision is semantic: the epilogue's body is evaluated in double on sample values and compared with
// each form, so any spelling of the same function (x*0.5*(1+tanh(..)), add operands swapped) is found,
// and a near miss (erf against tanh: up to 5e-4 apart) is not.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "tessel/kernel/kernel.h"

namespace tessel::cuda {

struct LtEpilogue {
  enum class Act { none, gelu_tanh, relu };
  bool fold = false;       // the whole epilogue is the library's
  bool bias = false;       // + bias[n] before the activation
  Act act = Act::none;
  bool residual = false;   // + r[m, n] after it (beta = 1, cuBLASLt's C = r)
  int bias_arg = -1, residual_arg = -1, out_arg = -1;  // kernel args; out_arg: where the result is stored
  std::string why;         // the decision, printable: what is folded, or why not
};

// The decision for matmul kernel `k` (a loop kernel or a matmul without epilogue: fold = false).
LtEpilogue match_lt_epilogue(const Kernel& k);

// One scalar instruction of the small set the value-based matchers evaluate (add mul div neg max min pow
// tanh erf exp sqrt, named through the core-op table), in double; nullopt for any other op or arity.
std::optional<double> eval_scalar_op(const KInstr& in, const std::vector<double>& a);

}  // namespace tessel::cuda
