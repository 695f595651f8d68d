// Constant weights in 2 MB pages (huge_pages.h): copies carved from 2 MB-aligned blocks of anonymous memory that
// the kernel is asked to back with huge pages, shared between kernels by content, freed with their last kernel.
#include "huge_pages.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <mutex>
#include <string>
#include <vector>

#if defined(__linux__)
#include <sys/mman.h>
#ifndef MADV_PAGEOUT
#define MADV_PAGEOUT 21  // Linux 5.4; older kernels reject it and the original pages simply stay
#endif
#endif

namespace edge {
namespace {

constexpr size_t kHugePage = size_t{2} << 20;
constexpr size_t kBlockBytes = size_t{32} << 20;  // the int4 default model's weights fill 3
constexpr size_t kAlign = 64;                     // each copy starts on a cache line

struct Block {
  char* base;
  size_t size, used;
  int64_t live;  // copies in it
};

struct Copy {
  const char* data;
  size_t bytes;
  uint64_t key;
  int64_t refs;
  Block* block;
};

// One mapping of /proc/self/maps: [lo, hi) and whether a file backs it.
struct Mapping {
  uintptr_t lo, hi;
  bool file;
};

struct Arena {
  std::mutex mu;
  std::vector<Block*> blocks;
  std::vector<Copy> copies;
  // /proc/self/maps as last read (sorted), and when: a session's kernels are made within a fraction of a second,
  // and reading the file costs ~1 ms (onnxruntime maps each initializer on its own: ~430 lines for SmolLM2).
  std::vector<Mapping> maps;
  std::chrono::steady_clock::time_point maps_read;
};

// Never destroyed: a session (and its kernels) may be released during interpreter shutdown, after statics.
Arena& arena() {
  static Arena* a = new Arena();
  return *a;
}

bool enabled() {
#if defined(__linux__)
  static const bool on = [] {
    const char* env = std::getenv("EDGE_HUGE_PAGES");
    if (env != nullptr && std::string(env) == "0") return false;
    std::ifstream f("/sys/kernel/mm/transparent_hugepage/enabled");
    std::string line;
    std::getline(f, line);
    return !line.empty() && line.find("[never]") == std::string::npos;
  }();
  return on;
#else
  return false;
#endif
}

// A cheap fingerprint (size and 65 sampled words) to find a copy of the same bytes; a match is confirmed by memcmp.
uint64_t fingerprint(const char* p, size_t n) {
  uint64_t h = 1469598103934665603ull ^ n;
  const auto mix = [&](size_t at) {
    uint64_t w = 0;
    std::memcpy(&w, p + at, 8);
    h = (h ^ w) * 1099511628211ull;
  };
  for (size_t i = 0; i < 64; ++i) mix((n - 8) / 64 * i);
  mix(n - 8);
  return h;
}

#if defined(__linux__)
Block* new_block(size_t need) {
  const size_t size = std::max(kBlockBytes, (need + kHugePage - 1) / kHugePage * kHugePage);
  void* raw = mmap(nullptr, size + kHugePage, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw == MAP_FAILED) return nullptr;
  char* start = static_cast<char*>(raw);
  char* base = reinterpret_cast<char*>((reinterpret_cast<uintptr_t>(start) + kHugePage - 1) & ~(kHugePage - 1));
  if (base > start) munmap(start, base - start);
  if (start + kHugePage > base) munmap(base + size, start + kHugePage - base);
  madvise(base, size, MADV_HUGEPAGE);  // a hint: without it the block is ordinary memory, still correct
  return new Block{base, size, 0, 0};
}

void read_maps(Arena& a) {
  a.maps.clear();
  std::ifstream maps("/proc/self/maps");
  std::string line;
  while (std::getline(maps, line)) {
    char* end = nullptr;
    const uintptr_t lo = std::strtoull(line.c_str(), &end, 16);
    if (end == nullptr || *end != '-') continue;
    a.maps.push_back(Mapping{lo, std::strtoull(end + 1, nullptr, 16), line.find(" /") != std::string::npos});
  }
  a.maps_read = std::chrono::steady_clock::now();
}

const Mapping* find_mapping(const Arena& a, uintptr_t at) {
  const auto it = std::upper_bound(a.maps.begin(), a.maps.end(), at,
                                   [](uintptr_t v, const Mapping& m) { return v < m.lo; });
  return it == a.maps.begin() || at >= std::prev(it)->hi ? nullptr : &*std::prev(it);
}

// Whether p lies in a mapping of a file (/proc/self/maps names a path for it): onnxruntime's memory map of the
// package's external data. Weights it holds in its own heap (a model with inline initializers) are not copied: their
// pages could not be handed back, and the copy would double them.
bool file_backed(Arena& a, const void* p) {
  const uintptr_t at = reinterpret_cast<uintptr_t>(p);
  const Mapping* m = find_mapping(a, at);
  if (m == nullptr || std::chrono::steady_clock::now() - a.maps_read > std::chrono::seconds(1)) {
    read_maps(a);
    m = find_mapping(a, at);
  }
  return m != nullptr && m->file;
}

// The source's whole pages, once copied: nothing reads them again (file pages return from the file if touched).
void page_out(const void* src, size_t bytes) {
  const uintptr_t first = (reinterpret_cast<uintptr_t>(src) + 4095) & ~uintptr_t{4095};
  const uintptr_t end = (reinterpret_cast<uintptr_t>(src) + bytes) & ~uintptr_t{4095};
  if (end > first) madvise(reinterpret_cast<void*>(first), end - first, MADV_PAGEOUT);
}
#endif

}  // namespace

const void* huge_copy(const void* src, size_t bytes) {
#if defined(__linux__)
  if (src == nullptr || bytes < kHugeCopyMinBytes || !enabled()) return nullptr;
  Arena& a = arena();
  std::lock_guard<std::mutex> lock(a.mu);
  if (!file_backed(a, src)) return nullptr;
  const char* from = static_cast<const char*>(src);
  const uint64_t key = fingerprint(from, bytes);
  for (Copy& c : a.copies) {
    if (c.key == key && c.bytes == bytes && std::memcmp(c.data, from, bytes) == 0) {
      ++c.refs;
      page_out(src, bytes);
      return c.data;
    }
  }
  const size_t need = (bytes + kAlign - 1) / kAlign * kAlign;
  Block* block = nullptr;
  for (Block* b : a.blocks)
    if (b->size - b->used >= need) block = b;
  if (block == nullptr) {
    block = new_block(need);
    if (block == nullptr) return nullptr;
    a.blocks.push_back(block);
  }
  char* out = block->base + block->used;
  block->used += need;
  ++block->live;
  std::memcpy(out, from, bytes);
  a.copies.push_back(Copy{out, bytes, key, 1, block});
  page_out(src, bytes);
  return out;
#else
  (void)src;
  (void)bytes;
  return nullptr;
#endif
}

void release_huge_copy(const void* copy) {
#if defined(__linux__)
  Arena& a = arena();
  std::lock_guard<std::mutex> lock(a.mu);
  const auto it = std::find_if(a.copies.begin(), a.copies.end(), [&](const Copy& c) { return c.data == copy; });
  if (it == a.copies.end() || --it->refs > 0) return;
  Block* block = it->block;
  a.copies.erase(it);
  if (--block->live > 0) return;
  munmap(block->base, block->size);
  a.blocks.erase(std::find(a.blocks.begin(), a.blocks.end(), block));
  delete block;
#else
  (void)copy;
#endif
}

HugeCopyStats huge_copy_stats() {
  Arena& a = arena();
  std::lock_guard<std::mutex> lock(a.mu);
  HugeCopyStats s{static_cast<int64_t>(a.copies.size()), 0, 0, static_cast<int64_t>(a.blocks.size())};
  for (const Copy& c : a.copies) {
    s.bytes += static_cast<int64_t>(c.bytes);
    s.references += c.refs;
  }
  return s;
}

}  // namespace edge
