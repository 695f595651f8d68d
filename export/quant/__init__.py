"""Low-bit weight quantization: the numeric core behind `edge-export --quant`.

Independent of ONNX graphs: every method turns a float weight (out, in) and, where it matters, a calibration Hessian
into a `QuantizedLinear` (qlinear.py), which dequantizes itself and lays itself out for onnxruntime's MatMulNBits.

Entry points: rtn.quantize_rtn, gptq.quantize_gptq, spqr.quantize_spqr, decoupleq.quantize_decoupleq (one layer);
methods.quantize_model (a whole Llama-style model, calibrated sequentially on calibration_text); bits.* (bits per
weight). The stock-op form of a layer is MatMulNBits + an optional group-offset term + an optional sparse outlier
term; QuantizedLinear.reference_matmul is its numpy reference.
"""

from edge.errors import EdgeError


class QuantizationError(EdgeError):
    """A quantization setting or input the methods here cannot handle (bits, block size, shapes, Hessian)."""
