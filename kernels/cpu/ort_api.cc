// Binding of the OrtApi slots we use, and the registration self-check that proves the binding right.
#include "ort_api.h"

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include "team.h"

namespace edge {

OrtApiFns g_ort{};

namespace {

// The slot a debug run wants to corrupt (-1: none). Only tests set it, to check that self_check() catches it.
int corrupt_slot() {
  const char* value = std::getenv("EDGE_KERNELS_DEBUG_CORRUPT_SLOT");
  if (value == nullptr || *value == '\0') return -1;
  return std::atoi(value);
}

template <typename Fn>
void bind(Fn& out, void* const* table, int slot, int corrupt) {
  out = reinterpret_cast<Fn>(table[slot == corrupt ? slot + 1 : slot]);
}

}  // namespace

bool bind_api(const OrtApi* api) {
  if (api == nullptr) return false;
  // One runtime per process hands out one table: bind once, so sessions already computing never see a rewrite.
  static std::mutex mutex;
  static const OrtApi* bound = nullptr;
  std::lock_guard<std::mutex> lock(mutex);
  if (bound == api) return true;
  bound = api;
  void* const* t = reinterpret_cast<void* const*>(api);
  const int c = corrupt_slot();
  bind(g_ort.CreateStatus, t, kSlotCreateStatus, c);
  bind(g_ort.GetErrorCode, t, kSlotGetErrorCode, c);
  bind(g_ort.GetErrorMessage, t, kSlotGetErrorMessage, c);
  bind(g_ort.CreateCustomOpDomain, t, kSlotCreateCustomOpDomain, c);
  bind(g_ort.CustomOpDomain_Add, t, kSlotCustomOpDomainAdd, c);
  bind(g_ort.AddCustomOpDomain, t, kSlotAddCustomOpDomain, c);
  bind(g_ort.GetTensorMutableData, t, kSlotGetTensorMutableData, c);
  bind(g_ort.CreateTensorTypeAndShapeInfo, t, kSlotCreateTensorTypeAndShapeInfo, c);
  bind(g_ort.SetTensorElementType, t, kSlotSetTensorElementType, c);
  bind(g_ort.SetDimensions, t, kSlotSetDimensions, c);
  bind(g_ort.GetTensorElementType, t, kSlotGetTensorElementType, c);
  bind(g_ort.GetDimensionsCount, t, kSlotGetDimensionsCount, c);
  bind(g_ort.GetDimensions, t, kSlotGetDimensions, c);
  bind(g_ort.GetTensorShapeElementCount, t, kSlotGetTensorShapeElementCount, c);
  bind(g_ort.GetTensorTypeAndShape, t, kSlotGetTensorTypeAndShape, c);
  bind(g_ort.KernelInfoGetAttribute_float, t, kSlotKernelInfoGetAttributeFloat, c);
  bind(g_ort.KernelInfoGetAttribute_int64, t, kSlotKernelInfoGetAttributeInt64, c);
  bind(g_ort.KernelContext_GetInputCount, t, kSlotKernelContextGetInputCount, c);
  bind(g_ort.KernelContext_GetOutputCount, t, kSlotKernelContextGetOutputCount, c);
  bind(g_ort.KernelContext_GetInput, t, kSlotKernelContextGetInput, c);
  bind(g_ort.KernelContext_GetOutput, t, kSlotKernelContextGetOutput, c);
  bind(g_ort.ReleaseStatus, t, kSlotReleaseStatus, c);
  bind(g_ort.ReleaseTensorTypeAndShapeInfo, t, kSlotReleaseTensorTypeAndShapeInfo, c);
  bind(g_ort.ReleaseCustomOpDomain, t, kSlotReleaseCustomOpDomain, c);
  bind(g_ort.KernelContext_GetGPUComputeStream, t, kSlotKernelContextGetGPUComputeStream, c);
  bind(g_ort.KernelInfoGetConstantInput_tensor, t, kSlotKernelInfoGetConstantInputTensor, c);
  bind(g_ort.KernelContext_ParallelFor, t, kSlotKernelContextParallelFor, c);
  return true;
}

void bind_api_24(const OrtApi* api) {
  if (api == nullptr) return;  // older than onnxruntime 1.24: describe() keeps to the version-1 entries
  void* const* t = reinterpret_cast<void* const*>(api);
  bind(g_ort.GetTensorElementTypeAndShapeDataReference, t, kSlotGetTensorElementTypeAndShapeDataReference,
       corrupt_slot());
}

OrtStatus* make_status(int code, const std::string& msg) {
  return g_ort.CreateStatus(code, msg.empty() ? "edge kernels: unknown error" : msg.c_str());
}

namespace {

// Consume a status returned by a probed call: "" if it is success, else its message (or a note that it was garbage).
std::string status_text(OrtStatus* status, const char* what) {
  if (status == nullptr) return "";
  std::string msg = std::string(what) + " returned an error";
  const char* text = g_ort.GetErrorMessage(status);
  if (text != nullptr) msg += std::string(": ") + text;
  g_ort.ReleaseStatus(status);
  return msg;
}

std::string check_status_round_trip() {
  const char* probe = "edge-abi-probe";
  OrtStatus* status = g_ort.CreateStatus(kOrtRuntimeException, probe);
  if (status == nullptr) return "CreateStatus (slot 0) returned null";
  // Wide storage, so a wrong slot that writes more than an int cannot smash the stack.
  const int code = g_ort.GetErrorCode(status);
  const char* text = g_ort.GetErrorMessage(status);
  std::string err;
  if (code != kOrtRuntimeException)
    err = "GetErrorCode (slot 1) gave " + std::to_string(code) + " instead of " + std::to_string(kOrtRuntimeException);
  else if (text == nullptr || std::strcmp(text, probe) != 0)
    err = "GetErrorMessage (slot 2) did not return the probe text";
  g_ort.ReleaseStatus(status);
  return err;
}

std::string check_type_and_shape_round_trip() {
  OrtTensorTypeAndShapeInfo* info = nullptr;
  std::string err = status_text(g_ort.CreateTensorTypeAndShapeInfo(&info), "CreateTensorTypeAndShapeInfo (slot 57)");
  if (!err.empty()) return err;
  if (info == nullptr) return "CreateTensorTypeAndShapeInfo (slot 57) gave no object";
  const int64_t dims[3] = {2, 3, 5};
  int64_t type_out[2] = {-1, -1};
  uint64_t count_out[2] = {0, 0}, elements_out[2] = {0, 0};
  int64_t dims_out[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  err = status_text(g_ort.SetTensorElementType(info, kOrtFloat16), "SetTensorElementType (slot 58)");
  if (err.empty()) err = status_text(g_ort.SetDimensions(info, dims, 3), "SetDimensions (slot 59)");
  if (err.empty())
    err = status_text(g_ort.GetTensorElementType(info, reinterpret_cast<int*>(type_out)), "GetTensorElementType (slot 60)");
  if (err.empty() && static_cast<int>(type_out[0]) != kOrtFloat16)
    err = "GetTensorElementType (slot 60) gave " + std::to_string(static_cast<int>(type_out[0])) + " instead of 10";
  if (err.empty())
    err = status_text(g_ort.GetDimensionsCount(info, reinterpret_cast<size_t*>(count_out)), "GetDimensionsCount (slot 61)");
  if (err.empty() && count_out[0] != 3)
    err = "GetDimensionsCount (slot 61) gave " + std::to_string(count_out[0]) + " instead of 3";
  if (err.empty()) err = status_text(g_ort.GetDimensions(info, dims_out, 3), "GetDimensions (slot 62)");
  if (err.empty() && (dims_out[0] != 2 || dims_out[1] != 3 || dims_out[2] != 5))
    err = "GetDimensions (slot 62) did not return (2, 3, 5)";
  if (err.empty())
    err = status_text(g_ort.GetTensorShapeElementCount(info, reinterpret_cast<size_t*>(elements_out)),
                      "GetTensorShapeElementCount (slot 64)");
  if (err.empty() && elements_out[0] != 30)
    err = "GetTensorShapeElementCount (slot 64) gave " + std::to_string(elements_out[0]) + " instead of 30";
  g_ort.ReleaseTensorTypeAndShapeInfo(info);
  return err;
}

}  // namespace

std::string self_check() {
  std::string err = check_status_round_trip();
  if (err.empty()) err = check_type_and_shape_round_trip();
  return err;
}

namespace {

// Type, shape and element count through the version-1 entries: a type-and-shape object allocated, read and freed.
OrtStatus* describe_by_info(const OrtValue* value, TensorView* v) {
  OrtTensorTypeAndShapeInfo* info = nullptr;
  if (OrtStatus* st = g_ort.GetTensorTypeAndShape(value, &info)) return st;
  size_t rank = 0, count = 0;
  OrtStatus* st = g_ort.GetTensorElementType(info, &v->type);
  if (st == nullptr) st = g_ort.GetDimensionsCount(info, &rank);
  if (st == nullptr) {
    v->dims.assign(rank, 0);
    st = g_ort.GetDimensions(info, v->dims.data(), rank);
  }
  if (st == nullptr) st = g_ort.GetTensorShapeElementCount(info, &count);
  g_ort.ReleaseTensorTypeAndShapeInfo(info);
  v->count = static_cast<int64_t>(count);
  return st;
}

// The same through API 24's one call, which reads the value's own shape: no object to allocate and free.
OrtStatus* describe_by_reference(const OrtValue* value, TensorView* v) {
  const int64_t* dims = nullptr;
  size_t rank = 0;
  if (OrtStatus* st = g_ort.GetTensorElementTypeAndShapeDataReference(value, &v->type, &dims, &rank)) return st;
  v->dims.assign(dims, dims + rank);
  v->count = 1;
  for (int64_t d : v->dims) v->count *= d;
  return nullptr;
}

// Whether describe_by_reference may be used: 0 not yet known, 1 yes, -1 no (an older runtime, or an entry that
// disagreed with describe_by_info on the first tensor described, which the registration's self-check cannot test
// for want of a tensor). Each input view cost a QMatMul call ~1.5 us through the version-1 entries (session 35),
// and a whole-model 1- to 4-token step is 1-2% faster without them (session 36).
std::atomic<int> g_by_reference{0};

void check_by_reference(const OrtValue* value, const TensorView& known) {
  int verdict = -1;
  if (g_ort.GetTensorElementTypeAndShapeDataReference != nullptr) {
    TensorView v;
    OrtStatus* st = describe_by_reference(value, &v);
    if (st != nullptr) g_ort.ReleaseStatus(st);
    else if (v.type == known.type && v.dims == known.dims && v.count == known.count) verdict = 1;
  }
  g_by_reference.store(verdict, std::memory_order_relaxed);
}

OrtStatus* describe(const OrtValue* value, TensorView* v) {
  const int by_reference = g_by_reference.load(std::memory_order_relaxed);
  if (by_reference > 0) return describe_by_reference(value, v);
  if (OrtStatus* st = describe_by_info(value, v)) return st;
  if (by_reference == 0) check_by_reference(value, *v);
  return nullptr;
}

}  // namespace

OrtStatus* view_input(OrtKernelContext* ctx, size_t index, size_t count, TensorView* v) {
  if (index >= count) return nullptr;
  const OrtValue* value = nullptr;
  if (OrtStatus* st = g_ort.KernelContext_GetInput(ctx, index, &value)) return st;
  if (value == nullptr) return nullptr;
  v->value = const_cast<OrtValue*>(value);
  if (OrtStatus* st = describe(value, v)) return st;
  return g_ort.GetTensorMutableData(v->value, &v->data);
}

void view_constant(const OrtKernelInfo* info, size_t index, TensorView* v) {
  int constant = 0;
  const OrtValue* value = nullptr;
  OrtStatus* st = g_ort.KernelInfoGetConstantInput_tensor(info, index, &constant, &value);
  if (st == nullptr && constant && value != nullptr) {
    v->value = const_cast<OrtValue*>(value);
    st = describe(value, v);
    if (st == nullptr) st = g_ort.GetTensorMutableData(v->value, &v->data);
  }
  if (st != nullptr) {
    g_ort.ReleaseStatus(st);
    *v = TensorView();
  } else if (!constant || value == nullptr) {
    *v = TensorView();
  }
}

namespace {

int float_output(const OrtCustomOp*, size_t) { return kOrtFloat; }
int required(const OrtCustomOp*, size_t) { return kOrtRequired; }
int default_memory(const OrtCustomOp*, size_t) { return 0; }
int no_variadic(const OrtCustomOp*) { return 0; }

void* create_v1(const OrtCustomOp* op, const OrtApi* api, const OrtKernelInfo* info) {
  void* kernel = nullptr;
  if (OrtStatus* st = op->CreateKernelV2(op, api, info, &kernel)) g_ort.ReleaseStatus(st);
  return kernel;
}

}  // namespace

OrtCustomOp make_custom_op(const CustomOpSpec& spec) {
  OrtCustomOp op;
  std::memset(&op, 0, sizeof op);
  op.version = kEdgeOrtApiVersion;
  op.CreateKernel = create_v1;
  op.GetName = spec.name;
  op.GetExecutionProviderType = spec.provider;
  op.GetInputType = spec.input_type;
  op.GetInputTypeCount = spec.input_count;
  op.GetOutputType = spec.output_type != nullptr ? spec.output_type : float_output;
  op.GetOutputTypeCount = spec.output_count;
  op.KernelCompute = spec.compute_v1;
  op.KernelDestroy = spec.destroy;
  op.GetInputCharacteristic = spec.input_characteristic;
  op.GetOutputCharacteristic = spec.output_characteristic != nullptr ? spec.output_characteristic : required;
  op.GetInputMemoryType = spec.input_memory != nullptr ? spec.input_memory : default_memory;
  op.GetVariadicInputMinArity = no_variadic;
  op.GetVariadicInputHomogeneity = no_variadic;
  op.GetVariadicOutputMinArity = no_variadic;
  op.GetVariadicOutputHomogeneity = no_variadic;
  op.CreateKernelV2 = spec.create;
  op.KernelComputeV2 = spec.compute;
  return op;
}

OrtStatus* parallel_for(OrtKernelContext* ctx, void (*fn)(void*, size_t), size_t n, void* user) {
  if (team_parallel_for(fn, n, user)) return nullptr;
  return g_ort.KernelContext_ParallelFor(ctx, fn, n, 0, user);
}

}  // namespace edge

// How this process reads its tensors' shapes (ort_api.cc: describe): 1 through GetTensorElementTypeAndShapeDataReference,
// -1 through the version-1 entries, 0 not decided yet (no tensor described). For tests and diagnostics.
extern "C" __attribute__((visibility("default"))) int EdgeShapeEntry() {
  return edge::g_by_reference.load(std::memory_order_relaxed);
}
