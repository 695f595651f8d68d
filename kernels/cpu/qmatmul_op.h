// The ORT-facing side of edge.QMatMul shared by the CPU and CUDA registrations: attributes, input binding, checks.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ort_api.h"
#include "qmatmul.h"

namespace edge {

struct QMatMulKernel {
  int64_t K = 0, N = 0, group = 0;
  int bits = 0;
  int digits = 3;  // 1 with accuracy_level 4 (int8 activations in the VNNI kernels; other kernels stay fp32)
};

struct BoundTensors {
  QMatMulArgs args;
  std::vector<int64_t> out_dims;
};

// Read, type-check and size-check all inputs, allocate the output, and fill args (layout fields included).
// Pointers are wherever the EP keeps tensors (host for CPU, device for CUDA); only metadata is read here.
OrtStatus* bind_tensors(const QMatMulKernel& kernel, OrtKernelContext* ctx, BoundTensors* out);

// Check CSR outliers on the host ("" when fine or absent): row_ptr monotone from 0 to nnz, columns in [0, K).
std::string validate_outliers_host(const QMatMulArgs& a);

// An OrtCustomOp (version 17) for edge.QMatMul on the given execution provider (nullptr provider = CPU).
OrtCustomOp make_qmatmul_op(const char* (*provider)(const OrtCustomOp*), OrtStatus* (*compute)(void*, OrtKernelContext*),
                            void (*compute_v1)(void*, OrtKernelContext*));

#ifdef EDGE_WITH_CUDA
// The CUDAExecutionProvider registration of the same op (cuda/qmatmul_cuda_op.cc).
const OrtCustomOp* cuda_op();
#endif

}  // namespace edge
