// Constant weights copied into memory backed by 2 MB pages (Linux transparent huge pages).
//
// Why: onnxruntime maps each external-data initializer from the file in 4 KB pages, and a decoder step streams all
// of them (83 MB for the int4 SmolLM2), so every 4 KB of weights costs the kernels a TLB miss and a page walk.
// Measured on a Zen 4 (session 32, one thread, SmolLM2's int4 weights streamed from memory): 5-18% less time per
// call at 1 row and 17-23% at 8 rows with the same weights in 2 MB pages; the whole default model's steps 3-12%
// faster at 1-16 tokens, depending on the minute (`benchmarks/step_ab.py --paired`).
//
// The copy replaces the original in the kernel's view, and the original's pages are handed back to the system
// (MADV_PAGEOUT: file pages are dropped, to be read again from the file if anything else touches them; anonymous
// pages without swap stay), so the resident size stays about what it was. Two kernels asking for the same bytes
// (a second session over the same package: a self-draft, a layer-skip draft) share one copy.
#pragma once

#include <cstddef>
#include <cstdint>

namespace edge {

// A read-only copy of src[0, bytes) in 2 MB pages, or nullptr where there is none to be had: not Linux, huge pages
// off in the kernel (/sys/kernel/mm/transparent_hugepage/enabled "never"), EDGE_HUGE_PAGES=0, fewer than
// kHugeCopyMinBytes bytes, src not in a memory-mapped file (onnxruntime's own heap: an inline initializer), or no
// memory. Every copy returned is released once with release_huge_copy.
const void* huge_copy(const void* src, size_t bytes);
void release_huge_copy(const void* copy);

constexpr size_t kHugeCopyMinBytes = 16 * 1024;  // smaller tensors sit in a few pages anyway

// What the process holds (for tests): distinct copies, their bytes, references to them, and 2 MB-aligned blocks.
struct HugeCopyStats {
  int64_t copies, bytes, references, blocks;
};
HugeCopyStats huge_copy_stats();

}  // namespace edge
