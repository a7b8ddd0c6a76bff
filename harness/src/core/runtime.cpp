#include "runtime.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <dlfcn.h>
#include <malloc.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdlib>
#include <fstream>
#include <iomanip>
#include <sstream>
#include <thread>
#include <vector>

#include "chiar/plugin.h"
#include "chiar_build_info.h"


namespace chiar {

namespace {
std::string g_allocator = "glibc default";
}

int64_t estimate_activation_bytes(int64_t batch, int64_t seq, int64_t d_model, int64_t layers, int64_t ffn_width,
                                  int64_t lm_vocab) {
  const int64_t per_token = layers * (16 * d_model + 3 * ffn_width) + 3 * lm_vocab;
  return 4 * batch * seq * per_token;
}

std::string configure_allocator(int64_t expected_bytes) {
  const char* env = std::getenv("CHIAR_MALLOC");
  const std::string choice = env ? env : "";
  const double physical = static_cast<double>(sysconf(_SC_PHYS_PAGES)) * static_cast<double>(sysconf(_SC_PAGESIZE));
  const bool large = static_cast<double>(expected_bytes) > physical * 3 / 4;
  const auto gib = [](double b) {
    std::ostringstream s;
    s << std::fixed << std::setprecision(1) << b / (1 << 30) << " GiB";
    return s.str();
  };
  if (choice == "default" || (choice != "retain" && large)) {
    // glibc's own defaults: mmap above the (dynamic) threshold, trim at 128 KiB.
    mallopt(M_MMAP_MAX, 65536);
    mallopt(M_TRIM_THRESHOLD, 128 * 1024);
    g_allocator = choice == "default" ? "glibc default (CHIAR_MALLOC=default)"
                                      : "glibc default (activations ~" + gib(static_cast<double>(expected_bytes)) +
                                            " > 3/4 of " + gib(physical) + ")";
  } else if (mallopt(M_MMAP_MAX, 0) == 1 && mallopt(M_TRIM_THRESHOLD, 1 << 30) == 1) {
    g_allocator = "glibc, mmap off, trim threshold 1 GiB";
    if (choice == "retain") g_allocator += " (CHIAR_MALLOC=retain)";
  }
  return g_allocator;
}

int configure_threads(int requested) {
  int n = requested > 0 ? requested : static_cast<int>(std::thread::hardware_concurrency());
  if (n < 1) n = 1;
  at::set_num_threads(n);
  return at::get_num_threads();
}

std::string detect_blas() {
  // The library that provides sgemm_ in the global lookup order is the one
  // libtorch's GEMM binds to (LD_PRELOAD and the Debian alternative included).
  void* sgemm = dlsym(RTLD_DEFAULT, "sgemm_");
  Dl_info where{};
  if (!sgemm || !dladdr(sgemm, &where) || !where.dli_fname)
    return "no BLAS sgemm_ found (libtorch uses its own fallback GEMM)";
  char resolved[PATH_MAX];
  std::string found = realpath(where.dli_fname, resolved) ? resolved : where.dli_fname;
  if (void* lib = dlopen(where.dli_fname, RTLD_LAZY | RTLD_NOLOAD)) {
    using ConfigFn = char* (*)();
    if (auto config = reinterpret_cast<ConfigFn>(dlsym(lib, "openblas_get_config")))
      found += " (" + std::string(config()) + ")";
    dlclose(lib);
  }
  // OpenBLAS's kernels depend on it, so the figures do: some machines set it
  // because an older OpenBLAS misbehaves on their CPU with its own choice.
  if (const char* core = std::getenv("OPENBLAS_CORETYPE")) found += "; OPENBLAS_CORETYPE=" + std::string(core);
  return found;
}

double median(std::vector<double> values) {
  if (values.empty()) return 0;
  const auto middle = values.begin() + static_cast<std::ptrdiff_t>(values.size() / 2);
  std::nth_element(values.begin(), middle, values.end());
  return *middle;
}

GemmProbe::GemmProbe(int64_t n) : n_(n) {
  at::NoGradGuard no_grad;
  a_ = at::randn({n, n});
  b_ = at::randn({n, n});
  c_ = at::empty({n, n});
  for (int i = 0; i < 2; ++i) at::mm_out(c_, a_, b_);
}

double GemmProbe::seconds() {
  at::NoGradGuard no_grad;
  const auto t0 = std::chrono::steady_clock::now();
  at::mm_out(c_, a_, b_);
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

double measure_gemm_gflops(int64_t n, int repeats) {
  GemmProbe probe(n);
  std::vector<double> seconds;
  for (int i = 0; i < std::max(1, repeats); ++i) seconds.push_back(probe.seconds());
  return probe.flops() / median(seconds) / 1e9;
}

RuntimeInfo probe_runtime(int requested_threads) {
  RuntimeInfo info;
  info.threads = configure_threads(requested_threads);
  info.gemm_size = 512;
  info.gemm_gflops = measure_gemm_gflops(info.gemm_size);
  info.blas = detect_blas();  // after a GEMM, so a lazily loaded BLAS is mapped
  info.torch_version = CHIAR_TORCH_VERSION_STRING;
  info.build_type = CHIAR_BUILD_TYPE;
  info.allocator = g_allocator;
  char host[256] = {0};
  if (gethostname(host, sizeof host - 1) == 0) info.host = host;
  std::ifstream cpuinfo("/proc/cpuinfo");
  std::string line;
  while (std::getline(cpuinfo, line)) {
    if (line.rfind("model name", 0) == 0) {
      info.cpu = line.substr(line.find(':') + 2);
      break;
    }
  }
  return info;
}

std::string describe(const RuntimeInfo& info) {
  std::ostringstream out;
  out.precision(1);
  out << std::fixed << "libtorch " << info.torch_version << " (" << info.build_type << "), "
      << info.threads << " threads, GEMM " << info.gemm_size << "^3 fp32 " << info.gemm_gflops
      << " GFLOP/s, BLAS " << info.blas << ", allocator: " << info.allocator;
  if (info.gemm_gflops < kSlowGemmGflops)
    out << "\nWARNING: GEMM runs at " << info.gemm_gflops << " GFLOP/s (< " << kSlowGemmGflops
        << "): libtorch is probably on the reference BLAS; install libopenblas0-openmp";
  return out.str();
}

}  // namespace chiar
