"""edge's own ONNX Runtime custom ops: edge.QMatMul (low-bit matmul) and edge.Attention (GroupQueryAttention's
contract), both with batch-invariant numerics.

library_path()/register() find and register the compiled library; pack()/quantize()/make_outliers() produce the
weights of an edge.QMatMul node; dequantize()/reference() are its float64 reference.
"""

from edge.kernels.library import DOMAIN, OP_TYPE, KernelLibraryError, kernel_isa, library_path, register
from edge.kernels.pack import (Outliers, PackedWeight, TwoLevel, dequantize, make_outliers, pack, pack_two_level, quantize,
                               reference)

__all__ = ["DOMAIN", "OP_TYPE", "KernelLibraryError", "Outliers", "PackedWeight", "TwoLevel", "dequantize",
           "kernel_isa", "library_path", "make_outliers", "pack", "pack_two_level", "quantize", "reference", "register"]
