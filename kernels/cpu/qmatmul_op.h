// The ORT-facing side of edge.QMatMul shared by the CPU and CUDA registrations: attributes, input binding, checks.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "huge_pages.h"
#include "ort_api.h"
#include "qmatmul.h"

namespace edge {

// X, codes, scales, zeros, bias, 3 outlier arrays, mins, 3 two-level inputs, and the norm's skip and norm_weight
constexpr size_t kQMatMulInputs = 14;
// Then the pre-projection's weights (attribute pre_K): codes, scales, zeros, mins, inputs 14-17 of the node, which
// fill these slots of its own input list.
constexpr size_t kPreSlots[] = {1, 2, 3, 8};
constexpr size_t kPreInputs = 4;

struct QMatMulKernel {
  int64_t K = 0, N = 0, group = 0;
  int bits = 0;
  int digits = 3;  // 1 with accuracy_level 4 (int8 activations in the VNNI kernels; other kernels stay fp32)
  int gated = 0;  // attribute activation: 1 silu(gate) * up, 2 gelu_tanh(gate) * up (QMatMulArgs::gated)
  bool norm = false;  // attribute norm_epsilon given: X (+ skip) is RMS-normalised first (rms_norm.h)
  float norm_epsilon = 0.0f;
  bool top = false;  // attribute top = 1: the node's output 2 is each row's argmax and maximum (row_top.h)
  // The inputs that are constant initializers (the weights of a resident model), described once when the kernel is
  // made (CPU only): a call then reads only the others, where each input costs ~8 C API calls. Empty: read per call.
  TensorView constants[kQMatMulInputs];
  // The host-side checks of outliers and stat rows (validate_*_host) passed on inputs that are all constants: later
  // calls skip them (each walks every outlier and row pointer: ~10k reads for a 1%-outlier 576x1536 layer).
  mutable std::atomic<bool> host_checked{false};
  // Constants the CPU kernel reads from copies in 2 MB pages (huge_pages.h) instead of onnxruntime's buffers.
  std::vector<const void*> huge_copies;
  // Attribute pre_K: X (width pre_K) first goes through a matmul of its own, X W_pre^T (N = K, the same bits, group
  // size and accuracy_level), and what the norm reads is that: the matmul before a decoder layer's residual add
  // (o_proj, down_proj) inside the node after it. Only with the norm. Null without.
  std::unique_ptr<QMatMulKernel> pre;

  QMatMulKernel() = default;
  QMatMulKernel(const QMatMulKernel&) = delete;
  QMatMulKernel& operator=(const QMatMulKernel&) = delete;
  ~QMatMulKernel() {
    for (const void* copy : huge_copies) release_huge_copy(copy);
  }
};

struct BoundTensors {
  QMatMulArgs args;
  std::vector<int64_t> out_dims;
  // float16 X and Y (the op's float16 registration): args.x and args.y stay null, the kernel converts.
  const uint16_t* x16 = nullptr;
  uint16_t* y16 = nullptr;
  // The norm mode (QMatMulKernel::norm): args.x is X itself until the EP's compute normalises it into a buffer of
  // its own and points args.x there. skip and sum (output 1, X + skip) are null when the node has no skip input.
  const float* skip = nullptr;
  const float* norm_weight = nullptr;
  float* sum = nullptr;
  // Output 2 (row_top.h), where the node has it: (..., 2) floats per row of Y, its argmax and maximum.
  // float32 Y without the gate only; computed on the CPU only.
  float* top = nullptr;
  // The pre-projection (QMatMulKernel::pre): its args with x = X; its y, and args.x, are set by the EP's compute.
  bool has_pre = false;
  QMatMulArgs pre;
};

// Read, type-check and size-check all inputs, allocate the output, and fill args (layout fields included).
// Pointers are wherever the EP keeps tensors (host for CPU, device for CUDA); only metadata is read here.
OrtStatus* bind_tensors(const QMatMulKernel& kernel, OrtKernelContext* ctx, BoundTensors* out);

// Check CSR outliers on the host ("" when fine or absent): row_ptr monotone from 0 to nnz, columns in [0, K).
std::string validate_outliers_host(const QMatMulArgs& a);

// Check two-level statistics' stat_rows on the host ("" when fine or absent): every row inside scale_stats.
std::string validate_stat_rows_host(const QMatMulArgs& a);

// An OrtCustomOp (version 17) for edge.QMatMul on the given execution provider (nullptr provider = CPU), with
// float32 X and Y, or float16 ones (half): registered side by side, onnxruntime picks by X's type.
OrtCustomOp make_qmatmul_op(const char* (*provider)(const OrtCustomOp*), OrtStatus* (*compute)(void*, OrtKernelContext*),
                            void (*compute_v1)(void*, OrtKernelContext*), bool half);

#ifdef EDGE_WITH_CUDA
// The CUDAExecutionProvider registrations of the same op, float32 and float16 (cuda/qmatmul_cuda_op.cc).
const OrtCustomOp* cuda_op(bool half);
#endif

}  // namespace edge
