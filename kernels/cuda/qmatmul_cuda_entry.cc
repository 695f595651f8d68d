// A plain C entry point to the CUDA kernel, for callers outside ONNX Runtime: benchmarks/kernels_cuda.py times it
// against a dequantize-then-cuBLAS baseline through torch (device pointers and stream from torch, via ctypes).
#include <string>

#include "qmatmul.h"
#include "qmatmul_cuda.h"

extern "C" __attribute__((visibility("default"))) const char* edge_qmatmul_cuda(
    const float* x, int64_t M, int64_t K, int64_t N, int bits, int64_t group, const uint8_t* codes,
    const float* scales, const uint8_t* zeros_u8, const float* zeros_f32, const float* bias,
    const uint16_t* outlier_values, const int32_t* outlier_cols, const int32_t* outlier_rowptr, int64_t nnz, float* y,
    void* stream) {
  static thread_local std::string error;
  edge::QMatMulArgs a;
  a.x = x, a.ldx = K, a.M = M, a.K = K, a.N = N, a.bits = bits, a.group = group;
  edge::finish_layout(a);
  a.codes = codes, a.scales = scales, a.zeros_u8 = zeros_u8, a.zeros_f32 = zeros_f32, a.bias = bias;
  a.outlier_values = outlier_values, a.outlier_cols = outlier_cols, a.outlier_rowptr = outlier_rowptr;
  a.outlier_nnz = nnz, a.y = y;
  error = edge::launch_qmatmul_cuda(a, nullptr, nullptr, nullptr, stream);
  return error.empty() ? nullptr : error.c_str();
}
