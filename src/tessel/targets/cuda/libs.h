// NVRTC and cuBLASLt, opened with dlopen the first time the CUDA target needs them rather than linked: the
// tessel CLI and library then start without mapping cuBLASLt (540 MB; linking it made `tessel --version`
// take 0.12 s and 250 MB), and a machine without them still runs everything but --target cuda. Calls go
// through the tables below, whose members have the libraries' own names and types (decltype of the
// headers' declarations), so a call reads nvrtc().nvrtcCompileProgram(...). Only _cudart.cpp files include
// this (it needs the toolkit's headers).
#pragma once

#include <cublasLt.h>
#include <cuda_runtime_api.h>
#include <nvrtc.h>

namespace tessel::cuda {

#define TESSEL_NVRTC_FUNCTIONS(X)                                                                              \
  X(nvrtcVersion) X(nvrtcCreateProgram) X(nvrtcCompileProgram) X(nvrtcDestroyProgram) X(nvrtcGetProgramLogSize) \
  X(nvrtcGetProgramLog) X(nvrtcGetCUBINSize) X(nvrtcGetCUBIN) X(nvrtcGetErrorString)

#define TESSEL_CUBLASLT_FUNCTIONS(X)                                                                            \
  X(cublasLtCreate) X(cublasLtDestroy) X(cublasLtMatmul) X(cublasLtMatmulDescCreate)                           \
  X(cublasLtMatmulDescDestroy) X(cublasLtMatmulDescSetAttribute) X(cublasLtMatrixLayoutCreate)                 \
  X(cublasLtMatrixLayoutDestroy) X(cublasLtMatrixLayoutSetAttribute) X(cublasLtMatmulPreferenceCreate)         \
  X(cublasLtMatmulPreferenceDestroy) X(cublasLtMatmulPreferenceSetAttribute) X(cublasLtMatmulAlgoGetHeuristic)

#define TESSEL_CUDA_LIB_MEMBER(name) decltype(&::name) name = nullptr;
struct NvrtcApi {
  TESSEL_NVRTC_FUNCTIONS(TESSEL_CUDA_LIB_MEMBER)
};
struct CublasLtApi {
  TESSEL_CUBLASLT_FUNCTIONS(TESSEL_CUDA_LIB_MEMBER)
};
#undef TESSEL_CUDA_LIB_MEMBER

// The loaded tables (once per process). Throw tessel::Error naming the library and the places tried when
// it cannot be opened or lacks a function.
const NvrtcApi& nvrtc();
const CublasLtApi& cublaslt();

}  // namespace tessel::cuda
