#include "runtime.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <dlfcn.h>
#include <malloc.h>
#include <omp.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <climits>
#include <cstdlib>
#include <fstream>
#include <iomanip>
#include <sstream>
#include <thread>
#include <vector>

#include "chiar/error.h"
#include "chiar/linear.h"
#include "chiar/plugin.h"
#include "chiar_build_info.h"
#include "engine/runtime/stop_signals.h"

namespace chiar::engine {

namespace {
std::string g_allocator = "glibc default";
std::string g_gemm_choice, g_gemm;               // the last configure_gemm() request and its answer
GemmBackend g_gemm_backend = GemmBackend::Blas;  // ... and the library it chose

// GFLOP/s of a product of the model's shape, (2048, 256) x (256, 1024): the
// BLAS's, or the current library's; median of 5 after the probe's warm-up.
double model_product_gflops(bool blas_only) {
  GemmProbe probe(2048, 256, 1024, blas_only);
  std::vector<double> seconds;
  for (int i = 0; i < 5; ++i) seconds.push_back(probe.seconds());
  return probe.flops() / median(seconds) / 1e9;
}

std::string library_description(GemmBackend b) {
  return b == GemmBackend::Blas ? "blas (libtorch's path)" : "onednn: " + onednn_description();
}

// The file of the library that provides sgemm_ in the global lookup order,
// the one libtorch's GEMM binds to (LD_PRELOAD and the Debian alternative
// included); "" for none.
std::string sgemm_provider() {
  void* sgemm = dlsym(RTLD_DEFAULT, "sgemm_");
  Dl_info where{};
  if (!sgemm || !dladdr(sgemm, &where) || !where.dli_fname) return "";
  return where.dli_fname;
}

// What an OpenBLAS query (char* f(void)) of that library answers; "" when
// the library has no such function, so is not OpenBLAS.
std::string ask_openblas(const std::string& provider, const char* function) {
  if (provider.empty()) return "";
  void* lib = dlopen(provider.c_str(), RTLD_LAZY | RTLD_NOLOAD);
  if (!lib) return "";
  std::string answer;
  using QueryFn = char* (*)();
  if (auto query = reinterpret_cast<QueryFn>(dlsym(lib, function)))
    if (const char* text = query()) answer = text;
  dlclose(lib);
  return answer;
}

std::string lower(std::string text) {
  for (char& c : text) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return text;
}

bool has_flag(const std::vector<std::string>& flags, const char* flag) {
  return std::find(flags.begin(), flags.end(), flag) != flags.end();
}

// OpenBLAS kernel sets without AVX2: the generic Prescott a DYNAMIC_ARCH
// build falls back to on a processor it does not know, and older ones.
// OpenBLAS names them so in openblas_get_corename (upper case when built for
// one target).
bool pre_avx2_core(const std::string& core) {
  static const std::vector<std::string> old = {
      "katmai",  "coppermine", "northwood", "prescott",     "banias",    "atom", "core2",  "penryn",      "dunnington",
      "nehalem", "athlon",     "opteron",   "opteron_sse3", "barcelona", "nano", "bobcat", "sandybridge", "bulldozer"};
  return std::find(old.begin(), old.end(), lower(core)) != old.end();
}

// Debian's reference BLAS (blas/libblas.so.3), or another libblas.so that is
// none of the optimised ones.
bool is_reference_blas(const std::string& blas) {
  // detect_blas() appends " (OpenBLAS's config)" and "; OPENBLAS_CORETYPE=..." to the path.
  const std::string path = lower(blas.substr(0, blas.find_first_of(" ;")));
  const std::string file = path.substr(path.rfind('/') + 1);
  if (file.rfind("libblas.so", 0) != 0) return false;
  for (const char* optimised : {"openblas", "atlas", "blis", "mkl"})
    if (path.find(optimised) != std::string::npos) return false;
  return true;
}

// The first processor's "model name" and "flags" in /proc/cpuinfo.
void read_cpuinfo(std::string& model, std::vector<std::string>& flags) {
  std::ifstream cpuinfo("/proc/cpuinfo");
  std::string line;
  while (std::getline(cpuinfo, line) && (model.empty() || flags.empty())) {
    const auto colon = line.find(':');
    if (colon == std::string::npos) continue;
    if (model.empty() && line.rfind("model name", 0) == 0) {
      model = line.substr(std::min(colon + 2, line.size()));
    } else if (flags.empty() && line.rfind("flags", 0) == 0) {
      std::istringstream words(line.substr(colon + 1));
      for (std::string flag; words >> flag;) flags.push_back(flag);
    }
  }
}
}  // namespace

std::string configure_gemm(const std::string& requested) {
  std::string choice = requested;
  const char* env = std::getenv("CHIAR_GEMM");
  if (choice == "auto" && env && *env) choice = env;
  if (choice == g_gemm_choice && !g_gemm.empty()) {
    set_gemm_backend(g_gemm_backend);
    return g_gemm;
  }
  const auto rate = [](double gflops) {
    std::ostringstream s;
    s << std::fixed << std::setprecision(0) << gflops;
    return s.str();
  };
  if (choice == "blas" || choice == "onednn") {
    set_gemm_backend(gemm_backend_from_string(choice));
    g_gemm = library_description(gemm_backend());
  } else if (choice == "auto") {
    if (!onednn_available()) {
      set_gemm_backend(GemmBackend::Blas);
      g_gemm = "blas (auto: this build has no oneDNN)";
    } else {
      const double blas = model_product_gflops(/*blas_only=*/true);
      set_gemm_backend(GemmBackend::OneDnn);
      const double onednn = model_product_gflops(/*blas_only=*/false);
      const bool fast = onednn >= blas;
      set_gemm_backend(fast ? GemmBackend::OneDnn : GemmBackend::Blas);
      g_gemm = library_description(gemm_backend()) + "; auto: 2048x256x1024 at " + rate(onednn) +
               " GFLOP/s on oneDNN, " + rate(blas) + " on the BLAS";
    }
  } else {
    throw UserError("unknown gemm backend '" + choice + "'" + (choice == requested ? "" : " (from CHIAR_GEMM)") +
                    " (known: auto, blas, onednn)");
  }
  g_gemm_choice = choice;
  g_gemm_backend = gemm_backend();
  return g_gemm;
}

RunGemm gemm_for_run(const RuntimeInfo& process, const std::string& began_record, bool onednn_built) {
  const std::string& mine = process.gemm_library;
  // The library is the record's first word: "blas (libtorch's path)", "onednn: oneDNN ...".
  const std::string began = began_record.substr(0, began_record.find_first_of(" :"));
  const size_t switched = began_record.find("; switched from ");
  const std::string history = switched == std::string::npos ? "" : began_record.substr(switched);
  if ((began != "blas" && began != "onednn") || began == mine)
    return {mine, began == mine && process.gemm_timed ? began_record : process.gemm + history, ""};
  if (process.gemm_timed && (began == "blas" || onednn_built))
    return {began, began_record,
            "keeps " + began + ", the library it began on (this process timed " + mine + " faster)"};
  const std::string why = process.gemm_timed ? "this build has no oneDNN" : "as asked";
  return {mine, process.gemm + history + "; switched from " + began + " at resumption",
          "resumes on " + mine + " (" + why + "); it began on " + began +
              ", so its results will differ from an uninterrupted run's"};
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

int usable_cores() {
  // The CPUs this process may run on: a Slurm task, a container or taskset
  // limits them, and the machine's core count would oversubscribe them.
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0) return CPU_COUNT(&set);
  return std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
}

int configure_threads(int requested) {
  int n = requested > 0 ? requested : usable_cores();
  if (n < 1) n = 1;
  at::set_num_threads(n);
  // The harness's own parallel loops run in the OpenMP runtime it was linked
  // with; a libtorch that bundles its own copy would not pass the count on.
  omp_set_num_threads(n);
  engine::keep_stop_signals_off_workers(n);
  return at::get_num_threads();
}

std::string detect_blas() {
  const std::string provider = sgemm_provider();
  if (provider.empty()) return "no BLAS sgemm_ found (libtorch uses its own fallback GEMM)";
  char resolved[PATH_MAX];
  std::string found = realpath(provider.c_str(), resolved) ? resolved : provider;
  if (const std::string config = ask_openblas(provider, "openblas_get_config"); !config.empty())
    found += " (" + config + ")";
  // Wheels of libtorch (the pip builds users bring via Torch_DIR) link their
  // BLAS into libtorch_cpu itself: the path then says nothing, the build
  // configuration names it (BLAS_INFO=mkl, say).
  if (found.find("libtorch") != std::string::npos) {
    const std::string config = at::show_config(), key = "BLAS_INFO=";
    const auto at_key = config.find(key);
    if (at_key != std::string::npos) {
      const auto from = at_key + key.size();
      found += " (libtorch's own BLAS: " + config.substr(from, config.find_first_of(", \n", from) - from) + ")";
    }
  }
  // OpenBLAS's kernels depend on it, so the figures do: some machines set it
  // because an older OpenBLAS misbehaves on their CPU with its own choice.
  if (const char* core = std::getenv("OPENBLAS_CORETYPE")) found += "; OPENBLAS_CORETYPE=" + std::string(core);
  return found;
}

std::string detect_blas_core() { return ask_openblas(sgemm_provider(), "openblas_get_corename"); }

std::string blas_warning(const RuntimeInfo& info) {
  std::ostringstream out;
  out << std::fixed << std::setprecision(1);
  // A DYNAMIC_ARCH OpenBLAS picks kernels by processor model, not by its
  // features: on a model newer than itself it falls back to generic ones and
  // runs several times slower (Prescott at 37-41 GFLOP/s against 215 with
  // SkylakeX's on one AVX-512 machine), which no rate threshold catches.
  const auto& f = info.cpu_flags;
  const bool avx512 = has_flag(f, "avx512f") && has_flag(f, "avx512bw") && has_flag(f, "avx512vl");
  const bool avx2 = has_flag(f, "avx2") && has_flag(f, "fma");
  if (pre_avx2_core(info.blas_core) && (avx512 || avx2)) {
    out << "warning: OpenBLAS runs its " << info.blas_core << " kernels on this "
        << (info.cpu.empty() ? std::string("processor") : info.cpu) << " (" << (avx512 ? "AVX-512" : "AVX2")
        << "): set OPENBLAS_CORETYPE=" << (avx512 ? "SkylakeX" : "Haswell");
    if (info.blas_gflops > 0) out << " (the BLAS ran a GEMM at " << info.blas_gflops << " GFLOP/s)";
    return out.str();
  }
  if (info.blas_gflops >= kSlowGemmGflops) return "";
  out << "warning: the BLAS runs a GEMM at " << info.blas_gflops << " GFLOP/s (< " << kSlowGemmGflops << ")";
  if (is_reference_blas(info.blas))
    out << ": libtorch is on the reference BLAS; install libopenblas0-openmp";
  else
    out << " on " << (info.blas.empty() ? std::string("an unknown library") : info.blas);
  return out.str();
}

double median(std::vector<double> values) {
  if (values.empty()) return 0;
  const auto middle = values.begin() + static_cast<std::ptrdiff_t>(values.size() / 2);
  std::nth_element(values.begin(), middle, values.end());
  return *middle;
}

GemmProbe::GemmProbe(int64_t m, int64_t k, int64_t n, bool blas_only) : m_(m), k_(k), n_(n), blas_only_(blas_only) {
  at::NoGradGuard no_grad;
  a_ = at::randn({m, k});
  b_ = at::randn({k, n});
  c_ = at::empty({m, n});
  for (int i = 0; i < 2; ++i) seconds();
}

double GemmProbe::seconds() {
  at::NoGradGuard no_grad;
  const auto t0 = std::chrono::steady_clock::now();
  if (blas_only_)
    at::mm_out(c_, a_, b_);
  else
    gemm_into(c_, a_, b_);
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

double measure_gemm_gflops(int64_t n, int repeats, bool blas_only) {
  GemmProbe probe(n, blas_only);
  std::vector<double> seconds;
  for (int i = 0; i < std::max(1, repeats); ++i) seconds.push_back(probe.seconds());
  return probe.flops() / median(seconds) / 1e9;
}

RuntimeInfo probe_runtime(int requested_threads, const std::string& gemm) {
  RuntimeInfo info;
  info.threads = configure_threads(requested_threads);
  info.gemm = configure_gemm(gemm);
  info.gemm_library = to_string(gemm_backend());
  info.gemm_timed = g_gemm_choice == "auto";
  info.gemm_size = 512;
  info.gemm_gflops = measure_gemm_gflops(info.gemm_size);
  info.blas_gflops = gemm_backend() == GemmBackend::Blas ? info.gemm_gflops
                                                         : measure_gemm_gflops(info.gemm_size, 10, /*blas_only=*/true);
  // A resumed run may keep oneDNN against this process's choice
  // (gemm_for_run): its rate is measured now, at the start-up thread count.
  if (gemm_backend() == GemmBackend::OneDnn) {
    info.onednn_gflops = info.gemm_gflops;
  } else if (onednn_available()) {
    set_gemm_backend(GemmBackend::OneDnn);
    info.onednn_gflops = measure_gemm_gflops(info.gemm_size);
    set_gemm_backend(GemmBackend::Blas);
  }
  info.blas = detect_blas();  // after a GEMM, so a lazily loaded BLAS is mapped
  info.blas_core = detect_blas_core();
  info.torch_version = CHIAR_TORCH_VERSION_STRING;
  info.build_type = CHIAR_BUILD_TYPE;
  info.allocator = g_allocator;
  char host[256] = {0};
  if (gethostname(host, sizeof host - 1) == 0) info.host = host;
  read_cpuinfo(info.cpu, info.cpu_flags);
  return info;
}

std::string describe(const RuntimeInfo& info) {
  std::ostringstream out;
  out.precision(1);
  out << std::fixed << "libtorch " << info.torch_version << " (" << info.build_type << "), " << info.threads
      << " threads, GEMM " << info.gemm_size << "^3 fp32 " << info.gemm_gflops << " GFLOP/s (on the BLAS "
      << info.blas_gflops << "), products: " << info.gemm << ", BLAS " << info.blas
      << ", allocator: " << info.allocator;
  if (const std::string warning = blas_warning(info); !warning.empty()) out << "\n" << warning;
  return out.str();
}

}  // namespace chiar::engine
