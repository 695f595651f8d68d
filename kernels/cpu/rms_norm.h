// RMSNorm of edge.QMatMul's input (the op's norm_epsilon mode): the residual add and norm that precede almost every
// matmul of a decoder layer, done inside the matmul's node so the graph has no norm node of its own (SmolLM2: 158
// nodes instead of 218). Why: each node costs onnxruntime's dispatch, on the CPU a few microseconds (more at several
// rows, where its norm splits rows over threads): SmolLM2's steps ran 2.5-5.5% faster. On CUDA this file's kernel is
// a launch of its own before the matmul's, and decoding ran 3% slower (kernels/README.md).
//
// Numerics, the same for every row whatever the call's size (batch-invariant, like the matmul): h = x + skip (or x),
// ss = sum of h^2 in float32 over 16 lanes (lane j takes k = j, j + 16, ... in order; lanes folded 8, 4, 2, 1 apart),
// r = 1 / sqrtf(ss / K + epsilon), out = (h * r) * weight. The CUDA kernel sums in another fixed order.
#pragma once

#include <cstdint>

namespace edge {

// rows x k floats; skip may be null (then sum is unused and may be null); sum and out get rows x k floats. sum may be
// x itself (each element of x is read before sum's is written): the pre-projection's output is computed there.
void rms_norm_rows(const float* x, const float* skip, const float* weight, float epsilon, int64_t rows, int64_t k,
                   float* sum, float* out);
// The same bits with AVX2 (rms_norm_avx2.cc), for CPUs where uses_avx2(); elsewhere rms_norm_rows itself.
void rms_norm_rows_avx2(const float* x, const float* skip, const float* weight, float epsilon, int64_t rows,
                        int64_t k, float* sum, float* out);

}  // namespace edge
