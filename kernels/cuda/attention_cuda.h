// Host entry point of edge.Attention's CUDA kernels (attention_cuda.cu); plain C++ so the ORT glue compiles with g++.
#pragma once

#include <string>

#include "attention.h"

namespace edge {

// Write the S new rows into a.kcache/a.vcache (after copying the first P rows from the past when the present is
// another buffer) and attend, on `stream` (ORT's compute stream). Device pointers throughout; never synchronises.
// Returns "" on success, else the error.
std::string launch_attention_cuda(const AttentionArgs& a, const float* past_key, const float* past_value,
                                  void* stream);

}  // namespace edge
