// The ORT registration of edge.Attention (attention_op.cc); the kernels themselves are in attention.h.
#pragma once

#include "ort_abi.h"

namespace edge {

// edge.Attention on the CPU execution provider (version 17 OrtCustomOp, static storage).
const OrtCustomOp* cpu_attention_op();

}  // namespace edge
