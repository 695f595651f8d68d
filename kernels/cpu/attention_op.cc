// edge.Attention's inputs, checks and work split. Inputs and outputs are GroupQueryAttention's, in its order, so
// the exporter swaps the op type and keeps the wiring (attributes num_heads, kv_num_heads, scale, local_window_size;
// do_rotary must be 1, rotary halves not interleaved, no softcap):
//   0 query  float32 (1, S, (H + 2 KV) D) packed, or (1, S, H D) with 1 key and 2 value (1, S, KV D)
//   3 past_key, 4 past_value  float32, or both float16 (1, KV, L, D)   5 seqlens_k int32 (1,) = P + S - 1
//   6 total_sequence_length int32 scalar = P + S      7 cos_cache, 8 sin_cache float32 (positions, D / 2)
//   9 position_ids int64 (1, S)                        10 attention_bias float32 (1, 1, S, P + S), optional
//   11 q_norm, 12 k_norm float32 (head_dim,), optional, together (attribute qk_norm_epsilon, default 1e-6): each
//   head's query and key RMS-normalised before the rotary embedding (Gemma 3); not in GroupQueryAttention
// Outputs: 0 (1, S, H D); 1 present_key, 2 present_value (1, KV, L, D): the past buffers themselves when the caller
// binds them so (the runtime's in-place cache), else a copy of the past with the new rows written at P .. P+S-1.
#include "attention_op.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include "attention.h"
#include "ort_api.h"

namespace edge {

namespace {

constexpr size_t kInputs = kAttentionInputs;

int input_type(const OrtCustomOp*, size_t index) {
  switch (index) {
    case 5: case 6: return kOrtInt32;
    case 9: return kOrtInt64;
    default: return kOrtFloat;
  }
}
// The registration for a float16 KV cache: past and present in half, everything else as above.
int input_type_half_cache(const OrtCustomOp* op, size_t index) {
  return index == 3 || index == 4 ? kOrtFloat16 : input_type(op, index);
}
int output_type_half_cache(const OrtCustomOp*, size_t index) { return index == 0 ? kOrtFloat : kOrtFloat16; }
size_t input_count(const OrtCustomOp*) { return kInputs; }
size_t output_count(const OrtCustomOp*) { return 3; }
int input_characteristic(const OrtCustomOp*, size_t index) {
  return index == 1 || index == 2 || index >= 10 ? kOrtOptional : kOrtRequired;
}
const char* cpu_provider(const OrtCustomOp*) { return nullptr; }

OrtStatus* error(const std::string& what) { return make_status(kOrtInvalidArgument, "edge.Attention: " + what); }

// An optional attribute: `fallback` when absent.
template <typename T, typename Get>
T optional_attr(Get get, const OrtKernelInfo* info, const char* name, T fallback) {
  T value = fallback;
  if (OrtStatus* st = get(info, name, &value)) {
    g_ort.ReleaseStatus(st);
    return fallback;
  }
  return value;
}

}  // namespace

OrtStatus* create_attention_kernel(const OrtCustomOp*, const OrtApi*, const OrtKernelInfo* info, void** kernel) {
  auto* k = new AttentionKernel();
  k->H = optional_attr<int64_t>(g_ort.KernelInfoGetAttribute_int64, info, "num_heads", 0);
  k->KV = optional_attr<int64_t>(g_ort.KernelInfoGetAttribute_int64, info, "kv_num_heads", 0);
  k->scale = optional_attr<float>(g_ort.KernelInfoGetAttribute_float, info, "scale", 0.0f);
  const int64_t rotary = optional_attr<int64_t>(g_ort.KernelInfoGetAttribute_int64, info, "do_rotary", 1);
  const int64_t window = optional_attr<int64_t>(g_ort.KernelInfoGetAttribute_int64, info, "local_window_size", -1);
  const float softcap = optional_attr<float>(g_ort.KernelInfoGetAttribute_float, info, "softcap", 0.0f);
  const int64_t interleaved = optional_attr<int64_t>(g_ort.KernelInfoGetAttribute_int64, info, "rotary_interleaved", 0);
  std::string err;
  if (k->H <= 0 || k->KV <= 0 || k->H % k->KV != 0)
    err = "num_heads and kv_num_heads must be positive, num_heads a multiple of kv_num_heads";
  else if (rotary != 1 || interleaved != 0) err = "only do_rotary=1 with rotary_interleaved=0 is implemented";
  else if (softcap != 0.0f) err = "softcap is not implemented; export with GroupQueryAttention";
  if (!err.empty()) {
    delete k;
    return error(err);
  }
  k->window = window > 0 ? window : 0;
  k->norm_eps = optional_attr<float>(g_ort.KernelInfoGetAttribute_float, info, "qk_norm_epsilon", 1e-6f);
  *kernel = k;
  return nullptr;
}

void destroy_attention_kernel(void* kernel) { delete static_cast<AttentionKernel*>(kernel); }

namespace {

std::string shape_text(const std::vector<int64_t>& dims) {
  std::string out = "(";
  for (size_t i = 0; i < dims.size(); ++i) out += (i ? ", " : "") + std::to_string(dims[i]);
  return out + ")";
}

// Check the inputs against each other and fill everything but the cache and output pointers. position_ids are
// range-checked only when they are in host memory (the CUDA kernel clamps them instead).
std::string bind(const AttentionKernel& k, const TensorView* in, AttentionArgs& a, bool host_positions) {
  for (size_t i : {0, 7, 8})
    if (in[i].type != kOrtFloat) return "input " + std::to_string(i) + " must be float32";
  if (in[3].type != in[4].type || (in[3].type != kOrtFloat && in[3].type != kOrtFloat16))
    return "past_key and past_value must both be float32 or both float16";
  if (in[5].type != kOrtInt32 || in[6].type != kOrtInt32) return "seqlens_k and total_sequence_length must be int32";
  if (in[9].type != kOrtInt64) return "position_ids must be int64";
  const TensorView& past = in[3];
  if (past.dims.size() != 4 || past.dims[0] != 1 || past.dims[1] != k.KV || in[4].dims != past.dims)
    return "past_key and past_value must both be (1, kv_num_heads, L, head_dim), got " + shape_text(past.dims);
  a.H = k.H;
  a.KV = k.KV;
  a.L = past.dims[2];
  a.D = past.dims[3];
  if (a.D % 2 != 0) return "head_dim must be even for rotary embedding";
  const TensorView& q = in[0];
  if (q.dims.size() != 3 || q.dims[0] != 1) return "query must be (1, S, hidden), batch 1, got " + shape_text(q.dims);
  a.S = q.dims[1];
  const bool packed = in[1].value == nullptr;
  if (packed != (in[2].value == nullptr)) return "key and value must be given together (or both packed in query)";
  const int64_t q_width = packed ? (a.H + 2 * a.KV) * a.D : a.H * a.D;
  if (q.dims[2] != q_width) return "query's last dimension must be " + std::to_string(q_width) + ", got " + shape_text(q.dims);
  a.q = static_cast<const float*>(q.data);
  a.q_stride = q_width;
  if (packed) {
    a.k = a.q + a.H * a.D;
    a.v = a.k + a.KV * a.D;
    a.kv_stride = q_width;
  } else {
    const std::vector<int64_t> want{1, a.S, a.KV * a.D};
    if (in[1].dims != want || in[2].dims != want) return "key and value must be " + shape_text(want);
    if (in[1].type != kOrtFloat || in[2].type != kOrtFloat) return "key and value must be float32";
    a.k = static_cast<const float*>(in[1].data);
    a.v = static_cast<const float*>(in[2].data);
    a.kv_stride = a.KV * a.D;
  }
  if (in[6].count != 1 || in[5].count != 1) return "seqlens_k and total_sequence_length must hold one value (batch 1)";
  const int64_t total = *static_cast<const int32_t*>(in[6].data);
  if (*static_cast<const int32_t*>(in[5].data) != total - 1) return "seqlens_k must be total_sequence_length - 1";
  a.P = total - a.S;
  if (a.P < 0 || total > a.L)
    return "total_sequence_length " + std::to_string(total) + " must be in [S, L] for S=" + std::to_string(a.S) +
           " new rows and a cache of L=" + std::to_string(a.L);
  if (in[7].dims.size() != 2 || in[7].dims[1] != a.D / 2 || in[8].dims != in[7].dims)
    return "cos_cache and sin_cache must be (positions, head_dim / 2), got " + shape_text(in[7].dims);
  a.cos = static_cast<const float*>(in[7].data);
  a.sin = static_cast<const float*>(in[8].data);
  a.rope_rows = in[7].dims[0];
  if (in[9].count != a.S) return "position_ids must hold S=" + std::to_string(a.S) + " positions";
  a.positions = static_cast<const int64_t*>(in[9].data);
  for (int64_t s = 0; host_positions && s < a.S; ++s)
    if (a.positions[s] < 0 || a.positions[s] >= a.rope_rows)
      return "position " + std::to_string(a.positions[s]) + " is outside the rotary cache of " +
             std::to_string(a.rope_rows);
  if (in[10].value != nullptr) {
    if (in[10].type != kOrtFloat || in[10].count != a.S * total)
      return "attention_bias must be float32 (1, 1, S, total_sequence_length)";
    a.bias = static_cast<const float*>(in[10].data);
  }
  if ((in[11].value == nullptr) != (in[12].value == nullptr)) return "q_norm and k_norm must be given together";
  if (in[11].value != nullptr) {
    if (in[11].type != kOrtFloat || in[12].type != kOrtFloat || in[11].count != a.D || in[12].count != a.D)
      return "q_norm and k_norm must be float32 (head_dim,) weights";
    a.q_norm = static_cast<const float*>(in[11].data);
    a.k_norm = static_cast<const float*>(in[12].data);
    a.norm_eps = k.norm_eps;
  }
  a.scale = k.scale != 0.0f ? k.scale : 1.0f / std::sqrt(static_cast<float>(a.D));
  a.window = k.window;
  return "";
}

}  // namespace

OrtStatus* prepare_attention(const AttentionKernel& k, OrtKernelContext* ctx, TensorView* in, AttentionArgs& a,
                             bool host_positions) {
  size_t count = 0;
  if (OrtStatus* st = g_ort.KernelContext_GetInputCount(ctx, &count)) return st;
  for (size_t i = 0; i < kInputs; ++i)
    if (OrtStatus* st = view_input(ctx, i, count, &in[i])) return st;
  if (std::string err = bind(k, in, a, host_positions); !err.empty()) return error(err);
  const int64_t out_dims[3] = {1, a.S, a.H * a.D};
  OrtValue* out = nullptr;
  if (OrtStatus* st = g_ort.KernelContext_GetOutput(ctx, 0, out_dims, 3, &out)) return st;
  void* data = nullptr;
  if (OrtStatus* st = g_ort.GetTensorMutableData(out, &data)) return st;
  a.out = static_cast<float*>(data);
  void* present[2] = {nullptr, nullptr};
  for (int i = 0; i < 2; ++i) {
    OrtValue* value = nullptr;
    if (OrtStatus* st = g_ort.KernelContext_GetOutput(ctx, 1 + i, in[3].dims.data(), 4, &value)) return st;
    if (OrtStatus* st = g_ort.GetTensorMutableData(value, &present[i])) return st;
  }
  if (in[3].type == kOrtFloat16) {
    a.kcache16 = static_cast<uint16_t*>(present[0]);
    a.vcache16 = static_cast<uint16_t*>(present[1]);
  } else {
    a.kcache = static_cast<float*>(present[0]);
    a.vcache = static_cast<float*>(present[1]);
  }
  return nullptr;
}

CustomOpSpec attention_spec(const char* (*provider)(const OrtCustomOp*), OrtStatus* (*compute)(void*, OrtKernelContext*),
                            void (*compute_v1)(void*, OrtKernelContext*), int (*input_memory)(const OrtCustomOp*, size_t),
                            bool half_cache) {
  return {[](const OrtCustomOp*) { return "Attention"; }, provider, half_cache ? input_type_half_cache : input_type,
          input_count, output_count, input_characteristic, create_attention_kernel, destroy_attention_kernel, compute,
          compute_v1, input_memory, half_cache ? output_type_half_cache : nullptr};
}

namespace {

// present = past with the S new rows (keys rotated) written at P .. P+S-1. A half cache gets each row rounded to
// nearest even (NarrowFn), the same bits whichever kernel reads it and however many rows the call writes.
template <class T>
void write_cache(const TensorView* in, AttentionArgs& a) {
  T* present[2] = {cache_of<T>(a, false), cache_of<T>(a, true)};
  for (int i = 0; i < 2; ++i) {
    const auto* past = static_cast<const T*>(in[3 + i].data);
    if (present[i] != past)  // not bound in place: carry the past over
      for (int64_t g = 0; g < a.KV; ++g)
        std::memcpy(present[i] + g * a.L * a.D, past + g * a.L * a.D, sizeof(T) * a.P * a.D);
  }
  const int64_t half = a.D / 2;
  for (int64_t s = 0; s < a.S; ++s) {
    const int64_t pos = a.positions[s];
    for (int64_t g = 0; g < a.KV; ++g) {
      const int64_t row = (g * a.L + a.P + s) * a.D;
      const float* key = a.k + s * a.kv_stride + g * a.D;
      const float* value = a.v + s * a.kv_stride + g * a.D;
      if constexpr (std::is_same_v<T, float>) {
        rotate_head(key, a.k_norm, a.norm_eps, a.D, a.cos + pos * half, a.sin + pos * half, present[0] + row);
        std::memcpy(present[1] + row, value, sizeof(float) * a.D);
      } else {
        static const NarrowFn narrow = select_narrow_fn();
        thread_local std::vector<float> rotated;
        rotated.resize(static_cast<size_t>(a.D));
        rotate_head(key, a.k_norm, a.norm_eps, a.D, a.cos + pos * half, a.sin + pos * half, rotated.data());
        narrow(rotated.data(), a.D, present[0] + row);
        narrow(value, a.D, present[1] + row);
      }
    }
  }
}

constexpr int64_t kFewTasks = 4;  // calls with at most this many tasks split them into halves of the keys

struct Job {
  const AttentionArgs* args;
  AttendFn fn;
  int64_t rows;  // rows per task
  int64_t halves;  // 2 when some row is split (first_half), else 1
  bool half_tasks;  // each half a task of its own (a call with few tasks), else a task attends both in turn
  float* second;  // (S, H * D): the second halves' outputs, merged into args->out after
  int64_t tasks, chunks;
};

// Whether some row of the call is split into two halves of its keys (first_half).
bool splits_rows(const AttentionArgs& a) {
  for (int64_t s = 0; s < a.S; ++s) {
    int64_t n = 0;
    const int64_t first = visible_keys(a, s, n);
    if (first_half(a, s, first, n) < n) return true;
  }
  return false;
}

// out = the two halves' outputs weighted by their share of the row's softmax, for every split row: each half was
// normalised by its own sum against its own maximum. The same operations for a row whatever shares the call.
void merge_halves(const AttentionArgs& a, const float* second, const float* stats, int64_t s0, int64_t s1, int64_t h0,
                  int64_t h1) {
  for (int64_t s = s0; s < s1; ++s) {
    int64_t n = 0;
    const int64_t first = visible_keys(a, s, n);
    if (first_half(a, s, first, n) == n) continue;
    for (int64_t h = h0; h < h1; ++h) {
      const float* one = stats + (s * a.H + h) * 2;
      const float* two = stats + ((a.S + s) * a.H + h) * 2;
      const float top = std::max(one[0], two[0]);
      const float w1 = one[1] * std::exp(one[0] - top), w2 = two[1] * std::exp(two[0] - top);
      const float inv = 1.0f / (w1 + w2), c1 = w1 * inv, c2 = w2 * inv;
      float* out = a.out + s * a.H * a.D + h * a.D;
      const float* other = second + s * a.H * a.D + h * a.D;
      for (int64_t d = 0; d < a.D; ++d) out[d] = out[d] * c1 + other[d] * c2;
    }
  }
}

// Rows per task: as many as keep ~6 tasks for the threads to share (a task's rows read each block of the kv head's
// cache once between them), at most kMaxTaskRows. Which rows share a task changes no result.
// Where rows are split into halves of their keys (a past of kSplitKeys and more), all the rows (up to kMaxTaskRows,
// else evenly in as few blocks) share a task, and with a kv head or two per block of rows each half becomes a task
// of its own, as in a 1-token step: every half of a kv head's cache is then read once a layer, for all the rows.
// Before, a 2- or 4-token step at such a past gave each task one or two rows, and the cache was read from memory
// once per task: paired (`python benchmarks/step_ab.py OLD NEW --paired --pairs 60`, session 41), at a 1,400-token
// past the 2-, 4-, 6- and 8-token steps took 7.7, 7.9, 5.6 and 4.2% longer than now, at 500 tokens 3-4%.
int64_t rows_per_task(const AttentionArgs& a, bool halves) {
  if (halves) {
    const int64_t blocks = (a.S + kMaxTaskRows - 1) / kMaxTaskRows;
    return (a.S + blocks - 1) / blocks;
  }
  const int64_t per_row = a.KV * task_blocks(a);
  return std::clamp<int64_t>((a.S * per_row + 5) / 6, 1, kMaxTaskRows);
}

// Contiguous ranges of tasks (a block of rows and a block of heads of one kv group); a task's result never depends
// on which thread runs it. Tasks are numbered kv head first: the rows that read one kv head's keys and values run
// back to back, so a verify step reads each layer's cache from memory about once rather than once per row.
void run_chunk(void* user, size_t index) {
  const auto* job = static_cast<const Job*>(user);
  const AttentionArgs& a = *job->args;
  const int64_t heads = heads_per_task(a), group = a.H / a.KV, blocks = task_blocks(a);
  const int64_t row_blocks = (a.S + job->rows - 1) / job->rows;
  thread_local std::vector<float> scores;
  scores.resize(static_cast<size_t>(job->rows * heads * (a.P + a.S)));
  const int64_t i = static_cast<int64_t>(index);
  AttentionArgs half = a;
  const int64_t per_task = job->half_tasks ? 1 : job->halves;
  for (int64_t task = job->tasks * i / job->chunks; task < job->tasks * (i + 1) / job->chunks; ++task) {
    const int64_t t = task / (job->halves / per_task), first = job->half_tasks ? task % job->halves : 0;
    const int64_t g = t / (row_blocks * blocks), s0 = t / blocks % row_blocks * job->rows;
    const int64_t h0 = g * group + t % blocks * heads;
    const int64_t s1 = std::min(s0 + job->rows, a.S), count = std::min(heads, g * group + group - h0);
    for (half.key_half = first; half.key_half < first + per_task; ++half.key_half) {
      half.out = half.key_half == 0 ? a.out : job->second;
      job->fn(half, s0, s1, h0, count, scores.data());
    }
    if (per_task == 2) merge_halves(a, job->second, a.half_stats, s0, s1, h0, h0 + count);
  }
}

OrtStatus* compute(void* kernel, OrtKernelContext* ctx) {
  TensorView in[kInputs];
  AttentionArgs a;
  if (OrtStatus* st = prepare_attention(*static_cast<const AttentionKernel*>(kernel), ctx, in, a, true)) return st;
  if (a.kcache16 != nullptr) write_cache<uint16_t>(in, a);
  else write_cache<float>(in, a);
  if (a.S == 0) return nullptr;
  const int64_t halves = splits_rows(a) ? 2 : 1;
  const int64_t rows = rows_per_task(a, halves == 2);
  thread_local std::vector<float> second, stats;
  if (halves == 2) {
    second.resize(static_cast<size_t>(a.S * a.H * a.D));
    stats.resize(static_cast<size_t>(2 * a.S * a.H * 2));
    a.half_stats = stats.data();
  }
  const int64_t tasks = (a.S + rows - 1) / rows * a.KV * task_blocks(a);
  // A 1-token step has a task per kv head (3 for SmolLM2, 2 + 1 for two threads): its halves become tasks. Calls
  // with more tasks keep them whole, as the halves' extra tasks and merges cost more than they balance (a 9-token
  // step 1-4% slower at a 200-400-token past, measured with every half a task).
  const bool half_tasks = halves == 2 && tasks <= kFewTasks;
  Job job{&a, select_attend_fn(a.D), rows, halves, half_tasks, second.data(), half_tasks ? tasks * 2 : tasks, 1};
  const int64_t work = a.H * a.S * (a.P + a.S) * a.D;  // multiply-adds of the scores
  if (work >= (int64_t{1} << 15)) job.chunks = std::min<int64_t>(job.tasks, 64);
  if (job.chunks == 1) {
    run_chunk(&job, 0);
  } else if (OrtStatus* st = parallel_for(ctx, run_chunk, static_cast<size_t>(job.chunks), &job)) {
    return st;
  }
  if (half_tasks) merge_halves(a, second.data(), stats.data(), 0, a.S, 0, a.H);
  return nullptr;
}

// ORT keeps the pointer for the life of every session.
OrtCustomOp g_op = make_custom_op(attention_spec(cpu_provider, compute, compute_v1<compute>, nullptr, false));
OrtCustomOp g_op_half_cache = make_custom_op(attention_spec(cpu_provider, compute, compute_v1<compute>, nullptr, true));

}  // namespace

const OrtCustomOp* cpu_attention_op(bool half_cache) { return half_cache ? &g_op_half_cache : &g_op; }

}  // namespace edge
