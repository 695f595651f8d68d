// The team (team.h): one job at a time, split into one contiguous share of its chunks per thread.
//
// A job is published by bumping `generation` after its fields are written; every worker acknowledges each
// generation (`finished`) before the caller returns, so no worker can read a job's fields after the caller has
// moved on to the next one. Idle workers spin for `spin_ns`, then sleep on a condition variable; the Dekker pair
// (a worker raising `sleepers` then re-reading `generation`, the caller bumping `generation` then reading
// `sleepers`, all sequentially consistent) makes sure a job is never published past a worker about to sleep.
#include "team.h"

#include <dlfcn.h>
#include <pthread.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <new>
#include <thread>

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#define EDGE_PAUSE() _mm_pause()
#else
#define EDGE_PAUSE() std::this_thread::yield()
#endif

namespace edge {

namespace {

using Clock = std::chrono::steady_clock;
constexpr int kMaxThreads = 64;

// Chunks [front, back) of one thread's share still unclaimed, packed in one word so that its owner (from the
// front) and a thief (from the back) claim with one compare-exchange each.
struct alignas(64) Share {
  std::atomic<uint64_t> range{0};
};

uint64_t pack(uint64_t front, uint64_t back) { return front | back << 32; }

struct Team {
  std::atomic<bool> busy{false};  // a caller owns the team
  alignas(64) std::atomic<uint64_t> generation{0};  // bumped once per published job
  std::atomic<int> sleepers{0};
  alignas(64) std::atomic<int> finished{0};  // workers done with this generation
  std::atomic<int> workers{0};
  std::atomic<int64_t> spin_ns{0};
  std::atomic<int64_t> jobs{0};  // jobs run (EdgeTeamStats: the tests check the team really ran)
  ChunkFn fn = nullptr;
  void* user = nullptr;
  Share shares[kMaxThreads];
  std::mutex mutex;
  std::condition_variable wake;
};

// Leaked on purpose: workers may still be asleep in it at exit, and a static destructor must not pull it away.
Team* g_team = new Team;
std::mutex g_start;  // serialises EdgeTeamStart

// Claims the front (owner) or back (thief) chunk of a share; false when it is empty.
bool claim(Share& s, bool owner, size_t* chunk) {
  uint64_t r = s.range.load(std::memory_order_relaxed);
  for (;;) {
    const uint64_t front = r & 0xFFFFFFFFu, back = r >> 32;
    if (front >= back) return false;
    const uint64_t next = owner ? pack(front + 1, back) : pack(front, back - 1);
    if (s.range.compare_exchange_weak(r, next, std::memory_order_relaxed)) {
      *chunk = owner ? front : back - 1;
      return true;
    }
  }
}

// Thread `member` runs its own contiguous share of the chunks in order, then takes what is left of the others'
// shares from their ends. Contiguous shares matter: a thread whose chunks follow one another in memory keeps its
// prefetch stream running from one chunk into the next (chunks handed out one by one in turn made a chain of
// 576x576 QMatMuls 12% slower than onnxruntime's split, contiguous shares 13% faster); taking from the ends evens
// out chunks of unequal cost (attention's) and a worker that woke late.
void run_share(Team& t, int member, int members) {
  size_t chunk;
  while (claim(t.shares[member], true, &chunk)) t.fn(t.user, chunk);
  for (int k = 1; k < members; ++k)
    while (claim(t.shares[(member + k) % members], false, &chunk)) t.fn(t.user, chunk);
}

// Waits for a generation other than `seen`: spinning first, then asleep.
uint64_t await_job(Team& t, uint64_t seen) {
  const auto deadline = Clock::now() + std::chrono::nanoseconds(t.spin_ns.load(std::memory_order_relaxed));
  for (unsigned spins = 0;; ++spins) {
    const uint64_t g = t.generation.load(std::memory_order_acquire);
    if (g != seen) return g;
    EDGE_PAUSE();
    if ((spins & 255) == 255 && Clock::now() >= deadline) break;
  }
  std::unique_lock<std::mutex> lock(t.mutex);
  t.sleepers.fetch_add(1, std::memory_order_seq_cst);
  uint64_t g;
  while ((g = t.generation.load(std::memory_order_seq_cst)) == seen) t.wake.wait(lock);
  t.sleepers.fetch_sub(1, std::memory_order_relaxed);
  return g;
}

void work(Team* t, int member, uint64_t seen) {
  for (;;) {
    seen = await_job(*t, seen);
    run_share(*t, member, t->workers.load(std::memory_order_relaxed) + 1);
    t->finished.fetch_add(1, std::memory_order_acq_rel);
  }
}

// A forked child has the parent's memory but none of its threads: it starts with the team off.
void after_fork_in_child() {
  g_team = new Team;
  new (&g_start) std::mutex;
}

}  // namespace

int team_members() { return g_team->workers.load(std::memory_order_relaxed) + 1; }

bool team_parallel_for(ChunkFn fn, size_t n, void* user) {
  Team& t = *g_team;
  if (t.workers.load(std::memory_order_relaxed) == 0 || n < 2 || n > 0xFFFFFFFFu) return false;
  if (t.busy.exchange(true, std::memory_order_acquire)) return false;
  const int workers = t.workers.load(std::memory_order_relaxed);  // read under `busy`: EdgeTeamStart adds under it
  t.fn = fn;
  t.user = user;
  const int members = workers + 1;
  for (int m = 0; m < members; ++m)
    t.shares[m].range.store(pack(n * m / members, n * (m + 1) / members), std::memory_order_relaxed);
  t.finished.store(0, std::memory_order_relaxed);
  t.generation.fetch_add(1, std::memory_order_seq_cst);
  if (t.sleepers.load(std::memory_order_seq_cst) > 0) {
    std::lock_guard<std::mutex> lock(t.mutex);
    t.wake.notify_all();
  }
  run_share(t, 0, members);
  while (t.finished.load(std::memory_order_acquire) < workers) EDGE_PAUSE();
  t.jobs.fetch_add(1, std::memory_order_relaxed);
  t.busy.store(false, std::memory_order_release);
  return true;
}

}  // namespace edge

// Workers are only ever added (a running team keeps its threads; a call asking for fewer changes only the spin):
// the runtime starts the team once per process with the thread count its sessions ask for.
extern "C" __attribute__((visibility("default"))) int EdgeTeamStart(int threads, int spin_us) {
  using namespace edge;
  static const bool fork_handler = pthread_atfork(nullptr, nullptr, after_fork_in_child) == 0;
  (void)fork_handler;
  std::lock_guard<std::mutex> lock(g_start);
  Team& t = *g_team;
  t.spin_ns.store(int64_t{std::max(spin_us, 0)} * 1000, std::memory_order_relaxed);
  const int wanted = std::min(threads, kMaxThreads) - 1, have = t.workers.load(std::memory_order_relaxed);
  if (wanted > have) {
    // Workers run this library's code until the process ends: pin it, so that a host unloading it (onnxruntime
    // when its last session using the library goes) cannot take the code from under them. (GCC's builds are pinned
    // anyway, by the STB_GNU_UNIQUE symbols libstdc++ puts in them: a dlclose test cannot tell the two apart.)
    Dl_info self;
    if (dladdr(reinterpret_cast<void*>(&EdgeTeamStart), &self) != 0 && self.dli_fname != nullptr)
      dlopen(self.dli_fname, RTLD_NOW | RTLD_NOLOAD | RTLD_NODELETE);
    while (t.busy.exchange(true, std::memory_order_acquire)) EDGE_PAUSE();  // no job runs while workers join
    const uint64_t seen = t.generation.load(std::memory_order_relaxed);
    for (int i = have; i < wanted; ++i) std::thread(work, &t, i + 1, seen).detach();
    t.workers.store(wanted, std::memory_order_relaxed);
    t.busy.store(false, std::memory_order_release);
  }
  return t.workers.load(std::memory_order_relaxed) + 1;
}

extern "C" __attribute__((visibility("default"))) void EdgeTeamStats(int64_t* out) {
  out[0] = edge::g_team->workers.load(std::memory_order_relaxed) + 1;
  out[1] = edge::g_team->jobs.load(std::memory_order_relaxed);
}
