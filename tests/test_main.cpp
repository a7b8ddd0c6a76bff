// The one translation unit with Catch2's main. Threads are fixed so results do
// not depend on the machine's core count.
#define CATCH_CONFIG_RUNNER
#include <ATen/Parallel.h>
#include <catch2/catch.hpp>

int main(int argc, char* argv[]) {
  at::set_num_threads(2);
  return Catch::Session().run(argc, argv);
}
