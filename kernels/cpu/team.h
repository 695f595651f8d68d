// The library's own worker threads, used in place of onnxruntime's parallel-for when the runtime starts them.
//
// Why: a decode step of the default model makes ~150 split calls (121 QMatMul, 30 Attention) of a few to a few
// tens of microseconds each. onnxruntime's KernelContext_ParallelFor costs ~1-1.5 us a call and hands chunks out
// one by one, so each thread's chunks lie apart in memory and every chunk starts its prefetch stream cold. The
// team hands a call over in ~0.4 us (one shared generation counter its idle workers spin on) and gives each
// thread a contiguous share. The runtime starts it (EdgeTeamStart) and runs its sessions at one onnxruntime
// thread, so the team's workers are the only ones spinning on the cores; a process that never starts it runs
// every op on onnxruntime's threads.
#pragma once

#include <cstddef>
#include <cstdint>

namespace edge {

using ChunkFn = void (*)(void* user, size_t index);

// Runs fn(user, i) for every i in [0, n) on the calling thread and the team's workers; which thread runs a chunk
// never changes its result. Returns false, having run nothing, when the team is off or serving another caller
// (another thread's session): the caller then uses onnxruntime's parallel-for.
bool team_parallel_for(ChunkFn fn, size_t n, void* user);
// Threads a job would run on now (1: no team).
int team_members();

}  // namespace edge

// Exported for the runtime (ctypes). EdgeTeamStart: at least `threads` in all, the caller included (a running team
// never shrinks); an idle worker spins `spin_us` before it sleeps (0: sleeps at once). Returns the threads in use.
extern "C" __attribute__((visibility("default"))) int EdgeTeamStart(int threads, int spin_us);
// out[0]: threads in use (1: off), out[1]: jobs the team has run in this process.
extern "C" __attribute__((visibility("default"))) void EdgeTeamStats(int64_t* out);
