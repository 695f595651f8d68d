// Host entry point of the CUDA kernel (qmatmul_cuda.cu); plain C++ so the ORT glue compiles with g++.
#pragma once

#include <string>

#include "qmatmul.h"

namespace edge {

// Launch on `stream` (a cudaStream_t; ORT's compute stream). All pointers in `a` are device pointers.
// Returns "" on success, else the CUDA error. Never synchronises.
std::string launch_qmatmul_cuda(const QMatMulArgs& a, void* stream);

}  // namespace edge
