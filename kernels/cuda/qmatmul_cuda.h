// Host entry point of the CUDA kernel (qmatmul_cuda.cu); plain C++ so the ORT glue compiles with g++.
#pragma once

#include <string>

#include "qmatmul.h"

namespace edge {

// Launch on `stream` (a cudaStream_t; ORT's compute stream). All pointers in `a` are device pointers; x16/y16, when
// given, are float16 X and Y in place of a.x/a.y (computed in float32 all the same). Returns "" on success, else
// the CUDA error. Never synchronises.
std::string launch_qmatmul_cuda(const QMatMulArgs& a, const uint16_t* x16, uint16_t* y16, void* stream);

}  // namespace edge
