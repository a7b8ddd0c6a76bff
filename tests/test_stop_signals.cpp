// Where SIGINT and SIGTERM land (engine/runtime/stop_signals.h): never on an intra-op
// worker thread, and on the handler's own stack, so that a signal taken in
// the middle of a JIT product that points rsp into the heap writes its frame
// elsewhere. The process-level consequence (a run stopped at a random moment
// by kill -TERM, resumed, no heap corruption) is probabilistic; this checks
// the two conditions it rests on, deterministically.
#include <catch2/catch.hpp>
#include <pthread.h>
#include <signal.h>

#include <ATen/Parallel.h>
#include <omp.h>

#include <vector>

#include "engine/runtime/runtime.h"
#include "engine/runtime/stop_signals.h"

using namespace chiar;

TEST_CASE("stop signals: the pool's workers block SIGINT and SIGTERM; the calling thread takes them", "[faults]") {
  const int before = at::get_num_threads();
  engine::configure_threads(3);
  const pthread_t caller = pthread_self();
  std::vector<int> blocked(3, -1), is_caller(3, -1);  // per OpenMP thread
#pragma omp parallel num_threads(3)
  {
    sigset_t mask;
    pthread_sigmask(SIG_BLOCK, nullptr, &mask);
    const int t = omp_get_thread_num();
    blocked[t] = sigismember(&mask, SIGTERM) == 1 && sigismember(&mask, SIGINT) == 1;
    is_caller[t] = pthread_equal(pthread_self(), caller) != 0;
  }
  engine::configure_threads(before);
  for (int t = 0; t < 3; ++t) {
    CAPTURE(t);
    REQUIRE(is_caller[t] >= 0);  // the region ran with every thread
    CHECK(blocked[t] == (is_caller[t] ? 0 : 1));
  }
}

TEST_CASE("stop signals: while a scope lives the handler runs on its own stack and only sets the flag", "[faults]") {
  struct sigaction outside {};
  sigaction(SIGTERM, nullptr, &outside);
  {
    engine::StopSignals scope;
    CHECK_FALSE(engine::stop_requested().load());
    struct sigaction inside {};
    sigaction(SIGTERM, nullptr, &inside);
    CHECK((inside.sa_flags & SA_ONSTACK) != 0);
    sigaction(SIGINT, nullptr, &inside);
    CHECK((inside.sa_flags & SA_ONSTACK) != 0);
    stack_t alternate{};
    REQUIRE(sigaltstack(nullptr, &alternate) == 0);
    CHECK_FALSE(alternate.ss_flags & SS_DISABLE);
    // Ours, or one already there (Catch's own, 32 KiB): room for a frame
    // with the AVX-512 state (under 4 KiB) and the one-store handler.
    CHECK(alternate.ss_size >= 16 * 1024);
    raise(SIGTERM);
    CHECK(engine::stop_requested().load());
  }
  struct sigaction after {};
  sigaction(SIGTERM, nullptr, &after);
  CHECK(after.sa_handler == outside.sa_handler);
  engine::StopSignals again;  // a new scope starts with the flag clear
  CHECK_FALSE(engine::stop_requested().load());
}
