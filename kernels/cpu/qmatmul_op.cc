// Input binding and checks of edge.QMatMul, shared by every execution provider.
#include "qmatmul_op.h"

namespace edge {

namespace {

const char* kInputNames[] = {"X", "codes", "scales", "zeros", "bias", "outlier_values", "outlier_cols",
                             "outlier_row_ptr", "mins", "scale_stats", "zero_stats", "stat_rows", "skip",
                             "norm_weight"};

std::string type_error(size_t index, int got, const char* want) {
  return std::string("input '") + kInputNames[index] + "' has element type " + std::to_string(got) + ", expected " +
         want;
}

std::string size_error(size_t index, int64_t got, int64_t want, const std::string& why) {
  return std::string("input '") + kInputNames[index] + "' has " + std::to_string(got) + " elements, expected " +
         std::to_string(want) + " (" + why + "); pack weights with edge.kernels.pack";
}

// The weight layout a size error names. Built only for an error: as a string every call made (four to_string and
// their concatenation) it cost ~0.5 us of every call, a sixth of what the main thread does between two calls.
std::string layout_of(const QMatMulKernel& k) {
  return "N=" + std::to_string(k.N) + ", K=" + std::to_string(k.K) + ", bits=" + std::to_string(k.bits) +
         ", group_size=" + std::to_string(k.group);
}

// Inputs 9-11 (SpQR's second level): scale_stats needs stat_rows; zero_stats needs scale_stats and uint8 zeros.
std::string check_two_level(const QMatMulKernel& k, const TensorView* const* in, const QMatMulArgs& a) {
  const bool scale_stats = in[9]->value != nullptr, zero_stats = in[10]->value != nullptr;
  if (!scale_stats) return zero_stats || in[11]->value != nullptr ? "zero_stats and stat_rows need scale_stats" : "";
  if (in[9]->type != kOrtFloat16) return type_error(9, in[9]->type, "float16");
  if (in[9]->count == 0 || in[9]->count % (a.G * 2) != 0)
    return size_error(9, in[9]->count, a.G * 2,
                      "a multiple of 2 * groups: (rows, groups, 2) base and step, " + layout_of(k));
  if (in[11]->value == nullptr) return "scale_stats need stat_rows (the stat row of each half tile)";
  if (in[11]->type != kOrtInt32) return type_error(11, in[11]->type, "int32");
  if (in[11]->count != a.tiles * 2) return size_error(11, in[11]->count, a.tiles * 2, "two per tile of 8 columns");
  if (in[8]->value != nullptr) return "mins do not combine with two-level statistics";
  if (zero_stats) {
    if (in[10]->type != kOrtFloat16) return type_error(10, in[10]->type, "float16");
    if (in[10]->count != in[9]->count) return size_error(10, in[10]->count, in[9]->count, "as many as scale_stats");
    if (in[3]->value == nullptr || in[3]->type != kOrtUint8) return "zero_stats need zeros as uint8 codes";
  }
  return "";
}

// Inputs 12-13 (the norm mode): norm_weight (K,) float32, skip shaped as X; both only with norm_epsilon.
std::string check_norm(const QMatMulKernel& k, const TensorView* const* in) {
  const bool skip = in[12]->value != nullptr, weight = in[13]->value != nullptr;
  if (!k.norm) return skip || weight ? "inputs 'skip' and 'norm_weight' need the attribute norm_epsilon" : "";
  if (in[0]->type != kOrtFloat) return "the norm (attribute norm_epsilon) needs float32 X";
  if (!weight) return "the norm (attribute norm_epsilon) needs input 'norm_weight'";
  if (in[13]->type != kOrtFloat) return type_error(13, in[13]->type, "float32");
  if (in[13]->count != k.K) return size_error(13, in[13]->count, k.K, "one weight per input column");
  if (skip && in[12]->type != kOrtFloat) return type_error(12, in[12]->type, "float32");
  if (skip && in[12]->dims != in[0]->dims) return "input 'skip' must have X's shape";
  return "";
}

std::string check(const QMatMulKernel& k, const TensorView* const* in, QMatMulArgs& a) {
  if (std::string err = check_norm(k, in); !err.empty()) return err;
  const TensorView& x = *in[0];
  if (x.type != kOrtFloat && x.type != kOrtFloat16) return type_error(0, x.type, "float32 or float16");
  if (x.dims.empty() || x.dims.back() != k.K)
    return "input 'X' must have last dimension K=" + std::to_string(k.K);
  if (in[1]->type != kOrtUint8) return type_error(1, in[1]->type, "uint8");
  if (std::string err = check_two_level(k, in, a); !err.empty()) return err;
  const bool two_level = in[9]->value != nullptr;
  if (two_level && in[2]->type != kOrtUint8) return type_error(2, in[2]->type, "uint8 (codes, with scale_stats)");
  if (!two_level && in[2]->type != kOrtFloat && in[2]->type != kOrtFloat16)
    return type_error(2, in[2]->type, "float32 or float16");
  if (in[1]->count != a.tiles * a.tile_bytes) return size_error(1, in[1]->count, a.tiles * a.tile_bytes, layout_of(k));
  const int64_t per_group = a.tiles * a.G * 8;
  if (in[2]->count != per_group) return size_error(2, in[2]->count, per_group, layout_of(k));
  if (in[3]->value != nullptr) {
    if (in[3]->type != kOrtUint8 && in[3]->type != kOrtFloat) return type_error(3, in[3]->type, "uint8 or float32");
    if (in[3]->count != per_group) return size_error(3, in[3]->count, per_group, layout_of(k));
  }
  if (in[8]->value != nullptr) {
    if (in[3]->value != nullptr)
      return "give zeros or mins, not both (W = (code - zero) * scale or code * scale + min)";
    if (in[8]->type != kOrtFloat && in[8]->type != kOrtFloat16) return type_error(8, in[8]->type, "float32 or float16");
    if (in[8]->count != per_group) return size_error(8, in[8]->count, per_group, layout_of(k));
  }
  if (in[4]->value != nullptr) {
    if (in[4]->type != kOrtFloat) return type_error(4, in[4]->type, "float32");
    if (in[4]->count != k.N) return size_error(4, in[4]->count, k.N, "one bias per output column");
  }
  const int present = (in[5]->value != nullptr) + (in[6]->value != nullptr) + (in[7]->value != nullptr);
  if (present != 0 && present != 3) return "outliers need all three inputs: values, columns and row_ptr";
  if (present == 3) {
    if (in[5]->type != kOrtFloat16) return type_error(5, in[5]->type, "float16");
    if (in[6]->type != kOrtInt32) return type_error(6, in[6]->type, "int32");
    if (in[7]->type != kOrtInt32) return type_error(7, in[7]->type, "int32");
    if (in[6]->count != in[5]->count) return size_error(6, in[6]->count, in[5]->count, "one column per outlier value");
    if (in[7]->count != k.N + 1) return size_error(7, in[7]->count, k.N + 1, "CSR row pointer of N+1 entries");
  }
  return "";
}

// The weights' pointers in args, from inputs already checked.
void fill_weights(const TensorView* const* in, QMatMulArgs& a) {
  a.codes = static_cast<const uint8_t*>(in[1]->data);
  if (in[9]->value != nullptr) {
    a.scale_codes = static_cast<const uint8_t*>(in[2]->data);
    a.scale_stats = static_cast<const uint16_t*>(in[9]->data);
    a.stat_rows = static_cast<const int32_t*>(in[11]->data);
    a.stat_row_count = in[9]->count / (a.G * 2);
    if (in[10]->value != nullptr) {
      a.zero_codes = static_cast<const uint8_t*>(in[3]->data);
      a.zero_stats = static_cast<const uint16_t*>(in[10]->data);
    }
  } else if (in[2]->type == kOrtFloat16) {
    a.scales_f16 = static_cast<const uint16_t*>(in[2]->data);
  } else {
    a.scales = static_cast<const float*>(in[2]->data);
  }
  if (in[8]->value != nullptr) {
    if (in[8]->type == kOrtFloat16) a.mins_f16 = static_cast<const uint16_t*>(in[8]->data);
    else a.mins_f32 = static_cast<const float*>(in[8]->data);
  }
  if (in[3]->value != nullptr && a.zero_codes == nullptr) {
    if (in[3]->type == kOrtUint8) a.zeros_u8 = static_cast<const uint8_t*>(in[3]->data);
    else a.zeros_f32 = static_cast<const float*>(in[3]->data);
  }
  if (in[4]->value != nullptr) a.bias = static_cast<const float*>(in[4]->data);
  if (in[5]->value != nullptr) {
    a.outlier_values = static_cast<const uint16_t*>(in[5]->data);
    a.outlier_cols = static_cast<const int32_t*>(in[6]->data);
    a.outlier_rowptr = static_cast<const int32_t*>(in[7]->data);
    a.outlier_nnz = in[5]->count;
  }
}

void start_args(const QMatMulKernel& k, QMatMulArgs& a) {
  a.K = k.K;
  a.N = k.N;
  a.bits = k.bits;
  a.group = k.group;
  a.digits = k.digits;
  a.gated = k.gated;
  finish_layout(a);
}

// The pre-projection's inputs 14-17 as the slots of an input list of its own, X in slot 0; checked as a plain op's.
OrtStatus* bind_pre(const QMatMulKernel& k, OrtKernelContext* ctx, size_t count, const TensorView& x,
                    BoundTensors* out) {
  const QMatMulKernel& p = *k.pre;
  TensorView read[kPreInputs];
  const TensorView* in[kQMatMulInputs];
  for (size_t i = 0; i < kQMatMulInputs; ++i) in[i] = &p.constants[i];  // all absent but the weights' slots
  in[0] = &x;
  for (size_t j = 0; j < kPreInputs; ++j) {
    const size_t slot = kPreSlots[j];
    if (p.constants[slot].value != nullptr) continue;
    if (OrtStatus* st = view_input(ctx, kQMatMulInputs + j, count, &read[j])) return st;
    in[slot] = &read[j];
  }
  if (in[1]->value == nullptr || in[2]->value == nullptr)
    return make_status(kOrtInvalidArgument, "edge.QMatMul: pre_K needs inputs 14 and 15 (pre_codes, pre_scales)");
  if (x.type != kOrtFloat) return make_status(kOrtInvalidArgument, "edge.QMatMul: pre_K needs float32 X");
  QMatMulArgs& a = out->pre;
  start_args(p, a);
  if (std::string err = check(p, in, a); !err.empty())
    return make_status(kOrtInvalidArgument, "edge.QMatMul: pre-projection (inputs 14-17): " + err);
  a.M = x.count / p.K;
  a.x = static_cast<const float*>(x.data);
  a.ldx = p.K;
  fill_weights(in, a);
  out->has_pre = true;
  return nullptr;
}

}  // namespace

OrtStatus* bind_tensors(const QMatMulKernel& k, OrtKernelContext* ctx, BoundTensors* out) {
  size_t count = 0;
  if (OrtStatus* st = g_ort.KernelContext_GetInputCount(ctx, &count)) return st;
  TensorView read[kQMatMulInputs];
  const TensorView* in[kQMatMulInputs];
  for (size_t i = 0; i < kQMatMulInputs; ++i) {
    in[i] = &k.constants[i];  // a constant initializer, described when the kernel was made
    if (k.constants[i].value != nullptr) continue;
    if (OrtStatus* st = view_input(ctx, i, count, &read[i])) return st;
    in[i] = &read[i];
  }
  if (in[0]->value == nullptr || in[1]->value == nullptr || in[2]->value == nullptr)
    return make_status(kOrtInvalidArgument, "edge.QMatMul: inputs X, codes and scales are required");
  TensorView projected;  // with a pre-projection: X W_pre^T as this matmul's X, shaped (..., K); its data comes later
  if (k.pre) {
    if (OrtStatus* st = bind_pre(k, ctx, count, *in[0], out)) return st;
    projected.value = in[0]->value;
    projected.type = kOrtFloat;
    projected.dims = in[0]->dims;
    projected.dims.back() = k.K;
    projected.count = out->pre.M * k.K;
    in[0] = &projected;
  }
  QMatMulArgs& a = out->args;
  start_args(k, a);
  if (std::string err = check(k, in, a); !err.empty()) return make_status(kOrtInvalidArgument, "edge.QMatMul: " + err);
  a.M = in[0]->count / k.K;
  const bool half = in[0]->type == kOrtFloat16;
  if (half) out->x16 = static_cast<const uint16_t*>(in[0]->data);
  else a.x = static_cast<const float*>(in[0]->data);
  a.ldx = k.K;
  fill_weights(in, a);
  out->out_dims = in[0]->dims;
  out->out_dims.back() = k.gated ? k.N / 2 : k.N;
  OrtValue* y = nullptr;
  if (OrtStatus* st = g_ort.KernelContext_GetOutput(ctx, 0, out->out_dims.data(), out->out_dims.size(), &y)) return st;
  void* y_data = nullptr;
  if (OrtStatus* st = g_ort.GetTensorMutableData(y, &y_data)) return st;
  if (half) out->y16 = static_cast<uint16_t*>(y_data);
  else a.y = static_cast<float*>(y_data);
  if (k.top) {
    if (half || k.gated)
      return make_status(kOrtInvalidArgument, "edge.QMatMul: output 2 (each row's argmax and maximum) needs "
                                              "float32 X and no activation");
    std::vector<int64_t> top_dims = in[0]->dims;
    top_dims.back() = 2;
    OrtValue* top = nullptr;
    if (OrtStatus* st = g_ort.KernelContext_GetOutput(ctx, 2, top_dims.data(), top_dims.size(), &top)) return st;
    void* top_data = nullptr;
    if (OrtStatus* st = g_ort.GetTensorMutableData(top, &top_data)) return st;
    out->top = static_cast<float*>(top_data);
  }
  if (k.norm) {
    out->norm_weight = static_cast<const float*>(in[13]->data);
    if (in[12]->value != nullptr) {  // then the node has output 1: X + skip, the residual stream going on
      out->skip = static_cast<const float*>(in[12]->data);
      size_t outputs = 0;
      if (OrtStatus* st = g_ort.KernelContext_GetOutputCount(ctx, &outputs)) return st;
      if (outputs < 2)
        return make_status(kOrtInvalidArgument, "edge.QMatMul: with input 'skip' the node needs output 1 (X + skip)");
      OrtValue* sum = nullptr;
      if (OrtStatus* st = g_ort.KernelContext_GetOutput(ctx, 1, in[0]->dims.data(), in[0]->dims.size(), &sum))
        return st;
      void* sum_data = nullptr;
      if (OrtStatus* st = g_ort.GetTensorMutableData(sum, &sum_data)) return st;
      out->sum = static_cast<float*>(sum_data);
    }
  }
  return nullptr;
}

std::string validate_stat_rows_host(const QMatMulArgs& a) {
  for (int64_t i = 0; a.stat_rows != nullptr && i < a.tiles * 2; ++i)
    if (a.stat_rows[i] < 0 || a.stat_rows[i] >= a.stat_row_count)
      return "stat_rows[" + std::to_string(i) + "] = " + std::to_string(a.stat_rows[i]) + " is outside [0, " +
             std::to_string(a.stat_row_count) + ") (the rows of scale_stats)";
  return "";
}

std::string validate_outliers_host(const QMatMulArgs& a) {
  if (a.outlier_rowptr == nullptr) return "";
  const int32_t* rp = a.outlier_rowptr;
  if (rp[0] != 0) return "outlier_row_ptr must start at 0";
  for (int64_t n = 0; n < a.N; ++n)
    if (rp[n + 1] < rp[n]) return "outlier_row_ptr must not decrease (at row " + std::to_string(n) + ")";
  const int64_t nnz = a.outlier_nnz;
  if (rp[a.N] != nnz) return "outlier_row_ptr must end at the number of outliers (" + std::to_string(nnz) + ")";
  for (int64_t e = 0; e < nnz; ++e)
    if (a.outlier_cols[e] < 0 || a.outlier_cols[e] >= a.K)
      return "outlier column " + std::to_string(a.outlier_cols[e]) + " is outside [0, K)";
  return "";
}

}  // namespace edge
