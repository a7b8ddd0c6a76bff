#pragma once
// Catch2 v2 has no SKIP, and a test case that returns early counts as passed.
// CHIAR_SKIP records the skip, prints "SKIPPED [tag]: reason" where Catch
// reports the test case, and returns from it. When nothing failed, main()
// then exits with kSkipExitCode, which the ctest entries declare as their
// SKIP_RETURN_CODE: the entry shows as "Skipped", never "Passed".
#include <catch2/catch.hpp>

namespace chiar::test {

// Also written to tests/CMakeLists.txt (SKIP_RETURN_CODE); 77 is the usual
// "skipped" status of automake and Meson test drivers.
constexpr int kSkipExitCode = 77;

// Counts a skipped test case; main() reads the count.
void note_skip();
int skipped_test_cases();

}  // namespace chiar::test

// Use as a statement inside a TEST_CASE: `if (!ready) CHIAR_SKIP("[data]", "...");`
#define CHIAR_SKIP(tag, reason)                \
  do {                                         \
    ::chiar::test::note_skip();                \
    WARN("SKIPPED " << tag << ": " << reason); \
    return;                                    \
  } while (false)
