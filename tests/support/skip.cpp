#include "skip.h"

namespace chiar::test {
namespace {
int skips = 0;
}  // namespace

void note_skip() { ++skips; }
int skipped_test_cases() { return skips; }

}  // namespace chiar::test
