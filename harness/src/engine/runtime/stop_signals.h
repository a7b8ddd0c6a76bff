#pragma once
// SIGINT and SIGTERM (Ctrl-C, scancel, a Slurm time limit) as a request to
// stop: the running run checkpoints and is recorded interrupted.
//
// Where the signal lands matters. oneDNN 2.6's JIT sgemm kernels (what
// `--gemm onednn` runs) point rsp into a heap workspace while they run, so a
// signal frame pushed on the interrupted thread's stack is written into the
// heap: a SIGTERM in the middle of a product aborted the process later with
// "corrupted size vs. prev_size" (oneDNN issue 4845, fixed upstream after
// the version Debian 12 ships). So the handler runs on a stack of its own
// (SA_ONSTACK), and the intra-op worker threads block both signals, which
// leaves the kernel only threads that have that stack or run no kernel.
#include <atomic>
#include <csignal>

namespace chiar::engine {

// While one lives, SIGINT and SIGTERM set stop_requested() instead of ending
// the process; the previous handlers come back when it ends. The flag is
// cleared when one is made.
class StopSignals {
 public:
  StopSignals();
  ~StopSignals();
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;

 private:
  struct sigaction old_int_ {
  }, old_term_{};
};

// Set by SIGINT or SIGTERM while a StopSignals lives.
std::atomic<bool>& stop_requested();

// Blocks SIGINT and SIGTERM in every thread of the OpenMP pool but the
// calling one, with the pool at `threads`: configure_threads calls it, since
// a larger pool brings new threads, which inherit the caller's open mask.
void keep_stop_signals_off_workers(int threads);

}  // namespace chiar::engine
