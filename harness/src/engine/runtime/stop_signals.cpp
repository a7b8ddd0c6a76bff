#include "stop_signals.h"

#include <pthread.h>
#include <signal.h>

#include <vector>

namespace chiar::engine {
namespace {

std::atomic<bool> g_stop{false};

extern "C" void on_stop_signal(int) { g_stop.store(true); }

// An alternate stack for the calling thread, unless it has one (a
// sanitizer's, say). Kept for the life of the process: a handler may run on
// it until the last instruction.
void ensure_alternate_stack() {
  stack_t current{};
  if (sigaltstack(nullptr, &current) == 0 && !(current.ss_flags & SS_DISABLE)) return;
  static thread_local std::vector<char> memory;
  memory.resize(256 * 1024);  // the handler is tiny; the frame holds the AVX-512 state
  stack_t fresh{};
  fresh.ss_sp = memory.data();
  fresh.ss_size = memory.size();
  fresh.ss_flags = 0;
  sigaltstack(&fresh, nullptr);
}

sigset_t stop_set() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  return set;
}

}  // namespace

std::atomic<bool>& stop_requested() { return g_stop; }

StopSignals::StopSignals() {
  g_stop.store(false);
  ensure_alternate_stack();
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sa.sa_flags = SA_ONSTACK;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, &old_int_);
  sigaction(SIGTERM, &sa, &old_term_);
}

StopSignals::~StopSignals() {
  sigaction(SIGINT, &old_int_, nullptr);
  sigaction(SIGTERM, &old_term_, nullptr);
}

void keep_stop_signals_off_workers(int threads) {
  const pthread_t caller = pthread_self();
  const sigset_t set = stop_set();
  // One region of the whole pool: every thread of it runs the body once.
#pragma omp parallel num_threads(threads)
  {
    if (!pthread_equal(pthread_self(), caller)) pthread_sigmask(SIG_BLOCK, &set, nullptr);
  }
}

}  // namespace chiar::engine
