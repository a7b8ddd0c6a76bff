#include <iostream>

#include "../core/registry.h"
#include "../core/runtime.h"
#include "commands.h"

namespace chiar::cli {

void start_compute(const Global& g) {
  const RuntimeInfo info = probe_runtime(g.threads, g.gemm);
  if (info.blas_gflops < kSlowGemmGflops) std::cerr << describe(info) << "\n";
}

int run_info(const Global& g) {
  const RuntimeInfo info = probe_runtime(g.threads, g.gemm);
  std::cout << "libtorch   " << info.torch_version << "\n"
            << "build      " << info.build_type << "\n"
            << "threads    " << info.threads << "\n"
            << "BLAS       " << info.blas << "\n"
            << "products   " << info.gemm << "\n"
            << "GEMM       " << info.gemm_gflops << " GFLOP/s (fp32, " << info.gemm_size << "^3, median of 10; "
            << info.blas_gflops << " on the BLAS)\n"
            << "host       " << info.host << "\n"
            << "cpu        " << info.cpu << "\n"
            << "allocator  " << info.allocator << "\n";
  if (info.blas_gflops < kSlowGemmGflops) std::cerr << describe(info) << "\n";
  const auto dirs = default_plugin_dirs();
  std::cout << "plugins    " << (dirs.empty() ? std::string("(no default folder found)") : dirs[0])
            << "\n";
  return 0;
}

}  // namespace chiar::cli
