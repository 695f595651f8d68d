// Host entry point of the CUDA kernel (qmatmul_cuda.cu); plain C++ so the ORT glue compiles with g++.
#pragma once

#include <string>

#include "qmatmul.h"

namespace edge {

// edge.QMatMul's norm mode on the GPU (cpu/rms_norm.h): every block normalises the rows it multiplies as it reads
// them, so the norm costs no launch of its own. Device pointers; skip may be null (then sum is not written).
struct CudaNorm {
  const float* skip = nullptr;
  const float* weight = nullptr;
  float* sum = nullptr;  // X + skip, written by the blocks of the first column tile
  float epsilon = 0.0f;
};

// Launch on `stream` (a cudaStream_t; ORT's compute stream). All pointers in `a` are device pointers; x16/y16, when
// given, are float16 X and Y in place of a.x/a.y (computed in float32 all the same); norm, when given, normalises
// float32 X first. Returns "" on success, else the CUDA error. Never synchronises.
std::string launch_qmatmul_cuda(const QMatMulArgs& a, const uint16_t* x16, uint16_t* y16, const CudaNorm* norm,
                                void* stream);

// edge.QMatMul's pre-projection (QMatMulKernel::pre) on `stream`: a.x W^T into this host thread's device scratch,
// which a.y is pointed at; the node's own matmul then reads it. Returns "" on success, else the error.
std::string launch_projection_cuda(QMatMulArgs& a, void* stream);

}  // namespace edge
